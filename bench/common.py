"""Shared machinery: the module under test, alternating rounds, statistics, child
processes with their rusage, and the JSON/Markdown report."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
# The repository root this bench/ folder lives in: numa_utils is imported from here,
# never from site-packages or PYTHONPATH, so the numbers belong to this checkout.
ROOT = os.path.dirname(BENCH_DIR)
DEFAULT_OUT = os.path.join(BENCH_DIR, "results")
BUILD_DIR = os.path.join(BENCH_DIR, "build")

_nu: Any = None


def numa_utils() -> Any:
    """The numa_utils module of this checkout (imported once, from ROOT)."""
    global _nu
    if _nu is None:
        if sys.path[:1] != [ROOT]:
            sys.path.insert(0, ROOT)
        import numa_utils as mod  # noqa: PLC0415

        here = os.path.dirname(os.path.abspath(mod.__file__))
        if os.path.realpath(here) != os.path.realpath(ROOT):
            raise ImportError(f"numa_utils was imported from {here}, not from this checkout")
        _nu = mod
    return _nu


def sibling(name: str) -> Any:
    """A file beside numa_utils.py in this checkout: numa_utils_regions, _threads."""
    numa_utils()  # this checkout first on the path, and checked
    import importlib  # noqa: PLC0415

    return importlib.import_module(name)


def child_env(**extra: str) -> Dict[str, str]:
    """Environment for child Pythons: this checkout first on the path, and bytecode
    caching on (an engine imports numa_utils from its __pycache__; with
    PYTHONDONTWRITEBYTECODE set, as in some CI shells, every start would recompile
    the whole file and the benchmark would measure the compiler)."""
    env = dict(os.environ)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = ROOT + (os.pathsep + old if old else "")
    env.pop("PYTHONSTARTUP", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(extra)
    return env


_bytecode_state: Optional[str] = None


def warm_bytecode() -> str:
    """Import numa_utils once in a child so its .pyc exists before anything is
    timed; returns how the timed runs will load it."""
    global _bytecode_state
    if _bytecode_state is None:
        import importlib.util  # noqa: PLC0415

        src = os.path.join(ROOT, "numa_utils.py")
        spawn([sys.executable, "-c", "import numa_utils"], cwd=ROOT, env=child_env())
        pyc = importlib.util.cache_from_source(src)
        if os.path.exists(pyc) and os.path.getmtime(pyc) >= os.path.getmtime(src):
            _bytecode_state = "cached .pyc (written before timing)"
        else:
            _bytecode_state = "compiled from source on every start (__pycache__ not writable)"
    return _bytecode_state


class Skip(Exception):
    """A contender (or a whole benchmark) cannot run here; the message says why."""


# ---------------------------------------------------------------------------
# child processes
# ---------------------------------------------------------------------------


class ChildResult:
    def __init__(
        self,
        rc: int,
        seconds: float,
        maxrss_kb: int,
        stdout: bytes,
        stderr: bytes,
        cpu_seconds: float = 0.0,
    ) -> None:
        self.rc = rc
        self.seconds = seconds
        self.maxrss_kb = maxrss_kb
        self.cpu_seconds = cpu_seconds  # user + system, the child's own (wait4)
        self.stdout = stdout
        self.stderr = stderr

    def check(self, what: str) -> ChildResult:
        if self.rc != 0:
            tail = self.stderr.decode(errors="replace").strip().splitlines()[-3:]
            joined = " | ".join(tail)
            raise RuntimeError(f"{what} exited {self.rc}: {joined}")
        return self


def spawn(
    argv: Sequence[str],
    *,
    cwd: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    capture: bool = False,
    timeout: float = 300.0,
) -> ChildResult:
    """Run a child to completion; wall time from fork to reap, and the child's own
    peak RSS from wait4 (ru_maxrss, kB on Linux).  Output goes to temp files (not
    pipes), so a chatty child cannot block and the parent reads nothing meanwhile."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out if capture else subprocess.DEVNULL,
            stderr=err,
        )
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        try:
            _, status, ru = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        dt = time.perf_counter() - t0
        if os.WIFEXITED(status):
            rc = os.WEXITSTATUS(status)
        else:
            rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1
        p.returncode = rc  # reaped by wait4: tell Popen not to wait again
        out.seek(0)
        err.seek(0)
        return ChildResult(
            rc,
            dt,
            int(ru.ru_maxrss),
            out.read() if capture else b"",
            err.read(),
            ru.ru_utime + ru.ru_stime,
        )


