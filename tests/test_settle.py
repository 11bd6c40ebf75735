"""settle(): what it may move (issue 38 section 1), on the simulator.

By default settle moves only this process's private anonymous memory (heap, stacks,
anonymous mmap) whose mapping has no policy of its own: never shared memory another
process maps, a mapping bound somewhere on purpose, a file's pages or a range pinned
for DMA.  The simulator models what made the old whole-process migrate_pages(2) look
harmless: MPOL_MF_MOVE against MOVE_ALL, shared mappings in /proc/self/maps, and
mappings with policies of their own."""

import errno

import pytest
from conftest import hook_call, nu, nut, sim

PAGE = 4096


def _where(b, addr, size):
    return nu.placement(addr, size, method="move_pages", backend=b)


def _touch_on(b, addr, size, node):
    """First touch of [addr, addr+size) on ``node``: the thread's policy then."""
    with nu.thread_policy("bind", [node], backend=b):
        b.touch(addr, size)


def _shared(b, name, size):
    """Shared memory interleaved over nodes 0 and 1 by ``b``, which touches it; a
    second process maps it and touches it too: (address in b, the second, its address)."""
    addr = b.map_object(name, size)
    assert nu.interleave(addr, size, nodes=[0, 1], backend=b)
    b.touch(addr, size)
    other = b.process()
    there = other.map_object(name, size, create=False)
    other.touch(there, size)
    return addr, other, there


# -- the default scope: private anonymous memory without a policy of its own ----------


