"""GPU discovery, CUDA device mapping and CPU plans, over the saved fixtures."""

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import (
    FIXTURES,
    REPO,
    fixture_root,
    fixture_tree,
    nu,
    nur,
    nusim,
    nut,
    saved_backend,
    shared_library,
    sim,
)

# Configuration must come from the test, never from the shell running it.
_ENV_NAMES = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("NUMA_UTILS_") or name in _ENV_NAMES:
            monkeypatch.delenv(name)


def tree(name):
    return saved_backend(fixture_root(name))


def _has_gpus(name):
    return bool(nu.read_topology(backend=tree(name)).gpus)


GPU_FIXTURES = [f for f in FIXTURES if _has_gpus(f)]
assert GPU_FIXTURES, "no fixture with GPUs"


def _cli(*args, env=None, check=True):
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("NUMA_UTILS_") and k not in _ENV_NAMES
    }
    e.update(env or {})
    p = subprocess.run(
        [sys.executable, nu.__file__, *args], capture_output=True, text=True, env=e, timeout=60
    )
    if check:
        assert p.returncode == 0, p.stderr
    return p


# -- gpus() --------------------------------------------------------------------------


def test_dual_socket_gpus():
    g = nu.gpus(backend=tree("dual-socket-8gpu"))
    assert [x.pci for x in g] == [
        "0000:19:00.0",
        "0000:3b:00.0",
        "0000:4c:00.0",
        "0000:5d:00.0",
        "0000:9b:00.0",
        "0000:bb:00.0",
        "0000:cb:00.0",
        "0000:db:00.0",
    ]
    assert [x.node for x in g] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(x.vendor == "nvidia" and x.uuid.startswith("GPU-") for x in g)
    assert all(x.memory_nodes == () for x in g)


def test_numa_node_minus_one_derived_or_none():
    g = {x.pci: x for x in nu.gpus(backend=tree("gpu-numa-unknown"))}
    assert g["0000:00:05.0"].node is None and g["0000:00:05.0"].numa_node == -1
    assert g["0000:00:06.0"].node is None
    assert (g["0000:00:07.0"].node, g["0000:00:07.0"].node_source) == (1, "local_cpulist")
    assert (g["0000:80:00.0"].node, g["0000:80:00.0"].node_source) == (1, "numa_node")


def test_gh200_gpu_memory_node_from_driver():
    (g,) = nu.gpus(backend=tree("gh200"))
    assert (g.node, g.cpu_node, g.memory_nodes, g.memory_source) == (0, 0, (1,), "driver")
    # MIG-reserved nodes 2-8 hold no memory: never attributed.


def test_cxl_node_is_not_gpu_memory():
    (g,) = nu.gpus(backend=tree("cxl-memory-node"))
    assert g.node == 1 and g.memory_nodes == ()


def test_amd_and_intel_are_gpus():
    vendors = sorted(x.vendor for x in nu.gpus(backend=tree("four-node-asym")))
    assert vendors == ["amd", "amd", "intel"]
    assert len(nu.gpus(backend=tree("mi300x-8gpu"))) == 8


def test_nvml_numa_node_is_the_authority(monkeypatch):
    b = tree("sparse-ids")
    pcis = [x.pci for x in nu.gpus(backend=b)]
    # Without NVML or driver entries the HBM nodes 250-255 could be anything (CXL).
    assert all(x.memory_nodes == () for x in nu.gpus(backend=b))
    fake = [nu._NvmlGpu(p, f"GPU-{i:08x}", numa_node=255 - i) for i, p in enumerate(pcis)]
    monkeypatch.setattr(nu, "_nvml_devices", lambda backend: fake)
    got = nu.gpus(backend=b)
    assert [x.memory_nodes for x in got] == [(255 - i,) for i in range(6)]
    assert {x.memory_source for x in got} == {"nvml"}
    assert [x.cpu_node for x in got] == [0, 0, 0, 8, 8, 8]


class _Patched(nu.LinuxBackend):
    """A saved tree with some files replaced."""

    def __init__(self, root, files):
        super().__init__(nusim.open_tree(root))
        self.files = files

    def read_text(self, path):
        if path in self.files:
            return self.files[path]
        return super().read_text(path)


def test_gpu_on_cpu_less_node_maps_to_nearest_cpu_node():
    # as if firmware named the GPU's HBM node (1) instead of the Grace node
    b = _Patched(fixture_root("gh200"), {"/sys/bus/pci/devices/0009:01:00.0/numa_node": "1\n"})
    (g,) = nu.gpus(backend=b)
    assert g.node == 1 and g.cpu_node == 0
    assert nu.gpu_node(0, backend=b) == 0


# -- gpu_node: CUDA numbering ----------------------------------------------------------


def test_gpu_node_default_order():
    b = tree("dual-socket-8gpu")
    assert [nu.gpu_node(i, environ={}, backend=b) for i in range(8)] == [0] * 4 + [1] * 4


