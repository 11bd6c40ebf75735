"""devices(), device_distance(), local_devices(), generic-initiator nodes and nodes per
package, on the fixtures gathered from QEMU guests (expectations from their
guest_oracle.json, read in the guest without numa_utils) and on generated trees."""

import ctypes
import json
import mmap
import os
import shutil

import pytest
from conftest import (
    FIXTURES,
    FIXTURES_DIR,
    cli,
    fixture_root,
    fixture_text,
    fixture_tree,
    nu,
    nusim,
    saved_backend,
    sim,
)

PCI = "qemu-x86_64-pci-devices"
SNC = "qemu-x86_64-snc-2x2"
ORACLE = json.loads(fixture_text(PCI, "guest_oracle.json"))
KIND_OF_CLASS = {0x0300: "display", 0x0108: "nvme", 0x0200: "net"}


def _backends(name):
    return [saved_backend(fixture_root(name)), sim(name)]


@pytest.mark.parametrize("b", _backends(PCI), ids=["tree", "sim"])
def test_devices_of_the_pci_guest(b):
    found = {d.address: d for d in nu.devices(backend=b)}
    on_node1 = {a: w for a, w in ORACLE["pci"].items() if w["root_port"]}
    assert len(on_node1) == 3
    for addr, w in on_node1.items():
        d = found[addr]
        assert d.kind == KIND_OF_CLASS[int(w["class"], 16) >> 8]
        assert (d.vendor, d.device, d.pci_class) == (
            int(w["vendor"], 16),
            int(w["device"], 16),
            int(w["class"], 16),
        )
        assert (d.node, d.node_source, sorted(d.cpus)) == (1, "numa_node", w["local_cpulist"])
        assert [x.address for x in nu.devices(d.kind, backend=b)] == [addr]
    # bridges are the path, not devices; -1 whose CPUs span both nodes stays unknown
    assert not [a for a, w in ORACLE["pci"].items() if w["class"].startswith("0x06") and a in found]
    assert found["0000:00:1f.2"].node is None and found["0000:00:1f.2"].node_source == "unknown"
    with pytest.raises(ValueError):
        nu.devices("nic", backend=b)


@pytest.mark.parametrize("name", FIXTURES)
def test_gpus_and_devices_gpu_agree(name):
    b = saved_backend(fixture_root(name))
    want = [(g.pci, g.node, g.node_source.split(",")[0]) for g in nu.gpus(backend=b)]
    assert [(d.address, d.node, d.node_source) for d in nu.devices("gpu", backend=b)] == want


@pytest.fixture(scope="module")
def linked_tree(tmp_path_factory):
    """The pci guest's node/CPU files plus a PCI bus as the guest's sysfs links it
    (the oracle's paths and names), and a switch with two functions behind it."""
    root = tmp_path_factory.mktemp("linked")
    src = fixture_tree(PCI, tmp_path_factory.mktemp("src"))
    shutil.copytree(os.path.join(src, "sys/devices/system"), root / "sys/devices/system")
    shutil.copytree(os.path.join(src, "proc"), root / "proc")
    bus = root / "sys/bus/pci/devices"
    bus.mkdir(parents=True)
    extra = {
        "0000:85:00.0": ["0000:80:03.0", "0000:84:00.0", "0000:85:00.0"],
        "0000:86:00.0": ["0000:80:03.0", "0000:84:00.0", "0000:86:00.0"],
    }
    items = [
        (a, w["path"], w["class"], w["vendor"], w["device"], w["names"])
        for a, w in ORACLE["pci"].items()
        if w["host_bridge"] == "pci0000:80"
    ] + [
        (a, p, "0x020700", "0x15b3", "0x1017", {"infiniband": ["mlx5_" + a[6]]})
        for a, p in extra.items()
    ]
    for addr, path, cls, ven, dev, names in items:
        d = root / "sys/devices/pci0000:80" / "/".join(path)
        d.mkdir(parents=True, exist_ok=True)
        for f, v in (
            ("class", cls),
            ("vendor", ven),
            ("device", dev),
            ("numa_node", "1"),
            ("local_cpulist", "1"),
        ):
            (d / f).write_text(v + "\n")
        for sub, ns in names.items():
            for n in ns:
                (d / sub / n).mkdir(parents=True)
        os.symlink("../../../devices/pci0000:80/" + "/".join(path), bus / addr)
    return str(root)