def test_settle_leaves_another_process_s_shared_pages_where_they_are():
    """As root (CAP_SYS_NICE) migrate_pages(2) takes MOVE_ALL: another process's
    pages of a region both map used to move with the caller's."""
    b = sim("dual-socket-8gpu")  # cap_sys_nice: the kernel would allow MOVE_ALL
    size = 64 * PAGE
    addr, other, there = _shared(b, "kv", size)
    split = {0: size // 2, 1: size // 2}
    assert _where(other, there, size) == split
    r = nut.settle([0], budget_ms=None, backend=b)
    assert _where(other, there, size) == split
    assert _where(b, addr, size) == split
    assert r and r.finished and r.scope == "private"
    assert r.skipped == {"shared": size // 2} and r.moved == {}


def test_settle_leaves_a_mapping_with_its_own_policy(anon):
    """migrate_pages(2) ignores each mapping's policy: a buffer bound to node 1 used to
    move to node 0."""
    b = sim("dual-socket-8gpu")
    addr, size = anon(32 * PAGE)
    assert nu.bind(addr, [1], size, backend=b)
    b.touch(addr, size)
    r = nut.settle([0], budget_ms=None, backend=b)
    assert _where(b, addr, size) == {1: size}
    assert r and r.skipped == {"policy": size} and r.moved == {}


def test_settle_moves_this_process_s_first_touched_pages_by_kind(anon):
    b = sim("dual-socket-8gpu")
    size = 16 * PAGE
    (heap, _), (stack, _), (plain, _) = anon(size), anon(size), anon(size)
    b.map_private(heap, size, "heap")
    b.map_private(stack, size, "stack")
    for addr in (heap, stack, plain):
        _touch_on(b, addr, size, 0)
    r = nut.settle([1], budget_ms=None, backend=b)
    for addr in (heap, stack, plain):
        assert _where(b, addr, size) == {1: size}
    assert r and r.finished and r.resident_unmoved == 0
    assert r.moved == {"heap": size, "stack": size, "anon": size} and r.skipped == {}
    assert r.nodes == {1} and r.next_address == 0


def test_settle_leaves_files_pins_and_a_policy_equal_to_the_thread_s(anon):
    """A file's private pages and a range pinned for DMA stay; a mapping whose own
    policy reads as the thread's in numa_maps (the kernel prints the thread's policy
    for mappings without one) is still told apart."""
    b = sim("dual-socket-8gpu")
    size = 8 * PAGE
    (lib, _), (pinned, _), (bound, _), (loose, _) = (anon(size) for _ in range(4))
    b.map_private(lib, size, "file=/usr/lib/libfoo.so")
    for addr in (lib, pinned, loose):
        _touch_on(b, addr, size, 0)
    assert nu.bind(bound, [0], size, backend=b)
    b.touch(bound, size)
    with nu.thread_policy("bind", [0], backend=b):
        r = nut.settle([1], pinned=[(pinned, size)], budget_ms=None, backend=b)
    assert _where(b, lib, size) == {0: size}
    assert _where(b, pinned, size) == {0: size}
    assert _where(b, bound, size) == {0: size}
    assert _where(b, loose, size) == {1: size}
    assert r and r.skipped == {"file": size, "pinned": size, "policy": size}
    assert r.moved == {"anon": size}


def test_settle_leaves_pages_on_gpu_memory(anon):
    """Pages on nodes that are no default memory node (the H100's HBM) were put there
    on purpose, policy or not."""
    b = sim("gh200")  # node 1: the H100's HBM
    addr, size = anon(16 * PAGE)
    _touch_on(b, addr, size, 1)
    assert nut.settle([0], budget_ms=None, backend=b)
    assert _where(b, addr, size) == {1: size}


def test_settle_never_asks_for_move_all_nor_migrates_the_process(anon):
    b = sim("dual-socket-8gpu")
    addr, size = anon(16 * PAGE)
    _touch_on(b, addr, size, 0)
    calls = []
    real = hook_call(b, "syscall", lambda nr, *args: calls.append((nr, args)) or real(nr, *args))
    assert nut.settle([1], budget_ms=None, backend=b)
    numbers = {nr for nr, _ in calls}
    assert b.abi.number("migrate_pages") not in numbers
    moves = [args for nr, args in calls if nr == b.abi.number("move_pages")]
    assert moves and all(args[-1] & nu.MbindFlag.MOVE_ALL == 0 for args in moves)
    assert _where(b, addr, size) == {1: size}


def test_settle_stops_at_its_budget_and_goes_on_from_where_it_stopped(anon, monkeypatch):
    b = sim("dual-socket-8gpu")
    monkeypatch.setattr(nut, "_SETTLE_BATCH", 4 * PAGE)
    addr, size = anon(18 * PAGE)
    _touch_on(b, addr, size, 0)
    r = nut.settle([1], budget_ms=0, backend=b)  # one batch per call
    assert not r and not r.finished and r.reason == "budget"
    assert r.moved == {"anon": 4 * PAGE} and r.next_address == addr + 4 * PAGE
    calls = 1
    while not r.finished:
        r = nut.settle([1], budget_ms=0, start=r.next_address, backend=b)
        calls += 1
    assert r and calls == 5 and r.next_address == 0
    assert _where(b, addr, size) == {1: size}
    whole = nut.settle([1], budget_ms=None, backend=b)  # nothing left: no budget needed
    assert whole and whole.moved == {}


def test_settle_moves_in_short_calls(anon, monkeypatch):
    """One move_pages call per batch of pages (a query, then the pages to move), never
    one call for the whole process."""
    b = sim("dual-socket-8gpu")
    monkeypatch.setattr(nut, "_SETTLE_BATCH", 4 * PAGE)
    sizes = []
    real = nu.move_pages
    monkeypatch.setattr(
        nu,
        "move_pages",
        lambda pid, pages, *a, **kw: sizes.append(len(pages)) or real(pid, pages, *a, **kw),
    )
    addr, size = anon(10 * PAGE)
    _touch_on(b, addr, size, 0)
    assert nut.settle([1], budget_ms=None, backend=b)
    assert max(sizes) == 4 and sum(sizes) == 2 * 10  # each page asked about, then moved


def test_settle_counts_pages_the_kernel_would_not_move(anon, monkeypatch):
    b = sim("dual-socket-8gpu")
    addr, size = anon(8 * PAGE)
    _touch_on(b, addr, size, 0)
    real = nu.move_pages

    def busy(pid, pages, nodes=None, *args, **kw):
        if nodes is None:
            return real(pid, pages, None, *args, **kw)
        return [-errno.EBUSY for _ in pages]  # held by a driver behind our back

    monkeypatch.setattr(nu, "move_pages", busy)
    r = nut.settle([1], budget_ms=None, backend=b)
    assert not r and r.reason == "unmoved" and r.resident_unmoved == size
    assert r.finished and r.moved == {}
    with pytest.raises(OSError, match="unmoved"):
        nut.settle([1], budget_ms=None, strict=True, backend=b)


def test_settle_counts_pages_another_process_maps_too_as_shared(anon, monkeypatch):
    """A private page a forked child maps too (copy-on-write) is EACCES for
    MPOL_MF_MOVE: shared, left alone, not a failure."""
    b = sim("dual-socket-8gpu")
    addr, size = anon(8 * PAGE)
    _touch_on(b, addr, size, 0)
    real = nu.move_pages

    def forked(pid, pages, nodes=None, *args, **kw):
        if nodes is None:
            return real(pid, pages, None, *args, **kw)
        return [-errno.EACCES for _ in pages]

    monkeypatch.setattr(nu, "move_pages", forked)
    r = nut.settle([1], budget_ms=None, backend=b)
    assert r and r.skipped == {"shared": size} and r.moved == {}


def test_settle_denied_is_falsy_with_the_fix(anon):
    b = sim("dual-socket-8gpu")
    addr, size = anon(8 * PAGE)
    _touch_on(b, addr, size, 0)
    b.fail("move_pages", errno.EPERM)
    r = nut.settle([1], budget_ms=None, backend=b)
    assert not r and r.reason == "EPERM" and "SYS_NICE" in r.hint
    with pytest.raises(OSError, match="EPERM"):
        nut.settle([1], budget_ms=None, strict=True, backend=b)


def test_settle_of_the_whole_process_denied_or_left_is_falsy(monkeypatch):
    b = sim("dual-socket-8gpu")
    b.fail("migrate_pages", errno.EPERM)
    r = nut.settle([1], scope="process", backend=b)
    assert not r and r.reason == "EPERM" and "SYS_NICE" in r.hint
    b.clear_failures()
    monkeypatch.setattr(nu, "migrate_pages", lambda *a, **kw: 3)  # 3 pages stayed
    r = nut.settle([1], scope="process", backend=b)
    assert not r and r.reason == "unmoved" and r.resident_unmoved == 3 * PAGE


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"nodes": []}, "no node"),
        ({"scope": "everything"}, "scope"),
        ({"scope": "process", "buffers": [(0, 4096)]}, "buffers"),
        ({"budget_ms": -1}, "budget_ms"),
    ],
)
def test_settle_refuses_bad_arguments(kw, msg):
    b = sim("dual-socket-8gpu")
    args = {"nodes": [1], **kw}
    with pytest.raises(ValueError, match=msg):
        nut.settle(args.pop("nodes"), args.pop("buffers", ()), backend=b, **args)


