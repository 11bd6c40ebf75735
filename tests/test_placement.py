# SPDX-License-Identifier: Apache-2.0
"""Issue 40: pages placed by the threads that fault them.  The core's prefault places
each extent from threads whose own policy (set_mempolicy) or, where the policy
syscalls are denied (EPERM), whose CPUs are on its nodes; the simulator models
first touch per thread and vm.max_map_count."""

import errno
import threading

import pytest
from conftest import fixture_root, fixture_tree, nu, nur, nusim, saved_backend, sim

MiB = 1 << 20
PAGE = 4096


def _alternating(count, cell, nodes):
    """A vLLM-shaped list of extents: cell i on nodes[i % len(nodes)], bound."""
    return [(i * cell, cell, "bind", {nodes[i % len(nodes)]}) for i in range(count)]


def _per_extent(b, addr, extents):
    return [nu.placement(addr + off, n, backend=b, method="move_pages") for off, n, _, _ in extents]


def _maps_lines(b):
    return b.read_text("/proc/self/maps").count("\n")


@pytest.mark.parametrize("denied", [False, True], ids=["thread-policy", "cpu-affinity"])
def test_prefault_places_each_extent_from_its_nodes_threads(denied):
    """No mbind, one VMA: each cell lands on its node, from the thread's own policy,
    or under EPERM (seccomp) from its CPUs."""
    b = sim("dual-socket-8gpu")
    addr = b.map_object("cells", 512 * 64 * 1024)
    extents = _alternating(512, 64 * 1024, [0, 1])
    before = _maps_lines(b)
    if denied:
        b.fail("*", errno.EPERM)
    res = nu.prefault(addr, 512 * 64 * 1024, backend=b, shared=True, extents=extents)
    b.clear_failures()
    want = "sched_setaffinity" if denied else "set_mempolicy"
    assert res["placed_by"] == "thread" and res["thread_placement"] == want
    assert res["unplaced"] == {} and res["bytes"] == 512 * 64 * 1024
    assert res["threads"] >= 2  # both nodes fault at once
    got = _per_extent(b, addr, extents)
    assert got == [{i % 2: 64 * 1024} for i in range(512)]
    assert _maps_lines(b) == before  # no VMA of its own per cell
    assert not [c for c in b.kernel.calls if c[0] == "mbind"]


def test_a_creator_bound_to_node_0_still_places_node_1_cells():
    """Under EPERM the threads use any CPU the cpuset allows, not the caller's mask;
    the caller's own mask is left as it was."""
    b = sim("dual-socket-8gpu")
    node0 = b.topology.nodes[0].cpus
    b.call("sched_setaffinity", 0, node0)
    addr = b.map_object("bound", 64 * MiB)
    extents = [(0, 32 * MiB, "bind", {1}), (32 * MiB, 32 * MiB, "bind", {0})]
    b.fail("*", errno.EPERM)
    nu.prefault(addr, 64 * MiB, threads=1, backend=b, extents=extents)
    b.clear_failures()
    assert _per_extent(b, addr, extents) == [{1: 32 * MiB}, {0: 32 * MiB}]
    assert b.call("sched_getaffinity", 0) == node0


def test_only_the_extents_named_are_faulted():
    b = sim("dual-socket-8gpu")
    addr = b.map_object("mine", 8 * 64 * 1024)
    mine = _alternating(8, 64 * 1024, [0, 1])[1::2]  # rank 1's cells
    res = nu.prefault(addr, 8 * 64 * 1024, backend=b, extents=mine)
    assert res["bytes"] == 4 * 64 * 1024
    assert nu.placement(addr, 8 * 64 * 1024, backend=b) == {1: 4 * 64 * 1024}


def test_the_seeds_flow_under_eperm_spreads_by_thread():
    """interleave() denied (EPERM), then a plain prefault(): the pages are spread over
    the nodes by thread, in granules the result states, not left on one node."""
    b = sim("dual-socket-8gpu")
    addr = b.map_object("seed", 64 * MiB)
    b.fail("*", errno.EPERM)
    res = nu.interleave(addr, 64 * MiB, backend=b)
    assert not res and res.reason == "EPERM"
    got = nu.prefault(addr, 64 * MiB, threads=1, backend=b, shared=True)
    b.clear_failures()
    assert got["placed_by"] == "thread" and got["thread_placement"] == "sched_setaffinity"
    assert got["granularity"] == 2 * MiB
    assert nu.placement(addr, 64 * MiB, backend=b) == {0: 32 * MiB, 1: 32 * MiB}
    # Once placed, the range is forgotten: a later prefault of it is a plain one.
    assert "placed_by" not in nu.prefault(addr, 64 * MiB, backend=b)


