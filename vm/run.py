#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Boot a Debian kernel under QEMU (software emulation, no KVM) with an emulated
NUMA topology and run a command in it.

The guest's initramfs is the cached base archive from vm/build.py followed by a
small per-run archive holding /init, the current numa_utils.py (with envs.py and
every numa_utils_*.py beside it), tests/kernel_checks.py,
vm/guest_runner.py and the expected topology (/vmtest/expect.json). /init mounts
proc, sysfs, devtmpfs, a tmpfs on /dev/shm and /tmp (and cgroup2 for the ``cpuset``
topology), runs the command between markers on the console and powers off.

    python3 vm/run.py x86_64 two-node              # run the kernel checks
    python3 vm/run.py aarch64 memory-only -- cat /sys/devices/system/node/online
    python3 vm/run.py --list                       # the topologies
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, Mapping, Optional, Tuple, Union

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import build  # noqa: E402  (vm/build.py: cache location and cpio writer)

BEGIN = "@@NUMA_UTILS_VM BEGIN@@"
END_RE = re.compile(r"@@NUMA_UTILS_VM END rc=(\d+)@@")

# Guest architecture -> QEMU binary, machine arguments and console device.
QEMU = {
    "x86_64": {"binary": "qemu-system-x86_64", "machine": ["-M", "pc"], "console": "ttyS0"},
    "aarch64": {
        "binary": "qemu-system-aarch64",
        "machine": ["-M", "virt", "-cpu", "cortex-a57"],
        "console": "ttyAMA0",
    },
    "ppc64le": {
        "binary": "qemu-system-ppc64",
        "machine": ["-M", "pseries", "-cpu", "power9"],
        "console": "hvc0",
    },
    "s390x": {
        "binary": "qemu-system-s390x",
        "machine": ["-M", "s390-ccw-virtio", "-cpu", "max"],
        "console": "ttysclp0",
    },
}


# ---------------------------------------------------------------- topologies
#
# A topology is described once, as what the guest must see; the QEMU arguments
# are generated from it. QEMU keeps node ids as given on the command line, but
# x86_64 Linux renumbers nodes in the order the firmware (SRAT) lists them, CPU
# nodes first (KERNEL_FACTS section 9), so every topology here lists CPU nodes
# first and numbers nodes densely: then the guest's ids equal ours.


def _topology(nodes, distances=None, *, cgroup_mems=None, numa=True) -> dict:
    """nodes: list of (cpus, mem_mb); distances: {(a, b): d} (symmetric)."""
    n = len(nodes)
    dist = [[10 if i == j else 20 for j in range(n)] for i in range(n)]
    for (a, b), d in (distances or {}).items():
        dist[a][b] = dist[b][a] = d
    cpus_total = sum(len(c) for c, _ in nodes)
    return {
        "numa": numa,
        "nodes": {str(i): {"cpus": list(c), "mem_mb": m} for i, (c, m) in enumerate(nodes)},
        "distances": dist if numa else None,
        # Memory but no CPUs (a node with neither is not memory-only).
        "memory_only": [i for i, (c, m) in enumerate(nodes) if not c and m and numa],
        "cpus": cpus_total,
        "mem_mb": sum(m for _, m in nodes),
        "allowed_mems": (
            list(cgroup_mems)
            if cgroup_mems is not None
            else [i for i, (_, m) in enumerate(nodes) if m]
            if numa
            else None
        ),
        "cgroup_mems": list(cgroup_mems) if cgroup_mems is not None else None,
    }