def test_gpu_node_reordered_indexes():
    b = tree("dual-socket-8gpu")
    env = {"CUDA_VISIBLE_DEVICES": "7,0,5,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert [nu.gpu_node(i, environ=env, backend=b) for i in range(4)] == [1, 0, 1, 0]
    assert nu.gpu_node(4, environ=env, backend=b) is None


def test_cuda_device_is_the_gpu_cuda_numbers():
    # The fixture's NVIDIA GPUs in PCI order begin 0000:19:00.0, 0000:3b:00.0
    # (fake_sysfs/dual-socket-8gpu.txt); "7,0,5,2" makes index 0 CUDA device 1.
    b = tree("dual-socket-8gpu")
    assert nu.cuda_device(1, environ={}, backend=b).pci == "0000:3b:00.0"
    env = {"CUDA_VISIBLE_DEVICES": "7,0,5,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert nu.cuda_device(1, environ=env, backend=b).pci == "0000:19:00.0"
    with pytest.raises(ValueError, match=r"no CUDA device 4: 4 visible"):
        nu.cuda_device(4, environ=env, backend=b)


def test_gpu_node_uuids_from_driver_entries():
    b = tree("dual-socket-8gpu")
    env = {"CUDA_VISIBLE_DEVICES": "GPU-5eed0006-0006-1006-2000-000000000006,GPU-5eed0001"}
    assert nu.gpu_node(0, environ=env, backend=b) == 1
    assert nu.gpu_node(1, environ=env, backend=b) == 0  # unique prefix, as CUDA allows


def test_gpu_node_uuids_through_nvml_seam(monkeypatch):
    b = tree("dual-socket-8gpu")
    pcis = [x.pci for x in nu.gpus(backend=b)]
    fake = [
        nu._NvmlGpu(p, f"GPU-aaaa{i}-nvml", mig_uuids=(f"MIG-bbbb{i}",)) for i, p in enumerate(pcis)
    ]
    monkeypatch.setattr(nu, "_nvml_devices", lambda backend: fake)
    monkeypatch.setenv(
        "CUDA_VISIBLE_DEVICES", "GPU-aaaa6-nvml,GPU-aaaa1-nvml,GPU-aaaa4-nvml,GPU-aaaa3-nvml"
    )
    assert [nu.gpu_node(i, backend=b) for i in range(4)] == [1, 0, 1, 0]
    plans = nu.gpu_plans("exclusive", backend=b)
    assert [p.pci for p in plans] == [pcis[6], pcis[1], pcis[4], pcis[3]]
    assert [p.node for p in plans] == [1, 0, 1, 0]
    # each device keeps the CPUs of its own GPU, whatever the visible order
    full = {p.pci: p.cpus for p in nu.gpu_plans("exclusive", environ={}, backend=b)}
    assert all(p.cpus == full[p.pci] for p in plans)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-bbbb5")
    assert nu.gpu_node(0, backend=b) == 1


def test_mig_legacy_id_names_its_parent():
    b = tree("dual-socket-8gpu")
    env = {"CUDA_VISIBLE_DEVICES": "MIG-GPU-5eed0004-0004-1004-2000-000000000004/1/0"}
    assert nu.gpu_node(0, environ=env, backend=b) == 1


@pytest.mark.parametrize(
    "cvd, n",
    [
        ("0,2,-1,1", 2),  # CUDA stops at the first invalid entry
        ("", 0),  # empty: no device
        ("1,1", 1),  # a repeat ends the list
        ("3,9,0", 1),  # out of range is invalid
        ("GPU-ffff", 0),  # unknown UUID: invalid
        ("  4 , 5", 2),
    ],
)
def test_cuda_visible_devices_semantics(cvd, n):
    b = tree("dual-socket-8gpu")
    assert len(nu.gpu_plans(environ={"CUDA_VISIBLE_DEVICES": cvd}, backend=b)) == n


def test_unresolvable_uuid_without_any_source():
    b = tree("gpu-numa-unknown")  # no NVIDIA driver entries, no NVML
    env = {"CUDA_VISIBLE_DEVICES": "GPU-5eed0004,3"}
    assert nu.gpu_node(0, environ=env, backend=b) is None  # kept: index 1 stays right
    assert nu.gpu_node(1, environ=env, backend=b) == 1
    with pytest.raises(OSError):
        nu.gpu_node(0, environ=env, strict=True, backend=b)


def test_pci_bus_id_argument():
    b = tree("dual-socket-8gpu")
    assert nu.gpu_node(0, pci_bus_id="0000:9b:00.0", backend=b) == 1
    assert nu.gpu_node(0, pci_bus_id="9B:00.0", backend=b) == 1
    assert nu.gpu_node(0, pci_bus_id="00000000:19:00.0", backend=b) == 0
    with pytest.raises(ValueError):
        nu.gpu_node(0, pci_bus_id="nonsense", backend=b)


def test_unknown_node_is_the_planned_node_and_strict_raises():
    # numa_node -1: gpu_node names the node the plans put the GPU's worker on (the
    # one with the most cores per GPU), as they do; strict refuses to guess.
    b = tree("gpu-numa-unknown")
    planned = nu.gpu_plans("node", memory=None, environ={}, backend=b)[0]
    assert "NUMA node unknown" in " ".join(planned.notes)
    assert nu.gpu_node(0, environ={}, backend=b) == planned.cpu_node is not None
    with pytest.raises(OSError) as ei:
        nu.gpu_node(0, environ={}, strict=True, backend=b)
    assert ei.value.errno == errno.EINVAL
    assert nu.gpu_node(2, environ={}, backend=b) == 1


def test_hip_visible_devices_for_amd():
    b = tree("mi300x-8gpu")
    env = {"HIP_VISIBLE_DEVICES": "6,1"}
    assert [nu.gpu_node(i, environ=env, backend=b) for i in range(2)] == [1, 0]
    env = {"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "3"}
    assert nu.gpu_node(0, environ=env, backend=b) == 1


def test_torch_seam_only_when_cuda_initialised(monkeypatch):
    class Props:
        pci_domain_id, pci_bus_id, pci_device_id = 0, 0x9B, 0

    class Cuda:
        initialised = False

        def is_initialized(self):
            return self.initialised

        def get_device_properties(self, i):
            assert self.initialised, "must not initialise CUDA for the caller"
            return Props()

    class Torch:
        cuda = Cuda()

    monkeypatch.setitem(sys.modules, "torch", Torch())
    assert nu._torch_bus_id(0) is None
    Torch.cuda.initialised = True
    assert nu._torch_bus_id(0) == "0000:9b:00.0"


def test_never_imports_torch_or_loads_nvml_for_a_tree(tmp_path):
    code = (
        "import sys, importlib.util as u; s = u.spec_from_file_location('nux', sys.argv[1]);"
        "m = u.module_from_spec(s); sys.modules['nux'] = m; s.loader.exec_module(m);"
        f"sys.path.insert(0, {str(REPO)!r}); import numa_utils_sim;"
        "b = m.LinuxBackend(numa_utils_sim.open_tree(sys.argv[2]));"
        "m.gpu_plans('exclusive', backend=b);"
        "m.gpu_node(0, backend=b);"
        "assert 'torch' not in sys.modules; assert not m._nvml_cache; print('ok')"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, nu.__file__, fixture_tree("dual-socket-8gpu", tmp_path / "t")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.stdout.strip() == "ok", p.stderr


# -- CPU plans -------------------------------------------------------------------------


def _pool(topo, node, reserve=0):
    allowed = topo.allowed_cpus & topo.online_cpus & topo.nodes[node].cpus
    cores = topo.cores_of(allowed)
    return set(allowed) - {c for core in cores[:reserve] for c in core}


@pytest.mark.parametrize("name", GPU_FIXTURES)
@pytest.mark.parametrize("policy", nu.BIND_POLICIES)
def test_plans_for_every_fixture(name, policy):
    b = tree(name)
    topo = nu.read_topology(backend=b)
    plans = nu.gpu_plans(policy, environ={}, backend=b)
    assert plans, "every GPU fixture plans at least one GPU"
    assert [p.gpu for p in plans] == list(range(len(plans)))
    for p in plans:
        assert p.cpus, p
        assert p.cpus <= topo.allowed_cpus & topo.online_cpus
        assert p.cpu_node in topo.nodes_with_cpus
        assert set(p.memory_nodes) <= topo.usable_memory_nodes
        assert p.memory == "prefer" and len(p.memory_nodes) == 1
        assert not set(p.memory_nodes) & set(p.gpu_memory_nodes)


@pytest.mark.parametrize("name", GPU_FIXTURES)
@pytest.mark.parametrize("reserve", [0, 1])
def test_exclusive_disjoint_covering_and_whole_cores(name, reserve):
    b = tree(name)
    topo = nu.read_topology(backend=b)
    plans = nu.gpu_plans("exclusive", reserve=reserve, environ={}, backend=b)
    seen = set()
    by_node = {}
    for p in plans:
        assert not p.cpus & seen, f"GPU {p.gpu} shares CPUs"
        seen |= p.cpus
        by_node.setdefault(p.cpu_node, set()).update(p.cpus)
        for c in p.cpus:  # SMT siblings stay together
            sib = topo.cpus[c].siblings & topo.allowed_cpus & topo.online_cpus
            assert sib <= p.cpus
    for node, cpus in by_node.items():
        assert cpus == _pool(topo, node, reserve), f"node {node} not covered"


def test_dual_socket_exclusive_is_12_cores_each():
    b = tree("dual-socket-8gpu")
    plans = nu.gpu_plans("exclusive", environ={}, backend=b)
    topo = nu.read_topology(backend=b)
    for p in plans:
        assert len(p.cpus) == 24
        assert {c % 96 for c in p.cpus} == {c for c in p.cpus if c < 96}  # c, c+96 pairs
        assert all(topo.node_of_cpu(c) == p.node for c in p.cpus)
    assert plans[0].cpus == set(range(0, 12)) | set(range(96, 108))


def test_reserve_leaves_first_cores_of_each_node():
    b = tree("dual-socket-8gpu")
    for policy in nu.BIND_POLICIES:
        plans = nu.gpu_plans(policy, reserve=2, environ={}, backend=b)
        for p in plans:
            assert not p.cpus & {0, 1, 96, 97, 48, 49, 144, 145}


def test_node_and_socket_policies():
    b = tree("four-node-asym")  # SNC: 2 nodes per package
    topo = nu.read_topology(backend=b)
    p_node = nu.cpus_for_gpu(0, "node", environ={}, backend=b)
    p_sock = nu.cpus_for_gpu(0, "socket", environ={}, backend=b)
    node = nu.gpu_node(0, environ={}, backend=b)
    assert p_node == topo.nodes[node].cpus
    assert p_node < p_sock
    assert {topo.cpus[c].package for c in p_sock} == {topo.cpus[min(p_node)].package}


def test_core_complex_gives_whole_llc_domains():
    b = tree("mi300x-8gpu")
    topo = nu.read_topology(backend=b)
    plans = nu.gpu_plans("core-complex", environ={}, backend=b)
    seen = set()
    for p in plans:
        assert not p.cpus & seen
        seen |= p.cpus
        for c in p.cpus:
            assert topo.cpus[c].llc <= p.cpus


def test_cpuset_fallback_to_nearest_node(caplog):
    b = tree("container-cpuset")
    topo = nu.read_topology(backend=b)
    cpus = nu.cpus_for_gpu(0, "node", environ={}, backend=b)
    assert cpus == topo.allowed_cpus  # node 0 is outside the cpuset
    assert "cpuset allows no CPU on its node 0" in caplog.text
    with pytest.raises(OSError):
        nu.cpus_for_gpu(0, "node", environ={}, strict=True, backend=b)
    a = nu.cpus_for_gpu(0, "exclusive", environ={}, backend=b)
    c = nu.cpus_for_gpu(1, "exclusive", environ={}, backend=b)
    assert a and c and not a & c and a | c == topo.allowed_cpus


def test_memoryless_cpu_node_prefers_nearest_memory():
    b = tree("memoryless-cpu-node")
    (p,) = nu.gpu_plans("node", environ={}, backend=b)
    assert p.node == 0 and p.memory_nodes == (1,)
    (p,) = nu.gpu_plans("node", memory="bind", environ={}, backend=b)
    assert p.memory_nodes == (1, 2)  # equidistant: bind takes both


def test_interleave_excludes_gpu_memory():
    (p,) = nu.gpu_plans("node", memory="interleave", environ={}, backend=tree("gh200"))
    assert p.memory_nodes == (0,) and p.gpu_memory_nodes == (1,)


def test_no_gpus_no_plans():
    assert nu.gpu_plans(environ={}, backend=tree("single-node")) == []
    assert nu.gpu_node(0, environ={}, backend=tree("single-node")) is None


# -- configuration from envs.py ---------------------------------------------------------


def test_defaults_from_envs(monkeypatch):
    b = tree("dual-socket-8gpu")
    monkeypatch.setenv("NUMA_UTILS_NUMA_BIND_POLICY", "exclusive")
    monkeypatch.setenv("NUMA_UTILS_NUMA_RESERVED_CORES", "1")
    monkeypatch.setenv("NUMA_UTILS_NUMA_MEMORY_POLICY", "bind")
    cpus = nu.cpus_for_gpu(0, environ={}, backend=b)
    assert cpus == set(range(1, 13)) | set(range(97, 109))  # 47 cores: 12,12,12,11
    (p,) = nu.gpu_plans(environ={"CUDA_VISIBLE_DEVICES": "4"}, backend=b)
    assert (p.policy, p.memory, p.memory_nodes) == ("exclusive", "bind", (1,))
    # an explicit argument wins over the environment
    assert (
        nu.cpus_for_gpu(0, "node", reserve=0, environ={}, backend=b)
        == nu.read_topology(backend=b).nodes[0].cpus
    )


@pytest.mark.parametrize(
    "var, value",
    [
        ("NUMA_UTILS_NUMA_BIND_POLICY", "fastest"),
        ("NUMA_UTILS_NUMA_RESERVED_CORES", "-1"),
        ("NUMA_UTILS_NUMA_RESERVED_CORES", "two"),
        ("NUMA_UTILS_NUMA_MEMORY_POLICY", "everywhere"),
        ("NUMA_UTILS_NUMA_STRICT", "maybe"),
    ],
)
def test_env_parsing_errors_name_the_variable(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=var):
        nu.gpu_plans(environ={}, backend=tree("dual-socket-8gpu"))
    p = _cli("plan", "--root", fixture_root("dual-socket-8gpu"), env={var: value}, check=False)
    assert p.returncode == 2 and var in p.stderr


def test_copy_alone_reads_its_own_variables(tmp_path):
    """Without envs.py beside it, a copy reads its variables itself."""
    shutil.copy(nu.__file__, tmp_path / "vendored_numa.py")
    tree = fixture_tree("gh200", tmp_path / "gh200")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import vendored_numa as m;"
        f"sys.path.insert(0, {str(REPO)!r}); import numa_utils_sim;"
        "b = m.LinuxBackend(numa_utils_sim.open_tree(sys.argv[2]));"
        "print(sorted(m.cpus_for_gpu(0, backend=b, environ={})))"
    )
    for policy, rc in (("bogus", 1), ("node", 0)):
        p = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path), tree],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "NUMA_UTILS_NUMA_BIND_POLICY": policy},
        )
        assert p.returncode == rc, p.stderr
    assert (
        "NUMA_UTILS_NUMA_BIND_POLICY='bogus'"
        in subprocess.run(
            [sys.executable, "-c", code, str(tmp_path), tree],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "NUMA_UTILS_NUMA_BIND_POLICY": "bogus"},
        ).stderr
    )
    assert json.loads(p.stdout) == list(range(72))


