# SPDX-License-Identifier: Apache-2.0
"""Threads for numa_utils: CPUs per thread role (thread_plan), every thread pinned by
its name (pin_threads, pinned), pages moved after a late bind (settle), instances
sharing a host (instance_plans), and where a process's pages sit against its CPUs
(remote_share, choose_node).

Vendor it beside numa_utils.py (the core, which it imports) when an engine manages its
threads; binding a worker to its GPU's node needs the core alone (bind_for_gpu).
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import time
from types import MappingProxyType
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Set,
    Tuple,
    Union,
)

__version__ = "0.1.0"

__version__ = "0.1.0"

if TYPE_CHECKING:
    import ctypes
    from typing import NamedTuple as _Record

    import numa_utils as nu
else:
    nu = globals().get("_NUMA_UTILS_LIBRARY")  # the core that loaded this file, by any name
    if nu is None:
        try:  # beside this file in the engine's package (vendored), else the top-level one
            from . import numa_utils as nu
        except ImportError:
            import numa_utils as nu
    if not hasattr(nu, "_check_sibling"):
        raise ImportError(
            f"{__name__.rpartition('.')[2]} found {nu.__name__} "
            f"({getattr(nu, '__file__', '?')}), which is not numa_utils: keep the "
            "library's file name beside it, or import it through the library"
        )
    nu._check_sibling(__name__, __version__)

    ctypes = nu.ctypes  # the core's: loaded on first use
    _Record = nu._Record

__all__ = [
    "thread_plan",
    "ThreadPlan",
    "pin_threads",
    "pinned",
    "PinResult",
    "ThreadPin",
    "instance_plans",
    "InstancePlan",
    "process_tree_plan",
    "ProcessTreePlan",
    "TreeGroup",
    "settle",
    "SettleResult",
    "SETTLE_SCOPES",
    "DEFAULT_ROLES",
    "SMT_RULES",
    "RemoteShare",
    "remote_share",
    "NodeCandidate",
    "NodeChoice",
    "choose_node",
    "REMOTE_SHARE_THRESHOLD",
]


# -- end of GPU section ----------------------------------------------------------------


# -- thread roles section --------------------------------------------------------------
#
# One worker's CPUs split by what its threads do, and every thread pinned by its name.
# Engines bound late (after NCCL, UCX and ZMQ threads had started and first-touched
# their pages) or let two busy threads take two SMT siblings of one core.  Here:
#
# - thread_plan() cuts the GPU's `exclusive` plan (_plan_all: disjoint across every GPU
#   of the machine, whatever CUDA_VISIBLE_DEVICES says), or a node's CPUs, into whole
#   cores per role, under one SMT rule for every role.
# - pin_threads() pins each thread of the process by its name (/proc/self/task/TID/comm),
#   passing again until no new thread appears; pinned() puts every mask back.
# - instance_plans() splits one host among several engines.
#
# A thread's CPU mask is inherited by the threads it starts (sched_setaffinity(2), and
# clone(2) copies it): threads started after pinning get their creator's role.

DEFAULT_ROLES: Mapping[str, Union[int, str]] = MappingProxyType(
    {"feeder": 1, "copy": 1, "progress": 1, "compute": "rest"}
)
SMT_RULES = ("core", "one")  # a role gets whole cores / one CPU of each core
_PIN_PASSES = 16  # passes over /proc/self/task before giving up on threads still starting
_INHERIT_NOTE = (
    "threads started from now on inherit the CPU mask of the thread that starts them: "
    "start each from a thread pinned to the role it needs"
)


def _cpulists(sets: Mapping[str, FrozenSet[int]]) -> Dict[str, str]:
    """``{name: CPUs}`` -> ``{name: "0-3,8"}``."""
    return {name: nu.format_cpulist(cpus) for name, cpus in sets.items()}


class ThreadPlan(_Record):
    """CPUs per thread role for one worker.  Truthy when every role has cores of its
    own."""

    gpu: Optional[int]  # the CUDA index asked for; None: planned by node
    pci: Optional[str]
    node: Optional[int]  # the node whose CPUs the roles use
    roles: Dict[str, FrozenSet[int]]
    smt: str  # "core": whole cores per role; "one": one CPU of each core
    left_out: Dict[str, FrozenSet[int]]  # why -> the node's CPUs in no role
    omp_env: Dict[str, str]  # OpenMP variables placing the OpenMP role's threads
    memory_nodes: Tuple[int, ...] = ()  # where its memory should come from
    shared: Tuple[str, ...] = ()  # roles that got no core of their own
    notes: Tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return all(self.roles.values()) and not self.shared

    @property
    def cpus(self) -> FrozenSet[int]:
        """Every CPU of every role."""
        return frozenset().union(*self.roles.values())

    def to_json(self) -> Dict[str, Any]:
        return nu._record_json(
            self,
            roles={"roles": _cpulists(self.roles)},
            left_out={"left_out": _cpulists(self.left_out)},
        )


def _is_count(value: object, least: int) -> bool:
    """Whether ``value`` is an integer >= ``least`` (True and False are not counts)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return value >= least


def _cpus_of(cores: Iterable[Tuple[int, ...]]) -> FrozenSet[int]:
    """Every CPU of ``cores`` (each a tuple of SMT siblings)."""
    return frozenset(itertools.chain.from_iterable(cores))


def _role_counts(roles: Mapping[str, Union[int, str]]) -> Dict[str, Union[int, str]]:
    """``roles`` checked: each a number of cores >= 1, or "rest" for one role."""
    if not roles:
        raise ValueError("thread_plan: no roles given")
    for role, want in roles.items():
        if not isinstance(role, str) or not role:
            raise ValueError(f"a role is named by a non-empty string, not {role!r}")
        if want != "rest" and not _is_count(want, 1):
            raise ValueError(f"role {role!r}: a number of cores >= 1 or 'rest', not {want!r}")
    rest = [role for role, want in roles.items() if want == "rest"]
    if len(rest) > 1:
        raise ValueError(f"roles {', '.join(rest)}: only one role may take the 'rest'")
    return dict(roles)


def _split_roles(
    units: List[Tuple[int, ...]],
    roles: Mapping[str, Union[int, str]],
    strict: bool,
    notes: List[str],
) -> Tuple[Dict[str, FrozenSet[int]], Tuple[str, ...]]:
    """Whole ``units`` (cores) for each role in the order given, the "rest" role taking
    what the others leave; a role left without one shares the last unit (strict:
    OSError).  No units: every role gets none, and none is counted as sharing."""
    fixed = sum(want for want in roles.values() if isinstance(want, int))
    rest = len(units) - fixed  # what the "rest" role gets
    left = list(units)
    out: Dict[str, FrozenSet[int]] = {}
    shared: List[str] = []
    for role, want in roles.items():
        count = rest
        if isinstance(want, int):
            count = want
        cut = max(count, 0)
        taken = left[:cut]
        left = left[cut:]
        if not taken and units:
            taken = [units[-1]]
            shared.append(role)
            nu._fail(
                strict,
                f"role {role!r}: no core left of the {len(units)} planned; "
                f"it shares CPUs {nu.format_cpulist(units[-1])} with another role",
                notes,
            )
        out[role] = _cpus_of(taken)
    return out, tuple(shared)


def _omp_env(cpus: FrozenSet[int]) -> Dict[str, str]:
    """OpenMP variables that put one thread on each of ``cpus``, in CPU order: the
    standard's (OMP_*), GNU libgomp's (GOMP_CPU_AFFINITY) and Intel/LLVM libomp's
    (KMP_AFFINITY); {} when there is no CPU."""
    if not cpus:
        return {}
    ordered = sorted(cpus)
    places = ",".join("{" + str(cpu) + "}" for cpu in ordered)
    cpulist = nu.format_cpulist(ordered)
    return {
        "OMP_NUM_THREADS": str(len(ordered)),
        "OMP_PLACES": places,
        "OMP_PROC_BIND": "close",
        "GOMP_CPU_AFFINITY": cpulist,
        "KMP_AFFINITY": f"granularity=fine,explicit,proclist=[{cpulist}]",
    }