def _hmat_topology(
    nodes, distances, initiator_of, lb, *, local, remote, tiers, default_memory_nodes
) -> dict:
    """A topology with ACPI HMAT (`-machine pc,hmat=on`): initiator_of gives each
    CPU-less node the initiator QEMU needs; lb[(i, t)] = (latency ns, bandwidth GB/s)
    for CPU node i and target t, else local/remote. What the guest must read back:
    per node its best initiator and access class 0 figures (MB/s = GB/s * 1024,
    as the kernel reports QEMU's 'G'), the tiers fastest first, and the nodes
    default_memory_nodes() must choose."""
    topo = _topology(nodes, distances)
    cpu_nodes = [i for i, (c, _) in enumerate(nodes) if c]
    table = {}
    for i in cpu_nodes:
        for t in range(len(nodes)):
            table[f"{i},{t}"] = list(lb.get((i, t), local if i == t else remote))
    access = {}
    for t in range(len(nodes)):
        ini = t if t in cpu_nodes else initiator_of[t]
        lat, bw = table[f"{ini},{t}"]
        access[str(t)] = {
            "initiators": [ini],
            "read_latency_ns": lat,
            "write_latency_ns": lat,
            "read_bandwidth_mbps": bw * 1024,
            "write_bandwidth_mbps": bw * 1024,
        }
    topo.update(
        hmat={"initiator_of": {str(k): v for k, v in initiator_of.items()}, "lb": table},
        access=access,
        tiers=tiers,
        default_memory_nodes=default_memory_nodes,
    )
    return topo


# -- QEMU 10 guests (KERNEL_FACTS section 11; x86_64-6.12 image, vm/build.py qemu10) --
#
# Extra keys: "qemu": "qemu10" (the cached launcher instead of the host's QEMU);
# "machine", "smp": replace the image's -M and -smp; "devices": more QEMU arguments;
# "modules": guest modules /init insmods first (vm/build.py GUEST_MODULES);
# "setup": a shell snippet /init runs after them; "pci": the PCI functions the
# guest must show (from the QEMU definition below); "packages": each CPU's
# physical_package_id; "generic_initiators": nodes with neither CPUs nor memory
# that stand for a device.

_PXB = ["-device", "pxb-pcie,bus_nr=128,id=pxb1,numa_node=1,bus=pcie.0"]
for _i, (_dev, _extra) in enumerate(
    (
        ("VGA,id=gpu0", ""),
        ("nvme,id=nvme0,serial=numautils0,drive=nvm0", ""),
        ("e1000e,id=nic0,romfile=", ""),
    )
):
    _PXB += [
        "-device",
        f"pcie-root-port,id=rp{_i + 1},bus=pxb1,chassis={_i + 1},slot={_i + 1},addr={_i:#x}",
        "-device",
        f"{_dev},bus=rp{_i + 1}{_extra}",
    ]
# A 16 MiB drive that reads zeroes and stores nothing (no file on the host).
_PXB += [
    "-blockdev",
    "driver=null-co,node-name=nvm0,size=16777216,read-zeroes=on",
    "-object",
    "acpi-generic-initiator,id=gi0,pci-dev=gpu0,node=2",
]

# What the guest must show behind the expander: bus 0x80 holds the three root
# ports (devices 0-2), each the parent of bus 0x81 + i. QEMU's own ids (VGA
# 1234:1111, NVMe 1b36:0010, e1000e 8086:10d3), driver and kernel names as Debian's
# 6.12 names them without udev.
_PCI = {
    "0000:81:00.0": {
        "class": "0x030000",
        "vendor": "0x1234",
        "device": "0x1111",
        "driver": None,
        "names": [],
        "root_port": "0000:80:00.0",
    },
    "0000:82:00.0": {
        "class": "0x010802",
        "vendor": "0x1b36",
        "device": "0x0010",
        "driver": "nvme",
        "names": ["nvme0"],
        "root_port": "0000:80:01.0",
    },
    "0000:83:00.0": {
        "class": "0x020000",
        "vendor": "0x8086",
        "device": "0x10d3",
        "driver": "e1000e",
        "names": ["eth0"],
        "root_port": "0000:80:02.0",
    },
}
for _d in _PCI.values():
    _d.update(numa_node=1, local_cpulist=[1])

