#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Regenerate the ``fake_sysfs/qemu-*`` fixtures from real kernels booted under QEMU.

For each fixture: boot the guest with vm/run.py, run tools/gather.py inside
(shipped in the per-run archive; the guest has python3.11-minimal + stdlib
only), bring the gathered folder back over the console as a gzip'd tar in
base64 between markers, and write the archive ``fake_sysfs/<name>.txt`` holding

- ``root/``         the gathered files, unedited;
- ``SOURCE.md``     gather.py's own notes, plus the kernel package, the QEMU
                    command and topology, the date, what the tree shows and how
                    to regenerate;
- ``expected.json`` an oracle built WITHOUT numa_utils: nodes, their CPUs,
                    distances, which nodes have CPUs/memory and the online CPUs
                    come from what QEMU was told (vm/run.py TOPOLOGIES); memory
                    sizes (the kernel reserves some), hugepages, CPU topology,
                    caches, PCI, cpuset, THP and numa_balancing from the
                    gathered files, parsed here independently.

Then ``numa_utils.read_topology`` is run over the new tree and compared with
the oracle; every disagreement is printed and the exit status is 1. The oracle
is written as it is, never adjusted to what numa_utils says.

    python3 vm/gather_fixtures.py                      # every fixture below
    python3 vm/gather_fixtures.py qemu-x86_64-two-node # just these
    python3 vm/gather_fixtures.py --check              # no boot: rebuild the oracle from
                                                       # the saved trees and compare
    python3 vm/gather_fixtures.py --list
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import shlex
import sys
import tarfile
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import build  # noqa: E402
import run as vmrun  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "tools"))
import gather  # noqa: E402  (pack_text: the fixtures' text archive format)

FIXTURES_DIR = os.path.join(REPO, "fake_sysfs")

# fixture name -> (guest architecture, vm/run.py topology). The first four names
# predate this script and are kept as they are.
FIXTURES: Dict[str, Tuple[str, str]] = {
    "qemu-x86_64-two-node": ("x86_64", "two-node"),
    "qemu-x86_64-four-node-asym": ("x86_64", "four-node-asym"),
    "qemu-x86_64-memory-only": ("x86_64", "memory-only"),
    "qemu-aarch64-four-node": ("aarch64", "four-node-asym"),
    "qemu-ppc64le-memory-only": ("ppc64le", "memory-only"),
    "qemu-s390x-no-numa": ("s390x", "no-numa"),
    # Linux 6.12 (Debian 13 image) with ACPI HMAT: memory tiers, access0/access1,
    # weighted-interleave weights (issue 11).
    "qemu-x86_64-hmat-tiers": ("x86_64-6.12", "hmat-tiers"),
    # QEMU 10 guests of issue 22 (vm/build.py qemu10): PCI devices on node 1 and a
    # generic-initiator node; two packages x two nodes; a CXL Type-3 expander.
    # Each also keeps guest_oracle.json (vm/guest_oracle.py, run in the guest).
    "qemu-x86_64-pci-devices": ("x86_64-6.12", "pci-devices"),
    "qemu-x86_64-snc-2x2": ("x86_64-6.12", "snc-2x2"),
    "cxl-qemu-6.12": ("x86_64-6.12", "cxl"),
}

# Node memory as the kernel reports it must be at most what QEMU gave the node
# and at least this fraction of it (the rest is kernel reservations).
MEM_LOW_FRACTION = 0.75

TAR_BEGIN_RE = re.compile(r"@@FIXTURE TAR BEGIN bytes=(\d+) crc32=([0-9a-f]{8})@@")
TAR_END = "@@FIXTURE TAR END@@"

# Runs in the guest after gather.py: the folder as tar.gz, base64, between markers.
PACK_PY = r"""
import base64, io, sys, tarfile, zlib
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as tar:
    tar.add(sys.argv[1], arcname="fixture")
data = buf.getvalue()
out = ["@@FIXTURE TAR BEGIN bytes=%d crc32=%08x@@" % (len(data), zlib.crc32(data) & 0xffffffff)]
b = base64.b64encode(data).decode("ascii")
out += [b[i:i + 76] for i in range(0, len(b), 76)]
out.append("@@FIXTURE TAR END@@")
sys.stdout.write("\n".join(out) + "\n")
sys.stdout.flush()
"""

GUEST_COMMAND = (
    "python3 /vmtest/gather.py /tmp/fixture >/dev/null "
    "&& python3 /vmtest/guest_oracle.py > /tmp/fixture/guest_oracle.json "
    "&& python3 /vmtest/pack_fixture.py /tmp/fixture"
)


# ---------------------------------------------------------------- in the guest


