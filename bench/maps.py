"""Benchmark 2: numa_maps of a process with many VMAs.

A helper (vma_helper.py) holds N VMAs with alternating protections plus one touched
16 MiB region.  Contenders: ``numastat -p PID`` and ``python -m numa_utils maps PID``
(each as a whole process, start-up included), ``placement()`` of the helper's region
in-process, and, for context, a bare ``python -c pass`` and a plain read of
/proc/PID/numa_maps (the kernel's own cost of printing the file).  Also the parse
throughput of ``parse_numa_maps`` on the captured text, in lines per second.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import common
from .common import Section, Skip, whole_process

REGION = 16 << 20


class Helper:
    def __init__(self, vmas: int) -> None:
        self.p = subprocess.Popen(
            common.python_argv(
                os.path.join(common.BENCH_DIR, "vma_helper.py"), str(vmas), str(REGION)
            ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.p.stdout is not None
        line = self.p.stdout.readline().decode()
        if not line:
            err = self.p.stderr.read().decode() if self.p.stderr else ""
            self.p.wait()
            raise Skip(f"VMA helper failed: {err.strip().splitlines()[-1:]}")
        pid, addr, length, count = (int(x) for x in line.split())
        self.pid, self.addr, self.length, self.vmas = pid, addr, length, count

    def close(self) -> None:
        if self.p.stdin:
            self.p.stdin.close()
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def run(*, vmas: int, rounds: int, log: Callable[[str], None] = common.log) -> Section:
    sec = Section("maps", f"2. numa_maps with {vmas} VMAs")
    nu = common.numa_utils()
    env = common.child_env()
    helper = Helper(vmas)
    try:
        pid = helper.pid
        text = open(f"/proc/{pid}/numa_maps").read()
        nlines = text.count("\n")
        sec.params = {
            "vmas_in_helper": helper.vmas,
            "numa_maps_lines": nlines,
            "numa_maps_bytes": len(text),
            "region": common.fmt_size(REGION),
            "rounds": rounds,
        }
        sec.params["numa_utils_bytecode"] = common.warm_bytecode()
        contenders: List[Tuple[str, Callable[[], Dict[str, float]]]] = []

        numastat = common.which("numastat")
        ns_name = "numastat -p PID"
        if numastat:
            contenders.append((ns_name, whole_process([numastat, "-p", str(pid)], what="numastat")))
        else:
            sec.skip_contender(ns_name, "numastat not found (Debian package numactl)")

        maps_name = "python -m numa_utils maps PID"
        json_name = "python -m numa_utils maps PID --json"
        probe = common.spawn(
            common.python_argv("-m", "numa_utils", "maps", "--help"), cwd=common.ROOT, env=env
        )
        if probe.rc != 0:
            why = "no `maps` subcommand in this checkout ({})".format(
                " ".join(probe.stderr.decode(errors="replace").strip().splitlines()[-1:])
            )
            sec.skip_contender(maps_name, why)
            sec.skip_contender(json_name, why)
        else:
            base = common.python_argv("-m", "numa_utils", "maps", str(pid))
            contenders.append((maps_name, whole_process(base, env, "numa_utils maps")))
            contenders.append(
                (json_name, whole_process(base + ["--json"], env, "numa_utils maps --json"))
            )
        pass_name = "python -c pass (start-up floor)"
        contenders.append((pass_name, whole_process(common.python_argv("-c", "pass"), env)))

        read_name = "read /proc/PID/numa_maps in-process (kernel floor)"

        def read_raw() -> Dict[str, float]:
            t0 = time.perf_counter()
            with open(f"/proc/{pid}/numa_maps", "rb") as f:
                f.read()
            return {"s": time.perf_counter() - t0}

        contenders.append((read_name, read_raw))

        pl_name = "placement(region, pid=PID) in-process"
        got: Dict[str, Any] = {}

        def placement() -> Dict[str, float]:
            t0 = time.perf_counter()
            try:
                res = nu.placement(helper.addr, helper.length, pid=pid)
            except NotImplementedError as e:
                raise Skip("numa_utils.placement is a stub in this checkout") from e
            except TypeError as e:
                raise Skip(f"placement(addr, length, pid=PID) not accepted: {e}") from e
            dt = time.perf_counter() - t0
            got["placement"] = res
            return {"s": dt}

        contenders.append((pl_name, placement))

        parse_name = "parse_numa_maps(text)"

        def parse() -> Dict[str, float]:
            t0 = time.perf_counter()
            try:
                entries = nu.parse_numa_maps(text)
            except NotImplementedError as e:
                raise Skip("numa_utils.parse_numa_maps is a stub in this checkout") from e
            dt = time.perf_counter() - t0
            got["entries"] = len(entries)
            return {"s": dt, "lines/s": nlines / dt}

        contenders.append((parse_name, parse))

        log(
            f"maps: helper pid with {helper.vmas} VMAs, {len(contenders)} contenders x "
            f"{rounds} rounds"
        )
        samples, skipped = common.alternate(contenders, rounds, log=log)
    finally:
        helper.close()
    for name, why in skipped.items():
        sec.skip_contender(name, why)
    for name, _ in contenders:
        if name in samples:
            sec.row(name, "s", samples[name])
    if parse_name in samples:
        sec.row(
            parse_name,
            "lines/s",
            samples[parse_name],
            note=f"{got.get('entries')} entries from {nlines} lines",
        )
    if "placement" in got:
        p = got["placement"]
        shown = dict(sorted(p.items())) if isinstance(p, dict) else p
        sec.notes.append(f"placement() of the {common.fmt_size(REGION)} region returned {shown}")

    def cmp(
        a: str,
        b: str,
        label: str,
        target: Optional[str] = None,
        ok: Optional[Callable[[float], bool]] = None,
    ) -> None:
        if a in samples and b in samples:
            sec.compare(label, "time", samples[a], samples[b], key="s", target=target, ok=ok)

    cmp(maps_name, ns_name, "maps CLI / numastat -p", "<= 1.5", lambda x: x <= 1.5)
    cmp(json_name, ns_name, "maps --json / numastat -p", "<= 3.0", lambda x: x <= 3.0)
    cmp(pl_name, ns_name, "placement() in-process / numastat -p", "<= 0.5", lambda x: x <= 0.5)
    cmp(read_name, ns_name, "raw numa_maps read / numastat -p")
    cmp(pass_name, ns_name, "python -c pass / numastat -p")
    sec.notes.append("time ratios: below 1 means faster than the reference (B)")
    return sec


def synthetic_maps(size: int) -> bytes:
    """About ``size`` bytes of numa_maps text shaped like a big engine process: half
    the VMAs small anonymous ones (what vma_helper.py holds), the rest file mappings,
    heap, stack, huge pages and interleaved regions with varying counters (thousands
    of distinct line remainders, so no cache holds the whole file)."""
    lines = []
    addr = 0x7F0000000000
    for i in range(4000):
        if i % 2:
            rest = "default anon=1 dirty=1 active=0 N0=1 kernelpagesize_kB=4"
        elif i % 10 == 0:
            rest = (
                f"interleave:0-1 file=/SYSV{i:08x}\\040(deleted) dirty={i} "
                f"N0={i // 2} N1={i - i // 2} kernelpagesize_kB=4"
            )
        elif i % 10 == 2:
            rest = (
                f"default file=/anon_hugepage\\040(deleted) huge anon={i % 7} N1={i % 7} "
                "kernelpagesize_kB=2048"
            )
        elif i % 10 == 4:
            rest = f"default heap anon={i} dirty={i} N0={i} kernelpagesize_kB=4"
        else:
            rest = (
                f"default file=/usr/lib/x86_64-linux-gnu/lib{i % 300}.so.{i % 7} "
                f"mapped={i % 997} mapmax=3 N0={i % 997} kernelpagesize_kB=4"
            )
        lines.append(rest)
    out = []
    n = 0
    while n < size:
        for rest in lines:
            line = f"{addr:x} {rest}\n"
            addr += 0x2000
            out.append(line)
            n += len(line)
    return "".join(out).encode()[:size].rsplit(b"\n", 1)[0] + b"\n"


def file_case(*, small: int, rounds: int, log: Callable[[str], None] = common.log) -> Section:
    """`maps --file` on a generated file of ``small`` and 10x ``small`` bytes: time
    (linear?) and peak RSS against a bare interpreter."""
    import shutil
    import tempfile

    sec = Section("maps_file", f"2b. maps --file on {small * 10 / 1e6:.0f} MB of numa_maps")
    env = common.child_env()
    probe = common.build_c("rss_probe")
    tmp = tempfile.mkdtemp(prefix="nubench-maps-")
    try:
        text = synthetic_maps(small)
        paths = {}
        for mult in (1, 10):
            paths[mult] = os.path.join(tmp, f"numa_maps_x{mult}")
            with open(paths[mult], "wb") as f:
                for _ in range(mult):
                    f.write(text)
        vmas = text.count(b"\n")
        sec.params = {
            "small_bytes": len(text),
            "small_vmas": vmas,
            "large_bytes": len(text) * 10,
            "large_vmas": vmas * 10,
            "rounds": rounds,
        }
        sec.params["numa_utils_bytecode"] = common.warm_bytecode()
        del text

        def probed(argv: List[str], what: str) -> Callable[[], Dict[str, float]]:
            def fn() -> Dict[str, float]:
                r = common.spawn(
                    [probe, *argv], cwd=common.ROOT, env=env, capture=True, timeout=900
                )
                r.check("rss_probe " + what)
                kb, secs, rc = r.stdout.decode().split()
                if int(rc) != 0:
                    raise Skip(f"{what} exited {rc}: {r.stderr.decode()[-300:]}")
                return {"s": float(secs), "rss": float(kb)}

            return fn

        mb = os.path.getsize(paths[1]) / 1e6
        names = {
            "small": f"maps --file, {mb:.0f} MB",
            "large": f"maps --file, {mb * 10:.0f} MB",
            "json": f"maps --file --json, {mb * 10:.0f} MB",
            "bare": "python -c pass",
        }
        nu_argv = common.python_argv("-m", "numa_utils", "maps", "--file")
        contenders = [
            (names["small"], probed(nu_argv + [paths[1]], "maps small")),
            (names["large"], probed(nu_argv + [paths[10]], "maps large")),
            (names["json"], probed(nu_argv + [paths[10], "--json"], "maps --json")),
            (names["bare"], probed(common.python_argv("-c", "pass"), "python")),
        ]
        log(f"maps --file: {len(contenders)} contenders x {rounds} rounds")
        samples, skipped = common.alternate(contenders, rounds, log=log)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for name, why in skipped.items():
        sec.skip_contender(name, why)
    for name, _ in contenders:
        if name in samples:
            sec.row(name, "s", samples[name])
    for name, _ in contenders:
        if name in samples:
            sec.row(name, "peak RSS kB", samples[name], key="rss")
    bare = samples.get(names["bare"])
    for key in ("large", "json"):
        got = samples.get(names[key])
        if got and bare:
            a = [x["rss"] for x in got if x]
            b = [x["rss"] for x in bare if x]
            diffs = [(x["rss"] - y["rss"]) / 1024 for x, y in zip(got, bare) if x and y]
            sec.add_comparison(
                f"{names[key]} - python -c pass",
                "peak RSS MiB",
                (statistics.median(a) - statistics.median(b)) / 1024,
                statistics.median(diffs) if diffs else None,
                "<= 64 MiB",
                lambda x: x <= 64,
                unit="MiB",
            )
    small, large = samples.get(names["small"]), samples.get(names["large"])
    if small and large:
        tenfold = [None if x is None else {"s": x["s"] * 10} for x in small]
        sec.compare(
            f"{names['large']} / 10 x {names['small']}",
            "time",
            large,
            tenfold,
            key="s",
            target="<= 1.3 (linear)",
            ok=lambda x: x <= 1.3,
        )
    sec.notes.append(
        "peak RSS is the child's own ru_maxrss (launched by rss_probe); the "
        "file is generated (synthetic_maps): half small anonymous VMAs, half "
        "file, heap, huge and interleaved ones with varying counters"
    )
    return sec
