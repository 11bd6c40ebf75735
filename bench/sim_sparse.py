"""The simulator's sparse regions: create a region of an engine's real size, then
prefault a slice of it, on a saved two-node machine.

    python -m bench.sim_sparse [--size 32G] [--slice 256M] [--rounds 5]

Each round is a fresh SimulatedBackend: SharedRegion.create (kind sysv, one bind
extent and one interleave extent, no prefault), numa_utils.prefault of ``slice``
in each extent, and one numa_maps render.  Medians are printed, with the process's
RSS growth over the whole run (the region is larger than many hosts' memory: only
the record and the model's runs take any).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from . import common


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sim_sparse", description=__doc__)
    p.add_argument("--size", default="32G")
    p.add_argument("--slice", default="256M")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    size, part = common.parse_size(args.size), common.parse_size(args.slice)
    sys.path.insert(0, common.ROOT)
    import numa_utils as nu
    import numa_utils_regions as nur
    import numa_utils_sim as nusim

    root = os.path.join(common.ROOT, "fake_sysfs", "qemu-x86_64-two-node.txt")
    half = size // 2
    layout = f"{half >> 20}M:bind:1;{half >> 20}M:interleave:0-1"
    times: dict = {"create": [], "prefault": [], "numa_maps": []}
    rss0 = _rss_kib()
    for _ in range(args.rounds):
        s = nusim.SimulatedBackend(root, free_kb={0: size >> 10, 1: size >> 10})
        t0 = time.perf_counter()
        r = nur.SharedRegion.create("bench", size, layout=layout, prefault=False, backend=s)
        t1 = time.perf_counter()
        nu.prefault(r.address + part, part, backend=s)
        nu.prefault(r.address + half + part, part, backend=s)
        t2 = time.perf_counter()
        s.render_numa_maps()
        t3 = time.perf_counter()
        r.remove()
        r.close()
        times["create"].append(t1 - t0)
        times["prefault"].append(t2 - t1)
        times["numa_maps"].append(t3 - t2)
    rss = _rss_kib() - rss0
    print(f"region {args.size}, prefault 2 x {args.slice}, {args.rounds} rounds (medians)")
    for what, values in times.items():
        print(f"  {what:10s} {statistics.median(values) * 1000:9.1f} ms")
    print(f"  RSS growth {rss / 1024:9.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
