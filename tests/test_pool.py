"""PinnedPool (issue 42): pinned host memory per node, placed before it is pinned,
exact in size, never lent across nodes."""

import json
import random
import sys

import pytest
from conftest import FIXTURES, fixture_text, nu, nur, sim

PAGE = 4096
MiB = 1 << 20


def _expected(name):
    return json.loads(fixture_text(name, "expected.json"))


def test_b200_snc3_default_nodes_are_the_gpu_hosting_ones():
    # pegaflow #293: 6 CPU nodes, GPUs on 0, 2, 3, 5: nodes 1 and 4 stay out
    pool = nur.PinnedPool(backend=sim("b200-snc3"))
    assert pool.nodes == {0, 2, 3, 5}
    assert pool.registered is None and "simulated" in pool.register_why


@pytest.mark.parametrize("name", FIXTURES)
def test_default_nodes_on_every_saved_machine(name):
    exp = _expected(name)
    dram = set(exp["nodes_with_cpus"]) & set(exp["nodes_with_memory"]) & set(exp["allowed_mems"])
    pool = nur.PinnedPool(backend=sim(name))
    assert pool.nodes, name
    # never a CPU-less (GPU-memory, CXL, HBM) node, never one outside the cpuset
    assert pool.nodes <= dram
    if not exp["gpus"]:
        assert pool.nodes == dram


def test_gpu_memory_node_is_never_a_pool_node():
    # GH200: the GPU's memory is a CPU-less node; the pool keeps to the Grace node
    exp = _expected("gh200")
    pool = nur.PinnedPool(backend=sim("gh200"))
    assert pool.nodes <= set(exp["nodes_with_cpus"])


def test_named_nodes_and_bad_ones():
    b = sim("b200-snc3")
    assert nur.PinnedPool("1,4", backend=b).nodes == {1, 4}
    assert nur.PinnedPool([4], backend=b).nodes == {4}
    with pytest.raises(ValueError):
        nur.PinnedPool([7], backend=b)
    with pytest.raises(ValueError):
        nur.PinnedPool(register="vulkan", backend=b)


def test_sizes_are_page_rounded_never_a_power_of_two():
    pool = nur.PinnedPool(backend=sim("b200-snc3"))
    blk = pool.alloc(5 * PAGE + 1, node=3)
    assert (blk.length, blk.size, blk.node) == (5 * PAGE + 1, 6 * PAGE, 3)  # not 8 pages
    assert pool.stats()[3]["bytes"] == 6 * PAGE
    assert pool.placement()[3] == {3: 6 * PAGE}


