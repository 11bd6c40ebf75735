# SPDX-License-Identifier: Apache-2.0
"""A huge-page region's identity record lives in a record segment of base pages (see
numa_utils.record_segment_key), so a region of N huge pages needs exactly N: fit() and
create() agree on an exact reservation; every attacher, cleanup and create(existing=)
find the record; a crash at any step leaves what cleanup judges; a record segment
removed by hand is a clear error, never a read of the data's huge pages."""

import errno
import functools

import pytest
from conftest import hook_call, nu, nur

MiB = 1 << 20
HUGE = 2 * MiB


def _sim(free=None):
    """Two nodes with 2 MiB pages; ``free``: {node: free huge pages} (the rest 0)."""
    from conftest import sim

    s = sim("dual-socket-8gpu")
    if free is not None:
        s.kernel.huge_free[2048] = {n: free.get(n, 0) for n in s.kernel.huge_free[2048]}
    return s


def _segments(s):
    """{key: size} of every SysV segment the simulated kernel has."""
    rows = s.read_text("/proc/sysvipc/shm").splitlines()[1:]
    return {int(r.split()[0]) & 0xFFFFFFFF: int(r.split()[3]) for r in rows}


def _make(proc, name, pages=4, **kw):
    kw.setdefault("policy", "bind")
    kw.setdefault("nodes", [0])
    return nur.SharedRegion.create(name, pages * HUGE, hugepages="2M", backend=proc, **kw)


def test_exact_huge_reservation_fits_and_creates():
    s = _sim({0: 4})  # exactly 4 pages, all on node 0
    verdict = nur.fit(4 * HUGE, policy="bind", nodes=[0], hugepages="2M", backend=s)
    assert verdict.ok and verdict.exact, verdict.reason
    with _make(s, "exact") as r:
        assert r.placement() == {0: 4 * HUGE}
        assert s.kernel.huge_free[2048][0] == 0
        ikey = r.ipc_key
        # The data segment is the region's pages and nothing more; its record segment
        # (base pages) is under the key with "O" in the top byte.
        assert _segments(s) == {ikey: 4 * HUGE, nur.record_segment_key(ikey): nur._RECORD_ROOM}
        assert nur.record_segment_key(ikey) == 0x4F000000 | ikey & 0xFFFFFF
        maps = nu.parse_numa_maps(s.read_text("/proc/self/numa_maps"))
        (data,) = [e for e in maps if e.start == r.address]
        (room,) = [e for e in maps if e.start == r._room()[0]]
        assert data.huge and data.pages_total == 4 and data.bytes_per_node == {0: 4 * HUGE}
        assert not room.huge and room.pages_total * s.page_size == nur._RECORD_ROOM
        assert r.identity["data_key"] == ikey
    assert _segments(s) == {} and not s.kernel.objects  # destroy removed both
    assert s.kernel.huge_free[2048][0] == 4


def test_another_process_finds_the_record():
    s = _sim()
    r = _make(s, "shared", policy="interleave", nodes=[0, 1])
    r.buffer()[HUGE] = 9
    try:
        p = s.process()
        a = nur.SharedRegion.attach("shared", backend=p, wait=1)
        assert (a.size, a.page_size, str(a.layout)) == (r.size, HUGE, str(r.layout))
        assert a.identity["key"] == "shared" and a.buffer()[HUGE] == 9
        assert a.shmid == r.shmid and a._room_id == r._room_id
        a.close()
        # reuse finds it through its record segment too
        same = _make(s.process(), "shared", policy="interleave", nodes=[0, 1], existing="reuse")
        assert not same.created and same.buffer()[HUGE] == 9
        same.close()
        # a second create of the name is refused, naming the region
        with pytest.raises(FileExistsError, match="'shared' exists"):
            _make(s.process(), "shared")
    finally:
        r.destroy()
    assert _segments(s) == {}


def test_cleanup_removes_data_and_record_segment():
    s = _sim()
    creator = s.process()
    _make(creator, "gone").close()
    creator.exit()
    rows = nur.cleanup(min_age=0, backend=s)
    assert [(r["region"], r["action"]) for r in rows] == [("gone", "would remove")], rows
    rows = nur.cleanup("gone", remove=True, min_age=0, backend=s)
    assert [(r["region"], r["action"]) for r in rows] == [("gone", "removed")], rows
    assert _segments(s) == {} and not s.kernel.objects


