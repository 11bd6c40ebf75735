"""Per-extent cost of SharedRegion.create/attach against the bare mbind calls.

    unshare --ipc --mount sh -c 'mount -t tmpfs none /dev/shm &&
        python -m bench.extents --baseline REV [--size 64M] [--block 4K] [--rounds 5]'

Each contender runs in its own child Python, in alternating order (common.alternate):
this checkout's numa_utils and, with ``--baseline REV``, numa_utils.py as it was at
git revision REV (or the numa_utils.py file REV names), copied to a temporary folder,
so before and after are measured side by side in one run.  A child creates a
``blocks:BLOCK:bind:NODE`` region of SIZE (no prefault), attaches it, and times
each; "bare mbind" is the same number of mbind calls on an anonymous mapping
through numa_utils.mbind.  Medians are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

from . import common

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numa_utils as nu, numa_utils_regions as nur, numa_utils_threads as nut
size, block = int(sys.argv[2]), int(sys.argv[3])
node = min(nu.read_topology().mems_allowed)
lay = f"blocks:{block}:bind:{node}"
t0 = time.perf_counter()
r = nur.SharedRegion.create("bench-extents", size, layout=lay, prefault=False, kind="posix")
t1 = time.perf_counter()
a = nur.SharedRegion.attach("bench-extents", kind="posix")
t2 = time.perf_counter()
extents = len(a.layout)
a.close()
r.destroy()
import mmap
m = mmap.mmap(-1, size)
addr = nu.buffer_range(m)[0]
t3 = time.perf_counter()
for off in range(0, size, block):
    nu.mbind(addr + off, block, nu.Mode.BIND, {node})
t4 = time.perf_counter()
del addr
m.close()
print(json.dumps({"create": t1 - t0, "attach": t2 - t1, "bare_mbind": t4 - t3, "extents": extents}))
"""


def _contender(root: str, size: int, block: int) -> common.Sample:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, root, str(size), str(block)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise common.Skip(f"child exited {out.returncode}: {out.stderr.strip()[-300:]}")
    sample: common.Sample = json.loads(out.stdout.strip().splitlines()[-1])
    return sample


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.extents", description=__doc__)
    p.add_argument(
        "--baseline",
        action="append",
        help="git revision (or a numa_utils.py file) to compare against; may be repeated",
    )
    p.add_argument("--size", default="64M")
    p.add_argument("--block", default="4K")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    size, block = common.parse_size(args.size), common.parse_size(args.block)
    roots: List[Tuple[str, str]] = [("this checkout", common.ROOT)]
    with tempfile.TemporaryDirectory() as tmp:
        for number, base in enumerate(args.baseline or []):
            if os.path.isfile(base):
                with open(base, "rb") as f:
                    text = f.read()
            else:
                text = subprocess.run(
                    ["git", "-C", common.ROOT, "show", f"{base}:numa_utils.py"],
                    capture_output=True,
                    check=True,
                ).stdout
            folder = os.path.join(tmp, str(number))
            os.mkdir(folder)
            with open(os.path.join(folder, "numa_utils.py"), "wb") as f:
                f.write(text)
            roots.insert(number, (f"baseline {os.path.basename(base)}", folder))
        contenders = [
            (name, lambda root=root: _contender(root, size, block)) for name, root in roots
        ]
        samples, skipped = common.alternate(contenders, args.rounds)
    print(f"{size} bytes in {block}-byte extents, {args.rounds} rounds, medians (s):")
    print(f"{'contender':<28} {'create':>8} {'attach':>8} {'bare mbind':>11} {'extents':>8}")
    for name, runs in samples.items():
        med: Dict[str, float] = {
            k: common.summary(runs, k).get("median", float("nan"))
            for k in ("create", "attach", "bare_mbind", "extents")
        }
        print(
            f"{name:<28} {med['create']:8.3f} {med['attach']:8.3f} "
            f"{med['bare_mbind']:11.3f} {med['extents']:8.0f}"
        )
    for name, why in skipped.items():
        print(f"{name}: skipped ({why})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