# -- buffers named, and the whole process by name ---------------------------------------


def test_settle_moves_exactly_the_buffers_given(anon):
    b = sim("dual-socket-8gpu")
    (one, size), (two, _) = anon(16 * PAGE), anon(16 * PAGE)
    _touch_on(b, one, size, 0)
    _touch_on(b, two, size, 0)
    r = nut.settle({1}, [(one, size)], budget_ms=None, backend=b)
    assert r and r.scope == "buffers" and r.moved == {"buffers": size}
    assert _where(b, one, size) == {1: size}
    assert _where(b, two, size) == {0: size}


def test_settle_of_the_whole_process_is_asked_for_by_name(anon):
    """scope="process" is migrate_pages(2): as root it moves the pages other processes
    map too, and ignores every mapping's policy (the kernel does not say what moved)."""
    b = sim("dual-socket-8gpu")
    size = 16 * PAGE
    addr, other, there = _shared(b, "kv", size)
    bound, _ = anon(size)
    assert nu.bind(bound, [1], size, backend=b)
    b.touch(bound, size)
    r = nut.settle([0], scope="process", backend=b)
    assert r and r.scope == "process" and r.skipped == {} and r.moved == {}
    assert _where(other, there, size) == {0: size}
    assert _where(b, bound, size) == {0: size}


