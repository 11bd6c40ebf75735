"""python -m bench (all | prefault | maps | topology | import | hot | dma | page_modes | pool)
[options]"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import common
from .common import Section

BENCHES = ("prefault", "maps", "maps_file", "topology", "import", "hot")
TITLES = {
    "prefault": "1. Prefault of a shared region",
    "maps": "2. numa_maps",
    "maps_file": "2b. maps --file on a large numa_maps",
    "topology": "3. Topology of large generated trees",
    "import": "4. Import time and footprint",
    "hot": "6. Hot commands' own work",
    "dma": "5. Pinned host buffers: H2D/D2H by placement",
    "page_modes": "1b. Prefault by page mode against the physical floor",
    "pool": "7. Pinned pool: alloc/free against a plain free list and torch",
}


def _rounds(args: argparse.Namespace, full: int, quick: int) -> int:
    if args.rounds:
        return int(args.rounds)
    return quick if args.quick else full


def _run_one(name: str, args: argparse.Namespace) -> Section:
    if name == "prefault":
        from . import prefault

        size = common.parse_size(args.size) if args.size else (64 << 20 if args.quick else 4 << 30)
        return prefault.run(size=size, rounds=_rounds(args, 5, 3), kind=args.kind, quick=args.quick)
    if name == "page_modes":
        from . import prefault

        size = common.parse_size(args.size) if args.size else (64 << 20 if args.quick else 1 << 30)
        return prefault.modes(size=size, rounds=_rounds(args, 5, 3))
    if name == "maps":
        from . import maps

        return maps.run(
            vmas=args.vmas or (10000 if args.quick else 60000), rounds=_rounds(args, 7, 3)
        )
    if name == "maps_file":
        from . import maps

        return maps.file_case(small=(1 if args.quick else 20) * 10**6, rounds=_rounds(args, 3, 2))
    if name == "topology":
        from . import topology

        return topology.run(rounds=_rounds(args, 9, 2), quick=args.quick)
    if name == "import":
        from . import imports

        return imports.run(rounds=_rounds(args, 40, 5))
    if name == "hot":
        from . import hot

        return hot.run(
            vmas=args.vmas or (2000 if args.quick else 60000),
            rounds=_rounds(args, 9, 2),
            snapshot=args.hwloc_snapshot,
            quick=args.quick,
            baseline=args.baseline,
        )
    if name == "dma":
        from . import dma

        size = common.parse_size(args.size) if args.size else (64 << 20 if args.quick else 1 << 30)
        return dma.run(size=size, rounds=_rounds(args, 6, 2))
    if name == "pool":
        from . import pool

        return pool.run(blocks=200 if args.quick else 2000, rounds=_rounds(args, 7, 2))
    raise ValueError(name)


def _guarded(name: str, args: argparse.Namespace) -> Section:
    t0 = time.perf_counter()
    try:
        sec = _run_one(name, args)
    except common.Skip as e:
        sec = Section(name, TITLES[name]).skip(str(e))
    except Exception as e:  # one broken benchmark must not lose the others
        traceback.print_exc()
        sec = Section(name, TITLES[name]).skip(f"error: {e!r}")
        sec.status = "error"
    sec.seconds = time.perf_counter() - t0
    return sec


def _portable(argv: Sequence[str]) -> List[str]:
    """The command line as it goes into reports: no machine-specific paths."""
    out: List[str] = []
    hide = False
    for a in argv:
        if hide:
            a, hide = "DIR", False
        elif a in ("--out", "--hwloc-snapshot", "--baseline"):
            hide = True
        elif a.startswith(("--out=", "--hwloc-snapshot=", "--baseline=")):
            a = a.split("=", 1)[0] + "=DIR"
        out.append(a)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument(
        "what",
        choices=("all",) + BENCHES + ("dma", "page_modes", "pool"),
        help="all = prefault, maps, maps_file, topology, import and hot (not "
        "dma, not page_modes: it reserves huge pages as root)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: small sizes, 2-5 rounds")
    p.add_argument(
        "--size",
        default=None,
        help="prefault region size, e.g. 4G (default 4G, --quick 64M); "
        "for dma the pinned buffer size (default 1G)",
    )
    p.add_argument(
        "--kind",
        choices=("sysv", "posix"),
        default="sysv",
        help="shared memory kind for prefault (default sysv)",
    )
    p.add_argument("--rounds", type=int, default=None, help="rounds per contender")
    p.add_argument(
        "--vmas",
        type=int,
        default=None,
        help="VMAs in the numa_maps helper (default 60000, --quick 10000)",
    )
    p.add_argument(
        "--hwloc-snapshot",
        default=None,
        metavar="PATH",
        help="hwloc's 256ia64-64n2s2c saved machine (.tar.bz2 or folder) for "
        "`hot` (default $NUMA_UTILS_BENCH_HWLOC_SNAPSHOT; without it a "
        "generated tree of its shape stands in)",
    )
    p.add_argument(
        "--baseline",
        default=None,
        metavar="DIR",
        help="`hot`: another checkout (git worktree add DIR COMMIT) whose maps PID and "
        "import floor alternate with this one's: before and after in one run",
    )
    p.add_argument(
        "--out", default=None, help="output folder for JSON and Markdown (default bench/results)"
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    names: List[str] = list(BENCHES) if args.what == "all" else [args.what]
    t0 = time.perf_counter()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    sections: List[Dict[str, Any]] = []
    cmd = "python -m bench " + " ".join(_portable(argv if argv is not None else sys.argv[1:]))
    out = args.out or common.DEFAULT_OUT
    stem = args.what + ("-quick" if args.quick else "")
    report: Dict[str, Any] = {}
    write: Callable[[], Any] = lambda: common.write_report(report, out, stem)  # noqa: E731
    machine = common.machine_info()
    for name in names:
        common.log(f"== {name}")
        sec = _guarded(name, args)
        common.log(
            "== {}: {} in {:.1f} s{}".format(
                name, sec.status, sec.seconds, (f" ({sec.reason})") if sec.reason else ""
            )
        )
        sections.append(sec.to_json())
        report.clear()
        report.update(
            command=cmd.strip(),
            started=started,
            machine=machine,
            seconds=time.perf_counter() - t0,
            sections=sections,
            loadavg_end=" ".join(f"{x:.2f}" for x in os.getloadavg()),
        )
        write()  # after each benchmark: a crash later keeps what was measured
    jpath, mpath = write()
    common.log(f"wrote {os.path.relpath(jpath)} and {os.path.relpath(mpath)}")
    return 1 if any(s["status"] == "error" for s in sections) else 0


if __name__ == "__main__":
    raise SystemExit(main())