def test_names_path_and_distance(linked_tree):
    b = saved_backend(linked_tree)
    found = {d.address: d for d in nu.devices(backend=b)}
    for addr, w in ORACLE["pci"].items():
        if w["root_port"]:
            d = found[addr]
            assert d.path == ("pci0000:80", w["root_port"], addr)
            assert list(d.names) == [n for v in w["names"].values() for n in v]
    assert found["0000:85:00.0"].kind == "rdma" and found["0000:85:00.0"].names == ("mlx5_5",)
    dist = nu.device_distance
    assert dist(found["0000:85:00.0"], found["0000:86:00.0"]) == "PIX"  # one switch
    assert dist("0000:83:00.0", "0000:82:00.0", backend=b) == "PHB"  # root ports
    a, c = found["0000:83:00.0"], found["0000:85:00.0"]
    assert dist(a._replace(path=("pci0000:00", "x")), c) == "NODE"
    assert dist(a._replace(path=("pci0000:00", "x"), node=0), c) == "SYS"
    assert dist(a, c._replace(path=c.path[:2] + ("y", "z", "w") + c.path[2:])) == "PHB"
    deep = c._replace(path=c.path[:3] + ("s", "t") + c.path[3:])
    assert dist(deep, found["0000:86:00.0"]) == "PXB"
    with pytest.raises(ValueError):
        dist("0000:99:00.0", a, backend=b)


def test_local_devices_by_node_and_buffer():
    b = sim(PCI)
    nic = "0000:83:00.0"
    got = nu.local_devices(1, backend=b)
    assert [(d.address, r) for d, r in got] == [(nic, "local")] and not got.fell_back
    got = nu.local_devices({0}, "net", backend=b)
    assert [(d.address, r) for d, r in got] == [(nic, "remote")] and got.fell_back
    assert nu.local_devices(0, "net", strict=True, backend=b) == []
    mm = mmap.mmap(-1, 4 * b.page_size)
    ref = ctypes.c_char.from_buffer(mm)
    try:
        assert nu.bind(mm, [1], backend=b)
        b.touch(ctypes.addressof(ref), len(mm))
        got = nu.local_devices(mm, "net", backend=b)
        assert [(d.address, r) for d, r in got] == [(nic, "local")]
    finally:
        del ref
        mm.close()


def test_generic_initiator_node():
    for b in _backends(PCI):
        t = nu.read_topology(backend=b)
        gi = ORACLE["has_generic_initiator"]
        assert gi == [2]
        assert t.nodes[2].kind == "generic-initiator"
        assert 2 not in nu.default_memory_nodes(t)
        rep = cli.status_report(backend=b)
        assert "generic-initiator" in cli._render_status(rep)
        assert {n["id"]: n["devices"] for n in rep["nodes"]}[1] == sorted(
            a for a, w in ORACLE["pci"].items() if w["root_port"]
        )