def test_gpu_argument_uses_that_gpus_node(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pool = nur.PinnedPool(backend=sim("b200-snc3"))
    # PCI order: two GPUs on each of nodes 0, 2, 3, 5
    assert [pool.alloc(PAGE, gpu=g).node for g in (0, 2, 4, 7)] == [0, 2, 3, 5]
    with pytest.raises(ValueError):
        pool.alloc(PAGE, node=0, gpu=0)


def test_node_outside_the_pool_and_no_default_node():
    pool = nur.PinnedPool(backend=sim("b200-snc3"))
    with pytest.raises(ValueError, match="not in the pool"):
        pool.alloc(PAGE, node=1)
    with pytest.raises(ValueError, match="give node= or gpu="):
        pool.alloc(PAGE)  # this thread may run on every node
    with pytest.raises(ValueError):
        pool.alloc(0, node=0)


def test_a_dry_node_says_so_and_never_lends_another_nodes_block():
    pool = nur.PinnedPool(backend=sim("b200-snc3"), budget=4 * PAGE)
    a = pool.alloc(3 * PAGE, node=0)
    spare = pool.alloc(4 * PAGE, node=2)
    pool.free(spare)  # node 2 has 4 free pages now
    with pytest.raises(nur.PoolExhausted, match="node 0"):
        pool.alloc(2 * PAGE, node=0)
    assert pool.stats()[2]["free"] == 4 * PAGE
    pool.free(a)
    b, c = pool.alloc(2 * PAGE, node=0), pool.alloc(PAGE, node=0)  # from a's pages
    assert (b.node, c.node, pool.stats()[0]["bytes"]) == (0, 0, 3 * PAGE)
    assert pool.alloc(PAGE, node=0).node == 0  # grows to the budget, no further
    with pytest.raises(nur.PoolExhausted):
        pool.alloc(PAGE, node=0)


def test_free_twice_or_a_stranger_is_an_error():
    pool = nur.PinnedPool(backend=sim("b200-snc3"))
    blk = pool.alloc(PAGE, node=0)
    pool.free(blk)
    with pytest.raises(ValueError):
        pool.free(blk)
    with pytest.raises(ValueError):
        pool.free(object())


def _churn(name, steps, seed):
    """Random alloc/free of mixed sizes; after each step, the block just served lies
    on the node it was asked for, and stats agree with what is live."""
    backend = sim(name)
    pool = nur.PinnedPool(backend=backend)
    nodes = sorted(pool.nodes)
    rng = random.Random(seed)
    live = []
    numa = backend.kernel.numa  # a kernel without NUMA cannot say where pages are
    for _ in range(steps):
        if live and rng.random() < 0.45:
            pool.free(live.pop(rng.randrange(len(live))))
            continue
        want = rng.choice(nodes)
        nbytes = rng.choice([1, PAGE - 1, PAGE, 3 * PAGE + 7, 17 * PAGE, 64 * PAGE + 1])
        blk = pool.alloc(nbytes, node=want)
        assert blk.node == want and blk.length == nbytes
        assert blk.size == -(-nbytes // PAGE) * PAGE  # within a page of what was asked
        if numa:
            assert nu.placement(blk.address, blk.size, backend=backend) == {want: blk.size}
        live.append(blk)
    stats = pool.stats()
    for n in nodes:
        mine = [b for b in live if b.node == n]
        s = stats[n]
        assert s["used"] == sum(b.size for b in mine) and s["blocks"] == len(mine)
        assert s["bytes"] == s["used"] + s["free"]
        # resident, read back from the (simulated) kernel: all of it, all on n
        if numa:
            assert pool.placement()[n] == ({n: s["bytes"]} if s["bytes"] else {})
    spans = sorted((b.address, b.address + b.size) for b in live)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # no two blocks overlap
    pool.close()


def test_ten_thousand_random_allocs_and_frees_on_b200_snc3():
    _churn("b200-snc3", 10_000, 42)


@pytest.mark.parametrize("name", FIXTURES)
def test_random_allocs_and_frees_on_every_saved_machine(name):
    _churn(name, 300, 7)


def test_place_before_pin(monkeypatch):
    """bind and prefault each mapping before it is registered (pinned pages never move)."""
    events = []
    backend = sim("b200-snc3")
    original = backend.call
    mbind = backend.abi.number("mbind")

    def call(name, *args):
        if name == "syscall" and args[0] == mbind:
            events.append("bind")
        if name == "madvise":
            events.append("prefault")
        return original(name, *args)

    backend.call = call

    class Pin:
        def __bool__(self):
            return True

        def close(self):
            events.append("unpin")

    def pin_for_cuda(addr, size, **kw):
        events.append("pin")
        return Pin()

    class Calls:
        api = nur._PIN_APIS[0]

        def register(self, addr, size, flags):
            events.append("probe")
            return 0

        def unregister(self, addr):
            return 0

    monkeypatch.setattr(nur, "_load_cudart", lambda cudart, b: (Calls(), "fake libcudart"))
    monkeypatch.setattr(nur, "pin_for_cuda", pin_for_cuda)
    pool = nur.PinnedPool(backend=backend, cudart="fake")
    assert pool.registered == "cuda" and events == ["probe"]  # "auto": a page pins
    pool.alloc(8 * PAGE, node=5)
    assert "pin" in events and "bind" in events and "prefault" in events
    pin_at = events.index("pin")
    assert events.index("bind") < pin_at and events.index("prefault") < pin_at
    pool.close()
    assert events[-1] == "unpin"


def test_register_auto_without_a_runtime_is_a_host_pool(monkeypatch, tmp_path):
    monkeypatch.setattr(nur, "_load_cudart", lambda cudart, b: (None, "no libcudart (test)"))
    pool = nur.PinnedPool("all", backend=nu.LinuxBackend())
    assert pool.registered is None and "no libcudart" in pool.register_why
    with pytest.raises(OSError):
        nur.PinnedPool("all", register="cuda", backend=nu.LinuxBackend())
    assert nur.PinnedPool("all", register=None, backend=nu.LinuxBackend()).registered is None


def test_register_auto_with_a_runtime_that_cannot_pin_is_a_host_pool(monkeypatch):
    """A libcudart without a driver (or a GPU) loads, but registering fails: "auto"
    makes a host pool and says why; the runtime's error is cleared."""
    cleared = []

    class Calls:
        api = nur._PIN_APIS[0]

        def register(self, addr, size, flags):
            return 35

        def clear_error(self):
            cleared.append(True)

        error_string = None

    monkeypatch.setattr(nur, "_load_cudart", lambda cudart, b: (Calls(), "libcudart.so.12"))
    pool = nur.PinnedPool("all", backend=nu.LinuxBackend())
    assert pool.registered is None and "cannot pin a page" in pool.register_why
    assert "CUDA error 35" in pool.register_why and cleared == [True]


def test_fit_answers_per_node_before_anything_is_mapped():
    pool = nur.PinnedPool(backend=sim("b200-snc3"))
    answers = pool.fit(1 << 30)
    assert sorted(answers) == [0, 2, 3, 5] and all(r.ok for r in answers.values())
    assert not pool.fit(1 << 50, node=2)[2].ok
    assert all(s["bytes"] == 0 for s in pool.stats().values())


def test_torch_is_imported_only_when_a_tensor_is_asked_for():
    pool = nur.PinnedPool(backend=sim("b200-snc3"))
    pool.alloc(PAGE, node=0)
    assert "torch" not in sys.modules or pytest.skip("torch was imported before")
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            pool.tensor((4, 4), "float32", node=0)
        return
    t = pool.tensor((4, 4), torch.float32, node=0)
    t.fill_(1.0)
    assert nu.buffer_range(t)[1] == 64
    pool.free(t)


def test_block_buffer_is_the_memory_itself():
    pool = nur.PinnedPool(backend=sim("b200-snc3"))
    blk = pool.alloc(100, node=2)
    view = blk.buffer()
    view[:3] = b"abc"
    assert len(view) == 100 and nu.ctypes.string_at(blk.address, 3) == b"abc"


def test_this_machine_a_64_mib_block_raises_rss_by_64_mib():
    """Exact size on the live kernel: RSS grows by 64 MiB +- a page (a power-of-two
    allocator would take 128 MiB for 64 MiB + 1).  RSS from smaps_rollup, which walks
    the page tables (statm's counters lag for pages faulted by other threads)."""
    import re

    def rss():
        with open("/proc/self/smaps_rollup") as f:
            return int(re.search(r"^Rss:\s+(\d+)", f.read(), re.M).group(1)) * 1024

    warm = nur.PinnedPool("all", register=None, backend=nu.LinuxBackend())
    warm.alloc(64 * MiB, node=min(warm.nodes))  # prefault's threads and their stacks
    warm.close()
    pool = nur.PinnedPool("all", register=None, backend=nu.LinuxBackend())
    before = rss()
    blk = pool.alloc(64 * MiB, node=min(pool.nodes))
    grew = rss() - before
    with open("/proc/self/smaps") as f:
        vmas = f.read().split("\n")
    head = next(i for i, ln in enumerate(vmas) if ln.startswith(f"{blk.address:x}-"))
    vma_rss = next(ln for ln in vmas[head:] if ln.startswith("Rss:"))
    pool.close()
    assert blk.size == 64 * MiB
    assert int(vma_rss.split()[1]) * 1024 == 64 * MiB  # the block's own mapping: exact
    # the process: 64 MiB, plus what the interpreter itself allocates meanwhile (a few
    # pages of its heap), far from the 128 MiB of a power-of-two allocator
    assert 0 <= grew - 64 * MiB <= 4 * PAGE, grew


def test_shared_form_each_process_allocates_from_its_nodes_part():
    """One region, parts on nodes 0, 2, 3, 5; two processes attach it, each allocating
    from its own node's part; a full part raises, never lends another part."""
    b = sim("b200-snc3")
    size = 4 * 16 * PAGE
    lay = nur.Layout.parts([0, 2, 3, 5])
    with nur.SharedRegion.create("pool", size, layout=lay, kind="posix", backend=b) as region:
        first = nur.PinnedPool.shared(region, nodes=[0])
        other = b.process()
        theirs = nur.SharedRegion.attach("pool", kind="posix", backend=other)
        second = nur.PinnedPool.shared(theirs, nodes=[5])
        assert first.nodes == {0} and second.nodes == {5}
        x = first.alloc(3 * PAGE + 1, node=0)
        y = second.alloc(16 * PAGE, node=5)
        assert region.address <= x.address < region.address + 16 * PAGE  # part 0
        assert y.address - theirs.address == 3 * 16 * PAGE  # part 3: node 5's
        mine = region.address + (y.address - theirs.address)  # the creator faulted it in
        assert nu.placement(mine, y.size, backend=b) == {5: 16 * PAGE}
        with pytest.raises(nur.PoolExhausted, match="node 5"):
            second.alloc(PAGE, node=5)  # its part is full: no growth, no lending
        assert first.stats()[0] == {
            "bytes": 16 * PAGE,
            "used": 4 * PAGE,
            "free": 12 * PAGE,
            "largest_free": 12 * PAGE,
            "blocks": 1,
            "budget": 0,
        }
        first.close()
        second.close()
        theirs.close()
    with pytest.raises(ValueError):
        with nur.SharedRegion.create(
            "pool2", size, policy="interleave", kind="posix", backend=b
        ) as r:
            nur.PinnedPool.shared(r)  # no extent bound to one node