def whole_process(
    argv: List[str], env: Optional[Dict[str, str]] = None, what: str = "", cwd: str = ROOT
) -> Callable[[], Dict[str, float]]:
    """A contender that runs ``argv`` as a whole process (start-up included) in
    ``cwd`` and reports its wall seconds ("s") and CPU seconds ("cpu_s": user and
    system, which other work on a shared machine moves far less); a non-zero exit is
    a Skip naming ``what``."""

    def fn() -> Dict[str, float]:
        r = spawn(argv, cwd=cwd, env=env)
        if r.rc != 0:
            tail = r.stderr.decode(errors="replace").strip().splitlines()[-1:]
            raise Skip(f"{what or argv[0]} exited {r.rc}: {' '.join(tail)}")
        return {"s": r.seconds, "cpu_s": r.cpu_seconds}

    return fn


def python_argv(*args: str) -> List[str]:
    return [sys.executable, *args]


# ---------------------------------------------------------------------------
# alternating rounds and statistics
# ---------------------------------------------------------------------------

Sample = Dict[str, float]


def alternate(
    contenders: Sequence[Tuple[str, Callable[[], Sample]]],
    rounds: int,
    *,
    log: Optional[Callable[[str], None]] = None,
    warmup: bool = True,
) -> Tuple[Dict[str, List[Optional[Sample]]], Dict[str, str]]:
    """Run the contenders in alternating order (A B C, C B A, A B C, ...), ``rounds``
    times each, after one untimed warm-up call each (page cache, bytecode, and in a
    VM the host's backing of guest memory).  Returns (samples per contender, aligned
    by round, skip reasons).  A contender that raises Skip is dropped."""
    samples: Dict[str, List[Optional[Sample]]] = {n: [] for n, _ in contenders}
    skipped: Dict[str, str] = {}
    order = list(contenders)
    if warmup:
        for name, fn in order:
            try:
                fn()
            except Skip as e:
                skipped[name] = str(e)
                samples.pop(name, None)
    for r in range(rounds):
        seq = order if r % 2 == 0 else order[::-1]
        for name, fn in seq:
            if name in skipped:
                continue
            try:
                s = fn()
            except Skip as e:
                skipped[name] = str(e)
                samples.pop(name, None)
                continue
            samples[name].append(s)
        if log:
            log(f"  round {r + 1}/{rounds} done")
    return samples, skipped


def _values(samples: List[Optional[Sample]], key: str) -> List[float]:
    return [s[key] for s in samples if s is not None and key in s]


def summary(samples: List[Optional[Sample]], key: str) -> Dict[str, Any]:
    v = _values(samples, key)
    if not v:
        return {"n": 0}
    return {"n": len(v), "min": min(v), "median": statistics.median(v), "max": max(v), "samples": v}


def ratio(
    a: List[Optional[Sample]], b: List[Optional[Sample]], key: str
) -> Dict[str, Optional[float]]:
    """a/b as the ratio of medians and as the median of per-round ratios (rounds
    where both ran; the per-round ratio cancels slow drifts of a noisy machine)."""
    va, vb = _values(a, key), _values(b, key)
    out: Dict[str, Optional[float]] = {"ratio_of_medians": None, "median_round_ratio": None}
    if va and vb and statistics.median(vb) != 0:
        out["ratio_of_medians"] = statistics.median(va) / statistics.median(vb)
    pairs = [
        (x[key], y[key])
        for x, y in zip(a, b)
        if x is not None and y is not None and key in x and key in y and y[key] != 0
    ]
    if pairs:
        out["median_round_ratio"] = statistics.median(p / q for p, q in pairs)
    return out


