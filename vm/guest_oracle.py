# SPDX-License-Identifier: Apache-2.0
"""Runs inside a vm/ guest: an oracle of the machine read straight from sysfs with
the standard library only (never numa_utils), printed as one JSON document.

For each PCI function: its address, class, vendor, device, numa_node,
local_cpulist, driver, kernel names (/sys/class/net, /sys/class/nvme,
/sys/class/infiniband) and the path from its host bridge down to it (the root
port first). For the machine: nodes online/possible, has_cpu, has_memory,
has_normal_memory, has_generic_initiator, each node's CPUs, MemTotal and
distances, the memory tiers, and each CPU's physical_package_id and core_id.

    python3 guest_oracle.py            # JSON on stdout

vm/gather_fixtures.py saves it as a fixture's guest_oracle.json and
tests/kernel_checks.py compares the live guest with the QEMU definition the same
way; keep it stdlib-only and Python 3.8+.
"""

import json
import os
import re
import sys

NODE = "/sys/devices/system/node"
CPU = "/sys/devices/system/cpu"
PCI = "/sys/bus/pci/devices"
CLASSES = ("net", "nvme", "infiniband")
ADDR = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def ids(text):
    """'0-2,5' -> [0, 1, 2, 5]; None or '' -> []."""
    out = []
    for part in (text or "").split(","):
        if part.strip():
            lo, _, hi = part.strip().partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def class_names():
    """{real path of a PCI function: {class: [kernel names]}}."""
    out = {}
    for cls in CLASSES:
        base = f"/sys/class/{cls}"
        for name in sorted(os.listdir(base)) if os.path.isdir(base) else ():
            dev = os.path.realpath(f"{base}/{name}/device")
            out.setdefault(dev, {}).setdefault(cls, []).append(name)
    return out


def pci_functions():
    names = class_names()
    out = {}
    for addr in sorted(os.listdir(PCI)) if os.path.isdir(PCI) else ():
        if not ADDR.match(addr):
            continue
        d = f"{PCI}/{addr}"
        real = os.path.realpath(d)
        parts = real.split("/")
        bridge = next((p for p in parts if p.startswith("pci")), None)
        path = [p for p in parts if ADDR.match(p)]
        drv = os.path.realpath(f"{d}/driver") if os.path.exists(f"{d}/driver") else None
        node = read(f"{d}/numa_node")
        out[addr] = {
            "class": read(f"{d}/class"),
            "vendor": read(f"{d}/vendor"),
            "device": read(f"{d}/device"),
            "numa_node": int(node) if node is not None else None,
            "local_cpulist": ids(read(f"{d}/local_cpulist")),
            "driver": os.path.basename(drv) if drv else None,
            "names": names.get(real, {}),
            "host_bridge": bridge,
            "path": path,
            "root_port": path[0] if len(path) > 1 else None,
        }
    return out


def nodes():
    out = {}
    for key in (
        "online",
        "possible",
        "has_cpu",
        "has_memory",
        "has_normal_memory",
        "has_generic_initiator",
    ):
        text = read(f"{NODE}/{key}")
        out[key] = None if text is None else ids(text)
    per = {}
    for n in out["online"] or ():
        mem = re.search(r"MemTotal:\s+(\d+) kB", read(f"{NODE}/node{n}/meminfo") or "")
        per[str(n)] = {
            "cpus": ids(read(f"{NODE}/node{n}/cpulist")),
            "mem_total_kb": int(mem.group(1)) if mem else None,
            "distances": [int(x) for x in (read(f"{NODE}/node{n}/distance") or "").split()],
        }
    out["nodes"] = per
    tiers = {}
    tdir = "/sys/devices/virtual/memory_tiering"
    for name in os.listdir(tdir) if os.path.isdir(tdir) else ():
        m = re.fullmatch(r"memory_tier(\d+)", name)
        if m:
            tiers[m.group(1)] = ids(read(f"{tdir}/{name}/nodelist"))
    out["memory_tiers"] = dict(sorted(tiers.items(), key=lambda kv: int(kv[0])))
    return out


def cpus():
    out = {}
    for c in ids(read(f"{CPU}/online")):
        t = f"{CPU}/cpu{c}/topology"
        out[str(c)] = {
            "package": int(read(f"{t}/physical_package_id")),
            "core": int(read(f"{t}/core_id")),
        }
    return out


def oracle():
    return {"kernel": os.uname().release, **nodes(), "cpus": cpus(), "pci": pci_functions()}


if __name__ == "__main__":
    json.dump(oracle(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
