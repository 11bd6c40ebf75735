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
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import common
from .common import Section, Skip, whole_process

REGION = 16 << 20


class Helper:
    def __init__(self, vmas: int) -> None:
        self.p = subprocess.Popen(
            common.python_argv(os.path.join(common.BENCH_DIR, "vma_helper.py"), str(vmas),
                               str(REGION)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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
        sec.params = {"vmas_in_helper": helper.vmas, "numa_maps_lines": nlines,
                      "numa_maps_bytes": len(text), "region": common.fmt_size(REGION),
                      "rounds": rounds}
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
        probe = common.spawn(common.python_argv("-m", "numa_utils", "maps", "--help"),
                             cwd=common.ROOT, env=env)
        if probe.rc != 0:
            why = "no `maps` subcommand in this checkout ({})".format(" ".join(
                probe.stderr.decode(errors="replace").strip().splitlines()[-1:]))
            sec.skip_contender(maps_name, why)
            sec.skip_contender(json_name, why)
        else:
            base = common.python_argv("-m", "numa_utils", "maps", str(pid))
            contenders.append((maps_name, whole_process(base, env, "numa_utils maps")))
            contenders.append((json_name, whole_process(base + ["--json"], env,
                                                 "numa_utils maps --json")))
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

        log(f"maps: helper pid with {helper.vmas} VMAs, {len(contenders)} contenders x "
            f"{rounds} rounds")
        samples, skipped = common.alternate(contenders, rounds, log=log)
    finally:
        helper.close()
    for name, why in skipped.items():
        sec.skip_contender(name, why)
    for name, _ in contenders:
        if name in samples:
            sec.row(name, "s", samples[name])
    if parse_name in samples:
        sec.row(parse_name, "lines/s", samples[parse_name],
                note=f"{got.get('entries')} entries from {nlines} lines")
    if "placement" in got:
        p = got["placement"]
        shown = dict(sorted(p.items())) if isinstance(p, dict) else p
        sec.notes.append(f"placement() of the {common.fmt_size(REGION)} region returned {shown}")

    def cmp(a: str, b: str, label: str, target: Optional[str] = None,
            ok: Optional[Callable[[float], bool]] = None) -> None:
        if a in samples and b in samples:
            sec.compare(label, "time", samples[a], samples[b], key="s", target=target, ok=ok)

    cmp(maps_name, ns_name, "maps CLI / numastat -p", "<= 1.5", lambda x: x <= 1.5)
    cmp(json_name, ns_name, "maps --json / numastat -p")
    cmp(pl_name, ns_name, "placement() in-process / numastat -p", "<= 0.5",
        lambda x: x <= 0.5)
    cmp(read_name, ns_name, "raw numa_maps read / numastat -p")
    cmp(pass_name, ns_name, "python -c pass / numastat -p")
    sec.notes.append("time ratios: below 1 means faster than the reference (B)")
    return sec