class Section:
    """The results of one benchmark: rows (contender x metric), comparisons with
    targets, skipped contenders with reasons, notes."""

    def __init__(self, name: str, title: str) -> None:
        self.name = name
        self.title = title
        self.status = "ok"
        self.reason = ""
        self.params: Dict[str, Any] = {}
        self.rows: List[Dict[str, Any]] = []
        self.comparisons: List[Dict[str, Any]] = []
        self.skipped: List[Dict[str, str]] = []
        self.notes: List[str] = []
        self.seconds = 0.0

    def skip(self, reason: str) -> Section:
        self.status = "skipped"
        self.reason = reason
        return self

    def skip_contender(self, name: str, reason: str) -> None:
        self.skipped.append({"contender": name, "reason": reason})

    def row(
        self,
        contender: str,
        metric: str,
        samples: List[Optional[Sample]],
        key: Optional[str] = None,
        note: str = "",
    ) -> None:
        s = summary(samples, key or metric)
        if s["n"]:
            self.rows.append(dict(contender=contender, metric=metric, note=note, **s))

    def value_row(
        self, contender: str, metric: str, values: Sequence[float], note: str = ""
    ) -> None:
        self.row(contender, metric, [{"v": x} for x in values], "v", note)

    def compare(
        self,
        what: str,
        metric: str,
        a: List[Optional[Sample]],
        b: List[Optional[Sample]],
        key: Optional[str] = None,
        target: Optional[str] = None,
        ok: Optional[Callable[[float], bool]] = None,
        note: str = "",
    ) -> Dict[str, Any]:
        r = ratio(a, b, key or metric)
        return self.add_comparison(
            what, metric, r["ratio_of_medians"], r["median_round_ratio"], target, ok, note
        )

    def add_comparison(
        self,
        what: str,
        metric: str,
        of_medians: Optional[float],
        round_median: Optional[float],
        target: Optional[str] = None,
        ok: Optional[Callable[[float], bool]] = None,
        note: str = "",
        unit: str = "x",
    ) -> Dict[str, Any]:
        met: Optional[bool] = None
        if ok is not None and of_medians is not None:
            # Met only when both estimates agree; a noisy run cannot pass on one.
            met = ok(of_medians) and (round_median is None or ok(round_median))
        c = {
            "what": what,
            "metric": metric,
            "ratio_of_medians": of_medians,
            "median_round_ratio": round_median,
            "unit": unit,
            "target": target,
            "met": met,
            "note": note,
        }
        self.comparisons.append(c)
        return c

    def to_json(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "reason": self.reason,
            "params": self.params,
            "rows": self.rows,
            "comparisons": self.comparisons,
            "skipped": self.skipped,
            "notes": self.notes,
            "seconds": round(self.seconds, 2),
        }