def gather_in_guest(
    arch: str, topology: str, timeout: float = 300, tries: int = 2
) -> Tuple[bytes, str]:
    """Boot, gather, return (tar.gz bytes, console). Retries once on a garbled transfer."""
    files = {
        "/vmtest/gather.py": os.path.join(REPO, "tools", "gather.py"),
        "/vmtest/guest_oracle.py": os.path.join(HERE, "guest_oracle.py"),
        "/vmtest/pack_fixture.py": PACK_PY.encode(),
    }
    last = ""
    for _ in range(tries):
        ok, console = vmrun.run_guest(arch, topology, files, GUEST_COMMAND, timeout)
        last = console
        if not ok:
            continue
        try:
            return decode_tar(vmrun.guest_output(console)), console
        except ValueError as exc:
            last = f"{console}\n[gather_fixtures] {exc}"
    raise RuntimeError(f"{arch} {topology}: no fixture came back; console tail:\n{last[-3000:]}")


def decode_tar(text: str) -> bytes:
    m = TAR_BEGIN_RE.search(text)
    if not m:
        raise ValueError("no FIXTURE TAR BEGIN marker")
    end = text.find(TAR_END, m.end())
    if end < 0:
        raise ValueError("no FIXTURE TAR END marker")
    lines = [ln.strip() for ln in text[m.end() : end].splitlines()]
    data = base64.b64decode("".join(ln for ln in lines if ln), validate=True)
    if len(data) != int(m.group(1)) or f"{zlib.crc32(data) & 0xFFFFFFFF:08x}" != m.group(2):
        raise ValueError("archive garbled on the console (length or crc32 differs)")
    return data


def extract(data: bytes, dest: str) -> None:
    """Unpack the guest's archive (its 'fixture/' folder) into dest; plain files only."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            name = member.name
            parts = name.split("/")
            if name.startswith("/") or ".." in parts or parts[0] != "fixture":
                raise ValueError(f"unexpected archive member {name!r}")
            rel = os.path.join(*parts[1:]) if len(parts) > 1 else ""
            target = os.path.join(dest, rel)
            if member.isdir():
                os.makedirs(target, exist_ok=True)
            elif member.issym():
                # gather.py saves an HMAT initiator (accessN/initiators/nodeM) as a
                # relative link to the node's folder; nothing may point outside.
                inside = os.path.normpath(os.path.join(os.path.dirname(rel), member.linkname))
                if os.path.isabs(member.linkname) or inside.split(os.sep)[0] in ("..", ""):
                    raise ValueError(
                        f"archive link {name!r} -> {member.linkname!r} leaves the fixture"
                    )
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(member.linkname, target)
            elif member.isfile():
                os.makedirs(os.path.dirname(target), exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                with open(target, "wb") as fh:
                    fh.write(src.read())
            else:
                raise ValueError(f"archive member {name!r} is not a plain file")


def unpack_text(path: str, dest: str) -> None:
    """A fixture's text archive as a folder (the oracle reads files by path)."""
    sys.path.insert(0, REPO)
    import numa_utils_sim as nusim

    a = nusim.SavedArchive(path)
    for rel in a.dirs:
        os.makedirs(os.path.join(dest, rel), exist_ok=True)
    for rel, data in a.files.items():
        with open(os.path.join(dest, rel), "wb") as fh:
            fh.write(data)
    for rel, target in a.links.items():
        os.symlink(target, os.path.join(dest, rel))


# ---------------------------------------------------------------- the oracle
#
# Parsers written here on purpose, independently of numa_utils.


def _read(root: str, rel: str) -> Optional[str]:
    try:
        with open(os.path.join(root, rel), "rb") as fh:
            return fh.read().decode("utf-8", "replace").replace("\0", "").strip()
    except OSError:
        return None