# The CXL Type-3 volatile expander's region, made through sysfs
# (Documentation/ABI/testing/sysfs-bus-cxl): root decoder decoder0.0, the
# endpoint decoder of mem0, 256 MiB, one way; cxl_region then dax_cxl and kmem
# online it as node 2.
CXL_SETUP = r"""
B=/sys/bus/cxl/devices
for i in $(seq 100); do
    EP=$(for d in $B/decoder*.0; do [ -e $d/dpa_size ] && echo ${d##*/}; done | head -n1)
    [ -e $B/decoder0.0/create_ram_region ] && [ -n "$EP" ] && break; sleep 0.1
done
R=$(cat $B/decoder0.0/create_ram_region)
echo $R > $B/decoder0.0/create_ram_region
echo 256 > $B/$R/interleave_granularity
echo 1 > $B/$R/interleave_ways
echo ram > $B/$EP/mode
echo 0x10000000 > $B/$EP/dpa_size
echo 0x10000000 > $B/$R/size
echo $EP > $B/$R/target0
echo 1 > $B/$R/commit
echo $R > /sys/bus/cxl/drivers/cxl_region/bind
for i in $(seq 200); do grep -q 2 /sys/devices/system/node/has_memory && break; sleep 0.1; done
echo "VMNOTE cxl: $R on $EP; has_memory $(cat /sys/devices/system/node/has_memory)"
"""

PCI_SETUP = r"""
for i in $(seq 100); do [ -e /sys/class/nvme/nvme0 ] && [ -e /sys/class/net/eth0 ] && break
    sleep 0.1; done
"""

TOPOLOGIES = {
    "two-node": _topology([([0], 512), ([1], 512)]),
    "four-node-asym": _topology(
        [([0], 256), ([1], 256), ([2], 256), ([3], 256)],
        {(0, 1): 12, (0, 2): 20, (0, 3): 30, (1, 2): 25, (1, 3): 20, (2, 3): 15},
    ),
    "memory-only": dict(
        _topology([([0], 512), ([1], 512), ([], 256)], {(0, 1): 20, (0, 2): 30, (1, 2): 40}),
        # CPU-less and farther than the remote DRAM node (issue 11):
        # not a nodes=None node.
        default_memory_nodes=[0, 1],
    ),
    # One node per CPU plus 64 memory-only nodes: node masks wider than one
    # 64-bit word. x86_64 only (Debian's arm64 kernel allows 16 nodes).
    "many-66": _topology([([0], 256), ([1], 256)] + [([], 32)] * 64),
    "cpuset": _topology([([0], 512), ([1], 512)], cgroup_mems=[0]),
    # Two sockets of two cores of two SMT threads, one node each (issue 29: thread
    # roles, SMT siblings, settling pages from node 0 to node 1).
    # An Intel model (CPUID leaf 0xB) so that the kernel sees the SMT siblings (TCG's
    # "max" is AMD-like without topoext: every CPU its own core);
    # cgroup2 is mounted so that the process's cpuset is readable.
    "two-node-smt": dict(
        _topology([([0, 1, 2, 3], 512), ([4, 5, 6, 7], 512)]),
        machine=["-M", "pc", "-cpu", "Nehalem"],
        smp="8,sockets=2,cores=2,threads=2",
        setup="mount -t cgroup2 none /sys/fs/cgroup",
    ),
    "no-numa": _topology([([0, 1], 512)], numa=False),
    # Two DRAM nodes and a slow CPU-less one (CXL-like), described with ACPI HMAT
    # (KERNEL_FACTS section 10): the kernel puts node 2 in its own lower tier.
    "hmat-tiers": _hmat_topology(
        [([0], 512), ([1], 512), ([], 512)],
        {(0, 1): 20, (0, 2): 30, (1, 2): 30},
        {2: 0},
        {(0, 2): (300, 50), (1, 2): (300, 50)},
        local=(100, 200),
        remote=(200, 100),
        tiers=[[0, 1], [2]],
        default_memory_nodes=[0, 1],
    ),
    # q35, nodes 0 and 1 in packages 0 and 1, a PCI Express expander on node 1
    # with a display device, an NVMe controller and a NIC behind three root
    # ports; node 2 has neither CPUs nor memory: an ACPI generic initiator
    # standing for the display device.
    "pci-devices": dict(
        _topology([([0], 512), ([1], 512), ([], 0)]),
        qemu="qemu10",
        machine=["-M", "q35", "-vga", "none"],
        smp="2,sockets=2,cores=1",
        devices=_PXB,
        modules=["nvme-auth", "nvme-core", "nvme", "e1000e"],
        setup=PCI_SETUP,
        pci=_PCI,
        packages=[0, 1],
        generic_initiators=[2],
        tiers=[[0, 1]],
        default_memory_nodes=[0, 1],
    ),
    # Sub-NUMA clustering (SNC2 / NPS2): two packages of two cores, one node per core.
    "snc-2x2": dict(
        _topology(
            [([0], 256), ([1], 256), ([2], 256), ([3], 256)],
            {(0, 1): 11, (2, 3): 12, (0, 2): 20, (1, 3): 20, (0, 3): 21, (1, 2): 21},
        ),
        qemu="qemu10",
        smp="4,sockets=2,cores=2",
        packages=[0, 0, 1, 1],
        nodes_per_package=2,
        tiers=[[0, 1, 2, 3]],
        default_memory_nodes=[0, 1, 2, 3],
    ),
    # A CXL Type-3 volatile memory expander (256 MiB) onlined by the kernel's CXL
    # and DAX kmem drivers as the CPU-less node 2, in its own slower tier.
    "cxl": dict(
        _topology([([0], 512), ([1], 512), ([], 256)]),
        qemu="qemu10",
        machine=["-M", "q35,cxl=on", "-cpu", "max,-hypervisor"],
        smp="2,sockets=2,cores=1,threads=1",
        cxl_mb=256,
        devices=[
            "-object",
            "memory-backend-ram,id=cxlvmem0,size=256M",
            "-device",
            "pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.0",
            "-device",
            "cxl-rp,port=0,bus=cxl.0,id=cxl_rp0,chassis=0,slot=2",
            "-device",
            "cxl-type3,bus=cxl_rp0,volatile-memdev=cxlvmem0,id=cxl-vmem0",
            "-M",
            "cxl-fmw.0.targets.0=cxl.0,cxl-fmw.0.size=4G",
        ],
        modules=["cxl_acpi", "cxl_pci", "cxl_mem", "dax_cxl", "kmem"],
        setup=CXL_SETUP,
        packages=[0, 1],
        tiers=[[0, 1], [2]],
        default_memory_nodes=[0, 1],
    ),
}

