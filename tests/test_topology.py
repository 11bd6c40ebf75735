"""The topology reader against every fixture's expected.json, and against broken trees."""

import json
import os

import pytest
from conftest import FIXTURES, fixture_root, fixture_text, fixture_tree, nu, saved_backend


def _read(name_or_root):
    root = name_or_root if os.path.isdir(name_or_root) else fixture_root(name_or_root)
    return nu.read_topology(backend=saved_backend(root))


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_matches_expected_json(name):
    expected = json.loads(fixture_text(name, "expected.json"))
    got = nu.to_json(_read(name))
    problems = got.pop("problems")
    expected.pop("problems", None)
    assert problems == [], problems
    assert got == expected


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_has_source_md(name):
    assert fixture_text(name, "SOURCE.md").strip()


@pytest.mark.parametrize("name", FIXTURES)
def test_topology_invariants(name):
    t = _read(name)
    json.dumps(nu.to_json(t))  # JSON-serialisable through one function
    for n in t.nodes.values():
        assert isinstance(n.cpus, frozenset)
        for c in n.cpus:
            assert t.node_of_cpu(c) == n.id
        if t.has_node_dir and len(t.nodes) > 1:
            assert n.distances[n.id] == 10
    assert t.nodes_with_memory <= t.online_nodes <= t.possible_nodes
    assert t.allowed_cpus <= frozenset(t.cpus)
    for g in t.gpus:
        assert g.vendor in nu.GPU_VENDORS


def test_sparse_ids_are_not_assumed_contiguous():
    t = _read("sparse-ids")
    assert t.online_nodes == frozenset({0, 8, 250, 251, 252, 253, 254, 255})
    assert set(t.nodes[8].distances) == set(t.online_nodes)


def test_no_node_dir_is_one_node_with_everything():
    t = _read("no-node-dir")
    assert list(t.nodes) == [0]
    assert t.nodes[0].cpus == t.online_cpus
    assert t.nodes[0].mem_total_kb > 0
    assert t.has_node_dir is False


def test_memory_only_and_memoryless_nodes():
    cxl = _read("cxl-memory-node")
    cpuless = cxl.nodes_with_memory - cxl.nodes_with_cpus
    assert cpuless and all(not cxl.nodes[n].cpus for n in cpuless)
    ml = _read("memoryless-cpu-node")
    memless = ml.nodes_with_cpus - ml.nodes_with_memory
    assert memless and all(ml.nodes[n].mem_total_kb == 0 for n in memless)


def _reversed(mapping):
    return nu.MappingProxyType(dict(sorted(mapping.items(), reverse=True)))


def test_json_lists_every_mapping_in_key_order():
    """Distances, huge pages, memory tiers, interleave weights and left_out come out in
    key order, whatever order they were built in; each value as to_json() gives it."""
    t = _read("cxl-memory-node")
    nodes = {
        n: v._replace(distances=_reversed(v.distances), hugepages=_reversed(v.hugepages))
        for n, v in t.nodes.items()
    }
    t = t._replace(
        nodes=nodes,
        memory_tiers=_reversed(t.memory_tiers),
        interleave_weights=_reversed(t.interleave_weights),
    )
    got = nu.to_json(t)
    for node in got["nodes"]:
        assert list(node["distances"]) == [str(n) for n in sorted(t.nodes)]
        assert list(node["distances"].values()) == [
            t.distance(node["id"], n) for n in sorted(t.nodes)
        ]
        sizes = sorted(t.nodes[node["id"]].hugepages)
        assert list(node["hugepages"]) == [str(kb) for kb in sizes] and len(sizes) > 1
        for kb in sizes:
            assert node["hugepages"][str(kb)] == t.nodes[node["id"]].hugepages[kb]._asdict()
    assert got["memory_tiers"] == {"4": [0, 1], "22": [2]}
    assert list(got["memory_tiers"]) == ["4", "22"]
    assert list(got["interleave_weights"]) == ["0", "1", "2"]
    choice = nu.MemoryNodeChoice(frozenset({0}), _reversed({2: "far", 1: "GPU"}), "test")
    assert list(nu.to_json(choice)["left_out"].items()) == [("1", "GPU"), ("2", "far")]


