"""Benchmark 1: prefault of a shared-memory region.

Contenders, each creating and populating the same amount of shared memory:
- numa_utils: ``SharedRegion.create(key, size, policy="interleave", kind=...,
  prefault=True, threads=T)`` (create + policy + prefault), for T in 1, 2, all CPUs;
- numa_utils ``prefault(addr, size, threads=T)`` on a segment the harness created;
- a C baseline (prefault_baseline.c: one written byte per page, T pthreads), the
  kernel's page-population speed and the physical limit here;
- the seed engine's method: 8 unpinned Python threads, each a numpy strided sum that
  reads one byte per page of its slice;
- a plain Python loop writing one byte per page through a memoryview (on at most
  256 MiB; GB/s is size-independent, so it is reported as measured).

GB/s is decimal (1e9 bytes per second) of region size over creation-to-last-page time.
Every region is removed before the next contender runs; segments are counted before
and after, and any left behind by this process is reported (and removed).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from . import common
from .common import Section, Skip

PAGE = mmap.PAGESIZE
IPC_PRIVATE = 0
IPC_CREAT = 0o1000
IPC_RMID = 0

_libc: Any = None


def libc() -> Any:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
        lib.shmget.restype = ctypes.c_int
        lib.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        lib.shmat.restype = ctypes.c_void_p
        lib.shmdt.argtypes = [ctypes.c_void_p]
        lib.shmdt.restype = ctypes.c_int
        lib.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        lib.shmctl.restype = ctypes.c_int
        lib.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        lib.mmap.restype = ctypes.c_void_p
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.munmap.restype = ctypes.c_int
        _libc = lib
    return _libc


def _err(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


class Segment:
    """Shared memory made by the harness itself (SysV or memfd), for the contenders
    that do not create their own.  A SysV segment is marked IPC_RMID at once, so it
    cannot outlive this process."""

    def __init__(self, size: int, kind: str) -> None:
        lib = libc()
        self.size = size
        self.kind = kind
        if kind == "sysv":
            sid = lib.shmget(IPC_PRIVATE, size, IPC_CREAT | 0o600)
            if sid < 0:
                raise _err("shmget")
            addr = lib.shmat(sid, None, 0)
            lib.shmctl(sid, IPC_RMID, None)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise _err("shmat")
        else:
            fd = os.memfd_create("numa-utils-bench")
            try:
                os.ftruncate(fd, size)
                addr = lib.mmap(
                    None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0
                )
            finally:
                os.close(fd)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise _err("mmap")
        self.addr = int(addr)

    def close(self) -> None:
        if self.addr:
            if self.kind == "sysv":
                libc().shmdt(ctypes.c_void_p(self.addr))
            else:
                libc().munmap(ctypes.c_void_p(self.addr), self.size)
            self.addr = 0


# ---------------------------------------------------------------------------
# leak accounting
# ---------------------------------------------------------------------------


def sysv_segments() -> Dict[int, int]:
    """shmid -> creator pid, from /proc/sysvipc/shm."""
    out: Dict[int, int] = {}
    try:
        with open("/proc/sysvipc/shm") as f:
            head = f.readline().split()
            i_id, i_cpid = head.index("shmid"), head.index("cpid")
            for line in f:
                p = line.split()
                if len(p) > max(i_id, i_cpid):
                    out[int(p[i_id])] = int(p[i_cpid])
    except (OSError, ValueError):
        pass
    return out


def dev_shm() -> Set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


# ---------------------------------------------------------------------------
# contenders
# ---------------------------------------------------------------------------


def _feature_check(nu: Any, kind: str) -> Tuple[Optional[str], Optional[str]]:
    """(reason SharedRegion cannot run, reason prefault cannot run); None = fine."""
    region_reason: Optional[str] = None
    regions = common.sibling("numa_utils_regions")
    if not callable(getattr(getattr(regions, "SharedRegion", None), "create", None)):
        region_reason = "numa_utils_regions.SharedRegion.create is missing in this checkout"
    pre_reason: Optional[str] = None
    fn = getattr(nu, "prefault", None)
    if not callable(fn):
        pre_reason = "numa_utils.prefault is missing in this checkout"
    else:
        seg = Segment(PAGE * 4, "memfd")
        try:
            fn(seg.addr, seg.size, threads=1)
        except NotImplementedError:
            pre_reason = "numa_utils.prefault is a stub (NotImplementedError) in this checkout"
        except Exception as e:
            pre_reason = f"numa_utils.prefault failed on a 4-page segment: {e!r}"
        finally:
            seg.close()
    return region_reason, pre_reason


class NumaUtilsRegion:
    """create + policy + prefault through SharedRegion.create, then destroy."""

    def __init__(self, nu: Any, size: int, kind: str) -> None:
        self.nu = nu
        self.size = size
        self.kind = kind
        self.n = 0
        self.int_keys = False
        self.errors: List[str] = []

    def _key(self) -> Any:
        self.n += 1
        if self.int_keys:
            return 0x4E420000 | ((os.getpid() * 64 + self.n) & 0xFFFF)
        return f"numa-utils-bench-{os.getpid()}-{self.n}"

    def _create(self, threads: int) -> Any:
        kw = dict(policy="interleave", kind=self.kind, prefault=True, threads=threads)
        try:
            return common.sibling("numa_utils_regions").SharedRegion.create(
                self._key(), self.size, **kw
            )
        except TypeError:
            if self.int_keys:
                raise
            self.int_keys = True  # an API that wants SysV integer keys
            return common.sibling("numa_utils_regions").SharedRegion.create(
                self._key(), self.size, **kw
            )

    def run(self, threads: int) -> Dict[str, float]:
        t0 = time.perf_counter()
        try:
            region = self._create(threads)
        except NotImplementedError as e:
            raise Skip("SharedRegion.create is a stub in this checkout") from e
        except Exception as e:
            raise Skip(f"SharedRegion.create(..., kind={self.kind!r}) failed: {e!r}") from e
        dt = time.perf_counter() - t0
        release(region, self.errors)
        return {"s": dt, "GB/s": self.size / dt / 1e9}


def release(region: Any, errors: List[str]) -> None:
    """destroy() (remove) then close() (detach); a context manager as a last resort."""
    done = False
    for name in ("destroy", "close"):
        fn = getattr(region, name, None)
        if callable(fn):
            try:
                fn()
                done = True
            except Exception as e:
                errors.append(f"{name}(): {e!r}")
    if not done and hasattr(region, "__exit__"):
        region.__exit__(None, None, None)


def nu_prefault_only(nu: Any, size: int, kind: str, threads: int) -> Dict[str, float]:
    t0 = time.perf_counter()
    seg = Segment(size, kind)
    try:
        nu.prefault(seg.addr, size, threads=threads)
        dt = time.perf_counter() - t0
    finally:
        seg.close()
    return {"s": dt, "GB/s": size / dt / 1e9}


def build_baseline() -> str:
    return common.build_c("prefault_baseline")


def c_baseline(exe: str, size: int, kind: str, threads: int) -> Dict[str, float]:
    r = common.spawn(
        [exe, str(size), str(threads), "memfd" if kind == "posix" else kind], capture=True
    ).check("prefault_baseline")
    dt = float(json.loads(r.stdout.decode())["seconds"])
    return {"s": dt, "GB/s": size / dt / 1e9}


def seed_method(np: Any, size: int, kind: str, nthreads: int = 8) -> Dict[str, float]:
    """The seed engine's prefault: unpinned threads, numpy strided sums (read faults;
    on shared memory a read fault allocates the page)."""
    t0 = time.perf_counter()
    seg = Segment(size, kind)
    try:
        arr = np.ctypeslib.as_array(
            ctypes.cast(seg.addr, ctypes.POINTER(ctypes.c_uint8)), shape=(size,)
        )
        per = (size // PAGE + nthreads - 1) // nthreads * PAGE
        sums: List[int] = [0] * nthreads

        def work(i: int) -> None:
            sums[i] = int(arr[i * per : min(size, (i + 1) * per) : PAGE].sum())

        ts = [threading.Thread(target=work, args=(i,)) for i in range(nthreads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dt = time.perf_counter() - t0

    finally:
        seg.close()
    return {"s": dt, "GB/s": size / dt / 1e9}


def python_loop(size: int, kind: str) -> Dict[str, float]:
    t0 = time.perf_counter()
    seg = Segment(size, kind)
    try:
        mv = memoryview((ctypes.c_char * size).from_address(seg.addr)).cast("B")
        for off in range(0, size, PAGE):
            mv[off] = 1
        dt = time.perf_counter() - t0
        mv.release()
    finally:
        seg.close()
    return {"s": dt, "GB/s": size / dt / 1e9}


# ---------------------------------------------------------------------------


def run(
    *,
    size: int,
    rounds: int,
    kind: str = "sysv",
    quick: bool = False,
    log: Callable[[str], None] = common.log,
) -> Section:
    sec = Section("prefault", "1. Prefault of a shared region")
    size = (size + PAGE - 1) // PAGE * PAGE
    ncpu = len(os.sched_getaffinity(0))
    tlist = sorted({1, 2, ncpu})
    loop_size = min(size, (16 if quick else 256) << 20)
    # Thread scaling below all CPUs runs on at most 1 GiB: GB/s hardly depends on the
    # size, and the full size x every thread count would not fit the time budget.
    scale_size = min(size, 1 << 30)
    sec.params = {
        "size": common.fmt_size(size),
        "kind": kind,
        "rounds": rounds,
        "threads": "/".join(map(str, tlist)),
        "page": PAGE,
        "python_loop_size": common.fmt_size(loop_size),
        "scaling_size": common.fmt_size(scale_size),
    }
    nu = common.numa_utils()
    seg_before, shm_before = sysv_segments(), dev_shm()

    region_reason, pre_reason = _feature_check(nu, kind)
    contenders: List[Tuple[str, Callable[[], Dict[str, float]]]] = []
    errors: List[str] = []
    nur = NumaUtilsRegion(nu, size, kind)
    nur.errors = errors
    nur_small = NumaUtilsRegion(nu, scale_size, kind)
    nur_small.errors = errors

    def size_of(t: int) -> int:
        return size if t == ncpu else scale_size

    def nu_name(t: int) -> str:
        return f"numa_utils create+policy+prefault, {t} thr"

    def c_name(t: int) -> str:
        return f"C baseline (1 byte/page), {t} thr"

    for t in tlist:
        if region_reason:
            sec.skip_contender(nu_name(t), region_reason)
        else:
            contenders.append((nu_name(t), lambda t=t: (nur if t == ncpu else nur_small).run(t)))
    try:
        exe = build_baseline()
        for t in tlist:
            contenders.append((c_name(t), lambda t=t: c_baseline(exe, size_of(t), kind, t)))
    except Skip as e:
        for t in tlist:
            sec.skip_contender(c_name(t), str(e))
    pre_name = f"numa_utils prefault() only, {ncpu} thr"
    if pre_reason:
        sec.skip_contender(pre_name, pre_reason)
    else:
        contenders.append((pre_name, lambda: nu_prefault_only(nu, size, kind, ncpu)))
    seed_name = "seed: 8 Python threads, numpy strided sum"
    try:
        import numpy as np  # noqa: PLC0415

        contenders.append((seed_name, lambda: seed_method(np, size, kind)))
    except ImportError:
        sec.skip_contender(seed_name, "numpy is not installed (pip install numpy)")
    loop_name = "plain Python loop (memoryview), 1 thr"
    contenders.append((loop_name, lambda: python_loop(loop_size, kind)))

    log(f"prefault: {common.fmt_size(size)} {kind}, {len(contenders)} contenders x {rounds} rounds")
    # Warm-up: populate and free the full size once (untimed), so no contender pays
    # for the first touch of guest memory by the hypervisor; then no per-contender
    # warm-up (that would cost a whole round of multi-GiB runs).
    try:
        warm = Segment(size, kind)
        ctypes.memset(warm.addr, 0, size)
        warm.close()
    except OSError as e:
        sec.notes.append(f"warm-up failed: {e}")
    samples, skipped = common.alternate(contenders, rounds, log=log, warmup=False)
    for name, why in skipped.items():
        sec.skip_contender(name, why)

    for name, _ in contenders:
        if name in samples:
            secs = common.summary(samples[name], "s")
            note = "median {:.3f} s".format(secs["median"]) if secs["n"] else ""
            if name == loop_name:
                note += f" on {common.fmt_size(loop_size)}"
            elif (
                (name.startswith("numa_utils create") or name.startswith("C baseline"))
                and scale_size != size
                and not name.endswith(f", {ncpu} thr")
            ):
                note += f" on {common.fmt_size(scale_size)}"
            sec.row(name, "GB/s", samples[name], note=note)
    main_nu, main_c = nu_name(ncpu), c_name(ncpu)

    def cmp(
        a: str,
        b: str,
        label: str,
        target: Optional[str] = None,
        ok: Optional[Callable[[float], bool]] = None,
    ) -> None:
        if a in samples and b in samples:
            sec.compare(label, "GB/s", samples[a], samples[b], target=target, ok=ok)

    cmp(main_nu, main_c, f"numa_utils / C baseline ({ncpu} thr)", ">= 0.95", lambda x: x >= 0.95)
    cmp(main_nu, seed_name, f"numa_utils ({ncpu} thr) / seed method", "> 1.0", lambda x: x > 1.0)
    cmp(main_nu, loop_name, f"numa_utils ({ncpu} thr) / Python loop")
    cmp(pre_name, main_c, f"prefault() only / C baseline ({ncpu} thr)")
    for t in tlist:
        if t != ncpu:
            cmp(nu_name(t), c_name(t), f"numa_utils / C baseline ({t} thr)")
    if ncpu > 1:
        cmp(nu_name(ncpu), nu_name(1), f"numa_utils scaling {ncpu} thr / 1 thr")
        cmp(c_name(ncpu), c_name(1), f"C baseline scaling {ncpu} thr / 1 thr")

    # Leak accounting: nothing this process created may remain.
    after = sysv_segments()
    ours = [sid for sid, cpid in after.items() if sid not in seg_before and cpid == os.getpid()]
    for sid in ours:
        libc().shmctl(sid, IPC_RMID, None)
    new_files = sorted(
        f for f in dev_shm() - shm_before if "numa-utils-bench" in f or str(os.getpid()) in f
    )
    sec.params["leaked_sysv_segments"] = len(ours)
    sec.params["leaked_dev_shm_files"] = len(new_files)
    if ours:
        sec.notes.append(
            f"LEAK: {len(ours)} SysV segment(s) created by this run were still "
            "present after destroy()/close(); removed them"
        )
    if new_files:
        sec.notes.append("LEAK: /dev/shm files left behind: " + ", ".join(new_files))
    for e in sorted(set(errors)):
        sec.notes.append(f"release error: {e}")
    sec.notes.append(
        "GB/s = region bytes / (creation to last page) / 1e9; the C "
        "baseline times itself, so process start-up is not counted"
    )
    if ncpu <= 2:
        sec.notes.append(f"this machine allows {ncpu} CPUs, so 'all cores' is {ncpu} threads")
    return sec


# ---------------------------------------------------------------------------
# Page modes: base pages, THP and hugetlb against the physical floor, same run
# ---------------------------------------------------------------------------

_NR_HUGE = "/proc/sys/vm/nr_hugepages"
_HUGE = 2 << 20


def _anon(size: int) -> int:
    addr = libc().mmap(
        None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0
    )
    if addr in (None, ctypes.c_void_p(-1).value):
        raise _err("mmap")
    return int(addr)


def floor(size: int) -> Dict[str, float]:
    """memset of memory already faulted in: what zeroing pages costs with no fault."""
    addr = _anon(size)
    try:
        ctypes.memset(addr, 1, size)
        t0 = time.perf_counter()
        ctypes.memset(addr, 0, size)
        dt = time.perf_counter() - t0
    finally:
        libc().munmap(ctypes.c_void_p(addr), size)
    return {"s": dt, "GB/s": size / dt / 1e9}


def nu_anon(nu: Any, size: int, thp: bool, threads: int) -> Dict[str, float]:
    """numa_utils.prefault() of anonymous memory, after MADV_HUGEPAGE with ``thp``."""
    t0 = time.perf_counter()
    addr = _anon(size)
    try:
        if thp and libc().madvise(ctypes.c_void_p(addr), size, 14) != 0:
            raise _err("madvise(MADV_HUGEPAGE)")
        nu.prefault(addr, size, threads=threads)
        dt = time.perf_counter() - t0
    finally:
        libc().munmap(ctypes.c_void_p(addr), size)
    return {"s": dt, "GB/s": size / dt / 1e9}


def nu_region(nu: Any, size: int, hugepages: Any, threads: int) -> Dict[str, float]:
    t0 = time.perf_counter()
    r = common.sibling("numa_utils_regions").SharedRegion.create(
        f"bench-modes-{os.getpid()}",
        size,
        policy="interleave",
        hugepages=hugepages,
        threads=threads,
    )
    dt = time.perf_counter() - t0
    r.destroy()
    return {"s": dt, "GB/s": size / dt / 1e9}


def _reserve_huge(size: int, notes: List[str]) -> Optional[int]:
    """Reserve enough 2 MiB pages (as root); returns the old nr_hugepages to restore,
    or None (with the reason in ``notes``) when they cannot be had."""
    try:
        with open(_NR_HUGE) as f:
            old = int(f.read())
        with open(_NR_HUGE, "w") as f:
            f.write(str(old + size // _HUGE + 1))
        with open(_NR_HUGE) as f:
            got = int(f.read()) - old
    except OSError as e:
        notes.append(f"hugetlb: cannot reserve 2 MiB pages ({_NR_HUGE}: {e.strerror}); run as root")
        return None
    if got < size // _HUGE:
        notes.append(
            f"hugetlb: the kernel gave {got} of {size // _HUGE} 2 MiB pages "
            "(memory too fragmented or too small)"
        )
        _restore_huge(old)
        return None
    return old


def _restore_huge(old: int) -> None:
    with open(_NR_HUGE, "w") as f:
        f.write(str(old))


def modes(*, size: int, rounds: int, log: Callable[[str], None] = common.log) -> Section:
    sec = Section("page_modes", "1b. Prefault by page mode against the physical floor")
    ncpu = len(os.sched_getaffinity(0))
    size = (size + _HUGE - 1) // _HUGE * _HUGE
    nu = common.numa_utils()
    thp = {
        n: (
            open(f"/sys/kernel/mm/transparent_hugepage/{n}").read().strip()
            if os.path.exists(f"/sys/kernel/mm/transparent_hugepage/{n}")
            else "-"
        )
        for n in ("enabled", "defrag", "shmem_enabled")
    }
    sec.params = {
        "size": common.fmt_size(size),
        "rounds": rounds,
        "threads": ncpu,
        **{f"thp_{k}": v for k, v in thp.items()},
    }
    exe = build_baseline()
    c = lambda kind: lambda: c_baseline(exe, size, kind, ncpu)  # noqa: E731
    contenders: List[Tuple[str, Callable[[], Dict[str, float]]]] = [
        ("floor: memset of faulted memory, 1 thr", lambda: floor(size)),
        ("base: C baseline (SysV)", c("sysv")),
        ("base: numa_utils region", lambda: nu_region(nu, size, False, ncpu)),
        ("base anon: C baseline", c("anon")),
        ("base anon: numa_utils prefault()", lambda: nu_anon(nu, size, False, ncpu)),
        ("THP anon: C baseline", c("anon-thp")),
        ("THP anon: numa_utils prefault()", lambda: nu_anon(nu, size, True, ncpu)),
    ]
    if "[never]" in thp["shmem_enabled"] or "[deny]" in thp["shmem_enabled"]:
        sec.skip_contender(
            "THP shared region",
            f"shmem_enabled is {thp['shmem_enabled']}"
            ": hugepages='thp' cannot serve shared memory here",
        )
    old = _reserve_huge(size, sec.notes)
    if old is not None:
        contenders += [
            ("hugetlb: C baseline (SysV)", c("sysv-huge")),
            ("hugetlb: numa_utils region", lambda: nu_region(nu, size, "2M", ncpu)),
        ]
    try:
        log(f"page_modes: {common.fmt_size(size)}, {len(contenders)} contenders x {rounds}")
        samples, skipped = common.alternate(contenders, rounds, log=log)
    finally:
        if old is not None:
            _restore_huge(old)
            sec.notes.append(f"nr_hugepages restored to {old}")
    for name, why in skipped.items():
        sec.skip_contender(name, why)
    for name, _ in contenders:
        if name in samples:
            sec.row(name, "GB/s", samples[name])
    flo = contenders[0][0]
    for mode, nu_name, c_name in (
        ("base", "base: numa_utils region", "base: C baseline (SysV)"),
        ("base anon", "base anon: numa_utils prefault()", "base anon: C baseline"),
        ("THP anon", "THP anon: numa_utils prefault()", "THP anon: C baseline"),
        ("hugetlb", "hugetlb: numa_utils region", "hugetlb: C baseline (SysV)"),
    ):
        if nu_name in samples and c_name in samples:
            sec.compare(
                f"{mode}: numa_utils / C baseline",
                "GB/s",
                samples[nu_name],
                samples[c_name],
                target=">= 0.9",
                ok=lambda x: x >= 0.9,
            )
            sec.compare(f"{mode}: C baseline / floor", "GB/s", samples[c_name], samples[flo])
    for big in ("THP anon: numa_utils prefault()", "hugetlb: numa_utils region"):
        if big in samples and "base: numa_utils region" in samples:
            sec.compare(
                f"{big.split(':')[0]} / base pages (numa_utils)",
                "GB/s",
                samples[big],
                samples["base: numa_utils region"],
                target=">= 3",
                ok=lambda x: x >= 3,
            )
    sec.notes.append(
        "floor = memset bandwidth of memory already faulted in (one thread); "
        "the rest create and fault the memory (zeroing included)"
    )
    return sec
