"""Placement by thread (issue 40): a vLLM-shaped layout made and prefaulted against a
plain prefault of the same size, and against a policy per extent (mbind) at 16,384
extents.

    python -m bench.placement [--cells 100000] [--cell 64K] [--extents 16384] [--rounds 5]

Each contender runs in a child Python (common.alternate, alternating order) on a SysV
segment it makes and removes:

- "plain": SharedRegion.create(size, prefault=True): one range prefaulted;
- "by thread": cell i on rank i % 2's place, each faulted by threads placed there, one
  call per cell (what a region past vm.max_map_count or in a container without
  CAP_SYS_NICE does).  With two memory nodes, SharedRegion.create(layout=
  "blocks:CELL:bind:A/B", prefault=True) (more cells than vm.max_map_count: placed by
  thread); on a one-node machine the region is made without prefault and then
  prefault(extents=cells) with bind:0 and prefer:0 standing in for the ranks' nodes
  (two places, so that no two neighbouring cells are one range);
- at ``--extents`` extents of ``--extent-size`` (16,384 of 4 KiB, as bench.extents):
  "plain", "mbind per extent" (the region's policy path: one _apply_policy per extent,
  then its prefault), "by thread", and a bare loop of numa_utils.mbind calls (no
  prefault); what placing costs beyond the pages is each less plain (and the bare loop).

Medians of the whole operation (creation to the last page) are printed with the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Dict, List, Tuple

from . import common

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numa_utils as nu, numa_utils_regions as nur
what, cells, cell = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
size = cells * cell
mem = sorted(nu.read_topology().usable_memory_nodes)
places = [("bind", {mem[0]}), ("prefer", {mem[0]})]  # one node: two places on it
if len(mem) > 1:
    places = [("bind", {mem[0]}), ("bind", {mem[1]})]
cells_of = [(i * cell, cell, *places[i % 2]) for i in range(cells)]
out = {}
t0 = time.perf_counter()
if what == "bare":
    import mmap
    m = mmap.mmap(-1, size)
    addr = nu.buffer_range(m)[0]
    t0 = time.perf_counter()
    for off, n, policy, nodes in cells_of:
        nu.mbind(addr + off, n, nu._mode_of(policy), nodes)
    out["seconds"] = time.perf_counter() - t0
    del addr
    m.close()
else:
    lay = None  # two nodes: the region's own layout, placed by thread past the map count
    if what == "thread" and len(mem) > 1 and cells > 65530:
        lay = f"blocks:{cell}:bind:{mem[0]}/{mem[1]}"
    plain = what == "plain" or lay is not None
    r = nur.SharedRegion.create(
        "bench-placement", size, prefault=plain, layout=lay, existing="replace"
    )
    if what == "thread" and lay is None:
        res = nu.prefault(r.address, size, extents=cells_of, shared=True)
        out["threads"] = res["threads"]
    if what == "mbind":
        memory = nu._memory_nodes(nu.default_backend())  # read once, as a region does
        for off, n, policy, nodes in cells_of:
            at = r.address + off
            nu._apply_policy(at, n, mode=policy, nodes=nodes, count_resident=False, memory=memory)
        nu.prefault(r.address, size, extents=cells_of, shared=True)
    out["seconds"] = time.perf_counter() - t0
    r.destroy()
print(json.dumps(out))
"""


def _contender(what: str, cells: int, cell: int) -> common.Sample:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, common.ROOT, what, str(cells), str(cell)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        raise common.Skip(f"child exited {out.returncode}: {out.stderr.strip()[-300:]}")
    sample: common.Sample = json.loads(out.stdout.strip().splitlines()[-1])
    return sample


def _report(
    title: str, samples: Dict[str, List[common.Sample]], pairs: List[Tuple[str, str]]
) -> None:
    print(title)
    for name, runs in samples.items():
        med = common.summary(runs, "seconds")
        print(f"  {name:<22} median {med.get('median', float('nan')):8.3f} s  (n={med['n']})")
    for a, b in pairs:
        r = common.ratio(samples[a], samples[b], "seconds")
        print(
            f"  {a} / {b}: ratio of medians {r['ratio_of_medians']:.2f}, "
            f"median of round ratios {r['median_round_ratio']:.2f}"
        )


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__)
    p.add_argument("--cells", type=int, default=100_000)
    p.add_argument("--cell", default="64K")
    p.add_argument("--extents", type=int, default=16_384)
    p.add_argument("--extent-size", default="4K")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    cell = common.parse_size(args.cell)
    size = args.cells * cell
    common.warm_bytecode()
    big = [
        (name, lambda what=what: _contender(what, args.cells, cell))
        for name, what in (("plain", "plain"), ("by thread", "thread"))
    ]
    samples, skipped = common.alternate(big, args.rounds)
    _report(
        f"{args.cells} cells of {common.fmt_size(cell)} ({common.fmt_size(size)}):",
        samples,
        [("by thread", "plain")],
    )
    small = common.parse_size(args.extent_size)
    few = [
        (name, lambda what=what: _contender(what, args.extents, small))
        for name, what in (
            ("plain", "plain"),
            ("mbind per extent", "mbind"),
            ("by thread", "thread"),
            ("bare mbind", "bare"),
        )
    ]
    samples2, skipped2 = common.alternate(few, args.rounds)
    _report(
        f"{args.extents} extents of {common.fmt_size(small)}:",
        samples2,
        [
            ("by thread", "mbind per extent"),
            ("mbind per extent", "bare mbind"),
            ("by thread", "bare mbind"),
        ],
    )
    # What placing costs beyond faulting the pages: each less the plain prefault, per
    # round, against the bare mbind loop.
    for name in ("mbind per extent", "by thread"):
        extra = [
            (a["seconds"] - b["seconds"], c["seconds"])
            for a, b, c in zip(samples2[name], samples2["plain"], samples2["bare mbind"])
        ]
        cost = statistics.median(e for e, _ in extra)
        times = statistics.median(e / bare for e, bare in extra)
        print(f"  {name} less plain: median {cost:+.3f} s, {times:.1f}x the bare mbind loop")
    for name, why in {**skipped, **skipped2}.items():
        print(f"{name}: skipped ({why})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