# -- the plan command ---------------------------------------------------------------------


def test_done_when_exclusive_plan_for_8_gpus():
    root = fixture_root("dual-socket-8gpu")
    plans = json.loads(_cli("plan", "--root", root, "--policy", "exclusive", "--json").stdout)
    assert [p["gpu"] for p in plans] == list(range(8))
    seen = set()
    for p in plans:
        assert {"gpu", "pci", "node", "cpus", "memory_nodes"} <= set(p)
        assert p["cpus"] == sorted(p["cpus"]) and all(isinstance(c, int) for c in p["cpus"])
        assert p["node"] == (0 if p["gpu"] < 4 else 1)
        assert p["memory_nodes"] == [p["node"]]
        assert not set(p["cpus"]) & seen
        seen |= set(p["cpus"])
    env = {"CUDA_VISIBLE_DEVICES": "GPU-5eed0005,GPU-5eed0002,6,0"}
    re_plans = json.loads(
        _cli("plan", "--root", root, "--policy", "exclusive", "--json", env=env).stdout
    )
    assert [(p["gpu"], p["pci"], p["node"]) for p in re_plans] == [
        (0, "0000:bb:00.0", 1),
        (1, "0000:4c:00.0", 0),
        (2, "0000:cb:00.0", 1),
        (3, "0000:19:00.0", 0),
    ]
    by_pci = {p["pci"]: p["cpus"] for p in plans}
    assert all(p["cpus"] == by_pci[p["pci"]] for p in re_plans)