def _list(text: Optional[str]) -> List[int]:
    out: List[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


def _int(text: Optional[str]) -> Optional[int]:
    return int(text) if text is not None and re.fullmatch(r"-?\d+", text) else None


def _meminfo_kb(text: Optional[str], key: str) -> int:
    # "Node 0 MemTotal:  514636 kB" (node meminfo) or "MemTotal:  514636 kB".
    m = re.search(r"(?:^|\n)(?:Node \d+ )?" + re.escape(key) + r":\s+(\d+) kB", text or "")
    if m is None:
        raise ValueError(f"no {key} in meminfo")
    return int(m.group(1))


def _hugepages(root: str, rel: str) -> dict:
    out = {}
    base = os.path.join(root, rel)
    if not os.path.isdir(base):
        return out
    for name in os.listdir(base):
        m = re.fullmatch(r"hugepages-(\d+)kB", name)
        if m:
            out[m.group(1)] = {
                "total": _int(_read(root, f"{rel}/{name}/nr_hugepages")),
                "free": _int(_read(root, f"{rel}/{name}/free_hugepages")),
                "surplus": _int(_read(root, f"{rel}/{name}/surplus_hugepages")),
            }
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def _status(root: str, key: str) -> Optional[List[int]]:
    text = _read(root, "proc/self/status")
    m = re.search(r"(?:^|\n)" + re.escape(key) + r":\s*(\S*)", text or "")
    return _list(m.group(1)) if m else None


GPU_VENDORS = {0x10DE: "nvidia", 0x1002: "amd", 0x8086: "intel"}


def _gpus(root: str) -> list:
    rel = "sys/bus/pci/devices"
    base = os.path.join(root, rel)
    out = []
    for addr in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        vendor = int(_read(root, f"{rel}/{addr}/vendor") or "0", 16)
        cls = int(_read(root, f"{rel}/{addr}/class") or "0", 16)
        if vendor not in GPU_VENDORS or (cls >> 16) not in (0x03, 0x12):
            continue
        local = _read(root, f"{rel}/{addr}/local_cpulist")
        if local is None:
            mask = int((_read(root, f"{rel}/{addr}/local_cpus") or "0").replace(",", ""), 16)
            cpus = [i for i in range(mask.bit_length()) if mask >> i & 1]
        else:
            cpus = _list(local)
        out.append(
            {
                "address": addr,
                "vendor": f"0x{vendor:04x}",
                "vendor_name": GPU_VENDORS[vendor],
                "device": f"0x{int(_read(root, f'{rel}/{addr}/device') or '0', 16):04x}",
                "class": f"0x{cls:06x}",
                "numa_node": _int(_read(root, f"{rel}/{addr}/numa_node")),
                "local_cpus": cpus,
            }
        )
    return out


def _llc(root: str, cpu: int) -> List[int]:
    rel = f"sys/devices/system/cpu/cpu{cpu}/cache"
    base = os.path.join(root, rel)
    best: Tuple[int, List[int]] = (-1, [])
    if not os.path.isdir(base):
        return []
    for name in sorted(os.listdir(base), key=lambda n: int(n[5:]) if n[5:].isdigit() else 0):
        if not re.fullmatch(r"index\d+", name):
            continue
        level = _int(_read(root, f"{rel}/{name}/level"))
        if level is not None and level > best[0]:
            best = (level, _list(_read(root, f"{rel}/{name}/shared_cpu_list")))
    return best[1]


def oracle(arch: str, topology: str, root: str) -> Tuple[dict, List[str]]:
    """expected.json for a tree gathered from this guest, and the sanity
    findings (where the tree and what QEMU was told disagree)."""
    topo = vmrun.TOPOLOGIES[topology]
    notes: List[str] = []
    qnodes = {int(k): v for k, v in topo["nodes"].items()}
    ids = sorted(qnodes)
    online_cpus = list(range(topo["cpus"]))
    node_of = {c: n for n, v in qnodes.items() for c in v["cpus"]}

    nodes = []
    for n in ids:
        if topo["numa"]:
            info = _read(root, f"sys/devices/system/node/node{n}/meminfo")
            dist = {
                str(m): topo["distances"][i][j] for j, m in enumerate(ids) for i in [ids.index(n)]
            }
            hp = _hugepages(root, f"sys/devices/system/node/node{n}/hugepages")
        else:
            info = _read(root, "proc/meminfo")
            dist = {str(n): 10}
            hp = _hugepages(root, "sys/kernel/mm/hugepages")
        total, free = _meminfo_kb(info, "MemTotal"), _meminfo_kb(info, "MemFree")
        want = qnodes[n]["mem_mb"] * 1024
        if not (MEM_LOW_FRACTION * want <= total <= want):
            notes.append(f"node {n}: MemTotal {total} kB, QEMU gave {want} kB")
        nodes.append(
            {
                "id": n,
                "cpus": sorted(qnodes[n]["cpus"]),
                "mem_total_kb": total,
                "mem_free_kb": free,
                "distances": dist,
                "hugepages": hp,
            }
        )

    cpu_dir = "sys/devices/system/cpu"
    possible = _list(_read(root, f"{cpu_dir}/possible"))
    if possible != online_cpus:
        notes.append(f"cpu/possible {possible} but QEMU -smp {topo['cpus']}")
    online_file = _list(_read(root, f"{cpu_dir}/online"))
    if online_file != online_cpus:
        notes.append(f"cpu/online {online_file} but QEMU -smp {topo['cpus']}")
    cpus = {}
    for c in possible or online_cpus:
        on = c in online_cpus
        tdir = f"{cpu_dir}/cpu{c}/topology"
        cpus[str(c)] = {
            "node": node_of.get(c) if on else None,
            "online": on,
            "core": _int(_read(root, f"{tdir}/core_id")) if on else None,
            "package": _int(_read(root, f"{tdir}/physical_package_id")) if on else None,
            "siblings": _list(_read(root, f"{tdir}/thread_siblings_list")) if on else [],
            "llc": _llc(root, c) if on else [],
        }

    with_cpus = [n for n in ids if qnodes[n]["cpus"]]
    with_mem = [n for n in ids if qnodes[n]["mem_mb"]]
    if topo["numa"]:
        possible_nodes = _list(_read(root, "sys/devices/system/node/possible")) or ids
        if possible_nodes != ids:
            notes.append(f"node/possible {possible_nodes}, QEMU defined {ids}")
        for rel, want in (("online", ids), ("has_cpu", with_cpus), ("has_memory", with_mem)):
            got = _list(_read(root, f"sys/devices/system/node/{rel}"))
            if got != want:
                notes.append(f"node/{rel} is {got}, QEMU definition says {want}")
    else:
        possible_nodes = [0]
        if os.path.isdir(os.path.join(root, "sys/devices/system/node")):
            notes.append("QEMU had no -numa but the tree has sys/devices/system/node")
    allowed_cpus = _status(root, "Cpus_allowed_list")
    allowed_mems = _status(root, "Mems_allowed_list")
    tiers, access, weights = _tier_oracle(topo, root, ids, notes)
    nb = _read(root, "proc/sys/kernel/numa_balancing")
    thp = re.search(r"\[(\w+)\]", _read(root, "sys/kernel/mm/transparent_hugepage/enabled") or "")
    exp = {
        "nodes": nodes,
        "online_nodes": ids,
        "possible_nodes": possible_nodes,
        "nodes_with_cpus": with_cpus,
        "nodes_with_memory": with_mem,
        "cpus": cpus,
        "online_cpus": online_cpus,
        "allowed_cpus": allowed_cpus if allowed_cpus is not None else online_cpus,
        "allowed_mems": allowed_mems if allowed_mems is not None else with_mem,
        "gpus": _gpus(root),
        "numa_balancing": _int(nb),
        "thp": thp.group(1) if thp else None,
    }
    if TIER_KEYS:
        normal_text = _read(root, "sys/devices/system/node/has_normal_memory")
        normal = _list(normal_text) if normal_text is not None else None
        for node in nodes:
            n = node["id"]
            node["tier"] = next((t for t, v in tiers.items() if n in v), None)
            node["access"] = access.get(str(n))
            node["has_normal_memory"] = None if normal is None else n in normal
            # What the memory is, from the QEMU definition (no GPUs in these guests).
            if n not in with_mem:
                kind = ("no-memory", "not in has_memory")
            elif normal is not None and n not in normal:
                kind = (
                    "movable-only",
                    "memory only in ZONE_MOVABLE (not in "
                    "has_normal_memory)" + ("" if node["cpus"] else "; no CPUs"),
                )
            elif node["cpus"]:
                kind = ("dram", f"CPUs {_ranges(node['cpus'])} and normal memory")
            else:
                kind = ("cpu-less", "memory but no CPUs")
            if n in (topo.get("generic_initiators") or []):
                # A device's node (QEMU acpi-generic-initiator); vm/run.py ties it to
                # a device behind the expander, whose numa_node stays the expander's.
                kind = (
                    "generic-initiator",
                    "in has_generic_initiator"
                    + ("" if node["cpus"] or n in with_mem else "; no CPUs, no memory")
                    + "; standing for a device no PCI numa_node names",
                )
            node["kind"], node["kind_evidence"] = kind
        exp["memory_tiers"] = {str(t): v for t, v in sorted(tiers.items())}
        exp["interleave_weights"] = weights
        auto = _read(root, "sys/kernel/mm/mempolicy/weighted_interleave/auto")
        exp["interleave_auto"] = None if auto is None else auto in ("true", "1", "Y")
    package_facts(exp)
    return exp, notes


def package_facts(exp: dict) -> None:
    """nodes_per_package (nodes with CPUs per package; None when packages differ)
    and, with several, each DRAM node's package in its kind evidence, from the
    expectation's own CPUs."""
    per: Dict[int, set] = {}
    for c in exp["cpus"].values():
        if c["online"] and c["package"] is not None and c["node"] is not None:
            per.setdefault(c["package"], set()).add(c["node"])
    counts = {len(v) for v in per.values()}
    k = exp["nodes_per_package"] = counts.pop() if len(counts) == 1 else None
    for node in exp["nodes"]:
        pk = [p for p, ns in per.items() if node["id"] in ns]
        if k and k > 1 and pk and node.get("kind") == "dram":
            node["kind_evidence"] += f"; package {pk[0]}, one of {k} nodes (SNC{k}/NPS{k})"


def _ranges(ids: List[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the kernel's cpulist format)."""
    out: List[str] = []
    for i in sorted(ids):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        elif out and "-" not in out[-1] and int(out[-1]) == i - 1:
            out[-1] = f"{out[-1]}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


# expected.json carries the tier keys (per node "tier" and "access", top-level
# "memory_tiers" and "interleave_weights") only once numa_utils' topology JSON has
# them (issue 11 lands separately; tests/test_topology.py compares the whole dict).
TIER_KEYS = False


def _tier_keys_known() -> bool:
    sys.path.insert(0, REPO)
    import numa_utils as nu
    import numa_utils_sim as nusim

    tree = nusim.open_tree(os.path.join(FIXTURES_DIR, "no-node-dir.txt"))
    return "memory_tiers" in nu.to_json(nu.read_topology(backend=nu.LinuxBackend(tree)))


def _tier_oracle(topo: dict, root: str, ids: List[int], notes: List[str]):
    """Memory tiers, HMAT access class 0 and interleave weights. What the kernel had to
    do comes from the QEMU definition (tier grouping fastest first, access figures);
    the tier ids, which the kernel computes, and the weights from the tree."""
    tiers: Dict[int, List[int]] = {}
    tdir = os.path.join(root, "sys/devices/virtual/memory_tiering")
    for name in sorted(os.listdir(tdir)) if os.path.isdir(tdir) else []:
        m = re.fullmatch(r"memory_tier(\d+)", name)
        if m:
            tiers[int(m.group(1))] = _list(
                _read(root, f"sys/devices/virtual/memory_tiering/{name}/nodelist")
            )
    if topo.get("tiers") is not None and tiers:
        got = [tiers[t] for t in sorted(tiers)]
        if got != topo["tiers"]:
            notes.append(f"memory tiers {tiers}, QEMU definition says {topo['tiers']}")
    access = {str(n): v for n, v in (topo.get("access") or {}).items()}
    for n in ids:
        present = os.path.isdir(
            os.path.join(root, f"sys/devices/system/node/node{n}/access0/initiators")
        )
        if present != (str(n) in access):
            notes.append(
                f"node{n}/access0 {'present' if present else 'absent'}, "
                f"QEMU definition {'has' if str(n) in access else 'has no'} HMAT"
            )
    wdir = os.path.join(root, "sys/kernel/mm/mempolicy/weighted_interleave")
    weights = None
    if os.path.isdir(wdir):
        weights = {}
        for name in sorted(os.listdir(wdir), key=lambda x: int(x[4:]) if x[4:].isdigit() else 0):
            if re.fullmatch(r"node\d+", name):
                weights[name[4:]] = _int(
                    _read(root, f"sys/kernel/mm/mempolicy/weighted_interleave/{name}")
                )
    return tiers, access, weights


# Keys of vm/run.py TOPOLOGIES that fix what the guest oracle must show.
GUEST_ORACLE_KEYS = ("pci", "packages", "generic_initiators")


def guest_oracle_notes(topology: str, go: dict) -> List[str]:
    """Where guest_oracle.json (the guest's sysfs, read in the guest without
    numa_utils) and the QEMU definition disagree."""
    topo = vmrun.TOPOLOGIES[topology]
    notes = []
    for addr, want in (topo.get("pci") or {}).items():
        got = go["pci"].get(addr)
        if got is None:
            notes.append(f"guest oracle: no PCI function {addr}")
            continue
        flat = dict(got, names=sorted(n for ns in got["names"].values() for n in ns))
        for k, v in want.items():
            if flat.get(k) != v:
                notes.append(f"guest oracle: {addr} {k} {flat.get(k)!r}, QEMU definition {v!r}")
    if topo.get("packages") is not None:
        got = [go["cpus"][str(c)]["package"] for c in range(topo["cpus"])]
        if got != topo["packages"]:
            notes.append(f"guest oracle: packages {got}, QEMU definition {topo['packages']}")
    gi = topo.get("generic_initiators") or []
    if (go.get("has_generic_initiator") or []) != gi:
        notes.append(
            f"guest oracle: has_generic_initiator {go.get('has_generic_initiator')}, "
            f"QEMU definition {gi}"
        )
    for n, node in topo["nodes"].items():
        got = go["nodes"].get(n)
        if (
            got is None
            or got["cpus"] != node["cpus"]
            or got["distances"] != topo["distances"][int(n)]
        ):
            notes.append(f"guest oracle: node {n} {got}, QEMU definition {node}")
    return notes


def diff(want, got, path="") -> List[str]:
    """Every place where two JSON values differ, as 'path: want != got'."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got), key=str):
            if k not in got:
                out.append(f"{path}/{k}: missing in read_topology (oracle {want[k]!r})")
            elif k not in want:
                out.append(f"{path}/{k}: only in read_topology ({got[k]!r})")
            else:
                out += diff(want[k], got[k], f"{path}/{k}")
        return out
    if (
        isinstance(want, list)
        and isinstance(got, list)
        and len(want) == len(got)
        and all(isinstance(x, dict) for x in want + got)
    ):
        return [d for i, (a, b) in enumerate(zip(want, got)) for d in diff(a, b, f"{path}[{i}]")]
    return [] if want == got else [f"{path}: oracle {want!r} != read_topology {got!r}"]


def compare_with_numa_utils(root: str, exp: dict) -> List[str]:
    sys.path.insert(0, REPO)
    import numa_utils as nu
    import numa_utils_sim as nusim

    got = nu.to_json(nu.read_topology(backend=nu.LinuxBackend(nusim.open_tree(root))))
    problems = got.pop("problems", [])
    out = [f"read_topology problem: {p}" for p in problems]
    return out + diff(exp, got)


# ---------------------------------------------------------------- SOURCE.md


def _qemu_command_text(arch: str, topology: str) -> str:
    cmd = vmrun.qemu_command(arch, topology, "INITRD")
    kernel, _ = vmrun.images(arch)
    mods = " + modules.cpio.gz" if vmrun.TOPOLOGIES[topology].get("modules") else ""
    cmd = [
        f"vm/.cache/{arch}/vmlinuz"
        if a == kernel
        else "vm/.cache/qemu10/qemu-system-x86_64"
        if a == build.qemu10_binary()
        else f"<base.cpio.gz{mods} + per-run archive>"
        if a == "INITRD"
        else a
        for a in cmd
    ]
    return shlex.join(cmd)


def _observations(arch: str, topology: str, root: str, exp: dict) -> List[str]:
    """What the gathered tree shows, computed from the files (never typed in)."""
    topo = vmrun.TOPOLOGIES[topology]
    out = []
    node_dir = os.path.join(root, "sys/devices/system/node")
    if not os.path.isdir(node_dir):
        out.append(
            "no `sys/devices/system/node` (kernel without NUMA): read_topology must "
            "report one node 0 with every online CPU and the memory of proc/meminfo"
        )
    for n in exp["nodes"]:
        want = topo["nodes"][str(n["id"])]["mem_mb"] * 1024
        line = f"node {n['id']}: MemTotal {n['mem_total_kb']} kB of the {want} kB QEMU gave"
        if want:
            line += f" ({100 * n['mem_total_kb'] / want:.1f}%)"
        if not n["cpus"] and os.path.isdir(node_dir):
            cl = _read(root, f"sys/devices/system/node/node{n['id']}/cpulist")
            cm = _read(root, f"sys/devices/system/node/node{n['id']}/cpumap")
            line += f"; no CPU: cpulist {cl!r}, cpumap {cm!r}"
        out.append(line)
    if os.path.isdir(node_dir):
        rows = []
        for n in exp["nodes"]:
            rows.append(_read(root, f"sys/devices/system/node/node{n['id']}/distance"))
        out.append("node distance files, in node order: " + "; ".join(f"`{r}`" for r in rows))
    sizes = sorted({int(s) for n in exp["nodes"] for s in n["hugepages"]})
    out.append("hugepage sizes: " + (", ".join(f"{s} kB" for s in sizes) or "none"))
    levels = set()
    for c in exp["cpus"]:
        base = os.path.join(root, f"sys/devices/system/cpu/cpu{c}/cache")
        for idx in os.listdir(base) if os.path.isdir(base) else []:
            levels.add(
                (
                    _read(root, f"sys/devices/system/cpu/cpu{c}/cache/{idx}/level"),
                    _read(root, f"sys/devices/system/cpu/cpu{c}/cache/{idx}/type"),
                )
            )
    out.append(
        "cache leaves: "
        + (", ".join(f"L{lv} {t}" for lv, t in sorted(levels, key=str)) or "none (llc is [])")
    )
    out.append("llc per CPU: " + ", ".join(f"{c}: {v['llc']}" for c, v in exp["cpus"].items()))
    has_online = [
        c
        for c in exp["cpus"]
        if os.path.exists(os.path.join(root, f"sys/devices/system/cpu/cpu{c}/online"))
    ]
    out.append(f"CPUs with an `online` file: {has_online or 'none'}")
    out.append("packages: " + ", ".join(f"{c}: {v['package']}" for c, v in exp["cpus"].items()))
    pci = os.path.join(root, "sys/bus/pci/devices")
    devs = []
    for addr in sorted(os.listdir(pci)) if os.path.isdir(pci) else []:
        r = f"sys/bus/pci/devices/{addr}"
        devs.append(
            f"{addr} {_read(root, r + '/vendor')}:{_read(root, r + '/device')} "
            f"class {_read(root, r + '/class')} numa_node {_read(root, r + '/numa_node')}"
        )
    out.append("PCI: " + ("; ".join(devs) if devs else "none") + f"; GPUs: {len(exp['gpus'])}")
    tiers, _, weights = _tier_oracle(topo, root, [n["id"] for n in exp["nodes"]], [])
    acc = {
        n["id"]: _read(
            root, f"sys/devices/system/node/node{n['id']}/access0/initiators/read_bandwidth"
        )
        for n in exp["nodes"]
    }
    out.append(
        f"memory tiers (tier id: nodes): {tiers or 'none'}; access0 read_bandwidth "
        f"(MB/s) per node: {acc}; weighted_interleave weights: {weights}"
    )
    out.append(
        f"numa_balancing {exp['numa_balancing']} (the guest's /init writes 0 when "
        f"the file exists), thp {exp['thp']}"
    )
    return out


def source_md(
    name: str,
    arch: str,
    topology: str,
    gathered_md: str,
    root: str,
    exp: dict,
    notes: List[str],
    disagreements: List[str],
    *,
    guest_oracle: bool = False,
) -> str:
    manifest = {}
    mpath = os.path.join(build.cache_dir(), arch, "manifest.json")
    if os.path.exists(mpath):
        with open(mpath) as fh:
            manifest = json.load(fh)
    pkg = manifest.get("kernel_package", "?")
    version = manifest.get("packages", {}).get(pkg, "?")
    topo = vmrun.TOPOLOGIES[topology]
    suite = build.IMAGES[arch]["suite"]
    debian, py = {"bookworm": 12, "trixie": 13}.get(suite, suite), build.SUITES[suite]
    desc = []
    for nid, node in topo["nodes"].items():
        desc.append(f"node {nid}: CPUs {node['cpus'] or 'none'}, {node['mem_mb']} MiB")
    lines = [
        gathered_md.rstrip(),
        "",
        "## How this fixture was made",
        "",
        f"Written by `python3 vm/gather_fixtures.py {name}` on "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: a real Debian "
        f"{debian} kernel, package `{pkg}` version `{version}` (Debian's apt "
        "repositories, cached by `vm/build.py`), booted under QEMU TCG by `vm/run.py` "
        f"(image `{arch}`, topology `{topology}`), with python{py}-minimal + stdlib "
        "only, running `python3 tools/gather.py`; the folder came back over the "
        "console as a tar.gz in base64. Files under `root/` are unedited.",
        "",
        "Topology QEMU was given (`vm/run.py` TOPOLOGIES): "
        + "; ".join(desc)
        + ("; no `-numa` options" if not topo["numa"] else f"; distances {topo['distances']}"),
        "",
        "QEMU command:",
        "",
        "    " + _qemu_command_text(arch, topology),
        "",
    ]
    if topo.get("modules") or topo.get("setup"):
        lines += [
            "Before gathering, the guest's /init loaded these modules of the same "
            "kernel package (`vm/build.py` GUEST_MODULES, decompressed), in order: "
            + ", ".join(f"`{m}`" for m in topo.get("modules", ()))
            + "; then ran "
            "(`vm/run.py`):",
            "",
        ]
        lines += ["    " + ln for ln in topo.get("setup", "").strip().splitlines()] + [""]
    lines += [
        "## expected.json",
        "",
        "Built by `vm/gather_fixtures.py` without numa_utils: nodes, their CPUs, "
        "distances, nodes with CPUs / memory and the online CPUs from the QEMU "
        "topology above; MemTotal/MemFree (the kernel reserves part of what QEMU "
        "gives), hugepages, possible nodes and CPUs, core/package/siblings/llc, PCI, "
        "Cpus/Mems_allowed_list, numa_balancing and THP from the gathered files, "
        "parsed by the script's own code. Then compared with "
        "`numa_utils.read_topology` over `root/`.",
        "",
    ]
    if guest_oracle and any(topo.get(k) is not None for k in GUEST_ORACLE_KEYS):
        lines += [
            "## guest_oracle.json",
            "",
            "Printed in the guest by `vm/guest_oracle.py` (the standard library "
            "reading the live sysfs, never numa_utils): every PCI function's address, "
            "class, vendor, device, numa_node, local_cpulist, driver, kernel names "
            "(/sys/class/net, nvme, infiniband), host bridge and path from its root "
            "port; the node masks (has_cpu, has_memory, has_normal_memory, "
            "has_generic_initiator), each node's CPUs, MemTotal and distances, the "
            "memory tiers, each CPU's physical_package_id and core_id. What `root/` "
            "does not keep (drivers, class names, the PCI paths) is only here. "
            "Compared with the QEMU definition under 'Tree vs QEMU definition'.",
            "",
        ]
    lines += ["## What this kernel shows", ""]
    lines += [f"- {o}" for o in _observations(arch, topology, root, exp)]
    lines += ["", "## Tree vs QEMU definition", ""]
    lines += [f"- {n}" for n in notes] or ["- no differences"]
    lines += ["", "## Oracle vs numa_utils.read_topology (when generated)", ""]
    lines += [f"- {d}" for d in disagreements] or ["- they agree"]
    lines += [
        "",
        "## Regenerate",
        "",
        "    python3 vm/build.py                           # once: kernels and root fs",
        f"    python3 vm/gather_fixtures.py {name}",
        "    python3 vm/gather_fixtures.py --check         # no boot: oracle vs trees",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- driver


def make_fixture(name: str, out_dir: str, timeout: float) -> List[str]:
    arch, topology = FIXTURES[name]
    t0 = time.monotonic()
    data, _ = gather_in_guest(arch, topology, timeout)
    final = os.path.join(out_dir, name + ".txt")
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=out_dir) as tmp:
        extract(data, tmp)
        root = os.path.join(tmp, "root")
        with open(os.path.join(tmp, "SOURCE.md")) as fh:
            gathered_md = fh.read()
        exp, notes = oracle(arch, topology, root)
        go_path = os.path.join(tmp, "guest_oracle.json")
        go = None
        if os.path.exists(go_path):
            with open(go_path) as fh:
                go = json.load(fh)
            notes += guest_oracle_notes(topology, go)
        disagreements = compare_with_numa_utils(root, exp)
        md = source_md(
            name,
            arch,
            topology,
            gathered_md,
            root,
            exp,
            notes,
            disagreements,
            guest_oracle=go is not None,
        )
        with open(os.path.join(tmp, "SOURCE.md"), "w") as fh:
            fh.write(md)
        with open(os.path.join(tmp, "expected.json"), "w") as fh:
            json.dump(exp, fh, indent=2)
            fh.write("\n")
        if go is not None and any(
            vmrun.TOPOLOGIES[topology].get(k) is not None for k in GUEST_ORACLE_KEYS
        ):
            with open(os.path.join(tmp, "guest_oracle.json"), "w") as fh:
                json.dump(go, fh, indent=1, sort_keys=True)
                fh.write("\n")
        with open(final + ".part", "wb") as fh:
            fh.write(gather.pack_text(gather.folder_files(tmp)))
        os.replace(final + ".part", final)
    print(
        f"[gather_fixtures] {name}: {arch} {topology} in {time.monotonic() - t0:.1f}s; "
        f"{len(notes)} tree-vs-QEMU notes, {len(disagreements)} disagreements",
        flush=True,
    )
    return [f"{name}: tree vs QEMU: {n}" for n in notes] + [
        f"{name}: DISAGREE {d}" for d in disagreements
    ]


def check_fixture(name: str, out_dir: str) -> List[str]:
    """No boot: the oracle from the saved tree vs expected.json and read_topology."""
    arch, topology = FIXTURES[name]
    path = os.path.join(out_dir, name + ".txt")
    if not os.path.isfile(path):
        return [f"{name}: no saved tree (run without --check)"]
    with tempfile.TemporaryDirectory(prefix=f".{name}.") as tmp:
        unpack_text(path, tmp)
        root = os.path.join(tmp, "root")
        exp, notes = oracle(arch, topology, root)
        out = [f"{name}: tree vs QEMU: {n}" for n in notes]
        with open(os.path.join(tmp, "expected.json")) as fh:
            on_disk = json.load(fh)
        on_disk.pop("problems", None)
        out += [f"{name}: expected.json differs from the oracle {d}" for d in diff(exp, on_disk)]
        out += [f"{name}: DISAGREE {d}" for d in compare_with_numa_utils(root, exp)]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Regenerate fake_sysfs/qemu-* from QEMU guests.")
    ap.add_argument("names", nargs="*", help="fixtures (default: all)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument(
        "--check",
        action="store_true",
        help="no boot: rebuild the oracle from the saved trees and compare",
    )
    ap.add_argument("--out", default=FIXTURES_DIR, help="folder of fixtures (default fake_sysfs)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="guests at a time")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per guest")
    args = ap.parse_args(argv)
    global TIER_KEYS
    TIER_KEYS = _tier_keys_known()
    if args.list:
        for name, (arch, topo) in FIXTURES.items():
            qargs = shlex.join(vmrun.qemu_topology_args(vmrun.TOPOLOGIES[topo]))
            print(f"{name:28} {arch:8} {topo:16} {qargs}")
        return 0
    names = args.names or list(FIXTURES)
    unknown = [n for n in names if n not in FIXTURES]
    if unknown:
        ap.error(f"unknown fixture(s) {unknown}; --list shows them")
    if args.check:
        findings = [f for n in names for f in check_fixture(n, args.out)]
    else:
        for name in names:
            reason = vmrun.missing_reason(FIXTURES[name][0])
            if reason:
                print(f"[gather_fixtures] cannot boot {name}: {reason}", file=sys.stderr)
                return 2
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(lambda n: make_fixture(n, args.out, args.timeout), names))
        findings = [f for r in results for f in r]
    for f in findings:
        print(f)
    bad = [f for f in findings if ": tree vs QEMU: " not in f]
    print(
        f"[gather_fixtures] {len(names)} fixture(s): {len(bad)} disagreement(s), "
        f"{len(findings) - len(bad)} tree-vs-QEMU note(s)"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