def _gpu_share(
    backend: nu.Backend,
    gpu: int,
    pci_bus_id: Optional[str],
    environ: Optional[Mapping[str, str]],
    reserve: int,
    strict: bool,
    notes: List[str],
) -> nu.GpuPlan:
    """CUDA device ``gpu``'s `exclusive` plan; no CPUs when it is not identified."""
    _, _, found, plan = nu._device_plan(
        backend, gpu, pci_bus_id, environ, "exclusive", reserve, None, strict
    )
    notes.extend(found.notes)
    if found.gpu is not None:
        notes.extend(plan.notes)
        return plan
    message = f"CUDA device {gpu}: not identified ({found.how}); no thread plan"
    nu._fail(strict, message, notes)
    return plan._replace(cpus=frozenset())


def _worker_share(
    caller: str,
    gpu: Optional[int],
    node: Optional[int],
    reserve: Optional[int],
    strict: Optional[bool],
    pci_bus_id: Optional[str],
    environ: Optional[Mapping[str, str]],
    backend: nu.Backend,
) -> Tuple[
    nu.Topology,
    Optional[str],
    Optional[int],
    FrozenSet[int],
    Dict[str, FrozenSet[int]],
    List[str],
    bool,
]:
    """One worker's CPUs (thread_plan's): CUDA device ``gpu``'s share of the
    `exclusive` plan, or the CPUs of ``node``, whole cores inside the cpuset.  Returns
    (topology, pci, CPU node, CPUs, why each other CPU of the node is left out, notes,
    strict)."""
    if (gpu is None) == (node is None):
        raise ValueError(f"{caller}: give a CUDA device index or node=, one of the two")
    _, res, _, st = nu._plan_args("exclusive", reserve, None, strict)
    topo = nu._planning_topology(backend)
    notes: List[str] = []
    pci: Optional[str] = None
    cpus: FrozenSet[int] = frozenset()
    if gpu is not None:
        plan = _gpu_share(backend, gpu, pci_bus_id, environ, res, st, notes)
        pci = plan.pci
        node = plan.cpu_node
        cpus = plan.cpus
    why: Dict[str, FrozenSet[int]] = {}
    if node is not None:
        node, kept, why = nu._node_slice(topo, node, res, st, notes)
        if gpu is None:
            cpus = kept
        why["planned for another GPU"] = kept - cpus
        node_cpus = topo.nodes[node].cpus
        online = node_cpus & topo.online_cpus
        why["outside this process's cpuset"] = online - topo.allowed_cpus
    return topo, pci, node, cpus, why, notes, st


def thread_plan(
    gpu: Optional[int] = None,
    *,
    node: Optional[int] = None,
    roles: Mapping[str, Union[int, str]] = DEFAULT_ROLES,
    smt: str = "core",
    omp_role: str = "compute",
    reserve: Optional[int] = None,
    strict: Optional[bool] = None,
    pci_bus_id: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
    backend: Optional[nu.Backend] = None,
) -> ThreadPlan:
    """CPUs per thread role for CUDA device ``gpu``'s worker, or for a worker on
    ``node`` (CPU-only engines, hosts without a GPU).

    A GPU's CPUs are its `exclusive` plan (cpus_for_gpu): whole cores of its node,
    disjoint from every other GPU's whatever CUDA_VISIBLE_DEVICES says, inside the
    cpuset.  ``roles`` maps a role to a number of cores, or "rest" (one role) for those
    left; roles get whole cores in the order given.  ``smt``: "core" gives a role every
    SMT sibling of its cores, "one" one CPU of each core (the siblings are left out).
    ``left_out`` says which CPUs of the node are in no role and why; ``omp_env`` holds
    the OpenMP variables for role ``omp_role``.  Too few cores: a role shares the last
    core and the plan is falsy (strict: OSError).
    """
    if smt not in SMT_RULES:
        raise ValueError(f"smt must be one of {', '.join(SMT_RULES)}, not {smt!r}")
    wanted = _role_counts(roles)
    backend = nu._b(backend)
    share = _worker_share("thread_plan", gpu, node, reserve, strict, pci_bus_id, environ, backend)
    topo, pci, cpu_node, cpus, why, notes, st = share
    units = topo.cores_of(cpus)
    if smt == "one":
        units = [core[:1] for core in units]
        why["SMT sibling (smt='one')"] = cpus - _cpus_of(units)
    got, shared = _split_roles(units, wanted, st, notes)  # no units: every role empty
    left_out = {reason: found for reason, found in why.items() if found}
    memory = nu._plan_memory(topo, [], cpu_node, "prefer")
    return ThreadPlan(
        gpu,
        pci,
        cpu_node,
        got,
        smt,
        left_out,
        _omp_env(got.get(omp_role, frozenset())),
        memory,
        shared,
        tuple(notes),
    )


# -- settle: pages first-touched before the process was bound --------------------------
#
# settle() moves what this process first-touched by accident, and nothing else.  By
# default: its private anonymous memory (heap, stacks, anonymous mmap) whose mapping
# has no policy of its own, read from its own /proc/self/maps and numa_maps.  Never:
# - shared memory (SysV, /dev/shm, memfd, shared anonymous): other processes map its
#   pages, and with CAP_SYS_NICE migrate_pages(2) takes MPOL_MF_MOVE_ALL and moves
#   them under those processes too;
# - a mapping with a policy of its own (bound or interleaved on purpose):
#   migrate_pages(2) ignores policies;
# - a file's pages, hugetlb, the kernel's own mappings ([vdso]), a range pinned for DMA.
# Pages move with move_pages(2) and MPOL_MF_MOVE (never MOVE_ALL), a batch per call,
# and one settle() call stops at its budget, so that a 200 GiB process never waits
# minutes behind one call: the result says where to go on from.

SETTLE_SCOPES = ("private", "process")
SETTLE_BUDGET_MS = 20.0
_SETTLE_BATCH = 4 << 20  # bytes per move_pages call: a few milliseconds of copying
# A line of /proc/PID/maps (fs/proc/task_mmu.c show_map_vma): start-end perms offset
# dev inode [name]; the fourth permission is "s" for a shared mapping.
_MAPS_LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S{3}(\S) \S+ \S+ \S+ *(.*)$", re.M)
# The names it gives private anonymous memory ("[stack:TID]" before Linux 4.5,
# "[anon:NAME]" from prctl(PR_SET_VMA_ANON_NAME)); "" for none.
_ANONYMOUS_NAME = re.compile(r"|\[heap\]|\[stack\]|\[stack:\d+\]|\[anon:.*\]")
_UNMOVED_HINT = (
    "the kernel kept these pages where they are (pinned by a driver, locked or busy): "
    "settle again later, or leave them"
)
_BUDGET_HINT = "the budget ended first: settle(..., start=next_address) goes on from there"
_SHARED_PAGE = -errno.EACCES  # move_pages(2) status of a page another process maps too


class SettleResult(_Record):
    """What settle did.  Truthy when it went through its whole scope within the budget
    and every page there that sat off ``nodes`` is on them now."""

    applied: bool
    nodes: FrozenSet[int]
    scope: str  # "private" (the default), "buffers" (those named) or "process"
    moved: Dict[str, int]  # bytes moved onto ``nodes``, by kind: heap, stack, anon ...
    skipped: Dict[str, int]  # bytes off ``nodes`` left alone: shared, policy, pinned, file
    finished: bool  # the whole scope was gone through within the budget
    seconds: float
    next_address: int = 0  # not finished: pass it as ``start`` to go on from there
    resident_unmoved: int = 0  # bytes in scope the kernel would not move
    reason: Optional[str] = None  # why falsy: "budget", "unmoved", "EPERM", ...
    errno: Optional[int] = None
    hint: Optional[str] = None

    def __bool__(self) -> bool:
        return self.applied

    def to_json(self) -> Dict[str, Any]:
        return nu._record_json(self)


class _Vma(_Record):
    """A line of /proc/self/maps, as much as settle needs."""

    end: int
    shared: bool
    name: str  # a file's path, "[heap]", "[vdso]" ...; "" for anonymous memory