@pytest.mark.parametrize("name", GPU_FIXTURES)
def test_plan_cli_every_fixture(name, capsys):
    # In this process: `plan` as a command of its own is test_plan_numactl_and_taskset_formats'.
    assert nu.main(["plan", "--root", fixture_root(name), "--format", "text"]) == 0
    out = capsys.readouterr().out
    assert "gpu" in out and "pci" in out
    assert nu.main(["plan", "--root", fixture_root(name), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data and all(p["cpus"] for p in data)


def test_plan_numactl_and_taskset_formats():
    root = fixture_root("dual-socket-8gpu")
    out = _cli(
        "plan", "--root", root, "--policy", "exclusive", "--format", "numactl", "--gpu", "4"
    ).stdout.splitlines()
    assert out == [
        "# GPU 4 (0000:9b:00.0), node 1, policy exclusive",
        "numactl --physcpubind=48-59,144-155 --preferred=1 --",
    ]
    out = _cli(
        "plan",
        "--root",
        root,
        "--policy",
        "exclusive",
        "--format",
        "numactl",
        "--memory",
        "bind",
        "--gpu",
        "0",
    ).stdout
    assert "--membind=0 --" in out
    out = _cli(
        "plan", "--root", root, "--policy", "exclusive", "--format", "taskset", "--gpu", "0"
    ).stdout
    assert out.splitlines()[-1] == "taskset -c 0-11,96-107"


def test_plan_systemd_format():
    out = _cli(
        "plan",
        "--root",
        fixture_root("dual-socket-8gpu"),
        "--policy",
        "exclusive",
        "--format",
        "systemd",
        "--gpu",
        "5",
        "--memory",
        "bind",
    ).stdout
    assert out.splitlines() == [
        "# worker@5.service.d/50-numa.conf: GPU 5 (0000:bb:00.0), node 1, policy exclusive",
        "[Service]",
        "CPUAffinity=60-71,156-167",
        "NUMAPolicy=bind",
        "NUMAMask=1",
    ]


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze not installed (apt-get install systemd)",
)
@pytest.mark.parametrize("memory", ["prefer", "bind", "interleave", "local"])
def test_systemd_drop_in_passes_verify(tmp_path, memory):
    unit = tmp_path / "worker@.service"
    unit.write_text(f"[Unit]\nDescription=worker %i\n[Service]\nExecStart={shutil.which('true')}\n")
    d = tmp_path / "worker@2.service.d"
    d.mkdir()
    conf = d / "50-numa.conf"
    conf.write_text(
        _cli(
            "plan",
            "--root",
            fixture_root("dual-socket-8gpu"),
            "--policy",
            "exclusive",
            "--format",
            "systemd",
            "--gpu",
            "2",
            "--memory",
            memory,
        ).stdout
    )

    def verify():
        env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:", "SYSTEMD_LOG_LEVEL": "notice"}
        p = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(tmp_path / "worker@2.service")],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        return p.returncode, p.stdout + p.stderr

    rc, out = verify()
    assert rc == 0 and "50-numa.conf" not in out, out
    # The drop-in was really read: a broken line in it is reported.
    conf.write_text(conf.read_text() + "NUMAMask=not-a-node\n")
    rc, out = verify()
    assert "50-numa.conf" in out, out


