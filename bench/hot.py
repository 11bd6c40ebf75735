"""Benchmark 6: the hot commands' own work, against the reference tools.

The interpreter's own start is several times ``lstopo-no-graphics``' whole run on a
64-node tree, so a whole-process ratio mostly measures Python.  A command's OWN work
is its wall time less the same interpreter running ``import numa_utils`` (the floor
every command pays); the reference tool is timed as a whole run.  All contenders
alternate in one benchmark, and the own work is taken round by round (the floor of
the same round), so a drifting machine moves both sides:

- ``python -m numa_utils maps PID`` on a process with 60,000 VMAs (vma_helper.py)
  against ``numastat -p PID``: target own work <= 1.0x;
- ``python -m numa_utils status --root TREE`` against ``lstopo-no-graphics`` with
  ``HWLOC_FSROOT=TREE`` on hwloc's saved 256-CPU, 64-node machine
  (``tests/hwloc/linux/256ia64-64n2s2c.tar.bz2`` in https://github.com/open-mpi/hwloc,
  given with ``--hwloc-snapshot`` or NUMA_UTILS_BENCH_HWLOC_SNAPSHOT, a .tar.bz2 or
  its unpacked folder): target own work <= 2x.  Without the snapshot a generated
  tree of the same shape stands in and the target is not judged.

``--baseline DIR`` (another checkout, e.g. ``git worktree add DIR COMMIT``) adds that
checkout's import floor and ``maps PID`` to the same alternation: before and after
side by side, on the same helper and the same load.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from typing import Callable, List, Optional, Tuple

from . import common, gen_topology
from .common import Sample, Section, Skip, whole_process
from .maps import REGION, Helper

SNAPSHOT_ENV = "NUMA_UTILS_BENCH_HWLOC_SNAPSHOT"
SNAPSHOT_NAME = "256ia64-64n2s2c"
SNAPSHOT_HINT = (
    f"hwloc's {SNAPSHOT_NAME} snapshot not given (--hwloc-snapshot PATH or "
    f"{SNAPSHOT_ENV}: tests/hwloc/linux/{SNAPSHOT_NAME}.tar.bz2 from "
    "https://github.com/open-mpi/hwloc)"
)


def own_work(
    cmd: List[Optional[Sample]], floor: List[Optional[Sample]], key: str = "s"
) -> List[Optional[Sample]]:
    """Per round: the command's ``key`` less the import floor's of the same round
    (None where either is missing)."""
    return [None if a is None or f is None else {key: a[key] - f[key]} for a, f in zip(cmd, floor)]


def _tree_root(folder: str) -> str:
    """The folder holding sys/ (and proc/): ``folder`` or its single subfolder."""
    if os.path.isdir(os.path.join(folder, "sys")):
        return folder
    subs = [os.path.join(folder, d) for d in sorted(os.listdir(folder))]
    subs = [d for d in subs if os.path.isdir(os.path.join(d, "sys"))]
    if len(subs) != 1:
        raise Skip(f"no saved machine (a folder with sys/) in {folder}")
    return subs[0]


def snapshot_tree(path: str, scratch: str) -> str:
    """hwloc's snapshot as a folder: ``path`` itself, or its archive unpacked (data
    only: no links out, no devices) under ``scratch``."""
    if os.path.isdir(path):
        return _tree_root(path)
    if not tarfile.is_tarfile(path):
        raise Skip(f"{path}: neither a folder nor a tar archive")
    dest = os.path.join(scratch, "snapshot")
    with tarfile.open(path) as tf:
        if hasattr(tarfile, "data_filter"):
            tf.extractall(dest, filter="data")
        else:
            for m in tf.getmembers():
                if (
                    m.name.startswith("/")
                    or ".." in m.name.split("/")
                    or not (m.isdir() or m.isfile() or m.issym())
                ):
                    raise Skip(f"{path}: unexpected member {m.name!r}")
            tf.extractall(dest)
    return _tree_root(dest)


def run(
    *,
    vmas: int,
    rounds: int,
    snapshot: Optional[str] = None,
    quick: bool = False,
    baseline: Optional[str] = None,
    log: Callable[[str], None] = common.log,
) -> Section:
    sec = Section("hot", "6. Hot commands' own work (less `import numa_utils`)")
    snapshot = snapshot or os.environ.get(SNAPSHOT_ENV) or None
    env = common.child_env()
    scratch = tempfile.mkdtemp(prefix="nubench-hot-")
    helper = None
    try:
        if snapshot:
            tree = snapshot_tree(snapshot, scratch)
            tree_label = f"hwloc's {os.path.basename(tree)}"
        else:
            cpus, nodes = (32, 8) if quick else (256, 64)
            tree = os.path.join(scratch, "generated")
            gen_topology.write_tree(tree, cpus, nodes, 0)
            tree_label = f"generated {cpus} CPUs / {nodes} nodes (hwloc's shape)"
            sec.notes.append(
                SNAPSHOT_HINT + f"; a {tree_label} tree stands in and the "
                "status target is not judged"
            )
        helper = Helper(vmas)
        pid = str(helper.pid)
        sec.params = {
            "vmas_in_helper": helper.vmas,
            "region": common.fmt_size(REGION),
            "tree": tree_label,
            "rounds": rounds,
            "numa_utils_bytecode": common.warm_bytecode(),
        }
        names = {
            "floor": "python -c 'import numa_utils' (floor)",
            "maps": "python -m numa_utils maps PID",
            "numastat": "numastat -p PID",
            "status": "python -m numa_utils status --root TREE",
            "lstopo": "lstopo-no-graphics (HWLOC_FSROOT=TREE)",
        }
        py = common.python_argv
        contenders: List[Tuple[str, Callable[[], Sample]]] = [
            (
                names["floor"],
                whole_process(py("-c", "import numa_utils"), env, "import numa_utils"),
            ),
            (
                names["maps"],
                whole_process(py("-m", "numa_utils", "maps", pid), env, "numa_utils maps"),
            ),
            (
                names["status"],
                whole_process(
                    py("-m", "numa_utils", "status", "--root", tree), env, "numa_utils status"
                ),
            ),
        ]
        if baseline:
            base = os.path.abspath(baseline)
            if not os.path.isfile(os.path.join(base, "numa_utils.py")):
                raise Skip(f"--baseline {baseline}: no numa_utils.py there")
            benv = dict(env, PYTHONPATH=base)  # its own modules, found first
            names["base_floor"] = f"{names['floor']} [baseline]"
            names["base_maps"] = f"{names['maps']} [baseline]"
            sec.params["baseline"] = os.path.basename(base)
            for key, args, what in (
                ("base_floor", ("-c", "import numa_utils"), "baseline import"),
                ("base_maps", ("-m", "numa_utils", "maps", pid), "baseline maps"),
            ):
                contenders.append((names[key], whole_process(py(*args), benv, what, cwd=base)))
        for key, tool, argv, tenv, pkg in (
            ("numastat", "numastat", ["-p", pid], env, "numactl"),
            (
                "lstopo",
                "lstopo-no-graphics",
                [],
                dict(env, HWLOC_FSROOT=tree),
                "hwloc-nox or hwloc",
            ),
        ):
            exe = common.which(tool)
            if exe:
                contenders.append((names[key], whole_process([exe, *argv], tenv, tool)))
            else:
                sec.skip_contender(names[key], f"{tool} not found (Debian package {pkg})")
        log(f"hot: {len(contenders)} contenders x {rounds} rounds")
        samples, skipped = common.alternate(contenders, rounds, log=log)
    finally:
        if helper is not None:
            helper.close()
        shutil.rmtree(scratch, ignore_errors=True)
    for name, why in skipped.items():
        sec.skip_contender(name, why)
    for name, _ in contenders:
        if name in samples:
            sec.row(name, "s", samples[name])
    floor = samples.get(names["floor"])
    for cmd, ref, target, judged in (
        ("maps", "numastat", 1.0, True),
        ("status", "lstopo", 2.0, bool(snapshot)),
    ):
        a, b = samples.get(names[cmd]), samples.get(names[ref])
        if a is None or floor is None:
            continue
        own = own_work(a, floor)
        sec.row(f"{names[cmd]}: own work (less the floor)", "s", own)
        own_cpu = own_work(a, floor, "cpu_s")
        sec.row(f"{names[cmd]}: own CPU time (less the floor's)", "cpu s", own_cpu, key="cpu_s")
        if b is None:
            continue
        sec.row(f"{names[ref]}: CPU time", "cpu s", b, key="cpu_s")
        sec.compare(
            f"{cmd} own work / {names[ref]}",
            "time",
            own,
            b,
            key="s",
            target=f"<= {target}" if judged else None,
            ok=(lambda x, t=target: x <= t) if judged else None,
        )
        sec.compare(
            f"{cmd} own CPU time / {names[ref]} CPU time", "cpu time", own_cpu, b, key="cpu_s"
        )
        sec.compare(f"{cmd} whole process / {names[ref]}", "time", a, b, key="s")
        sec.compare(f"floor / {names[ref]}", "time", floor, b, key="s")
    base_floor, base_maps = (
        samples.get(names.get("base_floor", "")),
        samples.get(names.get("base_maps", "")),
    )
    if base_floor is not None and base_maps is not None and floor is not None:
        before = own_work(base_maps, base_floor)
        sec.row(f"{names['base_maps']}: own work (less its floor)", "s", before)
        before_cpu = own_work(base_maps, base_floor, "cpu_s")
        sec.row(
            f"{names['base_maps']}: own CPU time (less its floor's)",
            "cpu s",
            before_cpu,
            key="cpu_s",
        )
        after = own_work(samples[names["maps"]], floor) if names["maps"] in samples else None
        if names["numastat"] in samples:
            sec.compare(
                f"maps own work [baseline] / {names['numastat']}",
                "time",
                before,
                samples[names["numastat"]],
                key="s",
            )
            sec.compare(
                f"maps own CPU time [baseline] / {names['numastat']} CPU time",
                "cpu time",
                before_cpu,
                samples[names["numastat"]],
                key="cpu_s",
            )
        if after is not None:
            sec.compare("maps own work / maps own work [baseline]", "time", after, before, key="s")
            sec.compare(
                "maps own CPU time / maps own CPU time [baseline]",
                "cpu time",
                own_work(samples[names["maps"]], floor, "cpu_s"),
                before_cpu,
                key="cpu_s",
            )
    sec.notes.append(
        "own work = the command's wall time less `python -c 'import "
        "numa_utils'` in the same round; the reference tools are whole runs"
    )
    return sec