def _packages_tree(dest, packages, per):
    """``packages`` x ``per`` nodes, 2 single-thread cores per node; distance 11
    inside a package, 21 between."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_dev_make_fixtures", str(FIXTURES_DIR.parent / "tools" / "make_fixtures.py")
    )
    mf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mf)
    topo = mf.x86_smp(packages, 2 * per, 1)
    nodes = {}
    for c, t in topo.items():
        nodes.setdefault(t["package"] * per + (c % (2 * per)) // 2, []).append(c)
    desc = {n: mf.node(sorted(cs), 1 << 20, 1 << 19, {2048: (0, 0, 0)}) for n, cs in nodes.items()}
    n_all = packages * per
    dist = {
        (a, b): 10 if a == b else 11 if a // per == b // per else 21
        for a in range(n_all)
        for b in range(n_all)
    }
    m = mf.base(
        f"pk{packages}x{per}",
        source="tests/test_devices.py",
        topo=topo,
        nodes=desc,
        distance=dist,
        pci=[mf.pci("0000:17:00.0", 0x10DE, 0x2330, 0x030200, 0)],
        nvidia_proc=True,
    )
    r = mf.resolve(m)
    mf.build_tree(m, r, str(dest)).write()
    return nodes


@pytest.mark.parametrize("packages,per", [(2, 2), (2, 3), (4, 2)])
def test_nodes_per_package(tmp_path, packages, per):
    nodes = _packages_tree(tmp_path, packages, per)
    b = nusim.SimulatedBackend(str(tmp_path))
    t = nu.read_topology(backend=b)
    assert t.nodes_per_package == per and nu.to_json(t)["nodes_per_package"] == per
    assert f"SNC{per}/NPS{per}" in t.nodes[0].kind_evidence
    assert nu.default_memory_nodes(t) == frozenset(range(packages * per))
    rep = cli.status_report(backend=b)
    assert rep["packages"]["distance_inside"] == [11]
    assert rep["packages"]["distance_between"] == [21]
    assert f"{per} nodes per package over {packages} packages" in cli._render_status(rep)
    package0 = [c for n in range(per) for c in nodes[n]]
    assert sorted(nu.cpus_for_gpu(0, "socket", backend=b, environ={})) == package0
    res = nu.bind_for_gpu(0, "socket", memory="socket", backend=b, environ={})
    assert res.memory.mode == "preferred_many", res
    assert sorted(res.memory.nodes) == list(range(per))


def test_snc_guest():
    for b in _backends(SNC):
        t = nu.read_topology(backend=b)
        assert t.nodes_per_package == 2 and t.package_nodes == {0: {0, 1}, 1: {2, 3}}
        assert nu.default_memory_nodes(t) == frozenset(range(4))


@pytest.mark.parametrize("initiators", ["", "1"])
def test_numa_node_naming_no_online_node_is_a_problem_and_falls_back(tmp_path, initiators):
    """A numa_node of 7 on a two-node machine is reported (once, also where a generic
    initiator node makes read_topology read the devices twice) and the node is taken
    from local_cpulist, as for -1 (which is no problem); an online numa_node is used."""
    root = fixture_tree("dual-socket-8gpu", tmp_path)
    with open(os.path.join(root, "sys/devices/system/node/has_generic_initiator"), "w") as f:
        f.write(initiators + "\n")
    bus = os.path.join(root, "sys/bus/pci/devices")
    for addr, value in (("0000:19:00.0", "7"), ("0000:9b:00.0", "-1")):
        with open(os.path.join(bus, addr, "numa_node"), "w") as f:
            f.write(value + "\n")
    t = nu.read_topology(backend=saved_backend(root))
    got = {g.address: (g.numa_node, g.node, g.node_source) for g in t.gpus}
    assert got["0000:19:00.0"] == (7, 0, "local_cpulist")
    assert got["0000:9b:00.0"] == (-1, 1, "local_cpulist")
    assert got["0000:3b:00.0"] == (0, 0, "numa_node")
    named = [p for p in t.problems if "numa_node names node" in p]
    assert named == [
        f"{nu._PCI_DIR}/0000:19:00.0/numa_node names node 7, which is not online here: "
        "its node is taken from local_cpulist"
    ]


def test_a_pci_folder_not_named_as_a_bus_id_is_a_problem_not_a_crash(tmp_path):
    """A damaged tree with a GPU-like folder that no bus id can be made from: topology
    and GPUs are still read (read_topology never raises), the folder is named in the
    problems and left out, and the real GPUs stay."""
    root = fixture_tree("sparse-ids", tmp_path / "t")
    before = [gpu.pci for gpu in nu.gpus(backend=saved_backend(root))]
    bad = tmp_path / "t" / "sys" / "bus" / "pci" / "devices" / "not-a-bus-id"
    bad.mkdir()
    for name, value in (("class", "0x030200"), ("vendor", "0x10de"), ("device", "0x2330")):
        (bad / name).write_text(value + "\n")
    (bad / "numa_node").write_text("0\n")
    backend = saved_backend(root)
    topo = nu.read_topology(backend=backend)
    assert any("not-a-bus-id: not a PCI bus id" in p for p in topo.problems), topo.problems
    assert all("not-a-bus-id" not in dev.address for dev in nu.devices(backend=backend))
    assert [gpu.pci for gpu in nu.gpus(backend=backend)] == before


def test_a_tree_listing_no_cpu_node_reads_without_a_crash(tmp_path):
    """has_cpu empty (a damaged tree) on a machine with a CPU-less GPU memory node:
    read_topology found no nearest CPU node for it and raised IndexError; now the GPU
    memory is read with that node unknown, and the GPUs are still planned."""
    root = fixture_tree("gh200", tmp_path)
    with open(os.path.join(root, "sys/devices/system/node/has_cpu"), "w") as f:
        f.write("\n")
    b = saved_backend(root)
    t = nu.read_topology(backend=b)
    assert t.nodes_with_cpus == frozenset() and t.gpus
    assert nu.gpu_plans(backend=b, environ={})