def test_settle_of_the_whole_process_without_cap_sys_nice_keeps_shared_pages():
    b = sim("dual-socket-8gpu", cap_sys_nice=False)
    size = 16 * PAGE
    addr, other, there = _shared(b, "kv", size)
    assert nut.settle([0], scope="process", backend=b)
    assert _where(other, there, size) == {0: size // 2, 1: size // 2}


def test_pin_threads_settles_when_asked(anon):
    b = sim("dual-socket-8gpu")
    b.add_thread(name="NCCL WatchDog")
    addr, size = anon(32 * PAGE)
    nu.bind_to_node(0, memory=None, backend=b)
    b.touch(addr, size)
    plan = nut.thread_plan(7, environ={}, backend=b)  # GPU 7 is on node 1
    r = nut.pin_threads(plan, {"copy": "^NCCL"}, settle=True, backend=b)
    assert r and r.settled and r.settled.nodes == {1} and r.settled.moved == {"anon": size}
    assert _where(b, addr, size) == {1: size}
    assert nut.pin_threads(plan, {"copy": "^NCCL"}, backend=b).settled is None


def test_settle_result_to_json(anon):
    b = sim("dual-socket-8gpu")
    addr, size = anon(8 * PAGE)
    _touch_on(b, addr, size, 0)
    got = nu.to_json(nut.settle([1], budget_ms=None, backend=b))
    assert got["applied"] and got["nodes"] == [1] and got["moved"] == {"anon": size}
    assert got["skipped"] == {} and got["finished"] and got["scope"] == "private"


# -- the simulator's model of the kernel ------------------------------------------------


def test_sim_move_pages_moves_shared_pages_only_with_move_all():
    """mm/migrate.c add_page_for_migration: a page mapped by another process too is
    -EACCES for MPOL_MF_MOVE; MOVE_ALL needs CAP_SYS_NICE (EPERM without)."""
    size = 4 * PAGE
    for cap in (False, True):
        b = sim("dual-socket-8gpu", cap_sys_nice=cap)
        addr, other, there = _shared(b, "kv", size)
        page = addr + PAGE  # on node 1
        assert nu.move_pages(0, [page], [0], nu.MbindFlag.MOVE, backend=b) == [-errno.EACCES]
        if not cap:
            with pytest.raises(PermissionError):
                nu.move_pages(0, [page], [0], nu.MbindFlag.MOVE_ALL, backend=b)
            continue
        assert nu.move_pages(0, [page], [0], nu.MbindFlag.MOVE_ALL, backend=b) == [0]
        assert _where(other, there + PAGE, PAGE) == {0: PAGE}


def test_sim_move_pages_moves_pages_this_process_alone_maps():
    b = sim("dual-socket-8gpu", cap_sys_nice=False)
    addr = b.map_object("mine", 2 * PAGE)
    b.touch(addr, 2 * PAGE)
    assert nu.move_pages(0, [addr], [1], nu.MbindFlag.MOVE, backend=b) == [1]


def test_sim_mbind_move_leaves_shared_pages_without_move_all():
    size = 4 * PAGE
    b = sim("dual-socket-8gpu", cap_sys_nice=False)
    addr, other, there = _shared(b, "kv", size)
    assert nu.bind(addr, [0], size, move=True, backend=b) is not None
    assert _where(other, there, size) == {0: size // 2, 1: size // 2}


def test_sim_maps_lists_the_vmas_of_numa_maps(anon):
    """/proc/self/maps has one line per numa_maps VMA, shared memory as a shared
    mapping (s), private memory as private (p), named as the kernel names it."""
    b = sim("dual-socket-8gpu")
    obj = b.map_object("kv", 8 * PAGE)
    b.touch(obj, 8 * PAGE)
    (heap, size), (lib, _) = anon(4 * PAGE), anon(4 * PAGE)
    b.map_private(heap, size, "heap")
    b.map_private(lib, size, "file=/usr/lib/libfoo.so")
    b.touch(heap, size)
    b.touch(lib, size)
    assert nu.bind(heap, [1], PAGE, backend=b)  # splits the heap in two VMAs
    maps = [line.split() for line in b.read_text("/proc/self/maps").splitlines()]
    starts = [int(line.split()[0], 16) for line in b.read_text("/proc/self/numa_maps").splitlines()]
    assert [int(fields[0].split("-")[0], 16) for fields in maps] == starts
    by_start = {int(fields[0].split("-")[0], 16): fields for fields in maps}
    assert by_start[obj][1] == "rw-s" and by_start[obj][5] == "/kv"
    assert by_start[heap][1] == "rw-p" and by_start[heap][5] == "[heap]"
    assert by_start[heap][0] == f"{heap:08x}-{heap + PAGE:08x}"
    assert by_start[heap + PAGE][5] == "[heap]"
    assert by_start[lib][5] == "/usr/lib/libfoo.so"
    assert b.read_text(f"/proc/{b.pid}/maps") == b.read_text("/proc/thread-self/maps")
