# SPDX-License-Identifier: Apache-2.0
"""The real-kernel tier: tests/kernel_checks.py against real Debian kernels booted
under QEMU (vm/), and the same check functions against SimulatedBackend.

- ``test_guest[<arch>-<topology>]`` (marker ``vm``): boot the guest, run every
  check inside, assert none failed and the ones that matter for that guest ran.
  Skips when qemu-system-<arch> or the cached images (``python3 vm/build.py``)
  are missing.
- ``test_guest_catches_wrong_syscall_number`` (marker ``vm``): the guest copy of
  numa_utils gets aarch64 mbind = 237 (x86_64's number, set_mempolicy there);
  the tier must fail.
- ``test_simulated[<fixture>-<arch>]``: the API checks against SimulatedBackend
  over the fake_sysfs fixtures, with the expectation taken from expected.json.

Run: ``python3 vm/build.py && pytest -m vm -rP tests/test_vm.py`` (``-rP`` shows
what each guest checked).
"""

import importlib.util
import json
import math
import os
import pathlib
import time
import warnings

import kernel_checks as kc
import pytest
from conftest import FIXTURES, fixture_archive, fixture_root, fixture_text, nu, nur, nusim

REPO = pathlib.Path(__file__).resolve().parent.parent


def _load_vm_run():
    spec = importlib.util.spec_from_file_location("numa_utils_vm_run", REPO / "vm" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


vmrun = _load_vm_run()

# Each risk at least once (KERNEL_FACTS section 9, issue 5):
GUESTS = [
    ("x86_64", "two-node"),  # baseline, x86_64 syscall order 237/238/239
    ("x86_64", "four-node-asym"),  # asymmetric distances
    ("x86_64", "many-66"),  # 66 nodes: masks wider than one 64-bit word
    ("x86_64", "cpuset"),  # cgroup v2 cpuset.mems=0: real EINVAL paths
    ("aarch64", "two-node"),  # asm-generic numbers (235/236/237), the 237 trap
    ("aarch64", "memory-only"),  # a CPU-less memory node
    ("ppc64le", "two-node"),  # 64 KiB pages
    ("s390x", "no-numa"),  # big-endian, kernel without NUMA: ENOSYS
    # Linux 6.12 (Debian 13 image): ACPI HMAT, node 2 in a lower memory tier,
    # weighted interleave 3:1 (issue 11)
    ("x86_64-6.12", "hmat-tiers"),
    # QEMU 10 (vm/build.py qemu10) on the 6.12 image (issue 22): devices behind a
    # PCI Express expander on node 1 and a generic-initiator node; two packages of
    # two nodes (SNC2/NPS2); a CXL Type-3 memory expander onlined as node 2.
    ("x86_64-6.12", "pci-devices"),
    ("x86_64-6.12", "snc-2x2"),
    ("x86_64-6.12", "cxl"),
]

# Checks that must have run (passed, not skipped) in a guest of that kind.
_ALWAYS = {"raw_sysfs_topology", "topology", "launch"}
_NUMA = {
    "raw_interleave_split",
    "raw_bind_prefer_get",
    "raw_seccomp_eperm",
    "raw_shared_regions",
    "raw_numa_maps_kinds",
    "interleave_split",
    "bind_prefer",
    "numa_maps_parse",
}


def required_checks(arch, topology):
    topo = vmrun.TOPOLOGIES[topology]
    need = set(_ALWAYS)
    if not topo["numa"]:
        need |= {"raw_no_numa", "no_numa_api"}
        return need
    need |= _NUMA
    if topo["cgroup_mems"] is not None:
        need |= {"raw_cpuset_einval", "cpuset_einval"}
    else:
        # Interleaving a shared region needs two usable memory nodes; the cpuset
        # guest has one (shared_regions skips there, rightly).
        need |= {
            "seccomp_fallback",
            "shared_regions",
            "layout_regions",
            "record_room",
            "settle_scope",
            "pinned_reused_id",
        }
    if arch == "aarch64":
        need.add("raw_wrong_number_is_caught")
    if len([n for n in topo["nodes"].values() if n["mem_mb"]]) >= 2 and topo["cgroup_mems"] is None:
        need.add("raw_weighted_interleave")  # 3:1 on 6.9+, EINVAL on 6.1
    if topo.get("hmat") or topo.get("tiers"):
        need.add("raw_tiers_hmat")
    if topo.get("pci"):
        need |= {"raw_pci_locality", "pci_topology_api"}
    if topo.get("generic_initiators"):
        need |= {"raw_generic_initiator", "generic_initiator_api"}
    if topo.get("packages"):
        need |= {"raw_packages", "packages_api"}
    if topo.get("cxl_mb"):
        need |= {"raw_cxl_node", "cxl_api", "weighted_interleave_api"}
    if arch.startswith("x86_64") and topology in ("two-node", "cxl"):
        need.add("fit_real")  # fit() against a cgroup, huge pages, a small /dev/shm
    if arch == "x86_64" and topology == "two-node":
        # PinnedPool places on the node asked; a long-term pin (io_uring) stops
        # move_pages, so placing after pinning is too late (issue 42)
        need |= {"pool_cross_node", "raw_pinned_cannot_move"}
    return need


def _summary(arch, topology, records, seconds):
    lines = [f"guest {arch} topology {topology}: {len(records)} checks in {seconds:.1f}s"]
    for r in records:
        what = r.get("detail") or json.dumps(r.get("data"))[:150]
        lines.append(f"  {r['status']:4} {r['name']:28} {what}")
    return "\n".join(lines)


def _boot(arch, topology, **kw):
    reason = vmrun.missing_reason(arch, topology)
    if reason:
        pytest.skip(reason)
    t0 = time.monotonic()
    ok, console = vmrun.run_guest(arch, topology, timeout=kw.pop("timeout", 600), **kw)
    return ok, console, vmrun.check_results(console), time.monotonic() - t0


@pytest.mark.vm
@pytest.mark.parametrize("arch,topology", GUESTS, ids=[f"{a}-{t}" for a, t in GUESTS])
def test_guest(arch, topology):
    ok, console, records, seconds = _boot(arch, topology)
    summary = _summary(arch, topology, records, seconds)
    print(summary)
    assert records, f"no check results from the guest; console:\n{console[-4000:]}"
    failed = [r for r in records if r["status"] == "fail"]
    assert not failed, (
        summary
        + "\n\n"
        + "\n".join(f"{r['name']}: {r['detail']}\n{r.get('traceback', '')}" for r in failed)
    )
    status = {r["name"]: r["status"] for r in records}
    missing = sorted(n for n in required_checks(arch, topology) if status.get(n) != "pass")
    assert not missing, f"required checks did not pass: {missing}\n{summary}"
    assert ok, f"guest did not exit cleanly\n{summary}\n{console[-3000:]}"
    data = {r["name"]: r.get("data") or {} for r in records}
    if status.get("raw_weighted_interleave") == "pass":
        # The kernel generation decides which branch ran: make sure it is the right one.
        newer = vmrun.build.IMAGES[arch]["suite"] != "bookworm"
        assert ("pages" if newer else "mbind_mode_6") in data["raw_weighted_interleave"], summary


@pytest.mark.vm
def test_guest_catches_wrong_syscall_number():
    """aarch64 with mbind = 237 in numa_utils' table: the tier must fail."""
    command = (
        "NUMA_UTILS_VM_WRONG_SYSCALL=mbind=237 "
        "NUMA_UTILS_VM_ONLY=interleave_split,bind_prefer "
        "python3 /vmtest/guest_runner.py"
    )
    ok, console, records, seconds = _boot("aarch64", "two-node", command=command)
    summary = _summary("aarch64", "two-node (mbind patched to 237)", records, seconds)
    print(summary)
    assert "patching numa_utils aarch64 mbind: 235 -> 237" in console, console[-3000:]
    status = {r["name"]: r["status"] for r in records}
    assert status == {"interleave_split": "fail", "bind_prefer": "fail"}, summary
    assert not ok, "the guest passed with a wrong mbind number"


# ---------------------------------------------------------------- simulator

SIM_FIXTURES = [f for f in FIXTURES if "expected.json" in fixture_archive(f).files]
SIM_ARCHES = ("x86_64", "aarch64", "ppc64le")


# What nodes=None calls use where that is not every memory node in the cpuset (issue
# 11, the rule of default_memory_nodes): GPU HBM and movable-only nodes, and CPU-less
# nodes farther from every CPU node than the CPU nodes are from each other, stay out.
DEFAULT_MEMORY_NODES = {
    "cxl-memory-node": [0, 1],  # node 2: movable-only CXL expander, tier 22
    "gh200": [0],  # node 1: the H100's HBM
    "sparse-ids": [0, 8],  # 250-255: the V100s' movable-only HBM
    "qemu-x86_64-memory-only": [0, 1],  # node 2: CPU-less at 30/40 > 20
    "qemu-ppc64le-memory-only": [0, 1],
    "xeon-max-hbm-flat": [0, 1],  # nodes 2-3: HBM in the faster tier 3, opt-in
}


DEFAULT_MEMORY_NODES["qemu-x86_64-hmat-tiers"] = [0, 1]  # node 2: HMAT tier 54
DEFAULT_MEMORY_NODES["qemu-x86_64-pci-devices"] = [0, 1]  # node 2: generic initiator
DEFAULT_MEMORY_NODES["cxl-qemu-6.12"] = [0, 1]  # node 2: CXL, tier 22


def expect_from_fixture(name, arch):
    """The same expectation dict vm/run.py writes for a guest, from expected.json."""
    exp = json.loads(fixture_text(name, "expected.json"))
    nodes = sorted(exp["nodes"], key=lambda n: n["id"])
    ids = [n["id"] for n in nodes]
    has_dir = "root/sys/devices/system/node" in fixture_archive(name).dirs
    tiers = {}
    if "memory_tiers" in exp:  # issue 11 keys: the tiers fastest first, HMAT access0
        tiers["tiers"] = [
            sorted(v) for _, v in sorted(exp["memory_tiers"].items(), key=lambda kv: int(kv[0]))
        ]
        tiers["access"] = {str(n["id"]): n["access"] for n in nodes if n.get("access")}
    return {
        **tiers,
        "arch": arch,
        "topology": f"fixture:{name}",
        "numa": has_dir,
        "nodes": {
            str(n["id"]): {"cpus": sorted(n["cpus"]), "mem_mb": math.ceil(n["mem_total_kb"] / 1024)}
            for n in nodes
        },
        "distances": [[n["distances"].get(str(m)) for m in ids] for n in nodes],
        "memory_only": sorted(set(exp["nodes_with_memory"]) - set(exp["nodes_with_cpus"])),
        "cpus": len(exp.get("cpus", {})),
        "allowed_mems": sorted(exp["allowed_mems"]),
        "cgroup_mems": None,
        "default_memory_nodes": DEFAULT_MEMORY_NODES.get(name),
    }


@pytest.mark.parametrize("fixture", SIM_FIXTURES)
@pytest.mark.parametrize("arch", SIM_ARCHES)
def test_simulated(fixture, arch):
    expect = expect_from_fixture(fixture, arch)
    if arch == "aarch64" and max(int(n) for n in expect["nodes"]) >= 64:
        pytest.skip(
            "node ids >= 64 cannot exist on aarch64 (arm64 kernels allow at "
            "most 64 nodes, Debian's 16): mbind is EINVAL there, rightly"
        )
    backend = nusim.SimulatedBackend(fixture_root(fixture), arch=arch)
    env = kc.make_env(expect, nu, backend, real=False)
    records = kc.run_checks(env)
    print(_summary(f"simulated {arch}", fixture, records, 0))
    failed = [r for r in records if r["status"] == "fail"]
    assert not failed, "\n".join(
        f"{r['name']}: {r['detail']}\n{r.get('traceback', '')}" for r in failed
    )
    assert any(r["status"] == "pass" for r in records if not r["name"].startswith("raw_"))


# ---------------------------------------------------------------- native


def _native_expect():
    """The expectation for this machine, from its own sysfs (the policy checks
    then verify placement against it)."""
    topo = nu.read_topology()
    ids = sorted(topo.nodes)
    return {
        "arch": os.uname().machine,
        "topology": "native",
        "numa": bool(getattr(topo, "has_node_dir", True)),
        "nodes": {
            str(n): {
                "cpus": sorted(topo.nodes[n].cpus),
                "mem_mb": math.ceil(topo.nodes[n].mem_total_kb / 1024),
            }
            for n in ids
        },
        "distances": [[topo.nodes[n].distances.get(m) for m in ids] for n in ids],
        "memory_only": sorted(set(topo.nodes_with_memory) - set(topo.nodes_with_cpus)),
        "cpus": len(topo.cpus),
        "allowed_mems": sorted(topo.allowed_mems),
        "cgroup_mems": None,
    }


@pytest.mark.realkernel
def test_native_multi_node():
    """On a machine with real multiple nodes the same checks run natively."""
    if not os.path.isdir("/sys/devices/system/node/node1"):
        pytest.skip("this machine has one NUMA node: the QEMU guests (-m vm) cover it")
    expect = _native_expect()
    if len([n for n in expect["nodes"].values() if n["mem_mb"]]) < 2:
        pytest.skip("fewer than two nodes with memory")
    env = kc.make_env(expect, nu, nu.LinuxBackend(), real=True)
    records = kc.run_checks(env)
    print(_summary("native", os.uname().machine, records, 0))
    failed = [r for r in records if r["status"] == "fail"]
    assert not failed, "\n".join(f"{r['name']}: {r['detail']}" for r in failed)


def test_simulated_catches_wrong_syscall_number(monkeypatch):
    """The simulator tier fails too when numa_utils' aarch64 mbind is 237."""
    from types import MappingProxyType

    fixture = "qemu-aarch64-four-node"
    if fixture not in SIM_FIXTURES:
        pytest.skip(f"fixture {fixture} missing")
    tables = dict(nu.SYSCALL_TABLES)
    tables["aarch64"] = MappingProxyType({**tables["aarch64"], "mbind": 237})
    monkeypatch.setattr(nu, "SYSCALL_TABLES", MappingProxyType(tables))
    backend = nusim.SimulatedBackend(fixture_root(fixture), arch="aarch64")
    env = kc.make_env(expect_from_fixture(fixture, "aarch64"), nu, backend, real=False)
    status = {
        r["name"]: r["status"] for r in kc.run_checks(env, ["interleave_split", "bind_prefer"])
    }
    assert status == {"interleave_split": "fail", "bind_prefer": "fail"}, status


# ---------------------------------------------------------------- numactl matrix

MATRIX_GUESTS = [
    ("x86_64", "memory-only"),  # Debian 12: numactl 2.0.16, Linux 6.1
    ("x86_64-6.12", "hmat-tiers"),  # Debian 13: numactl 2.0.19 (--weighted-interleave), 6.12
]
MATRIX_FILES = {
    "/vmtest/numactl_matrix.py": str(REPO / "vm" / "numactl_matrix.py"),
    "/vmtest/numactl_matrix.txt": str(REPO / "vm" / "numactl_matrix.txt"),
}


def matrix_records(console):
    out = []
    for line in vmrun.guest_output(console).splitlines():
        if line.startswith("NUMACTL "):
            out.append(json.loads(line[len("NUMACTL ") :]))
    return out


def _matrix_summary(records):
    lines = []
    for r in records:
        a, b = r["numactl"], r["numa_utils"]
        lines.append(
            f"  {'ok  ' if r['match'] else 'DIFF'} numactl {' '.join(r['args'])}"
            f" {' '.join(r['tags'])}: exit {a['rc']}/{b['rc']}"
            + (
                ""
                if r["match"]
                else f" {'; '.join(r['why'])}\n"
                f"      numactl:    {a['out'][:300]!r} {a['err'][:200]!r}\n"
                f"      numa_utils: {b['out'][:300]!r} {b['err'][:200]!r}"
            )
        )
    return "\n".join(lines)


@pytest.mark.vm(long=True)
@pytest.mark.parametrize("arch,topology", MATRIX_GUESTS, ids=[f"{a}-{t}" for a, t in MATRIX_GUESTS])
def test_numactl_matrix(arch, topology):
    """Issue 13: >= 40 numactl command lines give the same exit status and the same
    `numactl --show` from the child under numactl and under numa_utils numactl."""
    ok, console, _, seconds = _boot(
        arch,
        topology,
        files=MATRIX_FILES,
        timeout=600,
        command="python3 /vmtest/numactl_matrix.py /vmtest/numactl_matrix.txt",
    )
    records = matrix_records(console)
    assert records, f"no matrix output; console:\n{console[-4000:]}"
    if "skip" in records[0]:
        pytest.skip(records[0]["skip"])
    summary = _matrix_summary(records)
    print(f"{arch} {topology}: {len(records)} command lines in {seconds:.0f}s\n{summary}")
    assert len(records) >= 40, summary
    bad = [r for r in records if not r["match"] and "known" not in r["tags"]]
    assert not bad, f"{len(bad)} of {len(records)} differ\n{summary}"
    fixed = [" ".join(r["args"]) for r in records if r["match"] and "known" in r["tags"]]
    assert not fixed, f"these now match: drop their 'known' tag: {fixed}"
    assert ok, console[-3000:]
    known = [" ".join(r["args"]) for r in records if not r["match"]]
    if known:
        warnings.warn(f"numactl matrix {arch} {topology}: known differences: {known}", stacklevel=1)


# ---------------------------------------------------------------- thread roles (issue 29)


@pytest.mark.vm
def test_guest_thread_roles():
    """A 2-node guest with SMT: first-touch 64 MiB on node 0, threads named like NCCL's
    and UCX's, then pinned() and settle() for node 1: every thread on its role's CPUs,
    threads started later inherit them, the pages all move to node 1, every mask comes
    back, and a spawn_context child's own anonymous pages are on node 1 from its first
    line of Python."""
    ok, console, _, seconds = _boot(
        "x86_64",
        "two-node-smt",
        files={"/vmtest/guest_threads.py": str(REPO / "vm" / "guest_threads.py")},
        command="python3 /vmtest/guest_threads.py",
        timeout=900,
    )
    lines = [ln for ln in vmrun.guest_output(console).splitlines() if ln.startswith("THREADS ")]
    assert lines, f"no report from the guest; console:\n{console[-4000:]}"
    got = json.loads(lines[-1][len("THREADS ") :])
    print(f"two-node-smt guest in {seconds:.0f}s: {json.dumps(got)[:3000]}")
    assert ok, console[-3000:]
    node0, node1 = got["node0"], got["node1"]
    assert (node0, node1) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert got["siblings"]["4"] == [4, 5], "the guest must have SMT siblings"
    roles = {role: nu.parse_cpulist(cpus) for role, cpus in got["plan"]["roles"].items()}
    assert roles == {"comm": {4, 5}, "compute": {6, 7}}  # whole cores, siblings together
    size = 64 << 20
    assert got["before"] == {"0": size}
    assert got["pinned_ok"]
    for name, mask in got["masks_pinned"].values():
        role = "comm" if name.startswith(("NCCL", "ucx")) else "compute"
        assert nu.parse_cpulist(mask) == roles[role], (name, mask)
    assert got["inherited"] == {
        "NCCL WatchDog": [4, 5],
        "ucx-progress": [4, 5],
        "ZMQbg/1": [6, 7],
        "main": [6, 7],
    }
    assert got["settled"]["applied"], got["settled"]
    assert got["after"] == {"1": size}  # the remote share made 0%
    assert got["masks_restored"] == got["masks_before"]
    assert got["policy_restored"] == "DEFAULT"
    spawned = got["spawned"]
    assert got["spawned_exit"] == 0
    assert spawned["cpus"] == node1
    assert set(spawned["anon_pages"]) == {"1"}, spawned


# ---------------------------------------------------------------- vm.max_map_count


@pytest.mark.vm
def test_guest_max_map_count():
    """Issues 27 and 40 on a real kernel (vm/guest_map_count.py): with
    vm.max_map_count 1000 a 200 x 8 alternating layout is placed by thread under
    strict with no mbind on its data, every block on its node, the data one VMA, the
    VMA count up by at most 2 beyond the prefault threads' stacks, the process still
    starts threads and maps files; a layout within the limit lands exactly by policy."""
    ok, console, records, seconds = _boot(
        "x86_64",
        "two-node",
        files={"/vmtest/guest_map_count.py": str(REPO / "vm" / "guest_map_count.py")},
        command="python3 /vmtest/guest_map_count.py",
    )
    summary = _summary("x86_64", "two-node (vm.max_map_count 1000)", records, seconds)
    print(summary)
    status = {r["name"]: r["status"] for r in records}
    want = {"map_count_by_thread", "map_count_within_lands"}
    assert status == dict.fromkeys(want, "pass"), (
        summary + "\n" + json.dumps([r for r in records if r["status"] != "pass"], indent=1)
    )


# ---------------------------------------------------------------- placement by thread


@pytest.mark.vm
def test_guest_placement_by_thread():
    """Issue 40 section 4 on a real kernel (vm/guest_placement.py), default
    vm.max_map_count: 100,000 one-page cells over 2 ranks land on their ranks' nodes
    page by page, the region at most 2 VMAs in each process; with seccomp denying the
    policy syscalls, the same layout made by a creator bound to node 0, a plain
    interleaved region and the seeds' own mapping land exactly by thread."""
    ok, console, records, seconds = _boot(
        "x86_64",
        "two-node",
        files={"/vmtest/guest_placement.py": str(REPO / "vm" / "guest_placement.py")},
        # cgroup2 mounted, as a container runtime mounts it: the cpuset is readable
        command="mount -t cgroup2 none /sys/fs/cgroup; python3 /vmtest/guest_placement.py",
        timeout=1800,
    )
    summary = _summary("x86_64", "two-node (placement by thread)", records, seconds)
    print(summary)
    status = {r["name"]: r["status"] for r in records}
    want = {
        "placement_ranks",
        "placement_seccomp",
        "placement_seccomp_interleave",
        "placement_seccomp_seeds",
    }
    assert status == dict.fromkeys(want, "pass"), (
        summary + "\n" + json.dumps([r for r in records if r["status"] != "pass"], indent=1)
    )


# ---------------------------------------------------------------- huge-page record segment


def _huge_record_steps(console):
    out = {}
    for line in vmrun.guest_output(console).splitlines():
        if line.startswith("HUGE_RECORD "):
            step = json.loads(line[len("HUGE_RECORD ") :])
            out[step.pop("step")] = step
    return out


@pytest.mark.vm
def test_huge_record_guest():
    """Issue 27.2 on a real kernel: 4 huge pages of 2 MiB reserved on node 0 only; a
    region of exactly 4 pages bound there creates and prefaults; numa_maps shows only
    the data's 4 huge pages (the record segment's line is no huge one); a second
    process attaches it; `maps PID` reads its layout; cleanup removes both segments."""
    ok, console, _, seconds = _boot(
        "x86_64",
        "two-node",
        files={"/vmtest/huge_record_guest.py": str(REPO / "vm" / "huge_record_guest.py")},
        command="python3 /vmtest/huge_record_guest.py",
    )
    steps = _huge_record_steps(console)
    print(f"huge record guest in {seconds:.0f}s: {json.dumps(steps, indent=1)}")
    assert {"reserved", "create", "maps", "attach", "cleanup"} <= set(steps), console[-4000:]
    assert steps["reserved"] == {"node0": 4, "node1": 0}
    made = steps["create"]
    assert made["fit_ok"], made
    assert (made["size"], made["page"], made["prefaulted"]) == (8 << 20, 2 << 20, 8 << 20)
    assert made["placement"] == {"0": 8 << 20} and made["free_node0"] == 0, made
    key = made["ipc_key"]
    room_key = f"0x4f{key[4:]}"
    assert made["segments"] == {key: 8 << 20, room_key: nur._RECORD_ROOM}, made
    (data,) = made["data_line"]
    assert " huge " in data and "N0=4" in data and "kernelpagesize_kB=2048" in data, data
    (room,) = made["room_line"]
    assert " huge" not in room and "kernelpagesize_kB=4" in room, room
    # All 4 of its pages where the data may be, the first written (its record being
    # made) too: the room's policy is set before that write.
    assert " N0=4 " in room and " N1=" not in room, room
    assert [x["pages"] for x in made["huge_lines"]] == [4], made["huge_lines"]
    assert steps["maps"]["regions"] == [
        {"name": "huge-record", "layout": "8M:bind:0", "error": None}
    ], steps["maps"]
    att = steps["attach"]
    assert att.get("identity_key") == "huge-record", att
    assert (att["size"], att["page"], att["layout"]) == (8 << 20, 2 << 20, "8M:bind:0")
    assert att["placement"] == {"0": 8 << 20}, att
    gone = steps["cleanup"]
    assert [(r["region"], r["action"]) for r in gone["rows"]] == [("huge-record", "removed")]
    assert gone["segments"] == {} and gone["free_node0"] == 4, gone
    assert ok, console[-3000:]


# A boot that never reaches the guest's command is stopped after boot_timeout and
# booted once more; these stand-ins for QEMU are shell commands (no guest needed).
def test_console_stops_a_boot_that_never_begins():
    t0 = time.monotonic()
    text, status, timed_out = vmrun._console(
        ["sh", "-c", "echo booting; exec sleep 30"], timeout=60, boot_timeout=1, echo=False
    )
    assert time.monotonic() - t0 < 20
    assert (status, timed_out) == (None, False)
    assert "booting" in text


def test_console_lets_a_begun_command_run_past_boot_timeout():
    script = f"echo '{vmrun.BEGIN}'; sleep 2; echo '@@NUMA_UTILS_VM END rc=0@@'"
    text, status, timed_out = vmrun._console(
        ["sh", "-c", script], timeout=60, boot_timeout=1, echo=False
    )
    assert (status, timed_out) == (0, False)
    assert vmrun.END_RE.search(text).group(1) == "0"


def test_console_times_out_a_command_that_never_ends():
    text, status, timed_out = vmrun._console(
        ["sh", "-c", f"echo '{vmrun.BEGIN}'; exec sleep 30"], timeout=2, boot_timeout=1, echo=False
    )
    assert timed_out
    assert status is not None


def test_the_long_guests_start_first():
    """The numactl matrices (marked vm(long=True)) are the first guests collected, so
    xdist hands them out first (conftest.pytest_collection_modifyitems)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-m", "vm", "tests/test_fleet.py", "tests/test_vm.py"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(REPO),
    )
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert len(ids) > len(MATRIX_GUESTS), out.stdout + out.stderr
    assert ids[: len(MATRIX_GUESTS)] == [
        f"tests/test_vm.py::test_numactl_matrix[{a}-{t}]" for a, t in MATRIX_GUESTS
    ]