def test_a_policy_applied_later_wins_over_the_denial():
    """A range's own policy governs its pages whatever thread faults them."""
    b = sim("dual-socket-8gpu")
    addr = b.map_object("later", 8 * MiB)
    b.fail("mbind", errno.EPERM, times=1)
    assert not nu.interleave(addr, 8 * MiB, backend=b)
    assert nu.bind(addr, [1], 8 * MiB, backend=b).placed_by == "policy"
    nu.prefault(addr, 8 * MiB, backend=b)
    assert nu.placement(addr, 8 * MiB, backend=b) == {1: 8 * MiB}


def test_a_node_whose_cpus_the_cpuset_forbids_is_reported_per_extent():
    b = sim("dual-socket-8gpu", cpus_allowed=sim("dual-socket-8gpu").topology.nodes[0].cpus)
    addr = b.map_object("forbidden", 4 * MiB)
    extents = [(0, 2 * MiB, "bind", {0}), (2 * MiB, 2 * MiB, "bind", {1})]
    b.fail("*", errno.EPERM)
    res = nu.prefault(addr, 4 * MiB, backend=b, extents=extents)
    b.clear_failures()
    assert res["unplaced"] == {1: "no-cpu"}
    assert _per_extent(b, addr, extents)[0] == {0: 2 * MiB}
    # With its own policy a thread places there all the same (the cpuset allows the memory).
    b2 = sim("dual-socket-8gpu", cpus_allowed=b.cpus_allowed)
    addr = b2.map_object("forbidden", 4 * MiB)
    res = nu.prefault(addr, 4 * MiB, backend=b2, extents=extents)
    assert res["unplaced"] == {} and _per_extent(b2, addr, extents)[1] == {1: 2 * MiB}


def test_a_cpu_less_node_is_placed_by_policy_not_by_cpu():
    b = sim("qemu-x86_64-memory-only")
    addr = b.map_object("hbm", 3 * MiB)
    extents = [(i * MiB, MiB, "bind", {i}) for i in range(3)]
    res = nu.prefault(addr, 3 * MiB, backend=b, extents=extents)
    assert res["unplaced"] == {}
    assert _per_extent(b, addr, extents) == [{0: MiB}, {1: MiB}, {2: MiB}]
    b = sim("qemu-x86_64-memory-only")
    addr = b.map_object("hbm", 3 * MiB)
    b.fail("*", errno.EPERM)
    res = nu.prefault(addr, 3 * MiB, backend=b, extents=extents)
    b.clear_failures()
    assert res["unplaced"] == {2: "no-cpu"}
    assert _per_extent(b, addr, extents)[:2] == [{0: MiB}, {1: MiB}]


def test_a_node_outside_mems_allowed_is_reported_per_extent():
    b = sim("dual-socket-8gpu", mems_allowed=[0])
    addr = b.map_object("mems", 4 * MiB)
    extents = [(0, 2 * MiB, "bind", {0}), (2 * MiB, 2 * MiB, "bind", {1})]
    res = nu.prefault(addr, 4 * MiB, backend=b, extents=extents)
    assert res["unplaced"] == {1: "cpuset"}
    assert nu.placement(addr, 4 * MiB, backend=b) == {0: 4 * MiB}


# -- the simulator: first touch per thread, vm.max_map_count ------------------------------


def test_sim_first_touch_is_per_thread():
    """A thread's own CPUs place the pages it faults; the main thread's mask (and
    /proc/self/status) is untouched, and a new thread starts from the main one's."""
    b = sim("dual-socket-8gpu")
    node1 = b.topology.nodes[1].cpus
    addr = b.map_object("tt", 4 * MiB)
    seen = {}

    def worker():
        b.call("sched_setaffinity", 0, node1)
        seen["mask"] = b.call("sched_getaffinity", 0)
        b.touch(addr, 2 * MiB)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    b.touch(addr + 2 * MiB, 2 * MiB)
    assert seen["mask"] == node1 and b.call("sched_getaffinity", 0) == b.cpus_allowed
    assert nu.placement(addr, 2 * MiB, backend=b) == {1: 2 * MiB}
    assert nu.placement(addr + 2 * MiB, 2 * MiB, backend=b) == {0: 2 * MiB}
    other = []
    t = threading.Thread(target=lambda: other.append(b.call("sched_getaffinity", 0)))
    t.start()
    t.join()
    assert other == [b.cpus_allowed]


def _mode_into(b, out):
    out.append(nu.get_policy(backend=b).mode)