# -- NVML through ctypes, against a fake library (no NVML on the test machines) -----------


class _FakeNvml:
    """Answers the NVML calls _nvml_query makes, writing through the ctypes pointers."""

    def __init__(self, gpus):
        self.gpus = gpus  # [(domain, bus, uuid, numa_node or None, [mig uuids])]
        self.shutdown = False

    def nvmlInit_v2(self):
        return 0

    def nvmlShutdown(self):
        self.shutdown = True
        return 0

    def nvmlDeviceGetCount_v2(self, count):
        count._obj.value = len(self.gpus)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, i, handle):
        handle._obj.value = 100 + i.value
        return 0

    def _gpu(self, h):
        return self.gpus[h.value - 100] if h.value < 1000 else None

    def nvmlDeviceGetPciInfo_v3(self, h, info):
        dom, bus, *_ = self._gpu(h)
        info._obj.domain, info._obj.bus, info._obj.device = dom, bus, 0
        return 0

    def nvmlDeviceGetUUID(self, h, buf, size):
        if h.value >= 1000:
            buf.value = self.gpus[h.value // 1000 - 1][4][h.value % 1000].encode()
        else:
            buf.value = self._gpu(h)[2].encode()
        return 0

    def nvmlDeviceGetNumaNodeId(self, h, node):
        n = self._gpu(h)[3]
        if n is None:
            return 3  # NVML_ERROR_NOT_SUPPORTED
        node._obj.value = n
        return 0

    def nvmlDeviceGetMaxMigDeviceCount(self, h, count):
        count._obj.value = 7
        return 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j, mh):
        migs = self._gpu(h)[4]
        if j.value >= len(migs):
            return 6  # NVML_ERROR_NOT_FOUND
        mh._obj.value = (h.value - 100 + 1) * 1000 + j.value
        return 0