# ---------------------------------------------------------------------------
# machine description and report
# ---------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def machine_info() -> Dict[str, Any]:
    model = ""
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = 0
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    nodes = _read("/sys/devices/system/node/online").strip() or "?"
    info: Dict[str, Any] = {
        "cpu_model": model or platform.machine(),
        "cpus_online": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "memory_gib": round(mem_kb / 1048576, 1),
        "numa_nodes_online": nodes,
        "kernel": platform.release(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "thp": _read("/sys/kernel/mm/transparent_hugepage/enabled").strip(),
        "shmem_thp": _read("/sys/kernel/mm/transparent_hugepage/shmem_enabled").strip(),
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    try:
        info["commit"] = subprocess.run(
            ["git", "-C", ROOT, "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["commit"] = ""
    try:
        info["numa_utils_version"] = numa_utils().__version__
    except Exception as e:  # the report must still be written
        info["numa_utils_version"] = f"import failed: {e}"
    return info


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1e6:
            return f"{v:.3g}"
        if a >= 100:
            return f"{v:.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def _val(c: Dict[str, Any], key: str) -> str:
    """A comparison value; differences (unit other than "x") carry their unit."""
    v = c[key]
    if v is None or c.get("unit", "x") == "x":
        return _fmt(v)
    return "{:+.1f} {}".format(v, c["unit"])


def _met(m: Optional[bool]) -> str:
    return {True: "met", False: "**missed**", None: "-"}[m]


def render_markdown(report: Dict[str, Any]) -> str:
    m = report["machine"]
    out = ["# numa_utils benchmarks", ""]
    out.append(
        "Machine: {}, {} CPUs online ({} allowed), {} GiB, NUMA nodes {}, "
        "Linux {} ({}), Python {}; THP {}; shmem THP {}. Commit {}, "
        "numa_utils {}. Run: `{}` ({} s).".format(
            m["cpu_model"],
            m["cpus_online"],
            m["cpus_allowed"],
            m["memory_gib"],
            m["numa_nodes_online"],
            m["kernel"],
            m["arch"],
            m["python"],
            m["thp"] or "-",
            m["shmem_thp"] or "-",
            m["commit"] or "-",
            m["numa_utils_version"],
            report["command"],
            _fmt(report["seconds"]),
        )
    )
    out.append("")
    start, end = m.get("loadavg_start", "?"), report.get("loadavg_end", "?")
    out.append(
        f"Load average (1/5/15 min) at start {start}, at end {end}: other work shares "
        "this machine; the alternation and per-round ratios are there for that."
    )
    out.append("")
    out.append(
        "Contenders alternate (A B C, C B A, ...); min/median/max over rounds. "
        "Ratios are A/B of the metric shown: the ratio of medians, and the median "
        "of the per-round ratios (for a difference in ms: the difference of "
        "medians, and the median of per-round differences). A target is met only "
        "when both agree."
    )
    out.append("")
    targets = [(s, c) for s in report["sections"] for c in s["comparisons"] if c["target"]]
    if targets:
        out += [
            "## Targets",
            "",
            "| benchmark | comparison | metric | ratio of medians "
            "| median of round ratios | target | result |",
            "|---|---|---|---|---|---|---|",
        ]
        for s, c in targets:
            out.append(
                "| {} | {} | {} | {} | {} | {} | {} |".format(
                    s["name"],
                    c["what"],
                    c["metric"],
                    _val(c, "ratio_of_medians"),
                    _val(c, "median_round_ratio"),
                    c["target"],
                    _met(c["met"]),
                )
            )
        out.append("")
    for s in report["sections"]:
        out += ["## {}".format(s["title"]), ""]
        if s["status"] == "skipped":
            out += ["Skipped: {}".format(s["reason"]), ""]
            continue
        if s["params"]:
            out += ["Parameters: " + ", ".join(f"{k}={v}" for k, v in s["params"].items()), ""]
        if s["rows"]:
            out += [
                "| contender | metric | min | median | max | n | note |",
                "|---|---|---|---|---|---|---|",
            ]
            for r in s["rows"]:
                cells = [
                    r["contender"],
                    r["metric"],
                    _fmt(r["min"]),
                    _fmt(r["median"]),
                    _fmt(r["max"]),
                    str(r["n"]),
                    r["note"],
                ]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
        if s["comparisons"]:
            out += [
                "| comparison | metric | ratio of medians | median of round ratios "
                "| target | result |",
                "|---|---|---|---|---|---|",
            ]
            for c in s["comparisons"]:
                out.append(
                    "| {} | {} | {} | {} | {} | {} |".format(
                        c["what"],
                        c["metric"],
                        _val(c, "ratio_of_medians"),
                        _val(c, "median_round_ratio"),
                        c["target"] or "-",
                        _met(c["met"]),
                    )
                )
            out.append("")
        for k in s["skipped"]:
            out.append("- skipped {}: {}".format(k["contender"], k["reason"]))
        for n in s["notes"]:
            out.append("- " + n)
        if s["skipped"] or s["notes"]:
            out.append("")
    return "\n".join(out)


def write_report(report: Dict[str, Any], out_dir: str, stem: str) -> Tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    jpath = os.path.join(out_dir, stem + ".json")
    mpath = os.path.join(out_dir, stem + ".md")
    with open(jpath + ".tmp", "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    os.replace(jpath + ".tmp", jpath)
    with open(mpath, "w") as f:
        f.write(render_markdown(report) + "\n")
    return jpath, mpath


def build_c(name: str) -> str:
    """Compile bench/NAME.c with the system compiler into bench/build/NAME (once;
    again when the source is newer).  Raises Skip when there is no compiler."""
    cc = os.environ.get("CC") or which("cc") or which("gcc")
    if not cc:
        raise Skip(f"no C compiler (cc) on PATH to build {name}.c")
    src = os.path.join(BENCH_DIR, name + ".c")
    os.makedirs(BUILD_DIR, exist_ok=True)
    exe = os.path.join(BUILD_DIR, name)
    if os.path.exists(exe) and os.path.getmtime(exe) >= os.path.getmtime(src):
        return exe
    tmp = f"{exe}.{os.getpid()}.tmp"
    r = subprocess.run([cc, "-O2", "-pthread", "-o", tmp, src], capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip(f"cc failed on {name}.c: {r.stderr.strip()[-300:]}")
    os.replace(tmp, exe)
    return exe


def which(name: str) -> Optional[str]:
    return shutil.which(name)


def parse_size(text: str) -> int:
    """A --size argument ("4G", "64M", "1.5g"), read as the library reads sizes."""
    return int(numa_utils().parse_size(text))


def fmt_size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()
