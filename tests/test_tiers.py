"""Tiered memory (issue 11): memory tiers, HMAT, the default memory nodes and weighted
interleave, against the cxl-memory-node and gh200 fixtures and the simulator."""

import errno
import json
import os
import re

import pytest
from conftest import fixture_root, fixture_tree, nu, nur, nut, saved_backend, sim

MiB = 1 << 20


def topo(name):
    return nu.read_topology(backend=saved_backend(fixture_root(name)))


def counts(backend, start, length):
    out = {}
    for line in backend.read_text("/proc/self/numa_maps").splitlines():
        addr = int(line.split(" ", 1)[0], 16)
        if start <= addr < start + length:
            for n, c in re.findall(r" N(\d+)=(\d+)", line):
                out[int(n)] = out.get(int(n), 0) + int(c)
    return out


# -- reading ----------------------------------------------------------------------------


def test_cxl_tiers_and_hmat_read_back():
    t = topo("cxl-memory-node")
    assert dict(t.memory_tiers) == {4: frozenset({0, 1}), 22: frozenset({2})}
    assert [t.nodes[n].tier for n in (0, 1, 2)] == [4, 4, 22]
    a = t.nodes[2].access
    assert (
        a.read_bandwidth_mbps,
        a.write_bandwidth_mbps,
        a.read_latency_ns,
        a.write_latency_ns,
        a.initiators,
    ) == (32000, 28000, 270, 300, frozenset({0}))
    assert t.nodes[0].access.initiators == frozenset({0})
    assert [t.nodes[n].kind for n in (0, 1, 2)] == ["dram", "dram", "movable-only"]
    assert t.nodes[2].has_normal_memory is False and t.nodes[0].has_normal_memory
    assert dict(t.interleave_weights) == {0: 1, 1: 1, 2: 1}
    assert t.interleave_auto is None


def test_gh200_hbm_is_gpu_memory():
    t = topo("gh200")
    assert t.nodes[1].kind == "gpu"
    assert "0009:01:00.0" in t.nodes[1].kind_evidence
    assert t.nodes[0].kind == "dram" and t.nodes[0].tier == 4
    assert t.nodes[5].kind == "no-memory" and t.nodes[5].tier is None
    assert t.interleave_weights is None  # 6.8: no weighted interleave


def test_no_tier_data_is_none_and_empty():
    t = topo("qemu-x86_64-two-node")
    assert dict(t.memory_tiers) == {} and t.nodes[0].tier is None
    assert t.nodes[0].access is None
    j = nu.to_json(t)
    assert j["memory_tiers"] == {} and j["nodes"][0]["access"] is None


def _copy(name, tmp_path):
    """The parts of a fixture the memory facts come from (the CPU and PCI trees
    would make the copy slow and do not matter here)."""
    dst = tmp_path / name
    for rel in ("sys/devices/system/node", "sys/devices/virtual", "sys/kernel/mm/mempolicy"):
        fixture_tree(name, dst / rel, sub="root/" + rel)
    return dst


@pytest.mark.parametrize(
    "rel,text,what",
    [
        ("sys/devices/virtual/memory_tiering/memory_tier22/nodelist", "2-x\n", "nodelist"),
        ("sys/devices/system/node/node2/access0/initiators/read_latency", "fast\n", "read_latency"),
        ("sys/kernel/mm/mempolicy/weighted_interleave/node1", "heavy\n", "node1"),
        ("sys/devices/system/node/has_normal_memory", "0-1,\n", "has_normal_memory"),
    ],
)
def test_malformed_files_are_problems_not_crashes(tmp_path, rel, text, what):
    root = _copy("cxl-memory-node", tmp_path)
    (root / rel).write_text(text)
    t = nu.read_topology(backend=saved_backend(str(root)))
    assert any(what in p for p in t.problems), t.problems
    json.dumps(nu.to_json(t))
    nu.memory_node_choice(t)