def test_nvml_query_through_ctypes(monkeypatch):
    fake = _FakeNvml([(0, 0x19, "GPU-one", None, []), (9, 0x01, "GPU-two", 1, ["MIG-a", "MIG-b"])])
    monkeypatch.setattr(nu, "_load_nvml", lambda: fake)
    got = nu._nvml_query()
    assert got == [
        nu._NvmlGpu("0000:19:00.0", "GPU-one", None, ()),
        nu._NvmlGpu("0009:01:00.0", "GPU-two", 1, ("MIG-a", "MIG-b")),
    ]
    assert fake.shutdown
    monkeypatch.setattr(nu, "_load_nvml", lambda: None)
    assert nu._nvml_query() is None


def test_nvml_is_never_asked_about_a_saved_tree(monkeypatch):
    monkeypatch.setattr(nu, "_nvml_query", lambda: pytest.fail("NVML queried"))
    assert nu._nvml_devices(tree("gh200")) is None


# -- pin_for_cuda against a fake libcudart that models the driver --------------------
# One global lock held for each whole call, a cost per byte (nanosleep), the 512 GiB
# limit of one cudaHostRegister, and a per-thread "last error" that stays until
# cudaGetLastError reads it.  Every call is written to a log the tests read.

STALL_CUDART = r"""
#include <pthread.h>
#include <stdio.h>
#include <stddef.h>
#include <time.h>
static pthread_mutex_t driver = PTHREAD_MUTEX_INITIALIZER;
static __thread int last_error;
static FILE *out;
long long ns_per_mib = 0;
int fail_call = -1, calls = 0;

static double now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
int fake_log(const char *path) { out = fopen(path, "w"); return out ? 0 : 1; }
void fake_flush(void) { fflush(out); }

int cudaHostRegister(void *p, size_t n, unsigned int flags) {
    pthread_mutex_lock(&driver);
    double t0 = now();
    int k = ++calls, rc = 0;
    if (n >= (512ULL << 30)) rc = 1;            /* cudaErrorInvalidValue */
    else if (k == fail_call) rc = 2;            /* cudaErrorMemoryAllocation */
    else if (ns_per_mib) {
        long long ns = ns_per_mib * (long long)(n >> 20);
        struct timespec d = {ns / 1000000000, ns % 1000000000};
        nanosleep(&d, NULL);
    }
    if (rc) last_error = rc;
    fprintf(out, "register %d %lu %p %zu %u %d %.6f\n", k, (unsigned long)pthread_self(),
            p, n, flags, rc, now() - t0);
    pthread_mutex_unlock(&driver);
    return rc;
}
int cudaHostUnregister(void *p) {
    pthread_mutex_lock(&driver);
    fprintf(out, "unregister %p\n", p);
    pthread_mutex_unlock(&driver);
    return 0;
}
int cudaGetLastError(void) {
    int e = last_error;
    last_error = 0;
    pthread_mutex_lock(&driver);
    fprintf(out, "getlasterror %lu %d\n", (unsigned long)pthread_self(), e);
    pthread_mutex_unlock(&driver);
    return e;
}
const char *cudaGetErrorString(int e) {
    return e == 1 ? "invalid argument (fake)" : e == 2 ? "out of memory (fake)" : "?";
}
int cudaGetDevice(int *d) { *d = 0; return 0; }
int cudaSetDevice(int d) { return 0; }
"""

GiB = 1 << 30


class StallCudart:
    def __init__(self, tmp_path):
        import ctypes

        self.path = shared_library(STALL_CUDART, tmp_path / "libcudart_stall.so")
        self.lib = ctypes.CDLL(self.path)
        self.log = tmp_path / "calls.log"
        assert self.lib.fake_log(str(self.log).encode()) == 0
        self.ctypes = ctypes

    def set(self, name, value):
        t = self.ctypes.c_longlong if name == "ns_per_mib" else self.ctypes.c_int
        t.in_dll(self.lib, name).value = value

    def calls(self):
        self.lib.fake_flush()
        return [line.split() for line in self.log.read_text().splitlines()]

    def registers(self):
        return [
            (int(c[4]), int(c[6]), float(c[7]), int(c[2]), int(c[3], 16))
            for c in self.calls()
            if c[0] == "register"
        ]  # (size, rc, s, tid, addr)


@pytest.fixture
def stall_cudart(tmp_path):
    return StallCudart(tmp_path)


def test_pin_never_makes_a_call_of_512_gib_whatever_chunk_says(stall_cudart):
    # An address range nobody maps: the fake never touches memory, and nothing here
    # faults pages, so 1.5 TiB costs nothing.
    base, length = 1 << 44, 3 << 39
    pin = nur.pin_for_cuda(base, length, chunk=1 << 40, cudart=stall_cudart.path)
    regs = stall_cudart.registers()
    assert pin and pin.reason is None, pin.reason
    assert regs and all(n < 512 * GiB for n, *_ in regs)
    assert sum(n for n, *_ in regs) == length and len(regs) == 4
    assert [a for *_, a in regs] == [a for a, _ in pin.chunks]
    pin.close()
    assert sum(c[0] == "unregister" for c in stall_cudart.calls()) == 4