def test_cleanup_keeps_a_live_pair_and_replace_takes_a_stale_one():
    s = _sim()
    live = _make(s.process(), "kept")
    (row,) = nur.cleanup(remove=True, min_age=0, backend=s)
    assert row["action"] == "keep" and row["why"].startswith("in use"), row
    assert len(_segments(s)) == 2
    live._b.exit()  # its creator dies without destroying it
    new = _make(s.process(), "kept", existing="replace")
    assert new.created and len(_segments(s)) == 2
    new.destroy()
    assert _segments(s) == {}


class _Crash(Exception):
    """The creator dies here (kill -9): nothing of it runs afterwards."""


def _crash_at(monkeypatch, proc, where):
    """Make ``proc`` die (no undo runs) at ``where``: "data" (the data segment's
    shmget, after its record segment) or "record" (the policies, after both)."""
    monkeypatch.setattr(nur, "_undo", lambda held, region: nur._release_signals(held))

    def die(*a, **kw):
        raise _Crash

    if where == "record":
        monkeypatch.setattr(nur, "_layout_apply", die)
        return
    real = functools.partial(proc.call, "shmget")

    def shmget(key, size, flags):
        if flags & nur.SHM_HUGETLB:
            die()
        return real(key, size, flags)

    hook_call(proc, "shmget", shmget)


@pytest.mark.parametrize("where", ["data", "record"])
def test_a_crash_at_any_step_leaves_what_cleanup_removes(monkeypatch, where):
    s = _sim()
    creator = s.process()
    _crash_at(monkeypatch, creator, where)
    with pytest.raises(_Crash):
        _make(creator, "crash")
    monkeypatch.undo()
    left = _segments(s)
    assert len(left) == (1 if where == "data" else 2), left
    # Nobody attaches a region still being made: attach waits, then times out.
    with pytest.raises(TimeoutError, match="not made within"):
        nur.SharedRegion.attach("crash", backend=s.process(), wait=0.2)
    # While its creator lives, cleanup keeps it; a create of the name is refused.
    (row,) = nur.cleanup(remove=True, min_age=0, backend=s)
    assert row["region"] == "crash" and row["action"] == "keep", row
    assert "in use: 1 attached" in row["why"], row  # by the creator, alive
    with pytest.raises(FileExistsError, match="crash"):
        _make(s.process(), "crash")
    creator.exit()
    (row,) = nur.cleanup(remove=True, min_age=0, backend=s)
    assert row["action"] == "removed", row
    assert _segments(s) == {} and not s.kernel.objects
    _make(s.process(), "crash").destroy()  # the name is free again


def test_a_crash_between_the_two_removals_leaves_what_cleanup_removes():
    s = _sim()
    p = s.process()
    r = _make(p, "half")
    p.call("shm_rmid", r.shmid)  # the data went; its remover died before the record segment
    p.exit()
    (row,) = nur.cleanup(min_age=0, backend=s)
    assert row["key"] == f"0x{nur.record_segment_key(r.ipc_key):08x}", row
    assert "whose data segment" in row["why"] or row["action"] == "would remove", row
    (row,) = nur.cleanup("half", remove=True, min_age=0, backend=s)
    assert row["action"] == "removed", row
    assert _segments(s) == {}


def test_a_missing_record_segment_is_a_clear_error():
    s = _sim()
    r = _make(s, "lost", prefault=False)
    try:
        s.call("shm_rmid", r._room_id)  # removed by hand
        with pytest.raises(ValueError, match=r"holds huge pages and its record segment .* missing"):
            nur.SharedRegion.attach("lost", backend=s.process())
        # cleanup never reads the data's huge pages, and never removes what it cannot
        # prove is ours
        (row,) = nur.cleanup(remove=True, min_age=0, backend=s)
        assert row["action"] == "keep" and "no numa_utils identity record" in row["why"], row
    finally:
        r.destroy()
    assert _segments(s) == {}


