"""Large fake sysfs/procfs trees for the topology benchmark.

Machine shapes are built with the description helpers of tools/make_fixtures.py (the
same kernel text formats the test fixtures use), then written with its tree writer.
Two additions make the trees complete for hwloc too, so lstopo does its full work:
the mask twins of the list files (thread_siblings, core_cpus, core_siblings,
package_cpus, cache shared_cpu_map) and cache sizes.

    python -m bench.gen_topology DIR [CPUS [NODES [GPUS]]]
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Dict, List

from . import common


def fixtures_module() -> Any:
    path = os.path.join(common.ROOT, "tools", "make_fixtures.py")
    if not os.path.exists(path):
        raise common.Skip("tools/make_fixtures.py is missing in this checkout")
    name = "_bench_make_fixtures"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


def describe(mf: Any, cpus: int, nodes: int, gpus: int) -> Dict[str, Any]:
    """An x86 box: sockets of 64 (or 128) cores x 2 threads, sub-NUMA clustering to
    ``nodes`` nodes, ``gpus`` NVIDIA GPUs spread over the nodes."""
    threads = 2
    cores_total = cpus // threads
    sockets = max(1, min(nodes, cores_total // 64 if cores_total >= 64 else 1))
    while nodes % sockets:
        sockets -= 1
    cores = cores_total // sockets
    per_socket = nodes // sockets
    assert sockets * cores * threads == cpus, (sockets, cores, threads, cpus)
    # One L3 per 16 cores whatever the size, so every CPU carries the same amount of
    # sysfs text at every size and the per-CPU cost comparison is like for like.
    topo = mf.x86_smp(sockets, cores, threads, llc_per_socket=max(1, cores // 16))
    cores_per_node = cores // per_socket
    hp = {2048: (0, 0, 0), 1048576: (0, 0, 0)}
    node_cpus: Dict[int, List[int]] = {n: [] for n in range(nodes)}
    for cpu, t in topo.items():
        core_index = (cpu % cores_total) % cores  # position within its socket
        n = t["package"] * per_socket + core_index // cores_per_node
        node_cpus[n].append(cpu)
    gib = 1024 * 1024
    desc_nodes = {
        n: mf.node(sorted(c), 64 * gib, 60 * gib - n * 1024, hp) for n, c in node_cpus.items()
    }
    dist = {
        (a, b): 10 if a == b else (12 if a // per_socket == b // per_socket else 32)
        for a in range(nodes)
        for b in range(nodes)
    }
    devs = [mf.pci("0000:00:00.0", 0x8086, 0x09A2, 0x060000, 0)]
    for g in range(gpus):
        n = g * nodes // max(gpus, 1)
        bus = 0x10 + g * 8
        devs.append(mf.pci(f"0000:{bus:02x}:00.0", 0x10DE, 0x2330, 0x030200, n))
        devs.append(mf.pci(f"0000:{bus + 1:02x}:00.0", 0x15B3, 0x1021, 0x020000, n))
    return mf.base(
        f"bench-{cpus}cpu-{nodes}node",
        source=f"bench/gen_topology.py: {cpus} CPUs, {nodes} nodes, {gpus} GPUs",
        topo=topo,
        nodes=desc_nodes,
        distance=dist,
        pci=devs,
        nvidia_proc=True,
    )


def describe_many_nodes(mf: Any, cpus: int, nodes: int) -> Dict[str, Any]:
    """The shape of hwloc's 256-CPU, 64-node test machine (an Itanium system named
    "64n2s2c" there): per node two packages of single-thread cores, no SMT, one
    cache per package, distances growing with the hops between nodes.  Written from
    that shape, not copied; used at 256 CPUs / 64 nodes."""
    sockets = nodes * 2
    cores = cpus // sockets
    assert sockets * cores == cpus, (cpus, nodes)
    topo = mf.x86_smp(sockets, cores, 1)
    gib = 1024 * 1024
    desc_nodes = {
        n: mf.node(
            [c for c in topo if topo[c]["package"] // 2 == n],
            8 * gib,
            6 * gib - n * 1024,
            {2048: (0, 0, 0)},
        )
        for n in range(nodes)
    }
    dist = {
        (a, b): 10 if a == b else 15 + 5 * bin(a ^ b).count("1")
        for a in range(nodes)
        for b in range(nodes)
    }
    return mf.base(
        f"bench-{cpus}cpu-{nodes}node-hwloc",
        source=f"bench/gen_topology.py: {cpus} CPUs, {nodes} nodes (2 packages per node)",
        topo=topo,
        nodes=desc_nodes,
        distance=dist,
        pci=[],
        nvidia_proc=False,
    )


_CACHE_KB = {1: 48, 2: 2048, 3: 65536}


def _add_hwloc_files(
    mf: Any, files: Dict[str, bytes], m: Dict[str, Any], r: Dict[str, Any]
) -> None:
    bits = r["mask_bits"]
    topo = m["topo"]
    pkg: Dict[int, List[int]] = {}
    for c in r["online"]:
        pkg.setdefault(topo[c]["package"], []).append(c)
    mask_cache: Dict[str, str] = {}

    def mask(list_text: str) -> str:
        if list_text not in mask_cache:
            ids = set()
            for part in list_text.split(","):
                if part:
                    a, _, b = part.partition("-")
                    ids.update(range(int(a), int(b or a) + 1))
            mask_cache[list_text] = mf.fmt_mask(ids, bits)
        return mask_cache[list_text]

    add: Dict[str, bytes] = {}
    for rel, data in files.items():
        if rel.endswith("/topology/thread_siblings_list"):
            d = rel[: -len("thread_siblings_list")]
            m_text = mask(data.decode().strip()) + "\n"
            add[d + "thread_siblings"] = m_text.encode()
            add[d + "core_cpus"] = m_text.encode()
            cpu = int(rel.split("/")[4][3:])
            plist = mf.fmt_list(pkg[topo[cpu]["package"]])
            add[d + "core_siblings_list"] = (plist + "\n").encode()
            add[d + "package_cpus_list"] = (plist + "\n").encode()
            add[d + "core_siblings"] = (mask(plist) + "\n").encode()
            add[d + "package_cpus"] = (mask(plist) + "\n").encode()
            add[d + "die_id"] = b"0\n"
        elif rel.endswith("/shared_cpu_list") and "/cache/index" in rel:
            d = rel[: -len("shared_cpu_list")]
            add[d + "shared_cpu_map"] = (mask(data.decode().strip()) + "\n").encode()
            level = int(files[d + "level"].decode())
            add[d + "size"] = f"{_CACHE_KB.get(level, 1024)}K\n".encode()
            add[d + "coherency_line_size"] = b"64\n"
            add[d + "ways_of_associativity"] = b"16\n"
            add[d + "physical_line_partition"] = b"1\n"
    files.update(add)


def write_tree(dest: str, cpus: int, nodes: int, gpus: int) -> Dict[str, Any]:
    """Write the tree under ``dest`` (its filesystem root); returns its shape.  With
    more nodes than a quarter of the CPUs' cores, the many-node shape (no GPUs)."""
    mf = fixtures_module()
    m = (
        describe_many_nodes(mf, cpus, nodes)
        if nodes * 4 >= cpus
        else describe(mf, cpus, nodes, gpus)
    )
    r = mf.resolve(m)
    tree = mf.build_tree(m, r, dest)
    _add_hwloc_files(mf, tree.files, m, r)
    tree.write()
    return {
        "cpus": len(r["online"]),
        "nodes": len(r["online_nodes"]),
        "gpus": gpus,
        "files": len(tree.files),
    }


def main(argv: List[str]) -> int:
    dest = argv[0]
    nums = [int(x) for x in argv[1:]] + [1024, 32, 16][len(argv) - 1 :]
    print(write_tree(dest, *nums[:3]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
