"""Benchmark 4: import cost and memory footprint.

Whole processes, alternating: ``python -c pass`` against ``python -c "import
numa_utils"`` (the import's added wall time), ``-X importtime`` self and cumulative
time of numa_utils and the modules it pulls in that a bare interpreter does not load,
and the peak RSS (ru_maxrss of the reaped child, from wait4) of ``python -m numa_utils
status`` against the bare interpreter.
"""

from __future__ import annotations

import statistics
from typing import Callable, Dict, List, Tuple

from . import common
from .common import Section, Skip


def _importtime(code: str, env: Dict[str, str]) -> Dict[str, Tuple[int, int]]:
    """module -> (self us, cumulative us) from one ``-X importtime`` run."""
    r = common.spawn(
        common.python_argv("-X", "importtime", "-c", code), cwd=common.ROOT, env=env
    ).check("python -X importtime")
    out: Dict[str, Tuple[int, int]] = {}
    for line in r.stderr.decode(errors="replace").splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) == 3:
            try:
                out[parts[2].strip()] = (int(parts[0]), int(parts[1]))
            except ValueError:
                continue
    return out


def run(*, rounds: int, log: Callable[[str], None] = common.log) -> Section:
    sec = Section("import", "4. Import time and footprint")
    env = common.child_env()
    nu = common.numa_utils()
    sec.params = {"rounds": rounds, "numa_utils": getattr(nu, "__version__", "?")}
    sec.params["numa_utils_bytecode"] = common.warm_bytecode()

    try:
        probe = common.build_c("rss_probe")
    except Skip as e:
        probe = ""
        sec.notes.append(
            f"peak RSS not measured: {e} (rss_probe.c explains why a small launcher is needed)"
        )

    def whole(*args: str, env: Dict[str, str] = env) -> Callable[[], Dict[str, float]]:
        argv = common.python_argv(*args)

        def fn() -> Dict[str, float]:
            if not probe:
                r = common.spawn(argv, cwd=common.ROOT, env=env).check(" ".join(args))
                return {"ms": r.seconds * 1e3}
            # Launched and reaped by the small C probe, so ru_maxrss is the child's own
            # (see rss_probe.c); the wall time is the probe's fork-to-reap.
            r = common.spawn([probe, *argv], cwd=common.ROOT, env=env, capture=True)
            r.check("rss_probe " + " ".join(args))
            kb, secs, rc = r.stdout.decode().split()
            if int(rc) != 0:
                raise RuntimeError(
                    "{} exited {}: {}".format(" ".join(args), rc, r.stderr.decode()[-300:])
                )
            return {"ms": float(secs) * 1e3, "rss": float(kb)}

        return fn

    bare = "python -c pass"
    imp = 'python -c "import numa_utils"'
    status = "python -m numa_utils status"
    # No bytecode cache (PYTHONDONTWRITEBYTECODE=1 in many container images, or a
    # read-only install): every import compiles the whole file.  An empty
    # PYTHONPYCACHEPREFIX hides this checkout's __pycache__ from the child.
    import tempfile

    nocache = tempfile.mkdtemp(prefix="nubench-nopyc-")
    env_nopyc = dict(env, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=nocache)
    imp_nopyc = 'python -c "import numa_utils", no bytecode cache'
    script = "python numa_utils.py --version (a script: never cached)"
    module = "python -m numa_utils --version"
    contenders: List[Tuple[str, Callable[[], Dict[str, float]]]] = [
        (bare, whole("-c", "pass")),
        (imp, whole("-c", "import numa_utils")),
        (status, whole("-m", "numa_utils", "status")),
        (imp_nopyc, whole("-c", "import numa_utils", env=env_nopyc)),
        (script, whole("numa_utils.py", "--version")),
        (module, whole("-m", "numa_utils", "--version")),
    ]
    log(f"import: {len(contenders)} contenders x {rounds} rounds")
    try:
        samples, skipped = common.alternate(contenders, rounds, log=log)
    finally:
        import shutil

        shutil.rmtree(nocache, ignore_errors=True)
    for name, why in skipped.items():
        sec.skip_contender(name, why)
    for name, _ in contenders:
        if name in samples:
            sec.row(name, "wall ms", samples[name], key="ms")
    for name in (bare, imp, status):
        if name in samples:
            sec.row(name, "peak RSS kB", samples[name], key="rss")
    for name, label in (
        (imp_nopyc, "import numa_utils without bytecode - python -c pass"),
        (script, "numa_utils.py --version - python -c pass"),
        (module, "python -m numa_utils --version - python -c pass"),
    ):
        if bare in samples and name in samples:
            d = [x["ms"] - y["ms"] for x, y in zip(samples[name], samples[bare]) if x and y]
            sec.add_comparison(
                label,
                "added wall ms",
                statistics.median(s["ms"] for s in samples[name] if s)
                - statistics.median(s["ms"] for s in samples[bare] if s),
                statistics.median(d) if d else None,
                unit="ms",
            )

    if bare in samples and imp in samples:
        a = [s["ms"] for s in samples[imp] if s]
        b = [s["ms"] for s in samples[bare] if s]
        diffs = [x["ms"] - y["ms"] for x, y in zip(samples[imp], samples[bare]) if x and y]
        sec.add_comparison(
            "import numa_utils - python -c pass",
            "added wall ms",
            statistics.median(a) - statistics.median(b),
            statistics.median(diffs) if diffs else None,
            "< 10 ms",
            lambda x: x < 10,
            unit="ms",
        )
    if bare in samples and status in samples:
        sec.compare(
            "status / python -c pass",
            "peak RSS",
            samples[status],
            samples[bare],
            key="rss",
            target="<= 1.2",
            ok=lambda x: x <= 1.2,
        )
    if bare in samples and imp in samples:
        sec.compare(
            "import numa_utils / python -c pass", "peak RSS", samples[imp], samples[bare], key="rss"
        )

    # -X importtime: numa_utils' own line, and what it brings in beyond a bare start.
    n = max(3, rounds // 4)
    selfs: List[float] = []
    cums: List[float] = []
    extra: Dict[str, List[int]] = {}
    for _ in range(n):
        base = _importtime("pass", env)
        got = _importtime("import numa_utils", env)
        if "numa_utils" in got:
            selfs.append(got["numa_utils"][0] / 1e3)
            cums.append(got["numa_utils"][1] / 1e3)
        for mod, (self_us, _) in got.items():
            if mod not in base and mod != "numa_utils":
                extra.setdefault(mod, []).append(self_us)
    sec.value_row("numa_utils (-X importtime)", "self ms", selfs)
    sec.value_row(
        "numa_utils (-X importtime)", "cumulative ms", cums, note="includes the modules below"
    )
    if extra:
        top = sorted(extra.items(), key=lambda kv: -statistics.median(kv[1]))
        sec.notes.append(
            "modules numa_utils imports that `python -c pass` does not (median "
            "self us): "
            + ", ".join(f"{m} {statistics.median(v):.0f}" for m, v in top[:12])
            + (f" (+{len(top) - 12} more)" if len(top) > 12 else "")
        )
    sec.notes.append(
        "wall times are whole processes (fork to reap); RSS is ru_maxrss of "
        "the reaped child, per process"
    )
    return sec