# Which topologies each guest image (vm/build.py IMAGES) can boot.
SUPPORTED = {
    "x86_64": {
        "two-node",
        "two-node-smt",
        "four-node-asym",
        "memory-only",
        "many-66",
        "cpuset",
        "no-numa",
    },
    "x86_64-6.12": {
        "two-node",
        "memory-only",
        "cpuset",
        "hmat-tiers",
        "pci-devices",
        "snc-2x2",
        "cxl",
    },
    "aarch64": {"two-node", "four-node-asym", "memory-only", "cpuset", "no-numa"},
    "ppc64le": {"two-node", "four-node-asym", "memory-only", "cpuset", "no-numa"},
    # Debian's s390x kernel has no NUMA: the only honest topology is none.
    "s390x": {"no-numa"},
}


def qemu_topology_args(topo: dict) -> list:
    # The CXL window's memory is not part of -m (its own memory-backend-ram).
    boot_mb = topo["mem_mb"] - topo.get("cxl_mb", 0)
    args = ["-smp", topo.get("smp") or str(topo["cpus"]), "-m", f"{boot_mb}M"]
    if not topo["numa"]:
        return args
    hmat = topo.get("hmat")
    for nid, node in topo["nodes"].items():
        if nid == "2" and topo.get("cxl_mb"):
            continue  # the kernel makes it from the CXL region
        if not node["mem_mb"]:
            args += ["-numa", f"node,nodeid={nid}"]  # neither CPUs nor memory
            continue
        args += ["-object", f"memory-backend-ram,id=m{nid},size={node['mem_mb']}M"]
        spec = f"node,nodeid={nid},memdev=m{nid}"
        for cpu in node["cpus"]:
            spec += f",cpus={cpu}"
        if hmat:
            spec += f",initiator={nid if node['cpus'] else hmat['initiator_of'][nid]}"
        args += ["-numa", spec]
    n = len(topo["nodes"])
    dist = topo["distances"]
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    # QEMU wants either no distances or one for every pair.
    if any(dist[a][b] != 20 for a, b in pairs) and not topo.get("cxl_mb"):
        for a, b in pairs:
            args += ["-numa", f"dist,src={a},dst={b},val={dist[a][b]}"]
    for key, (lat, bw) in (hmat or {}).get("lb", {}).items():
        i, t = key.split(",")
        base = f"hmat-lb,initiator={i},target={t},hierarchy=memory"
        args += [
            "-numa",
            f"{base},data-type=access-latency,latency={lat}",
            "-numa",
            f"{base},data-type=access-bandwidth,bandwidth={bw}G",
        ]
    return args + list(topo.get("devices", ()))