def test_pin_default_calls_are_at_most_1_gib_and_portable_only(stall_cudart):
    base, length = 1 << 44, 5 * GiB + 12345
    with nur.pin_for_cuda(base, length, cudart=stall_cudart.path) as pin:
        regs = stall_cudart.registers()
        assert pin and max(n for n, *_ in regs) <= GiB and len(regs) == 6
        assert pin.flags == int(nur.CudaHostRegisterFlag.PORTABLE) == 1
        assert {int(c[5]) for c in stall_cudart.calls() if c[0] == "register"} == {1}
        assert pin.progress.bytes == length and pin.progress.calls == 6
    mapped = nur.pin_for_cuda(
        base,
        GiB,
        cudart=stall_cudart.path,
        flags=nur.CudaHostRegisterFlag.PORTABLE | nur.CudaHostRegisterFlag.MAPPED,
    )
    assert mapped.flags == 3
    mapped.close()


def test_pin_stall_budget_bounds_the_longest_call(stall_cudart):
    # 2 ms per MiB: one 64 MiB call would hold the driver lock ~128 ms; 8 MiB chunks
    # keep every call near 16 ms, and progress reports the longest one.
    stall_cudart.set("ns_per_mib", 2_000_000)
    pin = nur.pin_for_cuda(1 << 44, 64 << 20, chunk=8 << 20, cudart=stall_cudart.path)
    regs = stall_cudart.registers()
    assert pin and len(regs) == 8
    longest = max(s for _, _, s, *_ in regs)
    assert 0.012 < longest < 0.1
    assert pin.progress.longest_s >= longest and pin.progress.longest_s < 0.12
    pin.close()


def test_pin_failure_in_call_k_unregisters_the_rest_and_clears_the_error(stall_cudart):
    stall_cudart.set("fail_call", 4)
    pin = nur.pin_for_cuda(1 << 44, 6 * GiB, cudart=stall_cudart.path)
    assert not pin and pin.ready and pin.error == 2 and "out of memory (fake)" in pin.reason
    assert pin.failed_chunk == ((1 << 44) + 3 * GiB, GiB)
    calls = stall_cudart.calls()
    kinds = [c[0] for c in calls]
    k = kinds.index("getlasterror")
    # right after the failing call 4, in the same thread, the error is read (cleared)
    assert calls[k - 1][:2] == ["register", "4"] and calls[k - 1][6] == "2"
    assert calls[k][1] == calls[k - 1][2] and calls[k][2] == "2"
    assert kinds.count("register") == 4  # nothing after the failure
    unreg = sorted(int(c[1], 16) for c in calls if c[0] == "unregister")
    assert unreg == [(1 << 44) + i * GiB for i in range(3)]
    stall_cudart.set("fail_call", 6)  # the second call of the next pin
    with pytest.raises(OSError, match="cudaHostRegister"):
        nur.pin_for_cuda(1 << 44, 2 * GiB, strict=True, cudart=stall_cudart.path)


def test_pin_background_returns_at_once_and_becomes_ready(stall_cudart):
    import time

    stall_cudart.set("ns_per_mib", 1_000_000)  # 1 ms per MiB: 256 ms in all
    t0 = time.monotonic()
    pin = nur.pin_for_cuda(
        1 << 44, 256 << 20, chunk=16 << 20, background=True, cudart=stall_cudart.path
    )
    assert time.monotonic() - t0 < 0.1 and not pin.ready and not pin
    assert "registering" in repr(pin)
    assert pin.wait(10) and pin.ready and pin, pin.reason
    assert pin.progress.bytes == 256 << 20 and pin.progress.calls == 16
    assert len(pin.chunks) == 16
    pin.close()
    assert not pin and pin.closed


def test_pin_background_failure_and_close_while_running(stall_cudart):
    stall_cudart.set("ns_per_mib", 1_000_000)
    stall_cudart.set("fail_call", 3)
    pin = nur.pin_for_cuda(
        1 << 44, 64 << 20, chunk=8 << 20, background=True, cudart=stall_cudart.path
    )
    assert pin.wait(10) and not pin and pin.error == 2 and pin.failed_chunk[1] == 8 << 20
    stall_cudart.set("fail_call", -1)
    pin = nur.pin_for_cuda(
        1 << 44, 1 << 30, chunk=8 << 20, background=True, cudart=stall_cudart.path
    )
    pin.close()  # stops it; what it made is undone
    regs = [c for c in stall_cudart.calls() if c[0] == "register"][3:]
    unreg = [c for c in stall_cudart.calls() if c[0] == "unregister"][2:]
    assert pin.ready and not pin and len(regs) < 128 and len(unreg) == len(regs)
    assert all(c[6] == "0" for c in regs)


def test_pin_prefault_faults_pages_before_registering(stall_cudart):
    import mmap

    buf = mmap.mmap(-1, 8 << 20)
    pin = nur.pin_for_cuda(buf, prefault=True, cudart=stall_cudart.path)
    assert pin
    with open("/proc/self/smaps") as f:
        text = f.read()
    addr = nu.buffer_range(buf)[0]
    block = text[text.index(f"{addr:x}-") :]
    rss_kb = int(block.split("Rss:")[1].split()[0])
    assert rss_kb >= 8 << 10
    pin.close()