def _maps_vmas(text: str) -> Dict[int, _Vma]:
    """/proc/PID/maps by start address."""
    vmas = {}
    for found in _MAPS_LINE.finditer(text):
        start, end, share, name = found.groups()
        vmas[int(start, 16)] = _Vma(int(end, 16), share == "s", name)
    return vmas


def _left_alone(backend: nu.Backend, entry: nu.NumaMapsEntry, vma: _Vma) -> Optional[str]:
    """Why the default scope leaves a mapping alone: "shared", "file" (a file's pages,
    hugetlb, the kernel's [vdso]) or "policy" (a policy of its own); None for private
    anonymous memory without one."""
    if vma.shared:
        return "shared"
    anonymous = entry.file is None and not entry.huge
    if not anonymous or not _ANONYMOUS_NAME.fullmatch(vma.name):
        return "file"
    if entry.mode in ("default", "local"):
        return None
    # numa_maps prints the task's policy for a mapping without one: ask the mapping's.
    try:
        value = nu.get_mempolicy(entry.start, backend=backend)[0]
    except OSError:
        return "policy"  # unknown: left alone
    mode = value & ~nu._MODE_FLAGS_MASK
    if mode in (nu.Mode.DEFAULT, nu.Mode.LOCAL):
        return None
    return "policy"


def _bytes_on(bytes_by_node: Mapping[int, int], nodes: FrozenSet[int]) -> int:
    """The bytes of ``bytes_by_node`` (node -> bytes) that sit on ``nodes``."""
    held = 0
    for node, size in bytes_by_node.items():
        if node in nodes:
            held += size
    return held


def _private_ranges(
    backend: nu.Backend, away: FrozenSet[int], skipped: Dict[str, int]
) -> List[Tuple[int, int, str]]:
    """(start, end, kind) of the default scope's mappings that hold pages on ``away``,
    by address; the bytes on ``away`` of those it leaves go into ``skipped``."""
    vmas = _maps_vmas(backend.read_text("/proc/self/maps"))
    text = backend.read_text(nu._maps_path("self"))
    entries = nu.parse_numa_maps(text, page_size_kb=nu._page_kb(backend))
    ranges = []
    for entry in entries:
        vma = vmas.get(entry.start)
        held = _bytes_on(entry.bytes_per_node, away)
        if vma is None or not held:
            continue
        why = _left_alone(backend, entry, vma)
        if why is None:
            ranges.append((entry.start, vma.end, entry.kind))
            continue
        skipped.setdefault(why, 0)
        skipped[why] += held
    return ranges


def _page_ranges(backend: nu.Backend, bufs: Iterable[Any]) -> List[Tuple[int, int]]:
    """(start, end) of the whole pages of each buffer or (address, length), sorted."""
    ranges = []
    for buf in bufs:
        if not isinstance(buf, tuple):
            buf = (buf,)
        addr, length = nu.buffer_range(*buf)
        start, size = nu._page_range(addr, length, backend.page_size)
        end = start + size
        ranges.append((start, end))
    ranges.sort()
    return ranges


def _in_turn(nodes: List[int], count: int) -> List[int]:
    """``count`` nodes taken from ``nodes`` in turn: 0, 1, 0, 1 ..."""
    return [nodes[at % len(nodes)] for at in range(count)]


def _settle_failed(
    res: SettleResult, strict: bool, reason: str, err: int, hint: Optional[str]
) -> SettleResult:
    """``res`` failed for ``reason``: falsy, logged once, or raised (strict)."""
    if strict:
        raise OSError(err, f"settle: {reason}: {hint}")
    nu._warn_once(f"settle:{reason}", "numa_utils: settle: %s. %s", reason, hint)
    return res._replace(reason=reason, errno=err, hint=hint)