def test_json_of_memory_access_lists_its_initiators_in_order():
    access = nu.MemoryAccess(1000, 900, None, 80, frozenset({12, 3, 7}))
    assert nu.to_json(access) == {
        "read_bandwidth_mbps": 1000,
        "write_bandwidth_mbps": 900,
        "read_latency_ns": None,
        "write_latency_ns": 80,
        "initiators": [3, 7, 12],
    }
    node = _read("qemu-x86_64-hmat-tiers").nodes[0]
    assert node.access is not None
    assert nu.to_json(node)["access"] == nu.to_json(node.access)


def test_cpuset_smaller_than_machine():
    t = _read("container-cpuset")
    assert t.allowed_cpus < t.online_cpus
    assert t.allowed_mems < t.nodes_with_memory
    assert t.usable_memory_nodes == t.allowed_mems & t.nodes_with_memory


def test_nearest_orders_by_distance():
    t = _read("four-node-asym")
    for n in t.nodes:
        order = t.nearest(n, t.nodes)
        assert order[0] == n
        ds = [t.distance(n, m) for m in order]
        assert ds == sorted(ds)


# -- broken trees: a warning in Topology.problems, never a crash ----------------------


@pytest.fixture
def tree(tmp_path):
    dst = tmp_path / "root"
    fixture_tree("dual-socket-8gpu", dst)
    return dst


NODE = "sys/devices/system/node"


@pytest.mark.parametrize(
    "rel,content,expect",
    [
        (f"{NODE}/node1/cpulist", "garbage!\n", "node1/cpulist"),
        (f"{NODE}/node0/meminfo", "Node 0 MemTotal: lots kB\n", "node0/meminfo"),
        (f"{NODE}/node0/distance", "10 x\n", "node0/distance"),
        (f"{NODE}/node0/distance", "10 21 31\n", "distances ignored"),
        (f"{NODE}/online", "0-\n", "node/online"),
        ("proc/self/status", "Name: x\nCpus_allowed_list:\tzz\n", "Cpus_allowed_list"),
        ("sys/kernel/mm/transparent_hugepage/enabled", "always madvise never\n", "THP"),
        ("proc/sys/kernel/numa_balancing", "on\n", "numa_balancing"),
    ],
)
def test_malformed_files_become_problems(tree, rel, content, expect):
    (tree / rel).write_text(content)
    t = _read(str(tree))
    assert any(expect in p for p in t.problems), t.problems
    assert t.nodes  # still a usable topology


def test_unreadable_file_is_a_problem_not_a_crash(tree):
    p = tree / NODE / "node0" / "meminfo"
    p.unlink()
    p.mkdir()  # reading a directory fails even as root
    t = _read(str(tree))
    assert any("node0/meminfo" in x for x in t.problems)
    assert t.nodes[0].mem_total_kb == 0


def test_cpumap_only_and_nul_terminated(tree):
    for n in (0, 1):
        (tree / NODE / f"node{n}" / "cpulist").unlink()
    want = _read("dual-socket-8gpu")
    got = _read(str(tree))
    assert got.nodes[0].cpus == want.nodes[0].cpus
    assert got.nodes[1].cpus == want.nodes[1].cpus
    (tree / NODE / "online").write_text("0-1\n\0")
    assert _read(str(tree)).online_nodes == frozenset({0, 1})


def test_missing_files_fall_back(tree):
    for rel in (
        f"{NODE}/has_cpu",
        f"{NODE}/has_memory",
        f"{NODE}/possible",
        "proc/self/status",
        "proc/sys/kernel/numa_balancing",
    ):
        os.unlink(tree / rel)
    t = _read(str(tree))
    assert t.nodes_with_cpus == frozenset({0, 1})
    assert t.nodes_with_memory == frozenset({0, 1})
    assert t.possible_nodes == t.online_nodes
    assert t.allowed_cpus == t.online_cpus and t.allowed_mems == frozenset({0, 1})
    assert t.numa_balancing is None
    assert t.problems == ()