def arch_of(image: str) -> str:
    """Guest image (x86_64, x86_64-6.12, ...) -> its architecture."""
    return build.IMAGES[image]["arch"]


def expect_for(image: str, topology: str) -> dict:
    topo = dict(TOPOLOGIES[topology])
    topo["arch"] = arch_of(image)
    topo["image"] = image
    topo["topology"] = topology
    return topo


# ---------------------------------------------------------------- the guest

INIT = r"""#!/bin/busybox sh
export PATH=/usr/bin:/bin:/usr/sbin:/sbin HOME=/root PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH=/vmtest LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
if [ "@CGROUP@" = 1 ]; then
    mount -t cgroup2 none /sys/fs/cgroup
fi
[ -w /proc/sys/kernel/numa_balancing ] && echo 0 > /proc/sys/kernel/numa_balancing
cd /vmtest
for m in @MODULES@; do busybox insmod /vmtest/modules/$m.ko || echo "VMNOTE insmod $m failed"; done
@SETUP@
echo "@BEGIN@"
@COMMAND@
echo "@@NUMA_UTILS_VM END rc=$?@@"
sync
poweroff -f
"""

DEFAULT_COMMAND = "python3 /vmtest/guest_runner.py"

FileSpec = Union[str, bytes]


def _guest_files(
    expect: dict, files: Optional[Mapping[str, FileSpec]], patch_module=None
) -> Dict[str, bytes]:
    out: Dict[str, bytes] = {}

    def read(path: str) -> bytes:
        with open(path, "rb") as fh:
            return fh.read()

    module = (
        read(os.path.join(REPO, "numa_utils.py"))
        if os.path.exists(os.path.join(REPO, "numa_utils.py"))
        else None
    )
    if module is not None:
        if patch_module is not None:
            module = patch_module(module.decode()).encode()
        out["/vmtest/numa_utils.py"] = module
    siblings = sorted(
        n for n in os.listdir(REPO) if n.startswith("numa_utils_") and n.endswith(".py")
    )
    for name in ("envs.py", *siblings):
        if os.path.exists(os.path.join(REPO, name)):
            out["/vmtest/" + name] = read(os.path.join(REPO, name))
    out["/vmtest/kernel_checks.py"] = read(os.path.join(REPO, "tests", "kernel_checks.py"))
    out["/vmtest/guest_runner.py"] = read(os.path.join(HERE, "guest_runner.py"))
    out["/vmtest/expect.json"] = json.dumps(expect, indent=1).encode()
    for guest_path, spec in (files or {}).items():
        out[guest_path] = spec if isinstance(spec, bytes) else read(spec)
    return out


def _run_archive(files: Dict[str, bytes], init: str, dest: str) -> None:
    def write(w: build.CpioWriter) -> None:
        dirs = set()
        for path in sorted(files):
            parts = path.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    w.add_dir(d)
        w.add_file("init", init.encode(), 0o755)
        for path in sorted(files):
            w.add_file(path.strip("/"), files[path], 0o755 if path.endswith(".sh") else 0o644)

    build.pack_cpio_gz(write, dest, level=1)