@pytest.mark.parametrize("raw", ["7", "1024", "99999999999999999999"])
def test_numa_node_naming_no_node_takes_local_cpus(raw):
    # 26.18: a numa_node naming no node (7 on a 2-node machine, 1024, 20 digits) was
    # shown as the GPU's node.  It is a problem, and the local CPUs' node stands in.
    gpu = "/sys/bus/pci/devices/0000:19:00.0"
    b = _Patched(fixture_root("dual-socket-8gpu"), {f"{gpu}/numa_node": raw + "\n"})
    topo = nu.read_topology(backend=b)
    (g,) = [x for x in nu.gpus(backend=b) if x.pci == "0000:19:00.0"]
    assert (g.node, g.node_source, g.numa_node) == (0, "local_cpulist", int(raw))
    assert any(f"names node {raw}" in p for p in topo.problems), topo.problems
    (d,) = [x for x in nu.devices("gpu", backend=b) if x.address == "0000:19:00.0"]
    assert (d.node, d.node_source) == (0, "local_cpulist")
    # Local CPUs on both nodes: unknown, not the firmware's number.
    every = nu.format_cpulist(topo.online_cpus)
    b.files[f"{gpu}/local_cpulist"] = every + "\n"
    (g,) = [x for x in nu.gpus(backend=b) if x.pci == "0000:19:00.0"]
    assert (g.node, g.node_source) == (None, "unknown")


def test_driver_share_leaves_out_the_nodes_nvml_attributed():
    """NVML names the memory node of two GPUs; the driver lists all six: the other four
    GPUs share out only the CPU-less nodes NVML did not attribute, one each."""
    b = tree("sparse-ids")
    topo = nu.read_topology(backend=b)
    infos = nu._gpu_infos(topo, b)
    assert all(x.memory_nodes == () for x in infos)
    pcis = [x.pci for x in infos]
    nvml = [nu._NvmlGpu(pcis[0], "GPU-0", numa_node=255), nu._NvmlGpu(pcis[1], "GPU-1", 254)]
    got = nu._attribute_gpu_memory(topo, infos, nvml, pcis)
    assert [(x.memory_nodes, x.memory_source) for x in got[:2]] == [
        ((255,), "nvml"),
        ((254,), "nvml"),
    ]
    shared = [x.memory_nodes for x in got[2:]]
    assert {x.memory_source for x in got[2:]} == {"driver"}
    assert sorted(n for nodes in shared for n in nodes) == [250, 251, 252, 253]
    assert all(len(nodes) == 1 for nodes in shared)


# -- gpu_node: the node every planner uses ---------------------------------------------


def _planners(s, i):
    """The node each planner gives CUDA device ``i``'s worker on backend ``s``."""
    topo = nu.read_topology(backend=s)
    cpus = nu.cpus_for_gpu(i, "node", strict=False, environ={}, backend=s)
    bound = nu.bind_for_gpu(i, "node", memory=None, strict=False, environ={}, backend=s)
    return {
        "gpu_plans": nu.gpu_plans("exclusive", memory=None, strict=False, environ={}, backend=s)[
            i
        ].cpu_node,
        "cpus_for_gpu": next(n for n in topo.nodes if cpus and cpus <= topo.nodes[n].cpus),
        "bind_for_gpu": bound.node,
        "thread_plan": nut.thread_plan(i, strict=False, environ={}, backend=s).node,
        "spawn_context": nu.spawn_context(i, strict=False, environ={}, backend=s).plan.cpu_node,
    }


def _cpusets(name):
    """(None: no cpuset) and, per node with CPUs that holds a GPU, every online CPU but
    that node's: a cpuset that forbids the GPU's node."""
    topo = nu.read_topology(backend=tree(name))
    out = [None]
    for node in sorted({g.cpu_node for g in nu.gpus(backend=tree(name))} - {None}):
        rest = topo.online_cpus - topo.nodes[node].cpus
        if rest:
            out.append((node, rest))
    return out


@pytest.mark.parametrize("name", FIXTURES)
def test_gpu_node_is_the_node_every_planner_uses(name):
    """With and without a cpuset that forbids a GPU's node, and for a GPU whose node
    the firmware does not give (numa_node -1): gpu_node(i) is the node whose CPUs
    gpu_plans, cpus_for_gpu, bind_for_gpu, thread_plan and spawn_context give CUDA
    device i's worker, and a node this process may run on."""
    checked = 0
    for case in _cpusets(name):
        forbidden, allowed = (None, None) if case is None else case
        s = sim(name, cpus_allowed=allowed)
        topo = nu.read_topology(backend=s)
        count = len(nu.gpu_plans(environ={}, strict=False, backend=s))
        assert nu.gpu_node(count, environ={}, strict=False, backend=s) is None  # no such GPU
        for i in range(count):
            node = nu.gpu_node(i, environ={}, strict=False, backend=s)
            assert node is not None and node != forbidden
            if allowed is not None:
                assert topo.nodes[node].cpus & allowed
            planners = _planners(sim(name, cpus_allowed=allowed), i)
            assert planners == dict.fromkeys(planners, node), (case, i)
            checked += 1
    if name in GPU_FIXTURES:
        assert checked, "no CUDA device planned"