def test_live_machine_reads():
    if not os.path.isdir("/sys/devices/system/cpu"):
        pytest.skip("no sysfs here")
    t = nu.read_topology()
    assert t.online_cpus
    assert t.allowed_cpus <= t.online_cpus | frozenset(t.cpus)
    assert os.sched_getaffinity(0) <= t.allowed_cpus | t.online_cpus


def test_synthetic_fixtures_are_what_the_generator_writes():
    """Fixtures are generated, never hand-edited: the generator's --check agrees."""
    import subprocess
    import sys

    from conftest import REPO

    p = subprocess.run(
        [sys.executable, str(REPO / "tools" / "make_fixtures.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(REPO),
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_llc_counts_only_unified_and_data_caches(tree):
    """An Instruction (or unknown-type) cache at a higher level is not the LLC."""
    cpu = tree / "sys/devices/system/cpu"
    for c in os.listdir(cpu):
        idx = cpu / c / "cache" / "index4"
        if not (cpu / c / "cache").is_dir():
            continue
        idx.mkdir()
        (idx / "level").write_text("4\n")
        (idx / "type").write_text("Instruction\n")
        (idx / "shared_cpu_list").write_text("0-191\n")
    t = _read(str(tree))
    assert t.cpus[0].llc == frozenset(range(48)) | frozenset(range(96, 144))
    for c in os.listdir(cpu):
        if (cpu / c / "cache" / "index4").is_dir():
            (cpu / c / "cache" / "index4" / "type").write_text("Unified\n")
    assert _read(str(tree)).cpus[0].llc == frozenset(range(192))


def _looked_up(root):
    """read_topology of saved tree ``root`` and every path it read or listed."""
    b = saved_backend(str(root))
    seen = []
    for name in ("read_text", "listdir", "exists"):
        real = getattr(b, name)
        setattr(b, name, lambda p, real=real: seen.append(p) or real(p))
    return nu.read_topology(backend=b), seen


def test_what_the_first_cpu_lacks_is_not_looked_for_again(tree):
    cpu = tree / "sys/devices/system/cpu"
    full, seen = _looked_up(tree)
    online = sorted(full.online_cpus)
    assert len(online) > 2 and all(full.cpus[c].siblings for c in online)
    assert len({p.split("/cache")[0] for p in seen if "/cache" in p}) > 1  # several CPUs
    # An old kernel (no *_list files) without cacheinfo, as the first online CPU shows.
    for c in online:
        for f in ("topology/thread_siblings_list", "topology/core_cpus_list"):
            (cpu / f"cpu{c}" / f).unlink(missing_ok=True)
        for d in sorted((cpu / f"cpu{c}" / "cache").glob("**/*"), reverse=True):
            d.rmdir() if d.is_dir() else d.unlink()
        (cpu / f"cpu{c}" / "cache").rmdir()
    t, seen = _looked_up(tree)
    first = f"cpu{online[0]}/"
    assert [p for p in seen if "_list" in p and "topology" in p and first not in p] == []
    assert [p for p in seen if p.endswith("/cache") and first not in p] == []
    assert all(t.cpus[c].siblings == frozenset() and t.cpus[c].llc == frozenset() for c in online)
    assert [t.cpus[c].core for c in online] == [full.cpus[c].core for c in online]
    assert t.problems == ()


def test_what_the_first_node_lacks_is_not_looked_for_again(tree):
    node = tree / NODE
    full, seen = _looked_up(tree)
    assert sum(p.endswith("/hugepages") for p in seen) > len(full.nodes) > 1  # each node
    for n in full.nodes:  # an old kernel (cpumap only) without hugetlbfs
        (node / f"node{n}" / "cpulist").unlink()
        for d in sorted((node / f"node{n}" / "hugepages").glob("**/*"), reverse=True):
            d.rmdir() if d.is_dir() else d.unlink()
        (node / f"node{n}" / "hugepages").rmdir()
    t, seen = _looked_up(tree)
    first = f"node{min(full.nodes)}/"
    assert [
        p
        for p in seen
        if p.endswith(("/cpulist", "/hugepages")) and first not in p and "/node/node" in p
    ] == []
    assert {n: v.cpus for n, v in t.nodes.items()} == {n: v.cpus for n, v in full.nodes.items()}
    assert all(v.hugepages == {} for v in t.nodes.values()) and t.problems == ()