def test_sim_thread_policy_dies_with_its_thread():
    b = sim("dual-socket-8gpu")

    def worker():
        nu.set_thread_policy("bind", [1], backend=b)

    for _ in range(3):  # Python reuses thread idents: none may inherit a dead one's
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        got = []
        t = threading.Thread(target=_mode_into, args=(b, got))
        t.start()
        t.join()
        assert got == [nu.Mode.DEFAULT]


def test_sim_models_the_map_count_limit():
    b = sim("dual-socket-8gpu")
    assert b.read_text("/proc/sys/vm/max_map_count") == "65530\n"
    b.kernel.max_map_count = _maps_lines(b) + 3
    addr = b.map_object("split", 16 * PAGE)
    nu.mbind(addr + PAGE, PAGE, nu.Mode.BIND, [1], backend=b)  # two splits: 3 VMAs
    assert _maps_lines(b) == b.kernel.max_map_count
    with pytest.raises(OSError) as e:
        nu.mbind(addr + 4 * PAGE, PAGE, nu.Mode.BIND, [1], backend=b)
    assert e.value.errno == errno.ENOMEM
    with pytest.raises(OSError) as e:
        b.map_object("one more", PAGE)
    assert e.value.errno == errno.ENOMEM


def test_sim_takes_a_saved_machines_max_map_count(tmp_path):
    root = fixture_tree("qemu-x86_64-two-node", tmp_path)
    (tmp_path / "proc" / "sys" / "vm").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc" / "sys" / "vm" / "max_map_count").write_text("1000\n")
    b = nusim.SimulatedBackend(root)
    assert b.kernel.max_map_count == 1000
    assert b.read_text("/proc/sys/vm/max_map_count") == "1000\n"


# -- regions: the mechanism per region, ranks, the vLLM port --------------------------------


def _vmas(b):
    return b.read_text("/proc/self/maps").count("\n")


def test_region_past_the_map_count_is_placed_by_thread_per_cell():
    """A vLLM-shaped layout whose runs would take more VMAs than vm.max_map_count leaves:
    no mbind per cell, each cell on its rank's node, the VMA count up by at most 2."""
    b = sim("dual-socket-8gpu")
    b.kernel.max_map_count = 2000  # 4,096 alternating cells: 4,097 VMAs by policy
    lay = nur.Layout.blocks(PAGE, [0, 1])
    before = _vmas(b)
    with nur.SharedRegion.create("vllm", 4096 * PAGE, layout=lay, backend=b) as r:
        assert r.policy and r.policy.placed_by == "thread" and r.policy.reason == "max-map-count"
        assert {p.placed_by for p in r.policies} == {"thread"}
        assert _vmas(b) - before <= 2
        assert all(p.ok for p in r.placement(by_extent=True))
        assert r.to_json()["policy"]["placed_by"] == "thread"


def test_each_rank_places_its_own_cells():
    """The creator makes the region without prefault; each rank attaches and faults its
    own cells from its own node (region.prefault(rank=)), even under EPERM with every
    process bound to one node."""
    b = sim("dual-socket-8gpu")
    b.fail("*", errno.EPERM)
    lay = nur.Layout.blocks(16 * PAGE, [0, 1])
    with nur.SharedRegion.create("ranks", 64 * 16 * PAGE, layout=lay, prefault=False, backend=b):
        for rank in (0, 1):
            worker = b.process(cpus_allowed=b.topology.nodes[rank].cpus)
            with nur.SharedRegion.attach("ranks", backend=worker) as mine:
                got = mine.prefault(rank=rank)
                assert got["bytes"] == 32 * 16 * PAGE and got["extents"] == 32
                assert mine.layout.of_rank(rank) == list(range(rank, 64, 2))
        b.clear_failures()
        with nur.SharedRegion.attach("ranks", backend=b.process(), prefault=True) as whole:
            assert all(p.ok for p in whole.placement(by_extent=True))
    with pytest.raises(ValueError, match="no rank 2"):
        lay.bound(64 * 16 * PAGE, PAGE).of_rank(2)


def test_layout_blocks_takes_each_ranks_node_from_the_gpu_plans():
    b = sim("dual-socket-8gpu")
    lay = nur.Layout.blocks(256 * 1024, gpus=range(8), backend=b)
    plans = nu.gpu_plans(memory="prefer", backend=b)
    assert str(lay) == "blocks:256K:bind:" + "/".join(str(p.memory_nodes[0]) for p in plans)
    assert str(lay) == "blocks:256K:bind:0/0/0/0/1/1/1/1"
    assert nur.Layout.blocks(256 * 1024, [0, 1]) == nur.Layout.parse("blocks:256K:bind:0/1")
    with pytest.raises(ValueError, match="CUDA device 8"):
        nur.Layout.blocks(256 * 1024, gpus=range(9), backend=b)
    with pytest.raises(ValueError, match="nodes or gpus"):
        nur.Layout.blocks(256 * 1024)