def images(image: str) -> Tuple[str, str]:
    d = os.path.join(build.cache_dir(), image)
    return os.path.join(d, "vmlinuz"), os.path.join(d, "base.cpio.gz")


def missing_reason(image: str, topology: Optional[str] = None) -> Optional[str]:
    """Why this image's guest (with this topology) cannot boot here, or None."""
    topo = TOPOLOGIES.get(topology or "", {})
    if topo.get("qemu") == "qemu10":
        if not build.qemu10_complete():
            return (
                f"QEMU 10 missing: {build.qemu10_binary()} (run: python3 vm/build.py --arch qemu10)"
            )
        if topo.get("modules") and not build.modules_complete(image):
            return (
                f"guest modules missing in {build.modules_dir(image)} (run: python3 "
                f"vm/build.py --arch {image}-modules)"
            )
    q = QEMU[arch_of(image)]["binary"]
    if topo.get("qemu") != "qemu10" and shutil.which(q) is None:
        return (
            f"{q} not found (apt-get install qemu-system-x86 qemu-system-arm "
            "qemu-system-ppc qemu-system-misc)"
        )
    for path in images(image):
        if not os.path.exists(path):
            return f"{path} missing (run: python3 vm/build.py --arch {image})"
    return None


def qemu_command(image: str, topology: str, initrd: str, *, extra_append: str = "") -> list:
    kernel, _ = images(image)
    q = QEMU[arch_of(image)]
    topo = TOPOLOGIES[topology]
    machine = list(topo.get("machine") or q["machine"])
    if topo.get("hmat"):
        machine[1] += ",hmat=on"
    binary = build.qemu10_binary() if topo.get("qemu") == "qemu10" else q["binary"]
    append = (
        f"console={q['console']} panic=-1 quiet rdinit=/init loglevel=3 {extra_append}"
    ).strip()
    return [
        binary,
        *machine,
        "-accel",
        "tcg",
        "-no-reboot",
        "-nographic",
        "-net",
        "none",
        "-kernel",
        kernel,
        "-initrd",
        initrd,
        "-append",
        append,
    ] + qemu_topology_args(topo)


def run_guest(
    arch: str,
    topology: str,
    files: Optional[Mapping[str, FileSpec]] = None,
    command: str = DEFAULT_COMMAND,
    timeout: float = 180,
    *,
    boot_timeout: float = 300,
    patch_module=None,
    echo: bool = False,
) -> Tuple[bool, str]:
    """Boot the guest, run command, power off. Returns (exit_ok, console text).

    exit_ok is True when the command exited 0 inside the guest and QEMU ended
    by itself. files maps guest paths to host paths or bytes; patch_module is
    an optional str -> str applied to the guest's copy of numa_utils.py.
    A guest whose command has not begun ``boot_timeout`` seconds after QEMU
    started (a stalled boot) is stopped and booted once more.
    """
    if topology not in SUPPORTED[arch]:
        raise ValueError(f"{arch} cannot boot topology {topology!r}")
    reason = missing_reason(arch, topology)
    if reason:
        raise FileNotFoundError(reason)
    expect = expect_for(arch, topology)
    init = (
        INIT.replace("@BEGIN@", BEGIN)
        .replace("@CGROUP@", "1" if expect["cgroup_mems"] is not None else "0")
        .replace("@MODULES@", " ".join(expect.get("modules", ())))
        .replace("@SETUP@", expect.get("setup", ""))
        .replace("@COMMAND@", command)
    )
    _, base = images(arch)
    parts = [base]
    if expect.get("modules"):
        parts.append(os.path.join(build.modules_dir(arch), "modules.cpio.gz"))
    with tempfile.TemporaryDirectory(prefix="numa_utils_vm_") as tmp:
        run_cpio = os.path.join(tmp, "run.cpio.gz")
        _run_archive(_guest_files(expect, files, patch_module), init, run_cpio)
        initrd = os.path.join(tmp, "initrd.gz")
        # The kernel unpacks concatenated archives in order; later files win.
        with open(initrd, "wb") as out:
            for part in (*parts, run_cpio):
                with open(part, "rb") as fh:
                    shutil.copyfileobj(fh, out)
        cmd = qemu_command(arch, topology, initrd)
        text, returncode, timed_out = _console(cmd, timeout, boot_timeout, echo)
        if returncode is None and not timed_out:
            # The guest's command never began: the kernel stalled while booting under
            # TCG (once in CI, on a loaded machine, after hundreds of good boots) or
            # stopped before /init.  Nothing of ours ran yet, so one more boot judges
            # the same code; both consoles are kept.
            first = text
            text, returncode, timed_out = _console(cmd, timeout, boot_timeout, echo)
            note = f"[vm/run] the command did not begin within {boot_timeout:.0f}s; booted again"
            text = f"{first}\n{note}\n{text}"
    if timed_out:
        text += f"\n[vm/run] TIMEOUT after {timeout:.0f}s\n"
    m = END_RE.search(text)
    ok = not timed_out and returncode == 0 and m is not None and m.group(1) == "0"
    return ok, text