class _Settling:
    """One settle call: the misplaced pages of address ranges moved onto ``target``
    with move_pages(2), a batch of pages per call, until the budget ends."""

    def __init__(
        self,
        backend: nu.Backend,
        target: FrozenSet[int],
        pinned: List[Tuple[int, int]],
        budget_ms: Optional[float],
    ) -> None:
        self.backend = backend
        self.page = backend.page_size
        self.target = target
        self.order = sorted(target)
        self.away: Optional[FrozenSet[int]] = None  # pages there move; None: any not on target
        self.pinned = pinned
        self.budget_ms = budget_ms
        self.started = time.monotonic()
        self.moved: Dict[str, int] = {}
        self.skipped: Dict[str, int] = {}
        self.unmoved = 0  # pages
        self.batches = 0
        self.stopped_at = 0  # where the budget ended it; 0: it went through

    def out_of_time(self) -> bool:
        """The budget has ended (never before the first batch)."""
        if self.budget_ms is None or not self.batches:
            return False
        elapsed = time.monotonic() - self.started
        return elapsed >= self.budget_ms / 1000

    def run(self, ranges: List[Tuple[int, int, str]], start: int) -> None:
        """Go through ``ranges`` ((start, end, kind) by address) from ``start`` on."""
        pages_per_batch = max(_SETTLE_BATCH // self.page, 1)
        step = pages_per_batch * self.page
        start -= start % self.page
        for first, end, kind in ranges:
            addr = max(first, start)
            while addr < end:
                if self.out_of_time():
                    self.stopped_at = addr
                    return
                stop = min(addr + step, end)
                pages = list(range(addr, stop, self.page))
                self.batch(pages, kind)
                addr = stop

    def misplaced(self, node: int) -> bool:
        """Whether a page on ``node`` (move_pages' status: < 0 for none) is to move."""
        if node < 0 or node in self.target:
            return False
        return self.away is None or node in self.away

    def is_pinned(self, page: int) -> bool:
        return any(start <= page < end for start, end in self.pinned)

    def count(self, tally: Dict[str, int], key: str, pages: int) -> None:
        if pages:
            tally[key] = tally.get(key, 0) + pages * self.page

    def batch(self, pages: List[int], kind: str) -> None:
        """Ask where ``pages`` are, then move the misplaced ones (pinned ones aside)."""
        self.batches += 1
        where = nu.move_pages(0, pages, backend=self.backend)
        todo = []
        for page, node in zip(pages, where):
            if not self.misplaced(node):
                continue
            if self.is_pinned(page):
                self.count(self.skipped, "pinned", 1)
            else:
                todo.append(page)
        if todo:
            self.count(self.moved, kind, self.move(todo))

    def move(self, pages: List[int]) -> int:
        """Move ``pages`` onto the target nodes in turn; how many moved.  A page another
        process maps too (a forked child's copy-on-write copy) stays, as MPOL_MF_MOVE
        leaves it (EACCES): shared; any other page that stayed: unmoved."""
        targets = _in_turn(self.order, len(pages))
        status = nu.move_pages(0, pages, targets, nu.MbindFlag.MOVE, backend=self.backend)
        shared = status.count(_SHARED_PAGE)
        left = []
        for page, node in zip(pages, status):
            stayed = node not in self.target and node != _SHARED_PAGE
            if stayed:
                left.append(page)
        unmoved = 0
        if left:  # the other pages of a huge page that moved whole say "busy": ask again
            now = nu.move_pages(0, left, backend=self.backend)
            unmoved = sum(1 for node in now if self.misplaced(node))
        self.count(self.skipped, "shared", shared)
        self.unmoved += unmoved
        return len(pages) - shared - unmoved

    def result(self, scope: str, strict: bool, err: Optional[int] = None) -> SettleResult:
        finished = not self.stopped_at and err is None
        seconds = time.monotonic() - self.started
        res = SettleResult(
            False,
            self.target,
            scope,
            self.moved,
            self.skipped,
            finished,
            seconds,
            self.stopped_at,
            self.unmoved * self.page,
        )
        if err is not None:
            reason = nu._errno_reason(err)
            return _settle_failed(res, strict, reason, err, nu._HINTS.get(reason))
        if self.unmoved:
            return _settle_failed(res, strict, "unmoved", errno.EBUSY, _UNMOVED_HINT)
        if self.stopped_at:
            return res._replace(reason="budget", hint=_BUDGET_HINT)
        return res._replace(applied=True)


def _settle_scope(scope: Optional[str], buffers: List[Any], budget_ms: Optional[float]) -> str:
    """The scope settle works in ("private", "buffers" or "process"), its arguments
    checked."""
    if budget_ms is not None and not budget_ms >= 0:
        raise ValueError(f"settle: budget_ms must be >= 0 or None, not {budget_ms!r}")
    if scope is None and buffers:
        return "buffers"
    if scope is None:
        return "private"
    if scope not in SETTLE_SCOPES:
        choices = ", ".join(SETTLE_SCOPES)
        raise ValueError(f"settle: scope must be one of {choices}, not {scope!r}")
    if buffers:
        raise ValueError(f"settle: buffers and scope={scope!r}: give one of the two")
    return scope


def settle(
    nodes: Iterable[int],
    buffers: Iterable[Any] = (),
    *,
    scope: Optional[str] = None,
    pinned: Iterable[Any] = (),
    budget_ms: Optional[float] = SETTLE_BUDGET_MS,
    start: int = 0,
    strict: Optional[bool] = None,
    backend: Optional[nu.Backend] = None,
) -> SettleResult:
    """Move the pages this process first-touched before it was bound onto ``nodes``.

    By default (scope "private") only its own private anonymous memory (heap, stacks,
    anonymous mmap) whose mapping has no policy of its own, from the other default
    memory nodes (GPU memory and slower tiers hold pages put there on purpose).
    ``skipped`` counts what it leaves, by why: shared memory other processes may map
    ("shared"), mappings with a policy ("policy"), files, hugetlb and the kernel's own
    ("file"), and ``pinned`` ranges, buffers or (address, length) such as a CudaPin's
    ``chunks`` ("pinned").  With ``buffers`` (each a buffer or (address, length)):
    exactly their pages, from any other node.  Pages move with move_pages(2)
    (MPOL_MF_MOVE, never MOVE_ALL); ``moved`` counts them by kind.

    One call works for about ``budget_ms`` (None: until done), a batch of pages per
    kernel call; when the budget ends first, ``finished`` is False and settle(...,
    start=result.next_address) goes on from there.

    ``scope="process"`` is migrate_pages(2) over the whole process instead: every
    mapping's policy is ignored, and with CAP_SYS_NICE (root) the kernel moves the
    pages of shared memory that other processes map too (MPOL_MF_MOVE_ALL), under
    them; the kernel does not say what moved.

    Truthy when the whole scope was gone through and every page in it moved;
    ``resident_unmoved`` counts the bytes the kernel kept.  Denied (Docker's default
    seccomp profile: EPERM) or unsupported: falsy with the fix (strict: OSError,
    except when only the budget ended).
    """
    backend = nu._b(backend)
    st = nu._strict_or_env(strict)
    _, allowed, default, online = nu._memory_nodes(backend)
    asked = nu._check_nodes(nodes, online)
    if not asked:
        raise ValueError("settle: no node to move pages to")
    # Nodes the cpuset forbids are left out, as the policy calls leave them out.
    target = asked & allowed
    forbidden = asked - target
    buffers = list(buffers)
    where = _settle_scope(scope, buffers, budget_ms)
    run = _Settling(backend, target, _page_ranges(backend, pinned), budget_ms)
    if not target or (forbidden and st):
        refused = run.result(where, st)
        return _settle_failed(refused, st, "cpuset", errno.EINVAL, nu._HINTS["cpuset"])
    away = default - target
    try:
        if where == "buffers":
            named = _page_ranges(backend, buffers)
            run.run([(first, end, "buffers") for first, end in named], start)
        elif where == "private":
            run.away = away
            run.run(_private_ranges(backend, away, run.skipped), start)
        else:
            run.away = away
            run.unmoved = nu.migrate_pages(0, away, target, backend=backend)
    except OSError as err:
        return run.result(where, st, err.errno or errno.EIO)
    res = run.result(where, st)
    if forbidden and res:
        return res._replace(reason="cpuset", hint=nu._HINTS["cpuset"])
    return res


_settle = settle  # pin_threads' ``settle`` argument hides the function


class ThreadPin(_Record):
    """One thread as pin_threads found and left it."""

    tid: int
    name: str  # /proc/self/task/TID/comm ("" when unreadable)
    role: Optional[str]  # None: its name matched no role, and there is no default
    before: FrozenSet[int]
    after: FrozenSet[int]
    ok: bool  # pinned to its role's CPUs
    reason: Optional[str] = None  # why not: "no role", "exited", "EPERM", ...
    start: Optional[str] = None  # when it started (stat field 22): its id alone may be reused

    @property
    def failed(self) -> bool:
        """It matched a role, did not exit meanwhile, and is not on the role's CPUs."""
        return self.role is not None and not self.ok and self.reason != "exited"

    def to_json(self) -> Dict[str, Any]:
        return nu._record_json(
            self,
            before={"before": nu.format_cpulist(self.before)},
            after={"after": nu.format_cpulist(self.after)},
        )


class PinResult(_Record):
    """What pin_threads did to each thread of the process.  Truthy when every thread
    that matched a role (and did not exit meanwhile) is pinned to its role's CPUs."""

    threads: Tuple[ThreadPin, ...]  # every thread seen, in the order pinned
    unmatched: Tuple[int, ...]  # tids whose name matched no role (left alone)
    late: Tuple[int, ...]  # tids that appeared during a pass (pinned by a later one)
    passes: int
    inherit: str = _INHERIT_NOTE
    notes: Tuple[str, ...] = ()
    settled: Optional[SettleResult] = None  # settle=True: the pages moved to the plan's

    def __bool__(self) -> bool:
        return not any(pin.failed for pin in self.threads)


def _role_patterns(
    plan: ThreadPlan, match: Mapping[str, str], default: Optional[str]
) -> Dict[str, re.Pattern[str]]:
    """``match``'s regular expressions compiled, each naming a role of ``plan``."""
    named = list(match)
    if default is not None:
        named.append(default)
    for role in named:
        if role not in plan.roles:
            raise ValueError(f"role {role!r} is not in the plan ({', '.join(plan.roles)})")
    patterns: Dict[str, re.Pattern[str]] = {}
    for role, text in match.items():
        try:
            patterns[role] = re.compile(text)
        except re.error as err:
            raise ValueError(f"role {role!r}: invalid thread-name pattern {text!r}: {err}") from err
    return patterns


def _task_text(backend: nu.Backend, tid: int, name: str) -> str:
    """/proc/self/task/TID/NAME; "" when it cannot be read (the thread exited)."""
    text = nu._read_optional(backend, f"/proc/self/task/{tid}/{name}")
    return text or ""


def _thread_name(backend: nu.Backend, tid: int) -> str:
    return nu._clean(_task_text(backend, tid, "comm"))


def _thread_start(backend: nu.Backend, tid: int) -> Optional[str]:
    """When thread ``tid`` of this process started (proc(5) stat field 22, counted
    after the name, which may hold ") "); None when this process has no such thread
    (it exited: its id may be another task's by now)."""
    stat = _task_text(backend, tid, "stat")
    _, _, after_name = stat.rpartition(")")
    fields = after_name.split()
    if len(fields) < 20:
        return None
    return fields[19]


def _pin_thread(
    backend: nu.Backend,
    plan: ThreadPlan,
    patterns: Mapping[str, re.Pattern[str]],
    default: Optional[str],
    tid: int,
) -> ThreadPin:
    """Thread ``tid`` pinned to the CPUs of the first role whose pattern its name
    matches (``default`` when none does)."""
    name = _thread_name(backend, tid)
    start = _thread_start(backend, tid)
    role = default
    for candidate, pattern in patterns.items():
        if pattern.search(name):
            role = candidate
            break
    nothing: FrozenSet[int] = frozenset()
    gone = ThreadPin(tid, name, role, nothing, nothing, False, "exited", start)
    if start is None:
        return gone
    try:
        before = backend.call("sched_getaffinity", tid)
    except ProcessLookupError:
        return gone
    left = gone._replace(before=before, after=before)
    if role is None:
        return left._replace(reason="no role")
    want = plan.roles[role]
    if not want:
        return left._replace(reason="role has no CPUs")
    try:
        backend.call("sched_setaffinity", tid, want)
        after = backend.call("sched_getaffinity", tid)
    except ProcessLookupError:
        return gone._replace(before=before)
    except OSError as err:
        return left._replace(reason=nu._errno_reason(err.errno or errno.EIO))
    if after != want:
        return left._replace(after=after, reason="the kernel applied other CPUs")
    return left._replace(after=after, ok=True, reason=None)


def pin_threads(
    plan: ThreadPlan,
    match: Optional[Mapping[str, str]] = None,
    *,
    default: Optional[str] = None,
    settle: bool = False,
    strict: Optional[bool] = None,
    backend: Optional[nu.Backend] = None,
) -> PinResult:
    """Pin every thread of this process to the CPUs of its role in ``plan``.

    ``match`` maps a role to a regular expression searched in each thread's name
    (/proc/self/task/TID/comm: "NCCL", "ucx", "ZMQbg"); the first role that matches
    wins, ``default`` takes the rest (None: they are left alone and listed in
    ``unmatched``).  Threads that appear while it works are pinned by another pass,
    until a pass finds none new.  Threads started afterwards inherit the mask of the
    thread that starts them (``inherit``).  ``settle``: then move the pages the process
    first-touched elsewhere to the plan's memory nodes, all of them (settle's default
    scope, no budget: ``settled``).  Strict:
    OSError when a matched thread could not be pinned.
    """
    backend = nu._b(backend)
    st = nu._strict_or_env(strict)
    patterns = _role_patterns(plan, match or {}, default)
    seen: Dict[int, ThreadPin] = {}
    late: List[int] = []
    notes: List[str] = []
    passes = 0
    new = backend.call("threads")
    while new and passes < _PIN_PASSES:
        passes += 1
        if passes > 1:
            late.extend(new)
        for tid in new:
            seen[tid] = _pin_thread(backend, plan, patterns, default, tid)
        running = backend.call("threads")
        new = [tid for tid in running if tid not in seen]
    if new:
        nu._fail(st, f"threads kept starting: {len(new)} not pinned after {passes} passes", notes)
    for pin in seen.values():
        if pin.failed:
            msg = f"thread {pin.tid} ({pin.name}): not pinned to role {pin.role}: {pin.reason}"
            nu._fail(st, msg, notes)
    threads = tuple(seen.values())
    unmatched = tuple(pin.tid for pin in threads if pin.role is None)
    moved = None
    if settle and plan.memory_nodes:
        moved = _settle(plan.memory_nodes, budget_ms=None, strict=st, backend=backend)
    elif settle:
        nu._fail(st, "settle: the plan names no memory node; the pages stay where they are", notes)
    return PinResult(threads, unmatched, tuple(late), passes, notes=tuple(notes), settled=moved)


class pinned:
    """Context manager: pin_threads(plan, match, ...) on entry (the PinResult is what
    ``as`` gets); on exit every thread mask it changed is put back (``restored``), and
    the calling thread's memory policy when ``memory`` ("prefer", "bind", ...) set it
    to the plan's memory nodes.

    A thread is put back only while it is still one of this process's
    (/proc/self/task) and started when the one pinned did: once a thread exits, its
    id may name a new thread or another process (as root, any process's mask could be
    overwritten).  The others are listed in ``exited``.  (A thread that exits and
    whose id is taken again between that check and the call is beyond any check:
    sched_setaffinity(2) takes an id, not a handle.)"""

    def __init__(
        self,
        plan: ThreadPlan,
        match: Optional[Mapping[str, str]] = None,
        *,
        default: Optional[str] = None,
        memory: Optional[str] = None,
        strict: Optional[bool] = None,
        backend: Optional[nu.Backend] = None,
    ) -> None:
        self.plan = plan
        self.match = match
        self.default = default
        self.memory = memory
        self.strict = strict
        self.backend = backend
        self.result: Optional[PinResult] = None
        self.restored: List[int] = []  # tids whose mask was put back
        self.exited: List[int] = []  # tids that exited meanwhile: left alone
        self._policy: Optional[nu.thread_policy] = None

    def __enter__(self) -> PinResult:
        if self.memory is not None:
            policy = nu.thread_policy(
                self.memory, self.plan.memory_nodes, strict=self.strict, backend=self.backend
            )
            policy.__enter__()
            self._policy = policy
        self.result = pin_threads(
            self.plan, self.match, default=self.default, strict=self.strict, backend=self.backend
        )
        return self.result

    def __exit__(self, *exc: Any) -> None:
        backend = nu._b(self.backend)
        pins: Tuple[ThreadPin, ...] = ()
        if self.result is not None:
            pins = self.result.threads
        changed = [pin for pin in pins if pin.before and pin.after != pin.before]
        for pin in changed:
            if pin.start is None or _thread_start(backend, pin.tid) != pin.start:
                self.exited.append(pin.tid)
                continue
            try:
                backend.call("sched_setaffinity", pin.tid, pin.before)
                self.restored.append(pin.tid)
            except ProcessLookupError:
                self.exited.append(pin.tid)
            except OSError as err:
                nu._warn_once(
                    f"pinned-restore:{pin.tid}",
                    "numa_utils: could not restore thread %s's CPU mask: %s",
                    pin.tid,
                    err,
                )
        if self._policy is not None:
            self._policy.__exit__(*exc)


class InstancePlan(_Record):
    """One engine's share of the host, disjoint from every other instance's."""

    instance: int  # 0, 1, ...
    gpus: Tuple[int, ...]  # GPU indexes in PCI order (CUDA_DEVICE_ORDER=PCI_BUS_ID)
    pcis: Tuple[str, ...]
    cpus: FrozenSet[int]
    nodes: Tuple[int, ...]  # the nodes of its CPUs
    memory_nodes: Tuple[int, ...]
    environ: Dict[str, str]  # the variables its process starts with
    notes: Tuple[str, ...] = ()

    def to_json(self) -> Dict[str, Any]:
        return nu._record_json(
            self, cpus={"cpus": sorted(self.cpus), "cpulist": nu.format_cpulist(self.cpus)}
        )


def _usable_nodes(topo: nu.Topology) -> List[int]:
    """The nodes with CPUs this process may use (online, in its cpuset), by id."""
    usable_cpus = topo.allowed_cpus & topo.online_cpus
    usable = []
    for node in sorted(topo.nodes_with_cpus):
        if topo.nodes[node].cpus & usable_cpus:
            usable.append(node)
    return usable


def _memory_for(
    topo: nu.Topology, infos: List[nu.GpuInfo], nodes: Iterable[Optional[int]]
) -> Tuple[int, ...]:
    """The memory nodes of workers on ``nodes`` ("prefer": each node's own or its
    nearest), together, by id."""
    memory: Set[int] = set()
    for node in nodes:
        memory.update(nu._plan_memory(topo, infos, node, "prefer"))
    return tuple(sorted(memory))


def _gpu_instances(
    topo: nu.Topology, infos: List[nu.GpuInfo], n: int, per: int, reserve: int, strict: bool
) -> List[InstancePlan]:
    """Instance i: GPUs i*per ... (PCI order), with their `exclusive` CPUs."""
    fam = nu._family(infos)
    needed = n * per
    if needed > len(fam):
        raise ValueError(
            f"{n} instances of {per} GPUs need {needed} GPUs; this host has {len(fam)}"
        )
    planned = nu._plan_all(topo, infos, "exclusive", reserve, strict)
    out = []
    for index in range(n):
        first = index * per
        picked = range(first, first + per)
        cpus: Set[int] = set()
        homes: List[Optional[int]] = []
        for gpu in picked:
            node, their_cpus, _ = planned[fam[gpu].pci]
            cpus |= their_cpus
            homes.append(node)
        nodes = {node for node in homes if node is not None}
        visible = ",".join(str(gpu) for gpu in picked)
        env = {"CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        pcis = tuple(fam[gpu].pci for gpu in picked)
        out.append(
            InstancePlan(
                index,
                tuple(picked),
                pcis,
                frozenset(cpus),
                tuple(sorted(nodes)),
                _memory_for(topo, infos, homes),
                env,
            )
        )
    return out


def _node_instances(topo: nu.Topology, n: int) -> List[InstancePlan]:
    """Instance i: a run of whole nodes (those with CPUs this process may use)."""
    usable = _usable_nodes(topo)
    if n > len(usable):
        raise ValueError(
            f"{n} CPU-only instances need {n} nodes with CPUs; this process may use {len(usable)}"
        )
    allowed = topo.allowed_cpus & topo.online_cpus
    out = []
    for index, run in enumerate(nu._chunks(len(usable), n)):
        nodes = usable[run.start : run.stop]
        cpus: Set[int] = set()
        for node in nodes:
            cpus |= topo.nodes[node].cpus & allowed
        memory = _memory_for(topo, [], nodes)
        out.append(InstancePlan(index, (), (), frozenset(cpus), tuple(nodes), memory, {}))
    return out


def _note_shared_memory(plans: List[InstancePlan]) -> List[InstancePlan]:
    """``plans`` with a note on each instance whose memory nodes another one uses."""
    out = []
    for plan in plans:
        mine = set(plan.memory_nodes)
        shared: Set[int] = set()
        for other in plans:
            if other.instance != plan.instance:
                shared |= mine.intersection(other.memory_nodes)
        if shared:
            note = f"memory on nodes {nu.format_cpulist(shared)} is shared with another instance"
            plan = plan._replace(notes=plan.notes + (note,))
        out.append(plan)
    return out


def instance_plans(
    n: int,
    *,
    gpus_per_instance: int = 1,
    reserve: Optional[int] = None,
    strict: Optional[bool] = None,
    backend: Optional[nu.Backend] = None,
) -> List[InstancePlan]:
    """Disjoint shares of this host for ``n`` engines: GPUs, CPUs and memory nodes.

    With ``gpus_per_instance`` >= 1, instance i gets the GPUs i*g ... i*g+g-1 in PCI
    order (``environ`` names them for its process) and their `exclusive` CPUs;
    memory comes from their nodes, shared (and noted) when two instances' GPUs sit on
    one node.  With 0 (CPU-only engines) each instance gets a run of whole nodes.
    Too few GPUs or nodes: ValueError.
    """
    if not _is_count(n, 1):
        raise ValueError(f"instance_plans: n must be an integer >= 1, not {n!r}")
    per = gpus_per_instance
    if not _is_count(per, 0):
        raise ValueError(f"gpus_per_instance must be an integer >= 0, not {per!r}")
    backend = nu._b(backend)
    _, res, _, st = nu._plan_args("exclusive", reserve, None, strict)
    topo = nu._planning_topology(backend)
    if per == 0:
        return _note_shared_memory(_node_instances(topo, n))
    infos = nu._gpu_infos(topo, backend)
    return _note_shared_memory(_gpu_instances(topo, infos, n, per, res, st))


# -- process trees ------------------------------------------------------------------------
#
# An engine's processes: an API server starts an engine core (or scheduler) for each
# data-parallel group, and each engine core its tensor-parallel workers.  A child's CPU
# list must lie inside its parent's (vLLM checks it), groups must not pile onto one node,
# and no plan may widen what this process was given (an NRI balloon's or taskset's
# affinity): process_tree_plan plans from this process's own affinity, not the cpuset.


def _worker_json(plan: nu.GpuPlan) -> Dict[str, Any]:
    nodes = []
    if plan.cpu_node is not None:
        nodes.append(plan.cpu_node)
    return {
        "gpu": plan.gpu,
        "pci": plan.pci,
        "cpus": nu.format_cpulist(plan.cpus),
        "nodes": nodes,
        "memory_nodes": list(plan.memory_nodes),
    }


class TreeGroup(_Record):
    """One data-parallel group of process_tree_plan: its engine core's share."""

    rank: int  # the data-parallel rank
    cpus: FrozenSet[int]  # the engine core's: every CPU of its workers
    nodes: Tuple[int, ...]  # the nodes of its workers' CPUs
    workers: Tuple[nu.GpuPlan, ...]  # one per tensor-parallel rank

    def to_json(self) -> Dict[str, Any]:
        cpulist = nu.format_cpulist(self.cpus)
        rows = [_worker_json(plan) for plan in self.workers]
        return nu._record_json(self, cpus={"cpus": cpulist}, workers={"workers": rows})


class ProcessTreePlan(_Record):
    """process_tree_plan's answer: the groups, in data-parallel rank order.  JSON:
    ``{"groups": [{"rank", "cpus", "nodes", "workers": [{"gpu", "pci", "cpus",
    "nodes", "memory_nodes"}]}], "notes"}``, CPU lists in the kernel's list format."""

    groups: Tuple[TreeGroup, ...]
    notes: Tuple[str, ...] = ()

    def to_json(self) -> Dict[str, Any]:
        return nu._record_json(self)


def _gpu_workers(
    topo: nu.Topology,
    backend: nu.Backend,
    environ: Mapping[str, str],
    count: int,
    reserve: int,
    strict: bool,
    notes: List[str],
) -> List[nu.GpuPlan]:
    """The first ``count`` CUDA devices' `exclusive` shares, planned with every GPU of
    the machine (disjoint within a node, whatever CUDA_VISIBLE_DEVICES shows)."""
    infos = nu._gpu_infos(topo, backend)
    nvml = nu._nvml_devices(backend)
    visible, seen = nu._visible_gpus(infos, nvml, environ)
    notes.extend(seen)
    if not visible:
        return []
    if count > len(visible):
        raise ValueError(f"{count} workers need {count} GPUs; this process sees {len(visible)}")
    planned = nu._plan_all(topo, infos, "exclusive", reserve, strict)
    out = []
    for index in range(count):
        found = visible[index]
        plan = nu._plan_for(topo, infos, found, index, "exclusive", "prefer", (), planned)
        out.append(plan)
    return out


def _cpu_homes(topo: nu.Topology, count: int) -> List[int]:
    """The node of each of ``count`` CPU workers: worker w on usable node
    w * nodes // count, so a group's workers sit together and groups take runs of
    nodes of their own when there are enough."""
    usable = _usable_nodes(topo)
    homes = []
    for worker in range(count):
        at = worker * len(usable) // count
        homes.append(usable[at])
    return homes


def _node_workers(
    topo: nu.Topology, node: int, mates: int, reserve: int, strict: bool, notes: List[str]
) -> List[nu.GpuPlan]:
    """``mates`` CPU workers on ``node``: its whole cores (NUMA_RESERVED_CORES left
    out) split into runs, one each; fewer cores than workers: one core each, shared."""
    _, node_cpus, _ = nu._node_slice(topo, node, reserve, strict, notes)
    cores = topo.cores_of(node_cpus)
    if len(cores) < mates:
        message = f"node {node} has {len(cores)} usable cores for {mates} workers: they share cores"
        nu._fail(strict, message, notes)
    memory = nu._plan_memory(topo, [], node, "prefer")
    base = nu.GpuPlan(None, None, None, node, frozenset(), "prefer", memory, "exclusive")
    out = []
    runs = nu._chunks(len(cores), mates)
    for rank, run in enumerate(runs):
        mine = cores[run.start : run.stop]
        if not mine:  # fewer cores than workers
            mine = [cores[rank % len(cores)]]
        out.append(base._replace(cpus=_cpus_of(mine)))
    return out


def _tree_group(rank: int, workers: List[nu.GpuPlan]) -> TreeGroup:
    """Group ``rank``: every CPU and node of its workers."""
    cpus: Set[int] = set()
    nodes: Set[int] = set()
    for plan in workers:
        cpus |= plan.cpus
        if plan.cpu_node is not None:
            nodes.add(plan.cpu_node)
    found = tuple(sorted(nodes))
    return TreeGroup(rank, frozenset(cpus), found, tuple(workers))


def _overlaps(groups: List[TreeGroup]) -> List[str]:
    """A note for each two groups that share CPUs (the machine left no other way)."""
    notes = []
    for first, second in itertools.combinations(groups, 2):
        shared = nu.format_cpulist(first.cpus & second.cpus)
        if shared:
            notes.append(f"groups {first.rank} and {second.rank} share CPUs {shared}")
    return notes


def process_tree_plan(
    dp: int = 1,
    tp: int = 1,
    *,
    reserve: Optional[int] = None,
    strict: Optional[bool] = None,
    environ: Optional[Mapping[str, str]] = None,
    backend: Optional[nu.Backend] = None,
) -> ProcessTreePlan:
    """A plan for an engine's process tree: ``dp`` data-parallel groups of ``tp``
    tensor-parallel workers, an engine core (scheduler, API server's child) above each.

    Group g's workers are CUDA devices g*tp ... g*tp+tp-1 as this process numbers them
    (CUDA_VISIBLE_DEVICES, ``environ``), each on its GPU's node with its `exclusive`
    share; without a visible GPU, CPU workers spread over the nodes, whole cores each.
    A group's CPUs are every CPU of its workers (a parent holds its children's), so
    groups are disjoint wherever the workers are.  Everything lies inside this
    process's own affinity, never widened to the cpuset.  ``notes`` says where the
    machine forced sharing.  More workers than GPUs: ValueError.
    """
    for value in (dp, tp):
        if type(value) is not int or value < 1:
            raise ValueError(f"process_tree_plan: dp={dp!r}, tp={tp!r}: each an integer >= 1")
    backend = nu._b(backend)
    if environ is None:
        environ = os.environ
    _, res, _, st = nu._plan_args("exclusive", reserve, None, strict)
    topo = nu.read_topology(backend=backend)  # allowed_cpus: this process's affinity
    notes: List[str] = []
    count = dp * tp
    workers = _gpu_workers(topo, backend, environ, count, res, st, notes)
    if not workers:  # no GPU: workers spread over the nodes, a node's together
        homes = _cpu_homes(topo, count)
        for node in sorted(set(homes)):
            mates = homes.count(node)
            workers += _node_workers(topo, node, mates, res, st, notes)
    groups = []
    for rank in range(dp):
        first = rank * tp
        mine = workers[first : first + tp]
        groups.append(_tree_group(rank, mine))
    notes.extend(_overlaps(groups))
    return ProcessTreePlan(tuple(groups), tuple(notes))


# -- end of thread roles section -------------------------------------------------------


# ===========================================================================
# Observation: counters, remote share, node chooser, CUDA pinning.
# ===========================================================================

# -- observation section ---------------------------------------------------------------


# The share of a process's pages that may sit off its CPUs' nodes before we warn
# (the seed write-up alerts above 10%).
REMOTE_SHARE_THRESHOLD = 0.10


# ---------------------------------------------------------------------------
# Remote share: where a process's pages are against where its CPUs are.
# ---------------------------------------------------------------------------


def _fraction(part: int, total: int) -> float:
    """``part`` / ``total``; 0.0 when ``total`` is 0 (nothing mapped or measured)."""
    if not total:
        return 0.0
    return part / total


class RemoteShare(_Record):
    """Where a process's pages are, against the nodes of the CPUs it may run on."""

    pid: Union[int, str]
    bytes_by_node: Mapping[int, int]
    cpus: FrozenSet[int]  # Cpus_allowed_list
    local_nodes: FrozenSet[int]  # memory nodes local to those CPUs
    threshold: float = REMOTE_SHARE_THRESHOLD
    error: Optional[str] = None  # why nothing could be measured

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_node.values())

    @property
    def remote_bytes(self) -> int:
        return self.total_bytes - self.local_bytes

    @property
    def local_bytes(self) -> int:
        return _bytes_on(self.bytes_by_node, self.local_nodes)

    @property
    def share(self) -> float:
        """Remote bytes / all bytes (0.0 when nothing is mapped or measured)."""
        return _fraction(self.remote_bytes, self.total_bytes)

    @property
    def over_threshold(self) -> bool:
        return self.total_bytes > 0 and self.share > self.threshold

    @property
    def warning(self) -> Optional[str]:
        if not self.over_threshold:
            return None
        return (
            f"process {self.pid}: {self.share:.0%} of its pages "
            f"({nu.format_kib(self.remote_bytes // 1024)}) sit off the nodes of its CPUs "
            f"({nu._nodes_txt(self.local_nodes)}); above the {self.threshold:.0%} threshold: "
            "bind its memory to its CPUs' node or move its CPUs to where the memory is"
        )

    def to_json(self) -> Dict[str, Any]:
        total = self.total_bytes
        by = sorted(self.bytes_by_node.items())
        return nu._record_json(
            self,
            bytes_by_node={
                "bytes_by_node": {str(node): size for node, size in by},
                "share_by_node": {str(node): _fraction(size, total) for node, size in by},
            },
            threshold={
                "total_bytes": total,
                "remote_bytes": self.remote_bytes,
                "remote_share": self.share,
                "threshold": self.threshold,
                "over_threshold": self.over_threshold,
            },
        )


def _local_memory(topo: nu.Topology, cpus: FrozenSet[int]) -> FrozenSet[int]:
    """The memory nodes local to ``cpus``: their nodes, and for a CPU node without
    memory the nearest with memory (where the kernel's local allocation goes)."""
    if not topo.has_node_dir:
        return frozenset({0})
    local: Set[int] = set()
    for cpu in cpus:
        node = topo.node_of_cpu(cpu)
        if node is not None:
            local.update(nu._nearest_tied(topo, node, topo.nodes_with_memory))
    return frozenset(local)


def _remote_share(
    pid: Union[int, str],
    maps: Union[str, OSError],
    threshold: float,
    topo: nu.Topology,
    backend: nu.Backend,
) -> Tuple[RemoteShare, List[nu.NumaMapsEntry]]:
    """remote_share on numa_maps text already read (or the error reading it), and the
    entries parsed from it."""
    entries: List[nu.NumaMapsEntry] = []
    error = None
    if isinstance(maps, OSError):
        error = f"cannot read /proc/{pid}/numa_maps: {maps.strerror or maps}"
    else:
        try:
            entries = nu.parse_numa_maps(maps, page_size_kb=nu._page_kb(backend))
        except ValueError as err:  # a malformed line (parse_numa_maps names it)
            error = str(err)
    try:
        cpus: Optional[FrozenSet[int]] = nu._allowed_from_status(backend, pid)[0]
    except ValueError:
        cpus = None
    if cpus is None:
        cpus = topo.allowed_cpus if pid == "self" else frozenset()
        error = error or f"cannot read Cpus_allowed_list of /proc/{pid}/status"
    res = RemoteShare(
        pid,
        MappingProxyType(nu._entries_bytes(entries)),
        frozenset(cpus),
        _local_memory(topo, cpus),
        threshold,
        error,
    )
    if res.warning:
        nu._warn_once(f"remote-share:{pid}", "numa_utils: %s", res.warning)
    return res, entries


def remote_share(
    pid: Union[int, str] = "self",
    *,
    threshold: float = REMOTE_SHARE_THRESHOLD,
    topology: Optional[nu.Topology] = None,
    backend: Optional[nu.Backend] = None,
) -> RemoteShare:
    """The share of ``pid``'s pages (numa_maps) that sit off the nodes of the CPUs it
    may run on (Cpus_allowed_list).  Never raises: an unreadable process gives a
    result with ``error`` set and no pages.  Warns once when above ``threshold``."""
    backend = nu._b(backend)
    topo = nu._topology_or_read(topology, backend)
    try:
        maps: Union[str, OSError] = backend.read_text(nu._maps_path(pid))
    except OSError as err:
        maps = err
    return _remote_share(pid, maps, threshold, topo, backend)[0]


# ---------------------------------------------------------------------------
# Node chooser.
# ---------------------------------------------------------------------------


class NodeCandidate(_Record):
    """One node considered by ``choose_node``."""

    node: int
    memory_node: Optional[int]  # where its allocations go (itself, or nearest)
    available_kb: int  # MemFree + reclaimable file pages of memory_node
    load: int  # workers already placed there (``loads``)
    gpu_distance: Optional[int]  # distance from the GPU's node (None: no GPU)
    memory_distance: Optional[int]  # distance to memory_node
    fits: bool  # available_kb covers need_bytes

    def to_json(self) -> Dict[str, Any]:
        return nu._record_json(self)


class NodeChoice(_Record):
    """What ``choose_node`` picked and why.  Falsy when no node could be chosen."""

    node: Optional[int]
    reason: str
    candidates: Tuple[NodeCandidate, ...] = ()
    gpu_node: Optional[int] = None

    def __bool__(self) -> bool:
        return self.node is not None

    def to_json(self) -> Dict[str, Any]:
        return nu._record_json(self)


def _resolve_gpu(
    gpu: Any, topo: nu.Topology, backend: nu.Backend, environ: Optional[Mapping[str, str]]
) -> Tuple[Optional[int], str]:
    """(the GPU's own node, label) for a CUDA device index (as this process numbers
    it: CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER honoured), a PCI address or a
    GpuInfo.  The node may be memory-only (GPU memory exposed as a node)."""
    if isinstance(gpu, nu.GpuInfo):
        return gpu.node, f"GPU {gpu.pci}"
    infos = nu._gpu_infos(topo, backend)
    if isinstance(gpu, bool) or not isinstance(gpu, (int, str)):
        raise TypeError(f"gpu must be a CUDA device index, a PCI address or a GpuInfo, not {gpu!r}")
    if isinstance(gpu, str):
        by_address = nu._resolve(0, gpu, infos, backend, environ)
        found = by_address.gpu
        if found is None:
            known = ", ".join(info.pci for info in infos) or "none"
            raise ValueError(f"no GPU at PCI address {gpu!r} ({by_address.how}); GPUs: {known}")
        return found.node, f"GPU {found.pci}"
    by_index = nu._resolve(gpu, None, infos, backend, environ)
    found = by_index.gpu
    if found is None:
        raise ValueError(f"no GPU {gpu}: {by_index.how}")
    return found.node, f"CUDA device {gpu} (GPU {found.pci})"


def choose_node(
    *,
    gpu: Any = None,
    need_bytes: int = 0,
    exclude: Iterable[int] = (),
    loads: Optional[Mapping[int, int]] = None,
    environ: Optional[Mapping[str, str]] = None,
    backend: Optional[nu.Backend] = None,
) -> NodeChoice:
    """Pick the node for a new worker the way a careful operator would.

    Only nodes with CPUs that this process's cpuset allows are candidates (never
    assuming contiguous ids).  Order: the GPU's node when ``gpu`` is given (the
    nearest node with CPUs when the GPU hangs off a memory-only node), enough memory
    for ``need_bytes`` (MemFree plus reclaimable file pages), fewest workers already
    there (``loads``: node -> count), then the shortest distance to memory.  The
    result says why in ``reason`` and lists every candidate.  ``gpu``: a CUDA device
    index (CUDA_VISIBLE_DEVICES from ``environ``, default os.environ), a PCI address
    or a GpuInfo.
    """
    backend = nu._b(backend)
    # The cpuset, not this thread's affinity: after bind_to_node the affinity is one
    # node, and a new worker may still go anywhere the cpuset allows.
    topo = nu._planning_topology(backend)
    # Per-node free memory with reclaimable page cache: numa_utils_regions' counters
    # when that file is here, else the topology's MemFree.
    regions = nu._sibling("numa_utils_regions")
    meminfo: Mapping[int, Any] = {}
    if regions is not None:
        meminfo = regions.counters(backend=backend).nodes
    excluded = nu._check_nodes(exclude, topo.online_nodes)
    placed: Mapping[int, int] = loads or {}
    nu._check_nodes(placed, topo.online_nodes)
    usable_mem = nu.default_memory_nodes(topo)
    if topo.has_node_dir:
        nodes = sorted(
            node
            for node in topo.nodes_with_cpus
            if node in topo.nodes and topo.nodes[node].cpus & topo.allowed_cpus
        )
    else:
        nodes = [0]
    skipped = [node for node in nodes if node in excluded]
    nodes = [node for node in nodes if node not in excluded]
    gnode: Optional[int] = None
    glabel = ""
    if gpu is not None:
        gnode, glabel = _resolve_gpu(gpu, topo, backend, environ)

    need = max(int(need_bytes), 0)
    need_kb = (need + 1023) // 1024
    cands: List[NodeCandidate] = []
    for node in nodes:
        nearest = nu._nearest_tied(topo, node, usable_mem)
        mnode = next(iter(nearest), None)
        candidate = None
        memory_distance = None
        if mnode is not None:
            candidate = meminfo.get(mnode)
            memory_distance = topo.distance(node, mnode)
        gpu_distance = None
        if gnode is not None:
            gpu_distance = topo.distance(gnode, node)
        # counters' meminfo, else the topology's free memory (no nodeN/meminfo)
        if candidate is not None and candidate.meminfo:
            avail = candidate.available_kb
        elif mnode is not None and mnode in topo.nodes:
            avail = topo.nodes[mnode].mem_free_kb
        else:
            avail = 0
        cands.append(
            NodeCandidate(
                node=node,
                memory_node=mnode,
                available_kb=avail,
                load=int(placed.get(node, 0)),
                gpu_distance=gpu_distance,
                memory_distance=memory_distance,
                fits=avail >= need_kb,
            )
        )
    if not cands:
        allowed = nu.format_cpulist(topo.allowed_cpus) or "-"
        if skipped:
            reason = (
                f"no node with CPUs is usable (excluded: {nu.format_cpulist(skipped)});"
                f" this process may run on CPUs {allowed}"
            )
        else:
            reason = f"no node with CPUs is usable; this process may run on CPUs {allowed}"
        return NodeChoice(None, reason, (), gnode)
    far = 1 << 16

    def key(candidate: NodeCandidate) -> Tuple[int, ...]:
        # (without a GPU, gd is the same for every node)
        if candidate.gpu_distance is not None:
            gd = candidate.gpu_distance
        elif candidate.node == gnode:
            gd = 0
        else:
            gd = far
        if candidate.memory_distance is not None:
            md = candidate.memory_distance
        else:
            md = far
        # Last: more memory available, then the lower id (a stable answer).
        return (not candidate.fits, gd, candidate.load, md, -candidate.available_kb, candidate.node)

    fitting = [candidate for candidate in cands if candidate.fits]
    if fitting:
        best = min(fitting, key=key)
    else:
        best = max(cands, key=lambda candidate: (candidate.available_kb, -candidate.node))
    parts: List[str] = []
    if gnode is None:
        if gpu is not None:
            parts = [
                f"{glabel}'s node is unknown (firmware reports numa_node=-1), so it did not count"
            ]
    elif best.node == gnode:
        parts = [f"{glabel} is on node {gnode}"]
    elif gnode not in topo.nodes_with_cpus:
        parts = [
            f"{glabel} is on node {gnode}, which has no CPUs;"
            f" node {best.node} is the nearest node with CPUs this process may use"
            f" (distance {best.gpu_distance})"
        ]
    elif gnode in excluded:
        parts = [
            f"{glabel} is on node {gnode}, which was excluded;"
            f" node {best.node} is the nearest other usable node"
        ]
    elif not any(candidate.node == gnode for candidate in cands):
        parts = [
            f"{glabel} is on node {gnode} but this process's cpuset allows none of its CPUs;"
            f" node {best.node} is the nearest allowed node"
        ]
    else:
        parts = [
            f"{glabel} is on node {gnode}, which lacks the memory;"
            f" node {best.node} is the nearest node that has it"
        ]
    mem_txt = nu.format_kib(best.available_kb)
    if best.memory_node not in (None, best.node):
        mem_txt = f"{mem_txt} on its nearest memory node {best.memory_node}"
    if not fitting:
        parts.append(
            f"no node has {nu.format_kib(need_kb)} available; "
            f"node {best.node} has the most ({mem_txt})"
        )
    else:
        available = f"{mem_txt} available (MemFree + reclaimable page cache)"
        if need_kb:
            available += f" for the {nu.format_kib(need_kb)} needed"
        workers = f"{best.load} worker(s) already there"
        if len(fitting) > 1 and gnode is None:
            workers += f" (fewest among {len(fitting)} fitting node(s))"
        parts += [available, workers]
    if len(cands) == 1:
        parts.append("it is the only usable node with CPUs")
    return NodeChoice(best.node, f"node {best.node}: " + "; ".join(parts), tuple(cands), gnode)