def test_the_vllm_ports_eperm_case_gives_4_and_4():
    """vLLM's shared CPU offload buffer on the dual-socket 8-GPU machine, in a container
    that denies the policy syscalls: rank 0 makes it bound to node 0, every worker
    attaches it bound to its GPU's node and faults its own cells: 4 workers' cells on
    node 0, 4 on node 1 (the port had put all 8 on node 0)."""
    b = sim("dual-socket-8gpu")
    cell, rows = 64 * 1024, 16
    lay = nur.Layout.blocks(cell, gpus=range(8), backend=b)
    b.call("sched_setaffinity", 0, b.topology.nodes[0].cpus)
    b.fail("*", errno.EPERM)
    with nur.SharedRegion.create("offload", 8 * rows * cell, layout=lay, prefault=False, backend=b):
        for rank in range(8):
            plan = nu.gpu_plans(backend=b)[rank]
            worker = b.process(cpus_allowed=plan.cpus)
            with nur.SharedRegion.attach("offload", backend=worker) as mine:
                mine.prefault(rank=rank)
        b.clear_failures()
        with nur.SharedRegion.attach("offload", backend=b.process(), prefault=True) as whole:
            per = whole.placement(by_extent=True)
            nodes = [sorted(k for k, v in per[rank].items() if v) for rank in range(8)]
    assert nodes == [[0]] * 4 + [[1]] * 4


def test_one_extent_on_a_forbidden_node_no_longer_voids_the_layout():
    """Issue 38 section 7: the cpuset forbids node 1's CPUs and the policy syscalls are
    denied: every other extent is placed as asked, the one on node 1 is reported."""
    whole = sim("dual-socket-8gpu")
    b = sim("dual-socket-8gpu", cpus_allowed=whole.topology.nodes[0].cpus)
    b.fail("*", errno.EPERM)
    with nur.SharedRegion.create("part", 4 * MiB, layout="parts:bind:0/0/1/0", backend=b) as r:
        assert [p.applied for p in r.policies] == [True, True, False, True]
        assert r.policies[2].reason == "no-cpu" and "cpuset" in r.policies[2].hint
        assert not r.policy and r.policy.reason == "no-cpu" and r.policy.dropped == {1}
        b.clear_failures()
        per = [dict(p) for p in r.placement(by_extent=True)]
        assert per[0] == per[1] == per[3] == {0: MiB}
    with pytest.raises(OSError, match="bind over node 1"):
        b.fail("*", errno.EPERM)
        nur.SharedRegion.create(
            "part", 4 * MiB, layout="parts:bind:0/0/1/0", strict=True, backend=b
        )


def test_fit_weighs_a_saved_machines_max_map_count(tmp_path):
    """fit() on a saved machine: its own vm.max_map_count when the tree has the file,
    else the kernel's default, and the mechanism create would use."""
    lay = "blocks:4K:bind:0/1"  # 16 MiB: 4,096 alternating blocks, 4,097 VMAs by policy
    plain = nur.fit(
        16 * MiB, layout=lay, backend=saved_backend(fixture_root("qemu-x86_64-two-node"))
    )
    assert (plain.vmas_free, plain.placed_by) == (65530 - 4095, "policy")
    root = fixture_tree("qemu-x86_64-two-node", tmp_path)
    (tmp_path / "proc" / "sys" / "vm").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc" / "sys" / "vm" / "max_map_count").write_text("1000\n")
    low = nur.fit(16 * MiB, layout=lay, backend=saved_backend(root))
    assert (low.vmas, low.vmas_free, low.placed_by) == (4097, 750, "thread")
    assert low.exact  # placed as asked, by the threads that prefault it


def test_extents_outside_the_buffer_are_a_clear_error():
    b = sim("dual-socket-8gpu")
    addr = b.map_object("small", MiB)
    for bad in ([(0, 2 * MiB, "bind", {0})], [(-PAGE, PAGE, "bind", {0})]):
        with pytest.raises(ValueError, match="is not in the 1048576 bytes"):
            nu.prefault(addr, MiB, backend=b, extents=bad)
    assert nu.prefault(addr, MiB, backend=b, extents=[(PAGE, 0, "bind", {1})])["bytes"] == 0
    assert nu.placement(addr, MiB, backend=b) == {}
