#!/usr/bin/env python3
# ruff: noqa: UP031  (printf-style on purpose: it mirrors the kernel's formats)
"""Write the synthetic fixtures under fake_sysfs/ from machine descriptions.

Each machine below is plain data (CPUs, nodes, memory, distances, PCI devices,
process cpuset, kernel quirks). From that one description this script writes
BOTH the saved tree (root/ in fake_sysfs/<name>.txt, in the exact text formats
the kernel prints) and the archive's expected.json (what numa_utils'
reader must return), as one text archive (fake_sysfs/README.md has the
format). expected.json is computed from the description, never by
reading the tree back and never through numa_utils, so it is an independent
oracle for the reader.

Deterministic: same script, same bytes. Run from anywhere:

    python3 tools/make_fixtures.py            # (re)write every synthetic fixture
    python3 tools/make_fixtures.py --check    # exit 1 if a fixture on disk differs
    python3 tools/make_fixtures.py gh200      # only the named ones

Fixtures gathered from real machines (single-node, ...) are not touched.

Kernel behaviour the writer follows (Linux 5.x/6.x unless a machine says otherwise):
- node<N>/cpulist and cpumap list online CPUs only (node.c ANDs with cpu_online_mask);
  thread_siblings, shared_cpu_list and PCI local_cpus drop offline CPUs too.
- Offline CPUs keep cpu<N>/online ("0") but lose topology/ and cache/.
  Possible-but-not-present CPUs have no cpu<N>/ directory at all.
- CPU masks print nr_cpu_ids bits (highest possible CPU + 1) as 32-bit hex words,
  most significant first, the first word only as wide as its bits need;
  Mems_allowed prints MAX_NUMNODES bits.
- Only online nodes have node<N>/ directories; distance rows list online nodes in id order.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gather  # noqa: E402  (pack_text: the archive format, written in one place)

FAKE = os.path.join(os.path.dirname(HERE), "fake_sysfs")

GIB_KB = 1024 * 1024
VENDOR_NAMES = {0x10DE: "nvidia", 0x1002: "amd", 0x8086: "intel"}


# ---------------------------------------------------------------------------
# kernel text formats
# ---------------------------------------------------------------------------


def fmt_list(ids):
    """cpulist format: "0-3,8,10-11"; empty set -> ""."""
    ids = sorted(set(ids))
    out = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else "%d-%d" % (ids[i], ids[j]))
        i = j + 1
    return ",".join(out)


def fmt_mask(ids, nbits):
    """bitmap_print "%*pb": 32-bit hex chunks, most significant first."""
    value = 0
    for i in ids:
        assert 0 <= i < nbits, (i, nbits)
        value |= 1 << i
    nchunks = (nbits + 31) // 32
    top_bits = nbits - 32 * (nchunks - 1)
    words = []
    for k in range(nchunks - 1, -1, -1):
        chunk = (value >> (32 * k)) & 0xFFFFFFFF
        width = (top_bits + 3) // 4 if k == nchunks - 1 else 8
        words.append("%0*x" % (width, chunk))
    return ",".join(words)


def kb_line(label, value, prefix=""):
    return "%s%-16s%8d kB" % (prefix, label + ":", value)


# ---------------------------------------------------------------------------
# building blocks for descriptions
# ---------------------------------------------------------------------------


def x86_smp(sockets, cores, threads, llc_per_socket=1, core_ids=None):
    """CPU topology with Linux/x86 numbering: all first threads, then all second
    threads (cpu N and N + sockets*cores are SMT siblings).

    Returns {cpu: {"package", "core", "siblings", "caches"}} where caches is a list
    of (level, type, sharing cpus)."""
    total_cores = sockets * cores
    topo = {}
    per_llc = cores // llc_per_socket
    for s in range(sockets):
        for c in range(cores):
            sib = [t * total_cores + s * cores + c for t in range(threads)]
            g = c // per_llc
            llc = [
                t * total_cores + s * cores + cc
                for t in range(threads)
                for cc in range(g * per_llc, (g + 1) * per_llc)
            ]
            cid = core_ids[c] if core_ids else c
            for cpu in sib:
                topo[cpu] = {
                    "package": s,
                    "core": cid,
                    "siblings": sib,
                    "caches": [
                        (1, "Data", sib),
                        (1, "Instruction", sib),
                        (2, "Unified", sib),
                        (3, "Unified", sorted(llc)),
                    ],
                }
    return topo


def grouped_smp(sockets, cores, threads, package_ids, core_id_fn, llc_cores):
    """Numbering where the threads of one core are consecutive (powerpc, arm64)."""
    topo = {}
    for s in range(sockets):
        for c in range(cores):
            first = (s * cores + c) * threads
            sib = list(range(first, first + threads))
            g = c // llc_cores
            llc_first = (s * cores + g * llc_cores) * threads
            llc = list(range(llc_first, llc_first + llc_cores * threads))
            for cpu in sib:
                topo[cpu] = {
                    "package": package_ids[s],
                    "core": core_id_fn(s, c),
                    "siblings": sib,
                    "caches": [
                        (1, "Data", sib),
                        (1, "Instruction", sib),
                        (2, "Unified", llc if llc_cores <= 2 else sib),
                        (3, "Unified", llc),
                    ],
                }
    return topo


def pci(addr, vendor, device, cls, node, local=None):
    """A PCI function. local: CPUs of local_cpulist; None = derived from node."""
    return {
        "address": addr,
        "vendor": vendor,
        "device": device,
        "class": cls,
        "numa_node": node,
        "local": local,
    }


def node(cpus, total_kb, free_kb, hugepages=None, normal=True):
    """hugepages: {size_kB: (total, free, surplus)}."""
    return {
        "cpus": list(cpus),
        "total": total_kb,
        "free": free_kb,
        "hugepages": hugepages or {},
        "normal": normal,
    }


def matrix(ids, rows):
    return {(a, b): rows[i][j] for i, a in enumerate(ids) for j, b in enumerate(ids)}


def uniform(ids, near=10, far=21):
    return {(a, b): near if a == b else far for a in ids for b in ids}


# ---------------------------------------------------------------------------
# the machines
# ---------------------------------------------------------------------------


def base(name, **kw):
    m = {
        "name": name,
        "source": "",
        "arch": "x86_64",
        "kernel": "6.8.0-49-generic",
        "possible": None,  # default: every CPU in topo
        "present": None,  # default: possible
        "online": None,  # default: present
        "topo": {},
        "nodes": {},
        "online_nodes": None,  # default: sorted(nodes)
        "possible_nodes": None,  # default: online_nodes
        "distance": None,
        "pci": [],
        "thp": "madvise",  # None: no THP file
        "numa_balancing": 0,  # None: no file
        "global_hugepages": None,  # default: sum over nodes
        "default_hugepage_kb": 2048,
        "allowed_cpus": None,  # default: online
        "allowed_mems": None,  # default: nodes with memory
        "max_numnodes": 1024,  # width of Mems_allowed
        "cpumask_bits": None,  # default nr_cpu_ids
        "node_dir": True,
        "node_cpulist": True,  # False: cpumap only (old kernels)
        "nul_files": (),  # relative paths (in the node dir) ending "\n\0"
        "core_cpus_list": True,
        "cpu0_online_file": False,  # x86 has none for the boot CPU
        "pci_cpulist": True,  # False: local_cpus mask only
        "node_hugepages": True,
        "nvidia_proc": False,
        "weighted_interleave": False,
        "memory_tiers": None,  # {tier id: [nodes]}: memory_tiering/ (6.1+)
        "hmat": {},  # node: (read MB/s, write MB/s, read ns, write ns,
        #        [initiators]) in nodeN/access0/initiators/
        "gpu_memory": {},  # node: PCI address of the GPU whose HBM it holds
        "proc_total": None,  # proc/meminfo MemTotal if it must differ
    }
    m.update(kw)
    return m


def h100_box():
    topo = x86_smp(2, 48, 2)
    n0 = [c for c in topo if topo[c]["package"] == 0]
    n1 = [c for c in topo if topo[c]["package"] == 1]
    hp = {2048: (4096, 4000, 0), 1048576: (32, 30, 0)}
    gpus0 = ["0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0"]
    gpus1 = ["0000:9b:00.0", "0000:bb:00.0", "0000:cb:00.0", "0000:db:00.0"]
    devs = [
        pci("0000:00:00.0", 0x8086, 0x09A2, 0x060000, 0),
        pci("0000:03:00.0", 0x1A03, 0x2000, 0x030000, 0),  # ASPEED BMC VGA
        pci("0000:00:01.0", 0x8086, 0x0B25, 0x088000, 0),  # Intel DSA: intel, not display
        pci("0000:6b:00.0", 0x8086, 0x4940, 0x0B4000, 0),  # Intel QAT co-processor
        pci("0000:1a:00.0", 0x15B3, 0x1021, 0x020000, 0),  # ConnectX-7 Ethernet
        pci("0000:9c:00.0", 0x15B3, 0x1021, 0x020700, 1),  # ConnectX-7 InfiniBand
        pci("0000:05:00.0", 0x10DE, 0x22A3, 0x068000, 0),  # NVSwitch (bridge class)
        pci("0000:06:00.0", 0x10DE, 0x22A3, 0x068000, 0),
        pci("0000:85:00.0", 0x10DE, 0x22A3, 0x068000, 1),
        pci("0000:86:00.0", 0x10DE, 0x22A3, 0x068000, 1),
    ]
    devs += [pci(a, 0x10DE, 0x2330, 0x030200, 0) for a in gpus0]
    devs += [pci(a, 0x10DE, 0x2330, 0x030200, 1) for a in gpus1]
    return base(
        "dual-socket-8gpu",
        source=(
            "HGX H100 8-GPU server shape: 2 sockets x 48 cores x 2 threads "
            "(Xeon Platinum 8468 class), SNC off, 2 nodes, 4 H100 SXM (10de:2330) per "
            "socket, 4 NVSwitches (10de:22a3, bridge class 0x068000: NVIDIA but not a GPU), "
            "ASPEED BMC VGA, Intel DSA/QAT (Intel vendor, not display class), ConnectX-7. "
            "Kernel-style numbering: cpu N and N+96 are SMT siblings. 2 MiB and 1 GiB "
            "hugepages reserved on both nodes; numa_balancing 1; THP always."
        ),
        topo=topo,
        nodes={0: node(n0, 1056462848, 1011723264, hp), 1: node(n1, 1056964608, 1023410176, hp)},
        distance=uniform([0, 1], 10, 21),
        pci=devs,
        thp="always",
        numa_balancing=1,
        nvidia_proc=True,
    )


def four_node_asym():
    # 2 packages x 16 cores x 2 threads, sub-NUMA clustering: 4 nodes of 8 cores.
    topo = x86_smp(2, 16, 2, llc_per_socket=2)
    nodes = {}
    for n in range(4):
        cores = range(8 * n, 8 * n + 8)
        cpus = list(cores) + [32 + c for c in cores]
        nodes[n] = node(
            cpus,
            132006912 - n * 1024,
            120000000 - n * 777777,
            {2048: (0, 0, 0), 1048576: (0, 0, 0)},
        )
    dist = matrix(
        [0, 1, 2, 3], [[10, 12, 20, 30], [12, 10, 30, 20], [20, 30, 10, 12], [31, 20, 12, 10]]
    )
    # AMD's host bridges use vendor 0x1022, not 0x1002: not GPUs.
    devs = [
        pci("0000:00:00.0", 0x1022, 0x14A4, 0x060000, 0),
        pci("0000:41:00.0", 0x1002, 0x740F, 0x038000, 1),  # MI210, display-other class
        pci("0000:41:00.1", 0x1002, 0xAB28, 0x040300, 1),  # AMD HD audio: not a GPU
        pci("0000:c1:00.0", 0x1002, 0x740F, 0x038000, 3),
        pci("0000:e2:00.0", 0x8086, 0x56C0, 0x038000, 2),  # Intel Flex 170 (0x0380)
        pci("0000:21:00.0", 0x15B3, 0x101D, 0x020000, 0),
    ]
    return base(
        "four-node-asym",
        source=(
            "4 nodes on 2 packages (sub-NUMA clustering, 8 cores x 2 threads each), "
            "non-uniform distances (10/12/20/30) and one deliberately non-symmetric "
            "pair: distance 0->3 is 30 but 3->0 is 31 (SLIT allows it), so a reader "
            "that transposes rows or assumes symmetry fails. Node cpulists are two "
            "ranges each (0-7,32-39). Two AMD MI210 (1002:740f, class 0x038000) and an "
            "Intel Data Center GPU Flex (8086:56c0, class 0x038000); AMD's other vendor "
            "id 0x1022 and AMD HD-audio functions are not GPUs. numa_balancing 1."
        ),
        topo=topo,
        nodes=nodes,
        distance=dist,
        pci=devs,
        numa_balancing=1,
        kernel="5.14.0-427.13.1.el9_4.x86_64",
    )


def sparse_ids():
    # IBM AC922 (POWER9, ppc64le): chips 0 and 8, six V100 whose HBM shows up as
    # CPU-less nodes 250-255.
    def core_id(s, c):
        return s * 2048 + c * 4

    topo = grouped_smp(2, 20, 4, [0, 8], core_id, llc_cores=2)
    n0 = [c for c in topo if topo[c]["package"] == 0]
    n8 = [c for c in topo if topo[c]["package"] == 8]
    hp = {2048: (0, 0, 0), 1048576: (0, 0, 0)}
    hp0 = {2048: (512, 512, 0), 1048576: (0, 0, 0)}
    nodes = {0: node(n0, 267911168, 250112000, hp0), 8: node(n8, 268173312, 259200000, hp)}
    for g in range(250, 256):
        nodes[g] = node([], 16252928, 16252928 - g, hp, normal=False)
    online = [0, 8] + list(range(250, 256))
    dist = {}
    for a in online:
        for b in online:
            if a == b:
                d = 10
            elif a < 250 and b < 250:
                d = 40
            else:
                d = 80
            dist[(a, b)] = d
    devs = [
        pci("0004:04:00.0", 0x10DE, 0x1DB1, 0x030200, 0),
        pci("0004:05:00.0", 0x10DE, 0x1DB1, 0x030200, 0),
        pci("0004:06:00.0", 0x10DE, 0x1DB1, 0x030200, 0),
        pci("0035:03:00.0", 0x10DE, 0x1DB1, 0x030200, 8),
        pci("0035:04:00.0", 0x10DE, 0x1DB1, 0x030200, 8),
        pci("0035:05:00.0", 0x10DE, 0x1DB1, 0x030200, 8),
        pci("0005:01:00.0", 0x1A03, 0x2000, 0x030000, 0),  # ASPEED
        pci("0033:01:00.0", 0x15B3, 0x1019, 0x020700, 8),
    ]
    return base(
        "sparse-ids",
        source=(
            "IBM AC922 shape (POWER9, ppc64le): chips 0 and 8 are the CPU nodes "
            "(2 x 20 cores x SMT4 = 160 CPUs, threads of a core consecutive, core_id "
            "values 0,4,8,... and 2048+), six V100 (10de:1db1) whose HBM is onlined as "
            "CPU-less, movable-only nodes 250-255. possible 0-255: node masks need 256 "
            "bits (4 x 64-bit words). PCI domains 0004/0035. 64 KiB base pages, "
            "2 MiB and 1 GiB hugepages (radix MMU)."
        ),
        arch="ppc64le",
        kernel="5.14.0-284.11.1.el9_2.ppc64le",
        topo=topo,
        nodes=nodes,
        online_nodes=online,
        possible_nodes=list(range(256)),
        distance=dist,
        pci=devs,
        max_numnodes=256,
        cpu0_online_file=True,
        numa_balancing=1,
        thp="always",
    )


def cxl_memory_node():
    topo = x86_smp(2, 32, 2, llc_per_socket=4)
    n0 = [c for c in topo if topo[c]["package"] == 0]
    n1 = [c for c in topo if topo[c]["package"] == 1]
    hp = {2048: (0, 0, 0), 1048576: (0, 0, 0)}
    dist = matrix([0, 1, 2], [[10, 32, 50], [32, 10, 60], [50, 60, 10]])
    devs = [
        pci("0000:00:00.0", 0x1022, 0x14A4, 0x060000, 0),
        pci("0000:c1:00.0", 0x10DE, 0x26B9, 0x030200, 1),  # L40S
        pci("0000:41:00.0", 0x8086, 0x0D93, 0x050210, 0),  # CXL Type-3 memory, Intel
        pci("0000:03:00.0", 0x1A03, 0x2000, 0x030000, 0),
    ]
    return base(
        "cxl-memory-node",
        source=(
            "2-socket AMD Genoa-class box (2 x 32 cores x 2 threads, 4 L3 groups per "
            "socket) with a CXL Type-3 memory expander onlined (ZONE_MOVABLE) as "
            "CPU-less node 2: has_cpu 0-1, has_memory 0-2, has_normal_memory 0-1. "
            "Distances 10/32 between sockets, 50/60 to the expander. numa_balancing 2 "
            "(memory tiering mode): the value is an int, not a bool. The CXL memory "
            "device is Intel-vendor class 0x0502, not a GPU. Weighted-interleave "
            "weights present (6.9+). Memory tiers and HMAT (modelled, not gathered): "
            "DRAM nodes 0-1 in tier 4 (230 GB/s, 110 ns from their own socket), the "
            "expander in tier 22 (32 GB/s read, 28 GB/s write, 270/300 ns from "
            "socket 0), as the kernel tiers a CXL node from its CDAT/HMAT figures."
        ),
        kernel="6.11.0-9-generic",
        topo=topo,
        nodes={
            0: node(n0, 395844352, 380000000, hp),
            1: node(n1, 396361728, 391002112, hp),
            2: node([], 268435456, 268000000, hp, normal=False),
        },
        distance=dist,
        pci=devs,
        numa_balancing=2,
        weighted_interleave=True,
        memory_tiers={4: [0, 1], 22: [2]},
        hmat={
            0: (230400, 230400, 110, 110, [0]),
            1: (230400, 230400, 110, 110, [1]),
            2: (32000, 28000, 270, 300, [0]),
        },
    )


def memoryless_cpu_node():
    # Threadripper 3960X, NPS4: 24 cores x 2 threads, 4 CCDs x 2 CCX x 3 cores.
    core_ids = []
    for ccd in range(4):
        for ccx in range(2):
            for k in range(3):
                core_ids.append(ccd * 8 + ccx * 4 + k)
    topo = x86_smp(1, 24, 2, llc_per_socket=8, core_ids=core_ids)
    nodes = {}
    for n in range(4):
        cpus = list(range(6 * n, 6 * n + 6)) + list(range(24 + 6 * n, 24 + 6 * n + 6))
        mem = (0, 0) if n in (0, 3) else (65850368 - n, 19673088 + n * 1000)
        nodes[n] = node(cpus, mem[0], mem[1], {2048: (0, 0, 0), 1048576: (0, 0, 0)})
    dist = {(a, b): 10 if a == b else 12 for a in range(4) for b in range(4)}
    devs = [
        pci("0000:00:00.0", 0x1022, 0x1480, 0x060000, 0),
        pci("0000:21:00.0", 0x10DE, 0x2684, 0x030000, 0),  # RTX 4090: VGA class
        pci("0000:21:00.1", 0x10DE, 0x22BA, 0x040300, 0),  # its HD audio: not a GPU
        pci("0000:61:00.0", 0x8086, 0x1533, 0x020000, 3),
    ]
    return base(
        "memoryless-cpu-node",
        source=(
            "AMD Threadripper 3960X in NPS4 (the layout from numactl issue #165): "
            "4 nodes with CPUs, but DIMMs only behind nodes 1 and 2, so nodes 0 and 3 "
            "have MemTotal 0 (has_cpu 0-3, has_memory 1-2, Mems_allowed_list 1-2). "
            "Zen core_id values have gaps (0-2,4-6,8-10,...); L3 per CCX of 3 cores. "
            "An RTX 4090 (VGA class 0x030000) hangs off memory-less node 0; its audio "
            "function (class 0x0403) is not a GPU."
        ),
        kernel="6.1.0-28-amd64",
        topo=topo,
        nodes=nodes,
        distance=dist,
        pci=devs,
    )


def gh200():
    topo = grouped_smp(1, 72, 1, [0], lambda s, c: c, llc_cores=72)
    hp = {2048: (0, 0, 0), 524288: (0, 0, 0), 16777216: (0, 0, 0)}
    hp0 = {2048: (0, 0, 0), 524288: (64, 60, 0), 16777216: (0, 0, 0)}
    nodes = {
        0: node(range(72), 497704896, 470155072, hp0),
        1: node([], 100663296, 99876864, hp, normal=False),
    }
    for n in range(2, 9):
        nodes[n] = node([], 0, 0, hp)
    online = list(range(9))
    dist = {(a, b): 10 if a == b else 80 for a in online for b in online}
    devs = [
        pci("0009:01:00.0", 0x10DE, 0x2342, 0x030200, 0),
        pci("0000:01:00.0", 0x15B3, 0x1021, 0x020000, 0),
        pci("0002:01:00.0", 0x10DE, 0x22B1, 0x060400, 0),  # NVIDIA PCIe bridge: not a GPU
        pci("0008:02:00.0", 0x1A03, 0x2000, 0x030000, 0),
    ]
    return base(
        "gh200",
        source=(
            "NVIDIA GH200 Grace Hopper superchip shape (arm64, 64 KiB-page kernel): "
            "node 0 = 72 Grace cores (no SMT, one L3 for all) + LPDDR5X; node 1 = the "
            "H100's HBM, CPU-less and movable-only; nodes 2-8 = the empty nodes the "
            "NVIDIA driver reserves for MIG partitions (online, no CPUs, no memory), "
            "as lscpu reports 'NUMA node(s): 9' on these machines. Distances are "
            "modelled (10 local, 80 elsewhere), not gathered. GPU 10de:2342 at "
            "0009:01:00.0 with numa_node 0; /proc/driver/nvidia present. Hugepage "
            "sizes of a 64K-page arm64 kernel: 2 MiB, 512 MiB, 16 GiB. Every CPU "
            "including cpu0 has an online file (arm64). Memory tiers and HMAT "
            "(modelled): LPDDR5X node 0 in tier 4 (500 GB/s, 120 ns); the HBM node 1 "
            "seen from the Grace CPUs over NVLink-C2C in tier 17 (450 GB/s, "
            "800 ns); node 1 is the GPU's memory (the NVIDIA driver's node)."
        ),
        arch="aarch64",
        kernel="6.8.0-1013-nvidia-64k",
        topo=topo,
        nodes=nodes,
        online_nodes=online,
        possible_nodes=online,
        distance=dist,
        pci=devs,
        max_numnodes=64,
        cpu0_online_file=True,
        default_hugepage_kb=524288,
        nvidia_proc=True,
        memory_tiers={4: [0], 17: [1]},
        hmat={0: (512000, 512000, 120, 120, [0]), 1: (450000, 450000, 800, 800, [0])},
        gpu_memory={1: "0009:01:00.0"},
    )


def container_cpuset():
    topo = x86_smp(2, 16, 2)
    n0 = [c for c in topo if topo[c]["package"] == 0]
    n1 = [c for c in topo if topo[c]["package"] == 1]
    hp = {2048: (0, 0, 0), 1048576: (0, 0, 0)}
    devs = [
        pci("0000:17:00.0", 0x10DE, 0x26B9, 0x030200, 0),
        pci("0000:ca:00.0", 0x10DE, 0x26B9, 0x030200, 1),
        pci("0000:02:00.0", 0x1A03, 0x2000, 0x030000, 0),
    ]
    return base(
        "container-cpuset",
        source=(
            "A 2-node, 64-CPU host (2 x 16 cores x 2 threads) seen from inside a "
            "container whose cpuset is 8 cores of node 1 with their siblings "
            "(Cpus_allowed_list 20-27,52-59) and Mems_allowed_list 1. sysfs still "
            "shows the whole machine; only proc/self/status is narrowed. The GPU on "
            "node 0 is outside the cpuset. numa_balancing 1."
        ),
        topo=topo,
        nodes={0: node(n0, 263782656, 200112640, hp), 1: node(n1, 264200192, 240011264, hp)},
        distance=uniform([0, 1], 10, 21),
        pci=devs,
        numa_balancing=1,
        allowed_cpus=list(range(20, 28)) + list(range(52, 60)),
        allowed_mems=[1],
    )


def no_node_dir():
    topo = {}
    for c in range(4):
        topo[c] = {
            "package": 0,
            "core": c,
            "siblings": [c],
            "caches": [
                (1, "Data", [c]),
                (1, "Instruction", [c]),
                (2, "Data", [c]),
                (2, "Instruction", [c]),
                (3, "Unified", [c]),
                (4, "Unified", [c]),
            ],
        }
    return base(
        "no-node-dir",
        source=(
            "s390x guest (Debian's s390x kernel is built without CONFIG_NUMA): no "
            "sys/devices/system/node at all, no numa_balancing file. The reader must "
            "report one node 0 holding every online CPU, memory from proc/meminfo, "
            "hugepages from sys/kernel/mm/hugepages (1 MiB and 2 GiB sizes on s390x). "
            "s390 cache leaves list only the CPU itself, up to level 4, so llc is [cpu]. "
            "No PCI devices."
        ),
        arch="s390x",
        kernel="6.1.0-28-s390x",
        topo=topo,
        nodes={0: node(range(4), 8155192, 7632440)},
        node_dir=False,
        numa_balancing=None,
        thp="always",
        max_numnodes=1,
        global_hugepages={1024: (16, 16, 0), 2097152: (0, 0, 0)},
        default_hugepage_kb=1024,
        cpu0_online_file=True,
    )


def gpu_numa_unknown():
    topo = x86_smp(1, 32, 1)
    for c in topo:  # two virtual sockets of 16 vCPUs
        topo[c]["package"] = c // 16
        topo[c]["caches"][3] = (3, "Unified", list(range(16 * (c // 16), 16 * (c // 16) + 16)))
    hp = {2048: (0, 0, 0), 1048576: (0, 0, 0)}
    devs = [
        pci("0000:00:00.0", 0x8086, 0x29C0, 0x060000, -1),  # q35 host bridge
        pci("0000:00:01.0", 0x1234, 0x1111, 0x030000, -1),  # QEMU stdvga
        pci("0000:00:03.0", 0x1AF4, 0x1041, 0x020000, -1),  # virtio-net
        pci("0000:00:05.0", 0x10DE, 0x20B2, 0x030200, -1),  # A100, node unknown
        pci("0000:00:06.0", 0x10DE, 0x20B2, 0x030200, -1),
        pci(
            "0000:00:07.0", 0x10DE, 0x20B2, 0x030200, -1, local=list(range(16, 32))
        ),  # unknown node, one socket local
        pci("0000:80:00.0", 0x10DE, 0x20B2, 0x030200, 1),
    ]
    return base(
        "gpu-numa-unknown",
        source=(
            "Cloud KVM guest with 2 virtual NUMA nodes of 16 vCPUs (no SMT), CPU "
            "hotplug slots: possible 0-47, present and online 0-31 (so CPUs 32-47 have "
            "no cpu<N>/ directory and masks are 48 bits: '0000,ffffffff'). Four passed-"
            "through A100 (10de:20b2): three report numa_node -1 (two with local_cpulist "
            "= every CPU, one with one socket), one behind a pxb root port reports node "
            "1. QEMU stdvga (1234:1111, VGA class) and virtio devices are not GPUs."
        ),
        topo=topo,
        possible=list(range(48)),
        present=list(range(32)),
        nodes={
            0: node(range(16), 131926528, 120000000, hp),
            1: node(range(16, 32), 132120576, 129999872, hp),
        },
        distance=uniform([0, 1], 10, 20),
        pci=devs,
        max_numnodes=1024,
        numa_balancing=0,
        thp="never",
    )


def old_kernel_cpumap():
    # Westmere-EP: 2 x 6 cores x 2 threads, BIOS numbering alternating sockets:
    # even CPUs on socket 0, odd on socket 1; cpu N and N+12 are siblings.
    topo = {}
    for cpu in range(24):
        s = cpu % 2
        core = (cpu % 12) // 2
        sib = [cpu % 12, cpu % 12 + 12]
        llc = [c for c in range(24) if c % 2 == s]
        topo[cpu] = {
            "package": s,
            "core": [0, 1, 2, 8, 9, 10][core],
            "siblings": sib,
            "caches": [
                (1, "Data", sib),
                (1, "Instruction", sib),
                (2, "Unified", sib),
                (3, "Unified", llc),
            ],
        }
    devs = [
        pci("0000:00:00.0", 0x8086, 0x3406, 0x060000, -1),
        pci("0000:01:03.0", 0x102B, 0x0532, 0x030000, -1),  # Matrox G200eW
        pci("0000:02:00.0", 0x10DE, 0x1091, 0x030200, 0),  # Tesla M2090
        pci("0000:84:00.0", 0x10DE, 0x1091, 0x030200, 1),
    ]
    return base(
        "old-kernel-cpumap",
        source=(
            "2-socket Westmere-EP shape on an old (2.6.3x-era) kernel layout: node "
            "directories have cpumap but no cpulist; node cpumap, distance, online and "
            'possible end in "\\n\\0"; masks are printed 64 bits wide (NR_CPUS=64) '
            "for 24 CPUs; PCI devices have local_cpus but no local_cpulist; no "
            "core_cpus_list; no per-node hugepages; no numa_balancing file; no "
            "transparent_hugepage/enabled (RHEL6 used a redhat_ path). BIOS "
            "numbering alternates sockets (node 0 = even CPUs). CPUs 7, 19 (both "
            "threads of one core) and 10 (one thread; its sibling 22 stays online) are "
            "offline: they keep cpu<N>/online = 0 but have no topology/ or cache/."
        ),
        kernel="2.6.32-754.el6.x86_64",
        topo=topo,
        online=[c for c in range(24) if c not in (7, 10, 19)],
        nodes={
            0: node([c for c in range(24) if c % 2 == 0], 49432780, 47001232),
            1: node([c for c in range(24) if c % 2 == 1], 49545216, 48210004),
        },
        distance=uniform([0, 1], 10, 20),
        pci=devs,
        thp=None,
        numa_balancing=None,
        node_cpulist=False,
        nul_files=("cpumap", "distance", "online", "possible"),
        core_cpus_list=False,
        pci_cpulist=False,
        node_hugepages=False,
        cpumask_bits=64,
        global_hugepages={2048: (0, 0, 0)},
    )


def mi300x():
    topo = x86_smp(2, 96, 2, llc_per_socket=12)
    n0 = [c for c in topo if topo[c]["package"] == 0]
    n1 = [c for c in topo if topo[c]["package"] == 1]
    hp = {2048: (0, 0, 0), 1048576: (0, 0, 0)}
    addrs0 = ["0000:05:00.0", "0000:15:00.0", "0000:65:00.0", "0000:75:00.0"]
    addrs1 = ["0000:85:00.0", "0000:95:00.0", "0000:e5:00.0", "0000:f5:00.0"]
    devs = [pci(a, 0x1002, 0x74A1, 0x120000, 0) for a in addrs0]
    devs += [pci(a, 0x1002, 0x74A1, 0x120000, 1) for a in addrs1]
    devs += [
        pci("0000:00:00.0", 0x1022, 0x14A4, 0x060000, 0),
        pci("0000:c2:00.0", 0x1A03, 0x2000, 0x030000, 1),
        pci("0000:06:00.0", 0x1022, 0x14DC, 0x130000, 0),  # AMD 0x1022 non-GPU function
        pci("0000:0c:00.0", 0x15B3, 0x1021, 0x020700, 0),
    ]
    return base(
        "mi300x-8gpu",
        source=(
            "AMD Instinct MI300X platform shape: 2 x 96-core Genoa (SMT2, 384 CPUs, "
            "masks 12 words), NPS1, 8 MI300X (1002:74a1) that report class 0x120000 "
            "(processing accelerator, not display), 4 per socket. numa_balancing 0 as "
            "AMD recommends."
        ),
        kernel="6.8.0-45-generic",
        topo=topo,
        nodes={0: node(n0, 792525312, 700001280, hp), 1: node(n1, 792723456, 760000512, hp)},
        distance=uniform([0, 1], 10, 32),
        pci=devs,
    )


def xeon_max_hbm_flat():
    topo = x86_smp(2, 56, 2, llc_per_socket=1)
    n0 = [c for c in topo if topo[c]["package"] == 0]
    n1 = [c for c in topo if topo[c]["package"] == 1]
    hp = {2048: (0, 0, 0), 1048576: (0, 0, 0)}
    ddr, hbm = 268435456, 67108864
    dist = matrix(
        [0, 1, 2, 3], [[10, 21, 13, 23], [21, 10, 23, 13], [13, 23, 10, 23], [23, 13, 23, 10]]
    )
    return base(
        "xeon-max-hbm-flat",
        source=(
            "2-socket Intel Xeon Max 9480 shape (2 x 56 cores x 2 threads) in HBM "
            "flat mode, quadrant clustering: nodes 0-1 = DDR5 with the CPUs, nodes "
            "2-3 = each socket's 64 GiB of HBM2e as CPU-less nodes with normal "
            "memory (has_normal_memory 0-3). Distances 10/13/21/23 as numactl shows "
            "them on these machines. Memory tiers and HMAT (modelled, not gathered): "
            "the HBM nodes have ~3x the bandwidth and slightly higher latency, so "
            "the kernel ranks them in the faster tier 3, the DDR nodes in tier 4. "
            "The default keeps to DDR: HBM is opt-in."
        ),
        topo=topo,
        nodes={
            0: node(n0, ddr, ddr - 8 * GIB_KB, hp),
            1: node(n1, ddr, ddr - 6 * GIB_KB, hp),
            2: node([], hbm, hbm - GIB_KB, hp),
            3: node([], hbm, hbm - GIB_KB, hp),
        },
        distance=dist,
        pci=[pci("0000:00:00.0", 0x8086, 0x09A2, 0x060000, 0)],
        memory_tiers={3: [2, 3], 4: [0, 1]},
        hmat={
            0: (250000, 250000, 120, 120, [0]),
            1: (250000, 250000, 120, 120, [1]),
            2: (800000, 800000, 135, 135, [0]),
            3: (800000, 800000, 135, 135, [1]),
        },
    )


def b200_snc3():
    # pegaflow #293's shape: 2 packages x SNC3 = 6 nodes with CPUs, 8 GPUs local to 4.
    topo = x86_smp(2, 48, 2, llc_per_socket=3)
    hp = {2048: (0, 0, 0), 1048576: (0, 0, 0)}
    nodes = {}
    for n in range(6):
        cores = range(16 * n, 16 * n + 16)
        cpus = list(cores) + [96 + c for c in cores]
        nodes[n] = node(cpus, 352321536, 340000000 - n * 1000000, hp)
    rows = [[10 if a == b else 12 if a // 3 == b // 3 else 21 for b in range(6)] for a in range(6)]
    gpus = {
        "0000:1a:00.0": 0,
        "0000:2a:00.0": 0,
        "0000:5d:00.0": 2,
        "0000:6d:00.0": 2,
        "0000:9a:00.0": 3,
        "0000:aa:00.0": 3,
        "0000:cd:00.0": 5,
        "0000:dd:00.0": 5,
    }
    devs = [pci("0000:00:00.0", 0x8086, 0x09A2, 0x060000, 0)]
    devs += [pci(a, 0x10DE, 0x2901, 0x030200, n) for a, n in gpus.items()]
    return base(
        "b200-snc3",
        source=(
            "B200 host in pegaflow #293's shape: 2 packages x 48 cores x 2 threads, "
            "sub-NUMA clustering 3 per package (SNC3): 6 nodes of 16 cores with CPUs "
            "and DRAM, 8 B200 (10de:2901) two each on nodes 0, 2, 3 and 5; nodes 1 "
            "and 4 have CPUs and memory but no GPU. Distances 10 / 12 (same package) "
            "/ 21. A GPU pool belongs on nodes 0, 2, 3, 5 only."
        ),
        topo=topo,
        nodes=nodes,
        distance=matrix(list(range(6)), rows),
        pci=devs,
    )


MACHINES = [
    h100_box,
    four_node_asym,
    sparse_ids,
    cxl_memory_node,
    memoryless_cpu_node,
    gh200,
    container_cpuset,
    no_node_dir,
    gpu_numa_unknown,
    old_kernel_cpumap,
    mi300x,
    xeon_max_hbm_flat,
    b200_snc3,
]


# ---------------------------------------------------------------------------
# derived facts (shared by the tree writer and the oracle)
# ---------------------------------------------------------------------------


def resolve(m):
    """Fill defaults. Returns a dict of derived sets used by both outputs."""
    topo = m["topo"]
    possible = sorted(m["possible"] if m["possible"] is not None else topo)
    present = sorted(m["present"] if m["present"] is not None else possible)
    online = sorted(m["online"] if m["online"] is not None else present)
    assert set(online) <= set(present) <= set(possible) and set(present) <= set(topo)
    nodes = m["nodes"]
    online_nodes = sorted(m["online_nodes"] if m["online_nodes"] is not None else nodes)
    possible_nodes = sorted(
        m["possible_nodes"] if m["possible_nodes"] is not None else online_nodes
    )
    assert set(online_nodes) == set(nodes) and set(online_nodes) <= set(possible_nodes)
    on = set(online)

    node_cpus = {n: sorted(set(nodes[n]["cpus"]) & on) for n in online_nodes}
    with_cpus = [n for n in online_nodes if node_cpus[n]]
    with_mem = [n for n in online_nodes if nodes[n]["total"] > 0]
    with_normal = [n for n in with_mem if nodes[n]["normal"]]
    if m["global_hugepages"] is not None:
        ghp = m["global_hugepages"]
    else:
        ghp = {}
        for n in online_nodes:
            for size, (t, f, s) in nodes[n]["hugepages"].items():
                a = ghp.get(size, (0, 0, 0))
                ghp[size] = (a[0] + t, a[1] + f, a[2] + s)
    return {
        "possible": possible,
        "present": present,
        "online": online,
        "online_nodes": online_nodes,
        "possible_nodes": possible_nodes,
        "node_cpus": node_cpus,
        "with_cpus": with_cpus,
        "with_mem": with_mem,
        "with_normal": with_normal,
        "ghp": ghp,
        "nr_cpu_ids": possible[-1] + 1,
        "mask_bits": m["cpumask_bits"] or (possible[-1] + 1),
        "allowed_cpus": sorted(m["allowed_cpus"] if m["allowed_cpus"] is not None else online),
        "allowed_mems": sorted(
            m["allowed_mems"]
            if m["allowed_mems"] is not None
            else (with_mem if m["node_dir"] else [0])
        ),
    }


def pci_local(m, r, dev):
    """What local_cpulist/local_cpus of a device say."""
    on = set(r["online"])
    if dev["local"] is not None:
        return sorted(set(dev["local"]) & on)
    if dev["numa_node"] < 0 or not m["node_dir"]:
        return r["online"]
    return r["node_cpus"][dev["numa_node"]]


def is_gpu(dev):
    return dev["vendor"] in VENDOR_NAMES and (dev["class"] >> 16) in (0x03, 0x12)


# ---------------------------------------------------------------------------
# the oracle: expected.json
# ---------------------------------------------------------------------------


def expected(m, r):
    on = set(r["online"])
    nodes_out = []
    if m["node_dir"]:
        for n in r["online_nodes"]:
            nd = m["nodes"][n]
            hp = {}
            if m["node_hugepages"]:
                for size in sorted(nd["hugepages"]):
                    t, f, s = nd["hugepages"][size]
                    hp[str(size)] = {"total": t, "free": f, "surplus": s}
            nodes_out.append(
                {
                    "id": n,
                    "cpus": r["node_cpus"][n],
                    "mem_total_kb": nd["total"],
                    "mem_free_kb": nd["free"],
                    "distances": {str(b): m["distance"][(n, b)] for b in r["online_nodes"]},
                    "hugepages": hp,
                }
            )
            nodes_out[-1].update(memory_facts(m, r, n))
        node_of = {c: n for n in r["online_nodes"] for c in r["node_cpus"][n]}
        online_nodes, possible_nodes = r["online_nodes"], r["possible_nodes"]
        with_cpus, with_mem = r["with_cpus"], r["with_mem"]
    else:
        nd = m["nodes"][0]
        nodes_out.append(
            {
                "id": 0,
                "cpus": r["online"],
                "mem_total_kb": nd["total"],
                "mem_free_kb": nd["free"],
                "distances": {"0": 10},
                "hugepages": {
                    str(s): {"total": t, "free": f, "surplus": u}
                    for s, (t, f, u) in sorted(r["ghp"].items())
                },
                "tier": None,
                "access": None,
                "has_normal_memory": None,
                "kind": "dram",
                "kind_evidence": "CPUs %s and normal memory" % fmt_list(r["online"]),
            }
        )
        node_of = {c: 0 for c in r["online"]}
        online_nodes = possible_nodes = with_cpus = with_mem = [0]

    cpus = {}
    for c in r["possible"]:
        if c in on:
            t = m["topo"][c]
            top = max(lv for lv, _, _ in t["caches"]) if t["caches"] else None
            llc = [sorted(set(s) & on) for lv, _, s in t["caches"] if lv == top]
            cpus[str(c)] = {
                "node": node_of.get(c),
                "online": True,
                "core": t["core"],
                "package": t["package"],
                "siblings": sorted(set(t["siblings"]) & on),
                "llc": llc[-1] if llc else [],
            }
        else:
            cpus[str(c)] = {
                "node": None,
                "online": False,
                "core": None,
                "package": None,
                "siblings": [],
                "llc": [],
            }

    gpus = []
    for dev in sorted(m["pci"], key=lambda d: d["address"]):
        if not is_gpu(dev):
            continue
        gpus.append(
            {
                "address": dev["address"],
                "vendor": "0x{:04x}".format(dev["vendor"]),
                "vendor_name": VENDOR_NAMES[dev["vendor"]],
                "device": "0x{:04x}".format(dev["device"]),
                "class": "0x{:06x}".format(dev["class"]),
                "numa_node": dev["numa_node"],
                "local_cpus": pci_local(m, r, dev),
            }
        )
    per = {}
    for c in cpus.values():
        if c["online"] and c["package"] is not None and c["node"] is not None:
            per.setdefault(c["package"], set()).add(c["node"])
    counts = {len(v) for v in per.values()}
    k = counts.pop() if len(counts) == 1 else None
    for nd in nodes_out:  # several nodes per package (SNC/NPS): said in the evidence
        pk = [p for p, ns in per.items() if nd["id"] in ns]
        if k and k > 1 and pk and nd["kind"] == "dram":
            nd["kind_evidence"] += "; package %d, one of %d nodes (SNC%d/NPS%d)" % (pk[0], k, k, k)
    return {
        "nodes": nodes_out,
        "nodes_per_package": k,
        "online_nodes": online_nodes,
        "possible_nodes": possible_nodes,
        "nodes_with_cpus": with_cpus,
        "nodes_with_memory": with_mem,
        "cpus": cpus,
        "online_cpus": r["online"],
        "allowed_cpus": r["allowed_cpus"],
        "allowed_mems": r["allowed_mems"],
        "gpus": gpus,
        "numa_balancing": m["numa_balancing"],
        "thp": m["thp"],
        "memory_tiers": {str(t): sorted(ns) for t, ns in sorted((m["memory_tiers"] or {}).items())},
        "interleave_weights": {str(n): 1 for n in r["online_nodes"]}
        if m["weighted_interleave"]
        else None,
        "interleave_auto": None,
    }


def memory_facts(m, r, n):
    """tier, HMAT access, has_normal_memory and the kind of memory of node n."""
    tier = None
    for t, ns in (m["memory_tiers"] or {}).items():
        if n in ns:
            tier = t
    h = m["hmat"].get(n)
    access = (
        None
        if h is None
        else {
            "read_bandwidth_mbps": h[0],
            "write_bandwidth_mbps": h[1],
            "read_latency_ns": h[2],
            "write_latency_ns": h[3],
            "initiators": sorted(h[4]),
        }
    )
    cpus = r["node_cpus"][n]
    if n not in r["with_mem"]:
        kind, why = "no-memory", "not in has_memory"
    elif n not in r["with_normal"]:
        kind = "movable-only"
        why = "memory only in ZONE_MOVABLE (not in has_normal_memory)" + (
            "" if cpus else "; no CPUs"
        )
    elif cpus:
        kind, why = "dram", "CPUs %s and normal memory" % fmt_list(cpus)
    else:
        kind, why = "cpu-less", "memory but no CPUs"
    if n in m["gpu_memory"]:
        kind, why = "gpu", "memory of GPU %s (driver); %s" % (m["gpu_memory"][n], why)
    return {
        "tier": tier,
        "access": access,
        "has_normal_memory": n in r["with_normal"],
        "kind": kind,
        "kind_evidence": why,
    }


# ---------------------------------------------------------------------------
# the tree writer
# ---------------------------------------------------------------------------


class Tree:
    def __init__(self, root):
        self.root = root
        self.files = {}
        self.links = {}  # relative path -> symlink target

    def put(self, rel, text, nul=False):
        data = text.encode() + (b"\0" if nul else b"")
        self.files[rel] = data

    def line(self, rel, text, nul=False):
        self.put(rel, text + "\n", nul)

    def link(self, rel, target):
        self.links[rel] = target

    def write(self):
        for rel in sorted(self.files):
            path = os.path.join(self.root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(self.files[rel])


def node_meminfo(n, total, free, hp_default):
    used = total - free
    act_anon, inact_anon = used // 8, used // 16
    act_file, inact_file = used // 4, used // 5
    p = "Node %d " % n
    lines = [
        kb_line("MemTotal", total, p),
        kb_line("MemFree", free, p),
        kb_line("MemUsed", used, p),
        kb_line("SwapCached", 0, p),
        kb_line("Active", act_anon + act_file, p),
        kb_line("Inactive", inact_anon + inact_file, p),
        kb_line("Active(anon)", act_anon, p),
        kb_line("Inactive(anon)", inact_anon, p),
        kb_line("Active(file)", act_file, p),
        kb_line("Inactive(file)", inact_file, p),
        kb_line("Unevictable", 0, p),
        kb_line("Mlocked", 0, p),
        kb_line("Dirty", used // 1000, p),
        kb_line("Writeback", 0, p),
        kb_line("FilePages", act_file + inact_file, p),
        kb_line("Mapped", used // 50, p),
        kb_line("AnonPages", act_anon + inact_anon, p),
        kb_line("Shmem", used // 100, p),
        kb_line("KernelStack", used // 2000, p),
        kb_line("PageTables", used // 500, p),
        kb_line("SecPageTables", 0, p),
        kb_line("NFS_Unstable", 0, p),
        kb_line("Bounce", 0, p),
        kb_line("WritebackTmp", 0, p),
        kb_line("KReclaimable", used // 40, p),
        kb_line("Slab", used // 25, p),
        kb_line("SReclaimable", used // 40, p),
        kb_line("SUnreclaim", used // 25 - used // 40, p),
        kb_line("AnonHugePages", 0, p),
        kb_line("ShmemHugePages", 0, p),
        kb_line("ShmemPmdMapped", 0, p),
        kb_line("FileHugePages", 0, p),
        kb_line("FilePmdMapped", 0, p),
    ]
    t, f, s = hp_default
    lines += [
        "%sHugePages_Total: %5d" % (p, t),
        "%sHugePages_Free:  %5d" % (p, f),
        "%sHugePages_Surp:  %5d" % (p, s),
    ]
    return "\n".join(lines) + "\n"


def old_node_meminfo(n, total, free):
    p = "Node %d " % n
    used = total - free
    lines = [
        kb_line("MemTotal", total, p),
        kb_line("MemFree", free, p),
        kb_line("MemUsed", used, p),
        kb_line("Active", used // 3, p),
        kb_line("Inactive", used // 4, p),
        kb_line("Dirty", 0, p),
        kb_line("Writeback", 0, p),
        kb_line("FilePages", used // 2, p),
        kb_line("Mapped", used // 50, p),
        kb_line("AnonPages", used // 4, p),
        kb_line("Shmem", 0, p),
        kb_line("KernelStack", 1000, p),
        kb_line("PageTables", used // 500, p),
        kb_line("NFS_Unstable", 0, p),
        kb_line("Bounce", 0, p),
        kb_line("WritebackTmp", 0, p),
        kb_line("Slab", used // 25, p),
        kb_line("SReclaimable", used // 40, p),
        kb_line("SUnreclaim", used // 25 - used // 40, p),
        "%sHugePages_Total: %5d" % (p, 0),
        "%sHugePages_Free:  %5d" % (p, 0),
        "%sHugePages_Surp:  %5d" % (p, 0),
    ]
    return "\n".join(lines) + "\n"


def numastat(n, total):
    if not total:  # a node without memory allocates nothing itself
        return (
            "numa_hit 0\nnuma_miss 0\nnuma_foreign 0\ninterleave_hit 0\n"
            "local_node 0\nother_node 0\n"
        )
    base_hits = (total // 4096) * 37 + n * 1009
    other = n * 311 + 17
    return (
        "numa_hit %d\nnuma_miss %d\nnuma_foreign %d\ninterleave_hit %d\n"
        "local_node %d\nother_node %d\n"
        % (base_hits, other, other // 2, 1100 + n, base_hits - other, other)
    )


def node_vmstat(n, total, free):
    hits = (total // 4096) * 37 + n * 1009
    keys = [
        ("nr_free_pages", free // 4),
        ("nr_zone_inactive_anon", (total - free) // 64),
        ("nr_zone_active_anon", (total - free) // 32),
        ("nr_zone_inactive_file", (total - free) // 20),
        ("nr_zone_active_file", (total - free) // 16),
        ("nr_zone_unevictable", 0),
        ("nr_zone_write_pending", 0),
        ("nr_mlock", 0),
        ("nr_bounce", 0),
        ("nr_free_cma", 0),
        ("numa_hit", hits),
        ("numa_miss", n * 311 + 17),
        ("numa_foreign", (n * 311 + 17) // 2),
        ("numa_interleave", 1100 + n),
        ("numa_local", hits - n * 311 - 17),
        ("numa_other", n * 311 + 17),
        ("nr_inactive_anon", (total - free) // 64),
        ("nr_active_anon", (total - free) // 32),
        ("nr_anon_pages", (total - free) // 24),
        ("nr_mapped", (total - free) // 200),
        ("nr_file_pages", (total - free) // 9),
        ("nr_dirty", 0),
        ("nr_writeback", 0),
        ("nr_shmem", 0),
        ("nr_anon_transparent_hugepages", 0),
    ]
    return "".join("%s %d\n" % kv for kv in keys)


def proc_meminfo(total, free, ghp, default_kb):
    used = total - free
    t, f, s = ghp.get(default_kb, (0, 0, 0))
    hugetlb = sum(size * tot for size, (tot, _, _) in ghp.items())
    rows = [
        ("MemTotal", total),
        ("MemFree", free),
        ("MemAvailable", free + used // 3),
        ("Buffers", used // 100),
        ("Cached", used // 4),
        ("SwapCached", 0),
        ("Active", used // 3),
        ("Inactive", used // 4),
        ("Active(anon)", used // 8),
        ("Inactive(anon)", used // 16),
        ("Active(file)", used // 4),
        ("Inactive(file)", used // 5),
        ("Unevictable", 0),
        ("Mlocked", 0),
        ("SwapTotal", 0),
        ("SwapFree", 0),
        ("Zswap", 0),
        ("Zswapped", 0),
        ("Dirty", used // 1000),
        ("Writeback", 0),
        ("AnonPages", used // 6),
        ("Mapped", used // 50),
        ("Shmem", used // 100),
        ("KReclaimable", used // 40),
        ("Slab", used // 25),
        ("SReclaimable", used // 40),
        ("SUnreclaim", used // 25 - used // 40),
        ("KernelStack", used // 2000),
        ("PageTables", used // 500),
        ("SecPageTables", 0),
        ("NFS_Unstable", 0),
        ("Bounce", 0),
        ("WritebackTmp", 0),
        ("CommitLimit", total // 2),
        ("Committed_AS", used // 2),
        ("VmallocTotal", 34359738367),
        ("VmallocUsed", 14220),
        ("VmallocChunk", 0),
        ("Percpu", 712),
        ("AnonHugePages", 0),
        ("ShmemHugePages", 0),
        ("ShmemPmdMapped", 0),
        ("FileHugePages", 0),
        ("FilePmdMapped", 0),
    ]
    lines = [kb_line(k, v) for k, v in rows]
    lines += [
        "%-16s%8d" % ("HugePages_Total:", t),
        "%-16s%8d" % ("HugePages_Free:", f),
        "%-16s%8d" % ("HugePages_Rsvd:", 0),
        "%-16s%8d" % ("HugePages_Surp:", s),
        kb_line("Hugepagesize", default_kb),
        kb_line("Hugetlb", hugetlb),
    ]
    return "\n".join(lines) + "\n"


def proc_status(m, r):
    cpus, mems = r["allowed_cpus"], r["allowed_mems"]
    rows = [
        ("Name", "python3"),
        ("Umask", "0022"),
        ("State", "R (running)"),
        ("Tgid", "4242"),
        ("Ngid", "0"),
        ("Pid", "4242"),
        ("PPid", "4200"),
        ("TracerPid", "0"),
        ("Uid", "1000\t1000\t1000\t1000"),
        ("Gid", "1000\t1000\t1000\t1000"),
        ("FDSize", "64"),
        ("Groups", "1000 "),
        ("NStgid", "4242"),
        ("NSpid", "4242"),
        ("NSpgid", "4200"),
        ("NSsid", "4100"),
        ("VmPeak", "   27572 kB"),
        ("VmSize", "   27572 kB"),
        ("VmLck", "       0 kB"),
        ("VmPin", "       0 kB"),
        ("VmHWM", "   10240 kB"),
        ("VmRSS", "   10240 kB"),
        ("RssAnon", "    4096 kB"),
        ("RssFile", "    6144 kB"),
        ("RssShmem", "       0 kB"),
        ("VmData", "    5120 kB"),
        ("VmStk", "     132 kB"),
        ("VmExe", "    2816 kB"),
        ("VmLib", "    3584 kB"),
        ("VmPTE", "      68 kB"),
        ("VmSwap", "       0 kB"),
        ("HugetlbPages", "       0 kB"),
        ("CoreDumping", "0"),
        ("THP_enabled", "1"),
        ("Threads", "1"),
        ("SigQ", "0/1031224"),
        ("SigPnd", "0000000000000000"),
        ("ShdPnd", "0000000000000000"),
        ("SigBlk", "0000000000000000"),
        ("SigIgn", "0000000001001000"),
        ("SigCgt", "0000000100000002"),
        ("CapInh", "0000000000000000"),
        ("CapPrm", "0000000000000000"),
        ("CapEff", "0000000000000000"),
        ("CapBnd", "000001ffffffffff"),
        ("CapAmb", "0000000000000000"),
        ("NoNewPrivs", "0"),
        ("Seccomp", "0"),
        ("Seccomp_filters", "0"),
        ("Speculation_Store_Bypass", "thread vulnerable"),
        ("SpeculationIndirectBranch", "conditional enabled"),
        ("Cpus_allowed", fmt_mask(cpus, r["mask_bits"])),
        ("Cpus_allowed_list", fmt_list(cpus)),
        ("Mems_allowed", fmt_mask(mems, m["max_numnodes"])),
        ("Mems_allowed_list", fmt_list(mems)),
        ("voluntary_ctxt_switches", "12"),
        ("nonvoluntary_ctxt_switches", "3"),
    ]
    return "".join("{}:\t{}\n".format(*kv) for kv in rows)


def nvidia_information(dev, minor):
    return (
        "Model: \t\t NVIDIA %s\n"
        "IRQ:   \t\t %d\n"
        "GPU UUID: \t GPU-%08x-%04x-%04x-%04x-%012x\n"
        "Video BIOS: \t 96.00.99.00.01\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 52 bits\n"
        "DMA Mask: \t 0xfffffffffffff\n"
        "Bus Location: \t %s\n"
        "Device Minor: \t %d\n"
        "GPU Firmware: \t 550.127.05\n"
        "GPU Excluded:\t No\n"
        % (
            {0x2330: "H100 80GB HBM3", 0x2342: "GH200 480GB"}.get(dev["device"], "GPU"),
            200 + minor,
            0x5EED0000 + minor,
            minor,
            0x1000 + minor,
            0x2000,
            minor,
            dev["address"],
            minor,
        )
    )


def build_tree(m, r, root):
    t = Tree(root)
    on = set(r["online"])
    bits = r["mask_bits"]
    ND = "sys/devices/system/node"
    if m["node_dir"]:

        def nodefile(rel, text):
            t.line(f"{ND}/{rel}", text, nul=rel.split("/")[-1] in m["nul_files"])

        nodefile("online", fmt_list(r["online_nodes"]))
        nodefile("possible", fmt_list(r["possible_nodes"]))
        nodefile("has_cpu", fmt_list(r["with_cpus"]))
        nodefile("has_memory", fmt_list(r["with_mem"]))
        nodefile("has_normal_memory", fmt_list(r["with_normal"]))
        if m["node_cpulist"]:
            nodefile("has_generic_initiator", "")
        for n in r["online_nodes"]:
            nd = m["nodes"][n]
            d = "node%d" % n
            if m["node_cpulist"]:
                nodefile(d + "/cpulist", fmt_list(r["node_cpus"][n]))
            nodefile(d + "/cpumap", fmt_mask(r["node_cpus"][n], bits))
            t.put(
                f"{ND}/{d}/meminfo",
                node_meminfo(
                    n,
                    nd["total"],
                    nd["free"],
                    nd["hugepages"].get(m["default_hugepage_kb"], (0, 0, 0)),
                )
                if m["node_cpulist"]
                else old_node_meminfo(n, nd["total"], nd["free"]),
            )
            nodefile(
                d + "/distance", " ".join(str(m["distance"][(n, b)]) for b in r["online_nodes"])
            )
            t.put(f"{ND}/{d}/numastat", numastat(n, nd["total"]))
            if m["node_cpulist"]:
                t.put(f"{ND}/{d}/vmstat", node_vmstat(n, nd["total"], nd["free"]))
            if m["node_hugepages"]:
                for size, (tot, free, sur) in sorted(nd["hugepages"].items()):
                    hd = "%s/%s/hugepages/hugepages-%dkB" % (ND, d, size)
                    t.line(hd + "/nr_hugepages", str(tot))
                    t.line(hd + "/free_hugepages", str(free))
                    t.line(hd + "/surplus_hugepages", str(sur))

    CD = "sys/devices/system/cpu"
    t.line(CD + "/possible", fmt_list(r["possible"]))
    t.line(CD + "/present", fmt_list(r["present"]))
    t.line(CD + "/online", fmt_list(r["online"]))
    t.line(CD + "/offline", fmt_list(set(r["possible"]) - on))
    nr_cpus = 8192 if m["arch"] == "x86_64" else 4096
    t.line(CD + "/kernel_max", str(max(r["nr_cpu_ids"], nr_cpus) - 1))
    for c in r["present"]:
        d = "%s/cpu%d" % (CD, c)
        if c != 0 or m["cpu0_online_file"]:
            t.line(d + "/online", "1" if c in on else "0")
        if c not in on:
            continue
        tp = m["topo"][c]
        sib = sorted(set(tp["siblings"]) & on)
        t.line(d + "/topology/core_id", str(tp["core"]))
        t.line(d + "/topology/physical_package_id", str(tp["package"]))
        t.line(d + "/topology/thread_siblings_list", fmt_list(sib))
        if m["core_cpus_list"]:
            t.line(d + "/topology/core_cpus_list", fmt_list(sib))
        for i, (level, typ, shared) in enumerate(tp["caches"]):
            cd = "%s/cache/index%d" % (d, i)
            sh = sorted(set(shared) & on)
            t.line(cd + "/level", str(level))
            t.line(cd + "/type", typ)
            t.line(cd + "/shared_cpu_list", fmt_list(sh))

    PD = "sys/bus/pci/devices"
    minor = 0
    for dev in sorted(m["pci"], key=lambda x: x["address"]):
        d = "{}/{}".format(PD, dev["address"])
        local = pci_local(m, r, dev)
        t.line(d + "/vendor", "0x{:04x}".format(dev["vendor"]))
        t.line(d + "/device", "0x{:04x}".format(dev["device"]))
        t.line(d + "/class", "0x{:06x}".format(dev["class"]))
        t.line(d + "/numa_node", str(dev["numa_node"]))
        if m["pci_cpulist"]:
            t.line(d + "/local_cpulist", fmt_list(local))
        t.line(d + "/local_cpus", fmt_mask(local, bits))
        if m["nvidia_proc"] and is_gpu(dev) and dev["vendor"] == 0x10DE:
            t.put(
                "proc/driver/nvidia/gpus/{}/information".format(dev["address"]),
                nvidia_information(dev, minor),
            )
            minor += 1

    if m["thp"] is not None:
        modes = ["always", "madvise", "never"]
        t.line(
            "sys/kernel/mm/transparent_hugepage/enabled",
            " ".join(f"[{x}]" if x == m["thp"] else x for x in modes),
        )
        t.line(
            "sys/kernel/mm/transparent_hugepage/defrag",
            "always defer defer+madvise [madvise] never",
        )
    for size, (tot, free, sur) in sorted(r["ghp"].items()):
        hd = "sys/kernel/mm/hugepages/hugepages-%dkB" % size
        t.line(hd + "/nr_hugepages", str(tot))
        t.line(hd + "/free_hugepages", str(free))
        t.line(hd + "/surplus_hugepages", str(sur))
        t.line(hd + "/resv_hugepages", "0")
        t.line(hd + "/nr_overcommit_hugepages", "0")
    if m["weighted_interleave"]:
        for n in r["online_nodes"]:
            t.line("sys/kernel/mm/mempolicy/weighted_interleave/node%d" % n, "1")

    for tier, ns in sorted((m["memory_tiers"] or {}).items()):
        t.line("sys/devices/virtual/memory_tiering/memory_tier%d/nodelist" % tier, fmt_list(ns))
    for n, (rbw, wbw, rlat, wlat, inits) in sorted(m["hmat"].items()):
        d = "%s/node%d/access0/initiators" % (ND, n)
        for name, v in (
            ("read_bandwidth", rbw),
            ("write_bandwidth", wbw),
            ("read_latency", rlat),
            ("write_latency", wlat),
        ):
            t.line("%s/%s" % (d, name), str(v))
        for i in inits:  # the kernel's links to the initiator nodes
            t.link("%s/node%d" % (d, i), "../../../node%d" % i)

    if m["numa_balancing"] is not None:
        t.line("proc/sys/kernel/numa_balancing", str(m["numa_balancing"]))
    total = m["proc_total"] or sum(m["nodes"][n]["total"] for n in r["online_nodes"])
    free = sum(m["nodes"][n]["free"] for n in r["online_nodes"])
    t.put("proc/meminfo", proc_meminfo(total, free, r["ghp"], m["default_hugepage_kb"]))
    t.put("proc/self/status", proc_status(m, r))
    t.line("proc/sys/kernel/osrelease", m["kernel"])
    t.line("proc/sys/kernel/ostype", "Linux")
    if tuple(int(x) for x in m["kernel"].split(".")[:2]) >= (6, 1):
        t.line("proc/sys/kernel/arch", m["arch"])  # uname -m, since Linux 6.1
    t.line(
        "proc/version",
        "Linux version {} (synthetic fixture from tools/make_fixtures.py)".format(m["kernel"]),
    )
    return t


def source_md(m, r):
    return (
        "# Source\n\n"
        "Synthetic: written by `python3 tools/make_fixtures.py %s` from the machine "
        "description in that script, which also computes `expected.json` (without "
        "numa_utils and without reading this tree back).\n\n"
        "## What it models\n\n%s\n\n"
        "## Shape\n\n"
        "- arch %s, kernel %s (as printed in proc/sys/kernel/osrelease)\n"
        "- CPUs possible %s, present %s, online %s\n"
        "- nodes online %s, possible %s, with CPUs %s, with memory %s\n"
        "- process cpuset: Cpus_allowed_list %s, Mems_allowed_list %s\n"
        "- GPUs (expected): %d\n"
        % (
            m["name"],
            m["source"],
            m["arch"],
            m["kernel"],
            fmt_list(r["possible"]),
            fmt_list(r["present"]),
            fmt_list(r["online"]),
            fmt_list(r["online_nodes"]) if m["node_dir"] else "(no node directory)",
            fmt_list(r["possible_nodes"]) if m["node_dir"] else "-",
            fmt_list(r["with_cpus"]) if m["node_dir"] else "-",
            fmt_list(r["with_mem"]) if m["node_dir"] else "-",
            fmt_list(r["allowed_cpus"]),
            fmt_list(r["allowed_mems"]),
            sum(1 for d in m["pci"] if is_gpu(d)),
        )
    )


def render(m):
    """All files of one fixture: {relative path: bytes}."""
    r = resolve(m)
    tree = build_tree(m, r, None)
    files = {"root/" + k: v for k, v in tree.files.items()}
    files.update({"root/" + k: ("symlink", v) for k, v in tree.links.items()})
    files["expected.json"] = (json.dumps(expected(m, r), indent=1) + "\n").encode()
    files["SOURCE.md"] = source_md(m, r).encode()
    return files


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="fixtures to write (default: all)")
    ap.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if any fixture on disk differs"
    )
    ap.add_argument("--out", default=FAKE, help="fake_sysfs folder (default: the repo's)")
    args = ap.parse_args(argv)
    machines = [f() for f in MACHINES]
    known = [m["name"] for m in machines]
    for n in args.names:
        if n not in known:
            ap.error("unknown fixture {!r} (known: {})".format(n, ", ".join(known)))
    bad = 0
    for m in machines:
        if args.names and m["name"] not in args.names:
            continue
        files = render(m)
        data = gather.pack_text(files)
        path = os.path.join(args.out, m["name"] + ".txt")
        if args.check:
            try:
                with open(path, "rb") as fh:
                    same = fh.read() == data
            except OSError:
                same = False
            if not same:
                print("differs: {}".format(m["name"]))
                bad += 1
            continue
        with open(path + ".part", "wb") as fh:
            fh.write(data)
        os.replace(path + ".part", path)
        print("wrote %s (%d files)" % (path, len(files)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