def test_record_segment_keys_never_collide_with_names_and_int_keys_say_so():
    s = _sim()
    with pytest.raises(ValueError, match="0x4f000000-0x4fffffff"):
        nur.SharedRegion.create(0x4F000123, HUGE, hugepages="2M", backend=s)
    a = nur.SharedRegion.create(0x12000123, HUGE, hugepages="2M", backend=s)
    try:
        # Another int key with the same low 24 bits: its record key is taken.
        with pytest.raises(FileExistsError, match="0x4f000123, the key of the record") as e:
            nur.SharedRegion.create(0x13000123, HUGE, hugepages="2M", backend=s.process())
        assert e.value.errno == errno.EEXIST and "holds region 301990179's record" in str(e.value)
        # A base-page region may take a 0x4f key (no record segment needs it) ...
        nur.SharedRegion.create(0x4F000124, MiB, backend=s).destroy()
        # ... but not one a record segment holds.
        with pytest.raises(FileExistsError, match="hold other regions"):
            nur.SharedRegion.create(0x4F000123, MiB, backend=s)
    finally:
        a.destroy()
    assert _segments(s) == {}


@pytest.mark.parametrize("huge", [True, False])
def test_an_int_key_another_user_holds_is_named_with_its_owner(huge):
    # An int key has no other key to try: the key another user holds (a huge-page
    # region's record key, or the data key itself) is named, with its owner.
    s = _sim()
    ikey = 0x12000123
    taken = ikey
    if huge:
        taken = nur.record_segment_key(ikey)
    other = s.process(uid=1001)
    shmid = other.call("shmget", taken, nur._RECORD_ROOM, nur.IPC_CREAT | 0o600)
    kw = {"hugepages": "2M"} if huge else {}
    with pytest.raises(FileExistsError) as e:
        nur.SharedRegion.create(ikey, HUGE, backend=s.process(), **kw)
    assert f"0x{taken:08x}" in str(e.value) and "uid 1001" in str(e.value), e.value
    assert "hold other regions" not in str(e.value), e.value
    other.call("shm_rmid", shmid)
    assert _segments(s) == {}


def test_a_data_segment_the_kernel_refuses_leaves_no_record_segment(monkeypatch):
    s = _sim({0: 3})  # one page short, fit() bypassed: the kernel's shmget says ENOMEM
    monkeypatch.setattr(nur, "_fit_or_raise", lambda *a: ("2M", None))
    with pytest.raises(OSError) as e:
        _make(s, "short")
    assert e.value.errno == errno.ENOMEM
    assert _segments(s) == {} and not s.kernel.objects


def test_base_page_regions_keep_their_room_after_the_data():
    s = _sim()
    with nur.SharedRegion.create("small", MiB, backend=s) as r:
        assert r._room_id < 0 and r._room() == (r.address + r.size, nur._RECORD_ROOM)
        assert _segments(s) == {r.ipc_key: MiB + nur._RECORD_ROOM}
        assert "data_key" not in r.identity


# -- GH200: huge pages reserved on the CPU node only -----------------------------------


def _gh200_region(**kw):
    from conftest import sim

    s = sim("gh200")  # 512 MiB pages reserved on node 0 only; node 1 is GPU memory
    verdict = nur.fit(HUGE, hugepages=True, backend=s, **kw)
    r = nur.SharedRegion.create("gh", HUGE, hugepages=True, backend=s, **kw)  # prefaulted
    try:
        return verdict, r.page_size, r.placement()
    finally:
        r.destroy()


def test_gh200_first_touch_takes_huge_pages_where_they_are():
    verdict, page, placed = _gh200_region(policy=None)
    assert verdict.ok and verdict.exact, verdict.reason
    assert page == 512 * MiB and placed == {0: 512 * MiB}


def test_gh200_preferred_elsewhere_takes_them_from_where_they_are():
    verdict, page, placed = _gh200_region(policy="prefer", nodes=[1])
    assert verdict.ok and not verdict.exact and "node 1 has 0 KiB free" in verdict.reason
    assert page == 512 * MiB and placed == {0: 512 * MiB}


@pytest.mark.parametrize("policy,nodes", [("bind", [0, 1]), ("interleave", [0, 1]), ("bind", [1])])
def test_gh200_refusal_names_the_nodes_with_and_without_huge_pages(policy, nodes):
    from conftest import sim

    s = sim("gh200")
    verdict = nur.fit(HUGE, policy=policy, nodes=nodes, hugepages=True, backend=s)
    assert not verdict
    assert "huge pages are not reserved on node 1" in verdict.reason, verdict.reason
    assert "(524288 kB pages on node 0; none on node 1)" in verdict.reason
    assert "no huge pages reserved" not in verdict.reason
    with pytest.raises(OSError, match=r"524288 kB pages on node 0; none on node 1"):
        nur.SharedRegion.create("gh", HUGE, policy=policy, nodes=nodes, hugepages=True, backend=s)