def _console(
    cmd: list, timeout: float, boot_timeout: float, echo: bool
) -> Tuple[str, Optional[int], bool]:
    """Run QEMU and read its console as it comes (so a hung guest still shows what it
    printed).  Returns (console text, QEMU's exit status, timed out); the status is
    None when the guest's command never began: QEMU ended first, or
    ``boot_timeout`` seconds passed (then QEMU is stopped, and timed out is False)."""
    import selectors

    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    chunks = []
    started = time.monotonic()
    deadline = started + timeout
    began = False
    timed_out = False
    try:
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if not began and time.monotonic() - started > boot_timeout:
                break
            if not sel.select(timeout=min(left, 1.0)):
                if proc.poll() is not None:
                    break
                continue
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                break
            chunks.append(data)
            began = began or BEGIN.encode() in b"".join(chunks[-2:])
            if echo:
                sys.stdout.write(data.decode("utf-8", "replace"))
                sys.stdout.flush()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    if not began and BEGIN not in text:
        return text, None, timed_out
    return text, proc.returncode, timed_out


def guest_output(console: str) -> str:
    """The part of the console between the markers (the command's output)."""
    start = console.find(BEGIN)
    if start < 0:
        return ""
    body = console[start + len(BEGIN) :]
    m = END_RE.search(body)
    return body[: m.start()] if m else body


def check_results(console: str) -> list:
    """The per-check JSON records guest_runner.py printed (lines 'VMCHECK {...}')."""
    out = []
    for line in guest_output(console).splitlines():
        line = line.strip()
        if line.startswith("VMCHECK "):
            try:
                out.append(json.loads(line[len("VMCHECK ") :]))
            except ValueError:
                out.append({"name": "?", "status": "fail", "detail": f"bad record {line!r}"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Boot a NUMA guest under QEMU and run a command.")
    ap.add_argument(
        "arch",
        nargs="?",
        choices=sorted(SUPPORTED),
        help="guest image: an architecture (Debian 12, Linux 6.1) or x86_64-6.12",
    )
    ap.add_argument("topology", nargs="?", choices=sorted(TOPOLOGIES))
    ap.add_argument("command", nargs="*", help="shell command (default: the kernel checks)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--list", action="store_true", help="list topologies and QEMU arguments")
    args = ap.parse_args(argv)
    if args.list or not args.arch:
        for name, topo in TOPOLOGIES.items():
            archs = ",".join(a for a in SUPPORTED if name in SUPPORTED[a])
            print(f"{name:16} [{archs}]  {shlex.join(qemu_topology_args(topo))}")
        return 0
    topology = args.topology or ("no-numa" if args.arch == "s390x" else "two-node")
    command = " ".join(args.command) if args.command else DEFAULT_COMMAND
    t0 = time.monotonic()
    ok, console = run_guest(args.arch, topology, command=command, timeout=args.timeout, echo=True)
    print(
        f"\n[vm/run] {args.arch} {topology}: {'ok' if ok else 'FAILED'} "
        f"in {time.monotonic() - t0:.1f}s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