def test_status_json_and_text(capsys):
    assert nu.main(["status", "--root", fixture_root("cxl-memory-node"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["memory_tiers"] == {"4": [0, 1], "22": [2]}
    assert rep["interleave_weights"] == {"0": 1, "1": 1, "2": 1}
    n2 = rep["nodes"][2]
    assert n2["tier"] == 22 and n2["kind"] == "movable-only"
    assert set(n2["access"]) == {
        "read_bandwidth_mbps",
        "write_bandwidth_mbps",
        "read_latency_ns",
        "write_latency_ns",
        "initiators",
    }
    assert rep["default_memory_nodes"]["nodes"] == [0, 1]
    assert "2" in rep["default_memory_nodes"]["left_out"]
    assert nu.main(["status", "--root", fixture_root("gh200")]) == 0
    text = capsys.readouterr().out
    assert "left out: node 1: GPU memory" in text
    assert "NUMA_NODES" in text and "tier 17" in text and "450000" in text


# -- the default -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,want",
    [
        ("cxl-memory-node", {0, 1}),
        ("gh200", {0}),
        ("sparse-ids", {0, 8}),
        ("qemu-x86_64-memory-only", {0, 1}),
        ("xeon-max-hbm-flat", {0, 1}),
        # plain machines: every node with memory in the cpuset, as before
        ("dual-socket-8gpu", {0, 1}),
        ("four-node-asym", {0, 1, 2, 3}),
        ("single-node", {0}),
        ("container-cpuset", {1}),
        ("memoryless-cpu-node", {1, 2}),
        ("no-node-dir", {0}),
    ],
)
def test_default_memory_nodes(name, want):
    t = topo(name)
    assert nu.default_memory_nodes(t) == want
    c = nu.memory_node_choice(t)
    assert set(c.left_out) == set(t.nodes_with_memory) - want
    assert all(c.left_out.values())


def _tiered(tiers, normal=True):
    """qemu-x86_64-memory-only (CPU nodes 0-1, CPU-less node 2) with given tiers."""
    t = topo("qemu-x86_64-memory-only")
    nodes = {n: v._replace(tier=tiers.get(n), has_normal_memory=normal) for n, v in t.nodes.items()}
    by = {}
    for n, tr in tiers.items():
        by.setdefault(tr, set()).add(n)
    return t._replace(nodes=nodes, memory_tiers={k: frozenset(v) for k, v in by.items()})


def test_hbm_flat_mode_faster_cpu_less_tier_is_opt_in():
    c = nu.memory_node_choice(_tiered({0: 4, 1: 4, 2: 3}))
    assert c.nodes == {0, 1} and "faster CPU-less tier 3" in c.left_out[2]
    assert "memory tiers" in c.basis


def test_slower_tier_left_out_and_tiers_beat_distance():
    c = nu.memory_node_choice(_tiered({0: 4, 1: 4, 2: 22}))
    assert c.nodes == {0, 1} and "slower memory tier 22" in c.left_out[2]
    # one tier for all (no HMAT): distances decide, and say so
    c = nu.memory_node_choice(_tiered({0: 4, 1: 4, 2: 4}))
    assert c.nodes == {0, 1} and "distances" in c.basis


def test_cpuset_limits_and_never_empty():
    t = topo("cxl-memory-node")._replace(allowed_mems=frozenset({2}))
    assert nu.default_memory_nodes(t) == {2}  # the only allowed node stays


@pytest.mark.parametrize(
    "name,fast,every", [("cxl-memory-node", {0, 1}, [0, 1, 2]), ("gh200", {0}, [0, 1])]
)
def test_done_when_region_and_interleave_use_fast_nodes(name, fast, every, anon):
    b = sim(name)
    with nur.SharedRegion.create("t", 64 * MiB, policy="interleave", backend=b) as r:
        assert set(r.policy.nodes) == fast
        assert r.policy if len(fast) > 1 else r.policy.reason == "single-node"
        assert set(r.placement()) == fast
    addr, size = anon(64 * MiB, b.page_size)
    res = nu.interleave(addr, size, backend=b)
    if len(fast) > 1:
        assert res and res.nodes == fast
    else:
        assert not res and res.reason == "single-node"
    b.touch(addr, size)
    assert set(counts(b, addr, size)) == fast
    addr, size = anon(64 * MiB, b.page_size)
    res = nu.interleave(addr, size, nodes=every, backend=b)
    assert res and res.nodes == set(every)
    b.touch(addr, size)
    assert set(counts(b, addr, size)) == set(every)


def test_gpu_plans_and_choose_node_avoid_gpu_memory():
    b = sim("gh200")
    choice = nut.choose_node(backend=b)
    assert choice.node == 0
    for p in nu.gpu_plans("none", backend=b):
        assert 1 not in p.memory_nodes


# -- weighted interleave -----------------------------------------------------------------


def test_weights_3_to_1_exact_split(anon):
    b = sim("cxl-memory-node", uid=0)
    prev = nu.set_interleave_weights({0: 3, 2: 1}, backend=b)
    assert prev == {0: 1, 1: 1, 2: 1}
    assert nu.interleave_weights(backend=b) == {0: 3, 1: 1, 2: 1}
    addr, size = anon(64 * MiB)
    res = nu.weighted_interleave(addr, size, nodes=[0, 2], backend=b)
    assert res and res.mode == "weighted_interleave"
    b.touch(addr, size)
    assert counts(b, addr, size) == {0: 12288, 2: 4096}
    assert "weighted interleave:0,2" in b.read_text("/proc/self/numa_maps")
    entries = [
        e
        for e in nu.parse_numa_maps(b.read_text("/proc/self/numa_maps"))
        if e.mode == "weighted interleave"
    ]
    assert entries and entries[0].nodes == {0, 2}
    # the order inside each period: node 0 takes 3 consecutive indices, then node 2
    page = b.page_size
    first = addr // page % 4  # interleave index of the first page
    want = [0, 0, 0, 2]
    for i in range(8):
        assert nu.node_of(addr + i * page, backend=b) == want[(first + i) % 4]
    assert nu.set_interleave_weights(prev, backend=b) == {0: 3, 1: 1, 2: 1}


def test_weights_5_3_1_over_sparse_ids(anon):
    b = sim("sparse-ids", uid=0, weighted_interleave=True)
    nu.set_interleave_weights({0: 5, 8: 3, 250: 1}, backend=b)
    page = b.page_size
    addr, size = anon(9 * 64 * page, page)
    assert nu.weighted_interleave(addr, size, nodes=[0, 8, 250], backend=b)
    b.touch(addr, size)
    assert counts(b, addr, size) == {0: 5 * 64, 8: 3 * 64, 250: 64}


def test_task_policy_weighted(anon):
    b = sim("cxl-memory-node", uid=0)
    nu.set_interleave_weights({0: 3, 1: 1}, backend=b)
    assert nu.set_thread_policy("weighted-interleave", [0, 1], backend=b)
    try:
        # a fault in a VMA uses the VMA's interleave index even under a task policy
        addr, size = anon(4 * MiB)
        b.touch(addr, size)
        assert counts(b, addr, size) == {0: 768, 1: 256}
        # the per-task counter (no-index allocations): 0, 0, 0, 1, 0, ...
        k = b.kernel.topo
        assert [b._alloc(None, None) for _ in range(5)] == [0, 0, 0, 1, 0]
        assert k is b.kernel.topo
    finally:
        nu.set_thread_policy("default", backend=b)


def test_numa_strict_accepts_the_fallback_asked_for(anon, monkeypatch):
    """NUMA_STRICT=1 makes a failure raise; a plain interleave asked for with
    fallback="interleave" on a kernel before 6.9 is not one."""
    monkeypatch.setenv("NUMA_UTILS_NUMA_STRICT", "1")
    b = sim("cxl-memory-node", weighted_interleave=False)
    addr, size = anon(4 * MiB)
    res = nu.weighted_interleave(addr, size, nodes=[0, 1], fallback="interleave", backend=b)
    assert res and res.mode == "interleave"
    assert nu.get_policy(addr, backend=b).mode == nu.Mode.INTERLEAVE
    with pytest.raises(OSError):  # without the fallback: strict, so it raises
        nu.weighted_interleave(addr, size, nodes=[0, 1], backend=b)
    with pytest.raises(ValueError, match="no NUMA node 77"):  # a typo: strict or not
        nu.weighted_interleave(addr, size, nodes=[0, 77], fallback="interleave", backend=b)
    b.fail("mbind", errno.EPERM)
    with pytest.raises(PermissionError):  # the fallback asked for, but it fails too
        nu.weighted_interleave(addr, size, nodes=[0, 1], fallback="interleave", backend=b)


def test_shared_region_weighted_policy():
    b = sim("cxl-memory-node", uid=0)
    nu.set_interleave_weights({0: 3, 1: 1}, backend=b)
    with nur.SharedRegion.create("w", 64 * MiB, policy="weighted-interleave", backend=b) as r:
        assert r.policy and r.policy.nodes == {0, 1}
        assert r.placement() == {0: 48 * MiB, 1: 16 * MiB}


def test_old_kernel_says_why_and_fallback_is_explicit(anon):
    b = sim("cxl-memory-node", weighted_interleave=False)
    addr, size = anon(4 * MiB)
    res = nu.weighted_interleave(addr, size, nodes=[0, 1], backend=b)
    assert not res and res.reason == "no-weighted-interleave" and res.errno == errno.EINVAL
    assert nu.get_policy(addr, backend=b).mode == nu.Mode.DEFAULT  # not a plain one
    with pytest.raises(OSError) as e:
        nu.weighted_interleave(addr, size, nodes=[0, 1], strict=True, backend=b)
    assert e.value.errno == errno.EINVAL
    res = nu.weighted_interleave(addr, size, nodes=[0, 1], fallback="interleave", backend=b)
    assert res and res.mode == "interleave"
    assert nu.interleave_weights(backend=b) is None
    with pytest.raises(OSError) as e:
        nu.set_interleave_weights({0: 2}, backend=b)
    assert e.value.errno == errno.ENOTSUP
    r = nur.SharedRegion.create("old", 8 * MiB, policy="weighted-interleave", backend=b)
    try:
        assert not r.policy and r.policy.reason == "no-weighted-interleave"
    finally:
        r.destroy()


def test_set_weights_needs_root_and_valid_weights():
    b = sim("cxl-memory-node")  # uid 1000
    with pytest.raises(PermissionError):
        nu.set_interleave_weights({0: 3}, backend=b)
    root = sim("cxl-memory-node", uid=0)
    for bad in (0, 256, "3", True):
        with pytest.raises(ValueError):
            nu.set_interleave_weights({0: bad}, backend=root)
    with pytest.raises(ValueError, match=r"no NUMA node 7 \(this machine has nodes 0-2\)"):
        nu.set_interleave_weights({7: 2}, backend=root)
    assert nu.interleave_weights(backend=root) == {0: 1, 1: 1, 2: 1}


def test_set_weights_refuses_a_saved_tree():
    with pytest.raises(OSError):
        nu.set_interleave_weights({0: 2}, backend=saved_backend(fixture_root("cxl-memory-node")))


def test_suggest_weights_like_the_kernel():
    t = topo("cxl-memory-node")
    # min(read, write) bandwidth: 230400, 230400, 28000 of 488800 -> 32 * share
    assert nu.suggest_weights(t) == {0: 15, 1: 15, 2: 1}
    assert nu.suggest_weights(t, initiator=0) == {0: 28, 2: 3}
    assert nu.suggest_weights(topo("qemu-x86_64-two-node")) == {}
    # equal bandwidth reduces by the GCD to 1:1
    g = t._replace(nodes={n: v._replace(access=t.nodes[0].access) for n, v in t.nodes.items()})
    assert nu.suggest_weights(g) == {0: 1, 1: 1, 2: 1}


def test_gather_saves_tier_files(tmp_path):
    import subprocess
    import sys

    tool = os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools", "gather.py")
    out = tmp_path / "g"
    src = fixture_tree("cxl-memory-node", tmp_path / "src")
    subprocess.run(
        [sys.executable, tool, "--root", src, "--no-self-status", str(out)],
        check=True,
        capture_output=True,
    )
    a = nu.read_topology(backend=saved_backend(str(out / "root")))
    b = topo("cxl-memory-node")
    assert a.nodes == b.nodes and a.memory_tiers == b.memory_tiers
    assert a.interleave_weights == b.interleave_weights


@pytest.mark.parametrize(
    "weights,match",
    [
        ({0: 7, True: 3}, "node id must be an int, not True"),
        ({0: 7, 1.0: 3}, "node id must be an int, not 1.0"),
        ({0: 7, "1": 3}, "node id must be an int, not '1'"),
        ({0: 7, 1: 0}, "must be 1-255, not 0"),
        ({0: 7, 1: 256}, "must be 1-255, not 256"),
        ({0: 7, 1: True}, "must be 1-255, not True"),
        ({0: 7, 9: 3}, "no NUMA node 9 (this machine has nodes 0-2)"),
    ],
)
def test_set_interleave_weights_is_all_or_nothing(weights, match):
    """A bad entry anywhere in the mapping writes no weight at all (node 0's 7 was
    written before {0: 7, True: 3} failed)."""
    b = sim("cxl-memory-node", uid=0)
    with pytest.raises((ValueError, OSError), match=re.escape(match)):
        nu.set_interleave_weights(weights, backend=b)
    assert nu.interleave_weights(backend=b) == {0: 1, 1: 1, 2: 1}
