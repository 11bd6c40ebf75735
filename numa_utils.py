# SPDX-License-Identifier: Apache-2.0
"""NUMA topology, memory policy and placement for LLM inference engines, in one file.

numa_utils is meant to be copied (vendored) into an engine's utils folder: one file,
standard library only (ctypes), Python 3.8+, nothing done at import.  Upstream:
the numa_utils project (see its README for the full documentation).

Usage::

    import numa_utils as nu

    topo = nu.read_topology()                 # sysfs + procfs, sparse ids welcome
    print(topo.nodes_with_memory, topo.node_of_cpu(0))

    buf = bytearray(1 << 30)                  # or mmap, numpy array, torch tensor
    res = nu.interleave(buf)                  # over default_memory_nodes(): DRAM tier
    if not res:                               # a value, not an exception:
        print("first-touch:", res.reason)     #   "single memory node", "EPERM", ...
    nu.prefault(buf)                          # pages land under the policy
    print(nu.placement(buf))                  # {0: 536870912, 1: 536870912}

Every file read and every syscall goes through a backend object (``LinuxBackend`` for
the running system or a saved tree, ``SimulatedBackend`` for a model of the kernel).
"""

from __future__ import annotations

import enum
import errno
import itertools
import os
import re
import stat
import struct
import sys
import threading
from collections import abc as _abc
from types import MappingProxyType
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

__version__ = "0.1.0"

# Importing this file must stay cheap (engines import it on every worker start):
# ctypes is imported on first use, and records are namedtuples built without
# typing.NamedTuple's per-field type checks.  Type checkers see the usual forms.
if TYPE_CHECKING:
    import ctypes
    from typing import NamedTuple as _Record
else:
    import collections

    class _LazyCtypes:
        """Stands in for the ctypes module until first use, then replaces itself."""

        def __getattr__(self, name):
            import ctypes as real

            globals()["ctypes"] = real
            return getattr(real, name)

    ctypes = _LazyCtypes()

    class _RecordMeta(type):
        """``class X(_Record): a: int; b: str = ""`` -> an immutable namedtuple
        subclass with those fields, defaults, methods and docstring (what
        typing.NamedTuple gives, at a third of the import cost)."""

        def __new__(mcls, name, bases, ns):
            if not bases:
                return super().__new__(mcls, name, bases, ns)
            fields = list(ns.get("__annotations__", {}))
            defaults = [ns.pop(f) for f in fields if f in ns]
            base = collections.namedtuple(
                name, fields, defaults=defaults, module=ns.get("__module__")
            )
            ns["__slots__"] = ()
            return type(name, (base,), ns)

    class _Record(metaclass=_RecordMeta):
        pass


__all__ = [
    # parsers (pure, no I/O)
    "parse_cpulist",
    "format_cpulist",
    "parse_cpumap",
    "parse_meminfo",
    "parse_distance_row",
    "parse_numa_maps",
    "iter_numa_maps",
    "parse_sysvipc_shm",
    "parse_size",
    "printable",
    "format_size",
    "format_kib",
    "NodeListError",
    # backends
    "Abi",
    "abi_for",
    "Backend",
    "LinuxBackend",
    "ShmStat",
    "NotLiveError",
    "default_backend",
    "backend_for_root",
    "use_backend",
    # topology
    "Topology",
    "Node",
    "Cpu",
    "HugePages",
    "read_topology",
    "to_json",
    "MemoryAccess",
    "default_memory_nodes",
    "memory_node_choice",
    "MemoryNodeChoice",
    # memory policy: raw syscalls
    "Mode",
    "MODE_NAMES",
    "MEMORY_WORDS",
    "ModeFlag",
    "MbindFlag",
    "GetFlag",
    "NodeMask",
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    "move_pages",
    "migrate_pages",
    "set_mempolicy_home_node",
    # memory policy: safe layer
    "PolicyResult",
    "PolicyInfo",
    "buffer_range",
    "interleave",
    "bind",
    "prefer",
    "weighted_interleave",
    "interleave_weights",
    "set_interleave_weights",
    "suggest_weights",
    "set_local",
    "apply_policy",
    "thread_policy",
    "set_thread_policy",
    "get_policy",
    "node_of",
    # shared memory, prefault, placement
    "SharedRegion",
    "Layout",
    "Extent",
    "ExtentPlacement",
    "placement_verdict",
    "prefault",
    "placement",
    "NumaMapsEntry",
    "fit",
    "FitResult",
    "FitNode",
    "FitLimit",
    "cleanup",
    "read_identity_record",
    "record_layout",
    "record_segment_key",
    # GPU locality and binding
    "gpus",
    "gpu_node",
    "cuda_device",
    "cpus_for_gpu",
    "bind_to_node",
    "bind_for_gpu",
    "GpuInfo",
    "GpuPlan",
    "BindResult",
    "gpu_plans",
    "BIND_POLICIES",
    "bind_policy",
    # thread roles: CPUs per thread role, every thread pinned by name
    "thread_plan",
    "ThreadPlan",
    "pin_threads",
    "pinned",
    "PinResult",
    "ThreadPin",
    "instance_plans",
    "InstancePlan",
    "settle",
    "spawn_context",
    "DEFAULT_ROLES",
    "SMT_RULES",
    # PCI devices: NICs, RDMA, NVMe, GPUs
    "Device",
    "DEVICE_KINDS",
    "devices",
    "device_distance",
    "local_devices",
    "LocalDevices",
    # observation
    "NodeCounters",
    "NUMASTAT_FIELDS",
    "Counters",
    "counters",
    "RemoteShare",
    "remote_share",
    "NodeCandidate",
    "NodeChoice",
    "choose_node",
    "CudaPin",
    "CudaHostRegisterFlag",
    "CudaPinProgress",
    "pin_for_cuda",
    "REMOTE_SHARE_THRESHOLD",
    # numactl's node/CPU list grammar; CLI
    "parse_nodestring",
    "main",
    "configure",
]

if TYPE_CHECKING:  # imported lazily at run time: importing numa_utils stays cheap
    import argparse

    from typing_extensions import Literal

    ByteOrder = Literal["little", "big"]

# Warnings are logged once per distinct reason, not once per call (an engine may call
# interleave() for every layer of every request: that must not become a log storm).
_warned: Set[str] = set()
_warned_lock = threading.Lock()
_cli_verbose: Optional[bool] = None  # main()'s -v; None: a library caller's logging


def _warn_once(key: str, msg: str, *args: Any) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    import logging

    if _cli_verbose is not None:  # the command line: its format, set when first needed
        if _cli_verbose:
            level = logging.INFO
        else:
            level = logging.WARNING
        logging.basicConfig(level=level, format="%(levelname)s %(message)s")
    logging.getLogger(__name__).warning(msg, *args)


def _oserror(err: int, what: str, extra: str = "") -> OSError:
    """errno-first OSError, so callers get PermissionError & co for free."""
    if extra:
        return OSError(err, f"{what}: {os.strerror(err)} ({extra})")
    return OSError(err, f"{what}: {os.strerror(err)}")


def format_kib(kb: int) -> str:
    """A size in KiB for people: "512 KiB", "1.5 GiB" (one decimal, binary units up
    to TiB).  Use format_size for a size that must read back exactly."""
    if kb < 1024:
        return f"{kb} KiB"
    power = min(3, (kb.bit_length() - 1) // 10)  # of 1024: 1 for MiB, up to 3 for TiB
    return f"{kb / (1 << 10 * power):.1f} {'KMGT'[power]}iB"


class NotLiveError(OSError):
    """A syscall was asked of a backend that reads a saved tree, not the running system."""


# ===========================================================================
# Pure parsers (no I/O). Formats: Documentation/admin-guide/cputopology.rst,
# lib/bitmap.c (bitmap_parselist / bitmap_print_to_pagebuf), drivers/base/node.c.
# ===========================================================================


def _clean(text: str) -> str:
    # Some sysfs files end in "\n\0" (seen on old kernels and some drivers).
    return text.replace("\0", "").strip()


def _where(source: Optional[str]) -> str:
    if source:
        return f" in {source}"
    return ""


_CHUNK_RE = re.compile(r"^([0-9]{1,9})(?:-([0-9]{1,9})(?::([0-9]{1,9})/([0-9]{1,9}))?)?$")

# The largest ids a kernel can produce, so that a hostile or corrupt list cannot make
# us expand billions of ids: CPU ids < NR_CPUS, at most 8192 (the Kconfig maximum of
# x86_64 with MAXSMP and of powerpc; arm64 stops at 4096), node ids < MAX_NUMNODES =
# 1 << NODES_SHIFT, NODES_SHIFT at most 10 on every architecture.  Beyond: malformed.
MAX_CPUS = 8192
MAX_NODES = 1024


def _short(text: str, n: int = 80) -> str:
    """repr() of ``text``, cut to ``n`` characters (error messages stay one line)."""
    if len(text) <= n:
        return repr(text)
    return repr(text[:n]) + f"... ({len(text)} chars)"


def _set_bits(value: int) -> FrozenSet[int]:
    """The positions of the 1 bits of ``value`` (bit 0 is CPU/node 0); linear."""
    return frozenset(m.start() for m in re.finditer("1", bin(value)[:1:-1]))  # LSB first


def parse_cpulist(
    text: str, *, source: Optional[str] = None, limit: int = MAX_CPUS
) -> FrozenSet[int]:
    """Parse the kernel's list format ("0-3,8,10-11", "0-15:2/4") into a frozenset.

    An empty string is the empty set.  Garbage, or an id >= ``limit`` (MAX_CPUS;
    MAX_NODES for node lists), raises ValueError naming ``source``.  Linear in the
    text: ids are gathered as bits of one integer.
    """
    s = _clean(text)
    if not s:
        return frozenset()
    bits = 0
    for chunk in dict.fromkeys(s.split(",")):  # a repeated chunk costs nothing
        match = _CHUNK_RE.match(chunk.strip())
        g = match.groups() if match else ("1", "0", None, None)  # no match: refused below
        lo, used, group = int(g[0]), int(g[2] or 1), int(g[3] or 1)
        hi = int(g[1] or lo)
        if hi >= limit:
            raise ValueError(
                f"invalid CPU/node list{_where(source)}: chunk {chunk[:40]!r} of "
                f"{_short(text)} (ids must be < {limit})"
            )
        if match is None or hi < lo or used == 0 or group == 0 or used > group:
            raise ValueError(
                f"invalid CPU/node list{_where(source)}: chunk {chunk[:40]!r} of {_short(text)}"
            )
        if group == 1 or used == group:
            bits |= ((1 << (hi - lo + 1)) - 1) << lo
        else:
            # "lo-hi:used/group": ``used`` ids out of every ``group``; the pattern
            # is doubled until it covers the range (log steps, not one per group).
            span = hi - lo + 1
            pat, width = (1 << min(used, span)) - 1, group
            while width < span:
                pat |= pat << width
                width *= 2
            bits |= (pat & ((1 << span) - 1)) << lo
    return _set_bits(bits)


def _printable_char(char: str) -> str:
    if char.isprintable():
        return char
    return repr(char)[1:-1]


def _seconds(value: Any) -> Optional[float]:
    """A time from a record as a finite float; None for anything else."""
    import math

    if type(value) not in (int, float):
        return None
    try:
        out = float(value)
    except OverflowError:
        return None
    if not math.isfinite(out):
        return None
    return out


def printable(text: str) -> str:
    """``text`` for a terminal: each character that str.isprintable() refuses (control
    characters such as ESC and BEL, a newline, bidirectional overrides) as its
    backslash escape, as ``ls -b`` writes them.  File names, record keys and anything
    else another user chose go through it before a text output prints them."""
    if text.isprintable():
        return text
    return "".join(map(_printable_char, text))


def _cut(text: str, limit: int = 160) -> str:
    """``text`` for a message: escaped as printable escapes it, cut to ``limit``
    characters (a parser's words can quote a whole 120 KB value)."""
    shown = printable(text[:limit])
    if len(text) > limit:
        return shown + f"... ({len(text)} chars)"
    return shown


def _parse_nodelist(text: str, *, source: Optional[str] = None) -> FrozenSet[int]:
    """parse_cpulist for node lists: ids < MAX_NODES."""
    return parse_cpulist(text, source=source, limit=MAX_NODES)


def format_cpulist(ids: Iterable[int]) -> str:
    """Compress ids into the kernel's list format: {0,1,2,3,8} -> "0-3,8"."""
    # Consecutive ids share ``id - position``: each such group is one run.
    runs = itertools.groupby(enumerate(sorted(set(ids))), lambda pair: pair[1] - pair[0])
    parts = []
    for _, run in runs:
        span = [cpu for _, cpu in run]
        if len(span) == 1:
            parts.append(str(span[0]))
        else:
            parts.append(f"{span[0]}-{span[-1]}")
    return ",".join(parts)


_HEX_WORD = re.compile("[0-9a-fA-F]{1,8}")


def parse_cpumap(
    text: str, *, source: Optional[str] = None, limit: int = MAX_CPUS
) -> FrozenSet[int]:
    """Parse a hex mask ("00000000,0000ff00"; 32-bit words, most significant first).

    At most ``limit`` bits (the kernel prints nr_cpu_ids of them); linear in the text.
    """
    s = _clean(text)
    if not s:
        return frozenset()
    words = [w.strip() for w in s.split(",")]
    if len(words) > (limit + 31) // 32:
        raise ValueError(
            f"invalid CPU mask{_where(source)}: {len(words)} words, more "
            f"than {limit} bits: {_short(text)}"
        )
    bad = [w for w in words if not _HEX_WORD.fullmatch(w)]
    if bad:
        raise ValueError(
            f"invalid CPU mask{_where(source)}: word {bad[0][:40]!r} of {_short(text)}"
        )
    value = int("".join(w.rjust(8, "0") for w in words), 16)
    if value >> limit:
        raise ValueError(
            f"invalid CPU mask{_where(source)}: bits at or above {limit}: {_short(text)}"
        )
    return _set_bits(value)


def _uint(s: str) -> Optional[int]:
    """An unsigned decimal of 1-20 ASCII digits (a u64), else None.  isdigit() alone
    passes "³", which int() refuses, and int() alone takes "٣", " 1_0 " and, slowly,
    thousands of digits."""
    if 0 < len(s) <= 20 and s.isascii() and s.isdigit():
        return int(s)
    return None


def parse_meminfo(text: str, *, source: Optional[str] = None) -> Dict[str, int]:
    """Parse /proc/meminfo or nodeN/meminfo into {"MemTotal": kB, ...}.

    The "Node N " prefix of per-node files is dropped.  Values without a unit
    (HugePages_Total) are returned as plain counts.
    """
    s = _clean(text)
    # The whole file in C when every line is plain "[Node N ]Key:   123[ kB]" (read
    # per node by read_topology and counters); anything else line by line below.
    pairs = re.findall(
        r"(?am)^(?:Node [0-9]+ +)?([A-Za-z][^:\n]{0,80}?):[ \t]*([0-9]{1,20})"
        r"(?: kB)?[ \t]*$",
        s,
    )
    if len(pairs) == s.count("\n") + 1 and not any(field.startswith("Node ") for field, _ in pairs):
        return {field.strip(): int(amount) for field, amount in pairs}
    out: Dict[str, int] = {}
    for line in s.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("Node "):
            parts = line.split(None, 2)
            if len(parts) < 3 or not parts[1].isdigit():
                raise ValueError(f"invalid meminfo line{_where(source)}: {_short(line)}")
            line = parts[2]
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if (
            not sep
            or not key
            or not fields
            or len(fields) > 2
            or (len(fields) == 2 and fields[1] != "kB")
        ):
            raise ValueError(f"invalid meminfo line{_where(source)}: {_short(line)}")
        # Values are unsigned longs: 20 digits at most (a longer one is corrupt, and
        # int() of a huge digit string is slow and overflows later formatting).
        value = _uint(fields[0])
        if value is None:
            raise ValueError(f"invalid meminfo value{_where(source)}: {_short(line)}")
        out[key.strip()] = value
    return out


def parse_distance_row(text: str, *, source: Optional[str] = None) -> Tuple[int, ...]:
    """Parse nodeN/distance ("10 21 21") into a tuple of ints (online-node order)."""
    s = _clean(text)
    row: Tuple[int, ...] = ()
    if re.fullmatch(r"(?a)[0-9]{1,3}(?:\s+[0-9]{1,3})*", s):
        parts = s.split()
        if len(parts) <= MAX_NODES:
            row = tuple(map(int, parts))
    if not row or min(row) < 1 or max(row) > 255:
        raise ValueError(f"invalid distance row{_where(source)}: {_short(text)}")
    return row


_INT_RE = re.compile(r"-?[0-9]{1,20}|0[xX][0-9a-fA-F]{1,16}")


def _parse_int(text: str, source: str) -> int:
    s = _clean(text)
    if not _INT_RE.fullmatch(s):
        raise ValueError(f"invalid integer in {source}: {_short(text)}")
    if s[1:2] in ("x", "X"):
        return int(s, 16)
    return int(s)


# ===========================================================================
# Architectures and syscall numbers.
# Tables from arch/x86/entry/syscalls/syscall_64.tbl, syscall_32.tbl,
# include/uapi/asm-generic/unistd.h (aarch64, riscv64, loongarch64),
# arch/powerpc/kernel/syscalls/syscall.tbl, arch/s390/kernel/syscalls/syscall.tbl,
# arch/arm/tools/syscall.tbl.  x86_64 orders mbind/set/get (237/238/239), every other
# table mbind/get/set: 237 is mbind on x86_64 but set_mempolicy on aarch64.
# ===========================================================================

_NAMES = (
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    "migrate_pages",
    "move_pages",
    "set_mempolicy_home_node",
)


def _table(*nums: int) -> Mapping[str, int]:
    return MappingProxyType(dict(zip(_NAMES, nums)))


_GENERIC = _table(235, 237, 236, 238, 239, 450)
_POWERPC = _table(259, 261, 260, 258, 301, 450)  # one table, either byte order

SYSCALL_TABLES: Mapping[str, Mapping[str, int]] = MappingProxyType(
    {
        "x86_64": _table(237, 238, 239, 256, 279, 450),
        "i386": _table(274, 276, 275, 294, 317, 450),
        "aarch64": _GENERIC,
        "riscv64": _GENERIC,
        "loongarch64": _GENERIC,
        "arm": _table(319, 321, 320, 400, 344, 450),
        "s390x": _table(268, 270, 269, 287, 310, 450),
        "ppc64": _POWERPC,
        "ppc64le": _POWERPC,
    }
)

_MACHINE_ALIASES = MappingProxyType(
    {
        "amd64": "x86_64",
        "x64": "x86_64",
        "x86-64": "x86_64",
        "i486": "i386",
        "i586": "i386",
        "i686": "i386",
        "x86": "i386",
        "arm64": "aarch64",
        "ppc64el": "ppc64le",
        "powerpc64le": "ppc64le",
        "powerpc64": "ppc64",
        "riscv": "riscv64",
        "loong64": "loongarch64",
    }
)

_BIG_ENDIAN = frozenset({"ppc64", "s390x"})


class Abi(_Record):
    """The ABI a syscall is made in: table name, word size and byte order."""

    name: str  # key of SYSCALL_TABLES, or the unknown machine name
    word_bits: int  # C unsigned long width: nodemask word size
    byteorder: ByteOrder  # "little" | "big"
    syscalls: Optional[Mapping[str, int]]  # None: unsupported ABI -> ENOSYS at call time

    @property
    def supported(self) -> bool:
        return self.syscalls is not None

    def number(self, name: str) -> int:
        if self.syscalls is None or name not in self.syscalls:
            raise _oserror(errno.ENOSYS, name, f"no syscall table for the {self.name!r} ABI")
        return self.syscalls[name]


def abi_for(machine: Optional[str] = None, pointer_bits: Optional[int] = None) -> Abi:
    """The ABI for a machine name (``platform.machine()`` style) and pointer size.

    Without arguments: the running interpreter.  A 32-bit interpreter on a 64-bit
    kernel uses the 32-bit table (i386, arm); x32 (x86_64 with 32-bit pointers) is
    refused: its numbers differ and engines do not run there.
    """
    if machine is None:
        machine = os.uname().machine
    if pointer_bits is None:
        pointer_bits = struct.calcsize("P") * 8
    table_name = _MACHINE_ALIASES.get(machine.lower(), machine.lower())
    # Every 32-bit arm name (armv7l, armv6l, armhf, ...) is arm, and so is a 32-bit
    # process on arm64, which makes arm's calls; the other 64-bit ABIs have none.
    if table_name.startswith("arm") or (table_name == "aarch64" and pointer_bits == 32):
        table_name = "arm"
    known = table_name in SYSCALL_TABLES
    wide = known and table_name not in ("i386", "arm")
    name = table_name
    table = SYSCALL_TABLES.get(table_name)
    if wide and pointer_bits != 64:
        # A 32-bit process on a 64-bit-only ABI: x32 on x86_64, nothing elsewhere.
        table = None
    if wide and pointer_bits == 32:
        if table_name == "x86_64":
            name = "x32"
        else:
            name = table_name + "-32"
    if known:
        big_endian = table_name in _BIG_ENDIAN
    else:
        big_endian = sys.byteorder == "big"
    byteorder: ByteOrder = "big" if big_endian else "little"
    return Abi(name, pointer_bits, byteorder, table)


def _nodes_txt(ids: Iterable[int]) -> str:
    """ "node 0" / "nodes 0-1,4": the word agrees with the count."""
    some = sorted(ids)
    if not some:
        return "nodes -"
    if len(some) == 1:
        return f"node {some[0]}"
    return f"nodes {format_cpulist(some)}"


class ShmStat(_Record):
    """What IPC_STAT (or fstat, for POSIX) says about a segment: what
    the kernel calls "shm_stat" and "fstat" (``Backend.call``) return."""

    key: int
    id: int
    uid: int
    gid: int
    cuid: int
    cgid: int
    mode: int
    size: int
    nattch: int
    cpid: int
    lpid: int
    ino: int = 0  # POSIX: the file's inode and device, to find its mappings
    dev: int = 0
    used: int = 0  # SysV: the latest of shm_atime, shm_dtime, shm_ctime (epoch s)


# ===========================================================================
# Backends: the one seam through which every file read and every syscall goes.
# ===========================================================================


class Backend:
    """Interface of a backend.  ``LinuxBackend`` and ``SimulatedBackend`` implement it.

    Files: ``read_text``, ``listdir``, ``exists``, ``realpath`` and ``write_text`` take
    absolute system paths ("/sys/devices/system/node/online"); a backend maps them
    onto its root.  The kernel: ``call(name, *args)``, and ``touch`` (a first touch,
    one byte per page).

    ``is_live``: the backend is the running system itself, so what describes only the
    running system (NVML, torch's devices, opening a file for reading in place) is
    asked of it.  The library asks this of a backend, never its class.
    """

    root: str = "/"
    abi: Abi
    page_size: int = 4096
    is_live: bool = False

    @property
    def has_process(self) -> bool:
        """Whether this backend has a calling process (/proc/self, its policy, its
        syscalls): the running system, or a model of one; a saved tree has none."""
        return self.is_live

    def read_text(self, path: str) -> str:
        raise NotImplementedError

    def listdir(self, path: str) -> List[str]:
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def realpath(self, path: str) -> str:
        """``path`` with its symlinks resolved (a PCI device's place in the bus
        tree); ``path`` itself where the backend keeps no links."""
        return path

    def write_text(self, path: str, text: str) -> None:
        """Write a sysfs/procfs file (the weighted-interleave weights)."""
        raise NotImplementedError

    def touch(self, addr: int, length: int) -> None:
        """Write one byte per page of [addr, addr+length): a first touch."""
        raise NotImplementedError

    def call(self, name: str, *args: Any) -> Any:
        """The kernel operation ``name`` with ``args``, each an int (addresses
        included, exactly what the kernel receives) unless said otherwise; an error
        is the OSError the kernel's errno makes.  A backend implements operation
        ``name`` as its method ``_call_<name>``; a test that wants a call to fail or
        to see it overrides this one method.

        ==================  =========================  ===============================
        name                arguments                  result
        ==================  =========================  ===============================
        syscall             nr, *args                  its non-negative result
        madvise             addr, length, advice
        mincore             addr, length               pages of the range in memory,
                                                       as mincore(2) counts them: for
                                                       shared memory, the object's
                                                       pages, touched here or not
        sched_getaffinity   pid (0: the caller)        frozenset of CPUs
        sched_setaffinity   pid, cpus (an iterable)
        gettid                                         the calling thread's id (what
                                                       sched_setaffinity(0) pins)
        threads                                        this process's thread ids,
                                                       sorted
        cpuset_cpus                                    frozenset: the cgroup cpuset,
                                                       the most sched_setaffinity may
                                                       give; None when unreadable
        statvfs             path                       (size, bytes free to
                                                       unprivileged users) of its file
                                                       system; None when unknown
        geteuid                                        the effective uid
        shmget              key, size, flags           shmid
        shmat               shmid, flags               address
        shmdt               addr
        shm_stat            shmid                      ShmStat (shmctl IPC_STAT)
        shm_rmid            shmid                      (shmctl IPC_RMID: gone now, or
                                                       at the last detach; the key is
                                                       free now)
        shm_open            name (no "/"), flags,      fd of /dev/shm/<name>
                            mode
        shm_unlink          name
        ftruncate           fd, size
        fstat               fd                         ShmStat
        close               fd
        mmap                length, fd, huge=False     address of a shared read-write
                                                       mapping of fd
        munmap              addr, length
        flock               fd, op (LOCK_SH or
                            LOCK_EX, | LOCK_NB)
        pid_start           pid (of this namespace)    a token for when it started,
                                                       which differs once the pid is
                                                       reused: None when there is no
                                                       such process or it has exited
                                                       (a zombie), "" when it exists
                                                       but its start cannot be read
        whoami                                         this process for identity
                                                       records: a dict of pid, start
                                                       (as pid_start), boot (the boot
                                                       id), pidns and timens (as
                                                       /proc/self/ns names them; ""
                                                       where unknown)
        ==================  =========================  ===============================
        """
        return getattr(self, "_call_" + name)(*args)

    # Operations every backend can answer the same way.
    def _call_gettid(self) -> int:
        return threading.get_native_id()

    def _call_threads(self) -> List[int]:
        return sorted(
            int(t) for t in self.listdir("/proc/self/task") if t.isascii() and t.isdigit()
        )

    def _call_statvfs(self, path: str) -> Optional[Tuple[int, int]]:
        return None


def _read_optional(backend: Backend, path: str) -> Optional[str]:
    """The text of ``path``; None when it cannot be read (absent, denied)."""
    try:
        return backend.read_text(path)
    except OSError:
        return None


class _Reader:
    """Collects problems (unreadable or malformed files) as warnings, never crashes."""

    def __init__(self, backend: Backend) -> None:
        self.b = backend
        self.problems: List[str] = []

    def _get(self, fn: Callable[[str], Any], path: str, verb: str = "read") -> Any:
        """fn(path); None for a missing file, None and a problem for another failure
        (a saved tree's link loop: ELOOP)."""
        try:
            return fn(path)
        except FileNotFoundError:
            return None
        except OSError as err:
            self.problems.append(f"cannot {verb} {path}: {err.strerror or err}")
            return None

    def text(self, path: str) -> Optional[str]:
        return self._get(self.b.read_text, path)  # type: ignore[no-any-return]

    def parsed(self, path: str, parser: Callable[..., Any], default: Any = None) -> Any:
        t = self.text(path)
        if t is None:
            return default
        try:
            return parser(t, source=path)
        except ValueError as err:
            self.problems.append(str(err))
            return default

    def cpus(self, cpulist: str, cpumap: str) -> Optional[FrozenSet[int]]:
        """A CPU list file, else the hex mask beside it (all that old kernels print:
        POWER7 dumps)."""
        got: Optional[FrozenSet[int]] = self.parsed(cpulist, parse_cpulist)
        if got is not None:
            return got
        return self.parsed(cpumap, parse_cpumap)  # type: ignore[no-any-return]

    def integer(self, path: str) -> Optional[int]:
        return self.parsed(path, _parse_int)  # type: ignore[no-any-return]

    def listdir(self, path: str) -> List[str]:
        return self._get(self.b.listdir, path, "list") or []

    def exists(self, path: str) -> bool:
        return bool(self._get(self.b.exists, path))

    def online(self, ids: FrozenSet[int], online: FrozenSet[int], what: str) -> FrozenSet[int]:
        """``ids`` (read from ``what``) that are online nodes.  The kernel's node lists
        can name a node that is offline or has no directory (hwloc's snapshot
        offline-cpu0-node0 lists node 0 in has_memory with only node 1 online):
        every later lookup by node id assumes it is in Topology.nodes."""
        extra = ids - online
        if extra:
            self.problems.append(
                f"{what} names {_nodes_txt(extra)}, not online "
                f"(online: {format_cpulist(online) or 'none'}); ignored"
            )
        return ids & online


_libc_lock = threading.Lock()
_libc: Optional[ctypes.CDLL] = None


def _get_libc() -> ctypes.CDLL:
    """libc, loaded lazily and once, with errno capture and the prototypes set
    (under the lock, before any caller can use them)."""
    global _libc
    with _libc_lock:
        if _libc is None:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.syscall.restype = ctypes.c_long
            vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
            for name, args, res in (
                ("madvise", [vp, sz, i], i),
                ("shmget", [i, sz, i], i),
                ("shmat", [i, vp, i], vp),
                ("shmdt", [vp], i),
                ("shmctl", [i, i, vp], i),
                ("munmap", [vp, sz], i),
                ("mmap", [vp, sz, i, i, i, ctypes.c_long], vp),
                ("mincore", [vp, sz, ctypes.c_char_p], i),
                ("readv", [i, vp, i], ctypes.c_ssize_t),
                ("writev", [i, vp, i], ctypes.c_ssize_t),
            ):
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, res
            _libc = lib
        return _libc


# Saved trees: every lookup walks the tree's own links (LinuxBackend._walk).
_TREE_MAX_STEPS = 1 << 21  # path components one backend walks, all lookups together


def _read_regular(path: str, limit: int, flags: int = 0) -> bytes:
    """At most ``limit`` bytes of a regular file (EFBIG past it); a FIFO or a device
    is refused before it can block or never end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | flags)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        # One read of the size fstat gave (a 1 MiB buffer per small file costs more than
        # reading it), then MiB reads until a short one (a regular file's end) or more
        # than ``limit``.
        want = min(max(st.st_size, 1 << 16), limit) + 1
        chunks = [os.read(fd, want)]
        while len(chunks[-1]) == want and sum(map(len, chunks)) <= limit:
            want = 1 << 20
            chunks.append(os.read(fd, want))
        data = b"".join(chunks)
        if len(data) > limit:
            raise OSError(errno.EFBIG, f"larger than {limit >> 20} MiB")
        return data
    finally:
        os.close(fd)


class _SavedFolder:
    """A saved tree in a folder, read-only: each file read when first asked for (the
    small ones kept).  LinuxBackend walks its links itself (``link``); a saved tree
    in one file (text archive, tar) is numa_utils_sim.SavedArchive, which has the
    same five methods."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._kept: Dict[str, bytes] = {}

    def link(self, rel: str) -> Optional[str]:
        """The target of ``rel`` when it is a symbolic link."""
        try:
            return os.readlink(f"{self.path}/{rel}")
        except OSError:  # not a link, or not there
            return None

    def exists(self, rel: str) -> bool:
        return os.access(f"{self.path}/{rel}", os.F_OK, follow_symlinks=False)

    def read(self, rel: str, path: str, limit: int) -> str:
        """``rel``'s text; ELOOP when it is a link (LinuxBackend then follows it)."""
        data = self._kept.get(rel)
        if data is None:
            try:
                data = _read_regular(f"{self.path}/{rel}", limit, os.O_NOFOLLOW)
            except OSError as e:
                e.filename = path  # the tree's path, not the disk's
                raise
            # Kept: 64 KiB at most, under every ``limit`` LinuxBackend asks (1 MiB and
            # up), so a kept file never needs the size check _read_regular makes.
            if len(data) <= 1 << 16:
                self._kept[rel] = data
        return data.decode("utf-8", "replace")

    def listdir(self, rel: str, path: str) -> List[str]:
        try:
            return os.listdir(f"{self.path}/{rel}")
        except OSError as e:
            e.filename = path
            raise


def _saved_folder(path: str) -> _SavedFolder:
    """The saved tree in folder ``path``; ValueError for anything else (a file: an
    archive, which numa_utils_sim.SavedArchive reads)."""
    mode = os.stat(path).st_mode  # a stat opens nothing: a FIFO, a device
    if stat.S_ISREG(mode):
        raise ValueError(
            f"{path}: a saved tree in one file (text archive or tar) is read by "
            "numa_utils_sim.py: LinuxBackend(numa_utils_sim.SavedArchive(path))"
        )
    if not stat.S_ISDIR(mode):
        raise ValueError(f"{path}: not a saved tree (neither a folder nor a regular file)")
    return _SavedFolder(path)


def _ns_link(kind: str) -> str:
    """This process's namespace of ``kind``, as /proc/self/ns/KIND names it
    ("time:[4026531834]"); "" where the kernel has none (time: before Linux 5.6)."""
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return ""


def _allowed_from_status(
    backend: Backend, pid: Union[int, str] = "self"
) -> Tuple[Optional[FrozenSet[int]], Optional[FrozenSet[int]]]:
    """(Cpus_allowed_list, Mems_allowed_list) of /proc/<pid>/status; None for a file
    or line that is not there.  A malformed list raises ValueError naming it."""
    path = f"/proc/{pid}/status"
    fields = {}
    for line in (_read_optional(backend, path) or "").splitlines():
        name, _, value = line.partition(":")
        fields[name] = value

    def allowed(name: str, limit: int) -> Optional[FrozenSet[int]]:
        if name not in fields:
            return None
        return parse_cpulist(fields[name], source=f"{path} {name}", limit=limit)

    return allowed("Cpus_allowed_list", MAX_CPUS), allowed("Mems_allowed_list", MAX_NODES)


IPC_CREAT, IPC_EXCL, IPC_RMID, IPC_STAT = 0o1000, 0o2000, 0, 2


_PROT_READ, _PROT_WRITE = 1, 2


_MAP_SHARED, _MAP_HUGETLB = 0x01, 0x40000  # MAP_HUGETLB: x86, arm, ppc, s390, riscv alike


# struct shmid_ds as glibc lays it out on 64-bit little-endian ABIs with the
# asm-generic ipc structures (x86_64 differs only in a u16 mode + padding).
_SHMID_DS_GENERIC64 = frozenset({"x86_64", "aarch64", "riscv64", "loongarch64"})


def parse_sysvipc_shm(text: str) -> Iterator[ShmStat]:
    """The SysV segments /proc/sysvipc/shm lists (ipc/shm.c sysvipc_shm_proc_show), one
    ShmStat each: the header and short lines skipped, a malformed row a ValueError.
    Every segment of this IPC namespace, whoever owns it, as ipcs -m shows them."""
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 11:
            continue
        try:
            used = 0
            if len(fields) > 13:
                used = max(int(t) for t in fields[11:14])
            yield ShmStat(
                int(fields[0]) & 0xFFFFFFFF,
                int(fields[1]),
                int(fields[7]),
                int(fields[8]),
                int(fields[9]),
                int(fields[10]),
                int(fields[2], 8),
                int(fields[3]),
                int(fields[6]),
                int(fields[4]),
                int(fields[5]),
                used=used,
            )
        except ValueError:
            raise ValueError(f"invalid /proc/sysvipc/shm line: {_short(line)}") from None


def _sysvipc_stat(text: str, shmid: int) -> ShmStat:
    for row in parse_sysvipc_shm(text):
        if row.id == shmid:
            return row
    raise _oserror(errno.EINVAL, "shmctl(IPC_STAT)", f"no segment {shmid}")


_IOV_MAX = 1024


def _touch_iov(addr: int, length: int, page: int, write: bool = True) -> None:
    """First-touch every page of [addr, addr+length) in C, keeping the contents.

    For kernels without MADV_POPULATE_WRITE: one byte per page goes through a pipe
    (writev gathers it: a read fault per page), 1024 pages per system call, with the
    GIL released; no Python loop per page.  ``write=True`` writes each byte back
    (readv: a write fault), which private anonymous memory needs (a read fault only
    maps the shared zero page) but which would undo a concurrent writer's store in
    between.  Shared memory (shm, tmpfs) allocates its page on the read fault, under
    the shared policy, so regions use ``write=False`` and never rewrite data.
    """
    import array

    libc = _get_libc()
    starts = array.array("Q", range(addr - addr % page, addr + length, page))
    if starts and starts[0] < addr:
        starts[0] = addr
    iov = array.array("Q", bytes(16 * len(starts)))
    iov[0::2] = starts
    iov[1::2] = array.array("Q", [1]) * len(starts)
    base = iov.buffer_info()[0]
    r, w = os.pipe()
    try:
        for i in range(0, len(starts), _IOV_MAX):
            count = min(_IOV_MAX, len(starts) - i)
            ptr = base + 16 * i
            ctypes.set_errno(0)
            if libc.writev(w, ptr, count) != count or (
                write and libc.readv(r, ptr, count) != count
            ):
                raise _oserror(ctypes.get_errno() or errno.EIO, "prefault (touch)")
            if not write:
                os.read(r, count)  # drain: the bytes were only read
    finally:
        os.close(r)
        os.close(w)


class LinuxBackend(Backend):
    """The Linux kernel, or a saved tree of it.

    ``root="/"`` is the running system.  Any other root is a saved tree: a directory
    holding ``sys/`` and ``proc/``, or a tree object with the methods of
    _SavedFolder (``path``, ``link``, ``exists``, ``read``, ``listdir``), such as
    numa_utils_sim.SavedArchive for a tree saved in one file.  Files are read from
    there and every syscall is refused with NotLiveError, so a tree gathered on
    another machine never drives this machine's kernel.
    """

    def __init__(self, root: Any = "/", *, abi: Optional[Abi] = None) -> None:
        tree: Any = None
        if not isinstance(root, str):
            tree, root = root, root.path
        self.root = os.path.abspath(root) if root else "/"
        self.is_live = self.root == "/" and tree is None
        self.abi = abi if abi is not None else abi_for()
        self.page_size = os.sysconf("SC_PAGE_SIZE")
        self._real_paths: Dict[str, str] = {}
        self._steps = 0
        if tree is None and not self.is_live:
            tree = _saved_folder(self.root)
        self._tree: Optional[_SavedFolder] = tree  # or any object with its methods
        self._me: Dict[str, Any] = {}  # whoami(), until a fork changes the pid

    def __repr__(self) -> str:
        return f"LinuxBackend(root={self.root!r})"

    # A saved tree can come from anyone (a bug report, a shared folder, an archive), so
    # it is read as if it were "/": every path goes through _walk, which follows links
    # inside the tree (".." stops at its root, an absolute target names a file of the
    # tree); a file is opened with O_NOFOLLOW first and walked only when that says it
    # is a link (ELOOP).  Only regular files are opened (O_NONBLOCK, then fstat: a FIFO
    # would block, /dev/zero never ends), at most _TREE_MAX_READ bytes of each, and of
    # a sysfs file 1 MiB: the kernel prints an attribute into one page (fs/sysfs/file.c),
    # so 64 links to one huge file cost 64 short refusals, not 64 huge parses.
    # Resolved paths are cached: the tree is taken to stay put while it is read.
    _TREE_MAX_READ = 64 << 20
    _SYSFS_MAX_READ = 1 << 20

    def _walk(self, tree: _SavedFolder, path: str, base: str = "") -> str:
        """``path`` inside the tree with every link followed, iteratively: at most 40
        links per lookup (the kernel's MAXSYMLINKS), 512 components deep, and
        _TREE_MAX_STEPS components walked by this backend in all, so that no tree of
        links (chains that double, loops, 2,000-component targets) costs more.
        ``base``: an already resolved folder to start from."""
        cur = base.split("/") if base else []
        todo = path.split("/")[::-1]
        links = 0
        while todo:
            c = todo.pop()
            self._steps += 1
            if self._steps > _TREE_MAX_STEPS or len(cur) > 512 or len(todo) > 4096:
                raise _oserror(errno.ELOOP, path, f"links too deep or too many in {self.root}")
            if c in ("", ".", ".."):
                if c == ".." and cur:
                    cur.pop()
                continue
            cur.append(c)
            link = tree.link("/".join(cur))
            if link is None:
                continue
            links += 1
            if links > 40:
                raise _oserror(errno.ELOOP, path, f"in {self.root}")
            if link.startswith("/"):
                cur = []  # from the tree's root
            else:
                cur = cur[:-1]  # from the link's folder
            todo.extend(link.split("/")[::-1])
        return "/".join(cur)

    def _rel(self, tree: _SavedFolder, path: str, leaf_too: bool = True) -> str:
        """The tree-relative path of ``path`` with its links followed; with
        ``leaf_too=False`` but for its last component (a reader that opens it with
        O_NOFOLLOW learns that from ELOOP, without a lookup of its own)."""
        rel = path.strip("/")
        got = self._real_paths.get(rel)
        if got is None:
            # Each folder resolved once, whatever the file: sysfs paths share them.
            head, _, leaf = rel.rpartition("/")
            base = self._real_paths.get(head)
            if base is None:
                if 0 < head.count("/") < 64:
                    base = self._rel(tree, head)
                else:
                    base = self._real_paths.setdefault(head, self._walk(tree, head))
            got = f"{base}/{leaf}" if base else leaf  # most leaves: a plain name
            if leaf in ("", ".", "..") or leaf_too and tree.link(got) is not None:
                got = self._walk(tree, leaf, base)
            elif not leaf_too:
                return got
            self._real_paths[rel] = got
        return got

    def read_text(self, path: str) -> str:
        if self._tree is None:
            with open(path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        limit = self._SYSFS_MAX_READ if path.startswith("/sys/") else self._TREE_MAX_READ
        try:
            return self._tree.read(self._rel(self._tree, path, False), path, limit)
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
        return self._tree.read(self._rel(self._tree, path), path, limit)

    def listdir(self, path: str) -> List[str]:
        if self._tree is None:
            return os.listdir(path)
        return self._tree.listdir(self._rel(self._tree, path), path)

    def exists(self, path: str) -> bool:
        if self._tree is None:
            # access, not stat: on CPython 3.8-3.10 a signal handled while os.stat
            # builds its result leaves a SystemError in place of the KeyboardInterrupt.
            return os.access(path, os.F_OK)
        try:
            rel = self._rel(self._tree, path)
        except OSError as err:
            if err.errno == errno.ELOOP:  # a loop is worth a warning, not "absent"
                raise
            return False
        return bool(self._tree.exists(rel))

    def realpath(self, path: str) -> str:
        if self._tree is None:
            return os.path.realpath(path)
        return "/" + self._rel(self._tree, path)

    def _refuse(self, what: str) -> None:
        if not self.is_live:
            raise NotLiveError(
                errno.EOPNOTSUPP,
                f"{what}: backend reads the saved tree {self.root!r}, not the running system",
            )

    def _call_syscall(self, nr: int, *args: int) -> int:
        # c_long wraps an unsigned value (an address, -1 as a u64) as C would.
        return int(self._libc_call(f"syscall {nr}", *[ctypes.c_long(a) for a in (nr, *args)]))

    def _call_madvise(self, addr: int, length: int, advice: int) -> None:
        self._libc_call("madvise", addr, length, advice)

    def _call_sched_getaffinity(self, pid: int = 0) -> FrozenSet[int]:
        if not self.is_live:
            return frozenset(_allowed_from_status(self)[0] or ())
        return frozenset(os.sched_getaffinity(pid))

    def _call_sched_setaffinity(self, pid: int, cpus: Iterable[int]) -> None:
        self._refuse("sched_setaffinity")
        os.sched_setaffinity(pid, set(cpus))

    def write_text(self, path: str, text: str) -> None:
        self._refuse(f"write {path}")  # only the running system is written: no tree
        with open(path, "w") as fh:
            fh.write(text)

    def touch(self, addr: int, length: int) -> None:
        self._refuse("touch")
        _touch_iov(addr, length, self.page_size)

    _RESIDENT = bytes(i & 1 for i in range(256))  # mincore's bit 0; others reserved

    def _call_mincore(self, addr: int, length: int) -> int:
        self._refuse("mincore")
        page = self.page_size
        vec = ctypes.create_string_buffer(min((length + page - 1) // page, 1 << 20))
        step = len(vec) * page  # 4 GiB of 4 KiB pages per call, 1 MiB of vector
        count = 0
        for start in range(addr, addr + length, step):
            chunk = min(step, addr + length - start)
            self._libc_call("mincore", start, chunk, vec)
            count += (
                ctypes.string_at(vec, (chunk + page - 1) // page).translate(self._RESIDENT).count(1)
            )
        return count

    # -- shared memory -----------------------------------------------------------------
    def _call_geteuid(self) -> int:
        return os.geteuid()

    def _call_statvfs(self, path: str) -> Optional[Tuple[int, int]]:
        if not self.is_live:
            return None
        st = os.statvfs(path)
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

    def _call_cpuset_cpus(self) -> Optional[FrozenSet[int]]:
        """This process's cgroup cpuset.  Cgroup v2: <path>/cpuset.cpus.effective;
        v1: cpuset/<path>/cpuset.effective_cpus (Documentation/admin-guide/cgroup-v2.rst,
        cgroup-v1/cpusets.rst); the path comes from /proc/self/cpuset."""
        reader = _Reader(self)
        path = _clean(reader.text("/proc/self/cpuset") or "")
        if not path.startswith("/"):
            return None
        path = path.rstrip("/")
        candidates = (
            f"/sys/fs/cgroup{path}/cpuset.cpus.effective",
            f"/sys/fs/cgroup/cpuset{path}/cpuset.effective_cpus",
            f"/sys/fs/cgroup/cpuset{path}/cpuset.cpus",
        )
        for candidate in candidates:
            found = reader.parsed(candidate, parse_cpulist)
            if found:
                return found  # type: ignore[no-any-return]
        return None

    def _libc_call(self, what: str, *args: Any) -> Any:
        """libc's function named by the first word of ``what``, called with ``args``."""
        self._refuse(what)
        fn = getattr(_get_libc(), re.match(r"\w+", what).group())  # type: ignore[union-attr]
        ctypes.set_errno(0)
        res = fn(*args)
        # -1 for the int-returning calls; NULL or MAP_FAILED ((void *) -1, unsigned
        # through c_void_p) for shmat and mmap.
        if res in (-1, None, (1 << (ctypes.sizeof(ctypes.c_void_p) * 8)) - 1):
            raise _oserror(ctypes.get_errno() or errno.EIO, what)
        return res

    def _call_shmget(self, key: int, size: int, flags: int) -> int:
        # key_t is a C int: 0..2**32-1 wraps to its signed value.
        return int(self._libc_call("shmget", ctypes.c_int(key).value, size, flags))

    def _call_shmat(self, shmid: int, flags: int = 0) -> int:
        return int(self._libc_call("shmat", shmid, None, flags))

    def _call_shmdt(self, addr: int) -> None:
        self._libc_call("shmdt", addr)

    def _call_shm_stat(self, shmid: int) -> ShmStat:
        self._refuse("shmctl(IPC_STAT)")
        if self.abi.name not in _SHMID_DS_GENERIC64:
            # Other layouts of struct shmid_ds (ppc64, s390x, 32-bit): the same facts,
            # as text, from the kernel's own table.
            return _sysvipc_stat(self.read_text("/proc/sysvipc/shm"), shmid)
        buf = ctypes.create_string_buffer(256)
        self._libc_call("shmctl(IPC_STAT)", shmid, IPC_STAT, buf)
        # struct shmid_ds, generic 64-bit layout: ipc64_perm (key, uid, gid, cuid,
        # cgid, mode) at 0, shm_segsz and the three times at 48, cpid/lpid/nattch at 80.
        key, uid, gid, cuid, cgid, mode = struct.unpack_from("<iIIIIH", buf.raw, 0)
        size, atime, dtime, ctime = struct.unpack_from("<Qqqq", buf.raw, 48)
        cpid, lpid, nattch = struct.unpack_from("<iiQ", buf.raw, 80)
        return ShmStat(
            key & 0xFFFFFFFF,
            shmid,
            uid,
            gid,
            cuid,
            cgid,
            mode,
            size,
            nattch,
            cpid,
            lpid,
            used=max(atime, dtime, ctime),
        )

    def _call_shm_rmid(self, shmid: int) -> None:
        self._libc_call("shmctl(IPC_RMID)", shmid, IPC_RMID, None)

    def _shm_path(self, name: str) -> str:
        if not name or "/" in name or name in (".", ".."):
            raise _oserror(errno.EINVAL, "shm_open", repr(name))
        return "/dev/shm/" + name

    def _call_shm_open(self, name: str, flags: int, mode: int) -> int:
        # Anyone can put a FIFO, a symlink or a device node in /dev/shm under one of
        # our names: O_NONBLOCK|O_NOFOLLOW so that opening it cannot block or leave
        # /dev/shm, then a regular file or nothing.
        self._refuse("shm_open")
        path = self._shm_path(name)
        odd = _oserror(errno.EINVAL, "shm_open", f"{path} is not a regular file")
        # Not even opened: opening a device can act already.  A missing file raises
        # here the FileNotFoundError that opening it without O_CREAT would.
        if not flags & os.O_CREAT and not stat.S_ISREG(os.lstat(path).st_mode):
            raise odd
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise odd
        if flags & os.O_CREAT and flags & os.O_EXCL:
            try:
                os.fchmod(fd, mode)  # exactly ``mode``, whatever the umask
            except OSError:
                os.close(fd)
                os.unlink(path)
                raise
        return fd

    def _call_shm_unlink(self, name: str) -> None:
        self._refuse("shm_unlink")
        os.unlink(self._shm_path(name))

    def _call_ftruncate(self, fd: int, size: int) -> None:
        self._refuse("ftruncate")
        os.ftruncate(fd, size)

    def _call_fstat(self, fd: int) -> ShmStat:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _oserror(errno.EINVAL, "fstat", "not a regular file")
        return ShmStat(
            0,
            fd,
            st.st_uid,
            st.st_gid,
            st.st_uid,
            st.st_gid,
            st.st_mode & 0o7777,
            st.st_size,
            st.st_nlink,
            0,
            0,
            st.st_ino,
            st.st_dev,
        )

    def _call_close(self, fd: int) -> None:
        os.close(fd)

    def _call_mmap(self, length: int, fd: int, huge: bool = False) -> int:
        flags = _MAP_SHARED
        if huge:
            flags |= _MAP_HUGETLB
        return int(self._libc_call("mmap", None, length, _PROT_READ | _PROT_WRITE, flags, fd, 0))

    def _call_munmap(self, addr: int, length: int) -> None:
        self._libc_call("munmap", addr, length)

    def _call_flock(self, fd: int, op: int) -> None:
        self._refuse("flock")
        import fcntl

        fcntl.flock(fd, op)

    def _call_pid_start(self, pid: int) -> Optional[str]:
        self._refuse("kill")
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:  # another user's: it exists
            pass
        # proc(5): state is field 3, starttime field 22; the command (field 2) may
        # hold ") ".  A zombie (Z) or dead (X) task has exited: its memory is gone.
        fields = (_read_optional(self, f"/proc/{pid}/stat") or "").rpartition(")")[2].split()
        if fields and fields[0] in ("Z", "X"):
            return None
        if len(fields) > 19:
            return fields[19]
        return ""

    def _call_whoami(self) -> Dict[str, Any]:
        # Read once per process (again after a fork): every attach and close writes
        # it into the last-use slot.  Start and timens are read together, so they
        # still belong together after a later setns() into another time namespace.
        pid = os.getpid()
        if self._me.get("pid") != pid:
            boot = _read_optional(self, "/proc/sys/kernel/random/boot_id") or ""
            self._me = {
                "pid": pid,
                "start": self.call("pid_start", pid) or "",
                "boot": boot.strip(),
                "pidns": _ns_link("pid"),
                "timens": _ns_link("time"),
            }
        return dict(self._me)


_default_lock = threading.Lock()
_default: Optional[Backend] = None


def default_backend() -> Backend:
    """The lazily built backend for the running system."""
    global _default
    with _default_lock:
        if _default is None:
            _default = LinuxBackend("/")
        return _default


def _b(backend: Optional[Backend]) -> Backend:
    return backend if backend is not None else default_backend()


class use_backend:
    """Make ``backend`` the default of every call (all threads) that passes none::

        with nu.use_backend(SimulatedBackend(tree)):   # restored on exit
            engine_code_that_calls_numa_utils()

    Called without ``with`` it just sets the default; ``use_backend(None)`` returns
    to the running system."""

    def __init__(self, backend: Optional[Backend]) -> None:
        global _default
        with _default_lock:
            self.previous, _default = _default, backend

    def __enter__(self) -> Backend:
        return default_backend()

    def __exit__(self, *exc: object) -> None:
        global _default
        with _default_lock:
            _default = self.previous


def _sibling(module: str) -> Any:
    """numa_utils_cli or numa_utils_sim: ``pkg.<module>`` for a copy vendored as
    ``pkg.<any name>``, else the top-level module (installed, or beside this file);
    None when there is neither.  A sibling this loads is handed this module as its
    library (``_NUMA_UTILS_LIBRARY``), so a copy the engine renamed is the one its CLI
    uses, never a module of the engine that has the library's name."""
    import importlib.util

    names = [module]
    if __package__:
        names = [f"{__package__}.{module}", module]
    for name in names:
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            continue
        sibling = importlib.util.module_from_spec(spec)
        sibling._NUMA_UTILS_LIBRARY = sys.modules[__name__]  # type: ignore[attr-defined]
        sys.modules[name] = sibling
        try:
            spec.loader.exec_module(sibling)
        except BaseException:
            del sys.modules[name]
            raise
        return sibling
    return None


# ===========================================================================
# Topology.  Files: Documentation/ABI/stable/sysfs-devices-node,
# Documentation/ABI/testing/sysfs-devices-system-cpu, drivers/pci/pci-sysfs.c.
# ===========================================================================

_NODE_DIR = "/sys/devices/system/node"
_CPU_DIR = "/sys/devices/system/cpu"
_PCI_DIR = "/sys/bus/pci/devices"

# PCI vendor ids (include/linux/pci_ids.h) of GPU makers, and the classes that count
# as GPUs: 0x03xxxx display controllers, 0x12xxxx processing accelerators.
GPU_VENDORS: Mapping[int, str] = MappingProxyType(
    {
        0x10DE: "nvidia",
        0x1002: "amd",
        0x8086: "intel",
    }
)
_GPU_CLASSES = (0x03, 0x12)
DEVICE_KINDS = ("gpu", "net", "rdma", "nvme", "display", "other")
# A PCI function's own subfolders naming its kernel devices (drivers/net,
# drivers/infiniband/core/sysfs.c, drivers/nvme/host/core.c): eth0, mlx5_0, nvme0.
_NAME_CLASSES = ("net", "infiniband", "nvme")


class HugePages(_Record):
    total: int
    free: int
    surplus: int = 0


class MemoryAccess(_Record):
    """HMAT figures of a memory node as the kernel reports them for access class 0
    (nodeN/access0/initiators/, Documentation/admin-guide/mm/numaperf.rst): from the
    best initiators, which are listed; None where a file is missing."""

    read_bandwidth_mbps: Optional[int]
    write_bandwidth_mbps: Optional[int]
    read_latency_ns: Optional[int]
    write_latency_ns: Optional[int]
    initiators: FrozenSet[int]


class Node(_Record):
    id: int
    cpus: FrozenSet[int]
    mem_total_kb: int
    mem_free_kb: int
    distances: Mapping[int, int]
    hugepages: Mapping[int, HugePages]  # page size in kB -> counts
    tier: Optional[int] = None  # memory_tierN (lower is faster); None: no tiers
    access: Optional[MemoryAccess] = None  # HMAT access class 0; None: no HMAT
    has_normal_memory: Optional[bool] = None  # False: ZONE_MOVABLE only; None: unknown
    kind: str = ""  # "dram" | "cpu-less" | "gpu" | "movable-only"
    kind_evidence: str = ""  #   | "generic-initiator" | "no-memory"; and why


class Cpu(_Record):
    id: int
    node: Optional[int]
    online: bool
    core: Optional[int]
    package: Optional[int]
    siblings: FrozenSet[int]
    llc: FrozenSet[int]


def _pci_json(gpu: Device) -> Dict[str, Any]:
    return {
        "address": gpu.address,
        "vendor": f"0x{gpu.vendor:04x}",
        "vendor_name": gpu.vendor_name,
        "device": f"0x{gpu.device:04x}",
        "class": f"0x{gpu.pci_class:06x}",
        "numa_node": gpu.numa_node,
        "local_cpus": sorted(gpu.cpus),
    }


class Device(_Record):
    """A PCI function and where it sits.  ``node``: firmware's numa_node, else the one
    node its local CPUs fall on (numa_node -1: no _PXM), else None; ``node_source``
    says which ("numa_node", "local_cpulist", "single node") or "unknown"."""

    address: str  # "0000:17:00.0"
    kind: str  # one of DEVICE_KINDS
    vendor: int
    device: int
    pci_class: int
    numa_node: int  # -1: firmware did not say
    node: Optional[int]
    node_source: str
    cpus: FrozenSet[int]  # local_cpulist
    names: Tuple[str, ...] = ()  # kernel names: eth0, mlx5_0, nvme0
    # The host bridge ("pci0000:80") and the bridges down to the device, from the
    # sysfs link; just the address in a saved tree that kept no links.
    path: Tuple[str, ...] = ()

    @property
    def vendor_name(self) -> str:
        return GPU_VENDORS.get(self.vendor, f"0x{self.vendor:04x}")

    def to_json(self) -> Dict[str, Any]:
        return dict(
            _pci_json(self),
            kind=self.kind,
            node=self.node,
            node_source=self.node_source,
            names=list(self.names),
            path=list(self.path),
        )


class Topology(_Record):
    nodes: Mapping[int, Node]
    online_nodes: FrozenSet[int]
    possible_nodes: FrozenSet[int]
    nodes_with_cpus: FrozenSet[int]
    nodes_with_memory: FrozenSet[int]
    cpus: Mapping[int, Cpu]
    online_cpus: FrozenSet[int]
    allowed_cpus: FrozenSet[int]
    allowed_mems: FrozenSet[int]
    gpus: Tuple[Device, ...]
    numa_balancing: Optional[int]
    thp: Optional[str]
    problems: Tuple[str, ...] = ()  # what could not be read, as warnings
    has_node_dir: bool = True
    memory_tiers: Mapping[int, FrozenSet[int]] = MappingProxyType({})  # tier -> nodes
    interleave_weights: Optional[Mapping[int, int]] = None  # None: kernel < 6.9
    interleave_auto: Optional[bool] = None  # weights derived from HMAT (6.16+)

    def cores_of(self, cpus: Iterable[int]) -> List[Tuple[int, ...]]:
        """``cpus`` grouped by physical core (SMT siblings together), in CPU order:
        what a thread plan hands out one at a time."""
        left = set(cpus)
        out = []
        for c in sorted(left):
            if c not in left:
                continue
            info = self.cpus.get(c)
            sib = {c}
            if info is not None:
                sib.update(info.siblings)
            sib &= left
            left -= sib
            out.append(tuple(sorted(sib)))
        return out

    def node_of_cpu(self, cpu: int) -> Optional[int]:
        if cpu not in self.cpus:
            return None
        return self.cpus[cpu].node

    @property
    def mems_allowed(self) -> FrozenSet[int]:
        return self.allowed_mems

    @property
    def usable_memory_nodes(self) -> FrozenSet[int]:
        """Nodes with memory that this process may allocate from (cpuset applied)."""
        return self.nodes_with_memory & self.allowed_mems or self.nodes_with_memory

    @property
    def package_nodes(self) -> Dict[int, FrozenSet[int]]:
        """package id -> the nodes with its online CPUs (several with SNC or NPS)."""
        out: Dict[int, Set[int]] = {}
        for cpu in self.cpus.values():
            if cpu.online and cpu.package is not None and cpu.node is not None:
                out.setdefault(cpu.package, set()).add(cpu.node)
        return {p: frozenset(v) for p, v in sorted(out.items())}

    @property
    def nodes_per_package(self) -> Optional[int]:
        """Nodes with CPUs per package: 1, or 2-4 with Intel SNC / AMD NPS; None when
        packages differ or sysfs does not tell."""
        counts = {len(value) for value in self.package_nodes.values()}
        if len(counts) != 1:
            return None
        return counts.pop()

    def distance(self, a: int, b: int) -> Optional[int]:
        if a not in self.nodes:
            return None
        return self.nodes[a].distances.get(b)

    def nearest(self, node: int, among: Iterable[int]) -> List[int]:
        """``among`` sorted by distance from ``node`` (unknown distances last), then id."""
        # Distances are 1-255 (parse_distance_row): ``or`` only replaces None.
        return sorted(set(among), key=lambda n: (self.distance(node, n) or 1 << 16, n))


def _id_of(name: str, prefix: str) -> Optional[int]:
    """7 for "node7" with prefix "node"; None for anything else ("node³", "nodes")."""
    tail = name[len(prefix) :]
    if not name.startswith(prefix) or len(tail) > 9:
        return None
    return _uint(tail)


def _node_dirs(reader: _Reader) -> List[int]:
    # Through the reader: a node directory that is a file or unreadable is a problem
    # listed in Topology.problems, not an exception out of read_topology().
    ids = (_id_of(n, "node") for n in reader.listdir(_NODE_DIR))
    return sorted(i for i in ids if i is not None and i < MAX_NODES)


def _hugepages(reader: _Reader, base: str) -> Dict[int, HugePages]:
    out: Dict[int, HugePages] = {}
    for name in sorted(reader.listdir(base)):
        m = re.match(r"^hugepages-([0-9]+)kB$", name)
        if m:
            out[int(m.group(1))] = HugePages(
                *(
                    reader.integer(f"{base}/{name}/{k}_hugepages") or 0
                    for k in ("nr", "free", "surplus")
                )
            )
    return out


_CPU_OPTIONAL = ("topology/thread_siblings_list", "topology/core_cpus_list", "cache")


def _first_parsed(reader: _Reader, paths: Iterable[str], *, nonempty: bool = False) -> Any:
    """The CPU list the first of ``paths`` that parses holds (with ``nonempty``: the
    first that is not empty); None when none does."""
    for path in paths:
        got = reader.parsed(path, parse_cpulist)
        if got is None or (nonempty and not got):
            continue
        return got
    return None


def _possible_cpus(reader: _Reader) -> FrozenSet[int]:
    """cpu/possible (else present), else the cpuN folders."""
    listed = _first_parsed(reader, (f"{_CPU_DIR}/possible", f"{_CPU_DIR}/present"))
    if listed is not None:
        return frozenset(listed)
    found = set()
    for name in reader.listdir(_CPU_DIR):
        cpu = _id_of(name, "cpu")
        if cpu is not None and cpu < MAX_CPUS:
            found.add(cpu)
    return frozenset(found)


def _cache_order(reader: _Reader, cpu_dir: str, indexes: Tuple[str, ...]) -> List[Tuple[int, str]]:
    """The data and unified cache index folders of one CPU, highest level first.
    Instruction caches (and unknown types) are not where data is shared (PyTorch's
    binding reads only Unified/Data the same way)."""
    order = []
    for index in indexes:
        level = reader.integer(f"{cpu_dir}/cache/{index}/level")
        if level is None:
            continue
        kind = (reader.text(f"{cpu_dir}/cache/{index}/type") or "").strip()
        if kind in ("Unified", "Data"):
            order.append((-level, index))
    return sorted(order)


def _last_level_cache(
    reader: _Reader, cpu_dir: str, order: List[Tuple[int, str]], default: FrozenSet[int]
) -> FrozenSet[int]:
    """The CPUs sharing the highest cache level with a readable sharing list."""
    for _, index in order:
        base = f"{cpu_dir}/cache/{index}"
        shared = reader.cpus(f"{base}/shared_cpu_list", f"{base}/shared_cpu_map")
        if shared is not None:
            return shared
    return default


def _cpu_node(reader: _Reader, cpu: int, cpu_dir: str, listed: Mapping[int, int]) -> Optional[int]:
    """The node of ``cpu``: from the node cpulists, else its cpuN/nodeM link (offline
    CPUs may be missing from the node cpulists; the link still says where they
    belong)."""
    if cpu in listed:
        return listed.get(cpu)
    for name in reader.listdir(cpu_dir):
        node = _id_of(name, "node")
        if node is not None:
            return node
    return None


class GetFlag(enum.IntFlag):
    """MPOL_F_* flags of get_mempolicy."""

    NODE = 1 << 0
    ADDR = 1 << 1
    MEMS_ALLOWED = 1 << 2


def _node_ids(nodes: Iterable[int]) -> FrozenSet[int]:
    """``nodes`` as a frozenset; ValueError for anything but an int >= 0."""
    ids = frozenset(nodes)
    for node in ids:
        if not isinstance(node, int) or isinstance(node, bool) or node < 0:
            raise ValueError(f"invalid NUMA node id {node!r}")
    return ids


def _swap_words(raw: bytes, abi: Abi) -> bytes:
    """Little-endian bytes as the ABI's words, and back (the same on little-endian ABIs)."""
    if abi.byteorder == "little":
        return raw
    wb = abi.word_bits // 8
    return b"".join(raw[i : i + wb][::-1] for i in range(0, len(raw), wb))


def _encode_nodemask(nodes: Iterable[int], words: int, abi: Abi) -> bytes:
    """``words`` unsigned longs in the ABI's byte order; nodes beyond them are left out."""
    bits = words * abi.word_bits
    return _swap_words(
        sum(1 << i for i in set(nodes) if i < bits).to_bytes(bits // 8, "little"), abi
    )


def decode_nodemask(raw: bytes, abi: Abi) -> FrozenSet[int]:
    wb = abi.word_bits // 8
    return _set_bits(int.from_bytes(_swap_words(raw[: len(raw) // wb * wb], abi), "little"))


class NodeMask:
    """A kernel nodemask: C unsigned longs, node n is bit n % W of word n // W.

    Sized from the highest node id (not the node count) and written word by word in
    the ABI's byte order, so big-endian machines and sparse ids are right.  ``maxnode``
    is the value for mbind/set_mempolicy/migrate_pages: bits + 1, because the kernel's
    get_nodes() decrements it before reading.
    """

    def __init__(
        self, nodes: Iterable[int] = (), *, abi: Optional[Abi] = None, bits: int = 0
    ) -> None:
        self.abi = abi if abi is not None else abi_for()
        self.nodes = ids = _node_ids(nodes)
        w = self.abi.word_bits
        need = max(bits, 1)
        if ids:
            need = max(need, max(ids) + 1)
        self.words = (need + w - 1) // w
        self.bits = self.words * w
        # Room for what get_mempolicy writes: ALIGN(maxnode - 1, 64) / 8 bytes.
        self.nbytes = ((self.bits + 63) // 64) * 8
        self.buffer = ctypes.create_string_buffer(
            _encode_nodemask(ids, self.words, self.abi), self.nbytes
        )
        self.address = ctypes.addressof(self.buffer)

    @property
    def maxnode(self) -> int:
        return self.bits + 1

    def read(self) -> FrozenSet[int]:
        """Decode the buffer (after the kernel wrote into it)."""
        return decode_nodemask(self.buffer.raw[: self.words * self.abi.word_bits // 8], self.abi)

    def __repr__(self) -> str:
        return f"NodeMask({format_cpulist(self.nodes)!r}, bits={self.bits})"


def get_mempolicy(
    addr: Optional[int] = None, flags: int = 0, *, backend: Optional[Backend] = None
) -> Tuple[int, FrozenSet[int]]:
    """get_mempolicy(2) -> (value, nodes).

    ``value`` is the mode with its mode flags, or a node id with GetFlag.NODE.  The mask
    is sized so that maxnode >= nr_node_ids, with room for what the kernel writes.
    """
    backend = _b(backend)
    reader = _Reader(backend)
    ids: Optional[FrozenSet[int]] = reader.parsed(f"{_NODE_DIR}/possible", _parse_nodelist)
    # nr_node_ids; unknown: a generous bound the kernel accepts (copy_nodes_to_user
    # clears the rest).
    if ids:
        bits = max(ids) + 1
    elif reader.exists(_NODE_DIR):
        bits = 1024
    else:
        bits = 1
    mask = NodeMask((), abi=backend.abi, bits=bits)
    # An int the kernel writes, decoded in the ABI's byte order (the same as the
    # host's on a real kernel; a simulated big-endian kernel writes big-endian).
    pol = ctypes.create_string_buffer(4)
    call_flags = int(flags)
    if addr is not None:
        call_flags |= GetFlag.ADDR
    backend.call(
        "syscall",
        backend.abi.number("get_mempolicy"),
        ctypes.addressof(pol),
        mask.address,
        mask.maxnode,
        addr or 0,
        call_flags,
    )
    return int.from_bytes(pol.raw, backend.abi.byteorder, signed=True), mask.read()


def _pointer_bits(abi: Abi) -> int:
    # Equal to abi.word_bits on a real kernel; a 32-bit ABI simulated on a 64-bit
    # host keeps host-sized pointers.
    return max(abi.word_bits, ctypes.sizeof(ctypes.c_void_p) * 8)


def _c_array(raw: bytes) -> ctypes.Array[ctypes.c_char]:
    return ctypes.create_string_buffer(raw, max(len(raw), 1))


def move_pages(
    pid: int,
    pages: Sequence[int],
    nodes: Optional[Sequence[int]] = None,
    flags: int = 0,
    *,
    backend: Optional[Backend] = None,
) -> List[int]:
    """move_pages(2).  Without ``nodes``: where each page is (node, or -errno such as
    -ENOENT for a page not yet faulted in).  With ``nodes``: move, return status."""
    backend = _b(backend)
    count = len(pages)
    if nodes is not None and len(nodes) != count:
        raise ValueError("move_pages: pages and nodes differ in length")
    bits = _pointer_bits(backend.abi)
    if backend.abi.byteorder == "big":
        ints = f">{count}i"
    else:
        ints = f"<{count}i"
    parr = _c_array(
        b"".join((v & ((1 << bits) - 1)).to_bytes(bits // 8, backend.abi.byteorder) for v in pages)
    )
    narr = None  # held until the call returns
    nodes_address = 0
    if nodes is not None:
        narr = _c_array(struct.pack(ints, *nodes))
        nodes_address = ctypes.addressof(narr)
    status = _c_array(bytes(4 * count))
    backend.call(
        "syscall",
        backend.abi.number("move_pages"),
        pid,
        count,
        ctypes.addressof(parr),
        nodes_address,
        ctypes.addressof(status),
        int(flags),
    )
    return list(struct.unpack(ints, status.raw[: 4 * count]))


_py_buffer_api: Optional[Tuple[Any, Any, Any]] = None


def _py_buffer() -> Tuple[Any, Any, Any]:
    """(Py_buffer struct type, PyObject_GetBuffer, PyBuffer_Release), made once.

    Under the lock: argtypes live on ctypes.pythonapi's one cached function object,
    so two threads each building their own PyBuffer class would leave one of them
    calling with the other's argtypes (ctypes.ArgumentError)."""
    global _py_buffer_api
    with _libc_lock:
        if _py_buffer_api is None:

            class PyBuffer(ctypes.Structure):
                # Py_buffer (Include/pybuffer.h), stable since Python 3.3.
                _fields_ = [
                    ("buf", ctypes.c_void_p),
                    ("obj", ctypes.py_object),
                    ("len", ctypes.c_ssize_t),
                    ("itemsize", ctypes.c_ssize_t),
                    ("readonly", ctypes.c_int),
                    ("ndim", ctypes.c_int),
                    ("format", ctypes.c_char_p),
                    ("shape", ctypes.c_void_p),
                    ("strides", ctypes.c_void_p),
                    ("suboffsets", ctypes.c_void_p),
                    ("internal", ctypes.c_void_p),
                ]

            api = ctypes.pythonapi
            get = api.PyObject_GetBuffer
            get.argtypes = [ctypes.py_object, ctypes.POINTER(PyBuffer), ctypes.c_int]
            get.restype = ctypes.c_int
            release = api.PyBuffer_Release
            release.argtypes = [ctypes.POINTER(PyBuffer)]
            release.restype = None
            _py_buffer_api = (PyBuffer, get, release)
        return _py_buffer_api


def _buffer_address(obj: Any) -> int:
    """Address of a contiguous buffer-protocol object, read-only ones included,
    without keeping an export alive (an mmap stays closable)."""
    PyBuffer, get, release = _py_buffer()
    view = PyBuffer()
    if get(obj, ctypes.byref(view), 0) != 0:  # PyBUF_SIMPLE: contiguous bytes
        raise TypeError(f"{type(obj).__name__} is not a contiguous buffer")
    try:
        return view.buf or 0
    finally:
        release(ctypes.byref(view))


def buffer_range(buf: Any, length: Optional[int] = None) -> Tuple[int, int]:
    """(address, length) of ``buf``: an int address (then ``length`` is required),
    bytearray, mmap, memoryview, ctypes object, numpy array, or anything with
    ``data_ptr()`` and ``nbytes`` (torch tensors).  ``length`` caps the length."""
    if isinstance(buf, bool):
        raise TypeError("a bool is not a buffer")
    if isinstance(buf, int):
        if length is None:
            raise TypeError("an integer address needs a length")
        return buf, int(length)
    if hasattr(buf, "data_ptr") and hasattr(buf, "nbytes"):
        addr, size = int(buf.data_ptr()), int(buf.nbytes)
        if hasattr(buf, "is_contiguous") and not buf.is_contiguous():
            raise TypeError("tensor is not contiguous")
    elif hasattr(buf, "__array_interface__"):
        ai = buf.__array_interface__
        if (
            ai.get("strides") is not None
            and hasattr(buf, "flags")
            and not buf.flags["C_CONTIGUOUS"]
        ):
            raise TypeError("array is not contiguous")
        addr, size = int(ai["data"][0]), int(buf.nbytes)
    elif isinstance(buf, (ctypes._SimpleCData, ctypes.Array, ctypes.Structure, ctypes.Union)):
        addr, size = ctypes.addressof(buf), ctypes.sizeof(buf)
    else:
        addr, size = _buffer_address(buf), memoryview(buf).nbytes
    if length is not None:
        if length < 0 or length > size:
            raise ValueError(f"length {length} outside the buffer's {size} bytes")
        size = int(length)
    return addr, size


def _first_byte(buf: Any) -> int:
    """The address of ``buf``'s first byte (an int is that address)."""
    if isinstance(buf, int):
        return buffer_range(buf, 1)[0]
    return buffer_range(buf)[0]


def node_of(buf: Any, *, backend: Optional[Backend] = None) -> Optional[int]:
    """The node holding the page of ``buf``'s first byte; None if not faulted in.

    Uses move_pages (query only); where that is denied (Docker's default seccomp
    profile), falls back to get_mempolicy(MPOL_F_NODE|MPOL_F_ADDR), which faults the
    page in.
    """
    backend = _b(backend)
    addr = _first_byte(buf)
    page = addr - addr % backend.page_size
    try:
        st = move_pages(0, [page], backend=backend)[0]
        if st < 0:
            return None
        return st
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOSYS):
            raise
    return get_mempolicy(page, GetFlag.NODE, backend=backend)[0]


def _read_cpus(
    reader: _Reader, node_of: Mapping[int, int]
) -> Tuple[Dict[int, Cpu], FrozenSet[int]]:
    possible = _possible_cpus(reader)
    online = reader.parsed(f"{_CPU_DIR}/online", parse_cpulist, frozenset(possible))
    cpus: Dict[int, Cpu] = {}
    # Sharing is symmetric: an online CPU listed in another's thread siblings has the
    # same package and siblings, and one listed in another's last-level cache set has
    # that set as its own.  Reusing them reads ~2.5 files per CPU instead of ~12 (a
    # 1,024-CPU machine has ~9,000 such files).  core_id is read per CPU: AMD
    # Bulldozer-family parts (util-linux's Opteron 6328 dump) list the two cores of a
    # compute unit as thread siblings, each with its own core_id.
    pkg_of: Dict[int, Tuple[Optional[int], FrozenSet[int]]] = {}
    llc_of: Dict[int, FrozenSet[int]] = {}
    levels: Dict[Tuple[str, ...], List[Tuple[int, str]]] = {}
    lacks: Optional[Set[str]] = None
    for cpu in sorted(possible):
        cpu_dir = f"{_CPU_DIR}/cpu{cpu}"
        topo = f"{cpu_dir}/topology"
        core = package = None
        siblings: FrozenSet[int] = frozenset()
        llc = siblings
        if cpu in online:
            if lacks is None:
                # sysfs gives every CPU the same attributes and cache folders (or none):
                # what the first online CPU lacks (old kernels' *_list files, a VM's
                # cacheinfo) is not looked for in the others.
                lacks = {
                    field for field in _CPU_OPTIONAL if not reader.exists(f"{cpu_dir}/{field}")
                }
            core = reader.integer(f"{topo}/core_id")
            if cpu in pkg_of:
                package, siblings = pkg_of[cpu]
            else:
                package = reader.integer(f"{topo}/physical_package_id")
                sibling_files = [
                    f"{cpu_dir}/{field}" for field in _CPU_OPTIONAL[:2] if field not in lacks
                ]
                siblings = _first_parsed(reader, sibling_files, nonempty=True) or frozenset()
                if cpu in siblings:
                    for other in siblings & online:
                        pkg_of[other] = (package, siblings)
            llc = llc_of.get(cpu, frozenset())
            if cpu not in llc_of:
                # Which index is which level is read once per set of index folders, not
                # per CPU (cacheinfo builds every CPU's leaves the same way): 4 fewer
                # files per CPU where CPUs share no last-level cache.
                indexes: Tuple[str, ...] = ()
                if "cache" not in lacks:
                    found = reader.listdir(f"{cpu_dir}/cache")
                    indexes = tuple(sorted(i for i in found if i.startswith("index")))
                order = levels.get(indexes)
                if order is None:
                    order = levels[indexes] = _cache_order(reader, cpu_dir, indexes)
                llc = _last_level_cache(reader, cpu_dir, order, llc)
                if cpu in llc:
                    for other in llc & online:
                        llc_of[other] = llc
        node = _cpu_node(reader, cpu, cpu_dir, node_of)
        cpus[cpu] = Cpu(cpu, node, cpu in online, core, package, siblings, llc)
    return cpus, frozenset(online) & frozenset(possible)


def _device_node(
    numa: int, online: FrozenSet[int], hits: Set[Optional[int]], cpu_nodes: FrozenSet[int]
) -> Tuple[Optional[int], str]:
    """A PCI device's node and how it was found: its numa_node when that names an
    online node, else the one node of its local CPUs, else the machine's only CPU
    node; (None, "unknown") when none of these tells."""
    if numa in online:
        return numa, "numa_node"
    if len(hits) == 1:
        return next(iter(hits)), "local_cpulist"
    if len(cpu_nodes) == 1:
        return min(cpu_nodes), "single node"
    return None, "unknown"


def _device_kind(cls: int, gpu: bool, infiniband: bool) -> str:
    """A PCI device's kind from its class code (PCI Code and ID Assignment: 0x02 network,
    0x0207 InfiniBand, 0x0108 NVM Express, 0x03 display)."""
    if gpu:
        return "gpu"
    if infiniband or cls >> 8 == 0x0207:
        return "rdma"
    if cls >> 16 == 0x02:
        return "net"
    if cls >> 8 == 0x0108:
        return "nvme"
    if cls >> 16 == 0x03:
        return "display"
    return "other"


def _norm_bus_id(text: str) -> str:
    """ "00000000:17:00.0" (NVML), "0000:17:00.0" (sysfs), "17:00.0" -> "0000:17:00.0"."""
    s = text.strip().lower()
    match = re.match(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})(?:\.([0-7]))?$", s)
    if match is None:
        raise ValueError(f"invalid PCI bus id {text!r}")
    return (
        f"{int(match.group(1) or '0', 16):04x}:{int(match.group(2), 16):02x}:"
        f"{int(match.group(3), 16):02x}.{int(match.group(4) or '0')}"
    )


def _read_devices(
    reader: _Reader,
    node_of: Mapping[int, int],
    cpu_nodes: FrozenSet[int],
    online: FrozenSet[int],
    gpus_only: bool = False,
) -> Tuple[Device, ...]:
    """Every PCI function but bridges (class 0x06), in PCI order; ``gpus_only``: the
    display (0x03) and accelerator (0x12) classes of the vendors in GPU_VENDORS.  A
    numa_node naming no ``online`` node (7 on a 2-node machine) is a problem, and the
    node is found as for -1: from the local CPUs."""
    out = []
    for addr in sorted(reader.listdir(_PCI_DIR)):
        folder = f"{_PCI_DIR}/{addr}"
        # The kernel names each function DDDD:BB:DD.F (pci_setup_device); anything
        # else is a damaged tree, and no bus id can be made from it.
        try:
            _norm_bus_id(addr)
        except ValueError:
            reader.problems.append(f"{folder}: not a PCI bus id, left out")
            continue
        vendor = reader.integer(f"{folder}/vendor")
        cls = reader.integer(f"{folder}/class")
        if vendor is None or cls is None or cls >> 16 == 0x06:
            continue
        gpu = vendor in GPU_VENDORS and cls >> 16 in _GPU_CLASSES
        if gpus_only and not gpu:
            continue
        numa: int = reader.parsed(f"{folder}/numa_node", _parse_int, -1)
        local = reader.cpus(f"{folder}/local_cpulist", f"{folder}/local_cpus") or frozenset()
        hits = {node_of.get(c) for c in local} - {None}
        if numa >= 0 and numa not in online:
            reader.problems.append(
                f"{folder}/numa_node names node {numa}, which is not online here: "
                "its node is taken from local_cpulist"
            )
        node, how = _device_node(numa, online, hits, cpu_nodes)
        sub = {c: sorted(reader.listdir(f"{folder}/{c}")) for c in _NAME_CLASSES}
        kind = _device_kind(cls, gpu, bool(sub["infiniband"]))
        try:
            parts = reader.b.realpath(folder).split("/")
        except OSError:
            parts = []
        top = [i for i, p in enumerate(parts) if re.match(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}$", p)]
        path: Tuple[str, ...] = (addr,)  # no host bridge in the link (a saved tree)
        if top:
            path = tuple(parts[top[0] :])
        out.append(
            Device(
                addr,
                kind,
                vendor,
                reader.integer(f"{folder}/device") or 0,
                cls,
                numa,
                node,
                how,
                local,
                tuple(n for c in _NAME_CLASSES for n in sub[c]),
                path,
            )
        )
    return tuple(out)


_TIER_DIR = "/sys/devices/virtual/memory_tiering"  # Linux 6.1+, mm/memory-tiers.c
_WI_DIR = "/sys/kernel/mm/mempolicy/weighted_interleave"  # Linux 6.9+


def _read_access(reader: _Reader, n: int, online: FrozenSet[int]) -> Optional[MemoryAccess]:
    folder = f"{_NODE_DIR}/node{n}/access0/initiators"
    names = reader.listdir(folder)
    if not names:
        return None
    ids = [_id_of(name, "node") for name in names]
    inits = reader.online(frozenset(i for i in ids if i is not None), online, f"{folder}/node*")
    return MemoryAccess(
        reader.integer(f"{folder}/read_bandwidth"),
        reader.integer(f"{folder}/write_bandwidth"),
        reader.integer(f"{folder}/read_latency"),
        reader.integer(f"{folder}/write_latency"),
        inits,
    )


def _read_tiers(reader: _Reader, online: FrozenSet[int]) -> Dict[int, FrozenSet[int]]:
    tiers: Dict[int, FrozenSet[int]] = {}
    for name in reader.listdir(_TIER_DIR):
        tier = _id_of(name, "memory_tier")
        if tier is not None:
            path = f"{_TIER_DIR}/{name}/nodelist"
            nodes = reader.online(reader.parsed(path, _parse_nodelist) or frozenset(), online, path)
            if nodes:
                tiers[tier] = nodes
    return tiers


def _read_weights(
    reader: _Reader, online: Optional[FrozenSet[int]] = None, possible: FrozenSet[int] = frozenset()
) -> Tuple[Optional[Dict[int, int]], Optional[bool]]:
    """({node: weight} or None without weighted interleave, auto mode or None).
    With ``online``: only online nodes' weights.  The kernel has a file for every
    possible node (mm/mempolicy.c sysfs_wi), so possible offline nodes are dropped
    without a warning; a file for any other node is a problem."""
    if not reader.exists(_WI_DIR):
        return None, None
    weights: Dict[int, int] = {}
    auto = None
    for name in sorted(reader.listdir(_WI_DIR)):
        node = _id_of(name, "node")
        if node is not None:
            w = reader.integer(f"{_WI_DIR}/{name}")
            if w is not None:
                weights[node] = w
        elif name == "auto":
            t = (reader.text(f"{_WI_DIR}/auto") or "").strip().lower()
            if t in ("1", "y", "true", "0", "n", "false"):
                auto = t in ("1", "y", "true")
            else:
                reader.problems.append(f"{_WI_DIR}/auto: unexpected value {_short(t)}")
    if online is not None:
        keep = reader.online(frozenset(weights) - (possible - online), online, f"{_WI_DIR}/node*")
        weights = {n: w for n, w in weights.items() if n in keep}
    return weights, auto


def _node_kind(node: Node, with_mem: FrozenSet[int], gi: FrozenSet[int]) -> Tuple[str, str]:
    """(kind, evidence) from sysfs alone; GPU memory is told apart afterwards."""
    if node.id in gi:  # ACPI SRAT generic initiator (Linux 5.10+): a device's node
        if node.cpus or node.id in with_mem:
            return "generic-initiator", "in has_generic_initiator"
        return "generic-initiator", "in has_generic_initiator; no CPUs, no memory"
    if node.id not in with_mem:
        return "no-memory", "not in has_memory"
    if node.has_normal_memory is False:
        if node.cpus:
            return "movable-only", "memory only in ZONE_MOVABLE (not in has_normal_memory)"
        return "movable-only", "memory only in ZONE_MOVABLE (not in has_normal_memory); no CPUs"
    if node.cpus:
        cpus = format_cpulist(node.cpus)
        return "dram", f"CPUs {cpus} and normal memory"
    return "cpu-less", "memory but no CPUs"


class _NvmlGpu(_Record):
    """One GPU as NVML reports it (NVML enumerates in PCI order, ignoring
    CUDA_VISIBLE_DEVICES)."""

    pci: str  # normalised bus id
    uuid: str  # "GPU-..."
    numa_node: Optional[int] = None  # GPU memory node (coherent platforms only)
    mig_uuids: Tuple[str, ...] = ()  # "MIG-..." of its MIG devices


_nvml_lock = threading.Lock()


_nvml_cache: Dict[str, Optional[List[_NvmlGpu]]] = {}


def _dlopen(names: Iterable[Optional[str]]) -> Tuple[Optional[ctypes.CDLL], str, List[str]]:
    """The first of ``names`` that loads: (library, its name, the errors before it)."""
    errors: List[str] = []
    for name in dict.fromkeys(n for n in names if n is not None):
        try:
            return ctypes.CDLL(name), name, errors
        except OSError as err:
            errors.append(str(err))
    return None, "", errors


def _load_nvml() -> Optional[ctypes.CDLL]:
    import ctypes.util

    return _dlopen(["libnvidia-ml.so.1", ctypes.util.find_library("nvidia-ml")])[0]


def _nvml_query() -> Optional[List[_NvmlGpu]]:
    lib = _load_nvml()
    if lib is None:
        return None

    class PciInfo(ctypes.Structure):  # nvmlPciInfo_t (v2/v3 layout)
        _fields_ = [
            ("busIdLegacy", ctypes.c_char * 16),
            *(
                (field, ctypes.c_uint)
                for field in ("domain", "bus", "device", "pciDeviceId", "pciSubSystemId")
            ),
            ("busId", ctypes.c_char * 32),
        ]

    def ask(fn: Any, *args: Any, out: Any = None) -> Any:
        """``out`` (default an unsigned int) as NVML function ``fn`` fills it through
        its last argument; None when it fails or this NVML lacks it (``fn`` None)."""
        if out is None:
            out = ctypes.c_uint(0)
        if fn is None or fn(*args, ctypes.byref(out)) != 0:
            return None
        return out

    def uuid_of(h: Any) -> Optional[str]:
        buf = ctypes.create_string_buffer(96)
        if lib.nvmlDeviceGetUUID(h, buf, 96) != 0:
            return None
        return buf.value.decode()

    try:
        if (getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit)() != 0:
            return None
    except (AttributeError, OSError):
        return None
    out: List[_NvmlGpu] = []
    try:
        count = ask(lib.nvmlDeviceGetCount_v2)
        if count is None:
            return None
        get_pci = getattr(lib, "nvmlDeviceGetPciInfo_v3", None) or lib.nvmlDeviceGetPciInfo_v2
        for i in range(count.value):
            h = ask(lib.nvmlDeviceGetHandleByIndex_v2, ctypes.c_uint(i), out=ctypes.c_void_p())
            if h is None:
                continue
            pci = ask(get_pci, h, out=PciInfo())
            if pci is None:
                continue
            node = ask(getattr(lib, "nvmlDeviceGetNumaNodeId", None), h)
            node_id = None  # not a coherent platform's GPU, or NVML does not say
            if node is not None:
                node_id = int(node.value)
            maxmig = ask(getattr(lib, "nvmlDeviceGetMaxMigDeviceCount", None), h)
            mig_count = 0
            if maxmig:
                mig_count = maxmig.value
            mhs = [
                ask(
                    lib.nvmlDeviceGetMigDeviceHandleByIndex,
                    h,
                    ctypes.c_uint(j),
                    out=ctypes.c_void_p(),
                )
                for j in range(mig_count)
            ]
            migs = (uuid_of(mh) for mh in mhs if mh is not None)
            out.append(
                _NvmlGpu(
                    f"{pci.domain:04x}:{pci.bus:02x}:{pci.device:02x}.0",
                    uuid_of(h) or "",
                    node_id,
                    tuple(m for m in migs if m is not None),
                )
            )
    except (AttributeError, OSError, UnicodeDecodeError):
        return None
    finally:
        try:
            lib.nvmlShutdown()
        except (AttributeError, OSError):
            pass
    return out


def _nvml_devices(backend: Backend) -> Optional[List[_NvmlGpu]]:
    """NVML's GPUs in NVML order, or None without NVML.  The seam tests monkeypatch.
    NVML describes the running system, so a saved tree or a simulation gets None."""
    if not backend.is_live:
        return None
    with _nvml_lock:
        if "gpus" not in _nvml_cache:
            _nvml_cache["gpus"] = _nvml_query()
        return _nvml_cache["gpus"]


_NVIDIA_PROC = "/proc/driver/nvidia/gpus"


def _driver_gpus(backend: Backend) -> Dict[str, Optional[str]]:
    """bus id -> GPU UUID (None: not told) of the GPUs the NVIDIA driver lists in
    /proc/driver/nvidia/gpus/<bus id>/information."""
    out: Dict[str, Optional[str]] = {}
    try:
        names = backend.listdir(_NVIDIA_PROC)
    except OSError:
        return out
    for name in names:
        try:
            bus = _norm_bus_id(name)
        except ValueError:
            continue
        match = re.search(
            r"^GPU UUID:\s*(\S+)",
            _read_optional(backend, f"{_NVIDIA_PROC}/{name}/information") or "",
            re.MULTILINE,
        )
        out[bus] = match.group(1) if match else None
    return out


def to_json(obj: Any) -> Any:
    """JSON-ready data for any numa_utils value (Topology, results, entries ...)."""
    if obj is None or type(obj) in (int, str, float, bool):  # most calls: a leaf
        return obj
    if isinstance(obj, Topology):
        return _topology_json(obj)
    if hasattr(obj, "to_json") and callable(obj.to_json):
        return obj.to_json()
    if isinstance(obj, tuple) and hasattr(obj, "_asdict"):
        return {key: to_json(value) for key, value in obj._asdict().items()}
    if isinstance(obj, enum.Enum):
        return obj.name.lower()
    if isinstance(obj, (frozenset, set)):
        return sorted(map(to_json, obj))
    if isinstance(obj, _abc.Mapping):  # typing.Mapping's check is Python code
        return {str(key): to_json(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(x) for x in obj]
    return obj


def _sorted_json(mapping: Mapping[int, Any]) -> Dict[str, Any]:
    """to_json() of ``mapping`` with its keys in order (to_json keeps a mapping's own)."""
    return {str(key): to_json(value) for key, value in sorted(mapping.items())}


def _node_json(node: Node) -> Dict[str, Any]:
    """Node's fields in order, its two mappings sorted by key."""
    out = {}
    for name, value in node._asdict().items():
        if name in ("distances", "hugepages"):
            out[name] = _sorted_json(value)
        else:
            out[name] = to_json(value)
    return out


def _cpu_json(cpu: Cpu) -> Dict[str, Any]:
    """Cpu's fields but its id (the key it is listed under)."""
    return {name: to_json(value) for name, value in zip(Cpu._fields[1:], cpu[1:])}


def _topology_json(topo: Topology) -> Dict[str, Any]:
    weights = None
    if topo.interleave_weights is not None:
        weights = _sorted_json(topo.interleave_weights)
    return {
        "nodes": [_node_json(topo.nodes[i]) for i in sorted(topo.nodes)],
        "online_nodes": sorted(topo.online_nodes),
        "possible_nodes": sorted(topo.possible_nodes),
        "nodes_with_cpus": sorted(topo.nodes_with_cpus),
        "nodes_with_memory": sorted(topo.nodes_with_memory),
        "cpus": {str(i): _cpu_json(topo.cpus[i]) for i in sorted(topo.cpus)},
        "online_cpus": sorted(topo.online_cpus),
        "allowed_cpus": sorted(topo.allowed_cpus),
        "allowed_mems": sorted(topo.allowed_mems),
        "gpus": [_pci_json(gpu) for gpu in topo.gpus],
        "nodes_per_package": topo.nodes_per_package,
        "numa_balancing": topo.numa_balancing,
        "thp": topo.thp,
        "memory_tiers": _sorted_json(topo.memory_tiers),
        "interleave_weights": weights,
        "interleave_auto": topo.interleave_auto,
        "problems": list(topo.problems),
    }


def _record_json(rec: Any, **replace: Dict[str, Any]) -> Dict[str, Any]:
    """to_json() of ``rec``'s fields, in order; ``replace``: field -> the keys that
    stand in its place (another name or form, or extra keys beside it)."""
    out: Dict[str, Any] = {}
    for key, value in rec._asdict().items():
        if key in replace:
            out.update(replace[key])
        else:
            out[key] = to_json(value)
    return out


class GpuInfo(_Record):
    """A GPU found in sysfs, with what numa_utils knows about its locality."""

    pci: str  # "0000:19:00.0"
    vendor: str  # "nvidia" | "amd" | "intel"
    device_id: int
    numa_node: int  # as firmware reports it; -1: nothing
    node: Optional[int]  # numa_node, else derived from local CPUs, else None
    node_source: str  # "numa_node" | "local_cpulist" | "single node" | ...
    cpu_node: Optional[int]  # node for its worker's CPUs (nearest one with CPUs)
    local_cpus: FrozenSet[int]
    memory_nodes: Tuple[int, ...] = ()  # CPU-less nodes holding this GPU's memory
    memory_source: Optional[str] = None  # "nvml" | "driver" | None
    uuid: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        return _record_json(self, device_id={"device": f"0x{self.device_id:04x}"})


def _nearest_tied(topo: Topology, node: int, pool: Iterable[int]) -> Tuple[int, ...]:
    """``(node,)`` when it is in ``pool``, else the nodes of ``pool`` nearest to it (all
    those at the shortest distance, in id order)."""
    pool = frozenset(pool)
    if node in pool:
        return (node,)
    near = topo.nearest(node, pool)
    return tuple(n for n in near if topo.distance(node, n) == topo.distance(node, near[0]))


def _nearest_cpu_node(topo: Topology, node: int) -> Optional[int]:
    """``node`` when it has CPUs, else the nearest node that has (by distance, then id)."""
    return next(iter(_nearest_tied(topo, node, topo.nodes_with_cpus)), None)


def _share_out(nodes: List[int], cards: List[GpuInfo]) -> Dict[str, Tuple[int, ...]]:
    """``nodes`` in order, the same number to each of ``cards`` (by PCI address); {}
    when they do not divide evenly."""
    k, left = divmod(len(nodes), len(cards))
    if left or not k:
        return {}
    return {g.pci: tuple(nodes[i * k : (i + 1) * k]) for i, g in enumerate(cards)}


def _home_cpu_node(topo: Topology, node: int) -> Optional[int]:
    """The one CPU node nearest to memory node ``node``; None on a tie, or when the
    distances do not tell."""
    near = _nearest_tied(topo, node, topo.nodes_with_cpus)
    if len(near) == 1:
        return near[0]
    return None


def _share_by_shape(
    topo: Topology, free: List[int], cards: List[GpuInfo]
) -> Dict[str, Tuple[int, ...]]:
    """CPU-less memory nodes ``free`` shared out to ``cards`` as
    _attribute_gpu_memory describes: per CPU node first, else all in one go."""
    home = {m: _home_cpu_node(topo, m) for m in free}
    groups: Dict[Optional[int], List[GpuInfo]] = {}
    for g in sorted(cards, key=lambda gpu: gpu.pci):
        groups.setdefault(g.cpu_node, []).append(g)
    if None not in home.values():
        plan: Dict[str, Tuple[int, ...]] = {}
        for cpu_node, members in groups.items():
            part = _share_out([m for m in free if home[m] == cpu_node], members)
            if not part:
                break
            plan.update(part)
        else:
            return plan
    return _share_out(free, sorted(cards, key=lambda gpu: (gpu.cpu_node, gpu.pci)))


def _attribute_gpu_memory(
    topo: Topology, infos: List[GpuInfo], nvml: Optional[List[_NvmlGpu]], driver: Iterable[str]
) -> List[GpuInfo]:
    """Attach CPU-less memory nodes to the NVIDIA GPUs whose memory they hold.

    NVML's nvmlDeviceGetNumaNodeId is the authority.  Without it, only GPUs the NVIDIA
    driver lists in /proc/driver/nvidia/gpus qualify, and the CPU-less memory nodes are
    shared out by shape: nodes nearest (by distance) to a CPU node go, in id order, to
    that node's GPUs in PCI order, k per GPU; when distances do not tell (all equal)
    and the counts divide, the nodes go in id order to the GPUs in (node, PCI) order,
    which is the order the driver onlines them.  Anything else stays unattributed.
    """
    pcis = {gpu.pci for gpu in infos}
    claimed: Dict[str, Tuple[Tuple[int, ...], str]] = {}
    taken: Set[int] = set()
    for nv in nvml or ():
        if nv.numa_node is None or nv.pci not in pcis:
            continue
        if nv.numa_node not in topo.nodes_with_cpus:
            claimed[nv.pci] = ((nv.numa_node,), "nvml")
            taken.add(nv.numa_node)
    free = sorted((topo.nodes_with_memory - topo.nodes_with_cpus) - taken)
    driver = set(driver)
    cands = [
        gpu
        for gpu in infos
        if gpu.vendor == "nvidia"
        and gpu.pci in driver
        and gpu.pci not in claimed
        and gpu.cpu_node is not None
    ]
    if free and cands:
        for pci, nodes in _share_by_shape(topo, free, cands).items():
            claimed[pci] = (nodes, "driver")
    out = []
    for gpu in infos:
        if gpu.pci in claimed:
            nodes, source = claimed[gpu.pci]
            gpu = gpu._replace(memory_nodes=nodes, memory_source=source)
        out.append(gpu)
    return out


def _gpu_infos(topo: Topology, backend: Backend) -> List[GpuInfo]:
    nvml = _nvml_devices(backend)
    driver = _driver_gpus(backend)
    uuids = {**driver, **{nv.pci: nv.uuid for nv in nvml or () if nv.uuid}}
    out = []
    for dev in topo.gpus:
        node, how = dev.node, dev.node_source
        cpu_node = None
        if node is not None:
            cpu_node = _nearest_cpu_node(topo, node)
        if node is not None and cpu_node != node:
            how += f", CPU-less: nearest node with CPUs is {cpu_node}"
        pci = _norm_bus_id(dev.address)
        out.append(
            GpuInfo(
                pci,
                dev.vendor_name,
                dev.device,
                dev.numa_node,
                node,
                how,
                cpu_node,
                dev.cpus,
                uuid=uuids.get(pci),
            )
        )
    return _attribute_gpu_memory(topo, out, nvml, driver)


def read_topology(*, backend: Optional[Backend] = None) -> Topology:
    """Read NUMA topology from sysfs/procfs through ``backend`` (default: this system).

    Never raises for a missing or malformed file: what could not be read is listed
    in ``Topology.problems`` and a documented fallback is used.
    """
    backend = _b(backend)
    reader = _Reader(backend)
    has_node_dir = reader.exists(_NODE_DIR)
    # No node directory (kernel without CONFIG_NUMA): one node 0 with every CPU and
    # all memory.
    online = possible = frozenset({0})
    if has_node_dir:
        online = reader.parsed(
            f"{_NODE_DIR}/online", _parse_nodelist, frozenset(_node_dirs(reader))
        )
        possible = reader.parsed(f"{_NODE_DIR}/possible", _parse_nodelist, online)
    node_cpus: Dict[int, FrozenSet[int]] = {}
    mem: Dict[int, Tuple[int, int]] = {}
    hp: Dict[int, Dict[int, HugePages]] = {}
    rows: Dict[int, Optional[Tuple[int, ...]]] = {0: (10,)}
    lacks: Optional[Set[str]] = None
    for node in sorted(online):
        folder = f"{_NODE_DIR}/node{node}"
        meminfo = "/proc/meminfo"
        hugepages = "/sys/kernel/mm/hugepages"
        if has_node_dir:
            meminfo = f"{folder}/meminfo"
            hugepages = f"{folder}/hugepages"
            # As for CPUs: a name the first node lacks (old kernels' cpulist, hugetlbfs
            # configured out) is not looked for in the others.
            if lacks is None:
                lacks = set()
                for name in ("cpulist", "hugepages"):
                    if not reader.exists(f"{folder}/{name}"):
                        lacks.add(name)
            found: Optional[FrozenSet[int]]
            if "cpulist" in lacks:
                found = reader.parsed(f"{folder}/cpumap", parse_cpumap)
            else:
                found = reader.cpus(f"{folder}/cpulist", f"{folder}/cpumap")
            node_cpus[node] = found or frozenset()
        mi = reader.parsed(meminfo, parse_meminfo) or {}
        mem[node] = (mi.get("MemTotal", 0), mi.get("MemFree", 0))
        if lacks and "hugepages" in lacks:
            hp[node] = {}
        else:
            hp[node] = _hugepages(reader, hugepages)
        if has_node_dir:
            rows[node] = reader.parsed(f"{folder}/distance", parse_distance_row)

    def listed(name: str, default: Any) -> Any:
        """A node list of the node directory, cut to the online nodes (once, here)."""
        path = f"{_NODE_DIR}/{name}"
        got = default
        if has_node_dir:
            got = reader.parsed(path, _parse_nodelist, default)
        if got is None:
            return None
        return reader.online(got, online, path)

    # What listed() falls back to when has_cpu or has_memory cannot be read: the nodes
    # the per-node files showed CPUs and memory on.
    found_cpus = found_mem = online
    if has_node_dir:
        found_cpus = frozenset(node for node, cpu in node_cpus.items() if cpu)
        found_mem = frozenset(node for node, (total, _) in mem.items() if total > 0)
    with_cpus: FrozenSet[int] = listed("has_cpu", found_cpus)
    with_mem: FrozenSet[int] = listed("has_memory", found_mem)
    node_of = {cpu: node for node, cl in node_cpus.items() for cpu in cl}
    cpus, online_cpus = _read_cpus(reader, node_of)
    if not has_node_dir:
        node_cpus[0] = online_cpus
        cpus = {cpu: value._replace(node=0) for cpu, value in cpus.items()}
    order = sorted(online)
    nodes: Dict[int, Node] = {}
    for node in order:
        row = rows[node]
        dist: Dict[int, int] = {}
        if row is not None:
            where = f"{_NODE_DIR}/node{node}/distance"
            if len(row) == len(order):
                dist = dict(zip(order, row))
            elif len(row) == len(possible) and online <= possible:
                # One entry per possible node (a node taken offline): keep the online.
                dist = {m: d for m, d in zip(sorted(possible), row) if m in online}
                reader.online(frozenset(possible), online, f"{where} (a column per possible node)")
            else:
                reader.problems.append(
                    f"{where} has {len(row)} entries for {len(order)} "
                    "online nodes; distances ignored"
                )
        total, free = mem[node]
        nodes[node] = Node(
            node,
            node_cpus[node],
            total,
            free,
            MappingProxyType(dist),
            MappingProxyType(hp[node]),
        )
    try:
        allowed_cpus, allowed_mems = _allowed_from_status(backend)
    except ValueError as err:
        reader.problems.append(str(err))
        allowed_cpus = allowed_mems = None
    # Memory tiers, HMAT and weighted interleave.
    tiers = _read_tiers(reader, online) if has_node_dir else {}
    tier_of = {m: t for t, ns in sorted(tiers.items(), reverse=True) for m in ns}
    normal: Optional[FrozenSet[int]] = listed("has_normal_memory", None)
    gi: FrozenSet[int] = listed("has_generic_initiator", frozenset())
    links: Dict[int, List[str]] = {}
    if gi:
        for dev in _read_devices(reader, node_of, with_cpus, online):
            links.setdefault(dev.numa_node, []).append(dev.address)
    for node, nd in nodes.items():
        access = None
        if has_node_dir and node in with_mem:
            access = _read_access(reader, node, online)
        has_normal = None
        if normal is not None:
            has_normal = node in normal
        nd = nd._replace(tier=tier_of.get(node), access=access, has_normal_memory=has_normal)
        kind, why = _node_kind(nd, with_mem, gi)
        if node in gi and node in links:
            why += "; standing for " + ", ".join(links[node])
        elif node in gi:
            why += "; standing for a device no PCI numa_node names"
        nodes[node] = nd._replace(kind=kind, kind_evidence=why)
    weights, auto = _read_weights(reader, online, possible)
    nb = reader.integer("/proc/sys/kernel/numa_balancing")
    thp_text = reader.text("/sys/kernel/mm/transparent_hugepage/enabled")
    thp = re.search(r"\[(\w+)\]", thp_text or "")
    thp_mode = None
    if thp:
        thp_mode = thp.group(1)
    elif thp_text is not None:
        reader.problems.append(f"no [selected] THP mode in {thp_text.strip()!r}")
    if allowed_cpus is None:
        allowed_cpus = online_cpus
    if allowed_mems is None:
        allowed_mems = with_mem
    frozen_weights = None
    if weights is not None:
        frozen_weights = MappingProxyType(weights)
    topo = Topology(
        nodes=MappingProxyType(nodes),
        online_nodes=online,
        possible_nodes=possible,
        nodes_with_cpus=with_cpus,
        nodes_with_memory=with_mem,
        cpus=MappingProxyType(cpus),
        online_cpus=online_cpus,
        allowed_cpus=allowed_cpus,
        allowed_mems=allowed_mems,
        gpus=_read_devices(reader, node_of, with_cpus, online, True),
        numa_balancing=nb,
        thp=thp_mode,
        problems=tuple(reader.problems),
        has_node_dir=has_node_dir,
        memory_tiers=MappingProxyType(tiers),
        interleave_weights=frozen_weights,
        interleave_auto=auto,
    )
    k = topo.nodes_per_package
    if k and k > 1:  # several nodes per package: say so where the kind is read
        pkg = {node: package for package, ns in topo.package_nodes.items() for node in ns}
        marked = dict(nodes)
        for node, value in nodes.items():
            if value.kind == "dram" and node in pkg:
                note = f"package {pkg[node]}, one of {k} nodes (SNC{k}/NPS{k})"
                marked[node] = value._replace(kind_evidence=f"{value.kind_evidence}; {note}")
        topo = topo._replace(nodes=MappingProxyType(marked))
    # GPU memory onlined as a node: CPU-less memory nodes the GPU section attributes
    # to a GPU (NVML or the NVIDIA driver's /proc entries; never by shape alone).
    if topo.nodes_with_memory - topo.nodes_with_cpus and any(
        gpu.vendor_name == "nvidia" for gpu in topo.gpus
    ):
        gnodes = dict(topo.nodes)
        for gpu in _gpu_infos(topo, backend):
            for gm in gpu.memory_nodes:
                if gm in gnodes:
                    gnodes[gm] = gnodes[gm]._replace(
                        kind="gpu",
                        kind_evidence=f"memory of GPU {gpu.pci} "
                        f"({gpu.memory_source}); {gnodes[gm].kind_evidence}",
                    )
        topo = topo._replace(nodes=MappingProxyType(gnodes))
    return topo


# ---------------------------------------------------------------------------
# The default memory nodes: where a KV cache and every ``nodes=None``
# call go.  Memory tiers (mm/memory-tiers.c: a lower tier id is faster; DRAM is tier
# 4) and HMAT drive the kernel's own demotion; we follow them, and without them fall
# back to evidence that has no false positives on plain machines.
# ---------------------------------------------------------------------------


def _topology_or_read(topology: Optional[Topology], backend: Optional[Backend]) -> Topology:
    """``topology`` when the caller passed one, else the system's, read now."""
    if topology is not None:
        return topology
    return read_topology(backend=backend)


class MemoryNodeChoice(_Record):
    """The nodes default_memory_nodes() chose, those it left out (node -> why) and
    what the choice rests on ("memory tiers", "distances (no tier or HMAT data)" ...)."""

    nodes: FrozenSet[int]
    left_out: Mapping[int, str]
    basis: str

    def to_json(self) -> Dict[str, Any]:
        return {
            "nodes": sorted(self.nodes),
            "basis": self.basis,
            "left_out": _sorted_json(self.left_out),
        }


def _widest_cpu_distance(topo: Topology, cpu_nodes: List[int]) -> Optional[int]:
    """The largest distance between two of ``cpu_nodes`` (with one node: its own
    distance to itself); None when the table says nothing."""
    distances = []
    if len(cpu_nodes) > 1:
        for node in cpu_nodes:
            if node not in topo.nodes:
                continue
            for other, d in topo.nodes[node].distances.items():
                if other != node and other in cpu_nodes:
                    distances.append(d)
    else:
        for node in cpu_nodes:
            own = topo.distance(node, node)
            if own is not None:
                distances.append(own)
    return max(distances, default=None)


def memory_node_choice(
    topology: Optional[Topology] = None, *, backend: Optional[Backend] = None
) -> MemoryNodeChoice:
    """default_memory_nodes() with the reasons.  The rule, in order (a step never
    leaves nothing): nodes with memory inside this process's cpuset; not GPU memory
    (it is the GPU's own HBM); not movable-only memory (no normal memory: CXL
    expanders, GPU memory); then, when the kernel's memory tiers tell nodes apart,
    only the tier of the CPUs' own DRAM: slower tiers (CXL, far memory) and faster
    CPU-less tiers (HBM in flat mode: small, for explicit use) are left out.  Without
    tier data, a CPU-less node with no HMAT figures is left out when it is farther
    from every CPU node than the CPU nodes are from each other."""
    topo = _topology_or_read(topology, backend)
    cands = set(topo.usable_memory_nodes)
    left = {
        nid: (
            f"outside this process's cpuset (Mems_allowed_list {format_cpulist(topo.allowed_mems)})"
        )
        for nid in sorted(topo.nodes_with_memory - cands)
    }
    basis = ["nodes with memory in the cpuset"]

    def drop(test: Callable[[Node], bool], why: Callable[[Node], str], because: str = "") -> None:
        """Leave out the nodes ``test`` picks (for ``why``), unless that would leave nothing."""
        out = [nid for nid in sorted(cands) if nid in topo.nodes and test(topo.nodes[nid])]
        if not out or len(out) == len(cands):
            return
        for nid in out:
            left[nid] = why(topo.nodes[nid])
            cands.discard(nid)
        if because:
            basis.append(because)

    drop(
        lambda info: info.kind == "generic-initiator",
        lambda info: "a generic-initiator node: a device's, not the CPUs' memory",
        "generic initiators",
    )
    drop(
        lambda info: info.kind == "gpu",
        lambda info: (
            f"GPU memory ({info.kind_evidence.split(';')[0]}): host buffers "
            "there take the GPU's own HBM"
        ),
        "GPU memory nodes",
    )
    drop(
        lambda info: info.has_normal_memory is False,
        lambda info: (
            "movable-only memory (not in has_normal_memory; CXL expanders "
            "and GPU memory come up this way)"
        ),
        "has_normal_memory",
    )
    known_tiers = {nid: tier for nid in cands if (tier := topo.nodes[nid].tier) is not None}
    with_cpus = cands & topo.nodes_with_cpus
    if len(known_tiers) == len(cands) and len(set(known_tiers.values())) > 1:
        basis.append("memory tiers")
        ref = min(known_tiers[nid] for nid in (with_cpus or cands))
        drop(
            lambda info: known_tiers[info.id] > ref,
            lambda info: (
                f"slower memory tier {info.tier} (the default uses tier {ref}, the CPUs' DRAM)"
            ),
        )
        drop(
            lambda info: known_tiers[info.id] < ref and info.id not in topo.nodes_with_cpus,
            lambda info: (
                f"faster CPU-less tier {info.tier} (HBM-like and small: for "
                f"explicit use; the default uses tier {ref}, the CPUs' DRAM)"
            ),
        )
    else:
        cpu_set = with_cpus or (topo.nodes_with_cpus & set(topo.nodes))
        cpu_nodes = sorted(cpu_set)
        remote = _widest_cpu_distance(topo, cpu_nodes)
        if remote is not None:
            # A CPU-less node without HMAT figures, farther than any CPU node pair.
            far = {}
            for node in cands - topo.nodes_with_cpus:
                if topo.nodes[node].access is not None:
                    continue
                known = [topo.distance(cpu_node, node) for cpu_node in cpu_nodes]
                distances = [d for d in known if d is not None]
                if len(distances) == len(cpu_nodes) and min(distances) > remote:
                    far[node] = min(distances)
            drop(
                lambda info: info.id in far,
                lambda info: (
                    f"CPU-less and far (distance {far[info.id]} from the nearest "
                    f"CPU node, > {remote} between CPU nodes); no tier or HMAT "
                    "data to say it is fast"
                ),
                "distances (no tier or HMAT data)",
            )
    return MemoryNodeChoice(frozenset(cands), MappingProxyType(left), ", ".join(basis))


def default_memory_nodes(
    topology: Optional[Topology] = None, *, backend: Optional[Backend] = None
) -> FrozenSet[int]:
    """The nodes a KV cache, and every ``nodes=None`` call (interleave, bind,
    SharedRegion.create, plans, choose_node), uses: the CPUs' DRAM tier, within the
    cpuset, never GPU memory or a slower tier.  memory_node_choice() says what it
    left out and why; pass ``nodes=[...]`` (or NUMA_NODES) to use other nodes."""
    return memory_node_choice(topology, backend=backend).nodes


# ---------------------------------------------------------------------------
# JSON: one function turns every public type into JSON-ready data.
# ---------------------------------------------------------------------------


# ===========================================================================
# Memory policy: constants and node masks.  include/uapi/linux/mempolicy.h;
# the maxnode rules of mm/mempolicy.c get_nodes() / copy_nodes_to_user().
# ===========================================================================


class Mode(enum.IntEnum):
    """MPOL_* modes: PREFERRED_MANY is Linux 5.15+, WEIGHTED_INTERLEAVE 6.9+."""

    DEFAULT = 0
    PREFERRED = 1
    BIND = 2
    INTERLEAVE = 3
    LOCAL = 4
    PREFERRED_MANY = 5
    WEIGHTED_INTERLEAVE = 6


class ModeFlag(enum.IntFlag):
    """MPOL_F_* flags or-ed into a mode (MPOL_MODE_FLAGS)."""

    NUMA_BALANCING = 1 << 13
    RELATIVE_NODES = 1 << 14
    STATIC_NODES = 1 << 15


_MODE_FLAGS_MASK = sum(ModeFlag)  # every mode flag


# The flags' words in numa_maps, ModeFlag's members from the highest bit: the
# kernel's order (mpol_to_str).
_MAPS_FLAG_NAMES = ("static", "relative", "balancing")


class _ModeWords(_Record):
    """How one mode is spelled.  Every spelling is read back as that mode, by every
    input that takes one (mode=, policy=, memory=, layouts, NUMA_MEMORY_POLICY, the
    CLI)."""

    word: str  # what layouts, GPU plans and the CLI say: "prefer-many"
    kernel: str  # what numa_maps and PolicyInfo's text say (mpol_to_str): "prefer (many)"
    result: str  # what PolicyResult.mode and to_json say (the enum's name): "preferred_many"
    aliases: Tuple[str, ...] = ()  # other tools' names (numactl's "membind")


# The one table of mode words (policy_modes[] in mm/mempolicy.c for the kernel's).
_MODE_WORDS: Mapping[Mode, _ModeWords] = MappingProxyType(
    {
        Mode.DEFAULT: _ModeWords("default", "default", "default", ("none", "first-touch")),
        Mode.PREFERRED: _ModeWords("prefer", "prefer", "preferred"),
        Mode.BIND: _ModeWords("bind", "bind", "bind", ("membind",)),
        Mode.INTERLEAVE: _ModeWords("interleave", "interleave", "interleave"),
        Mode.LOCAL: _ModeWords("local", "local", "local"),
        Mode.PREFERRED_MANY: _ModeWords(
            "prefer-many", "prefer (many)", "preferred_many", ("preferred-many",)
        ),
        Mode.WEIGHTED_INTERLEAVE: _ModeWords(
            "weighted-interleave", "weighted interleave", "weighted_interleave"
        ),
    }
)


# Each spelling in _MODE_WORDS -> its mode: every word a result reports and every
# word an input takes ("prefer", "preferred", "MPOL_PREFERRED" ...).
MODE_NAMES: Mapping[str, Mode] = MappingProxyType(
    {
        word: mode
        for mode, words in _MODE_WORDS.items()
        for word in (words.word, words.kernel, words.result, *words.aliases)
    }
)


class MbindFlag(enum.IntFlag):
    """MPOL_MF_* flags of mbind (MOVE_ALL needs CAP_SYS_NICE)."""

    STRICT = 1 << 0
    MOVE = 1 << 1
    MOVE_ALL = 1 << 2


MADV_POPULATE_WRITE = 23  # Linux 5.14+


# ===========================================================================
# Memory policy: the raw syscalls.  Public, for libnuma-level control; they raise
# OSError built from errno.  Most engines want the safe layer below instead.
# ===========================================================================


def _mask_args(nodes: Iterable[int], abi: Abi) -> Tuple[Optional[NodeMask], int, int]:
    """(mask, its address, maxnode) for a policy syscall's node list; no nodes is a
    NULL mask (address and maxnode 0).  The caller holds the mask until the call
    returns: the kernel reads its buffer."""
    ids = frozenset(nodes)
    if not ids:
        return None, 0, 0
    mask = NodeMask(ids, abi=abi)
    return mask, mask.address, mask.maxnode


def mbind(
    addr: int,
    length: int,
    mode: int,
    nodes: Iterable[int] = (),
    flags: int = 0,
    *,
    mode_flags: int = 0,
    backend: Optional[Backend] = None,
) -> None:
    """mbind(2): set the policy of [addr, addr+length).  ``addr`` must be page aligned."""
    backend = _b(backend)
    mask, mask_address, maxnode = _mask_args(nodes, backend.abi)  # mask: alive until the call
    backend.call(
        "syscall",
        backend.abi.number("mbind"),
        addr,
        length,
        int(mode) | int(mode_flags),
        mask_address,
        maxnode,
        int(flags),
    )


def set_mempolicy(
    mode: int, nodes: Iterable[int] = (), *, mode_flags: int = 0, backend: Optional[Backend] = None
) -> None:
    """set_mempolicy(2): the calling THREAD's policy (threads it creates inherit it)."""
    backend = _b(backend)
    mask, mask_address, maxnode = _mask_args(nodes, backend.abi)  # mask: alive until the call
    backend.call(
        "syscall",
        backend.abi.number("set_mempolicy"),
        int(mode) | int(mode_flags),
        mask_address,
        maxnode,
    )


def migrate_pages(
    pid: int,
    old_nodes: Iterable[int],
    new_nodes: Iterable[int],
    *,
    backend: Optional[Backend] = None,
) -> int:
    """migrate_pages(2): move a process's pages from ``old_nodes`` to ``new_nodes``."""
    backend = _b(backend)
    old, new = frozenset(old_nodes), frozenset(new_nodes)
    bits = max(old | new, default=0) + 1  # one mask size for both
    om, nm = NodeMask(old, abi=backend.abi, bits=bits), NodeMask(new, abi=backend.abi, bits=bits)
    nr = backend.abi.number("migrate_pages")
    return int(backend.call("syscall", nr, pid, om.maxnode, om.address, nm.address))


def set_mempolicy_home_node(
    addr: int, length: int, home_node: int, flags: int = 0, *, backend: Optional[Backend] = None
) -> None:
    """set_mempolicy_home_node(2) (Linux 5.17+), for BIND / PREFERRED_MANY ranges."""
    backend = _b(backend)
    backend.call(
        "syscall", backend.abi.number("set_mempolicy_home_node"), addr, length, home_node, flags
    )


# ===========================================================================
# Buffers: address + length of anything that has memory behind it.
# ===========================================================================


def _page_range(addr: int, length: int, page: int) -> Tuple[int, int]:
    """The whole pages covering [addr, addr+length): mbind needs an aligned start."""
    start = addr - addr % page
    return start, -(-(addr + length) // page) * page - start


# ===========================================================================
# Memory policy: the safe layer engines call.  Never raises unless strict=True;
# returns a PolicyResult that is truthy when the policy was applied and otherwise
# says why, with the memory left usable under the kernel's first-touch default.
# ===========================================================================

_HINTS = MappingProxyType(
    {
        "EPERM": "memory policy syscalls are denied: in a container add CAP_SYS_NICE (docker run "
        "--cap-add SYS_NICE) or use a seccomp profile that allows mbind/set_mempolicy/"
        "get_mempolicy",
        "ENOSYS": "the kernel has no NUMA memory policy support (CONFIG_NUMA off)",
        "unsupported-arch": "no syscall table for this CPU architecture/ABI",
        "cpuset": "the cpuset (Mems_allowed_list) forbids every requested node",
        "single-node": "only one memory node is usable: nothing to spread",
        "not-live": "the backend reads a saved tree, not the running system",
        "disabled": "disabled by configuration",
        "EINVAL": "the kernel rejected the policy (EINVAL)",
        "no-memory-node": "the requested nodes have no memory or do not exist",
        "no-weighted-interleave": "the kernel lacks MPOL_WEIGHTED_INTERLEAVE (Linux 6.9+); "
        "pass fallback='interleave' to accept a plain interleave",
        "resident-unmoved": "the policy places pages faulted from now on; pages already in "
        "memory stay where they are: pass move=True to migrate them, or "
        "apply the policy before the first touch",
    }
)


class PolicyResult(_Record):
    """What a safe-layer call did.  Truthy when the policy was applied."""

    applied: bool
    mode: str  # "interleave", "bind", "preferred", "local", ...
    nodes: FrozenSet[int]
    start: int = 0  # covered range (whole pages); 0/0 for thread policy
    length: int = 0
    reason: Optional[str] = None  # why not applied: "EPERM", "single-node", ...
    errno: Optional[int] = None
    hint: Optional[str] = None
    dropped: FrozenSet[int] = frozenset()  # requested nodes the cpuset forbids
    # Bytes of the range already in memory that the call left where they are (a
    # policy places new pages; move=True migrates these).  Reason "resident-unmoved".
    resident_unmoved: int = 0

    def __bool__(self) -> bool:
        return self.applied

    def to_json(self) -> Dict[str, Any]:
        return {**self._asdict(), "nodes": sorted(self.nodes), "dropped": sorted(self.dropped)}


class PolicyInfo(_Record):
    """A policy read back from the kernel (get_policy)."""

    mode: Mode
    flags: int
    nodes: FrozenSet[int]

    def __str__(self) -> str:
        """The policy as /proc/<pid>/numa_maps prints it (mpol_to_str; the kernel
        never sets both static and relative)."""
        s = _MODE_WORDS[self.mode].kernel
        words = [w for f, w in zip(reversed(ModeFlag), _MAPS_FLAG_NAMES) if self.flags & f]
        if words:
            s += "=" + "|".join(words)
        if self.mode not in (Mode.DEFAULT, Mode.LOCAL) and self.nodes:
            s += ":" + format_cpulist(self.nodes)
        return s

    def to_json(self) -> Dict[str, Any]:
        return {
            "mode": _MODE_WORDS[self.mode].result,
            "flags": self.flags,
            "nodes": sorted(self.nodes),
            "text": str(self),
        }


def _mode_of(mode: Union[str, int]) -> Mode:
    if isinstance(mode, str):
        try:
            return MODE_NAMES[mode.strip().lower()]
        except KeyError:
            raise ValueError(
                f"unknown memory policy {mode!r}; one of {', '.join(sorted(MODE_NAMES))}"
            ) from None
    return Mode(int(mode) & ~_MODE_FLAGS_MASK)


_default_cache: Dict[Tuple[Any, ...], FrozenSet[int]] = {}


def _memory_nodes(backend: Backend) -> Tuple[FrozenSet[int], FrozenSet[int], FrozenSet[int]]:
    """(nodes with memory, Mems_allowed, default_memory_nodes) cheaply: the whole
    topology is read only when a memory node lacks CPUs or normal memory or the
    kernel has several memory tiers (otherwise the default is every allowed node)."""
    reader = _Reader(backend)  # what it cannot read is read_topology's to report
    if not reader.exists(_NODE_DIR):
        return frozenset({0}), frozenset({0}), frozenset({0})
    mem = reader.parsed(f"{_NODE_DIR}/has_memory", _parse_nodelist)
    if mem is None:
        mem = frozenset(_node_dirs(reader))
    try:
        _, allowed = _allowed_from_status(backend)
    except ValueError:
        allowed = None
    if allowed is None:
        allowed = mem
    texts = tuple(reader.text(f"{_NODE_DIR}/{name}") for name in ("has_cpu", "has_normal_memory"))
    tiers = tuple(sorted(x for x in reader.listdir(_TIER_DIR) if x.startswith("memory_tier")))
    try:  # every memory node has CPUs and normal memory
        plain = all(t is None or mem <= parse_cpulist(t) for t in texts)
    except ValueError:
        plain = False
    if plain and len(tiers) < 2:
        return mem, allowed, (mem & allowed or mem)
    # A tiered machine: the whole topology decides (~10 ms), once per distinct state
    # of these files (an engine may interleave every layer of every request).
    # Each dict operation is atomic: two threads at worst both read the topology.
    key = (type(backend).__name__, backend.root, mem, allowed, tuple(texts), tiers)
    default = _default_cache.get(key)
    if default is None:
        if len(_default_cache) > 64:
            _default_cache.clear()
        default = _default_cache[key] = default_memory_nodes(backend=backend)
    return mem, allowed, default


def _errno_reason(err: int) -> str:
    return errno.errorcode.get(err, f"errno {err}")


def _fallback(
    res: PolicyResult,
    strict: bool,
    what: str,
    reason: Optional[str] = None,
    err: Optional[int] = None,
) -> PolicyResult:
    """``res`` (failed with ``reason`` and ``err``, when given) returned, or raised as
    OSError in strict mode; logged once unless nothing was asked of the kernel."""
    if reason is not None:
        res = res._replace(reason=reason, errno=err, hint=_HINTS.get(reason))
    if strict:
        raise OSError(
            res.errno or errno.EINVAL, f"{what}: {res.reason}: {res.hint or ''}".rstrip(": ")
        )
    if res.reason not in ("disabled", "single-node"):
        _warn_once(
            f"{what}:{res.reason}",
            "numa_utils: %s not applied (%s); memory stays usable under first-touch. %s",
            what,
            res.reason,
            res.hint or "",
        )
    return res


# What memory= and NUMA_MEMORY_POLICY take: every mode word, and "socket".
MEMORY_WORDS = ("socket", *MODE_NAMES)


# Name after the prefix -> (default, kind): "bool", "int" (with its minimum), "nodes"
# (numactl's node-list grammar, resolved on the machine), or the accepted choices.
# envs.py is the same registry with documentation, for engines to merge into theirs
# (tests/test_envs.py checks that the two agree).
_ENV_VARS: Mapping[str, Tuple[Any, Any]] = MappingProxyType(
    {
        "ENABLE_NUMA_INTERLEAVE": (False, "bool"),
        "NUMA_STRICT": (False, "bool"),
        "NUMA_NODES": (None, "nodes"),
        "NUMA_PREFAULT_THREADS": (None, ("int", 1)),
        "NUMA_HUGEPAGES": ("off", ("off", "thp", "2M", "1G", "auto")),
        "NUMA_BIND_POLICY": ("none", ("none", "node", "socket", "exclusive", "core-complex")),
        "NUMA_RESERVED_CORES": (0, ("int", 0)),
        "NUMA_MEMORY_POLICY": ("prefer", MEMORY_WORDS),
    }
)


_env_prefix = "NUMA_UTILS_"


def _env(suffix: str) -> Any:
    """The typed value of <prefix><suffix>, read now; its default when unset or empty.
    A malformed value raises ValueError naming the variable."""
    default, kind = _ENV_VARS[suffix]
    name = _env_prefix + suffix
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    word = raw.lower()
    if kind == "bool":
        if word in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return word in ("1", "true", "yes", "on")
        raise ValueError(
            f"{name}={_short(raw)}: expected a boolean (1/0, true/false, yes/no, on/off)"
        )
    if kind == "nodes":
        return raw
    if kind[0] == "int":
        if not re.fullmatch(r"-?[0-9]{1,18}", raw):
            raise ValueError(f"{name}={_short(raw)}: expected an integer")
        if int(raw) < kind[1]:
            raise ValueError(f"{name}={_short(raw)}: must be >= {kind[1]}")
        return int(raw)
    for choice in kind:
        if choice.lower() == word:
            return choice
    raise ValueError(f"{name}={_short(raw)}: expected one of {', '.join(kind)}")


def _strict_or_env(strict: Optional[bool]) -> bool:
    if strict is not None:
        return bool(strict)
    return bool(_env("NUMA_STRICT"))


def _devices(topo: Topology, backend: Backend) -> Tuple[Device, ...]:
    return _read_devices(
        _Reader(backend),
        {c: value.node for c, value in topo.cpus.items() if value.node is not None},
        topo.nodes_with_cpus,
        topo.online_nodes,
    )


def devices(kind: Optional[str] = None, *, backend: Optional[Backend] = None) -> List[Device]:
    """The PCI functions (bridges aside) in PCI order, with kind, node, local CPUs,
    kernel names and bus path; ``kind``: only those of one of DEVICE_KINDS.  The
    "gpu" ones are the GPUs gpus() describes."""
    if kind is not None and kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device kind {kind!r}; one of {', '.join(DEVICE_KINDS)}")
    backend = _b(backend)
    return [
        device
        for device in _devices(read_topology(backend=backend), backend)
        if kind in (None, device.kind)
    ]


# ===========================================================================
# numactl's node/CPU list grammar, read as libnuma reads it (the numactl front end in
# numa_utils_cli.py takes its options, exit statuses and --show/--hardware formats).
# Facts from numactl.c, libnuma.c and affinity.c (numactl 2.0.16-2.0.19).
# ===========================================================================


class NodeListError(ValueError):
    """A node/CPU list libnuma rejects (what parse_nodestring raises).  ``warn``: what
    libnuma prints about it on stderr (nothing for trailing characters; an empty line
    after its parser's own)."""

    def __init__(self, msg: str, warn: bool = True, blank: bool = False) -> None:
        super().__init__(msg)
        self.warn = ""
        if warn:
            self.warn = msg + "\n" * blank


# libnuma's device forms (netdev:eth0, ...): the numactl command line resolves them
# (numa_utils_cli._device_node); a library caller's node list never stats a file.
_DEVICE_FORMS = ("netdev", "block", "file", "pci", "ip")


_ULONG_MAX = (1 << 64) - 1


# strtoul(s, &end, 0) as libnuma calls it: blanks, a sign, then hex (0x), octal (0) or
# decimal digits (compiled on first use: re caches it).
_STRTOUL = r"[ \t\n\v\f\r]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)"


def _strtoul(s: str, i: int) -> Tuple[Optional[int], int]:
    match = re.compile(_STRTOUL).match(s, i)
    if not match:
        return None, i
    sign, digits = match.group(1), match.group(2)
    if digits[1:2] in ("x", "X"):
        value = int(digits, 16)
    elif digits[0] == "0":
        value = int(digits, 8)
    else:
        value = int(digits, 10)
    # C's unsigned long: ULONG_MAX past it (ERANGE), a minus sign wraps
    if value >> 64:
        value = _ULONG_MAX
    elif sign == "-":
        value = -value % (1 << 64)
    return value, match.end()


def parse_nodestring(
    text: str,
    *,
    cpus: bool = False,
    possible: bool = False,
    backend: Optional[Backend] = None,
    topology: Optional[Topology] = None,
    devices: Optional[Callable[[str, Backend], FrozenSet[int]]] = None,
) -> FrozenSet[int]:
    """numactl's node list (CPU list with ``cpus=True``) -> ids, read as libnuma's
    numa_parse_nodestring/numa_parse_cpustring do.

    ``1,3,5-7``; numbers in C's bases (``0x2`` hex, ``010`` octal); ``all`` (every
    allowed id); ``!LIST`` (all but); ``+LIST`` (the n-th allowed ids).  With
    ``devices`` (the numactl front end, where a person typed it, passes its resolver:
    the text of the form and the backend in, the device's nodes out) nodes also take
    ``netdev:DEV``, ``block:DEV``, ``file:PATH``, ``pci:[SEG:]BUS:DEV[.FN]``,
    ``ip:ADDR`` (the device's node from sysfs; ``ip:NAME`` asks the resolver);
    without it they are refused, naming the form, so that a variable such as
    NUMA_NODES never stats a file or waits on DNS.  Allowed ids are the cpuset's
    (Mems_allowed / Cpus_allowed); ``possible=True`` (numactl --all) allows every
    node or CPU the machine has.  An empty text is the empty set.  Raises ValueError
    with libnuma's reason."""
    backend = _b(backend)
    topo = _topology_or_read(topology, backend)
    if cpus:
        what = "cpu"
        top = max(topo.cpus, default=0) + 1
        conf = top  # numa_num_configured_cpus
    else:
        what = "node"
        top = max(topo.nodes, default=0) + 1
        conf = len(topo.nodes_with_memory)  # numa_num_configured_nodes (sic)
    if possible:
        allowed = frozenset(range(top))
    elif cpus:
        allowed = frozenset(cpu for cpu in topo.allowed_cpus if cpu < top)
    else:
        allowed = topo.allowed_mems
    order = sorted(allowed)
    s = text
    if not s:
        return frozenset()
    invert = s.startswith("!")
    relative = s.startswith("+", invert)
    i = invert + relative
    mask: Set[int] = set()

    def number(j: int, missing: str, out_of_range: str) -> Tuple[int, int]:
        """The id at s[j:] (the v-th allowed id for "+LIST") and where it ends;
        libnuma's refusals name the text (CPUs) or its "%ld" (nodes)."""
        value, end = _strtoul(s, j)
        if value is None:
            raise NodeListError(missing, blank=True)
        if relative:
            if value < len(order):
                value = order[value]
            else:
                value = _ULONG_MAX
        # numa_bitmask_isbitset() takes an unsigned int: ids are read modulo 2**32
        if value & 0xFFFFFFFF not in allowed:
            if cpus:
                shown: object = s[j:]
            elif value >> 63:
                shown = value - (1 << 64)  # as libnuma's "%ld" prints it
            else:
                shown = value
            raise NodeListError(f"{what} argument {shown} {out_of_range}", blank=True)
        return value, end

    while True:
        rest = s[i:]
        kind, colon, _ = rest.partition(":")
        if rest == "all" or (colon and kind in _DEVICE_FORMS and not cpus):
            if rest == "all":
                mask |= allowed
            elif devices is not None:
                mask |= devices(rest, backend)
            else:
                raise NodeListError(
                    f"the device form `{kind}:' is refused here: node lists "
                    "(0-1,4, !0, +0-1) and all only; netdev:, block:, file:, "
                    "pci: and ip: belong to the numactl command line"
                )
            i = len(s)
            break
        v, i = number(i, f"unparseable {what} description `{rest}'", "is out of range")
        mask.add(v & 0xFFFFFFFF)
        if s.startswith("-", i):
            v2, i = number(i + 1, f"missing {what} argument {s[i + 1 :]}", "out of range")
            lo = v & 0xFFFFFFFF
            hi = lo + v2 - v  # the loop's int wraps: ids lo..hi modulo 2**32
            mask.update(node for node in order if lo <= node <= hi or node <= hi - (1 << 32))
        if not s.startswith(",", i):
            break
        i += 1
    if i != len(s):
        raise NodeListError(f"trailing characters in {what} list {s!r}", warn=False)
    if invert:  # libnuma flips ids below the count, not the allowed set
        mask ^= set(range(conf))
    return frozenset(mask)


def _env_nodes(
    backend: Optional[Backend], topo: Optional[Topology] = None
) -> Optional[FrozenSet[int]]:
    """NUMA_NODES resolved on the machine (on ``topo`` when given), or None when unset."""
    text = _env("NUMA_NODES")
    if text is None:
        return None
    try:
        return parse_nodestring(text, backend=backend, topology=topo)
    except ValueError as err:
        raise ValueError(f"{_env_prefix}NUMA_NODES={_short(text)}: {_cut(str(err))}") from None


def _apply_policy(
    buf: Any,
    length: Optional[int],
    *,
    mode: Union[str, int],
    nodes: Optional[Iterable[int]],
    mode_flags: int = 0,
    move: bool = False,
    strict: Optional[bool] = None,
    enabled: bool = True,
    page_size: Optional[int] = None,
    backend: Optional[Backend] = None,
    count_resident: bool = True,
    known: Optional[Dict[str, Any]] = None,
) -> PolicyResult:
    """apply_policy.  SharedRegion passes ``count_resident=False``: a region it
    creates is fresh, and an attached one's pages were placed by the creator under
    the same shared policy; the mincore walk costs ~50 ms per 8 GiB of shmem.
    ``known``: a dict kept by a caller that applies many extents, so that the
    machine's memory nodes and NUMA_NODES are read once for all of them."""
    backend = _b(backend)
    strict_ = _strict_or_env(strict)
    m = _mode_of(mode)
    if known is None:
        known = {}
    if nodes is None and m not in (Mode.DEFAULT, Mode.LOCAL):
        if "env" not in known:
            known["env"] = _env_nodes(backend)
        nodes = known["env"]
    mname = _MODE_WORDS[m].result
    what = f"{mname} policy"
    start = size = 0  # no buffer: the calling thread's policy
    if buf is not None:
        start, size = _page_range(*buffer_range(buf, length), page_size or backend.page_size)
    explicit = nodes is not None
    if "memory" not in known:
        known["memory"] = _memory_nodes(backend)
    mem, allowed, default = known["memory"]
    want = default
    if nodes is not None:
        want = _node_ids(nodes)
    res = PolicyResult(False, mname, want, start, size)
    if not enabled:
        return res._replace(reason="disabled", hint=_HINTS["disabled"])
    if m in (Mode.DEFAULT, Mode.LOCAL):
        want = frozenset()
        res = res._replace(nodes=want)
    else:
        if not want:
            return _fallback(res, strict_, what, "EINVAL", errno.EINVAL)
        # Intersect with the cpuset first (the kernel would fail the whole call with
        # EINVAL only when nothing is left, silently dropping the rest).
        forbidden = (want & mem) - allowed
        dropped = want - (mem & allowed)
        if dropped and explicit and strict_:
            raise OSError(
                errno.EINVAL,
                f"{what}: {_nodes_txt(dropped)} not "
                "usable (no memory, or outside this process's cpuset: "
                f"Mems_allowed_list {format_cpulist(allowed)})",
            )
        want = want - dropped
        res = res._replace(nodes=want, dropped=dropped)
        if not want and forbidden:
            return _fallback(res, strict_, what, "cpuset", errno.EINVAL)
        if not want:
            return _fallback(res, strict_, what, "no-memory-node", errno.EINVAL)
        if not explicit and len(want) < 2 and m in (Mode.INTERLEAVE, Mode.WEIGHTED_INTERLEAVE):
            return res._replace(reason="single-node", hint=_HINTS["single-node"])
        if m == Mode.PREFERRED and len(want) > 1:
            raise ValueError("preferred takes one node; use preferred_many for several")
    if not backend.abi.supported:
        return _fallback(res, strict_, what, "unsupported-arch", errno.ENOSYS)
    try:
        if buf is None:
            set_mempolicy(m, want, mode_flags=mode_flags, backend=backend)
        elif size:
            mbind_flags = 0
            if move:
                mbind_flags = MbindFlag.MOVE
            mbind(start, size, m, want, mbind_flags, mode_flags=mode_flags, backend=backend)
    except NotLiveError as e:
        return _fallback(res, strict_, what, "not-live", e.errno)
    except OSError as e:
        err = e.errno or errno.EIO
        # Before 6.9 mode 6 is an invalid mode: never a silent plain interleave.
        if err == errno.EINVAL and m == Mode.WEIGHTED_INTERLEAVE:
            return _fallback(res, strict_, what, "no-weighted-interleave", err)
        return _fallback(res, strict_, what, _errno_reason(err), err)
    res = res._replace(applied=True)
    if size and not move and count_resident and m != Mode.DEFAULT:
        try:  # mincore counts base pages, also in a hugetlb mapping
            resident = backend.call("mincore", start, size) * backend.page_size
        except (OSError, NotImplementedError):
            resident = 0  # unknown: claim nothing
        if resident:
            res = res._replace(
                resident_unmoved=resident,
                reason="resident-unmoved",
                hint=_HINTS["resident-unmoved"],
            )
    return res


def apply_policy(
    buf: Any = None,
    length: Optional[int] = None,
    *,
    mode: Union[str, int],
    nodes: Optional[Iterable[int]] = None,
    mode_flags: int = 0,
    move: bool = False,
    strict: Optional[bool] = None,
    enabled: bool = True,
    page_size: Optional[int] = None,
    backend: Optional[Backend] = None,
) -> PolicyResult:
    """Apply ``mode`` over ``nodes`` to ``buf`` (or, with ``buf=None``, to the calling
    thread).  ``nodes=None``: default_memory_nodes() (the CPUs' DRAM tier in the cpuset).

    Returns a PolicyResult; on failure the memory stays usable under first-touch
    and the result says why.  ``strict=True`` raises OSError instead.  ``nodes=None``
    and ``strict=None`` take NUMA_NODES and NUMA_STRICT when they are set.  Pages of
    ``buf`` already in memory stay where they are unless ``move=True``; the result
    counts them (``resident_unmoved``, reason "resident-unmoved").
    """
    return _apply_policy(
        buf,
        length,
        mode=mode,
        nodes=nodes,
        mode_flags=mode_flags,
        move=move,
        strict=strict,
        enabled=enabled,
        page_size=page_size,
        backend=backend,
    )


def interleave(
    buf: Any, length: Optional[int] = None, nodes: Optional[Iterable[int]] = None, **kw: Any
) -> PolicyResult:
    """Interleave ``buf``'s pages over ``nodes`` (default: default_memory_nodes()).

    Call before the pages are touched (then prefault): pages already present stay.
    On a machine with one usable memory node this is a no-op (reason "single-node").
    """
    return apply_policy(buf, length, mode=Mode.INTERLEAVE, nodes=nodes, **kw)


def weighted_interleave(
    buf: Any,
    length: Optional[int] = None,
    nodes: Optional[Iterable[int]] = None,
    *,
    strict: Optional[bool] = None,
    fallback: Optional[str] = None,
    **kw: Any,
) -> PolicyResult:
    """Interleave ``buf``'s pages over ``nodes`` in proportion to the kernel's global
    weights (MPOL_WEIGHTED_INTERLEAVE, Linux 6.9+; see interleave_weights(),
    set_interleave_weights(), suggest_weights()).  On an older kernel the result is
    falsy with reason "no-weighted-interleave", unless ``fallback="interleave"``."""
    if fallback not in (None, "interleave"):
        raise ValueError(f"fallback must be None or 'interleave', not {fallback!r}")
    # NUMA_STRICT as for every call; a fallback asked for is not a failure.
    strict = _strict_or_env(strict)
    res = apply_policy(
        buf,
        length,
        mode=Mode.WEIGHTED_INTERLEAVE,
        nodes=nodes,
        strict=strict and fallback is None,
        **kw,
    )
    if not res and fallback and res.reason == "no-weighted-interleave":
        return apply_policy(buf, length, mode=Mode.INTERLEAVE, nodes=nodes, strict=strict, **kw)
    if not res and strict and res.reason not in ("disabled", "single-node"):
        return _fallback(res, True, "weighted_interleave policy")
    return res


def bind(buf: Any, nodes: Iterable[int], length: Optional[int] = None, **kw: Any) -> PolicyResult:
    """Strictly allocate ``buf``'s pages from ``nodes`` (MPOL_BIND)."""
    return apply_policy(buf, length, mode=Mode.BIND, nodes=nodes, **kw)


def prefer(buf: Any, node: int, length: Optional[int] = None, **kw: Any) -> PolicyResult:
    """Allocate ``buf``'s pages from ``node`` while it has room (MPOL_PREFERRED)."""
    return apply_policy(buf, length, mode=Mode.PREFERRED, nodes=[node], **kw)


def set_local(buf: Any = None, length: Optional[int] = None, **kw: Any) -> PolicyResult:
    """Allocate from the node of the CPU that faults the page (MPOL_LOCAL); with
    ``buf=None`` for the calling thread."""
    return apply_policy(buf, length, mode=Mode.LOCAL, **kw)


def set_thread_policy(
    mode: Union[str, int], nodes: Optional[Iterable[int]] = None, **kw: Any
) -> PolicyResult:
    """The calling thread's policy (set_mempolicy is per thread; threads created
    afterwards inherit it).  For a whole process, call it first thing in ``main``."""
    return apply_policy(None, mode=mode, nodes=nodes, **kw)


class thread_policy:
    """Context manager: run a block under a thread memory policy, then restore the
    previous one.  ``with thread_policy("bind", [1]): arr = np.ones(n)``."""

    def __init__(
        self, mode: Union[str, int], nodes: Optional[Iterable[int]] = None, **kw: Any
    ) -> None:
        self.mode, self.nodes, self.kw = mode, nodes, kw
        self.result: Optional[PolicyResult] = None
        self._old: Optional[Tuple[int, FrozenSet[int]]] = None

    def __enter__(self) -> PolicyResult:
        try:
            self._old = get_mempolicy(backend=self.kw.get("backend"))
        except OSError:
            self._old = None
        self.result = set_thread_policy(self.mode, self.nodes, **self.kw)
        return self.result

    def __exit__(self, *exc: Any) -> None:
        try:  # the mode with its flags: set_mempolicy's value
            if self.result and self._old is not None:
                set_mempolicy(*self._old, backend=self.kw.get("backend"))
        except OSError as err:
            _warn_once(
                "thread_policy-restore",
                "numa_utils: could not restore the thread memory policy: %s",
                err,
            )


def get_policy(buf: Any = None, *, backend: Optional[Backend] = None) -> PolicyInfo:
    """The policy of the page holding ``buf``'s first byte (or of the calling thread)."""
    addr = None  # the calling thread's policy
    if buf is not None:
        addr = _first_byte(buf)
    value, nodes = get_mempolicy(addr, backend=backend)
    return PolicyInfo(Mode(value & ~_MODE_FLAGS_MASK), value & _MODE_FLAGS_MASK, nodes)


# -- weighted interleave weights ---------------------------------------------------
# Global, not per call: /sys/kernel/mm/mempolicy/weighted_interleave/nodeN, 1-255.


def interleave_weights(*, backend: Optional[Backend] = None) -> Optional[Dict[int, int]]:
    """{node: weight} the kernel uses for weighted interleave; None on kernels without
    it (before 6.9)."""
    return _read_weights(_Reader(_b(backend)))[0]


def set_interleave_weights(
    weights: Mapping[int, int], *, backend: Optional[Backend] = None
) -> Dict[int, int]:
    """Write the global weights (needs root; every process using weighted interleave
    sees them).  Returns the previous weights of every node, so callers can restore.
    The whole mapping is checked before the first write, so a bad entry writes
    nothing.  Raises OSError: ENOTSUP without weighted interleave, EACCES without
    root, ENOENT for a node the kernel has no weight for; ValueError for a node id
    that is not an int (True, 1.0) or a weight outside 1-255."""
    backend = _b(backend)
    before = interleave_weights(backend=backend)
    if before is None:
        raise OSError(
            errno.ENOTSUP, f"this kernel has no weighted interleave (Linux 6.9+: {_WI_DIR})"
        )
    for node, weight in weights.items():
        # True == 1 and 1.0 == 1 pass the lookup below, then name file "nodeTrue".
        if isinstance(node, bool) or not isinstance(node, int):
            raise ValueError(f"interleave weight node id must be an int, not {node!r}")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 255:
            raise ValueError(f"interleave weight for node {node} must be 1-255, not {weight!r}")
        if node not in before:
            raise OSError(
                errno.ENOENT,
                f"no weighted-interleave weight for node {node}",
                f"{_WI_DIR}/node{node}",
            )
    for node, weight in sorted(weights.items()):
        backend.write_text(f"{_WI_DIR}/node{node}", f"{weight}\n")
    return before


def suggest_weights(
    topology: Optional[Topology] = None,
    initiator: Optional[int] = None,
    *,
    backend: Optional[Backend] = None,
) -> Dict[int, int]:
    """Weights from HMAT bandwidth the way the kernel's auto mode derives them
    (mm/mempolicy.c reduce_interleave_weights): each node's min(read, write)
    bandwidth scaled to 1..32 of the total, then divided by the weights' GCD.
    ``initiator``: only nodes whose best initiators include it.  {} without HMAT."""
    import math
    from functools import reduce

    topo = _topology_or_read(topology, backend)
    bw = {}
    for node in sorted(topo.nodes_with_memory):
        if node not in topo.nodes:
            continue
        access = topo.nodes[node].access
        if access is None:
            continue
        if initiator is not None and initiator not in access.initiators:
            continue
        measured = (access.read_bandwidth_mbps, access.write_bandwidth_mbps)
        known = [mbps for mbps in measured if mbps]
        if known:
            bw[node] = min(known)
    total = sum(bw.values())
    if not total:
        return {}
    out = {nid: max(32 * value // total, 1) for nid, value in bw.items()}
    divisor = reduce(math.gcd, out.values())
    return {nid: weight // divisor for nid, weight in out.items()}


# ===========================================================================
# numa_maps: parsing and placement checks.
# ===========================================================================

# -- numa_maps section -----------------------------------------------------------------
# Format: fs/proc/task_mmu.c show_numa_map() and mm/mempolicy.c mpol_to_str():
#   "<%08lx start> <policy>[ file=<path>| heap| stack][ huge][ anon=N][ dirty=N]
#    [ mapped=N][ mapmax=N][ swapcache=N][ active=N][ writeback=N][ N<nid>=N]...
#    [ kernelpagesize_kB=N]"
# The path goes through seq_path(..., "\n\t= "), so those four characters come out as
# octal escapes (\012 \011 \075 \040); d_path appends " (deleted)" -> "\040(deleted)".

_MAPS_COUNTERS = ("anon", "dirty", "mapped", "mapmax", "swapcache", "active", "writeback")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


class NumaMapsEntry(_Record):
    """One line of /proc/<pid>/numa_maps: one VMA, its policy and where its pages are.

    Page counts are in units of ``page_size_kb`` (the VMA's kernel page size; the
    system page size on kernels that do not print kernelpagesize_kB).  ``active`` is
    None when the kernel did not print it (it does so only when fewer pages than
    ``pages_total`` are active).  A NamedTuple: tens of thousands are built per read.
    """

    start: int
    policy: str  # as printed: "bind=static:0", "prefer (many):0,2"
    mode: str  # "default", "interleave", "prefer (many)" ...
    nodes: FrozenSet[int]  # the policy's nodes (empty for default/local)
    flags: Tuple[str, ...] = ()  # "static", "relative", "balancing"
    file: Optional[str] = None  # path, \040-style escapes decoded
    deleted: bool = False  # path ended in " (deleted)" (SysV, memfd, ...)
    heap: bool = False
    stack: bool = False
    huge: bool = False  # hugetlb VMA
    anon: int = 0
    dirty: int = 0
    mapped: int = 0
    mapmax: int = 0
    swapcache: int = 0
    active: Optional[int] = None
    writeback: int = 0
    pages: Mapping[int, int] = MappingProxyType({})  # node -> pages
    page_size_kb: int = 4
    other: Mapping[str, str] = MappingProxyType({})  # unknown key=value (newer kernels)

    @property
    def pages_total(self) -> int:
        return sum(self.pages.values())

    @property
    def bytes_per_node(self) -> Dict[int, int]:
        unit = self.page_size_kb * 1024
        return {node: count * unit for node, count in self.pages.items()}

    @property
    def kind(self) -> str:
        """ "file", "heap", "stack" or "anon" (what numastat -p groups by, huge aside)."""
        if self.file is not None:
            return "file"
        if self.heap:
            return "heap"
        if self.stack:
            return "stack"
        return "anon"

    def to_json(self) -> Dict[str, Any]:
        d = self._asdict()  # the fields in order, "kb" before "other"
        pages = sorted(self.pages.items())
        d.update(
            start=f"0x{self.start:x}",
            nodes=sorted(self.nodes),
            flags=list(self.flags),
            pages={str(node): c for node, c in pages},
            kb={str(node): c * self.page_size_kb for node, c in pages},
        )
        d["other"] = dict(d.pop("other"))
        return d


# The policies numa_maps prints: each mode's kernel word, and "unknown" (mpol_to_str).
_POLICY_NAMES = frozenset([words.kernel for words in _MODE_WORDS.values()] + ["unknown"])


def _parse_policy(text: str, line: str) -> Tuple[str, FrozenSet[int], Tuple[str, ...]]:
    """ "bind=relative|balancing:0-1" -> ("bind", {0, 1}, ("relative", "balancing"))."""
    name, _, nodelist = text.partition(":")
    mode, _, flagtext = name.partition("=")
    if mode not in _POLICY_NAMES:
        raise ValueError(f"invalid numa_maps line: unknown policy {_short(text)}: {_short(line)}")
    flags = tuple(flagtext.split("|")) if flagtext else ()
    if any(f not in _MAPS_FLAG_NAMES for f in flags):
        raise ValueError(f"invalid numa_maps line: policy flags {_short(text)}: {_short(line)}")
    try:
        nodes = _parse_nodelist(nodelist)
    except ValueError:
        # mpol_to_str writes into a 64-byte buffer: a long list is cut at 63
        # characters, possibly inside a number.  Keep the complete chunks.
        if len(text) < 63 or "," not in nodelist:
            raise ValueError(
                f"invalid numa_maps line: policy nodes {_short(text)}: {_short(line)}"
            ) from None
        nodes = _parse_nodelist(nodelist.rsplit(",", 1)[0])
    return mode, nodes, flags


_POLICIES: Dict[str, Tuple[str, FrozenSet[int], Tuple[str, ...]]] = {}  # a few per host


def _parse_maps_line(line: str, default_kb: int) -> NumaMapsEntry:
    """One line of numa_maps (see the format above)."""
    parts = line.split(" ")
    if not parts[0] or len(parts) < 2 or not parts[1]:
        raise ValueError(f"invalid numa_maps line: no address and policy: {_short(line)}")
    try:
        start = int(parts[0], 16)
    except ValueError:
        raise ValueError(f"invalid numa_maps line: bad start address: {_short(line)}") from None
    i, pol = 2, parts[1]
    # Two policy names contain a space (mpol_to_str's policy_modes[] table).
    if (
        (pol == "prefer" or pol == "weighted")
        and len(parts) > 2
        and parts[2].startswith("(many)" if pol == "prefer" else "interleave")
    ):
        i, pol = 3, pol + " " + parts[2]
    parsed = _POLICIES.get(pol)
    if parsed is None:
        if len(_POLICIES) > 256:
            _POLICIES.clear()
        parsed = _POLICIES[pol] = _parse_policy(pol, line)
    pages: Dict[int, int] = {}
    kw: Dict[str, Any] = {"page_size_kb": default_kb}  # fields the line sets
    for tok in parts[i:]:
        key, eq, val = tok.partition("=")
        if not eq:
            if tok in ("heap", "stack", "huge") or (tok[:6] == "stack:" and tok[6:].isdigit()):
                kw[tok[:5]] = True  # "stack:<tid>": kernels before 3.x
            elif tok:
                raise ValueError(f"invalid numa_maps line: token {_short(tok)}: {_short(line)}")
        elif key[:1] == "N" and key[1:].isdigit() and val.isdigit():
            pages[int(key[1:])] = int(val)
        elif key == "file":
            path = _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), val) if "\\" in val else val
            kw["deleted"] = path.endswith(" (deleted)")
            kw["file"] = path[:-10] if kw["deleted"] else path
        elif not key:
            raise ValueError(f"invalid numa_maps line: token {_short(tok)}: {_short(line)}")
        elif not val.isdigit():
            raise ValueError(f"invalid numa_maps line: value of {key!r}: {_short(line)}")
        elif key == "kernelpagesize_kB":
            kw["page_size_kb"] = int(val)
        elif key in _MAPS_COUNTERS:
            kw[key] = int(val)
        else:  # a counter from a newer kernel: keep, do not fail
            kw.setdefault("other", {})[key] = val
    return NumaMapsEntry(start, pol, *parsed, pages=pages, **kw)


_MAPS_LINE_MAX = 1 << 20  # a line holds one path (<= 4 KiB, escaped x4) + node counts


def _whole_lines(text: Union[str, Iterable[str]]) -> Iterator[str]:
    """Chunks of whole lines, each ending in "\\n", from a text or its pieces."""
    if isinstance(text, str):
        text = (text,)
    carry = ""
    for piece in text:
        piece = carry + piece
        cut = piece.rfind("\n") + 1
        carry = piece[cut:]
        if len(carry) > _MAPS_LINE_MAX:
            raise ValueError(
                f"invalid numa_maps line: over {_MAPS_LINE_MAX} characters: {carry[:80]!r}..."
            )
        if cut:
            yield piece[:cut]
    if carry:
        yield carry + "\n"


def _system_page_kb() -> int:
    return os.sysconf("SC_PAGE_SIZE") // 1024


def iter_numa_maps(
    text: Union[str, Iterable[str]], *, page_size_kb: int = 0
) -> Iterator[NumaMapsEntry]:
    """``parse_numa_maps`` one entry at a time, for huge inputs: ``text`` is the whole
    text or an iterable of chunks cut anywhere (a file read in blocks)."""
    default_kb = page_size_kb or _system_page_kb()
    for chunk in _whole_lines(text):
        for line in chunk.split("\n"):
            if line:
                yield _parse_maps_line(line, default_kb)


def parse_numa_maps(text: str, *, page_size_kb: int = 0) -> List[NumaMapsEntry]:
    """Parse /proc/<pid>/numa_maps text into one NumaMapsEntry per VMA (one pass).

    ``page_size_kb`` is the unit for lines without kernelpagesize_kB (kernels before
    3.19); default: this system's page size.  A malformed line raises ValueError
    naming it.  Lines end at "\\n" only: the kernel does not escape "\\r", "\\f" or
    U+2028 in file names, where ``str.splitlines`` would cut.
    """
    return list(iter_numa_maps(text, page_size_kb=page_size_kb))


def _maps_path(pid: Union[int, str]) -> str:
    if isinstance(pid, bool) or not (pid == "self" or str(pid).isdigit()):
        raise ValueError(f"invalid pid {pid!r}")
    return f"/proc/{pid}/numa_maps"


_MOVE_PAGES_LIMIT = 1 << 16  # pages: above this, one numa_maps read is cheaper


def _placement_move_pages(backend: Backend, pid: int, addr: int, size: int) -> Dict[int, int]:
    """Bytes per node of [addr, addr+size) from move_pages queries, in batches."""
    import array
    import collections

    page = backend.page_size
    end = addr + max(size, 1)
    swap = backend.abi.byteorder != sys.byteorder
    seen: collections.Counter[int] = collections.Counter()
    step = page * 16384  # pages per call
    typecode = "I"  # the ABI's pointers
    if _pointer_bits(backend.abi) == 64:
        typecode = "Q"
    first_page = addr - addr % page
    for lo in range(first_page, end, step):
        ptrs = array.array(typecode, range(lo, min(end, lo + step), page))
        status = array.array("i", bytes(4 * len(ptrs)))
        if swap:
            ptrs.byteswap()
        backend.call(
            "syscall",
            backend.abi.number("move_pages"),
            pid,
            len(ptrs),
            ptrs.buffer_info()[0],
            0,
            status.buffer_info()[0],
            0,
        )
        if swap:
            status.byteswap()
        seen.update(status)
    return {n: c * page for n, c in sorted(seen.items()) if n >= 0}


def _page_kb(backend: Backend) -> int:
    return max(backend.page_size // 1024, 1)


def _line_at(text: str, addr: int) -> Tuple[int, int]:
    """(start, end) offsets of the last line of ``text`` whose VMA starts at or before
    ``addr`` (a binary search: lines are sorted by address); (0, 0) when none does."""
    lo, hi, found = 0, len(text), (0, 0)
    while lo < hi:
        p = text.rfind("\n", 0, (lo + hi) // 2) + 1  # a line start, >= lo
        nl = text.find("\n", p) % (len(text) + 1)  # -1: the text's end
        if int(text[p : text.index(" ", p)], 16) <= addr:
            found, lo = (p, nl), nl + 1
        else:
            hi = p
    return found


def _entries_bytes(entries: Iterable[NumaMapsEntry]) -> Dict[int, int]:
    out: Dict[int, int] = {}
    for entry in entries:
        for node, value in entry.bytes_per_node.items():
            out[node] = out.get(node, 0) + value
    return out


def _placement_in(text: str, start: int, end: int, default_kb: int) -> Dict[int, int]:
    """Bytes per node of the VMAs of address-sorted numa_maps ``text`` that hold
    [start, end): the one holding ``start`` and those starting before ``end``."""
    return _entries_bytes(
        iter_numa_maps(
            text[_line_at(text, start)[0] : _line_at(text, end - 1)[1]], page_size_kb=default_kb
        )
    )


def placement(
    buf: Any,
    length: Optional[int] = None,
    *,
    pid: Union[int, str] = "self",
    method: str = "auto",
    backend: Optional[Backend] = None,
) -> Dict[int, int]:
    """Bytes per node of the pages of ``buf`` that are faulted in.

    ``method="numa_maps"`` reads /proc/<pid>/numa_maps and counts whole VMAs: those
    starting inside the range plus the one holding its first byte.  A region from
    SharedRegion or mmap is its own VMA(s), so this is exact there; a buffer carved
    out of a larger mapping (malloc) also counts its neighbours.  Only the lines of
    that range are parsed (a binary search over the address-sorted lines).
    ``method="move_pages"`` asks the kernel where each page of exactly this range
    is (one query per page, no file to generate: the cost follows the range, not
    the process's VMA count).  ``"auto"`` (default) uses move_pages for ranges up to
    64 Ki pages and numa_maps beyond, or wherever move_pages is denied (Docker's
    default seccomp profile) or unavailable.
    """
    if method not in ("auto", "numa_maps", "move_pages"):
        raise ValueError(f"unknown placement method {method!r}")
    backend = _b(backend)
    addr, size = buffer_range(buf, length)
    path = _maps_path(pid)
    npages = _page_range(addr, size, backend.page_size)[1] // backend.page_size
    if method == "move_pages" or (
        method == "auto" and npages <= _MOVE_PAGES_LIMIT and backend.abi.supported
    ):
        target = 0  # move_pages' pid 0: this process
        if pid != "self":
            target = int(pid)
        try:
            return _placement_move_pages(backend, target, addr, size)
        except OSError:
            if method == "move_pages":
                raise
    return _placement_in(backend.read_text(path), addr, addr + max(size, 1), _page_kb(backend))


# -- the identity record ----------------------------------------------------------------
# Every region ends in a record of what it is: {"key", "kind", "size", "page_size",
# "created", "uid", "pid", "start", "boot", "pidns"}, JSON, then _RECORD_END (magic,
# format, JSON length, CRC-32) in its last bytes.  It lives inside the segment or file,
# after the `size` bytes of data (which start at offset 0, where engines that attach
# the key themselves expect them), in its room: _RECORD_ROOM rounded up to a page (a
# huge-page region's: see record_segment_key), mapped at address + size in every process.  The
# room's first _RECORD_SLOT bytes are kept for the region's last use; the record ends
# the room.  The room has a policy of its own (_room_policy), set before its page is
# touched, so it is a VMA and a numa_maps line of its own, on a node the data's policy
# allows.  So the record cannot outlive, or be swapped apart from, its region, and
# only who can write the region can write it.  Readers ignore fields they do not know
# (more can be added within the room) and check every field they act on against the
# kernel's own facts: the size mapped (_record_read), the mapping's page size
# (_record_page_check), the node ids (record_layout).
#
# The creator's time namespace is in the record too ("timens", /proc/self/ns/time).
# The record room's first 64 bytes (at address + size, right after the data) are the
# last-use slot (_SLOT, its code before SharedRegion): who used the region last, and
# when.  Create writes it once the region is the only one of its name (until then a
# region has none), and every attach and close of numa_utils writes it; cleanup's look
# never does.  cleanup judges idleness from it:
# not from shm_atime/shm_dtime, which its own read-only attach resets, nor from when
# the region was made.  Little-endian, 64 bytes:
#    0  8s   magic b"numa_use"
#    8  I    format (1)
#   12  I    the last user's pid, in its PID namespace
#   16  d    when it attached or closed, seconds since the epoch
#   24  Q    its PID namespace: the number in /proc/self/ns/pid's "pid:[N]" (0: unknown)
#   32  Q    its time namespace, from /proc/self/ns/time (0: unknown, or no such namespaces)
#   40  I    CRC-32 of its kernel's boot id (0: unknown)
#   44  16s  its start time as the kernel call "pid_start" reads it: ASCII, NUL-padded
#   60  I    CRC-32 of bytes 0-59: a torn or damaged slot proves nothing
_RECORD_END = struct.Struct("<8sIII")


_RECORD_MAGIC = b"numa_utl"


_RECORD_ROOM = 16 << 10


_RECORD_SLOT = 64


# The most JSON a record may hold: its room less the slot and the trailer.
_RECORD_MAX = _RECORD_ROOM - _RECORD_SLOT - _RECORD_END.size


_RECORD_FORMAT = 1


def _record_parse(raw: bytes, bad: str) -> Any:
    """The record's JSON, parsed; a ValueError when it is not JSON, or too deeply
    nested for the parser (json recurses per bracket: thousands of them would
    raise RecursionError, which is damage, not a crash)."""
    import json

    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:
        raise ValueError(f"{bad} (not JSON)") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"{bad} (nested too deeply)") from None


def _room_size(page: int) -> int:
    """The bytes a region maps after its data for the record: whole pages."""
    return -(-_RECORD_ROOM // page) * page


_PAGE_MIN = 4096  # the smallest page Linux has


_PAGE_MAX = 16 << 30  # the largest huge page (16 GiB on ppc64)


def _page_size_ok(page: Any) -> bool:
    """Whether ``page`` is a page size Linux can have: a power of two from 4 KiB to
    16 GiB."""
    if type(page) is not int:
        return False
    if page < _PAGE_MIN or page > _PAGE_MAX:
        return False
    return page & (page - 1) == 0


def _record_fields_ok(rec: Any, seg: int) -> bool:
    """Whether a record's fields have their types, and its size and page size are
    what the ``seg`` bytes mapped can hold: the data in whole pages, then exactly the
    room.  JSON gives exact types: type() checks leave out bools."""
    if not isinstance(rec, dict):
        return False
    if type(rec.get("key")) not in (str, int):
        return False
    if rec.get("kind") not in ("sysv", "posix"):
        return False
    if "layout" in rec and type(rec["layout"]) is not str:
        return False
    size = rec.get("size", 0)
    page = rec.get("page_size", 0)
    if type(size) is not int or size <= 0:
        return False
    if not _page_size_ok(page):
        return False
    if size % page:
        return False
    if "data_key" in rec:  # a record segment: base pages, less than one of the data's
        return type(rec["data_key"]) is int and _RECORD_ROOM <= seg < page
    return size + _room_size(page) == seg


# -- end of numa_maps section ----------------------------------------------------------


# -- regions seen from outside: identity records read in place ---------------------------
# `maps` and `status` read a region's record without a mapping, an attach or a lock:
# cleanup judges a SysV segment by its last attach (shm_lpid, shm_atime) and a file
# by its locks, so a look must not look like a use.


def read_identity_record(
    read: Callable[[int, int], bytes], seg: int, what: str
) -> Optional[Dict[str, Any]]:
    """The identity record of a ``seg``-byte region whose bytes ``read(offset, n)``
    gives: a /dev/shm file's (os.pread), another process's memory (/proc/PID/mem).
    A dict: the region's name ("key"), "size", "page_size", its "layout" when it has
    more than one extent (record_layout reads it), who made it.  None when the bytes
    end in no record (not made by SharedRegion.create, or still being made);
    ValueError when the record is damaged.  Only the record's bytes are read: no
    mapping, no attach."""
    import zlib

    end = seg - _RECORD_END.size
    if end < 0:  # smaller than a record's end
        return None
    trailer = read(end, _RECORD_END.size)
    if len(trailer) != _RECORD_END.size or trailer[:8] != _RECORD_MAGIC:
        return None
    _, fmt, n, crc = _RECORD_END.unpack(trailer)
    bad = f"{what}: damaged identity record"
    if fmt != _RECORD_FORMAT:
        raise ValueError(
            f"{what}: identity record format {fmt}, not {_RECORD_FORMAT}: "
            "made by another numa_utils version"
        )
    raw = b""  # a length past the region or _RECORD_MAX: damaged
    if n <= min(end, _RECORD_MAX):
        raw = read(end - n, n)
    if len(raw) != n:
        raise ValueError(f"{bad} (length {n} in {seg} bytes)")
    if zlib.crc32(raw) != crc:
        raise ValueError(f"{bad} (checksum mismatch)")
    rec: Dict[str, Any] = _record_parse(raw, bad)
    if not _record_fields_ok(rec, seg):
        raise ValueError(f"{bad} (fields)")
    return rec


def _record_read(addr: int, seg: int, what: str) -> Optional[Dict[str, Any]]:
    """The identity record of the ``seg`` bytes mapped at ``addr`` (read_identity_record)."""
    return read_identity_record(lambda offset, n: ctypes.string_at(addr + offset, n), seg, what)


def _file_record(path: str) -> Tuple[int, Optional[Dict[str, Any]]]:
    """(size, identity record) of a /dev/shm file, read: no lock, no mapping."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        return size, read_identity_record(lambda off, n: os.pread(fd, n, off), size, path)
    finally:
        os.close(fd)


_LAYOUT_IDS_MAX = 4 * MAX_NODES  # node ids a record's layout text may spell out


def _layout_ids(text: str) -> int:
    """At least as many node ids as the layout ``text`` names, counted in its text
    (a range "a-b" as b - a + 1): Layout.parse builds a set of each list, so a
    16 KiB record of "0-1023/0-1023/..." would cost far more to parse than to read."""
    count = 0
    for number in re.finditer(r"([0-9]+)(-[0-9]+)?", text):
        count += 1
        if number.group(2):
            count += int(number.group(2)[1:]) - int(number.group(1))
    return count


_SIZE_MAX = (1 << 64) - 1  # the largest size_t of any ABI; Abi.bits narrows it


def parse_size(text: str) -> int:
    """Bytes in a size as people and numactl write it: "4G", "512M", "1.5g", "2MiB",
    "1048576" (binary units; ValueError for anything else or past 2**64-1)."""
    match = re.match(r"^\s*([0-9]{1,20}(?:\.[0-9]{1,20})?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*$", text)
    if not match:
        raise ValueError(f"invalid size {_short(text)} (e.g. 4G, 512M, 1048576)")
    unit = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[match.group(2).lower()]
    whole, _, frac = match.group(1).partition(".")
    n: int = (int(whole) << unit) + (int(frac or 0) << unit) // 10 ** len(frac)
    if n > _SIZE_MAX:
        raise ValueError(f"invalid size {_short(text)}: more than 2**64-1 bytes")
    return n


def format_size(n: int) -> str:
    """The shortest exact form parse_size reads back: 2M, 1536K, 4097."""
    for shift, unit in ((40, "T"), (30, "G"), (20, "M"), (10, "K")):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


# The most bytes a layout covers: what len() can count (2**63-1 on 64-bit machines; a
# mapping is at most 2**57 bytes) and parse_size reads back.
_LAYOUT_MAX = min(sys.maxsize, _SIZE_MAX)


def _is_size(value: Any) -> bool:
    """Whether ``value`` is a length a layout can hold: an int from 1 to _LAYOUT_MAX."""
    return type(value) is int and 0 < value <= _LAYOUT_MAX


def _is_node_id(value: Any) -> bool:
    """Whether ``value`` is a node id a kernel can have: an int below MAX_NODES."""
    return type(value) is int and 0 <= value < MAX_NODES


class Extent(_Record):
    offset: int
    length: int
    policy: str  # a mode's _MODE_WORDS word
    nodes: FrozenSet[int]  # empty: none (default, local) or default_memory_nodes()


class Layout:
    """Where each extent of a region lives: an immutable, ordered list of extents.

    Build one with ``parts``, ``blocks`` or ``extents``, or ``Layout.parse(text)``
    (``str(layout)`` gives that text back).  A layout from ``parts``/``blocks``
    without ``size`` takes the size of the region it is given to.
    """

    __slots__ = ("_kind", "_entries", "_size", "_cache")

    def __init__(
        self, kind: str, entries: Iterable[Tuple[Any, Any, Any]], size: Optional[int] = None
    ) -> None:
        """``entries``: (length, policy, nodes) each; a length of 0 in a parts rule
        is the region size over the number of entries, in a blocks rule each is the
        block size."""
        if kind not in ("parts", "blocks", "extents"):
            raise ValueError(f"layout: kind {kind!r} is not parts, blocks or extents")
        self._kind, self._cache = kind, None  # type: str, Optional[Tuple[Extent, ...]]
        items = []
        for length, pol, nodes in entries:
            w = _mode_of(str(pol))
            if isinstance(nodes, int):
                ids = frozenset([nodes])
            else:
                ids = frozenset(nodes or ())
            if not all(_is_node_id(node) for node in ids):
                raise ValueError(f"layout: invalid node list {nodes!r}: ids 0 to {MAX_NODES - 1}")
            if (w in (Mode.DEFAULT, Mode.LOCAL)) == bool(ids) and (ids or kind != "extents"):
                if ids:
                    raise ValueError(f"layout: policy {_MODE_WORDS[w].word} takes no nodes")
                raise ValueError(f"layout: policy {_MODE_WORDS[w].word} needs nodes")
            if w == Mode.PREFERRED and len(ids) != 1:
                raise ValueError("layout: prefer takes one node (prefer-many: several)")
            if kind == "blocks" and not _is_size(length):
                raise ValueError(
                    f"layout: block size {length!r} is not an int from 1 to {_LAYOUT_MAX}"
                )
            if kind == "extents" and not _is_size(length):
                raise ValueError(
                    f"layout: extent length {length!r} is not an int from 1 to {_LAYOUT_MAX}"
                )
            items.append((length, _MODE_WORDS[w].word, ids))
        if not items:
            raise ValueError("layout: no extents")
        if kind == "parts" and any(i[0] for i in items):
            raise ValueError("layout: parts take their length from the size (give 0)")
        if kind == "blocks" and len({i[0] for i in items}) > 1:
            raise ValueError("layout: blocks are all one size")
        self._entries = tuple(items)
        if kind == "extents":
            size = sum(i[0] for i in items)
        if size is not None and not _is_size(size):
            raise ValueError(f"layout: size {size!r} is not an int from 1 to {_LAYOUT_MAX}")
        if kind == "parts" and size is not None and size % len(items):
            raise ValueError(
                f"layout: {size} bytes do not split into {len(items)} equal parts",
            )
        self._size = size

    @classmethod
    def parts(
        cls,
        nodes: Sequence[Union[int, Iterable[int]]],
        policy: str = "bind",
        *,
        size: Optional[int] = None,
    ) -> Layout:
        """Equal contiguous parts, one per entry of ``nodes`` (a node, or several for
        interleave/prefer-many): ``[0, 0, 0, 0, 1, 1, 1, 1]`` is one part per TP rank."""
        return cls("parts", [(0, policy, node) for node in nodes], size)

    @classmethod
    def blocks(
        cls,
        block_size: int,
        nodes: Sequence[Union[int, Iterable[int]]],
        policy: str = "bind",
        *,
        size: Optional[int] = None,
    ) -> Layout:
        """Blocks of ``block_size`` bytes, block i on ``nodes[i % len(nodes)]``."""
        return cls("blocks", [(block_size, policy, node) for node in nodes], size)

    @classmethod
    def extents(cls, items: Iterable[Tuple[int, str, Union[int, Iterable[int], None]]]) -> Layout:
        """``[(length, policy, nodes), ...]``, contiguous from offset 0."""
        return cls("extents", items)

    @classmethod
    def parse(cls, text: str) -> Layout:
        """The layout ``str()`` wrote (grammar: see the comment above Layout)."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("layout: empty text")
        body, at, size = text.strip().partition("@")
        head = body.partition(":")[0]
        try:
            if head in ("parts", "blocks"):
                maxsplit = 2  # parts:POLICY:NODES
                if head == "blocks":
                    maxsplit = 3  # blocks:SIZE:POLICY:NODES
                fields = body.split(":", maxsplit)[1:]
                block = 0
                if head == "blocks" and len(fields) == 3:
                    block = parse_size(fields.pop(0))
                if len(fields) != 2:
                    raise ValueError(f"expected {head}:POLICY:NODES[/NODES...]")
                entries = [(block, fields[0], _parse_nodelist(e)) for e in fields[1].split("/")]
                whole = None  # without @SIZE: the size of the region it is given to
                if at:
                    whole = parse_size(size)
                return cls(head, entries, whole)
            if at:
                raise ValueError("@SIZE follows only parts: and blocks:")
            ext = []
            for item in body.split(";"):
                fields = item.strip().split(":")
                if len(fields) not in (2, 3):
                    raise ValueError(f"extent {item!r}: expected SIZE:POLICY[:NODES]")
                nodelist = ""  # SIZE:POLICY names no nodes
                if len(fields) == 3:
                    nodelist = fields[2]
                ext.append((parse_size(fields[0]), fields[1], _parse_nodelist(nodelist)))
            return cls("extents", ext)
        except ValueError as e:
            msg = str(e).replace("layout: ", "")
            raise ValueError(f"layout {_short(text)}: {msg}") from None

    def __str__(self) -> str:
        es = self._entries
        if self._kind == "extents":
            texts = []
            for length, policy, ids in es:
                if ids:
                    texts.append(f"{format_size(length)}:{policy}:{format_cpulist(ids)}")
                else:
                    texts.append(f"{format_size(length)}:{policy}")
            return ";".join(texts)
        rule = f"{es[0][1]}:" + "/".join(format_cpulist(e[2]) for e in es)
        if self._kind == "blocks":
            rule = f"blocks:{format_size(es[0][0])}:{rule}"
        else:
            rule = f"parts:{rule}"
        if self._size is not None:
            rule += f"@{format_size(self._size)}"
        return rule

    def __repr__(self) -> str:
        return f"Layout.parse({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    @property
    def size(self) -> Optional[int]:
        """Bytes covered; None for a rule not bound to a region yet."""
        return self._size

    @property
    def nodes(self) -> FrozenSet[int]:
        """Every node an extent names."""
        return frozenset().union(*(i[2] for i in self._entries))

    def bound(self, size: int, page: int, nodes: Optional[FrozenSet[int]] = None) -> Layout:
        """This layout for a region of ``size`` bytes of ``page``-byte pages; one
        ValueError says what does not fit (alignment, size, unknown nodes)."""
        if self._size is not None and self._size > size:
            raise ValueError(
                f"layout {self} covers {self._size} bytes of a {size}-byte region: past the size"
            )
        if self._size is not None and self._size < size:
            raise ValueError(
                f"layout {self} covers {self._size} bytes of a {size}-byte region: "
                "the rest would have no policy"
            )
        k, unit = len(self._entries), format_size(page)
        if self._kind == "parts" and size % (k * page):
            raise ValueError(
                f"layout {self}: {size} bytes do not split into {k} equal "
                f"parts of whole {unit} pages"
            )
        lay = self
        if self._size is None:  # a rule: bound to this region's size
            lay = Layout(self._kind, self._entries, size)
        if any(i[0] % page for i in self._entries):
            raise ValueError(f"layout {lay}: extents must be whole {unit} pages")
        if nodes is not None and self.nodes - nodes:
            raise ValueError(
                f"layout {lay}: no memory node {format_cpulist(self.nodes - nodes)}"
                f" on this machine (memory nodes: {format_cpulist(nodes) or '-'})"
            )
        return lay

    def _step(self) -> int:
        """The length of every extent of a rule but perhaps the last: the block size,
        or the size over the number of parts.  0 for a list of extents."""
        size, es = self._bound_size(), self._entries
        if self._kind == "blocks":
            return int(es[0][0])
        if self._kind == "parts":
            return size // len(es)
        return 0

    def _bound_size(self) -> int:
        if self._size is None:
            raise ValueError(f"layout {self} is not bound to a size yet")
        return self._size

    def __len__(self) -> int:
        step = self._step()
        if step:
            return -(-self._bound_size() // step)
        return len(self._entries)

    def __getitem__(self, i: int) -> Extent:
        """Extent ``i`` (negative: from the end), computed without listing the others."""
        step = self._step()
        if not step or not isinstance(i, int):
            return self._all()[i]
        if not -len(self) <= i < len(self):
            raise IndexError(f"extent {i} of a layout of {len(self)}")
        return self._rule_extent(i % len(self), step)

    def _rule_extent(self, number: int, step: int) -> Extent:
        """Extent ``number`` of a parts or blocks rule whose extents are ``step`` long."""
        _, pol, ids = self._entries[number % len(self._entries)]
        offset = number * step
        return Extent(
            offset,
            min(step, self._bound_size() - offset),
            pol,
            ids,
        )

    def __iter__(self) -> Iterator[Extent]:
        return iter(self._all())

    def _all(self) -> Tuple[Extent, ...]:
        """The entries taken in turn, each its length (a part: an equal share), up to
        the size: once for extents and parts, round-robin for blocks."""
        if self._cache is None:
            size, step = self._bound_size(), self._step()
            out: List[Extent] = []
            off = 0
            while off < size:
                n, pol, ids = self._entries[len(out) % len(self._entries)]
                n = n or step
                out.append(Extent(off, min(n, size - off), pol, ids))
                off += n
            self._cache = tuple(out)
        return self._cache

    def index(self, offset: int) -> int:
        """The number of the extent holding byte ``offset``: arithmetic for a rule, a
        binary search for a list of extents (neither lists a rule's extents)."""
        if not 0 <= offset < self._bound_size():
            raise IndexError(f"offset {offset} is outside the layout's {self._size} bytes")
        if self._step():
            return offset // self._step()
        import bisect

        # Extents are tuples in offset order: those before (offset + 1,) start <= offset.
        return bisect.bisect_left(self._all(), (offset + 1,)) - 1

    @property
    def vmas(self) -> int:
        """How many VMAs (memory mappings) the data of a region with this layout takes:
        one per run of neighbouring extents with one policy over one node set (the
        kernel merges neighbours whose policies match), counted without listing the
        extents.  A process may hold vm.max_map_count of them (65,530 by default)."""
        keys = [(policy, nodes) for _, policy, nodes in self._entries]
        count = len(self)
        changes = 0
        for j, key in enumerate(keys):
            if key == keys[j - 1]:  # j = 0 meets the last entry: a blocks rule's wrap
                continue
            # extents i = 1 .. count - 1 whose entry is j (i % len(keys) == j)
            if j == 0:
                changes += (count - 1) // len(keys)
            elif j <= count - 1:
                changes += (count - 1 - j) // len(keys) + 1
        return changes + 1

    def _extents_before(self, offset: int) -> int:
        """How many extents start below ``offset`` (at the size: all of them), counted
        without building a rule's (index): a blocks layout of a few GiB has millions,
        and `maps` reads layouts from records anyone who can write a region wrote."""
        if offset <= 0:
            return 0
        if offset >= self._bound_size():
            return len(self)
        return self.index(offset - 1) + 1

    def location(self) -> str:
        """Mooncake-style: one "cpu:NODES" per extent, as "OFFSET+LENGTH@cpu:NODES"
        joined by ";" (hex offsets), for a transfer engine picking a local NIC."""
        return ";".join(
            f"{e.offset:x}+{e.length:x}@cpu:{format_cpulist(e.nodes) or '*'}" for e in self._all()
        )


def record_layout(rec: Mapping[str, Any]) -> Layout:
    """The layout a record publishes (one default extent when it names none); a
    ValueError when it names a node no kernel has (Layout.parse refuses MAX_NODES and
    above), or more node ids than a layout can use (what reading it costs stays
    bounded, for an attach and for `maps` alike)."""
    if "layout" not in rec:
        return Layout.extents([(rec["size"], "default", ())])
    text = rec["layout"]
    if isinstance(text, str) and _layout_ids(text) > _LAYOUT_IDS_MAX:
        raise ValueError(f"layout names over {_LAYOUT_IDS_MAX} node ids")
    return Layout.parse(text).bound(rec["size"], rec["page_size"])


# Keys of our SysV segments: "N" (0x4e) in the top 8 bits, 24 bits of a CRC of the
# region's name below.  24 bits still collide (among ~4,800 names more likely than
# not), so a name has _SYSV_PROBES keys, tried in order; which name a segment holds
# is in its identity record, which every attacher checks.  An int key is used as
# given.  POSIX regions are /dev/shm/numa_utils-<name>.
SYSV_KEY_PREFIX, SYSV_KEY_MASK = 0x4E000000, 0xFF000000


POSIX_PREFIX = "numa_utils-"


def _status_regions(report: Dict[str, Any], backend: Backend) -> None:
    """``report["regions"]``: this user's regions on the live system, SysV segments of
    our key family and /dev/shm/numa_utils-* files, with the text part.  A SysV
    layout is not read here (only an attach reads it, and a status scraped every few
    seconds would keep a stale segment from cleanup forever): `maps PID` and `cleanup`
    show it."""
    rows: List[Dict[str, Any]] = []
    report["regions"] = rows
    if not backend.is_live:
        return
    euid = os.geteuid()
    sysvipc = _read_optional(backend, "/proc/sysvipc/shm") or ""
    for st in parse_sysvipc_shm(sysvipc):
        if st.uid == euid and st.key & SYSV_KEY_MASK == SYSV_KEY_PREFIX:
            rows.append(
                {
                    "name": None,
                    "kind": "sysv",
                    "key": f"0x{st.key:08x}",
                    "size": st.size,
                    "attached": st.nattch,
                    "layout": None,
                }
            )
    locks = [
        ln.split()
        for ln in (_read_optional(backend, "/proc/locks") or "").splitlines()
        if "->" not in ln
    ]  # every attacher of a file holds a shared flock
    for name in sorted(n for n in backend.listdir("/dev/shm") if n.startswith(POSIX_PREFIX)):
        path = f"/dev/shm/{name}"
        row: Dict[str, Any] = {
            "name": name[len(POSIX_PREFIX) :],
            "kind": "posix",
            "key": path,
            "size": None,
            "attached": None,
            "layout": None,
        }
        try:
            st_ = os.stat(path, follow_symlinks=False)
            if st_.st_uid != euid:
                continue
            major = os.major(st_.st_dev)
            minor = os.minor(st_.st_dev)
            ino = f"{major:02x}:{minor:02x}:{st_.st_ino}"
            row["attached"] = sum(f[1:2] == ["FLOCK"] and ino in f for f in locks)
            row["size"], rec = _file_record(path)
            if rec is not None:
                row.update(name=rec["key"], size=rec["size"], layout=str(record_layout(rec)))
        except (OSError, ValueError) as err:
            row["error"] = str(err)
        rows.append(row)
    if rows:
        lines = ["", "REGIONS (this user's numa_utils shared memory)"]
        for region in rows:
            size = "?"
            if region["size"] is not None:
                size = format_size(region["size"])
            attached = "?"
            if region["attached"] is not None:
                attached = region["attached"]
            layout = region["layout"] or region.get("error")
            if not layout:
                layout = "layout: `maps PID` or `cleanup` shows it"
            label = region["name"] or region["key"]
            line = f"  {region['kind']:<5}  {label:<24}  {size:>8}  {attached} attached  {layout}"
            lines.append(printable(line))
        report.setdefault("extra_text", []).extend(lines)


# ===========================================================================
# Shared-memory regions and prefault.
# ===========================================================================

# -- shared-memory section -------------------------------------------------------------
# SysV: ipc/shm.c, include/uapi/linux/ipc.h and shm.h; POSIX: glibc's shm_open opens
# a file in the tmpfs mounted at /dev/shm.  Policy before touch (KERNEL_FACTS 4),
# prefault with MADV_POPULATE_WRITE (KERNEL_FACTS 8).

SHM_RDONLY, SHM_HUGETLB, SHM_HUGE_SHIFT = 0o10000, 0o4000, 26

_SYSV_PROBES = 8
LOCK_SH, LOCK_EX, LOCK_NB, LOCK_UN = 1, 2, 4, 8  # include/uapi/asm-generic/fcntl.h


def _sysv_key(key: Union[int, str]) -> int:
    if isinstance(key, bool):
        raise TypeError("key must be a str or an int")
    if isinstance(key, int):
        if not 0 <= key <= 0xFFFFFFFF:
            raise ValueError(f"SysV key {key} outside 0..0xffffffff")
        return key
    if not key:
        raise ValueError("empty key")
    import zlib

    return SYSV_KEY_PREFIX | (zlib.crc32(key.encode("utf-8")) & ~SYSV_KEY_MASK & 0xFFFFFFFF)


def _posix_name(key: Union[int, str]) -> str:
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise TypeError("key must be a str or an int")
    name = str(key)
    if not name or "/" in name or "\0" in name or len(name) > 200:
        raise ValueError(f"invalid POSIX shared memory name {name!r}")
    return POSIX_PREFIX + name


def _sysv_keys(key: Union[int, str]) -> List[int]:
    """The keys a region may live under, in the order create tries them."""
    probes = range(1, _SYSV_PROBES) if isinstance(key, str) else ()
    return [_sysv_key(key)] + [_sysv_key(f"{key}\0{i}") for i in probes]


def _same_key(a: Any, b: Union[int, str]) -> bool:
    return a == b and isinstance(a, str) == isinstance(b, str) and not isinstance(a, bool)


def _key_arg(key: Union[int, str]) -> str:
    """``key`` as `cleanup --key` takes it."""
    import shlex

    return f"0x{key:08x}" if isinstance(key, int) else shlex.quote(key)


def _region_mapped(size: int, page: int, huge: int) -> int:
    """The bytes create maps for ``size`` bytes of data in ``page``-byte pages: the data
    in whole pages, then the record's room, which a huge-page region (``huge``) keeps
    in base pages of a segment of its own.  fit() weighs exactly this."""
    data = -(-size // page) * page
    if huge:
        return data
    return data + _room_size(page)


def _record_write(addr: int, seg: int, rec: Mapping[str, Any]) -> None:
    """Write ``rec`` at the end of the ``seg`` bytes mapped at ``addr``, after the
    region's ``rec["size"]`` bytes of data and the room's last-use slot."""
    import json
    import zlib

    raw = json.dumps(rec, sort_keys=True, separators=(",", ":")).encode("utf-8")
    blob = raw + _RECORD_END.pack(_RECORD_MAGIC, _RECORD_FORMAT, len(raw), zlib.crc32(raw))
    if len(raw) > _RECORD_MAX:
        raise ValueError(f"identity record of {len(raw)} bytes does not fit the bytes kept for it")
    ctypes.memmove(addr + seg - len(blob), blob, len(blob))


# -- prefault ----------------------------------------------------------------------------


def prefault(
    buf: Any,
    length: Optional[int] = None,
    threads: Optional[int] = None,
    *,
    backend: Optional[Backend] = None,
    progress: Optional[Callable[[int, int], Any]] = None,
    page_size: Optional[int] = None,
    shared: bool = False,
) -> Dict[str, Any]:
    """Fault every page of ``buf`` in, for writing, under the range's memory policy.

    MADV_POPULATE_WRITE (Linux 5.14+) in ``threads`` threads (default: the allowed
    CPUs, at most 32; NUMA_PREFAULT_THREADS) on disjoint page-aligned slices; the
    calls release the GIL.  Older kernels: a write of each page's own byte, done in
    C (contents are kept).  ``progress(done_bytes, total_bytes)`` is called from the
    calling thread; an exception it raises (KeyboardInterrupt included) stops the
    workers and propagates.  ``page_size``: the huge page size for hugetlb memory.
    ``shared=True`` (shared memory): the old-kernel fallback only reads each page,
    which allocates it there, so a concurrent writer's data is never rewritten.
    Returns {"bytes", "threads", "method", "seconds"}.
    """
    import time

    backend = _b(backend)
    addr, size = buffer_range(buf, length)
    pg = page_size or backend.page_size
    start, span = _page_range(addr, size, pg)
    t0 = time.monotonic()
    if span == 0:
        return {"bytes": 0, "threads": 0, "method": "none", "seconds": 0.0}
    want = threads if threads is not None else _env("NUMA_PREFAULT_THREADS")
    if want is None:
        try:
            cpus = len(backend.call("sched_getaffinity", 0))
        except OSError:
            cpus = os.cpu_count() or 1
        # Page population scales with cores until memory bandwidth runs out.
        want = max(1, min(cpus, 32))
    if want < 1:
        raise ValueError("threads must be >= 1")
    # Slices of at least 16 MiB: below that a thread costs more than it saves.
    threads_used = max(1, min(int(want), span // max(pg, 16 << 20) or 1))
    method = "populate_write"
    # Probe on the first page: EINVAL means no MADV_POPULATE_WRITE (or a mapping it
    # cannot populate) -> touch pages instead.  Other errors are real (ENOMEM, EFAULT).
    try:
        backend.call("madvise", start, pg, MADV_POPULATE_WRITE)
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise
        method = "touch"
    chunk = max(pg, min(64 << 20, span // (4 * threads_used)) // pg * pg)
    done = [0] * threads_used
    errors: List[BaseException] = []
    stop = threading.Event()

    bounds = [start + (span // pg * i // threads_used) * pg for i in range(threads_used + 1)]

    def work(i: int) -> None:
        try:
            p, hi = bounds[i], bounds[i + 1]
            while p < hi and not stop.is_set():
                q = min(hi, p + chunk)
                if method == "populate_write":
                    backend.call("madvise", p, q - p, MADV_POPULATE_WRITE)
                elif backend.is_live:
                    _touch_iov(p, q - p, pg, write=not shared)
                else:
                    backend.touch(p, q - p)
                done[i] += q - p
                p = q
                if threads_used == 1 and progress is not None:  # one slice: run here
                    progress(sum(done), span)
        except BaseException as err:  # re-raised in the calling thread
            errors.append(err)
            stop.set()

    workers: List[threading.Thread] = []  # one slice: run here
    if threads_used > 1:
        workers = [
            threading.Thread(target=work, args=(i,), name=f"numa_utils-prefault-{i}", daemon=True)
            for i in range(threads_used)
        ]
    try:
        if not workers:
            # One slice: run it here, calling progress between chunks.
            work(0)
        for worker in workers:
            worker.start()
        # Wait on each worker in turn: joining one that has already ended returns at
        # once, and waiting on it would spin (and call progress) until the slowest
        # slice is done.
        for worker in workers:
            while worker.is_alive():
                worker.join(0.05)
                if progress is not None and not errors:
                    progress(sum(done), span)
    finally:
        stop.set()
        for worker in workers:
            if worker.ident is not None:  # started (joining one never started raises)
                worker.join()
    if errors:
        raise errors[0]
    if progress is not None and threads_used > 1:
        progress(span, span)
    return {
        "bytes": span,
        "threads": threads_used,
        "method": method,
        "seconds": time.monotonic() - t0,
    }


_do_prefault = prefault  # SharedRegion.create's ``prefault`` argument shadows it


# -- SharedRegion ----------------------------------------------------------------------


def _region_policy(
    policy: Optional[str],
    nodes: Optional[Iterable[int]],
    strict: Optional[bool],
    backend: Backend,
    known: Dict[str, Any],
) -> Tuple[Mode, Optional[FrozenSet[int]], bool, bool]:
    """(mode, nodes, strict, explicit) from the arguments and the environment:
    policy=None means interleave when ENABLE_NUMA_INTERLEAVE is set, else first-touch;
    nodes=None means NUMA_NODES, else default_memory_nodes(); strict=None: NUMA_STRICT.
    ``known``: as _apply_policy's, plus "topology": NUMA_NODES is resolved on a
    topology read already and kept as "env"."""
    if policy is not None and not isinstance(policy, str):
        raise ValueError(f"unknown region policy {policy!r}")
    if policy is not None:
        mode = _mode_of(policy)
    elif _env("ENABLE_NUMA_INTERLEAVE"):
        mode = Mode.INTERLEAVE
    else:
        mode = Mode.DEFAULT
    if nodes is None and mode not in (Mode.DEFAULT, Mode.LOCAL):
        if "env" not in known:
            known["env"] = _env_nodes(backend, known.get("topology"))
        nodes = known["env"] or None
    ids = frozenset(nodes) if nodes is not None else None
    if mode == Mode.PREFERRED and (ids is None or len(ids) != 1):
        raise ValueError("policy='prefer' needs nodes=[one node]")
    return mode, ids, _strict_or_env(strict), policy is not None


# Policies whose huge pages come from any allowed node with one free: nodes=None below.
_SPILL_MODES = (Mode.DEFAULT, Mode.LOCAL, Mode.PREFERRED)


def _reserved_kb(topo: Topology, node: int) -> Set[int]:
    """The huge page sizes (kB) with pages reserved on ``node``."""
    if node not in topo.nodes:
        return set()
    return {kb for kb, h in topo.nodes[node].hugepages.items() if h.total}


def _huge_size(
    hugepages: Union[bool, int, str, None], backend: Backend, nodes: Optional[FrozenSet[int]]
) -> int:
    """Huge page size in bytes (0: base pages, or "thp").  True: the size reserved on
    every node of ``nodes``, 2 MiB first; "2M"/"1G"/"2048kB" or a byte count pick one.
    ``nodes`` None or empty (_SPILL_MODES): pages come from where they are (the
    hugetlb allocator falls back along the zonelist): any usable node's size will do."""
    if hugepages in (None, False, 0, "off", "", "thp"):
        return 0
    topo = read_topology(backend=backend)
    targets = nodes or topo.usable_memory_nodes or frozenset(topo.nodes)
    have = {node: _reserved_kb(topo, node) for node in targets}  # the sizes reserved there
    reserved: Dict[str, List[int]] = {}  # what messages say is where: "2048 kB pages"
    for node in sorted(targets | topo.usable_memory_nodes):
        for what in [f"{kb} kB pages" for kb in sorted(_reserved_kb(topo, node))] or ["none"]:
            reserved.setdefault(what, []).append(node)
    seen = "; ".join(f"{what} on {_nodes_txt(ns)}" for what, ns in reserved.items())
    sizes_kb: Set[int] = set()
    if have and nodes:
        sizes_kb = set.intersection(*have.values())
    elif have:
        sizes_kb = set.union(*have.values())
    if hugepages is True:
        bare = [node for node in targets if not have[node]]
        if not sizes_kb and bare:
            raise OSError(
                errno.ENOMEM,
                f"huge pages are not reserved on {_nodes_txt(bare)}, where the policy "
                f"places pages ({seen}): reserve some there (e.g. "
                "nodeN/hugepages/hugepages-2048kB/nr_hugepages), place the region where "
                "they are, or use hugepages=False",
            )
        if not sizes_kb:
            raise OSError(
                errno.ENOMEM,
                "no one huge page size is reserved on every node the policy places pages "
                f"on ({seen}): reserve one size on all of "
                f"{_nodes_txt(targets)}, or use hugepages=False",
            )
        if 2048 in sizes_kb:
            return 2048 * 1024
        return min(sizes_kb) * 1024
    if isinstance(hugepages, str):
        nbytes = parse_size(hugepages)
    else:
        nbytes = int(hugepages or 0)
    kb = nbytes // 1024
    if kb not in sizes_kb:
        short = [node for node in targets if kb not in have[node]]
        raise OSError(
            errno.ENOMEM,
            f"no {nbytes >> 10} kB huge pages reserved on {_nodes_txt(short)} ({seen})",
        )
    return nbytes


def _region_page(
    hugepages: Union[bool, int, str, None],
    kind: str,
    backend: Backend,
    nodes: Optional[FrozenSet[int]],
) -> Tuple[int, int]:
    """(huge page size or 0, the page size the region is mapped with)."""
    huge = _huge_size(hugepages, backend, nodes)
    if huge and kind == "posix":
        raise ValueError("hugepages need kind='sysv' (SHM_HUGETLB): /dev/shm is tmpfs")
    return huge, huge or backend.page_size


def _region_args(backend: Backend, kind: str, size: Any, least: int) -> None:
    """create's and attach's checks, before any system call: a size above the ABI's
    size_t would be truncated (2**64 + 1M gave a 1 MiB segment behind a region
    claiming 2**64 + 1M)."""
    if kind not in ("sysv", "posix"):
        raise ValueError(f"kind must be 'sysv' or 'posix', not {kind!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < least:
        raise ValueError(f"invalid size {size!r}: an int >= {least}")
    size_max = (1 << backend.abi.word_bits) - 1 if backend.abi.word_bits else _SIZE_MAX
    if size > size_max:
        raise ValueError(f"size {size} is larger than this ABI's size_t ({size_max})")


# VMAs left to the engine beside a region's layout: its threads' stacks, the files
# and libraries it maps later (each a VMA or more).
_MAP_COUNT_SPARE_MIN = 1024


def _map_count_room(backend: Backend) -> Optional[Tuple[int, int]]:
    """(vm.max_map_count, the VMAs this process maps now); None where either cannot be
    read (a simulated or saved machine without them)."""
    limit = _read_optional(backend, "/proc/sys/vm/max_map_count")
    maps = _read_optional(backend, "/proc/self/maps")
    if limit is None or maps is None:
        return None
    try:
        return int(limit), maps.count("\n")
    except ValueError:
        return None


def _map_count_spare(limit: int) -> int:
    """The VMAs kept for the engine: a 16th of vm.max_map_count, at least
    _MAP_COUNT_SPARE_MIN, but never more than a quarter of a low limit (1,000 keeps
    250, not all of it)."""
    spare = max(_MAP_COUNT_SPARE_MIN, limit // 16)
    return min(spare, limit // 4)


def _map_count_check(backend: Backend, need: int, layout: str) -> Tuple[Optional[int], str]:
    """(the VMAs vm.max_map_count leaves this process with room kept for the engine,
    None where either cannot be read; why the ``need`` VMAs a region of ``layout``
    takes, its runs and the record room's one, do not fit there, "" when they do)."""
    room = _map_count_room(backend)
    if room is None:
        return None, ""
    limit, mapped = room
    spare = _map_count_spare(limit)
    free = max(limit - mapped - spare, 0)
    if need <= free:
        return free, ""
    why = (
        f"layout {layout} takes {need} memory mappings (VMAs); vm.max_map_count {limit}, "
        f"less the {mapped} this process maps and {spare} kept for the engine, leaves "
        f"{free}: raise vm.max_map_count (sysctl -w vm.max_map_count=N) or use "
        "fewer, larger blocks"
    )
    return free, why


# -- fit: will an allocation succeed, checked before anything is made -------------------

_THP_DIR = "/sys/kernel/mm/transparent_hugepage"
MADV_HUGEPAGE = 14
_CGROUP = "/sys/fs/cgroup"


class FitLimit(_Record):
    """One limit on an allocation: what it is, the file that says so, the bytes it
    still allows (None: only reported) and what raises it."""

    name: str
    source: str
    allows: Optional[int]
    fix: str = ""


class FitNode(_Record):
    node: int
    needed: int  # bytes this node should hold under the policy
    available: int  # MemFree + reclaimable, or free huge pages x size
    hugepages: Mapping[int, HugePages]  # page size in kB -> counts


class FitResult(_Record):
    """``fit()``: truthy when the allocation would succeed.  ``exact``: its pages
    would also land where the policy asks (not spilled to other nodes)."""

    ok: bool
    exact: bool
    reason: str
    size: int
    kind: str
    page_size: int
    hugepages: str  # "off", "thp", "2048kB" ...
    nodes: Tuple[FitNode, ...]
    limits: Tuple[FitLimit, ...]
    thp: Mapping[str, str]  # enabled, defrag, shmem_enabled: the selected words
    hugepages_fallback: Optional[str] = None  # why base pages instead of huge ones
    vmas: int = 2  # memory mappings the region takes: its layout's runs, the record room
    vmas_free: Optional[int] = None  # what vm.max_map_count leaves it (None: unknown)

    def __bool__(self) -> bool:
        return self.ok

    def to_json(self) -> Dict[str, Any]:
        return {key: to_json(value) for key, value in self._asdict().items()}


def _selected(text: Optional[str]) -> Optional[str]:
    match = re.search(r"\[([\w-]+)\]", text or "")
    return match.group(1) if match else None


def _thp_settings(backend: Backend) -> Dict[str, str]:
    return {
        n: w
        for n in ("enabled", "defrag", "shmem_enabled")
        if (w := _selected(_read_optional(backend, f"{_THP_DIR}/{n}")))
    }


def _layout_arg(layout: Union[Layout, str, None]) -> Optional[Layout]:
    """create's and fit's ``layout``: a Layout, its text (parsed), or None."""
    lay = Layout.parse(layout) if isinstance(layout, str) else layout
    if lay is not None and not isinstance(lay, Layout):
        raise ValueError(f"layout must be a Layout or its text, not {lay!r}")
    return lay


def _cgroup_dirs(backend: Backend) -> List[str]:
    """This process's cgroup v2 directory and its ancestors up to the root, innermost
    first; [] when /proc/self/cgroup names no v2 cgroup."""
    match = re.search(r"^0::\s*(/.*)", _read_optional(backend, "/proc/self/cgroup") or "", re.M)
    if match is None:
        return []
    parts = [p for p in match.group(1).strip().split("/") if p]
    dirs = []
    for depth in range(len(parts), -1, -1):
        dirs.append("/".join([_CGROUP, *parts[:depth]]))
    return dirs


def _fit_limits(backend: Backend, huge: int, kind: str, pin: bool, need: int) -> List[FitLimit]:
    """The limits beyond free memory, each with the file it came from."""
    num = _Reader(backend).integer  # None: absent, unreadable or "max"
    out: List[FitLimit] = []
    if huge:
        # hugetlb.2MB.max: mm/hugetlb_cgroup.c mem_fmt, as format_size for powers of two < 1 TiB
        names = [f"hugetlb.{format_size(huge)}B.max"]
    else:
        names = ["memory.max", "memory.high"]
    for d in _cgroup_dirs(backend):
        for name in names:
            # memory.max/.high -> memory.current, hugetlb.2MB.max -> hugetlb.2MB.current
            cap, cur = num(f"{d}/{name}"), num(f"{d}/{name.rsplit('.', 1)[0]}.current")
            if cap is not None:
                out.append(
                    FitLimit(
                        f"cgroup {name}",
                        f"{d}/{name}",
                        cap - (cur or 0),
                        f"raise {name} of the container/cgroup (docker "
                        "--memory, a Kubernetes limit)",
                    )
                )
    if pin:
        lim = re.search(
            r"^Max locked memory\s+(\S+)", _read_optional(backend, "/proc/self/limits") or "", re.M
        )
        if lim and lim.group(1).isdigit() and backend.call("geteuid") != 0:
            out.append(
                FitLimit(
                    "RLIMIT_MEMLOCK",
                    "/proc/self/limits",
                    int(lim.group(1)),
                    "raise it (ulimit -l, docker --ulimit memlock=-1, LimitMEMLOCK=infinity)",
                )
            )
    if kind == "posix":
        vfs = backend.call("statvfs", "/dev/shm")
        if vfs is not None:
            out.append(
                FitLimit(
                    "/dev/shm",
                    f"/dev/shm is a {format_kib(vfs[0] >> 10)} tmpfs",
                    vfs[1],
                    f"run the container with --shm-size="
                    f"{-(-need >> 20) + (vfs[0] - vfs[1] >> 20)}m (or remount "
                    "/dev/shm larger) or use kind='sysv'",
                )
            )
    else:
        shmmax, shmall = num("/proc/sys/kernel/shmmax"), num("/proc/sys/kernel/shmall")
        if shmmax is not None:
            out.append(
                FitLimit(
                    "kernel.shmmax",
                    "/proc/sys/kernel/shmmax",
                    shmmax,
                    "sysctl -w kernel.shmmax=..., or kind='posix'",
                )
            )
        if shmall is not None:
            used = sum(
                -(-seg.size // backend.page_size)
                for seg in parse_sysvipc_shm(_read_optional(backend, "/proc/sysvipc/shm") or "")
            )
            out.append(
                FitLimit(
                    "kernel.shmall",
                    "/proc/sys/kernel/shmall (pages)",
                    (shmall - used) * backend.page_size,
                    "sysctl -w kernel.shmall=..., or kind='posix'",
                )
            )
    oc = num("/proc/sys/vm/overcommit_memory")
    mi = parse_meminfo(_read_optional(backend, "/proc/meminfo") or "")
    if oc == 2 and not huge:
        out.append(
            FitLimit(
                "vm.overcommit_memory=2",
                "/proc/meminfo CommitLimit - Committed_AS",
                (mi.get("CommitLimit", 0) - mi.get("Committed_AS", 0)) * 1024,
                "raise vm.overcommit_ratio or add swap",
            )
        )
    elif oc == 0 and kind == "sysv" and not huge and "MemTotal" in mi:
        out.append(
            FitLimit(
                "vm.overcommit_memory=0",
                "/proc/meminfo MemTotal + SwapTotal",
                (mi["MemTotal"] + mi.get("SwapTotal", 0)) * 1024,
                "a smaller region, or vm.overcommit_memory=1",
            )
        )
    return out


def _parse_numastat(
    text: str, *, source: Optional[str] = None, lenient: bool = False
) -> Dict[str, int]:
    """nodeN/numastat ("numa_hit 4495833\\n...") -> {"numa_hit": 4495833, ...}.

    Values are unsigned (the kernel prints %lu).  A malformed line raises ValueError;
    with ``lenient=True`` it is skipped and the good lines are kept.
    """
    out: Dict[str, int] = {}
    for line in _clean(text).splitlines():
        parts = line.split()
        v = _uint(parts[1]) if len(parts) == 2 else None
        if v is not None:
            out[parts[0]] = v
        elif parts and not lenient:
            raise ValueError(f"invalid numastat line{_where(source)}: {_short(line)}")
    return out


# Per-node allocation counters, in pages (drivers/base/node.c node_read_numastat;
# Documentation/admin-guide/numastat.rst).  numa_miss/numa_foreign/other_node are
# the "remote" ones: a page that went to another node than the one asked for, or to
# this node for a CPU on another node.
NUMASTAT_FIELDS = (
    "numa_hit",
    "numa_miss",
    "numa_foreign",
    "interleave_hit",
    "local_node",
    "other_node",
)


class NodeCounters(_Record):
    """One node's numastat counters (pages) and meminfo (kB).

    From ``counters()`` these are totals since boot; after ``after - before`` they
    are the change over the interval (numastat never negative; meminfo signed).
    A missing file gives an empty mapping and the properties read 0.
    """

    node: int
    numastat: Mapping[str, int]  # numa_hit, numa_miss, ... in pages
    meminfo: Mapping[str, int]  # MemTotal, MemFree, FilePages, ... in kB

    @property
    def numa_hit(self) -> int:
        return self.numastat.get("numa_hit", 0)

    @property
    def numa_miss(self) -> int:
        return self.numastat.get("numa_miss", 0)

    @property
    def numa_foreign(self) -> int:
        return self.numastat.get("numa_foreign", 0)

    @property
    def interleave_hit(self) -> int:
        return self.numastat.get("interleave_hit", 0)

    @property
    def local_node(self) -> int:
        return self.numastat.get("local_node", 0)

    @property
    def other_node(self) -> int:
        return self.numastat.get("other_node", 0)

    @property
    def mem_total_kb(self) -> int:
        return self.meminfo.get("MemTotal", 0)

    @property
    def mem_free_kb(self) -> int:
        return self.meminfo.get("MemFree", 0)

    @property
    def file_kb(self) -> int:
        """Page cache on the file LRUs: what reclaim can give back without swap."""
        mi = self.meminfo
        if "Active(file)" in mi or "Inactive(file)" in mi:
            return mi.get("Active(file)", 0) + mi.get("Inactive(file)", 0)
        # Older kernels: FilePages includes shmem, which reclaim cannot drop.
        return max(mi.get("FilePages", 0) - mi.get("Shmem", 0), 0)

    @property
    def available_kb(self) -> int:
        """MemFree plus reclaimable file pages (what a new worker can count on)."""
        return self.mem_free_kb + self.file_kb

    def __sub__(self, other: object) -> NodeCounters:
        if not isinstance(other, NodeCounters):
            return NotImplemented
        # numastat counters only grow; a smaller value means the node went offline
        # and came back (they restart at 0), so the change is the new value.
        stat = {}
        for name, value in self.numastat.items():
            before = other.numastat.get(name, 0)
            if value >= before:
                stat[name] = value - before
            else:
                stat[name] = value
        mem = {key: v - other.meminfo.get(key, 0) for key, v in self.meminfo.items()}
        return NodeCounters(self.node, MappingProxyType(stat), MappingProxyType(mem))

    def to_json(self) -> Dict[str, Any]:
        return {
            "node": self.node,
            **{k: self.numastat.get(k) for k in NUMASTAT_FIELDS},
            "mem_total_kb": self.mem_total_kb,
            "mem_free_kb": self.mem_free_kb,
            "file_kb": self.file_kb,
            "available_kb": self.available_kb,
            "meminfo": dict(self.meminfo),
        }


class Counters:
    """A snapshot of every online node's counters (``counters()``), or the change
    between two snapshots (``after - before``: ``seconds`` is then the interval).
    ``snap[node]`` is a NodeCounters; iterating gives them in node order."""

    __slots__ = ("timestamp", "monotonic", "nodes", "page_size", "problems", "seconds")

    def __init__(
        self,
        timestamp: float,
        monotonic: float,
        nodes: Mapping[int, NodeCounters],
        page_size: int,
        problems: Tuple[str, ...] = (),
        seconds: Optional[float] = None,
    ) -> None:
        self.timestamp = timestamp  # time.time() of the (later) snapshot
        self.monotonic = monotonic  # time.monotonic(), for intervals
        self.nodes = nodes
        self.page_size = page_size
        self.problems = problems  # files that could not be read
        self.seconds = seconds  # set on a difference

    def __repr__(self) -> str:
        kind = "snapshot"
        if self.seconds is not None:
            kind = f"delta over {self.seconds:.3f}s"
        return (
            f"Counters({kind}, nodes {format_cpulist(self.nodes)}, remote {self.remote_ratio:.2%})"
        )

    def __getitem__(self, node: int) -> NodeCounters:
        return self.nodes[node]

    def __iter__(self) -> Iterator[NodeCounters]:
        return iter(self.nodes[node] for node in sorted(self.nodes))

    @property
    def is_delta(self) -> bool:
        return self.seconds is not None

    def total(self, name: str) -> int:
        """Sum of one numastat counter over every node."""
        return sum(node.numastat.get(name, 0) for node in self.nodes.values())

    @property
    def remote_pages(self) -> int:
        """Pages allocated on a node other than the allocating CPU's (other_node)."""
        return self.total("other_node")

    @property
    def remote_ratio(self) -> float:
        """other_node / (local_node + other_node); 0.0 when nothing was counted."""
        local, remote = self.total("local_node"), self.total("other_node")
        if not local + remote:
            return 0.0
        return remote / (local + remote)

    def __sub__(self, other: object) -> Counters:
        if not isinstance(other, Counters):
            return NotImplemented
        nodes = {}
        for node, counted in self.nodes.items():
            if node in other.nodes:
                nodes[node] = counted - other.nodes[node]
            else:
                nodes[node] = counted
        return Counters(
            self.timestamp,
            self.monotonic,
            MappingProxyType(nodes),
            self.page_size,
            self.problems,
            max(self.monotonic - other.monotonic, 0.0),
        )

    def to_json(self) -> Dict[str, Any]:
        return {
            "timestamp": self.timestamp,
            "seconds": self.seconds,
            "page_size": self.page_size,
            "nodes": [c.to_json() for c in self],
            "remote_pages": self.remote_pages,
            "remote_ratio": self.remote_ratio,
            "problems": list(self.problems),
        }


def counters(*, backend: Optional[Backend] = None) -> Counters:
    """Snapshot of per-node numastat counters and meminfo, for ``after - before``.

    Reads nodeN/numastat and nodeN/meminfo for every online node.  Fallbacks (never
    raises for a missing or malformed file; see ``Counters.problems``): no node
    directory (kernel without NUMA) -> node 0 with /proc/meminfo and no numastat;
    a missing numastat/meminfo file -> an empty mapping for that node.
    """
    import time

    backend = _b(backend)
    reader = _Reader(backend)
    nodes: Dict[int, NodeCounters] = {}
    if reader.exists(_NODE_DIR):
        online = reader.parsed(f"{_NODE_DIR}/online", _parse_nodelist)
        if online is None:
            online = _node_dirs(reader)
        for node in sorted(online):
            folder = f"{_NODE_DIR}/node{node}"
            stat = reader.parsed(f"{folder}/numastat", _parse_numastat)
            if stat is None:
                # Missing: no counters.  Malformed (the problem is recorded): keep
                # the lines that do parse rather than lose the whole node.
                t = reader.text(f"{folder}/numastat")
                stat = {}
                if t is not None:
                    stat = _parse_numastat(t, lenient=True)
            mi = reader.parsed(f"{folder}/meminfo", parse_meminfo) or {}
            nodes[node] = NodeCounters(node, MappingProxyType(stat), MappingProxyType(mi))
    else:
        mi = reader.parsed("/proc/meminfo", parse_meminfo) or {}
        nodes[0] = NodeCounters(0, MappingProxyType({}), MappingProxyType(mi))
    return Counters(
        time.time(),
        time.monotonic(),
        MappingProxyType(nodes),
        backend.page_size,
        tuple(reader.problems),
    )


def _fit_targets(topo: Topology, mode: Mode, ids: Optional[FrozenSet[int]]) -> List[int]:
    """The nodes a region's pages go to, as fit() weighs them: every allowed node for
    first-touch and local, else the nodes asked for, else the default ones."""
    allowed = topo.usable_memory_nodes
    if mode in (Mode.DEFAULT, Mode.LOCAL):
        return sorted(allowed)
    if ids is not None:
        return sorted(ids)
    return sorted(default_memory_nodes(topo) or allowed)


def _fit_share(mode: Mode, targets: List[int], npages: int, page: int) -> Dict[int, int]:
    """The bytes each of ``targets`` should hold: an interleave's even share (the first
    nodes one page more), all on the first for prefer, {} when the kernel decides."""
    if mode in (Mode.INTERLEAVE, Mode.WEIGHTED_INTERLEAVE):
        each, extra = divmod(npages, len(targets))
        return {node: (each + (i < extra)) * page for i, node in enumerate(targets)}
    if mode == Mode.PREFERRED:
        return {targets[0]: npages * page}
    return {}


def _fit_available(snap: Counters, node: int, hp: Mapping[int, HugePages], huge: int) -> int:
    """Bytes ``node`` can give: its free ``huge``-byte huge pages, or, for base pages,
    MemFree plus reclaimable page cache; 0 for what the counters do not know."""
    if huge:
        if huge >> 10 not in hp:
            return 0
        return hp[huge >> 10].free * huge
    if node not in snap.nodes:
        return 0
    return snap.nodes[node].available_kb * 1024


def _fit(
    backend: Backend,
    topo: Topology,
    size: int,
    mode: Mode,
    ids: Optional[FrozenSet[int]],
    hugepages: Union[bool, int, str, None],
    kind: str,
    pin: bool,
    hugepages_required: bool,
    lay: Optional[Layout] = None,
) -> FitResult:
    """fit() on a topology already read and a policy already resolved (``ids``: the
    nodes asked for, None for the default ones; ``lay``: the layout, if one)."""
    allowed = topo.usable_memory_nodes
    targets = _fit_targets(topo, mode, ids)
    # hugepages=None: NUMA_UTILS_NUMA_HUGEPAGES ("off" unless set).
    # "off" and "" reach _region_page, which takes them as base pages.
    want = hugepages
    if hugepages is None:
        want = _env("NUMA_HUGEPAGES")
    thp = _thp_settings(backend)
    short: List[str] = []  # why the pages would not all land as asked
    fallback = None
    huge = 0
    if want == "thp":
        if thp.get("shmem_enabled", "never") in ("never", "deny"):
            fallback = (
                f"shmem THP is {thp.get('shmem_enabled', 'absent')!r} "
                f"({_THP_DIR}/shmem_enabled): echo advise there"
            )
    elif want:
        placed = None  # _SPILL_MODES: huge pages from any allowed node
        if mode not in _SPILL_MODES:
            placed = frozenset(targets)
        asked = want
        if want == "auto":
            asked = True
        try:
            huge = _region_page(asked, kind, backend, placed)[0]
        except OSError as err:
            if want == "auto":
                want = "thp"  # auto: THP when no huge pages are reserved
            else:
                fallback = str(err.args[-1])
    page = huge or backend.page_size
    npages = -(-size // page)
    share = _fit_share(mode, targets, npages, page)
    if share and not huge:  # the record's room, on the lowest node (_room_apply)
        share[targets[0]] += _room_size(page)
    snap = counters(backend=backend)
    fnodes = []
    for node in sorted(set(targets) | allowed):
        hp: Mapping[int, HugePages] = MappingProxyType({})
        if node in topo.nodes:
            hp = topo.nodes[node].hugepages
        avail = _fit_available(snap, node, hp, huge)
        needed = share.get(node, 0)
        fnodes.append(FitNode(node, needed, avail, hp))
        if needed > avail and huge:
            short.append(
                f"node {node} has {format_kib(avail >> 10)} free in {huge >> 10} kB huge pages"
                f" of the {format_kib(needed >> 10)} it should hold"
            )
        elif needed > avail:
            short.append(
                f"node {node} has {format_kib(avail >> 10)} free of the "
                f"{format_kib(needed >> 10)} it should hold"
            )
    outside = set(targets) - allowed
    if outside:
        short.append(
            f"node(s) {format_cpulist(outside)} outside cpuset.mems.effective "
            f"({format_cpulist(allowed)}, /proc/self/status Mems_allowed_list): "
            "the policy is refused and pages land first-touch"
        )
    if huge and short and fallback is None and mode != Mode.PREFERRED:
        fallback = "; ".join(short)  # preferred: the rest comes from other nodes
    if fallback is not None and hugepages_required:
        return FitResult(
            False,
            False,
            f"hugepages={want!r}: {fallback} (or pass hugepages_required=False for base pages)",
            size,
            kind,
            page,
            str(want),
            tuple(fnodes),
            (),
            thp,
        )
    if fallback is not None and huge:
        again = _fit(backend, topo, size, mode, ids, False, kind, pin, True, lay)
        return again._replace(hugepages_fallback=fallback)
    rounded = npages * page
    if lay is None:
        lay = Layout.extents([(rounded, "default", ())])
    lay = lay.bound(rounded, page, topo.nodes_with_memory)
    vmas = lay.vmas + 1
    vmas_free, map_short = _map_count_check(backend, vmas, str(lay))
    if map_short:
        short.append(map_short)
    need = _region_mapped(size, page, huge)
    if mode == Mode.BIND:
        pool = frozenset(targets)
        pool_name = f"memory of bound node(s) {format_cpulist(pool)}"
    else:
        pool = allowed
        pool_name = f"memory of allowed node(s) {format_cpulist(pool)}"
    counted_in = f"{_NODE_DIR}/node*/meminfo"
    if huge:
        counted_in = f"{_NODE_DIR}/node*/hugepages"
    limits = [
        FitLimit(
            pool_name,
            counted_in,
            sum(f.available for f in fnodes if f.node in pool),
            "free memory there, or choose other nodes",
        )
    ]
    limits += _fit_limits(backend, huge, kind, pin, need)
    tight = min(
        (x for x in limits if x.allows is not None and x.allows < need),
        key=lambda x: x.allows or 0,
        default=None,
    )
    if tight is None:
        reason = "; ".join(short) or "fits as asked"
    else:
        reason = (
            f"{format_kib(need >> 10)} needed, {tight.name} allows "
            f"{format_kib(max(tight.allows or 0, 0) >> 10)} ({tight.source}): {tight.fix}"
        )
    if huge:
        pages = f"{huge >> 10}kB"
    elif want == "thp" and fallback is None:
        pages = "thp"
    else:
        pages = "off"
    return FitResult(
        tight is None,
        tight is None and not short,
        reason,
        size,
        kind,
        page,
        pages,
        tuple(fnodes),
        tuple(limits),
        thp,
        fallback,
        vmas,
        vmas_free,
    )


def fit(
    size: int,
    *,
    nodes: Optional[Iterable[int]] = None,
    policy: Optional[str] = "interleave",
    hugepages: Union[bool, int, str, None] = None,
    kind: str = "sysv",
    pin: bool = False,
    hugepages_required: bool = True,
    backend: Optional[Backend] = None,
    layout: Union[Layout, str, None] = None,
) -> FitResult:
    """Would ``SharedRegion.create(size, policy=, nodes=, hugepages=, kind=)`` plus its
    prefault (and ``pin_for_cuda`` with ``pin=True``) succeed?  Reads, never allocates:
    per node MemFree plus reclaimable page cache or free huge pages, and every limit
    with its source: cgroup v2 memory.max/memory.high/hugetlb.<size>.max less their
    current use, cpuset.mems.effective, RLIMIT_MEMLOCK, the tmpfs behind /dev/shm,
    shmmax/shmall, vm.overcommit_memory.  ``reason`` names the tightest limit and the
    fix.  ``hugepages_required=False``: too few huge pages falls back to base pages.
    ``size`` and ``kind`` are checked as create checks them (ValueError).
    ``layout`` (instead of ``nodes``; ``policy`` is then ignored): memory is weighed as
    create weighs a layout's (over the allowed nodes), and ``vmas``, the memory
    mappings it takes, against ``vmas_free``, what vm.max_map_count leaves this
    process: past it, not ``exact`` (create interleaves instead, or refuses under
    strict) and ``reason`` says so.
    """
    backend = _b(backend)
    _region_args(backend, kind, size, 1)
    if layout is not None and nodes is not None:
        raise ValueError("give layout= or nodes=, not both")
    lay = _layout_arg(layout)
    if lay is not None:
        policy = None  # create weighs a layout's memory as first-touch
    topo = read_topology(backend=backend)
    mode, ids, _, _ = _region_policy(policy, nodes, None, backend, {"topology": topo})
    return _fit(backend, topo, size, mode, ids, hugepages, kind, pin, hugepages_required, lay)


def _fit_or_raise(r: FitResult, size: int) -> Tuple[Union[bool, int, str], Optional[str]]:
    """SharedRegion.create's check of fit's answer: (the hugepages mode to use, why it
    fell back) or OSError naming the tightest limit, before anything is made."""
    if not r:
        if "/dev/shm allows" in r.reason:
            err = errno.ENOSPC
        else:
            err = errno.ENOMEM
        raise OSError(err, f"cannot create a {format_kib(size >> 10)} region: {r.reason}")
    pages: Union[bool, int, str] = False  # base pages
    if r.hugepages == "thp":
        pages = "thp"
    elif r.hugepages != "off":
        pages = r.page_size
    return pages, r.hugepages_fallback


# -- layouts: a policy per extent of one region ------------------------------------------
# One line of text, which the identity record carries to every attacher:
#   layout := rule ["@" SIZE]  |  extent (";" extent)*
#   rule   := "parts:" POLICY ":" ENTRIES          equal contiguous parts, one per entry
#           | "blocks:" SIZE ":" POLICY ":" ENTRIES  block i on entry i % len(ENTRIES)
#   extent := SIZE ":" POLICY [":" NODES]           contiguous from offset 0
#   ENTRIES := NODES ("/" NODES)*     NODES := a node list (0-3,8)
#   SIZE := bytes, or with K/M/G/T (binary) as everywhere else.  POLICY: bind,
#   interleave, weighted-interleave, prefer, prefer-many, local, default.
# "@SIZE" is the region size a rule was bound to (create adds it).  An extent without
# NODES takes default_memory_nodes() where its policy needs nodes.  A blocks rule is
# kept as the rule, not as one extent per block; a size that is not a whole number of
# blocks ends in a shorter block.  Each extent is one mbind, and a mapping holds at
# most vm.max_map_count (65530) VMAs: keep blocks that alternate nodes fewer than that.
def placement_verdict(per_node: Mapping[int, int], mode: str = "") -> str:
    """Where bytes landed, in words: "interleaved 50.0/50.0 over nodes 0-1" (``mode``
    names an interleave), "split 75.0/25.0 over nodes 0-1", "all on node 0",
    "nothing faulted in".  ``per_node``: bytes (or pages) per node."""
    total = sum(per_node.values())
    used = sorted(node for node, value in per_node.items() if value)
    if not total:
        return "nothing faulted in"
    if len(used) == 1:
        return f"all on node {used[0]}"
    shares = "/".join(f"{100.0 * per_node[node] / total:.1f}" for node in used)
    word = "interleaved" if "interleave" in mode else "split"
    return f"{word} {shares} over nodes {format_cpulist(used)}"


def _layout_within_map_count(backend: Backend, lay: Layout, strict: bool) -> Tuple[Layout, str]:
    """``lay`` when the VMAs it takes (and the record room's one) fit in what
    vm.max_map_count leaves this process, with room kept for the engine; else, before
    any mbind, OSError(ENOMEM) under ``strict`` or interleave over the same nodes and
    why (a process left at its mapping limit cannot start a thread or map a file)."""
    need = lay.vmas + 1
    _, why = _map_count_check(backend, need, str(lay))
    if not why:
        return lay, ""
    if strict:
        raise OSError(errno.ENOMEM, why)
    size = lay._bound_size()
    if lay.nodes:
        fallback = Layout.extents([(size, "interleave", lay.nodes)])
    else:
        fallback = Layout.extents([(size, "default", ())])
    _warn_once(f"map-count:{need}", "numa_utils: %s; interleaving over its nodes instead", why)
    return fallback, why


def _whole_policy(results: List[PolicyResult], lay: Layout, fallback: str) -> PolicyResult:
    """One result for a region's whole layout: its extents' result when it has one,
    else mode "layout" over every node it names, applied only when every extent's
    policy was (the first failure's reason); never applied after a fallback."""
    whole = results[0]
    if len(results) > 1:
        failed = [r for r in results if not r.applied]
        whole = PolicyResult(
            applied=not failed,
            mode="layout",
            nodes=lay.nodes,
            start=results[0].start,
            length=sum(r.length for r in results),
        )
        if failed:
            first = failed[0]
            whole = whole._replace(reason=first.reason, errno=first.errno, hint=first.hint)
    if fallback:
        whole = whole._replace(applied=False, reason="max-map-count", hint=fallback)
    return whole


# -- the last-use slot (laid out in the identity record section) ----------------------
_SLOT = struct.Struct("<8sIIdQQI16sI")
_SLOT_MAGIC = b"numa_use"
_SLOT_FORMAT = 1
_PID_MAX = 1 << 22  # PID_MAX_LIMIT, include/linux/threads.h: no pid is larger


def _ns_id(text: Any) -> int:
    """The number of a namespace as /proc/PID/ns names it ("pid:[4026531836]"); 0
    for anything else."""
    if not isinstance(text, str):
        return 0
    match = re.fullmatch(r"[a-z_]+:\[([0-9]{1,19})\]", text)
    if match is None:
        return 0
    return int(match.group(1))


def _who(ident: Mapping[str, Any]) -> Dict[str, Any]:
    """A process as an identity record or whoami() names it, in the slot's terms: pid
    (as given: the caller checks it), start ("" unless a short ASCII token), boot
    (CRC-32 of the boot id), pidns and timens (namespace numbers)."""
    import zlib

    start = ident.get("start")
    if not isinstance(start, str) or len(start) > 16 or not start.isascii():
        start = ""
    boot = ident.get("boot")
    boot_crc = 0
    if isinstance(boot, str) and boot:
        boot_crc = zlib.crc32(boot.encode("utf-8", "replace"))
    return {
        "pid": ident.get("pid"),
        "start": start,
        "boot": boot_crc,
        "pidns": _ns_id(ident.get("pidns")),
        "timens": _ns_id(ident.get("timens")),
    }


def _slot_write(backend: Backend, addr: int) -> None:
    """Record this process as the region's last user, now, in the slot at ``addr``."""
    import time
    import zlib

    me = _who(backend.call("whoami"))
    body = _SLOT.pack(
        _SLOT_MAGIC,
        _SLOT_FORMAT,
        me["pid"],
        time.time(),
        me["pidns"],
        me["timens"],
        me["boot"],
        me["start"].encode("ascii"),
        0,
    )[:-4]
    ctypes.memmove(addr, body + struct.pack("<I", zlib.crc32(body)), _SLOT.size)


def _slot_bytes(addr: int, seg: int, rec: Optional[Mapping[str, Any]]) -> bytes:
    """The slot of the ``seg`` bytes mapped at ``addr``, whose record is ``rec``."""
    if rec is None or rec["size"] + _SLOT.size > seg:
        return b""
    return ctypes.string_at(addr + rec["size"], _SLOT.size)


def _slot_read(raw: bytes) -> Optional[Dict[str, Any]]:
    """The last use in slot bytes ``raw`` (as _who gives a process, and "used"): None
    when never written (a region being made, or made by an older numa_utils);
    ValueError when damaged."""
    import math
    import zlib

    if len(raw) != _SLOT.size or raw[:8] != _SLOT_MAGIC:
        return None
    _, fmt, pid, used, pidns, timens, boot, start, crc = _SLOT.unpack(raw)
    if zlib.crc32(raw[:-4]) != crc:
        raise ValueError("last-use slot damaged (checksum mismatch)")
    if fmt != _SLOT_FORMAT:
        raise ValueError(f"last-use slot format {fmt}, not {_SLOT_FORMAT}")
    if not math.isfinite(used):
        raise ValueError(f"last-use slot damaged (time {used})")
    return {
        "pid": pid,
        "used": used,
        "start": start.rstrip(b"\0").decode("ascii", "replace"),
        "boot": boot,
        "pidns": pidns,
        "timens": timens,
    }


def _user_name(backend: Backend, uid: int) -> str:
    """The user name of ``uid`` from /etc/passwd (no NSS: no network behind an
    error message); "not in /etc/passwd" else."""
    for line in (_read_optional(backend, "/etc/passwd") or "").splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2] == str(uid):
            return f"user {fields[0]}"
    return "not in /etc/passwd"


def _posix_holder(backend: Backend, pname: str) -> str:
    """Why /dev/shm/``pname``, which exists, is no region of this user's (a FIFO,
    another user's file), and what to do; "" when it may be one."""
    try:
        fd = backend.call("shm_open", pname, getattr(os, "O_PATH", 0), 0)  # any owner, any mode
    except OSError as err:
        if err.errno == errno.EINVAL:  # a FIFO, symlink, device...
            return "it is not a region (not a regular file): use another name"
        return f"cannot look at it ({err.strerror or err}): use another name"
    try:
        uid = backend.call("fstat", fd).uid
    except OSError as err:
        return f"cannot look at it ({err.strerror or err}): use another name"
    finally:
        backend.call("close", fd)
    if uid != backend.call("geteuid"):
        return (
            f"it belongs to uid {uid} ({_user_name(backend, uid)}), not to this user "
            f"(uid {backend.call('geteuid')}): cleanup never removes another user's file; use "
            f"another name, or ask that user (or root) to remove /dev/shm/{pname}"
        )
    return ""


def _process_name(backend: Backend, pid: str) -> str:
    """``pid`` with its command and real uid, as far as /proc shows them."""
    comm = (_read_optional(backend, f"/proc/{pid}/comm") or "?").strip()
    uid = "?"
    for line in (_read_optional(backend, f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("Uid:") and len(line.split()) > 1:
            uid = line.split()[1]
    return f"pid {pid} ({comm!r}, uid {uid})"


def _lock_holder(backend: Backend, fd: int) -> str:
    """Who holds the exclusive flock on file ``fd``, from /proc/locks (fs/locks.c
    lock_get_status: "ID: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE START END")."""
    st: ShmStat = backend.call("fstat", fd)
    want = f"{os.major(st.dev):02x}:{os.minor(st.dev):02x}:{st.ino}"
    for line in (_read_optional(backend, "/proc/locks") or "").splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1:4] == ["FLOCK", "ADVISORY", "WRITE"] and fields[5] == want:
            return _process_name(backend, fields[4])
    return "a process not listed in this namespace's /proc/locks"


# A cleanup judging a /dev/shm file holds its exclusive lock for milliseconds; anyone
# who can open the file (every user, for a 0644 region) can hold one for ever.
_LOCK_WAIT = 5.0


def _flock_shared(backend: Backend, fd: int, what: str) -> None:
    """flock(LOCK_SH) on region file ``fd``, waiting at most _LOCK_WAIT seconds for
    an exclusive lock to go; TimeoutError naming its holder after that."""
    import time

    deadline = time.monotonic() + _LOCK_WAIT
    while True:
        try:
            backend.call("flock", fd, LOCK_SH | LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                break
        time.sleep(0.01)
    raise TimeoutError(
        errno.ETIMEDOUT,
        f"{what}: exclusively locked for {_LOCK_WAIT:g} s by {_lock_holder(backend, fd)}; "
        "a region's users take shared locks only: stop that process",
    )


_ATTACH_POLL = 0.05  # seconds between attach(wait=...)'s tries
_REUSE_WAIT = 60.0  # create(existing="reuse"): seconds to wait for a peer making it


def _check_made_after(rec: Mapping[str, Any], after: Optional[float], what: str) -> None:
    """FileNotFoundError when record ``rec`` says its region was made before ``after``
    (attach's ``created_after``): an earlier run's region is not the one awaited."""
    if after is None:
        return
    made = _seconds(rec.get("created"))
    if made is None or made < after:
        raise FileNotFoundError(
            errno.ENOENT,
            f"{what} was made at {made} (time.time()), before created_after={after}: "
            "an earlier run's region, not this run's",
        )


def _waiting(attach_once: Callable[[], Any], wait: float, what: str) -> Any:
    """attach_once() until it finds the region (FileNotFoundError: not made yet), for
    at most ``wait`` seconds; TimeoutError then, saying why the last try failed."""
    import time

    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0:
        raise ValueError(f"wait={wait!r}: a number of seconds >= 0")
    deadline = time.monotonic() + wait
    while True:
        try:
            return attach_once()
        except FileNotFoundError as err:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    errno.ETIMEDOUT, f"{what} not made within {wait:g} s: {err.strerror or err}"
                ) from None
        time.sleep(min(_ATTACH_POLL, max(deadline - time.monotonic(), 0)))


def _vma_entry(backend: Backend, addr: int) -> Optional[NumaMapsEntry]:
    """This process's numa_maps line of the VMA starting at ``addr``; None when there
    is no numa_maps (a kernel without NUMA) or no such line."""
    try:
        text = backend.read_text(_maps_path("self"))
    except OSError:
        return None
    first, last = _line_at(text, addr)
    if last <= first:
        return None
    try:
        entry = _parse_maps_line(text[first:last], _page_kb(backend))
    except ValueError:
        return None
    if entry.start != addr:
        return None
    return entry


def _record_page_check(backend: Backend, addr: int, kind: str, page: int, what: str) -> None:
    """ValueError unless ``page``, a record's page_size, is the page the kernel maps the
    region at ``addr`` with.  mbind and prefault are aimed by it: a forged one would
    aim them outside the mapping."""
    vma = None
    if kind == "sysv":
        vma = _vma_entry(backend, addr)
    base = backend.page_size
    aligned = addr % page == 0
    big = page > base and aligned  # a huge page aligns its mapping
    if vma is not None and vma.huge:
        ok = big
        if vma.pages_total:
            # numa_maps prints a hugetlb VMA's page size once a page is in.
            ok = big and vma.page_size_kb * 1024 == page
    elif vma is None and kind == "sysv":
        # No numa_maps (a kernel without NUMA): base pages or an aligned huge page.
        ok = big or page == base
    else:
        # A /dev/shm file (tmpfs), a SysV segment numa_maps does not call huge.
        ok = page == base
    if not ok:
        raise ValueError(f"{what}: damaged identity record (page_size: not the mapping's)")


def _room_apply(backend: Backend, addr: int, length: int, lay: Layout) -> None:
    """Set the policy of the record's room, [addr, addr+length), in every process that
    maps it: preferred on the
    lowest usable node of those the data's last extent names (else those any extent
    names, else any usable node), so it sits where a bind allows; and never the last
    extent's own policy (bind there when that extent prefers the same node): a VMA
    merges with a neighbour of the same policy, and numa_maps would count the room as
    data.  Where policies are denied (EPERM, ENOSYS, a saved tree) the data's results
    say so already; the room's page then lands as the data's would."""
    mem, allowed, _ = _memory_nodes(backend)
    usable = mem & allowed
    if not usable:
        return
    if not backend.abi.supported:
        return
    last = lay[len(lay) - 1]
    named = last.nodes or lay.nodes or usable
    mine = named & usable
    node = min(mine or named)
    mode = Mode.PREFERRED
    if last.policy == "prefer" and last.nodes == {node}:
        mode = Mode.BIND
    try:
        mbind(addr, length, mode, [node], backend=backend)
    except OSError as err:
        import logging

        logging.getLogger(__name__).debug("numa_utils: record room policy: %s", err)


# A huge-page (SHM_HUGETLB) region keeps no room after its data: that room would cost
# one more huge page (a 1 GiB region on 1 GiB pages took 2 GiB, and a reservation of
# exactly its pages passed fit() and failed in create).  Its room, the same 16 KiB of
# base pages in the same format (slot first, record last), is a SysV segment of its
# own, the record segment, under the key record_segment_key gives: "O" (0x4f) in the top 8
# bits, the data segment's key's low 24 bits below.  Names take 0x4exxxxxx keys, so two
# named regions' record segments never collide; an int key whose low 24 bits another
# region's key shares finds its record key taken (FileExistsError), and an int key of
# the 0x4fxxxxxx family cannot hold huge pages.  Its record names the data's key
# ("data_key"): a record segment serves only the segment under that key.  Order, so
# that every crash leaves what cleanup can judge: the record segment is made first,
# with the record marked being made ("making": true; an attacher sees no record yet,
# cleanup sees its creator), then the data segment, then the record proper once the
# policies are set; removal takes the data first, the record segment last.  A data
# segment under a key never lives without its record segment, except when someone
# removed that by hand (attach then says so; a huge page's tail is never read).
_COMPANION_PREFIX = 0x4F000000


def record_segment_key(ikey: int) -> int:
    """The SysV key of the record segment of the huge-page SysV region under key
    ``ikey``: such a region's identity record is kept out of its huge pages, in a
    small segment of its own (what `maps` and `cleanup` look for)."""
    return _COMPANION_PREFIX | ikey & ~SYSV_KEY_MASK & 0xFFFFFFFF


def _room_rmid(backend: Backend, shmid: int) -> None:
    """Remove record segment ``shmid`` (-1: none); gone already is no error."""
    try:
        if shmid >= 0:
            backend.call("shm_rmid", shmid)
    except OSError as err:
        if err.errno not in (errno.ENOENT, errno.EINVAL, errno.EIDRM):
            raise


def _huge_vma(backend: Backend, addr: int) -> Optional[bool]:
    """Whether this process maps huge pages (hugetlb) at ``addr``, as numa_maps says;
    None without numa_maps (a kernel without NUMA)."""
    vma = _vma_entry(backend, addr)
    if vma is None:
        return None
    return vma.huge


def _own_segment(backend: Backend, ikey: int) -> Optional[ShmStat]:
    """The SysV segment under key ``ikey`` when this user owns and created it; None
    when there is none, or it is another user's (or one it cannot see)."""
    try:
        st: ShmStat = backend.call("shm_stat", backend.call("shmget", ikey, 0, 0))
    except (FileNotFoundError, PermissionError):
        return None
    euid = backend.call("geteuid")
    if st.uid != euid or st.cuid != euid:
        return None
    return st


def _room_peek(
    backend: Backend, ckey: int
) -> Tuple[Optional[ShmStat], Optional[Dict[str, Any]], bytes, bool]:
    """(its stat, record, last-use slot, made) of this user's record segment under
    SysV key ``ckey``, read through a read-only attach; the stat None when there is
    none of this user's, the record None when it is no record segment; ``made`` False
    while its record is being made.  ValueError when damaged."""
    st = _own_segment(backend, ckey)
    if st is None:
        return None, None, b"", False
    what = f"SysV segment 0x{ckey:08x} (shmid {st.id})"
    addr = backend.call("shmat", st.id, SHM_RDONLY)
    try:
        rec = _record_read(addr, st.size, what)
        if rec is None or "data_key" not in rec:
            return st, None, b"", False
        return st, rec, ctypes.string_at(addr, _SLOT.size), not rec.get("making")
    finally:
        backend.call("shmdt", addr)


def _peek_region(
    backend: Backend, st: ShmStat, what: str, making: bool = False
) -> Tuple[Optional[Dict[str, Any]], bytes]:
    """The identity record and last-use slot (_slot_bytes) of SysV segment ``st``, read
    through read-only attaches, which write neither: a huge-page segment's from its
    record segment (``making``: a record being made too), whose data_key names it.
    A huge-page segment's own bytes are never read: a read faults a huge page in."""
    try:
        _, rec, slot, made = _room_peek(backend, record_segment_key(st.key))
    except ValueError:  # damaged: judged by its own row
        rec = None
    if rec is not None and rec["data_key"] == st.key and st.key:
        if made or making:
            return rec, slot
        return None, b""
    addr = backend.call("shmat", st.id, SHM_RDONLY)
    try:
        if _huge_vma(backend, addr):
            return None, b""
        rec = _record_read(addr, st.size, what)
        return rec, _slot_bytes(addr, st.size, rec)
    finally:
        backend.call("shmdt", addr)


def _room_holder(backend: Backend, ckey: int, key: Union[int, str]) -> str:
    """'' when region ``key`` may pass SysV key ``ckey`` (a record segment's key) by:
    another user's segment, another region's record segment; else why not."""
    what = f"SysV key 0x{ckey:08x}, the key of the record segment,"
    try:
        st, rec, _, _ = _room_peek(backend, ckey)
    except ValueError as err:
        return f"{err}; `ipcrm -M 0x{ckey:08x}` removes it"
    except OSError as err:
        return f"{what} is taken: {err.strerror or err}"
    if st is None:
        return ""
    if rec is None:
        return (
            f"{what} is taken by a segment without a numa_utils record: another "
            f"program's; `ipcs -m -i {st.id}` shows it"
        )
    if rec["kind"] == "sysv" and _same_key(rec["key"], key):
        return (
            f"region {key!r} exists or is being made ({what} shmid {st.id}): attach it, "
            f"or if its owner died, nu.cleanup({key!r}, remove=True) (the cleanup "
            f"command: `cleanup --remove --key {_key_arg(key)}`) removes it"
        )
    if isinstance(key, int):  # an int key has no other key to try
        return f"{what} holds region {rec['key']!r}'s record: use another key"
    return ""


def _check_trust(st: ShmStat, euid: int, trust: bool, what: str) -> None:
    if trust:
        return
    if {st.uid, st.cuid} != {euid}:
        why = f"belongs to uid {st.uid} (created by uid {st.cuid}), not to this user (uid {euid})"
    elif st.mode & 0o022:
        why = f"has mode {st.mode & 0o777:03o}: other users can write it"
    else:
        return
    raise PermissionError(errno.EPERM, f"{what} {why}; pass trust=True to attach anyway")


class _RecordRoom:
    """What a SharedRegion keeps of its record's room: after the data, or a huge-page
    region's record segment (see record_segment_key): its shmid, address and bytes."""

    _b: Backend
    _layout: Layout
    _key: Union[int, str]
    _ipc_key: int
    _address: int
    _size: int
    _mapped: int
    kind: str
    shmid: int
    identity: Dict[str, Any]
    _room_id, _room_at, _room_len = -1, 0, 0  # no record segment (yet)

    def _room(self) -> Tuple[int, int]:
        """(address, bytes) of the record's room."""
        if self._room_id >= 0:
            return self._room_at, self._room_len
        return self._address + self._size, self._mapped - self._size

    def _room_close(self) -> None:
        """Detach the record segment, when mapped."""
        if self._room_at:
            at, self._room_at = self._room_at, 0
            self._b.call("shmdt", at)

    def _room_make(self, ikey: int, mode: int) -> str:
        """Make the record segment of this huge-page region for data key ``ikey``, its
        record marked being made; "" when made, or when another region's record
        segment holds its key (none made: _room_id stays -1); else why the key is not
        to be passed by."""
        b = self._b
        ckey = record_segment_key(ikey)
        size = _room_size(b.page_size)
        try:
            shmid = b.call("shmget", ckey, size, IPC_CREAT | IPC_EXCL | mode)
        except FileExistsError:
            return _room_holder(b, ckey, self._key)
        self._room_id, self._room_len = shmid, size
        self._room_at = b.call("shmat", shmid)
        _room_apply(b, self._room_at, size, self._layout)  # before its pages are touched
        self.identity["data_key"] = ikey
        _record_write(self._room_at, size, dict(self.identity, making=True))
        return ""

    def _room_attach(self, trust: bool) -> None:
        """Map the record segment of the segment under SysV key _ipc_key, when there
        is one (a huge-page region's: see record_segment_key)."""
        b = self._b
        ckey = record_segment_key(self._ipc_key)
        try:
            shmid = b.call("shmget", ckey, 0, 0)
        except FileNotFoundError:
            return
        st: ShmStat = b.call("shm_stat", shmid)
        _check_trust(st, b.call("geteuid"), trust, f"SysV segment 0x{ckey:08x} (shmid {shmid})")
        self._room_id, self._room_len = shmid, st.size
        self._room_at = b.call("shmat", shmid)

    def _room_record(self, seg: int, what: str) -> Optional[Dict[str, Any]]:
        """The record in the record segment when it is the one of the ``seg``-byte data
        segment (else the segment is let go: another's).  Its data_key and size must be
        the data segment's own."""
        room = f"{what}, its record segment 0x{record_segment_key(self._ipc_key):08x}"
        rec = _record_read(self._room_at, self._room_len, room)
        if rec is None or rec.get("data_key") != self._ipc_key:
            self._room_close()
            self._room_id = -1
            return self._own_record(seg, what)
        if rec.get("making"):
            return None  # being made
        if rec["size"] != seg:
            raise ValueError(f"{room}: damaged identity record (size {rec['size']}, not {seg})")
        return rec

    def _own_record(self, seg: int, what: str) -> Optional[Dict[str, Any]]:
        """The identity record ending the ``seg`` mapped bytes (none while unmapped);
        ValueError for a huge-page SysV segment, whose record segment is missing (its
        bytes are never read: a read would fault a huge page in)."""
        if not self._address:
            return None
        if self.kind == "sysv" and _huge_vma(self._b, self._address):
            room_key = record_segment_key(self._ipc_key)
            raise ValueError(
                f"{what} holds huge pages and its record segment (SysV key "
                f"0x{room_key:08x}) is missing: removed by hand? Nothing can "
                f"attach it; `ipcrm -m {self.shmid}` removes it"
            )
        return _record_read(self._address, seg, what)


_HELD_SIGNALS = ("SIGINT", "SIGTERM")


def _csignal() -> Any:
    """The C signal module: signal.pthread_sigmask is a Python wrapper (enum
    conversion), at whose entry a pending signal would strike before the mask is set
    (measured: 1-4 leaks per 2,000 storm-interrupted creates on Python 3.8-3.10)."""
    try:
        import _signal  # type: ignore[import-not-found]

        return _signal
    except ImportError:  # not CPython
        import signal

        return signal


def _hold_signals() -> Optional[Tuple[Any, Callable[[], Any]]]:
    """Block SIGINT and SIGTERM in the main thread (Python runs handlers only there):
    (the old mask, a C-only callable that blocks them again); None off the main
    thread, where no KeyboardInterrupt can be raised.  A handler already due runs in
    this call (the C call checks for signals after setting the mask), so from its
    return nothing can interrupt until the release."""
    import functools

    sig = _csignal()
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        sig, "pthread_sigmask"
    ):
        return None
    block = functools.partial(
        sig.pthread_sigmask, sig.SIG_BLOCK, [getattr(sig, n) for n in _HELD_SIGNALS]
    )
    return block(), block


def _run_pending(held: Optional[Tuple[Any, Callable[[], Any]]]) -> None:
    """Handle, with SIGINT/SIGTERM still blocked, one that came while they were: the
    handler runs here and what it raises is undone by the caller with nothing let go.
    (Released first, it would strike a few bytecodes later, and a second signal
    within the undo's first bytecodes leaked the object: about 1 in 100 storms.)"""
    sig = _csignal()
    if held is None or not hasattr(sig, "sigpending"):
        return
    pending = sig.sigpending()
    for n in _HELD_SIGNALS:
        num = getattr(sig, n)
        if num not in pending:
            continue
        handler = sig.getsignal(num)
        if not callable(handler):
            # SIG_DFL: the release kills the process; undo before it does.
            raise InterruptedError(errno.EINTR, f"{n} while making a region")
        sig.sigtimedwait([num], 0)  # taken: not delivered again
        handler(num, sys._getframe(1))


def _release_signals(held: Optional[Tuple[Any, Callable[[], Any]]]) -> None:
    """Restore the mask: a signal that came meanwhile is handled now (KeyboardInterrupt
    is raised from this call, inside the caller's undo scope)."""
    if held is not None:
        sig = _csignal()
        sig.pthread_sigmask(sig.SIG_SETMASK, held[0])


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except OSError as err:
        import logging

        logging.getLogger(__name__).debug(
            "numa_utils: cleanup %s%r failed: %s", fn.__name__, args, err
        )


def _undo(held: Optional[Tuple[Any, Callable[[], Any]]], region: SharedRegion) -> None:
    """Undo a half-made (or half-attached) region: remove() the one made here, close()
    it, with SIGINT and SIGTERM blocked again, then let them go.  An interrupt that
    lands before the block (a second Ctrl-C within a few bytecodes of the first)
    restarts it: remove() and close() record what they did, so neither acts twice."""
    try:
        while True:
            try:
                if held is not None:
                    held[1]()
                if region.created:
                    _quietly(region.remove)
                _quietly(region.close)
                return
            except (KeyboardInterrupt, SystemExit):
                continue
    finally:
        _release_signals(held)


_REPLACE_TRIES = 20  # create(existing="replace"): looks at a region "in use" (1 s)


# -- which regions are stale: what `cleanup` lists and removes ----------------------
# `cleanup` removes a region only after nobody used it for this long (besides proof
# that its users are gone): `region --keep` hands a region over with nobody attached.
CLEANUP_MIN_AGE = 30.0


def _ns_name(number: int) -> str:
    return f"pid:[{number}]" if number else "?"


def _gone_why(
    backend: Backend,
    who: str,
    proc: Mapping[str, Any],
    me: Mapping[str, Any],
    pid_here: Optional[int] = None,
) -> str:
    """'' when process ``proc`` (as _who gives it, from a record or the last-use slot)
    is provably gone, else why it may be alive.  ``pid_here``: its pid as this PID
    namespace sees it (the kernel's shm_cpid); else ``proc``'s pid counts only in the
    PID namespace it was written in.  A start time read in another time namespace
    (CRIU, `unshare --time`) differs from ours for the same process: it proves nothing."""
    if proc["boot"] and me["boot"] and proc["boot"] != me["boot"]:
        return ""  # before the last boot
    pid = pid_here
    if pid is None:
        pid = proc["pid"]
        if type(pid) is not int or not 0 < pid <= _PID_MAX:
            return f"{who}'s pid {_short(repr(pid), 30)} is not a process id: damaged record"
        if not me["pidns"] or proc["pidns"] != me["pidns"]:
            return (
                f"{who} (pid {pid}) is in another PID namespace "
                f"({_ns_name(proc['pidns'])}): it may be alive"
            )
    if pid <= 0:
        return f"{who} is not visible from this PID namespace: it may be alive"
    if pid == me["pid"]:
        return f"{who} (pid {pid}) is this process"
    now = backend.call("pid_start", pid)
    if now is None:
        return ""
    if not proc["start"] or not now or now == proc["start"]:
        return f"{who} (pid {pid}) is alive"
    if proc["timens"] == me["timens"]:
        return ""  # another process under its pid
    return (
        f"{who} (pid {pid}) may be alive: it is in another time namespace, "
        "where start times read differently"
    )


def _idle_why(
    backend: Backend,
    rec: Mapping[str, Any],
    raw_slot: bytes,
    me: Mapping[str, Any],
    now: float,
    min_age: float,
    cpid: Optional[int] = None,
) -> str:
    """'' when the region of record ``rec`` and last-use slot ``raw_slot`` is proven
    idle: last used (made, without a slot) ``min_age`` seconds ago or more, and its
    creator and last user gone.  ``cpid``: the kernel's shm_cpid (SysV)."""
    try:
        slot = _slot_read(raw_slot)
    except ValueError as err:
        return f"{err}: attaching and closing it rewrites it"
    if slot is None:
        made = _seconds(rec.get("created"))
        age = 0.0 if made is None else now - made
        if age < min_age:
            return f"created {max(age, 0):.0f} s ago (minimum age {min_age:g} s)"
    else:
        idle = now - slot["used"]
        if idle < min_age:
            return f"used {max(idle, 0):.0f} s ago (minimum age {min_age:g} s)"
    why = _gone_why(backend, "creator", _who(rec), me, cpid)
    if why or slot is None:
        return why
    return _gone_why(backend, "last user", slot, me)


def _sysv_verdict(
    backend: Backend,
    st: ShmStat,
    keys: Optional[Sequence[Union[int, str]]],
    me: Mapping[str, Any],
    now: float,
    min_age: float,
) -> Tuple[str, Optional[Dict[str, Any]]]:
    """('' when segment ``st`` is proven stale, else why it is kept; its record).
    Reading the record attaches for a moment, which changes shm_atime, shm_dtime and
    shm_lpid: idleness is judged from the last-use slot, which only numa_utils'
    own attach and close write."""
    what = f"SysV segment 0x{st.key:08x} (shmid {st.id})"
    try:
        rec, slot = _peek_region(backend, st, what, making=True)
    except (OSError, ValueError) as err:
        return f"identity record unreadable: {err}", None
    if rec is None:
        return "no numa_utils identity record: not made by SharedRegion.create", None
    try:
        mine = rec["kind"] == "sysv" and st.key in _sysv_keys(rec["key"])
    except ValueError:
        mine = False
    if not mine:
        return f"its identity record names {rec['kind']} region {rec['key']!r}", rec
    if keys is not None and not any(_same_key(rec["key"], k) for k in keys):
        return f"holds region {rec['key']!r}, not one asked for", rec
    if st.nattch:
        return f"in use: {st.nattch} attached", rec
    return _idle_why(backend, rec, slot, me, now, min_age, st.cpid), rec


def _posix_verdict(
    backend: Backend,
    fd: int,
    st: ShmStat,
    name: str,
    users: int,
    me: Mapping[str, Any],
    now: float,
    min_age: float,
) -> Tuple[str, Optional[Dict[str, Any]]]:
    """As _sysv_verdict for the /dev/shm file open at ``fd``; when stale, the
    exclusive lock taken stays held (until ``fd`` is closed) for the removal."""
    rec, slot = None, b""
    if st.size >= _RECORD_END.size:
        try:
            addr = backend.call("mmap", st.size, fd)
            try:
                rec = _record_read(addr, st.size, f"/dev/shm/{name}")
                slot = _slot_bytes(addr, st.size, rec)
            finally:
                backend.call("munmap", addr, st.size)
        except (OSError, ValueError) as err:
            return f"identity record unreadable: {err}", None
    if rec is None:
        return (
            "no numa_utils identity record: not made by SharedRegion.create, or being made"
        ), None
    try:
        mine = rec["kind"] == "posix" and _posix_name(rec["key"]) == name
    except ValueError:
        mine = False
    if not mine:
        return f"its identity record names {rec['kind']} region {rec['key']!r}", rec
    if users:
        return f"in use: mapped by {users} process(es)", rec
    try:
        backend.call("flock", fd, LOCK_EX | LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return "in use: a process holds its lock", rec
        return f"cannot lock it: {err.strerror or err}", rec
    return _idle_why(backend, rec, slot, me, now, min_age), rec


_DATA_JUDGES = "its data segment's row judges it"


def _room_row(
    backend: Backend,
    st: ShmStat,
    keys: Optional[Sequence[Union[int, str]]],
    want: Optional[Set[int]],
    me: Mapping[str, Any],
    now: float,
    min_age: float,
) -> Optional[Tuple[str, Optional[Dict[str, Any]]]]:
    """Cleanup's verdict on segment ``st`` when it is a record segment (see
    record_segment_key) of ``keys`` (or, with none, under a 0x4fxxxxxx key): _DATA_JUDGES
    while its data segment lives; once that is gone (a creator that died before
    making it, or between the two removals), '' when proven stale as a region is:
    nobody attached, unused for ``min_age``, its creator and last user gone.  None
    when it is no record segment."""
    if want is None and st.key & SYSV_KEY_MASK != _COMPANION_PREFIX:
        return None
    if want is not None and st.key not in want:
        return None
    try:
        now_st, rec, slot, made = _room_peek(backend, st.key)
    except (OSError, ValueError):
        return None  # gone, or no record segment of ours to judge
    if now_st is None or rec is None or now_st.id != st.id:
        return None
    if keys is not None and not any(_same_key(rec["key"], k) for k in keys):
        return f"holds region {rec['key']!r}, not one asked for", rec
    data = rec["data_key"]
    try:
        backend.call("shmget", data, 0, 0)
        return _DATA_JUDGES, rec
    except FileNotFoundError:
        pass
    except OSError:
        return _DATA_JUDGES, rec
    gone = f"record segment of region {rec['key']!r}, whose data segment (0x{data:08x}) is gone"
    if st.nattch:
        return f"{gone}: in use: {st.nattch} attached", rec
    if not made:
        slot = b""  # a record being made has no last use
    why = _idle_why(backend, rec, slot, me, now, min_age, st.cpid)
    if why:
        return f"{gone}: {why}", rec
    return "", rec


def _room_drop(backend: Backend, ikey: int) -> None:
    """Remove the record segment of the segment that was under SysV key ``ikey``."""
    try:
        st, rec, _, _ = _room_peek(backend, record_segment_key(ikey))
    except ValueError:
        return  # damaged: its own row says so
    if st is not None and rec is not None and rec["data_key"] == ikey:
        _room_rmid(backend, st.id)


def _dev_shm_users(backend: Backend, files: Mapping[str, ShmStat]) -> Dict[str, int]:
    """How many processes map each /dev/shm file (from /proc/<pid>/maps).

    Matched by device and inode, not by name: the name field escapes only "\\n"
    and appends " (deleted)", so "x (deleted)" or a name with a newline cannot be
    told from another file's; and a mapping of a removed file of the same name is
    another inode."""
    import collections

    want = {
        (f"{os.major(st.dev):02x}:{os.minor(st.dev):02x}", str(st.ino)): name
        for name, st in files.items()
    }
    counts: collections.Counter[str] = collections.Counter()
    try:
        pids = [p for p in backend.listdir("/proc") if p.isascii() and p.isdigit()]
    except OSError:
        return counts
    for pid in pids:
        text = _read_optional(backend, f"/proc/{pid}/maps")
        if not text or "/dev/shm/" not in text:
            continue
        seen = set()
        for line in text.splitlines():
            fields = line.split(None, 5)
            if (
                len(fields) == 6
                and fields[5].startswith("/dev/shm/")
                and (fields[3], fields[4]) in want
            ):
                seen.add(want[fields[3], fields[4]])
        counts.update(seen)
    return counts


def _action(why: str, remove: bool) -> str:
    """What cleanup did with a region kept for ``why`` ('' when stale)."""
    if why.startswith("failed"):
        return why
    if why:
        return "keep"
    if remove:
        return "removed"
    return "would remove"


def _region_fields(rec: Optional[Dict[str, Any]], size: int) -> Dict[str, Any]:
    """A cleanup row's region, size and layout: from its record, or (none read) the
    segment's own ``size``."""
    if not rec:
        return {"region": None, "size": size, "layout": None}
    return {"region": rec["key"], "size": rec["size"], "layout": rec.get("layout")}


def _our_segments(
    backend: Backend,
    keys: Optional[Sequence[Union[int, str]]] = None,
    *,
    remove: bool = False,
    min_age: float = CLEANUP_MIN_AGE,
    kind: Optional[str] = None,
) -> List[Dict[str, Any]]:
    """Our regions on this machine (of ``kind`` only, if given), each with a verdict:
    ``stale`` when proven unused, else ``why`` it is kept; ``remove=True`` removes
    the stale ones (``action``).

    Proof, all of it: nobody attached (SysV nattch) or holding the file's lock
    (POSIX: every user holds a shared flock); unused for ``min_age`` seconds and its
    last user gone, as its last-use slot says (written by numa_utils' attach and
    close; this look writes nothing there); its creator gone (shm_cpid, or the
    record's pid with its start time, PID and time namespaces); and an identity
    record saying it is the region of its key.  A pid not visible here is no proof,
    nor a start time read in another time namespace.  Listed: SysV keys
    0x4exxxxxx and /dev/shm/numa_utils-* owned (SysV: also created) by this user;
    ``keys`` (names or int keys): only their regions, under any key."""
    import time

    euid, me, now = backend.call("geteuid"), _who(backend.call("whoami")), time.time()
    want_sysv = None
    want_posix = None
    if keys is not None:
        want_sysv = {k for key in keys for k in _sysv_keys(key)}
        want_posix = {_posix_name(k) for k in keys}
    out: List[Dict[str, Any]] = []

    def verdict(row: Dict[str, Any], why: str, drop: Callable[[], str]) -> None:
        row["stale"] = not why
        if not why and remove:
            why = drop()
        row["why"] = why
        row["action"] = _action(why, remove)
        out.append(row)

    sysv_rows = ""
    if kind != "posix":
        sysv_rows = _read_optional(backend, "/proc/sysvipc/shm") or ""
    want_rooms = None
    if want_sysv is not None:
        want_rooms = {record_segment_key(k) for k in want_sysv}
    for st in parse_sysvipc_shm(sysv_rows):
        if st.uid != euid or st.cuid != euid or not st.key:
            continue
        if want_sysv is None:
            listed = st.key & SYSV_KEY_MASK == SYSV_KEY_PREFIX
        else:
            listed = st.key in want_sysv
        room = _room_row(backend, st, keys, want_rooms, me, now, min_age)
        if room is not None:  # a record segment: its data's row judges it, or its own
            why, rec = room
        elif not listed:
            continue
        else:
            try:
                why, rec = _sysv_verdict(backend, st, keys, me, now, min_age)
            except (ValueError, TypeError, OverflowError) as err:  # one line, and on
                why, rec = f"cannot judge it: {err}", None
        if why == _DATA_JUDGES:
            continue

        def drop(st: ShmStat = st) -> str:
            try:
                again: ShmStat = backend.call(
                    "shm_stat", st.id
                )  # someone may have come since: look last
                if again.nattch or again.key != st.key or again.lpid not in (st.lpid, me["pid"]):
                    return "in use: attached since it was judged"
                backend.call("shm_rmid", st.id)
                _room_drop(backend, st.key)  # its record segment, if any: the data is gone
            except OSError as err:
                return f"failed: {err.strerror or err}"
            return ""

        verdict(
            {
                "kind": "sysv",
                "key": f"0x{st.key:08x}",
                "shmid": st.id,
                **_region_fields(rec, st.size),
                "mode": f"{st.mode & 0o777:03o}",
                "attached": st.nattch,
            },
            why,
            drop,
        )
    names: List[str] = []
    try:
        if kind != "sysv":
            names = sorted(
                n
                for n in backend.listdir("/dev/shm")
                if n.startswith(POSIX_PREFIX) and (want_posix is None or n in want_posix)
            )
    except OSError:
        pass
    files: Dict[str, Tuple[int, ShmStat]] = {}
    try:
        for name in names:
            try:
                fd = backend.call("shm_open", name, os.O_RDWR, 0)
            except OSError:
                continue  # gone, or not a regular file: not a region
            try:
                fst: Optional[ShmStat] = backend.call("fstat", fd)
            except OSError:
                fst = None
            if fst is None or fst.uid != euid:
                backend.call("close", fd)
                continue
            files[name] = (fd, fst)
        users: Dict[str, int] = {}
        if files:
            users = _dev_shm_users(backend, {n: st for n, (_, st) in files.items()})
        for name, (fd, st) in files.items():
            try:
                why, rec = _posix_verdict(
                    backend, fd, st, name, users.get(name, 0), me, now, min_age
                )
            except (ValueError, TypeError, OverflowError) as err:  # one line, and on
                why, rec = f"cannot judge it: {err}", None

            def unlink(name: str = name) -> str:
                try:
                    backend.call("shm_unlink", name)  # under the exclusive lock: nobody came
                except OSError as err:
                    return f"failed: {err.strerror or err}"
                return ""

            verdict(
                {
                    "kind": "posix",
                    "name": name,
                    "path": f"/dev/shm/{name}",
                    **_region_fields(rec, st.size),
                    "mode": f"{st.mode & 0o777:03o}",
                    "attached": users.get(name, 0),
                },
                why,
                unlink,
            )
    finally:
        for fd, _ in files.values():
            _quietly(backend.call, "close", fd)
    return out


def _replace_stale(backend: Backend, key: Union[int, str], kind: str) -> None:
    """Remove region ``key`` of ``kind`` for create(existing="replace") when cleanup's
    proof says it is stale; FileExistsError saying why not when it is not."""
    import time

    for attempt in range(_REPLACE_TRIES):
        rows = _our_segments(backend, [key], remove=True, min_age=0, kind=kind)
        held = [row for row in rows if _same_key(row["region"], key)]
        held = [row for row in held if row["action"] != "removed"]
        if not held:
            return
        # A worker waiting with attach(created_after=) maps the old region for the
        # moment it takes to read its record: "in use" may be that; look again.
        if not held[0]["why"].startswith("in use") or attempt == _REPLACE_TRIES - 1:
            break
        time.sleep(_ATTACH_POLL)
    raise FileExistsError(
        errno.EEXIST,
        f"region {key!r} exists and is not proven stale ({held[0]['why']}): "
        "existing='replace' removes only a stale one",
    )


def _prog() -> str:
    """The command the user typed, for messages and hints: "numa-utils" (the
    installed script), "python3 -m numa_utils" (or a vendored copy's module path),
    "python3 numa_utils.py"."""
    py = os.path.basename(sys.executable or "") or "python3"
    script = ""
    if sys.argv and sys.argv[0]:
        script = sys.argv[0]
    if __name__ == "__main__":
        if __spec__ is not None and __spec__.name:
            return f"{py} -m {__spec__.name}"
        return f"{py} {script or 'numa_utils.py'}"
    argv0 = os.path.basename(script)
    if argv0 in ("numa-utils", "numa_utils"):
        return argv0
    return f"{py} -m {__name__}"


def _sysv_holder(backend: Backend, ikey: int, key: Union[int, str]) -> str:
    """'' when region ``key`` may take SysV key ``ikey`` or pass it by (free, another
    user's, another region's by its record); else why not, saying what to do."""
    st = _own_segment(backend, ikey)
    if st is None:
        return ""
    what = f"SysV key 0x{ikey:08x} (shmid {st.id})"
    try:
        rec = _peek_region(backend, st, what)[0]
    except ValueError as err:
        return f"{err}; `ipcrm -m {st.id}` removes it"
    except OSError as err:
        return f"{what}: cannot read its identity record: {err.strerror or err}"
    if rec is None:
        return (
            f"{what} is taken by a segment without a numa_utils identity record: "
            f"another program's, or {key!r} being created right now; "
            f"`ipcs -m -i {st.id}` shows it"
        )
    if rec["kind"] == "sysv" and _same_key(rec["key"], key):
        return (
            f"region {key!r} exists ({what}): attach it, or if its owner died, "
            f"`{_prog()} cleanup --remove --key {_key_arg(key)}` removes it"
        )
    return ""


def _sysv_create(region: SharedRegion, flags: int, replace: bool) -> None:
    """Make the segment of region ``r.key`` under the first of its keys free for it
    (``replace``: after removing a stale one)."""
    b, key = region._b, region._key
    if replace:
        _replace_stale(b, key, "sysv")
    keys = _sysv_keys(key)
    for ikey in keys:
        if flags & SHM_HUGETLB:  # its record segment first (see record_segment_key)
            why = region._room_make(ikey, flags & 0o777)
            if why:
                raise FileExistsError(errno.EEXIST, why)
            if region._room_id < 0:  # another region's record segment holds its key
                continue
        try:
            region.shmid = b.call("shmget", ikey, region._mapped, flags)
            break
        except FileExistsError:
            region._room_close()
            _room_rmid(b, region._room_id)
            region._room_id = -1
            why = _sysv_holder(b, ikey, key)
            if why:
                raise FileExistsError(errno.EEXIST, why) from None
    else:
        raise FileExistsError(
            errno.EEXIST,
            f"the {len(keys)} SysV keys of {key!r} (0x"
            f"{keys[0]:08x}, ...) all hold other regions: use another name",
        )
    region._ipc_key = ikey
    region._address = b.call("shmat", region.shmid)


def _posix_create(region: SharedRegion, flags: int, replace: bool) -> None:
    """Make /dev/shm/numa_utils-``r.key`` with the permission bits of ``flags``
    (``replace``: after removing a stale one)."""
    b, pname = region._b, _posix_name(region._key)
    if replace:
        _replace_stale(b, region._key, "posix")
    try:
        region._fd = fd = b.call(
            "shm_open", pname, os.O_RDWR | os.O_CREAT | os.O_EXCL, flags & 0o777
        )
    except FileExistsError:
        why = _posix_holder(b, pname) or (
            f"attach it, or remove a stale one with `{_prog()} cleanup "
            f"--remove --key {_key_arg(region._key)}`"
        )
        raise FileExistsError(errno.EEXIST, f"/dev/shm/{pname} exists: {why}") from None
    region.name = pname  # ours now: removed on any error below
    _flock_shared(b, fd, f"/dev/shm/{pname}")  # before it has a size: never stale
    b.call("ftruncate", fd, region._mapped)
    region._address = b.call("mmap", region._mapped, fd)


def _identity(region: SharedRegion, seg: int, what: str, why: str) -> Dict[str, Any]:
    """The identity record of ``r``'s ``seg`` mapped bytes (none while unmapped): its
    record segment's, or the one ending them."""
    if region._room_id >= 0:
        rec = region._room_record(seg, what)
    else:
        rec = region._own_record(seg, what)
    if rec is None:
        raise FileNotFoundError(errno.ENOENT, f"{what} has no numa_utils identity record: {why}")
    return rec


def _sysv_attach(region: SharedRegion, trust: bool) -> Tuple[Dict[str, Any], str]:
    """Map the segment whose identity record names region ``r.key``: (record, what)."""
    b, key = region._b, region._key
    first: Optional[Exception] = None
    for ikey in _sysv_keys(key):
        try:
            shmid = b.call("shmget", ikey, 0, 0)
        except FileNotFoundError:
            continue
        what = f"SysV segment 0x{ikey:08x} (shmid {shmid})"
        try:
            st: ShmStat = b.call("shm_stat", shmid)
            _check_trust(st, b.call("geteuid"), trust, what)
            region.shmid, region._ipc_key, region._mapped = shmid, ikey, st.size
            region._address = b.call("shmat", shmid)
            if _huge_vma(b, region._address) is not False:  # huge, or unknown: its record segment
                region._room_attach(trust)
            rec = _identity(
                region, st.size, what, "another program's segment, or one still being created"
            )
            if _same_key(rec["key"], key) and rec["kind"] == "sysv":
                return rec, what
            if isinstance(key, int):  # a str key tries its next key
                raise ValueError(f"{what}: its identity record names region {rec['key']!r}")
        except (PermissionError, FileNotFoundError, ValueError) as err:
            first = first or err
        if region._address:
            b.call("shmdt", region._address)
            region._address = 0
        region._room_close()
        region._room_id = -1
    raise first or FileNotFoundError(
        errno.ENOENT, f"no SysV segment with key 0x{_sysv_key(key):08x} ({key!r}) or its other keys"
    )


def _posix_attach(region: SharedRegion, trust: bool) -> Tuple[Dict[str, Any], str]:
    """Map /dev/shm/numa_utils-``r.key``, holding its shared flock: (record, what)."""
    b, name = region._b, _posix_name(region._key)
    what = f"/dev/shm/{name}"
    try:
        region._fd = fd = b.call("shm_open", name, os.O_RDWR, 0)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"no {what}") from None
    region.name = name
    _check_trust(b.call("fstat", fd), b.call("geteuid"), trust, what)
    _flock_shared(b, fd, what)  # waits while a cleanup decides on it
    st: ShmStat = b.call("fstat", fd)
    if not st.nattch:
        raise FileNotFoundError(errno.ENOENT, f"{what} was removed (stale) while attaching")
    region._mapped = seg = st.size
    if seg >= _RECORD_END.size:
        region._address = b.call("mmap", seg, fd)
    rec = _identity(region, seg, what, "not made by SharedRegion.create, or still being created")
    if rec["kind"] != "posix" or _posix_name(rec["key"]) != name:
        raise ValueError(f"{what}: its identity record names {rec['kind']} region {rec['key']!r}")
    return rec, what


def _policy_runs(lay: Layout) -> Layout:
    """``lay`` with neighbouring extents of one policy over one node set joined: the
    kernel makes each run one VMA, so one mbind sets it (blocks:4K:bind:0 over 64 MiB
    is one call, not 16,384)."""
    runs: List[Tuple[int, str, FrozenSet[int]]] = []
    for e in lay:
        if runs and runs[-1][1:] == (e.policy, e.nodes):
            runs[-1] = (runs[-1][0] + e.length, e.policy, e.nodes)
        else:
            runs.append((e.length, e.policy, e.nodes))
    return Layout.extents(runs)


def _per_extent(
    lay: Layout, runs: Layout, results: List[PolicyResult], addr: int
) -> List[PolicyResult]:
    """Each extent of ``lay`` given the result of the run (_policy_runs) holding it,
    with the extent's own start and length."""
    out = []
    found = iter(zip(runs, results))
    run, res = next(found)
    for e in lay:
        if e.offset >= run.offset + run.length:
            run, res = next(found)
        out.append(res._replace(start=addr + e.offset, length=e.length))
    return out


def _layout_apply(
    backend: Backend, addr: int, page: int, lay: Layout, strict: bool, known: Dict[str, Any]
) -> List[PolicyResult]:
    """Each extent's policy on its part of the data at ``addr`` (the record's room
    after the data has its own: _room_apply).  A default extent is left alone: a
    fresh mapping is first-touch already, and an mbind(MPOL_DEFAULT) on an attached
    one would wipe the creator's shared policy.  The machine's memory nodes, this
    process's allowed ones and NUMA_NODES are read once for all extents (a blocks
    layout may have tens of thousands) and kept in ``known`` (create's holds the
    NUMA_NODES it read), and neighbours of one policy are one mbind (_policy_runs)."""
    out = []
    runs = _policy_runs(lay)
    for e in runs:
        a, n = addr + e.offset, e.length
        if e.policy == "default":
            out.append(PolicyResult(True, "default", frozenset(), a, n))
        else:
            out.append(
                _apply_policy(
                    a,
                    n,
                    mode=e.policy,
                    nodes=e.nodes or None,
                    strict=strict,
                    page_size=page,
                    backend=backend,
                    count_resident=False,
                    known=known,
                )
            )
    return _per_extent(lay, runs, out, addr)


def _extent_cpus(
    backend: Backend, lay: Layout, topo: Optional[Topology] = None
) -> Dict[FrozenSet[int], FrozenSet[int]]:
    """{nodes: the CPUs of those nodes, or of the nearest with CPUs} per node set the
    extents name, within this thread's affinity; empty: run as the caller is.  Read
    before a region is made: the interruptible prefault then does no more."""
    topo = _topology_or_read(topo, backend)
    mine = backend.call("sched_getaffinity", 0)
    out: Dict[FrozenSet[int], FrozenSet[int]] = {}
    for nodes in dict.fromkeys(e.nodes for e in lay):
        if nodes & topo.nodes_with_cpus:
            near = sorted(nodes)
        else:
            near = topo.nearest(min(nodes or {0}), topo.nodes_with_cpus)[:1]
        out[nodes] = (
            frozenset().union(
                *(topo.nodes[node].cpus for node in near if nodes and node in topo.nodes)
            )
            & mine
        )
    return out


def _layout_prefault(
    backend: Backend,
    addr: int,
    lay: Layout,
    page: int,
    threads: Optional[int],
    progress: Optional[Callable[[int, int], Any]],
    cpus: Optional[Dict[FrozenSet[int], FrozenSet[int]]] = None,
    held: Optional[Tuple[Any, Callable[[], Any]]] = None,
) -> Dict[str, Any]:
    """prefault() over each extent with the calling thread (and so the workers it
    starts) bound to ``cpus[extent.nodes]`` (_extent_cpus): first touches come from
    local CPUs (``prefer`` lands there, zeroing runs on the socket that owns the
    memory).  Extents without nodes run as the caller does.  ``held``: signals held
    by _open, whose handlers run between chunks (_run_pending): a long prefault stays
    interruptible while a second signal cannot strike between the first and the undo."""
    import time

    if cpus is None:
        cpus = _extent_cpus(backend, lay)
    t0, done, total = time.monotonic(), 0, lay.size or 0
    out: Dict[str, Any] = {"bytes": 0, "threads": 0, "method": "none"}
    if any(cpus.values()):
        before = backend.call("sched_getaffinity", 0)
    else:
        before = frozenset()
    try:
        for nodes, want in cpus.items():
            want = want or before
            if want and want != backend.call("sched_getaffinity", 0):
                backend.call("sched_setaffinity", 0, want)
            for e in (e for e in lay if e.nodes == nodes):

                def step(d: int, _: int, base: int = done) -> None:
                    _run_pending(held)
                    if progress is not None:
                        progress(base + d, total)

                r = _do_prefault(
                    addr + e.offset,
                    e.length,
                    threads,
                    backend=backend,
                    progress=step,
                    page_size=page,
                    shared=True,
                )
                done += e.length
                out.update(
                    bytes=out["bytes"] + r["bytes"],
                    method=r["method"],
                    threads=max(out["threads"], r["threads"]),
                )
    finally:
        if before and backend.call("sched_getaffinity", 0) != before:
            backend.call("sched_setaffinity", 0, before)
    out.update(seconds=time.monotonic() - t0, extents=len(lay))
    return out


class ExtentPlacement(Dict[int, int]):
    """Bytes per node of one extent, with ``ok`` (every page faulted in, each on a
    node of the extent's policy) and a ``verdict`` in words."""

    ok: bool = False
    verdict: str = ""


def _extent_placement(backend: Backend, addr: int, seg: int, lay: Layout) -> List[ExtentPlacement]:
    """Per extent from one numa_maps read: a VMA inside one extent counts for it.  A
    VMA over several (adjacent extents of one policy merge into one VMA, and the last
    extent's VMA holds the identity record) is split by move_pages, or where that is
    denied, by the extents' share of its length (the verdict then says so)."""
    text = backend.read_text(_maps_path("self"))
    kb, end = _page_kb(backend), addr + seg
    vmas: List[Tuple[int, int, Dict[int, int]]] = []
    for line in text.splitlines():
        start = int(line[: line.index(" ")], 16) if " " in line else -1
        if vmas and vmas[-1][1] > start >= 0:
            vmas[-1] = (vmas[-1][0], start, vmas[-1][2])
        if addr <= start < end:
            vmas.append((start, end, _parse_maps_line(line, kb).bytes_per_node))
    out = []
    for e in lay:
        lo, hi = addr + e.offset, addr + e.offset + e.length
        mine = [v for v in vmas if v[0] < hi and v[1] > lo]
        pl, note = ExtentPlacement(), ""
        if not mine or any(v[0] < lo or hi < v[1] for v in mine):
            try:
                pl.update(_placement_move_pages(backend, 0, lo, e.length))
                mine = []
            except OSError:
                note = " (shared with neighbours: approximate)"
        for v0, v1, per in mine:  # a VMA inside the extent: share 1
            share = (min(v1, hi) - max(v0, lo)) / (v1 - v0)
            for node, nb in per.items():
                pl[node] = pl.get(node, 0) + int(nb * share) // kb // 1024 * kb * 1024
        used = frozenset(node for node, v in pl.items() if v)
        pl.ok = (
            not note
            and sum(pl.values()) == e.length
            and (not e.nodes or e.policy == "prefer-many" or used <= e.nodes)
            and (e.policy != "prefer" or used == e.nodes)
        )
        if pl.ok:
            word = "ok: "
        elif e.nodes and used - e.nodes:
            word = "MISPLACED: "
        else:
            word = "incomplete: "
        pl.verdict = word + placement_verdict(pl, e.policy) + note
        out.append(pl)
    return out


# Two creators of one name may make it under two of its SysV keys at once (each found
# the other's key taken, or free, as it passed).  Each names its segment (the record)
# and then looks at all the name's other keys: a twin already made wins; of two being
# made, the one under the earlier key, which waits for the later one to undo itself or
# be made (a later key never waits on an earlier one: no cycle).  The last-use slot,
# written once this check passes, is what "made" means.
_TWIN_WAIT = 5.0


def _twin(backend: Backend, ikey: int, key: Union[int, str]) -> str:
    """What SysV key ``ikey`` holds of region ``key``: "" (nothing of it, or a segment
    not named yet: its creator's check will see ours), "making" or "made"."""
    try:
        st = _own_segment(backend, ikey)
        if st is None:
            return ""
        rec, slot = _peek_region(backend, st, f"SysV key 0x{ikey:08x}")
    except (FileNotFoundError, PermissionError, ValueError):
        return ""  # none, another user's, or damaged: never made by a creator of ours
    except OSError as err:
        if err.errno in (errno.EINVAL, errno.EIDRM):  # removed while we looked
            return ""
        raise
    if rec is None or rec["kind"] != "sysv":
        return ""
    if not _same_key(rec["key"], key):
        return ""
    if slot[:8] == _SLOT_MAGIC:
        return "made"
    return "making"


def _sysv_twins(region: SharedRegion) -> None:
    """FileExistsError when region ``r.key``, named under ``r.ipc_key`` and not yet
    made, is not to be the one region of its name (see _TWIN_WAIT)."""
    import time

    b, key = region._b, region._key
    keys = _sysv_keys(key)
    mine = keys.index(region._ipc_key)
    deadline = time.monotonic() + _TWIN_WAIT
    for i, ikey in enumerate(keys):
        if i == mine:
            continue
        state = _twin(b, ikey, key)
        while state == "making" and i > mine and time.monotonic() < deadline:
            time.sleep(0.005)
            state = _twin(b, ikey, key)
        if state:  # made, or being made under an earlier key, or for too long
            why = _sysv_holder(b, ikey, key) or f"region {key!r} exists: attach it"
            raise FileExistsError(errno.EEXIST, why)


class SharedRegion(_RecordRoom):
    """A shared memory region (SysV segment or /dev/shm file) placed by a policy.

    ``create`` makes it (0600, policy applied before any page is touched, then
    prefaulted); ``attach`` maps an existing one after checking its owner, mode and
    identity record (which region it is), and applies the same policy to its own
    mapping.  ``with`` closes it; the creator's ``with`` also destroys it (in the
    creating process: a forked child leaving it only closes its copy).  Crash
    safety: ``attach(..., remove=True)`` (or ``remove()``) marks a SysV segment for
    removal at once: it disappears when the last process detaches or dies, and its
    key is free again immediately.  A POSIX region's users hold a shared flock on its
    file while they have it open, which is how ``cleanup`` knows it is in use.
    """

    _layout: Layout
    policies: List[PolicyResult]  # one per extent
    _policy: PolicyResult

    def __init__(
        self,
        backend: Backend,
        kind: str,
        key: Union[int, str],
        created: bool,
        hugepages_fallback: Optional[str],
    ) -> None:
        """Made empty by _open: its ``make`` fills in the mapping part by part (each
        part made is one close() or remove() undoes), then the record and layout."""
        self._b, self.kind, self._key, self.created = backend, kind, key, created
        self.shmid, self._ipc_key, self._fd = -1, 0, -1  # _fd: holds the POSIX flock
        self.name = ""  # POSIX: the file name in /dev/shm
        self._address = self._mapped = 0  # _mapped: data + identity record
        self._size = self.page_size = 0
        self.identity: Dict[str, Any] = {}
        self.prefaulted: Optional[Dict[str, Any]] = None
        self._closed = self._removed = False
        self.hugepages_fallback = hugepages_fallback  # why base pages, not huge ones
        self._pid = os.getpid()  # a forked child's `with` only closes

    # -- properties (read-only) ---------------------------------------------------------
    @property
    def address(self) -> int:
        return self._address

    @property
    def size(self) -> int:
        """Bytes of data (the size asked for, in whole pages); the record follows."""
        return self._size

    @property
    def key(self) -> Union[int, str]:
        return self._key

    @property
    def ipc_key(self) -> int:
        return self._ipc_key  # its SysV key (0 for POSIX)

    @property
    def policy(self) -> PolicyResult:
        return self._policy  # truthy when it was applied

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def layout(self) -> Layout:
        return self._layout  # where each extent lives, as its creator laid it out

    @property
    def extents(self) -> List[Extent]:
        return list(self._layout)

    def view(self, i: int) -> memoryview:
        """Extent ``i`` as a writable memoryview (see buffer())."""
        e = self._layout[i]
        return self.buffer()[e.offset : e.offset + e.length]

    def node_of(self, offset: int) -> FrozenSet[int]:
        """The nodes of the extent holding byte ``offset`` (empty: first touch)."""
        return self._layout[self._layout.index(offset)].nodes

    def buffer(self) -> memoryview:
        """The memory as a writable memoryview of unsigned bytes (format "B"), which
        slice assignment, ``numpy.frombuffer`` and ``torch.frombuffer`` take without a
        copy.  Valid until close(): a view used after it touches unmapped memory."""
        self._check_open()
        return memoryview((ctypes.c_ubyte * self._size).from_address(self._address)).cast("B")

    def __repr__(self) -> str:
        if self._closed:
            state = "closed"
        else:
            state = f"at 0x{self._address:x}"
        if len(self._layout) > 1:
            pol = f"layout {self._layout}"
        elif self._policy.nodes:
            pol = f"{self._policy.mode}:{format_cpulist(self._policy.nodes)}"
        else:
            pol = self._policy.mode
        if not self._policy:
            pol += f" (not applied: {self._policy.reason})"
        if self.kind == "sysv":
            ident = f"key=0x{self.ipc_key:08x} shmid={self.shmid}"
        else:
            ident = f"name={self.name!r}"
        if self.created:
            state += ", owner"
        return (
            f"SharedRegion({self.kind} {ident} {self._key!r}, {format_kib(self._size // 1024)}, "
            f"page {self.page_size // 1024} KiB, policy {pol}, {state})"
        )

    # -- create / attach -----------------------------------------------------------------
    @classmethod
    def create(
        cls,
        key: Union[int, str],
        size: int,
        *,
        policy: Optional[str] = None,
        nodes: Optional[Iterable[int]] = None,
        prefault: bool = True,
        hugepages: Union[bool, int, str, None] = None,
        kind: str = "sysv",
        mode: int = 0o600,
        threads: Optional[int] = None,
        strict: Optional[bool] = None,
        progress: Optional[Callable[[int, int], Any]] = None,
        hugepages_required: bool = True,
        backend: Optional[Backend] = None,
        layout: Union[Layout, str, None] = None,
        existing: str = "error",
        wait: float = _REUSE_WAIT,
    ) -> SharedRegion:
        """Create region ``key`` (a str name, or an int SysV key) of ``size`` bytes.

        ``layout`` (a Layout or its text) gives each extent its policy; ``policy`` and
        ``nodes`` make the one-extent layout.  The layout goes into the identity
        record, where every attacher reads it.
        ``hugepages``: False (base pages), True or "2M"/"1G" (hugetlb, kind="sysv"),
        "thp" (MADV_HUGEPAGE before prefault, where shmem THP is advise/within_size/
        always), None: NUMA_UTILS_NUMA_HUGEPAGES ("off" unless set; set it to "off",
        or pass False, to give no THP advice).  ``fit()`` checks first: a region that
        would not fit (too few huge pages on a node, a small /dev/shm, a cgroup
        limit ...) is refused with OSError naming the limit and the fix; with
        ``hugepages_required=False`` too few huge pages gives base pages instead, and
        ``hugepages_fallback`` says why.  When it exists: ``existing="error"``
        raises FileExistsError; ``"replace"`` removes it if cleanup proves it stale
        (nobody attached, its creator and last user gone; no minimum age), then makes
        it; ``"reuse"`` attaches it (as ``attach``: this user's only) when its size,
        page size and layout are the ones asked for (``created`` is then False),
        waiting up to ``wait`` seconds for a peer still making it.
        Nothing is left behind when any step fails (a bad layout, policy denied under
        strict, prefault interrupted, ...).
        """
        import time

        backend = _b(backend)
        _region_args(backend, kind, size, 1)  # before fit() weighs it
        if existing not in ("error", "replace", "reuse"):
            raise ValueError(f'existing={existing!r}: "error", "replace" or "reuse"')
        if mode & ~0o777:
            raise ValueError(f"mode {mode:o}: permission bits only")
        # The one read of the topology and of NUMA_NODES, for fit() and what follows.
        topo = read_topology(backend=backend)
        known: Dict[str, Any] = {"topology": topo}
        pmode, pnodes, strict_, _ = _region_policy(policy, nodes, strict, backend, known)
        fits = _fit(backend, topo, size, pmode, pnodes, hugepages, kind, False, hugepages_required)
        hugepages, huge_note = _fit_or_raise(fits, size)
        if layout is not None and (policy is not None or nodes is not None):
            raise ValueError("give layout= or policy=/nodes=, not both")
        lay = _layout_arg(layout)
        # The nodes the pages come from, where _region_page looks for huge pages.
        if lay is not None:
            page_nodes: Optional[FrozenSet[int]] = lay.nodes
        elif pmode in _SPILL_MODES:
            page_nodes = None  # first-touch, preferred: pages come from where they are
        else:
            page_nodes = pnodes or default_memory_nodes(topo)
        huge, page = _region_page(hugepages, kind, backend, page_nodes)
        size = (size + page - 1) // page * page
        if lay is None:
            if pmode in (Mode.DEFAULT, Mode.LOCAL):
                extent_nodes: Optional[Iterable[int]] = ()  # as mbind: nodes ignored there
            else:
                extent_nodes = pnodes
            lay = Layout.extents([(size, _MODE_WORDS[pmode].word, extent_nodes)])
        lay = lay.bound(size, page, _memory_nodes(backend)[0])
        seg = _region_mapped(size, page, huge)
        _region_args(backend, kind, seg, 1)
        if huge and isinstance(key, int) and key & SYSV_KEY_MASK == _COMPANION_PREFIX:
            raise ValueError(
                f"SysV key 0x{key:08x}: keys 0x4f000000-0x4fffffff hold huge-page regions' "
                "records; a huge-page region needs a key outside them"
            )
        ident = {
            "key": key,
            "kind": kind,
            "size": size,
            "page_size": page,
            "created": round(time.time(), 3),
            "uid": backend.call("geteuid"),
            **backend.call("whoami"),
            "layout": str(lay),
        }
        flags = IPC_CREAT | IPC_EXCL | mode
        if huge:
            flags |= SHM_HUGETLB | ((huge.bit_length() - 1) << SHM_HUGE_SHIFT)

        def make(made: SharedRegion) -> None:
            made._mapped, made.identity, made._layout = seg, ident, lay
            if kind == "sysv":
                _sysv_create(made, flags, existing == "replace")
            else:
                _posix_create(made, flags, existing == "replace")

        try:
            return cls._open(
                backend,
                kind,
                key,
                make,
                True,
                strict_,
                prefault,
                threads,
                progress,
                known,
                thp=hugepages == "thp",
                note=huge_note,
            )
        except FileExistsError:
            if existing != "reuse":
                raise
        region = cls.attach(
            key,
            kind=kind,
            prefault=prefault,
            threads=threads,
            strict=strict,
            progress=progress,
            backend=backend,
            wait=wait,
        )
        if (region.size, region.page_size, str(region.layout)) != (size, page, str(lay)):
            region.close()
            raise FileExistsError(
                errno.EEXIST,
                f"region {key!r} exists with {region.size} bytes in "
                f"{region.page_size}-byte pages, layout {region.layout}, not {size} bytes "
                f"in {page}-byte pages, layout {lay}: existing='reuse' attaches only "
                "the region asked for",
            )
        return region

    @classmethod
    def attach(
        cls,
        key: Union[int, str],
        size: Optional[int] = None,
        *,
        policy: Optional[str] = None,
        nodes: Optional[Iterable[int]] = None,
        kind: str = "sysv",
        trust: bool = False,
        remove: bool = False,
        prefault: bool = False,
        threads: Optional[int] = None,
        hugepages: Union[bool, int, str] = False,
        strict: Optional[bool] = None,
        progress: Optional[Callable[[int, int], Any]] = None,
        backend: Optional[Backend] = None,
        wait: Optional[float] = None,
        created_after: Optional[float] = None,
    ) -> SharedRegion:
        """Map the existing region ``key`` after checking it can be trusted.

        Refused (PermissionError) unless it is owned by this user and nobody else can
        write it (group/other write bits), unless ``trust=True``; its identity record
        must name ``key`` (FileNotFoundError when no region of that name exists,
        ValueError when the record or its layout is damaged); ``size`` must not
        exceed it.  The policy: the region's layout from its record, each extent's
        policy applied to this mapping before any touch (hugetlb segments need it in
        every process; on shmem the same policy moves nothing); ``policy`` instead
        (one extent) if given, and ENABLE_NUMA_INTERLEAVE for a first-touch region.
        ``remove=True`` marks a SysV segment for removal after attaching (see class).
        ``wait``: seconds to wait for a region not made yet (or still without its
        record), polling; TimeoutError after that.  ``created_after`` (a time.time()
        value, such as the engine's start): a region its record says was made before
        then is an earlier run's and counts as not made yet (FileNotFoundError, or
        waited past), so a worker that starts before its creator never maps the
        region a crashed run left.
        """
        backend = _b(backend)
        _region_args(backend, kind, size or 0, 0)
        if created_after is not None and _seconds(created_after) is None:
            raise ValueError(f"created_after={created_after!r}: a time.time() value")
        known: Dict[str, Any] = {}  # NUMA_NODES, read once for the policy and the layout
        pmode, pnodes, strict_, explicit = _region_policy(policy, nodes, strict, backend, known)
        _region_page(hugepages, kind, backend, pnodes)  # the region's record says its page

        def make(attached: SharedRegion) -> None:
            if kind == "sysv":
                rec, what = _sysv_attach(attached, trust)
            else:
                rec, what = _posix_attach(attached, trust)
            _record_page_check(backend, attached._address, kind, rec["page_size"], what)
            _check_made_after(rec, created_after, what)
            data = rec["size"]
            try:
                lay = record_layout(rec)
            except (ValueError, TypeError) as err:
                raise ValueError(f"{what}: damaged identity record ({err})") from None
            if size is not None and size > data:
                raise ValueError(f"{what} holds {data} bytes, fewer than the {size} asked for")
            # The creator's layout, re-applied to this mapping before any touch (hugetlb
            # keeps policy per VMA, not on the object); the same policy on shmem moves
            # nothing.  ``policy=`` overrides it with one extent; ENABLE_NUMA_INTERLEAVE
            # fills in a region made first-touch.
            if pmode != Mode.DEFAULT and (
                explicit or (len(lay) == 1 and lay[0].policy == "default")
            ):
                lay = Layout.extents([(data, _MODE_WORDS[pmode].word, pnodes)])
            attached.identity, attached._layout, attached._size = rec, lay, data
            _slot_write(backend, attached._room()[0])

        def attach_once() -> SharedRegion:
            return cls._open(
                backend,
                kind,
                key,
                make,
                False,
                strict_,
                prefault,
                threads,
                progress,
                known,
                remove=remove,
            )

        if wait is None:
            return attach_once()
        region: SharedRegion = _waiting(attach_once, wait, f"region {key!r}")
        return region

    @classmethod
    def _open(
        cls,
        backend: Backend,
        kind: str,
        key: Union[int, str],
        make: Callable[[SharedRegion], None],
        created: bool,
        strict: bool,
        prefault: bool,
        threads: Optional[int],
        progress: Optional[Callable[[int, int], Any]],
        known: Dict[str, Any],
        *,
        thp: bool = False,
        note: Optional[str] = None,
        remove: bool = False,
    ) -> SharedRegion:
        """The one path of create and attach.  ``make`` makes or maps the region: it
        fills in the region's shmid, name, ipc_key, fd, address and mapped as it takes
        each step, then its identity record and layout.  Then each extent's policy, the
        record room's own (before anything touches the room: the creator writes the
        record after it), THP advice and prefault.  Nothing stays behind when any step
        fails (_undo: close(), and remove() of a region made here); an attach never
        removes the region.

        SIGINT/SIGTERM wait until the region is returned or undone; a handler for one
        that came meanwhile runs before they are let go (_run_pending: between
        prefault's chunks, and at the end), so that what it raises is undone here
        with nothing let go."""
        region = cls(backend, kind, key, created, note)
        held = _hold_signals()
        try:
            make(region)
            rec, lay, addr = region.identity, region._layout, region._address
            region._size, region.page_size = rec["size"], rec["page_size"]
            page = region.page_size
            lay, fallback = _layout_within_map_count(backend, lay, strict)
            if fallback:
                region._layout = lay
                if created:  # attachers apply what was applied
                    rec["layout"] = str(lay)
            cpus = None
            if prefault:
                cpus = _extent_cpus(backend, lay, known.get("topology"))
            region.policies = _layout_apply(backend, addr, page, lay, strict, known)
            region._policy = _whole_policy(region.policies, lay, fallback)
            at, room = region._room()
            _room_apply(backend, at, room, lay)
            if created:  # the room's pages, then the record: nobody can attach before
                backend.touch(at, room)
                _record_write(at, room, rec)
                if kind == "sysv":
                    _sysv_twins(region)  # named first: a twin being made sees this one
                _slot_write(backend, at)  # made: the one region of its name
            if thp:
                backend.call("madvise", addr, region._mapped, MADV_HUGEPAGE)
            if remove and kind == "sysv":
                region.remove()
            if prefault:
                region.prefaulted = _layout_prefault(
                    backend, addr, lay, page, threads, progress, cpus, held
                )
            _run_pending(held)
            # Inside the try: an interrupt the release lets in undoes the region.
            _release_signals(held)
            return region
        except BaseException:
            _undo(held, region)
            raise

    # -- use and teardown ----------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self!r} is closed")

    def placement(self, by_extent: bool = False) -> Any:
        """Bytes per node of this region's pages, measured (this process's numa_maps);
        ``by_extent=True``: one ExtentPlacement ({node: bytes}, with ``ok`` and
        ``verdict``) per extent."""
        self._check_open()
        if not by_extent:
            return placement(self._address, self._size, backend=self._b)
        return _extent_placement(self._b, self._address, self._mapped, self._layout)

    def prefault(
        self, threads: Optional[int] = None, *, progress: Optional[Callable[[int, int], Any]] = None
    ) -> Dict[str, Any]:
        """Fault every page in, each extent from threads bound to its nodes' CPUs."""
        self._check_open()
        return _layout_prefault(
            self._b, self._address, self._layout, self.page_size, threads, progress
        )

    # remove() and close() act and record it with SIGINT/SIGTERM held: interrupted
    # in between, a retry would act again, on a key, name or address that may belong
    # to another region by then.
    def remove(self) -> None:
        """Remove the name now (IPC_RMID / unlink); the memory lives until every
        process has closed it.  Nobody can attach afterwards."""
        held = _hold_signals()
        try:
            if self._removed:
                return
            try:
                if self.kind == "sysv" and self.shmid >= 0:
                    self._b.call("shm_rmid", self.shmid)
                elif self.name:
                    self._b.call("shm_unlink", self.name)
            except OSError as err:
                # Already removed (by `cleanup`, or another process): nothing to do.
                if err.errno not in (errno.ENOENT, errno.EINVAL, errno.EIDRM):
                    raise
            if self._room_id >= 0:  # the record segment last: the data never lacks it
                _room_rmid(self._b, self._room_id)
            self._removed = True
        finally:
            _release_signals(held)

    def close(self) -> None:
        """Detach (unmap) from this process; the region stays for the others."""
        held = _hold_signals()
        try:
            if self._closed:
                return
            if self._size and self._room()[0]:
                _slot_write(self._b, self._room()[0])  # its last use
            if self.kind == "sysv" and self._address:
                self._b.call("shmdt", self._address)
            elif self._address:
                self._b.call("munmap", self._address, self._mapped)
            self._room_close()
            self._closed = True
            if self._fd >= 0:  # drops the flock: cleanup may judge it
                fd, self._fd = self._fd, -1
                _quietly(self._b.call, "close", fd)
        finally:
            _release_signals(held)

    def destroy(self) -> None:
        """Remove the region and detach from it."""
        try:
            self.remove()
        finally:
            self.close()

    def __enter__(self) -> SharedRegion:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.created and os.getpid() == self._pid:
            self.destroy()
        else:
            self.close()

    def to_json(self) -> Dict[str, Any]:
        return dict(
            {
                k: getattr(self, k)
                for k in ("kind", "key", "ipc_key", "shmid", "name", "address", "size", "page_size")
            },
            policy=self._policy.to_json(),
            layout=str(self._layout),
            vmas=self._layout.vmas,
            created=self.created,
            closed=self._closed,
        )


# -- which region holds a key, and which regions are stale ------------------------------


def cleanup(
    keys: Union[None, int, str, Iterable[Union[int, str]]] = None,
    remove: bool = False,
    min_age: float = CLEANUP_MIN_AGE,
    *,
    backend: Optional[Backend] = None,
) -> List[Dict[str, Any]]:
    """This user's regions on this machine, each judged as ``cleanup`` judges them
    (see _our_segments for the proof): one dict per region, with "region" (its name
    or int key), "kind", "action" (the verdict: "keep", "would remove", "removed" or
    "failed: ..."), "why" (the reason it is kept), "stale", where it is ("key" and
    "shmid", or "path"), "size", "layout", "mode" and "attached".  ``remove=True``
    removes the ones proven stale; ``keys`` (a name or int key, or several): only
    those regions.  Other users' and other programs' regions are never touched."""
    if isinstance(min_age, bool) or not isinstance(min_age, (int, float)) or not min_age >= 0:
        raise ValueError(f"min_age={min_age!r}: a number of seconds >= 0")
    if isinstance(keys, (int, str)):
        keys = [keys]
    wanted = None if keys is None else list(keys)
    return _our_segments(_b(backend), wanted, remove=remove, min_age=min_age)


# -- end of shared-memory section ------------------------------------------------------


# ===========================================================================
# GPU locality, CPU plans and binding.
# ===========================================================================

# -- GPU section -----------------------------------------------------------------------
#
# From a CUDA device index to CPUs and memory, in four steps:
#
# 1. gpus(): GPUs from sysfs PCI devices (display 0x03 / accelerator 0x12 classes of
#    the vendors in GPU_VENDORS), each with the node firmware gives it (numa_node), or
#    the one node its local_cpulist falls on, else None (_read_devices: every device).
#    ``cpu_node`` is where its worker runs: ``node``, or the nearest node that has
#    CPUs when ``node`` has none.
# 2. GPU memory exposed as NUMA nodes (GH200/GB200 over NVLink-C2C, POWER9 + V100 over
#    NVLink2): CPU-less nodes holding the GPU's own HBM.  Only the NVIDIA driver
#    onlines such memory, so a CPU-less node is only attributed to a GPU with evidence
#    from the driver: NVML's nvmlDeviceGetNumaNodeId when NVML is there, else the
#    driver's /proc/driver/nvidia/gpus/<bus id>/ entry plus the shape of the machine
#    (see _attribute_gpu_memory).  A CXL expander is also a CPU-less memory node; it
#    must never be taken for GPU memory, hence no attribution without the driver.
#    Plans never put host memory on those nodes: that would take the GPU's HBM.
# 3. CUDA device index -> GPU (_visible_gpus): CUDA numbers GPUs in CUDA_DEVICE_ORDER
#    (PCI_BUS_ID = PCI order; the default FASTEST_FIRST puts the fastest first, which
#    is PCI order when all GPUs are the same model), then CUDA_VISIBLE_DEVICES picks
#    and reorders them by index, GPU UUID (or a unique prefix of one) or MIG id; the
#    list ends at the first invalid entry.  UUIDs come from NVML, else from the
#    driver's /proc entries; bus ids from NVML, a caller's ``pci_bus_id=``, or torch
#    when the caller already imported it and initialised CUDA (we never import torch,
#    and never initialise CUDA for the caller: that would break forking workers).
# 4. CPU plans (_plan_all) are computed for every GPU of the machine at once, from
#    sysfs, never only for the visible ones: two workers that each see one GPU must
#    still get disjoint CPUs from `exclusive`.

_CUDA_FAMILY_ORDER = ("nvidia", "amd", "intel")
BIND_POLICIES = ("node", "socket", "exclusive", "core-complex")


class _Unset(enum.Enum):
    UNSET = 0


_UNSET = _Unset.UNSET


def _memory_or_env(memory: Union[str, None, _Unset]) -> Optional[str]:
    """The memory plan for a CPU binding: a mode's word ("prefer", "bind",
    "interleave", "weighted-interleave", "local"), "socket" (preferred-many over the
    package's nodes), or None (leave the policy alone).  Takes every mode word a
    result reports; "default"/"none" is None and "prefer-many" is "socket"."""
    if memory is _UNSET:
        memory = _env("NUMA_MEMORY_POLICY")
    if memory is None:
        return None
    if str(memory).strip().lower() == "socket":
        return "socket"
    mode = _mode_of(str(memory))
    if mode == Mode.DEFAULT:
        return None
    if mode == Mode.PREFERRED_MANY:
        return "socket"
    return _MODE_WORDS[mode].word


def bind_policy(policy: Optional[str] = None) -> str:
    """The bind policy in effect: ``policy``, else NUMA_BIND_POLICY, as one of
    BIND_POLICIES or "none" (the variable's default: leave CPU affinity alone).
    Case and "_" for "-" do not matter; anything else is a ValueError."""
    if policy is None:
        policy = _env("NUMA_BIND_POLICY")
    p = str(policy).lower().replace("_", "-")
    if p not in BIND_POLICIES + ("none",):
        raise ValueError(f"unknown bind policy {policy!r}; one of {', '.join(BIND_POLICIES)}, none")
    return p


# ---------------------------------------------------------------------------
# NVML through ctypes: loaded lazily by soname, queried once per process.
# Header: nvml.h (nvmlPciInfo_t, nvmlDeviceGetNumaNodeId since r545).
# ---------------------------------------------------------------------------


def _torch_bus_id(device: int) -> Optional[str]:
    """The bus id torch reports for ``device``, only when the caller has imported torch
    and initialised CUDA already (get_device_properties would initialise it)."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        props = cuda.get_device_properties(device)
        domain = int(getattr(props, "pci_domain_id", 0) or 0)
        slot = int(getattr(props, "pci_device_id", 0) or 0)
        return f"{domain:04x}:{int(props.pci_bus_id):02x}:{slot:02x}.0"
    except Exception:  # any torch failure (no pci_bus_id either) means: torch cannot tell
        return None


# ---------------------------------------------------------------------------
# GPUs from sysfs
# ---------------------------------------------------------------------------


def _planning_topology(backend: Backend) -> Topology:
    """The topology with ``allowed_cpus`` widened from this thread's affinity
    (Cpus_allowed_list) to the cpuset when that is readable: after a first binding the
    affinity is the bound set, and plans and re-binding must still see every CPU the
    process may use.  A narrower affinity set before (taskset) is replaced by binding."""
    topo = read_topology(backend=backend)
    cs = backend.call("cpuset_cpus")
    if cs is not None and cs & topo.online_cpus:
        return topo._replace(allowed_cpus=frozenset(cs & topo.online_cpus))
    return topo


def gpus(*, backend: Optional[Backend] = None) -> List[GpuInfo]:
    """The GPUs in sysfs (NVIDIA, AMD, Intel), in PCI order, with their nodes."""
    backend = _b(backend)
    return _gpu_infos(read_topology(backend=backend), backend)


# ---------------------------------------------------------------------------
# Every PCI device: NICs and RDMA for KV transfers, NVMe for offload
# ---------------------------------------------------------------------------


def device_distance(
    a: Union[Device, str], b: Union[Device, str], *, backend: Optional[Backend] = None
) -> str:
    """How two devices reach each other, named as ``nvidia-smi topo -m`` does, from
    their sysfs bus paths: "PIX" (at most one bridge or one switch between them),
    "PXB" (several bridges, no host bridge), "PHB" (through their host bridge),
    "NODE" (different host bridges of one node), "SYS" (different or unknown nodes).
    A saved tree that kept no links has no paths: NODE or SYS.  ``a``/``b``: Devices
    or PCI addresses."""
    if isinstance(a, str) or isinstance(b, str):
        found = {device.address: device for device in devices(backend=backend)}
        try:
            if isinstance(a, str):
                a = found[_norm_bus_id(a)]
            if isinstance(b, str):
                b = found[_norm_bus_id(b)]
        except KeyError as err:
            raise ValueError(f"no PCI device {err.args[0]} (see devices())") from None
    path_a, path_b = a.path, b.path
    if path_a[:1] == path_b[:1] and path_a[0].startswith("pci"):
        shared = len(os.path.commonprefix([path_a, path_b]))
        if shared == 1:
            return "PHB"  # only the host bridge in common
        if len(path_a) - shared <= 2 and len(path_b) - shared <= 2:
            return "PIX"
        return "PXB"
    if a.node is not None and a.node == b.node:
        return "NODE"
    return "SYS"


class LocalDevices(List[Tuple[Device, str]]):
    """local_devices()'s answer: (device, relation) pairs, nearest first.
    ``fell_back``: no device of the kind was local, so all of them are listed."""

    fell_back: bool = False


_RELATIONS = ("local", "near", "remote")


def local_devices(
    where: Any, kind: str = "net", *, strict: bool = False, backend: Optional[Backend] = None
) -> LocalDevices:
    """The devices of ``kind`` on ``where``: a node, a set (list) of nodes, or a buffer
    (the nodes its pages are on, from placement(), else the node of its first page;
    an address must be passed as a buffer object, an int is a node), as (device,
    relation) pairs: "local" (on those nodes), "near" (another node of their package:
    SNC/NPS) or "remote"; ranked by relation, NUMA distance, then PCI address.  When
    none is local, ``strict=False`` lists every device of the kind, ``fell_back``
    set, so a transfer never waits for want of a local NIC; ``strict=True`` lists none."""
    backend = _b(backend)
    topo = read_topology(backend=backend)
    if isinstance(where, int) and not isinstance(where, bool):
        nodes = frozenset({where})
    elif isinstance(where, (set, frozenset, list, tuple)):
        nodes = frozenset(where)
    else:
        nodes = frozenset(placement(where, backend=backend)) or frozenset(
            nid for nid in (node_of(where, backend=backend),) if nid is not None
        )
    pkg = {nid: package for package, ns in topo.package_nodes.items() for nid in ns}
    home = {nid: pkg.get(_nearest_cpu_node(topo, nid)) for nid in topo.nodes}  # type: ignore[arg-type]
    mine = {home.get(nid) for nid in nodes} - {None}

    def rank(device: Device) -> Tuple[int, int, str]:
        """(relation: 0 local, 1 near, 2 remote; the NUMA distance; PCI address)."""
        if device.node in nodes:
            relation = 0
        elif device.node is not None and home.get(device.node) in mine:
            relation = 1
        else:
            relation = 2
        distances = []
        if device.node is not None:
            for node in nodes:
                distance = topo.distance(node, device.node)
                if distance is not None:
                    distances.append(distance)
        nearest = min(distances, default=1 << 16)  # no distance known: after every known one
        return relation, nearest, device.address

    ranked = sorted(
        (rank(device), device) for device in _devices(topo, backend) if device.kind == kind
    )
    fell_back = not strict and all(r[0] for r, _ in ranked)
    out = LocalDevices((device, _RELATIONS[r[0]]) for r, device in ranked if fell_back or r[0] == 0)
    out.fell_back = fell_back
    return out


# ---------------------------------------------------------------------------
# CUDA device index -> GPU
# ---------------------------------------------------------------------------


class _Resolved(_Record):
    gpu: Optional[GpuInfo]  # None: not identified (``how`` says why)
    how: str
    notes: Tuple[str, ...] = ()


def _family(infos: List[GpuInfo]) -> List[GpuInfo]:
    """The GPUs CUDA (or HIP) numbers: NVIDIA if any, else AMD, else Intel."""
    for vendor in _CUDA_FAMILY_ORDER:
        fam = [gpu for gpu in infos if gpu.vendor == vendor]
        if fam:
            return sorted(fam, key=lambda gpu: gpu.pci)
    return []


def _apply_visible(
    base: List[_Resolved],
    raw: str,
    uuids: Mapping[str, GpuInfo],
    migs: Mapping[str, GpuInfo],
    notes: List[str],
) -> List[_Resolved]:
    """CUDA_VISIBLE_DEVICES semantics: entries pick devices in the order given; the
    list ends at the first invalid entry (CUDA ignores the rest)."""
    out: List[_Resolved] = []
    seen: Set[str] = set()
    for t in (tok.strip() for tok in raw.split(",")):
        got: Optional[_Resolved] = None
        if re.match(r"^-?\d+$", t):
            if 0 <= int(t) < len(base):
                got = base[int(t)]
        elif t[:4].upper() == "GPU-":
            hits = [g for u, g in uuids.items() if u.startswith(t.lower())]
            if len(hits) == 1:
                got = _Resolved(hits[0], "uuid")
            elif not uuids:
                got = _Resolved(
                    None, "uuid unknown: no NVML and no NVIDIA driver entries to match it against"
                )
        elif t[:4].upper() == "MIG-":
            match = re.match(r"^MIG-(GPU-[0-9a-fA-F-]+)/\d+/\d+$", t)
            if match and match.group(1).lower() in uuids:
                got = _Resolved(uuids[match.group(1).lower()], "mig (parent uuid)")
            elif t.lower() in migs:
                got = _Resolved(migs[t.lower()], "mig (nvml)")
            else:
                got = _Resolved(None, "MIG device unknown: needs NVML to find its GPU")
        if got is None:
            if t:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES={_short(raw)}: entry {_short(t)} is invalid; "
                    "CUDA ignores it and every entry after it"
                )
            break
        if got.gpu is not None:
            key = got.gpu.pci
        else:
            key = t
        if key in seen:
            entry = _short(t)
            notes.append(
                f"CUDA_VISIBLE_DEVICES={_short(raw)}: {entry} repeats a device; the list ends there"
            )
            break
        seen.add(key)
        out.append(got)
    return out


def _visible_gpus(
    infos: List[GpuInfo], nvml: Optional[List[_NvmlGpu]], env: Mapping[str, str]
) -> Tuple[List[_Resolved], List[str]]:
    """The GPUs a CUDA (HIP) process started with ``env`` numbers 0, 1, ... and notes."""
    fam = _family(infos)
    notes: List[str] = []
    base = [_Resolved(gpu, "pci order") for gpu in fam]
    if not fam or fam[0].vendor == "intel":  # Intel: no remapping
        return base, notes
    if fam[0].vendor == "amd":
        # HIP: ROCR_VISIBLE_DEVICES first, then HIP_VISIBLE_DEVICES (or
        # CUDA_VISIBLE_DEVICES); indexes are in PCI order.
        for raw in (
            env.get("ROCR_VISIBLE_DEVICES"),
            env.get("HIP_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES")),
        ):
            if raw is not None:
                base = _apply_visible(base, raw, {}, {}, notes)
        return base, notes
    order = env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST").strip().upper()
    if order != "PCI_BUS_ID" and len({gpu.device_id for gpu in fam}) > 1:
        base = [v._replace(how="pci order (assumed)") for v in base]
        notes.append(
            "CUDA_DEVICE_ORDER is not PCI_BUS_ID and the GPUs are of different "
            "models: CUDA may number them fastest first, so device indexes are "
            "a guess; set CUDA_DEVICE_ORDER=PCI_BUS_ID"
        )
    uuids = {gpu.uuid.lower(): gpu for gpu in fam if gpu.uuid}
    by_pci = {gpu.pci: gpu for gpu in fam}
    migs = {
        mig.lower(): by_pci[nv.pci] for nv in nvml or () if nv.pci in by_pci for mig in nv.mig_uuids
    }
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is not None:
        base = _apply_visible(base, raw, uuids, migs, notes)
    return base, notes


def _fail(strict: bool, msg: str, notes: Optional[List[str]] = None) -> None:
    """Raise (EINVAL) in strict mode; otherwise log once per distinct message (fallback
    is a value, not a log storm) and add it to ``notes``."""
    if strict:
        raise OSError(errno.EINVAL, msg)
    _warn_once(msg, "numa_utils: %s", msg)
    if notes is not None:
        notes.append(msg)


def _resolve(
    device: int,
    pci_bus_id: Optional[str],
    infos: List[GpuInfo],
    backend: Backend,
    env: Optional[Mapping[str, str]],
) -> _Resolved:
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(f"invalid CUDA device index {device!r}")
    by_pci = {gpu.pci: gpu for gpu in infos}
    if pci_bus_id is not None:
        bus = _norm_bus_id(pci_bus_id)
        if bus in by_pci:
            return _Resolved(by_pci[bus], "pci_bus_id")
        return _Resolved(None, f"pci_bus_id {bus} is not a GPU in sysfs")
    if backend.is_live:
        torch_gpu = by_pci.get(_torch_bus_id(device) or "")
        if torch_gpu is not None:
            return _Resolved(torch_gpu, "torch")
    if env is None:
        env = os.environ
    nvml = _nvml_devices(backend)
    vis, notes = _visible_gpus(infos, nvml, env)
    for note in notes:  # once each, however often the device is looked up
        _fail(False, note)
    if device >= len(vis):
        cvd = env.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None:
            how = f"no CUDA device {device}: {len(vis)} visible (CUDA_VISIBLE_DEVICES={cvd!r})"
        else:
            how = f"no CUDA device {device}: {len(vis)} visible"
        return _Resolved(None, how, tuple(notes))
    return vis[device]._replace(notes=tuple(notes))


def gpu_node(
    device: int,
    *,
    pci_bus_id: Optional[str] = None,
    strict: Optional[bool] = None,
    environ: Optional[Mapping[str, str]] = None,
    backend: Optional[Backend] = None,
) -> Optional[int]:
    """The node (with CPUs) of CUDA device ``device`` as this process numbers it.

    Honours CUDA_VISIBLE_DEVICES (indexes, GPU UUIDs, MIG ids) and CUDA_DEVICE_ORDER
    from ``environ`` (default os.environ).  ``pci_bus_id`` short-cuts the lookup.
    None when unknown (strict: OSError).
    """
    backend = _b(backend)
    r = _resolve(device, pci_bus_id, gpus(backend=backend), backend, environ)
    st = _strict_or_env(strict)
    if r.gpu is None or r.gpu.cpu_node is None:
        if r.gpu is None:
            why = r.how
        else:
            why = f"GPU {r.gpu.pci}: {r.gpu.node_source}"
        _fail(st, f"CUDA device {device}: node unknown ({why})")
        return None
    return r.gpu.cpu_node


def cuda_device(
    device: int,
    *,
    pci_bus_id: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
    backend: Optional[Backend] = None,
) -> GpuInfo:
    """The GPU that is CUDA device ``device`` for this process, as gpu_node finds it
    (CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER from ``environ``, default os.environ).
    ValueError when there is no such device, saying how many are visible."""
    backend = _b(backend)
    r = _resolve(device, pci_bus_id, gpus(backend=backend), backend, environ)
    if r.gpu is None:
        raise ValueError(r.how)
    return r.gpu


# ---------------------------------------------------------------------------
# CPU plans
# ---------------------------------------------------------------------------


class GpuPlan(_Record):
    """The CPUs and host memory planned for one GPU's worker."""

    gpu: Optional[int]  # CUDA index in this process; None: not visible
    pci: Optional[str]
    node: Optional[int]  # the GPU's node (with CPUs); None: unknown
    cpu_node: Optional[int]  # node whose CPUs the plan uses (cpuset fallback)
    cpus: FrozenSet[int]
    memory: Optional[str]  # a _memory_or_env plan: "prefer", "socket", ... or None
    memory_nodes: Tuple[int, ...]
    policy: str
    gpu_memory_nodes: Tuple[int, ...] = ()
    notes: Tuple[str, ...] = ()

    def to_json(self) -> Dict[str, Any]:
        return _record_json(
            self,
            cpus={"cpus": sorted(self.cpus), "cpulist": format_cpulist(self.cpus)},
            memory={"memory_policy": self.memory},
        )


def _plan_memory(
    topo: Topology, infos: List[GpuInfo], node: Optional[int], memory: Optional[str]
) -> Tuple[int, ...]:
    """Host-memory nodes for a worker on ``node``: the node itself when it has memory
    this process may use, else the nearest such nodes (DRAM nodes with CPUs first, so
    that a GPU's HBM node or a CXL expander is only a last resort).  "interleave":
    every usable node but GPU memory; "socket": those of the node's package."""
    if memory is None or node is None:
        return ()
    usable = default_memory_nodes(topo)
    if memory in ("interleave", "weighted-interleave"):
        return tuple(sorted(usable - {nid for gpu in infos for nid in gpu.memory_nodes}))
    if node in usable:
        nodes: Tuple[int, ...] = (node,)
    else:
        nodes = _nearest_tied(topo, node, (usable & topo.nodes_with_cpus) or usable)
    if memory == "socket":  # preferred-many over the package's memory nodes
        pk = {topo.cpus[cpu].package for cpu in topo.nodes[node].cpus if cpu in topo.cpus}
        mine = {nid for package, ns in topo.package_nodes.items() if package in pk for nid in ns}
        return tuple(sorted(usable & mine)) or nodes
    if memory == "prefer":
        return nodes[:1]
    return nodes


def _chunks(count: int, parts: int) -> List[range]:
    """``range(count)`` cut into ``parts`` near-equal runs, the first ones longer."""
    size, longer = divmod(count, parts)
    out = []
    start = 0
    for part in range(parts):
        end = start + size + int(part < longer)
        out.append(range(start, end))
        start = end
    return out


def _cache_domains(topo: Topology, cpus: Iterable[int]) -> List[Tuple[int, ...]]:
    """``cpus`` grouped by last-level cache (a CPU without cache data counts as
    sharing one with all of ``cpus``), each group sorted, the groups sorted."""
    whole = frozenset(cpus)
    groups: Dict[FrozenSet[int], List[int]] = {}
    for cpu in whole:
        domain = whole
        if cpu in topo.cpus and topo.cpus[cpu].llc:
            domain = topo.cpus[cpu].llc
        groups.setdefault(domain, []).append(cpu)
    return sorted(tuple(sorted(members)) for members in groups.values())


def _plan_all(
    topo: Topology, infos: List[GpuInfo], policy: str, reserve: int, strict: bool
) -> Dict[str, Tuple[Optional[int], FrozenSet[int], List[str]]]:
    """pci -> (cpu node, CPUs, notes) for every GPU of the family, planned together."""
    fam = _family(infos)
    allowed = topo.allowed_cpus & topo.online_cpus
    notes: Dict[str, List[str]] = {gpu.pci: [] for gpu in fam}
    # reserve: the first ``reserve`` usable cores of every node (core 0 of a node takes
    # most interrupts and housekeeping), kept out of every policy; one core stays.
    reserved: Set[int] = set()
    for nid in topo.nodes:
        cores = topo.cores_of(topo.nodes[nid].cpus & allowed)
        if reserve >= len(cores) > 0:
            _fail(
                strict,
                f"reserve={reserve} would leave no core on node {nid} "
                f"({len(cores)} usable); keeping one",
            )
        reserved.update(cpu for core in cores[: min(reserve, len(cores) - 1)] for cpu in core)
    pool = {node: topo.nodes[node].cpus & allowed - reserved for node in topo.nodes}
    usable = [node for node in sorted(pool) if pool[node]]
    eff: Dict[str, Optional[int]] = {}
    for gpu in fam:
        node: Optional[int] = gpu.cpu_node
        if node is not None and not pool.get(node):
            near = topo.nearest(node, usable)
            if near:
                msg = (
                    f"GPU {gpu.pci}: this process's cpuset allows no CPU on its node {node};"
                    f" using the nearest node {near[0]}"
                )
                node = near[0]
            else:
                msg = f"GPU {gpu.pci}: this process's cpuset allows no CPU on its node {node}"
                node = None
            _fail(strict, msg, notes[gpu.pci])
        eff[gpu.pci] = node
    # GPUs with unknown nodes go, in PCI order, where cores per GPU are highest.
    for gpu in fam:
        if eff[gpu.pci] is None and usable:
            placed = list(eff.values())
            best = max(
                usable,
                key=lambda node: (len(topo.cores_of(pool[node])) / (placed.count(node) + 1), -node),
            )
            _fail(
                strict,
                f"GPU {gpu.pci}: NUMA node unknown ({gpu.node_source}); planned on "
                f"node {best}, the node with the most cores per GPU",
                notes[gpu.pci],
            )
            eff[gpu.pci] = best
    out: Dict[str, Tuple[Optional[int], FrozenSet[int], List[str]]] = {}
    for gpu in fam:
        node = eff[gpu.pci]
        if node is None:
            out[gpu.pci] = (
                None,
                frozenset(allowed),
                notes[gpu.pci] + ["no usable node: all allowed CPUs"],
            )
            continue
        group = [p for p, m in eff.items() if m == node]
        rank, k = group.index(gpu.pci), len(group)
        if policy == "node":
            cpus = frozenset(pool[node])
        elif policy == "socket":
            pkgs = {topo.cpus[cpu].package for cpu in topo.nodes[node].cpus if cpu in topo.cpus}
            cpus = frozenset(
                cpu
                for cpu in allowed - reserved
                if cpu in topo.cpus and topo.cpus[cpu].package in pkgs
            ) or frozenset(pool[node])
        else:
            # exclusive: physical cores; core-complex: whole last-level-cache domains
            units: List[Tuple[int, ...]] = topo.cores_of(pool[node])
            if policy == "core-complex":
                units = _cache_domains(topo, pool[node])
            if len(units) >= k:  # chunk ``rank`` of k near-equal ones, first ones longer
                run = _chunks(len(units), k)[rank]
                mine = units[run.start : run.stop]
            elif policy == "exclusive":
                _fail(
                    strict,
                    f"node {node} has {len(units)} usable cores for {k} GPUs: "
                    "exclusive plans share cores",
                    notes[gpu.pci],
                )
                mine = [units[rank % len(units)]]
            else:
                mine = [units[rank * len(units) // k]]
                notes[gpu.pci].append(
                    f"node {node} has {len(units)} last-level caches for {k} GPUs: they are shared"
                )
            cpus = frozenset(cpu for u in mine for cpu in u)
        out[gpu.pci] = (node, cpus, notes[gpu.pci])
    return out


def _same_maker(infos: List[GpuInfo], gpu: GpuInfo) -> List[GpuInfo]:
    """The GPUs of ``gpu``'s maker, which a plan for it shares CPUs among: pci_bus_id=
    may name one outside the family CUDA numbers (an AMD GPU on a host with NVIDIA
    ones), planned then with its own kind."""
    return [info for info in infos if info.vendor == gpu.vendor]


def _plan_for(
    topo: Topology,
    infos: List[GpuInfo],
    found: _Resolved,
    index: Optional[int],
    policy: str,
    memory: Optional[str],
    extra: Sequence[str],
    planned: Dict[str, Tuple[Optional[int], FrozenSet[int], List[str]]],
) -> GpuPlan:
    """The plan of ``found``'s GPU from _plan_all's ``planned``; ``extra``: notes put
    first."""
    gpu = found.gpu
    if gpu is None:
        return GpuPlan(
            index,
            None,
            None,
            None,
            frozenset(topo.allowed_cpus),
            memory,
            (),
            policy,
            notes=(
                *extra,
                found.how,
                "GPU not identified: all allowed CPUs, memory policy unchanged",
            ),
        )
    n, cpus, notes = planned.get(gpu.pci, (None, frozenset(topo.allowed_cpus), []))
    return GpuPlan(
        index,
        gpu.pci,
        gpu.cpu_node,
        n,
        cpus,
        memory,
        _plan_memory(topo, infos, n, memory),
        policy,
        gpu.memory_nodes,
        tuple(extra) + tuple(notes),
    )


def _plan_args(
    policy: Optional[str],
    reserve: Optional[int],
    memory: Union[str, None, _Unset],
    strict: Optional[bool],
) -> Tuple[str, int, Optional[str], bool]:
    """A plan's policy, reserve, memory policy and strictness; the unset ones from the
    environment."""
    pol = bind_policy(policy)
    if reserve is None:
        reserve = _env("NUMA_RESERVED_CORES")
    if int(reserve) < 0:
        raise ValueError(f"reserve must be >= 0, not {reserve!r}")
    memory_policy = _memory_or_env(memory)
    strictness = _strict_or_env(strict)
    return pol, int(reserve), memory_policy, strictness


def gpu_plans(
    policy: Optional[str] = None,
    *,
    reserve: Optional[int] = None,
    memory: Union[str, None, _Unset] = _UNSET,
    strict: Optional[bool] = None,
    environ: Optional[Mapping[str, str]] = None,
    backend: Optional[Backend] = None,
) -> List[GpuPlan]:
    """One plan per CUDA device this process sees (CUDA_VISIBLE_DEVICES applied)."""
    backend = _b(backend)
    pol, res, mem, st = _plan_args(policy, reserve, memory, strict)
    if pol == "none":
        pol = "node"
    if environ is None:
        environ = os.environ
    topo = _planning_topology(backend)
    infos = _gpu_infos(topo, backend)
    vis, notes = _visible_gpus(infos, _nvml_devices(backend), environ)
    if vis:
        planned = _plan_all(topo, infos, pol, res, st)
    else:
        planned = {}
    return [_plan_for(topo, infos, v, i, pol, mem, notes, planned) for i, v in enumerate(vis)]


def _device_plan(
    backend: Backend,
    device: int,
    pci_bus_id: Optional[str],
    environ: Optional[Mapping[str, str]],
    policy: str,
    reserve: int,
    memory: Optional[str],
    strict: bool,
) -> Tuple[Topology, List[GpuInfo], _Resolved, GpuPlan]:
    """CUDA device ``device``'s GPU (the notes on finding it logged once) and its plan,
    on the planning topology; policy "none" plans as "node"."""
    topo = _planning_topology(backend)
    infos = _gpu_infos(topo, backend)
    r = _resolve(device, pci_bus_id, infos, backend, environ)
    if policy == "none":
        policy = "node"
    if r.gpu is not None:
        planned = _plan_all(topo, _same_maker(infos, r.gpu), policy, reserve, strict)
    else:
        planned = {}
    return topo, infos, r, _plan_for(topo, infos, r, device, policy, memory, (), planned)


def cpus_for_gpu(
    device: int,
    policy: Optional[str] = None,
    *,
    reserve: Optional[int] = None,
    strict: Optional[bool] = None,
    pci_bus_id: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
    backend: Optional[Backend] = None,
) -> FrozenSet[int]:
    """The CPUs for CUDA device ``device``'s worker, always within the allowed CPUs.

    ``policy``: "node" (the GPU's node), "socket", "exclusive" (the node's physical
    cores split evenly among the node's GPUs, SMT siblings together, disjoint across
    GPUs) or "core-complex" (whole last-level-cache domains).  ``reserve`` physical
    cores per node are left out.  Defaults come from the NUMA_UTILS_* variables.  When the
    cpuset leaves nothing on the GPU's node, the nearest node is used (strict: OSError).
    """
    backend = _b(backend)
    pol, res, _, st = _plan_args(policy, reserve, None, strict)
    r, plan = _device_plan(backend, device, pci_bus_id, environ, pol, res, None, st)[2:]
    if r.gpu is None:
        _fail(st, f"CUDA device {device}: not identified ({r.how}); all allowed CPUs")
    return plan.cpus


# ---------------------------------------------------------------------------
# Binding
# ---------------------------------------------------------------------------


class BindResult(_Record):
    """What bind_to_node / bind_for_gpu applied.  Truthy when everything asked was,
    on the node asked for: ``node`` is the node actually used, ``asked`` the one asked
    (they differ when the cpuset forbids the node asked and its nearest was used)."""

    node: Optional[int]
    cpus: FrozenSet[int]  # the CPU set applied (empty: none)
    cpus_applied: bool
    cpu_reason: Optional[str]  # why not: "not requested", "EPERM", ...
    memory: Optional[PolicyResult]  # None: memory policy not requested
    threads_changed: Tuple[int, ...] = ()  # tids whose affinity was set
    threads_skipped: Tuple[int, ...] = ()  # pinned elsewhere already: left alone
    threads_failed: Tuple[Tuple[int, int], ...] = ()  # (tid, errno)
    plan: Optional[GpuPlan] = None
    notes: Tuple[str, ...] = ()
    asked: Optional[int] = None  # the node asked for (None: as ``node``)

    def __bool__(self) -> bool:
        if self.asked is not None and self.node != self.asked:
            return False
        cpu_ok = self.cpus_applied or self.cpu_reason == "not requested"
        return cpu_ok and (self.memory is None or self.memory.applied)

    def to_json(self) -> Dict[str, Any]:
        return _record_json(
            self, cpus={"cpus": sorted(self.cpus), "cpulist": format_cpulist(self.cpus)}
        )


def _set_affinity(
    backend: Backend, cpus: FrozenSet[int], threads: str, notes: List[str]
) -> Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[Tuple[int, int], ...]]:
    """Pin the calling thread, and with threads="all" every other thread of the process
    that is not pinned already (affinity narrower than the calling thread's was)."""
    before = backend.call("sched_getaffinity", 0)
    me = backend.call("gettid")
    backend.call("sched_setaffinity", 0, cpus)
    changed, skipped, failed = [me], [], []
    if threads == "all":
        try:
            tids = backend.call("threads")
        except OSError as err:
            tids = []
            notes.append(f"cannot list this process's threads: {err.strerror or err}")
        for tid in (t for t in tids if t != me):
            try:
                if not backend.call("sched_getaffinity", tid) >= before:
                    skipped.append(tid)
                    continue
                backend.call("sched_setaffinity", tid, cpus)
                changed.append(tid)
            except ProcessLookupError:
                continue  # the thread exited meanwhile
            except OSError as err:
                failed.append((tid, err.errno or errno.EIO))
    return tuple(changed), tuple(skipped), tuple(failed)


def _check_node(topo: Topology, node: int) -> None:
    """ValueError unless ``node`` is the id of a node of ``topo``."""
    if isinstance(node, bool) or not isinstance(node, int) or node not in topo.nodes:
        raise ValueError(f"no NUMA node {node!r} (online: {format_cpulist(topo.online_nodes)})")


def _bind_node(
    backend: Backend,
    topo: Topology,
    node: int,
    cpus: Union[bool, Iterable[int]],
    mem: Optional[str],
    threads: str,
    st: bool,
    infos: Optional[List[GpuInfo]] = None,
) -> BindResult:
    """bind_to_node on a topology (and GPU list) the caller has already read."""
    if threads not in ("all", "current"):
        raise ValueError(f"threads must be 'all' or 'current', not {threads!r}")
    _check_node(topo, node)
    notes: List[str] = []
    allowed = topo.allowed_cpus & topo.online_cpus
    want: FrozenSet[int] = frozenset()
    used = node  # the node bound in the end: another when the cpuset forbids this one
    if cpus is True:
        cnode = _nearest_cpu_node(topo, node)
        if cnode is not None:
            want = topo.nodes[cnode].cpus & allowed
            if cnode != node:
                notes.append(f"node {node} has no CPUs: using node {cnode}'s")
        if not want:
            near = [
                m for m in topo.nearest(node, topo.nodes_with_cpus) if topo.nodes[m].cpus & allowed
            ]
            if near:
                _fail(
                    st,
                    f"this process's cpuset allows no CPU on node {node};"
                    f" using the nearest node {near[0]}",
                    notes,
                )
                used = near[0]
                want = topo.nodes[used].cpus & allowed
            else:
                _fail(st, f"this process's cpuset allows no CPU on node {node}", notes)
    elif cpus is not False:
        asked = frozenset(cpus)
        want = asked & allowed
        if asked and not want:
            _fail(
                st,
                f"CPUs {format_cpulist(asked)} are outside this process's allowed "
                f"CPUs {format_cpulist(allowed)}",
            )
    if mem in ("interleave", "weighted-interleave") and infos is None:
        infos = _gpu_infos(topo, backend)
    pres: Optional[PolicyResult] = None
    if mem is not None:
        mnodes = _plan_memory(topo, infos or [], node, mem)
        if mem in ("prefer", "bind") and mnodes and node not in mnodes:
            msg = (
                f"node {node} has no memory this process may use; memory policy "
                f"{mem} on {_nodes_txt(mnodes)}, the nearest"
            )
            if node in topo.nodes_with_memory:  # the cpuset's doing, not the machine's
                _fail(st, msg)
                if used == node:
                    used = min(mnodes)
            notes.append(msg)
        # "socket" is preferred-many over the package's nodes; the rest name their mode
        if mem == "socket":
            mode = Mode.PREFERRED_MANY
        else:
            mode = MODE_NAMES[mem]
        if mode == Mode.LOCAL:  # takes no nodes
            pres = set_thread_policy(mode, None, strict=st, backend=backend)
        elif not mnodes:
            pres = _fallback(
                PolicyResult(False, _MODE_WORDS[mode].result, frozenset()),
                st,
                f"{mem} policy",
                "no-memory-node",
                errno.EINVAL,
            )
        else:
            pres = set_thread_policy(mode, mnodes, strict=st, backend=backend)
    if cpus is False:
        reason: Optional[str] = "not requested"
    elif want:
        reason = None
    else:
        reason = "cpuset"
    done: Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[Tuple[int, int], ...]] = ((), (), ())
    if reason is None:
        try:
            done = _set_affinity(backend, want, threads, notes)
        except OSError as err:
            if st:
                raise
            if isinstance(err, NotLiveError):
                reason = "not-live"
                notes.append(str(err))
            else:
                reason = _errno_reason(err.errno or errno.EIO)
                _warn_once(
                    f"bind:affinity:{reason}",
                    "numa_utils: CPU binding to %s not applied: %s",
                    format_cpulist(want),
                    err,
                )
    if reason is not None:
        want = frozenset()  # nothing bound
    return BindResult(
        used,
        want,
        reason is None,
        reason,
        pres,
        *done,
        None,
        tuple(notes),
        asked=node,
    )


def bind_to_node(
    node: int,
    *,
    cpus: Union[bool, Iterable[int]] = True,
    memory: Union[str, None, _Unset] = _UNSET,
    threads: str = "all",
    strict: Optional[bool] = None,
    backend: Optional[Backend] = None,
) -> BindResult:
    """Run on ``node``'s CPUs and allocate from its memory; say what was applied.

    ``cpus``: True (the node's allowed CPUs), False (leave affinity alone) or an
    explicit set (intersected with the allowed CPUs).  ``memory``: "prefer" (default,
    or NUMA_MEMORY_POLICY), "bind", "interleave" or "weighted-interleave" (every
    usable memory node except GPU memory), "socket" (prefer-many over the package's
    nodes), "local" or None (any mode word a result reports is taken); set through
    the safe layer for the calling thread and
    the threads it creates later (set_mempolicy is per thread): call this early.
    ``threads``: "all" also re-pins this process's other threads, except those pinned
    elsewhere already; "current" only the calling thread.  Memory is applied before
    CPUs, so a strict failure leaves both alone.
    """
    backend = _b(backend)
    st, mem = _strict_or_env(strict), _memory_or_env(memory)
    return _bind_node(backend, _planning_topology(backend), node, cpus, mem, threads, st)


def bind_for_gpu(
    device: int,
    policy: Optional[str] = None,
    *,
    reserve: Optional[int] = None,
    memory: Union[str, None, _Unset] = _UNSET,
    threads: str = "all",
    strict: Optional[bool] = None,
    pci_bus_id: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
    backend: Optional[Backend] = None,
) -> BindResult:
    """Bind this process (see bind_to_node) for CUDA device ``device``'s worker.

    ``policy`` as in cpus_for_gpu; "none" (NUMA_BIND_POLICY's default when no argument is
    given) leaves CPU affinity alone and only sets the memory policy.
    """
    backend = _b(backend)
    pol, res, mem, st = _plan_args(policy, reserve, memory, strict)
    topo, infos, r, plan = _device_plan(backend, device, pci_bus_id, environ, pol, res, mem, st)
    if plan.cpu_node is None:
        _fail(st, f"CUDA device {device}: no node to bind to ({r.how})")
        return BindResult(
            None, frozenset(), False, "unknown-node", None, plan=plan, notes=plan.notes
        )
    if pol == "none":
        cpus: Union[bool, FrozenSet[int]] = False  # memory policy only
    else:
        cpus = plan.cpus
    out = _bind_node(backend, topo, plan.cpu_node, cpus, mem, threads, st, infos)
    return out._replace(plan=plan, notes=plan.notes + out.notes)


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
    return {name: format_cpulist(cpus) for name, cpus in sets.items()}


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
        return _record_json(
            self,
            roles={"roles": _cpulists(self.roles)},
            left_out={"left_out": _cpulists(self.left_out)},
        )


def _role_counts(roles: Mapping[str, Union[int, str]]) -> Dict[str, Union[int, str]]:
    """``roles`` checked: each a number of cores >= 1, or "rest" for one role."""
    if not roles:
        raise ValueError("thread_plan: no roles given")
    rest = [role for role, want in roles.items() if want == "rest"]
    for role, want in roles.items():
        if not isinstance(role, str) or not role:
            raise ValueError(f"a role is named by a non-empty string, not {role!r}")
        count_ok = isinstance(want, int) and not isinstance(want, bool) and want >= 1
        if not count_ok and want != "rest":
            raise ValueError(f"role {role!r}: a number of cores >= 1 or 'rest', not {want!r}")
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
    left = list(units)
    out: Dict[str, FrozenSet[int]] = {}
    shared: List[str] = []
    for role, want in roles.items():
        count = len(units) - fixed
        if isinstance(want, int):
            count = want
        taken, left = left[: max(count, 0)], left[max(count, 0) :]
        if not taken and units:
            taken = [units[-1]]
            shared.append(role)
            _fail(
                strict,
                f"role {role!r}: no core left of the {len(units)} planned; "
                f"it shares CPUs {format_cpulist(units[-1])} with another role",
                notes,
            )
        out[role] = frozenset(cpu for unit in taken for cpu in unit)
    return out, tuple(shared)


def _omp_env(cpus: FrozenSet[int]) -> Dict[str, str]:
    """OpenMP variables that put one thread on each of ``cpus``, in CPU order: the
    standard's (OMP_*), GNU libgomp's (GOMP_CPU_AFFINITY) and Intel/LLVM libomp's
    (KMP_AFFINITY); {} when there is no CPU."""
    if not cpus:
        return {}
    ordered = sorted(cpus)
    places = ",".join("{" + str(cpu) + "}" for cpu in ordered)
    return {
        "OMP_NUM_THREADS": str(len(ordered)),
        "OMP_PLACES": places,
        "OMP_PROC_BIND": "close",
        "GOMP_CPU_AFFINITY": format_cpulist(ordered),
        "KMP_AFFINITY": f"granularity=fine,explicit,proclist=[{format_cpulist(ordered)}]",
    }


def _gpu_slice(
    backend: Backend,
    topo: Topology,
    gpu: int,
    pci_bus_id: Optional[str],
    environ: Optional[Mapping[str, str]],
    reserve: int,
    strict: bool,
    notes: List[str],
) -> Tuple[Optional[str], Optional[int], FrozenSet[int], Dict[str, FrozenSet[int]]]:
    """CUDA device ``gpu``'s (pci, node, CPUs) from the `exclusive` plan of every GPU,
    and why its node's other CPUs are not in it."""
    infos = _gpu_infos(topo, backend)
    found = _resolve(gpu, pci_bus_id, infos, backend, environ)
    notes.extend(found.notes)
    if found.gpu is None:
        _fail(strict, f"CUDA device {gpu}: not identified ({found.how}); no thread plan", notes)
        return None, None, frozenset(), {}
    planned = _plan_all(topo, _same_maker(infos, found.gpu), "exclusive", reserve, strict)
    node, cpus, gpu_notes = planned[found.gpu.pci]
    notes.extend(gpu_notes)
    others: Set[int] = set()
    for pci, (_, their_cpus, _) in planned.items():
        if pci != found.gpu.pci:
            others |= their_cpus
    if node is None:
        return found.gpu.pci, None, cpus, {}
    node_cpus = topo.nodes[node].cpus & topo.allowed_cpus & topo.online_cpus
    why = {
        "planned for another GPU": (node_cpus & others) - cpus,
        f"reserved (reserve={reserve})": node_cpus - others - cpus,
    }
    return found.gpu.pci, node, cpus, why


def _node_slice(
    topo: Topology, node: int, reserve: int, strict: bool, notes: List[str]
) -> Tuple[int, FrozenSet[int], Dict[str, FrozenSet[int]]]:
    """Node ``node``'s allowed CPUs (the nearest node's when it has none) but the first
    ``reserve`` cores (one core stays), and the reserved ones."""
    _check_node(topo, node)
    cpu_node = _nearest_cpu_node(topo, node)
    if cpu_node is None:
        _fail(strict, f"node {node}: no node with CPUs near it; no thread plan", notes)
        return node, frozenset(), {}
    if cpu_node != node:
        notes.append(f"node {node} has no CPUs: using node {cpu_node}'s")
    cores = topo.cores_of(topo.nodes[cpu_node].cpus & topo.allowed_cpus & topo.online_cpus)
    skip = min(reserve, max(len(cores) - 1, 0))
    reserved = frozenset(cpu for core in cores[:skip] for cpu in core)
    cpus = frozenset(cpu for core in cores[skip:] for cpu in core)
    if not cpus:
        _fail(strict, f"this process's cpuset allows no CPU on node {cpu_node}", notes)
    return cpu_node, cpus, {f"reserved (reserve={reserve})": reserved}


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
    backend: Optional[Backend] = None,
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
    if (gpu is None) == (node is None):
        raise ValueError("thread_plan: give a CUDA device index or node=, one of the two")
    if smt not in SMT_RULES:
        raise ValueError(f"smt must be one of {', '.join(SMT_RULES)}, not {smt!r}")
    wanted = _role_counts(roles)
    backend = _b(backend)
    _, res, _, st = _plan_args("exclusive", reserve, None, strict)
    topo = _planning_topology(backend)
    notes: List[str] = []
    pci: Optional[str] = None
    if gpu is not None:
        pci, cpu_node, cpus, why = _gpu_slice(
            backend, topo, gpu, pci_bus_id, environ, res, st, notes
        )
    else:
        cpu_node, cpus, why = _node_slice(topo, node, res, st, notes)  # type: ignore[arg-type]
    if cpu_node is not None:
        online = topo.nodes[cpu_node].cpus & topo.online_cpus
        why["outside this process's cpuset"] = online - topo.allowed_cpus
    units = topo.cores_of(cpus)
    if smt == "one":
        units = [core[:1] for core in units]
        why["SMT sibling (smt='one')"] = cpus - frozenset(core[0] for core in units)
    got, shared = _split_roles(units, wanted, st, notes)  # no units: every role empty
    left_out = {reason: found for reason, found in why.items() if found}
    memory = _plan_memory(topo, [], cpu_node, "prefer")
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


_SHARED_PAGES_HINT = (
    "pages that other processes map too move only with CAP_SYS_NICE (docker run "
    "--cap-add SYS_NICE); pages of files and shared memory may stay"
)


def _move_buffer(backend: Backend, buf: Any, order: List[int]) -> int:
    """move_pages(2) for ``buf``'s pages, spread over ``order``, 64 Ki pages a call;
    the pages the kernel did not put there (those not faulted in yet do not count).
    ``buf``: a buffer, or (address, length)."""
    if isinstance(buf, tuple):
        addr, length = buffer_range(buf[0], buf[1])
    else:
        addr, length = buffer_range(buf)
    start, size = _page_range(addr, length, backend.page_size)
    step = _MOVE_PAGES_LIMIT * backend.page_size
    unmoved = 0
    for first in range(start, start + size, step):
        pages = list(range(first, min(first + step, start + size), backend.page_size))
        targets = [order[at % len(order)] for at in range(len(pages))]
        status = move_pages(0, pages, targets, MbindFlag.MOVE, backend=backend)
        unmoved += sum(1 for got in status if got not in order and got != -errno.ENOENT)
    return unmoved


def settle(
    nodes: Iterable[int],
    buffers: Iterable[Any] = (),
    *,
    strict: Optional[bool] = None,
    backend: Optional[Backend] = None,
) -> PolicyResult:
    """Move the pages this process first-touched before it was bound onto ``nodes``.

    Without ``buffers``: every page of the process on the other DRAM nodes it may use
    (default_memory_nodes: GPU memory and slower tiers hold pages put there on
    purpose), with migrate_pages(2); with them (each a buffer or (address, length)):
    only their pages, with move_pages(2).  Truthy when every page asked for moved;
    ``resident_unmoved`` counts the bytes that stayed (pages other processes map too
    need CAP_SYS_NICE: ``hint`` says so).  Denied (Docker's default seccomp profile:
    EPERM) or unsupported: falsy with the fix (strict: OSError).
    """
    backend = _b(backend)
    st = _strict_or_env(strict)
    target = frozenset(nodes)
    if not target:
        raise ValueError("settle: no node to move pages to")
    order = sorted(target)
    result = PolicyResult(False, "migrate", target)
    buffers = list(buffers)
    try:
        if buffers:
            unmoved = sum(_move_buffer(backend, buf, order) for buf in buffers)
        else:
            others = default_memory_nodes(backend=backend) - target
            unmoved = migrate_pages(0, others, target, backend=backend)
    except OSError as e:
        err = e.errno or errno.EIO
        return _fallback(result, st, "settle", _errno_reason(err), err)
    if unmoved:
        left = result._replace(
            reason="unmoved", resident_unmoved=unmoved * backend.page_size, hint=_SHARED_PAGES_HINT
        )
        return _fallback(left, st, "settle")
    return result._replace(applied=True)


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

    @property
    def failed(self) -> bool:
        """It matched a role, did not exit meanwhile, and is not on the role's CPUs."""
        return self.role is not None and not self.ok and self.reason != "exited"

    def to_json(self) -> Dict[str, Any]:
        return _record_json(
            self,
            before={"before": format_cpulist(self.before)},
            after={"after": format_cpulist(self.after)},
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
    settled: Optional[PolicyResult] = None  # settle=True: the pages moved to the plan's

    def __bool__(self) -> bool:
        return not any(pin.failed for pin in self.threads)


def _role_patterns(
    plan: ThreadPlan, match: Mapping[str, str], default: Optional[str]
) -> Dict[str, re.Pattern[str]]:
    """``match``'s regular expressions compiled, each naming a role of ``plan``."""
    for role in [*match, default]:
        if role is not None and role not in plan.roles:
            raise ValueError(f"role {role!r} is not in the plan ({', '.join(plan.roles)})")
    patterns: Dict[str, re.Pattern[str]] = {}
    for role, text in match.items():
        try:
            patterns[role] = re.compile(text)
        except re.error as err:
            raise ValueError(f"role {role!r}: invalid thread-name pattern {text!r}: {err}") from err
    return patterns


def _thread_name(backend: Backend, tid: int) -> str:
    return _clean(_read_optional(backend, f"/proc/self/task/{tid}/comm") or "")


def _pin_thread(
    backend: Backend,
    plan: ThreadPlan,
    patterns: Mapping[str, re.Pattern[str]],
    default: Optional[str],
    tid: int,
) -> ThreadPin:
    """Thread ``tid`` pinned to the CPUs of the first role whose pattern its name
    matches (``default`` when none does)."""
    name = _thread_name(backend, tid)
    role = default
    for candidate, pattern in patterns.items():
        if pattern.search(name):
            role = candidate
            break
    nothing: FrozenSet[int] = frozenset()
    try:
        before = backend.call("sched_getaffinity", tid)
    except ProcessLookupError:
        return ThreadPin(tid, name, role, nothing, nothing, False, "exited")
    if role is None:
        return ThreadPin(tid, name, None, before, before, False, "no role")
    want = plan.roles[role]
    if not want:
        return ThreadPin(tid, name, role, before, before, False, "role has no CPUs")
    try:
        backend.call("sched_setaffinity", tid, want)
        after = backend.call("sched_getaffinity", tid)
    except ProcessLookupError:
        return ThreadPin(tid, name, role, before, nothing, False, "exited")
    except OSError as err:
        reason = _errno_reason(err.errno or errno.EIO)
        return ThreadPin(tid, name, role, before, before, False, reason)
    if after != want:
        return ThreadPin(tid, name, role, before, after, False, "the kernel applied other CPUs")
    return ThreadPin(tid, name, role, before, after, True)


def pin_threads(
    plan: ThreadPlan,
    match: Optional[Mapping[str, str]] = None,
    *,
    default: Optional[str] = None,
    settle: bool = False,
    strict: Optional[bool] = None,
    backend: Optional[Backend] = None,
) -> PinResult:
    """Pin every thread of this process to the CPUs of its role in ``plan``.

    ``match`` maps a role to a regular expression searched in each thread's name
    (/proc/self/task/TID/comm: "NCCL", "ucx", "ZMQbg"); the first role that matches
    wins, ``default`` takes the rest (None: they are left alone and listed in
    ``unmatched``).  Threads that appear while it works are pinned by another pass,
    until a pass finds none new.  Threads started afterwards inherit the mask of the
    thread that starts them (``inherit``).  ``settle``: then move the pages the process
    placed elsewhere to the plan's memory nodes (see settle; ``settled``).  Strict:
    OSError when a matched thread could not be pinned.
    """
    backend = _b(backend)
    st = _strict_or_env(strict)
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
        new = [tid for tid in backend.call("threads") if tid not in seen]
    if new:
        _fail(st, f"threads kept starting: {len(new)} not pinned after {passes} passes", notes)
    for pin in seen.values():
        if pin.failed:
            msg = f"thread {pin.tid} ({pin.name}): not pinned to role {pin.role}: {pin.reason}"
            _fail(st, msg, notes)
    unmatched = tuple(pin.tid for pin in seen.values() if pin.role is None)
    moved = None
    if settle and plan.memory_nodes:
        moved = _settle(plan.memory_nodes, strict=st, backend=backend)
    elif settle:
        _fail(st, "settle: the plan names no memory node; the pages stay where they are", notes)
    threads = tuple(seen.values())
    return PinResult(threads, unmatched, tuple(late), passes, notes=tuple(notes), settled=moved)


class pinned:
    """Context manager: pin_threads(plan, match, ...) on entry (the PinResult is what
    ``as`` gets); on exit every thread mask it changed is put back (threads that exited
    meanwhile are skipped), and the calling thread's memory policy when ``memory``
    ("prefer", "bind", ...) set it to the plan's memory nodes."""

    def __init__(
        self,
        plan: ThreadPlan,
        match: Optional[Mapping[str, str]] = None,
        *,
        default: Optional[str] = None,
        memory: Optional[str] = None,
        strict: Optional[bool] = None,
        backend: Optional[Backend] = None,
    ) -> None:
        self.plan = plan
        self.match = match
        self.default = default
        self.memory = memory
        self.strict = strict
        self.backend = backend
        self.result: Optional[PinResult] = None
        self.restored: List[int] = []  # tids whose mask was put back
        self._policy: Optional[thread_policy] = None

    def __enter__(self) -> PinResult:
        if self.memory is not None:
            policy = thread_policy(
                self.memory, self.plan.memory_nodes, strict=self.strict, backend=self.backend
            )
            policy.__enter__()
            self._policy = policy
        self.result = pin_threads(
            self.plan, self.match, default=self.default, strict=self.strict, backend=self.backend
        )
        return self.result

    def __exit__(self, *exc: Any) -> None:
        backend = _b(self.backend)
        changed = []
        if self.result is not None:
            changed = [pin for pin in self.result.threads if pin.before and pin.after != pin.before]
        for pin in changed:
            try:
                backend.call("sched_setaffinity", pin.tid, pin.before)
                self.restored.append(pin.tid)
            except ProcessLookupError:
                continue
            except OSError as err:
                _warn_once(
                    f"pinned-restore:{pin.tid}",
                    "numa_utils: could not restore thread %s's CPU mask: %s",
                    pin.tid,
                    err,
                )
        if self._policy is not None:
            self._policy.__exit__(*exc)


_WORKER_ROLES: Mapping[str, Union[int, str]] = MappingProxyType({"worker": "rest"})


def _start_bound(
    start: Callable[[], None],
    backend: Backend,
    cpus: FrozenSet[int],
    memory: Optional[str],
    nodes: Tuple[int, ...],
    strict: Optional[bool],
) -> None:
    """``start()`` run with the calling thread on ``cpus`` under memory policy
    ``memory`` on ``nodes``, both put back after: a process forked meanwhile starts
    with them, before its first page or thread exists."""
    before = backend.call("sched_getaffinity", 0)
    policy = None
    if memory is not None and nodes:
        policy = thread_policy(memory, nodes, strict=strict, backend=backend)
        policy.__enter__()
    try:
        if cpus:
            backend.call("sched_setaffinity", 0, cpus)
        start()
    finally:
        backend.call("sched_setaffinity", 0, before)
        if policy is not None:
            policy.__exit__(None, None, None)


def spawn_context(
    gpu: Optional[int] = None,
    *,
    node: Optional[int] = None,
    roles: Mapping[str, Union[int, str]] = _WORKER_ROLES,
    role: str = "worker",
    memory: Optional[str] = "prefer",
    method: str = "spawn",
    strict: Optional[bool] = None,
    environ: Optional[Mapping[str, str]] = None,
    backend: Optional[Backend] = None,
) -> Any:
    """A multiprocessing context whose children start bound: on role ``role``'s CPUs
    of thread_plan(gpu, node=node, roles=roles), under memory policy ``memory`` on the
    plan's memory nodes, from their first instruction (no numactl binary).

    The thread that starts a child binds itself for the fork and then puts its own
    mask and policy back; the child inherits both.  ``method``: "spawn" or "fork" (a
    forkserver's children are forked by the server, which this cannot bind).
    ``ctx.plan`` is the plan; use the context as multiprocessing's own
    (``ctx.Process``, ``ctx.Pool``, ``ProcessPoolExecutor(mp_context=ctx)``).
    """
    if method not in ("spawn", "fork"):
        raise ValueError(f"spawn_context: method must be 'spawn' or 'fork', not {method!r}")
    plan = thread_plan(gpu, node=node, roles=roles, strict=strict, environ=environ, backend=backend)
    if role not in plan.roles:
        known = ", ".join(plan.roles)
        raise ValueError(f"role {role!r} is not in the plan ({known})")
    import multiprocessing

    base: Any = multiprocessing.get_context(method)
    b = _b(backend)

    class BoundProcess(base.Process):  # type: ignore[misc]
        def start(self) -> None:
            start = super().start
            _start_bound(start, b, plan.roles[role], memory, plan.memory_nodes, strict)

        def __reduce__(self) -> Any:
            # a spawned child unpickles a process of the plain kind: this class is local
            return (object.__new__, (base.Process,), self.__dict__)

    context = type(base)()
    context.Process = BoundProcess
    context.plan = plan
    return context


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
        return _record_json(
            self, cpus={"cpus": sorted(self.cpus), "cpulist": format_cpulist(self.cpus)}
        )


def _gpu_instances(
    topo: Topology, infos: List[GpuInfo], n: int, per: int, reserve: int, strict: bool
) -> List[InstancePlan]:
    """Instance i: GPUs i*per ... (PCI order), with their `exclusive` CPUs."""
    fam = _family(infos)
    needed = n * per
    if needed > len(fam):
        raise ValueError(
            f"{n} instances of {per} GPUs need {needed} GPUs; this host has {len(fam)}"
        )
    planned = _plan_all(topo, infos, "exclusive", reserve, strict)
    out = []
    for index in range(n):
        first = index * per
        picked = range(first, first + per)
        cpus: Set[int] = set()
        nodes: Set[int] = set()
        memory: Set[int] = set()
        for gpu in picked:
            node, their_cpus, _ = planned[fam[gpu].pci]
            cpus |= their_cpus
            nodes |= {node} - {None}  # type: ignore[arg-type]
            memory.update(_plan_memory(topo, infos, node, "prefer"))
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
                tuple(sorted(memory)),
                env,
            )
        )
    return out


def _node_instances(topo: Topology, n: int) -> List[InstancePlan]:
    """Instance i: a run of whole nodes (those with CPUs this process may use)."""
    allowed = topo.allowed_cpus & topo.online_cpus
    usable = [node for node in sorted(topo.nodes_with_cpus) if topo.nodes[node].cpus & allowed]
    if n > len(usable):
        raise ValueError(
            f"{n} CPU-only instances need {n} nodes with CPUs; this process may use {len(usable)}"
        )
    out = []
    for index, run in enumerate(_chunks(len(usable), n)):
        nodes = [usable[at] for at in run]
        cpus = frozenset(cpu for node in nodes for cpu in topo.nodes[node].cpus & allowed)
        memory: Set[int] = set()
        for node in nodes:
            memory.update(_plan_memory(topo, [], node, "prefer"))
        out.append(InstancePlan(index, (), (), cpus, tuple(nodes), tuple(sorted(memory)), {}))
    return out


def _note_shared_memory(plans: List[InstancePlan]) -> List[InstancePlan]:
    """``plans`` with a note on each instance whose memory nodes another one uses."""
    out = []
    for plan in plans:
        shared: Set[int] = set()
        for other in plans:
            if other.instance != plan.instance:
                shared |= set(plan.memory_nodes) & set(other.memory_nodes)
        if shared:
            note = f"memory on nodes {format_cpulist(shared)} is shared with another instance"
            plan = plan._replace(notes=plan.notes + (note,))
        out.append(plan)
    return out


def instance_plans(
    n: int,
    *,
    gpus_per_instance: int = 1,
    reserve: Optional[int] = None,
    strict: Optional[bool] = None,
    backend: Optional[Backend] = None,
) -> List[InstancePlan]:
    """Disjoint shares of this host for ``n`` engines: GPUs, CPUs and memory nodes.

    With ``gpus_per_instance`` >= 1, instance i gets the GPUs i*g ... i*g+g-1 in PCI
    order (``environ`` names them for its process) and their `exclusive` CPUs;
    memory comes from their nodes, shared (and noted) when two instances' GPUs sit on
    one node.  With 0 (CPU-only engines) each instance gets a run of whole nodes.
    Too few GPUs or nodes: ValueError.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"instance_plans: n must be an integer >= 1, not {n!r}")
    per = gpus_per_instance
    if isinstance(per, bool) or not isinstance(per, int) or per < 0:
        raise ValueError(f"gpus_per_instance must be an integer >= 0, not {per!r}")
    backend = _b(backend)
    _, res, _, st = _plan_args("exclusive", reserve, None, strict)
    topo = _planning_topology(backend)
    if per == 0:
        return _note_shared_memory(_node_instances(topo, n))
    infos = _gpu_infos(topo, backend)
    return _note_shared_memory(_gpu_instances(topo, infos, n, per, res, st))


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
        return sum(
            value for node, value in self.bytes_by_node.items() if node not in self.local_nodes
        )

    @property
    def local_bytes(self) -> int:
        return self.total_bytes - self.remote_bytes

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
            f"({format_kib(self.remote_bytes // 1024)}) sit off the nodes of its CPUs "
            f"({_nodes_txt(self.local_nodes)}); above the {self.threshold:.0%} threshold: "
            "bind its memory to its CPUs' node or move its CPUs to where the memory is"
        )

    def to_json(self) -> Dict[str, Any]:
        total, by = self.total_bytes, sorted(self.bytes_by_node.items())
        return _record_json(
            self,
            bytes_by_node={
                "bytes_by_node": {str(node): v for node, v in by},
                "share_by_node": {str(node): _fraction(v, total) for node, v in by},
            },
            threshold={
                "total_bytes": total,
                "remote_bytes": self.remote_bytes,
                "remote_share": self.share,
                "threshold": self.threshold,
                "over_threshold": self.over_threshold,
            },
        )


def _local_memory(topo: Topology, cpus: FrozenSet[int]) -> FrozenSet[int]:
    """The memory nodes local to ``cpus``: their nodes, and for a CPU node without
    memory the nearest with memory (where the kernel's local allocation goes)."""
    if not topo.has_node_dir:
        return frozenset({0})
    local: Set[int] = set()
    for cpu in cpus:
        node = topo.node_of_cpu(cpu)
        if node is not None:
            local.update(_nearest_tied(topo, node, topo.nodes_with_memory))
    return frozenset(local)


def _remote_share(
    pid: Union[int, str],
    maps: Union[str, OSError],
    threshold: float,
    topo: Topology,
    backend: Backend,
) -> Tuple[RemoteShare, List[NumaMapsEntry]]:
    """remote_share on numa_maps text already read (or the error reading it), and the
    entries parsed from it."""
    entries: List[NumaMapsEntry] = []
    error = None
    if isinstance(maps, OSError):
        error = f"cannot read /proc/{pid}/numa_maps: {maps.strerror or maps}"
    else:
        try:
            entries = parse_numa_maps(maps, page_size_kb=_page_kb(backend))
        except ValueError as err:  # a malformed line (parse_numa_maps names it)
            error = str(err)
    try:
        cpus: Optional[FrozenSet[int]] = _allowed_from_status(backend, pid)[0]
    except ValueError:
        cpus = None
    if cpus is None:
        cpus = topo.allowed_cpus if pid == "self" else frozenset()
        error = error or f"cannot read Cpus_allowed_list of /proc/{pid}/status"
    res = RemoteShare(
        pid,
        MappingProxyType(_entries_bytes(entries)),
        frozenset(cpus),
        _local_memory(topo, cpus),
        threshold,
        error,
    )
    if res.warning:
        _warn_once(f"remote-share:{pid}", "numa_utils: %s", res.warning)
    return res, entries


def remote_share(
    pid: Union[int, str] = "self",
    *,
    threshold: float = REMOTE_SHARE_THRESHOLD,
    topology: Optional[Topology] = None,
    backend: Optional[Backend] = None,
) -> RemoteShare:
    """The share of ``pid``'s pages (numa_maps) that sit off the nodes of the CPUs it
    may run on (Cpus_allowed_list).  Never raises: an unreadable process gives a
    result with ``error`` set and no pages.  Warns once when above ``threshold``."""
    backend = _b(backend)
    topo = _topology_or_read(topology, backend)
    try:
        maps: Union[str, OSError] = backend.read_text(_maps_path(pid))
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
        return _record_json(self)


class NodeChoice(_Record):
    """What ``choose_node`` picked and why.  Falsy when no node could be chosen."""

    node: Optional[int]
    reason: str
    candidates: Tuple[NodeCandidate, ...] = ()
    gpu_node: Optional[int] = None

    def __bool__(self) -> bool:
        return self.node is not None

    def to_json(self) -> Dict[str, Any]:
        return _record_json(self)


def _resolve_gpu(
    gpu: Any, topo: Topology, backend: Backend, environ: Optional[Mapping[str, str]]
) -> Tuple[Optional[int], str]:
    """(the GPU's own node, label) for a CUDA device index (as this process numbers
    it: CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER honoured), a PCI address or a
    GpuInfo.  The node may be memory-only (GPU memory exposed as a node)."""
    if isinstance(gpu, GpuInfo):
        return gpu.node, f"GPU {gpu.pci}"
    infos = _gpu_infos(topo, backend)
    if isinstance(gpu, bool) or not isinstance(gpu, (int, str)):
        raise TypeError(f"gpu must be a CUDA device index, a PCI address or a GpuInfo, not {gpu!r}")
    if isinstance(gpu, str):
        r = _resolve(0, gpu, infos, backend, environ)
        if r.gpu is None:
            known = ", ".join(g.pci for g in infos) or "none"
            raise ValueError(f"no GPU at PCI address {gpu!r} ({r.how}); GPUs: {known}")
        return r.gpu.node, f"GPU {r.gpu.pci}"
    r = _resolve(gpu, None, infos, backend, environ)
    if r.gpu is None:
        raise ValueError(f"no GPU {gpu}: {r.how}")
    return r.gpu.node, f"CUDA device {gpu} (GPU {r.gpu.pci})"


def choose_node(
    *,
    gpu: Any = None,
    need_bytes: int = 0,
    exclude: Iterable[int] = (),
    loads: Optional[Mapping[int, int]] = None,
    environ: Optional[Mapping[str, str]] = None,
    backend: Optional[Backend] = None,
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
    backend = _b(backend)
    # The cpuset, not this thread's affinity: after bind_to_node the affinity is one
    # node, and a new worker may still go anywhere the cpuset allows.
    topo = _planning_topology(backend)
    snap = counters(backend=backend)
    excluded = frozenset(exclude)
    usable_mem = default_memory_nodes(topo)
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

    need_kb = (max(int(need_bytes), 0) + 1023) // 1024
    cands: List[NodeCandidate] = []
    for node in nodes:
        mnode = next(iter(_nearest_tied(topo, node, usable_mem)), None)
        candidate = None
        memory_distance = None
        if mnode is not None:
            candidate = snap.nodes.get(mnode)
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
                load=int((loads or {}).get(node, 0)),
                gpu_distance=gpu_distance,
                memory_distance=memory_distance,
                fits=avail >= need_kb,
            )
        )
    if not cands:
        allowed = format_cpulist(topo.allowed_cpus) or "-"
        if skipped:
            reason = (
                f"no node with CPUs is usable (excluded: {format_cpulist(skipped)});"
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
    mem_txt = format_kib(best.available_kb)
    if best.memory_node not in (None, best.node):
        mem_txt = f"{mem_txt} on its nearest memory node {best.memory_node}"
    if not fitting:
        parts.append(
            f"no node has {format_kib(need_kb)} available; "
            f"node {best.node} has the most ({mem_txt})"
        )
    else:
        available = f"{mem_txt} available (MemFree + reclaimable page cache)"
        if need_kb:
            available += f" for the {format_kib(need_kb)} needed"
        workers = f"{best.load} worker(s) already there"
        if len(fitting) > 1 and gnode is None:
            workers += f" (fewest among {len(fitting)} fitting node(s))"
        parts += [available, workers]
    if len(cands) == 1:
        parts.append("it is the only usable node with CPUs")
    return NodeChoice(best.node, f"node {best.node}: " + "; ".join(parts), tuple(cands), gnode)


# ---------------------------------------------------------------------------
# GPU pinning: cudaHostRegister (ROCm: hipHostRegister) in chunks from several threads.
# ---------------------------------------------------------------------------


class CudaHostRegisterFlag(enum.IntFlag):
    """cudaHostRegister flags (cuda_runtime_api.h, driver_types.h)."""

    DEFAULT = 0
    PORTABLE = 1  # pinned for every CUDA context, not only the current one
    MAPPED = 2  # also mapped into the device address space
    IO_MEMORY = 4
    READ_ONLY = 8


# Sonames tried by name (the loader's own search path) after torch and find_library;
# newest first, CUDA's before ROCm's.  Never an absolute path.
_CUDART_SONAMES = (
    "libcudart.so.13",
    "libcudart.so.12",
    "libcudart.so.11.0",
    "libcudart.so",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
)


class _PinApi(_Record):
    """The entry points pinning calls in one runtime (cuda_runtime_api.h,
    hip_runtime_api.h): the same signatures and the same flag values in both."""

    runtime: str
    register: str
    unregister: str
    error_string: str
    last_error: str
    get_device: str
    set_device: str
    device_pointer: str


_PIN_APIS = (
    _PinApi(
        "CUDA",
        "cudaHostRegister",
        "cudaHostUnregister",
        "cudaGetErrorString",
        "cudaGetLastError",
        "cudaGetDevice",
        "cudaSetDevice",
        "cudaHostGetDevicePointer",
    ),
    _PinApi(
        "HIP",
        "hipHostRegister",
        "hipHostUnregister",
        "hipGetErrorString",
        "hipGetLastError",
        "hipGetDevice",
        "hipSetDevice",
        "hipHostGetDevicePointer",
    ),
)


def _entry(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> Any:
    """``lib``'s function ``name`` with its prototype set, or None where it lacks it."""
    fn = getattr(lib, name, None)
    if fn is not None:
        fn.restype = restype
        fn.argtypes = list(argtypes)
    return fn


class _PinCalls:
    """One loaded runtime's pinning calls; an optional one is None where the library
    lacks it (a fake, an old runtime)."""

    def __init__(self, lib: ctypes.CDLL, api: _PinApi) -> None:
        c_int, c_void_p = ctypes.c_int, ctypes.c_void_p
        self.api = api
        self.register = _entry(lib, api.register, c_int, c_void_p, ctypes.c_size_t, ctypes.c_uint)
        self.unregister = _entry(lib, api.unregister, c_int, c_void_p)
        self.error_string = _entry(lib, api.error_string, ctypes.c_char_p, c_int)
        self.last_error = _entry(lib, api.last_error, c_int)
        self.get_device = _entry(lib, api.get_device, c_int, ctypes.POINTER(c_int))
        self.set_device = _entry(lib, api.set_device, c_int, c_int)
        self.device_pointer = _entry(
            lib, api.device_pointer, c_int, ctypes.POINTER(c_void_p), c_void_p, ctypes.c_uint
        )

    def clear_error(self) -> None:
        """Read (and so clear) the calling thread's "last error": left there, the
        engine's next kernel-launch check reports it as its own."""
        if self.last_error is not None:
            self.last_error()


def _cudart_candidates(backend: Backend) -> List[str]:
    """Where libcudart may be, best first: the copy this process already loaded
    (torch imported it: /proc/self/maps), torch's lib dir and the nvidia-cuda-runtime
    wheel beside it, ctypes.util.find_library, then sonames (libamdhip64's last)."""
    import ctypes.util
    import glob

    out: List[str] = []
    if "torch" in sys.modules and backend.is_live:
        maps = _read_optional(backend, "/proc/self/maps") or ""
        # the path: the sixth field, the rest of the line (it may hold spaces)
        out += dict.fromkeys(
            re.findall(r"^(?:\S+ +){5}(.*/libcudart\.so[0-9.]*)$", maps, re.MULTILINE)
        )
        base = os.path.dirname(getattr(sys.modules["torch"], "__file__", None) or "")
        if base:
            for d in (
                os.path.join(base, "lib"),
                os.path.join(os.path.dirname(base), "nvidia", "cuda_runtime", "lib"),
            ):
                out += sorted(
                    glob.glob(os.path.join(glob.escape(d), "libcudart.so*")), reverse=True
                )
    found = ctypes.util.find_library("cudart")
    if found:
        out.append(found)
    return out + list(_CUDART_SONAMES)


def _in_library_path(names: List[str]) -> List[str]:
    """``names``, each bare soname preceded by the copies of it in LD_LIBRARY_PATH as
    the environment says it now.  The loader read that variable once, when the
    process started: a test kit that sets it later would otherwise get the system's
    copy of the library it named."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    out: List[str] = []
    for name in names:
        if "/" not in name:
            paths = [os.path.join(d, name) for d in dirs]
            out += [p for p in paths if os.path.isfile(p)]
        out.append(name)
    return out


def _load_cudart(cudart: Any, backend: Backend) -> Tuple[Optional[_PinCalls], str]:
    """(the runtime's calls, where it was found) or (None, why not)."""
    if isinstance(cudart, ctypes.CDLL):
        lib = cudart
        where = getattr(cudart, "_name", "libcudart")
    else:
        if cudart is not None:
            names = [os.fspath(cudart)]
        else:
            names = _cudart_candidates(backend)
        found, where, errors = _dlopen(_in_library_path(names))
        if found is None and cudart is None:
            tried = ", ".join(names)
            return None, f"neither libcudart nor libamdhip64 found (tried {tried})"
        if found is None:
            return None, f"cannot load {cudart}: {errors[-1]}"
        lib = found
    for api in _PIN_APIS:
        calls = _PinCalls(lib, api)
        if calls.register is not None and calls.unregister is not None:
            return calls, where
    return (
        None,
        f"{where} lacks the CUDA runtime API and HIP's (no cudaHostRegister, no hipHostRegister)",
    )


class CudaPinProgress(_Record):
    """How far a registration got: bytes registered, calls made, the longest call."""

    bytes: int
    calls: int
    longest_s: float


# One cudaHostRegister call holds the driver's lock for its whole length (every CUDA
# call of the process waits: 11.6 s for 94 GB, vLLM #51414), and one of 512 GiB or
# more fails outright (vLLM #51081).  So each call is cut at a budget, and never
# reaches this, whatever ``chunk`` says.
_PIN_CALL_MAX = 511 << 30


def _join(threads: List[threading.Thread]) -> None:
    """Wait for each of ``threads`` that runs.  One not yet running when the caller
    has already set the stop flag finds it set and registers nothing."""
    for t in threads:
        if t.is_alive() and t is not threading.current_thread():
            t.join()


def _cuda_error(calls: _PinCalls, rc: int) -> str:
    text = None
    try:
        if calls.error_string is not None:
            text = calls.error_string(rc)
    except Exception:  # a foreign library; its message is a nicety (text stays None)
        pass
    if not text:
        return f"{calls.api.runtime} error {rc}"
    return f"{calls.api.runtime} error {rc} ({text.decode('utf-8', 'replace')})"


class CudaPin:
    """Host memory registered with CUDA or HIP (``pin_for_cuda``).  Truthy when
    registered.

    Use as a context manager or call ``close()``: every chunk is unregistered.  With
    ``background=True`` it is returned at once: ``ready`` says the work has ended
    (registered, or failed with ``reason``, ``error`` and ``failed_chunk``),
    ``wait(timeout)`` blocks until then, ``progress`` says how far it is.
    ``device_pointer``: for a MAPPED registration, the GPU's address of ``addr``.
    """

    def __init__(
        self,
        addr: int,
        length: int,
        flags: int,
        calls: Optional[_PinCalls],
        library: Optional[str],
        threads: int = 0,
    ) -> None:
        self.ok = False
        self.addr, self.length, self.flags, self.threads = addr, length, flags, threads
        self.reason: Optional[str] = None  # why not registered ("libcudart not found" ...)
        self.error: Optional[int] = None  # cudaError_t (hipError_t) of the failing call
        self.failed_chunk: Optional[Tuple[int, int]] = None  # (address, bytes) of it
        self.device_pointer: Optional[int] = None
        self.library = library
        self.progress = CudaPinProgress(0, 0, 0.0)
        self._calls = calls
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._stop = False
        self._worker: Optional[threading.Thread] = None
        # What the threads did, under _lock.  A chunk is in _in_call from before its
        # call until its outcome is recorded: an exception between the two leaves it
        # there, and the undo unregisters it (it may or may not have been registered).
        self._registered: List[Tuple[int, int]] = []
        self._in_call: Dict[int, Tuple[int, int]] = {}  # thread id -> its chunk
        self._unsure: Set[int] = set()  # starts of chunks left in a call
        self._failed: List[Tuple[int, int, int]] = []  # (address, bytes, error)
        self._running = 0  # pool threads that may still register
        # what stopped it: (reason, the exception, errno for strict)
        self._cause: Optional[Tuple[str, Optional[BaseException], int]] = None

    def __bool__(self) -> bool:
        return self.ok

    @property
    def chunks(self) -> Tuple[Tuple[int, int], ...]:
        """(address, bytes) of each chunk registered now, by address."""
        with self._lock:
            return tuple(sorted(self._registered))

    @property
    def ready(self) -> bool:
        """The registration has ended (check ``bool(pin)`` or ``reason`` for how)."""
        return self._ended.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until ``ready`` (at most ``timeout`` seconds); returns ``ready``."""
        return self._ended.wait(timeout)

    @property
    def closed(self) -> bool:
        return not self.ok and self.ready

    def close(self) -> None:
        """Stop a background registration, then unregister every chunk (idempotent).
        Failures are logged, not raised."""
        self._stop = True
        if self._worker is not None:
            _join([self._worker])
        self._release()

    def _release(self) -> None:
        """Unregister every chunk, the last first.  A chunk leaves the list only after
        its call: an interrupt between the two costs a second call, never a chunk left
        registered with nothing to release it."""
        calls = self._calls
        while True:
            with self._lock:
                self.ok = False
                if not self._registered:
                    break
                start = self._registered[-1][0]
            assert calls is not None
            rc = calls.unregister(ctypes.c_void_p(start))
            with self._lock:
                self._registered.pop()
            if rc == 0:
                continue
            calls.clear_error()
            if start not in self._unsure:  # a chunk left in a call may not be registered
                _warn_once(
                    f"{calls.api.unregister}:{rc}",
                    "numa_utils: host memory unregister failed: %s: %s",
                    calls.api.unregister,
                    _cuda_error(calls, rc),
                )
        self._ended.set()

    def __enter__(self) -> CudaPin:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.ok:
            state = "registered"
        elif not self.ready:
            state = "registering"
        else:
            state = f"not registered: {self.reason or 'closed'}"
        return (
            f"CudaPin(0x{self.addr:x}, {self.length} bytes, {len(self.chunks)} chunk(s), {state})"
        )

    def to_json(self) -> Dict[str, Any]:
        return {
            "ok": self.ok,
            "ready": self.ready,
            "addr": self.addr,
            "length": self.length,
            "flags": self.flags,
            "chunks": len(self.chunks),
            "threads": self.threads,
            "reason": self.reason,
            "error": self.error,
            "failed_chunk": self.failed_chunk,
            "device_pointer": self.device_pointer,
            "library": self.library,
            "progress": self.progress._asdict(),
        }

    def _give_up(
        self,
        reason: str,
        strict: bool,
        cause: Optional[BaseException] = None,
        err: int = errno.EIO,
    ) -> None:
        """Unregister what was registered, then raise (strict) or log ``reason``."""
        self.reason = reason
        self._release()
        if strict:
            raise OSError(err, f"host memory not pinned for CUDA: {reason}") from cause
        _fail(False, f"host memory not pinned for CUDA: {reason}")

    def _stopped_by(self, what: str, exc: Optional[BaseException], err: int = errno.EIO) -> None:
        """Stop every thread; the first cause is the one reported."""
        with self._lock:
            self._stop = True
            if self._cause is None:
                self._cause = (what, exc, err)

    def _next_chunk(self, todo: Iterator[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
        """The next chunk to register, or None: all taken, one failed, or stopped.
        Called under _lock."""
        if self._failed or self._stop:
            return None
        return next(todo, None)

    def _register_chunks(self, todo: Iterator[Tuple[int, int]], device: Optional[int]) -> None:
        """Register chunks from ``todo`` until none is left, one fails or the pin is
        stopped.  An exception here (KeyboardInterrupt in the main thread, anything
        in another) stops the other threads too."""
        import time

        calls = self._calls
        assert calls is not None
        me = threading.get_ident()
        try:
            if device is not None:  # _cuda_current_device: None without cudaSetDevice
                calls.set_device(device)
            while True:
                with self._lock:
                    piece = self._next_chunk(todo)
                    if piece is None:
                        return
                    self._in_call[me] = piece
                address, length = piece
                t0 = time.monotonic()
                rc = calls.register(ctypes.c_void_p(address), length, self.flags)
                took = time.monotonic() - t0
                if rc != 0:
                    calls.clear_error()
                self._record(me, piece, rc, took)
        except BaseException as err:
            self._stopped_by(f"registering stopped by {err!r}", err)

    def _pool_worker(self, todo: Iterator[Tuple[int, int]], device: Optional[int]) -> None:
        """A thread of the pool: counted in ``_running`` while it may register."""
        with self._lock:
            if self._stop:
                return
            self._running += 1
        try:
            self._register_chunks(todo, device)
        finally:
            with self._lock:
                self._running -= 1

    def _wait_for_pool(self) -> None:
        """Wait until no thread of the pool can register: the caller has set the stop
        flag.  A worker checks the flag and counts itself in ``_running`` under the
        lock, so once the count, read under the lock, is zero, none registers again.
        No Thread.join: cut short by Ctrl-C, a join leaves the thread's lock in a state
        where the next join waits for ever on Python 3.8 (bpo-45274) and returns at
        once on 3.11."""
        import time

        while True:
            with self._lock:
                if not self._running:
                    return
            time.sleep(0.001)

    def _record(self, me: int, piece: Tuple[int, int], rc: int, took: float) -> None:
        with self._lock:
            pinned = 0
            if rc == 0:
                self._registered.append(piece)
                pinned = piece[1]
            else:
                self._failed.append((*piece, rc))
            del self._in_call[me]
            p = self.progress
            self.progress = CudaPinProgress(p.bytes + pinned, p.calls + 1, max(p.longest_s, took))

    def _start_threads(
        self,
        pool: List[threading.Thread],
        todo: Iterator[Tuple[int, int]],
        nthreads: int,
        device: Optional[int],
    ) -> None:
        """Start ``nthreads - 1`` threads registering from ``todo``, listed in
        ``pool`` before each starts: an interrupt inside start() (or before this
        returns) leaves a thread running, which the undo then waits for."""
        for i in range(1, nthreads):
            t = threading.Thread(
                target=self._pool_worker,
                args=(todo, device),
                name=f"pin_for_cuda-{i}",
                daemon=True,
            )
            pool.append(t)
            try:
                t.start()
            except RuntimeError as err:  # "can't start new thread": a pids or memory limit
                self._stopped_by(
                    f"could not start registering thread {i + 1} of {nthreads}: {err}",
                    err,
                    errno.EAGAIN,
                )
                break

    def _map_for_device(self) -> None:
        """For a MAPPED registration: the GPU's address of ``addr``.  Each chunk is
        mapped on its own, so one address serves the whole range only where every
        chunk lies at the same offset (unified addressing: the host's address)."""
        calls = self._calls
        assert calls is not None
        mapped = self.flags & CudaHostRegisterFlag.MAPPED
        if not mapped or calls.device_pointer is None or self._failed or self._stop:
            return
        offsets = set()
        for start, _size in self.chunks:
            dev = ctypes.c_void_p()
            rc = calls.device_pointer(ctypes.byref(dev), ctypes.c_void_p(start), 0)
            if rc != 0:
                calls.clear_error()
                self.error = rc
                self._stopped_by(
                    f"{calls.api.device_pointer}(0x{start:x}) failed: {_cuda_error(calls, rc)}",
                    None,
                )
                return
            offsets.add((dev.value or 0) - start)
        if len(offsets) > 1:
            self._stopped_by(
                "the chunks' device addresses are not contiguous (no unified addressing): "
                "pass chunk= at least the length for one device address",
                None,
            )
            return
        self.device_pointer = self.addr + offsets.pop()

    def _undo(self) -> Tuple[int, Optional[BaseException]]:
        """Stop and wait for every thread, then unregister every chunk, to the end even
        when a second Ctrl-C comes meanwhile: (chunks undone, that interrupt)."""
        late: Optional[BaseException] = None
        undone = 0
        while True:
            try:
                self._stop = True
                self._wait_for_pool()
                with self._lock:
                    # a call an exception cut short: registered or not, nobody knows
                    for piece in self._in_call.values():
                        self._unsure.add(piece[0])
                        self._registered.append(piece)
                    self._in_call.clear()
                    undone = max(undone, len(self._registered))
                self._release()
                return undone, late
            except BaseException as err:
                late = late or err

    def _run(
        self,
        pieces: List[Tuple[int, int]],
        nthreads: int,
        device: Optional[int],
        fault: Optional[Callable[[], Any]],
        strict: bool,
    ) -> None:
        """Register ``pieces`` from ``nthreads`` threads, this one among them.  On a
        failed call, a thread that cannot start, an exception or an interrupt: stop
        them all, clear the runtime's error, unregister what was registered, say why
        (KeyboardInterrupt and SystemExit are raised again)."""
        if fault is not None:
            try:
                fault()
            except Exception as err:  # nothing was registered yet
                self._give_up(f"prefault before registering failed: {err}", strict, err)
                return
        pool: List[threading.Thread] = []
        finished = False
        try:
            todo = iter(pieces)
            self._start_threads(pool, todo, nthreads, device)
            # the caller's thread has its device; the background one starts on GPU 0
            select: Optional[int] = None
            if threading.current_thread() is self._worker:
                select = device
            self._register_chunks(todo, select)
            _join(pool)
            self._map_for_device()
            finished = True
        except BaseException as err:  # an interrupt between the steps
            self._stopped_by(f"registering stopped by {err!r}", err)
        finally:
            # Also reached when a second interrupt cuts the handler above short: the
            # chunks are undone and that interrupt goes on.
            self._settle(finished, strict)

    def _settle(self, finished: bool, strict: bool) -> None:
        """Keep the chunks when all went well; else undo them and say why."""
        with self._lock:
            failed, cause = sorted(self._failed), self._cause
        if finished and not failed and cause is None:
            self.ok = not self._stop
            self._ended.set()
            return
        undone, late = self._undo()
        calls = self._calls
        assert calls is not None
        what, exc, err = "registering stopped by an interrupt", late, errno.EIO
        if cause is not None:
            what, exc, err = cause[0], late or cause[1], cause[2]
        if failed:  # named first; an interrupt besides is still raised
            start, n, rc = failed[0]
            self.error, self.failed_chunk = rc, (start, n)
            what = f"{calls.api.register}(0x{start:x}, {n}) failed: {_cuda_error(calls, rc)}"
            err = errno.EIO
        self.reason = f"{what}; {undone} chunk(s) already registered were unregistered"
        if exc is not None and not isinstance(exc, Exception):
            self._ended.set()
            raise exc
        if cause is None and not failed:  # the interrupt in flight goes on
            self._ended.set()
            return
        self._give_up(self.reason, strict, exc, err)


def _cuda_current_device(calls: _PinCalls) -> Optional[int]:
    """The calling thread's device, or None: no cudaGetDevice, or it failed, or no
    cudaSetDevice to select it with in another thread."""
    if calls.get_device is None or calls.set_device is None:
        return None
    dev = ctypes.c_int(-1)
    if calls.get_device(ctypes.byref(dev)) != 0 or dev.value < 0:
        return None
    return dev.value


def pin_for_cuda(
    buf: Any,
    length: Optional[int] = None,
    *,
    chunk: int = 1 << 30,
    threads: Optional[int] = None,
    flags: int = CudaHostRegisterFlag.PORTABLE,
    background: bool = False,
    prefault: bool = False,
    strict: Optional[bool] = None,
    cudart: Any = None,
    backend: Optional[Backend] = None,
) -> CudaPin:
    """Pin ``buf`` (or an address and ``length``) for DMA with cudaHostRegister (or
    ROCm's hipHostRegister), one call per ``chunk`` bytes (default 1 GiB; never 512
    GiB or more).  Each call holds the driver's lock, so the chunk bounds how long any
    other GPU call of the process (a kernel launch, a copy) waits behind it.

    ``flags``: PORTABLE by default; add CudaHostRegisterFlag.MAPPED only when the GPU
    must address the memory directly (that mapping costs device memory); the pin's
    ``device_pointer`` is then the GPU's address of the buffer.
    ``prefault=True`` first faults the pages in from several threads (``prefault()``),
    so that the driver, which faults on one thread, finds them present.  ``threads``:
    how many threads register (default 1: the driver serialises the calls anyway).
    ``background=True`` returns at once; see CudaPin.ready/wait/progress.

    The runtime is the libcudart torch already loaded, else ``ctypes.util.find_library``,
    else a soname, libamdhip64's last; ``cudart=`` (a path, soname or CDLL, CUDA's or
    HIP's) is the one used, a soname looked up in LD_LIBRARY_PATH as set now.  Without
    a runtime, or when a chunk fails (the error is cleared and the chunks already
    registered are unregistered), the CudaPin is falsy and ``reason`` says why;
    ``strict=True`` (default: NUMA_STRICT) raises OSError instead (not with
    ``background``).  Nothing stays registered on any way out but a returned pin: a
    thread that cannot start or an exception undoes every chunk, and
    KeyboardInterrupt is raised again once they are undone.
    """
    backend = _b(backend)
    strict = _strict_or_env(strict)
    addr, size = buffer_range(buf, length)
    page = backend.page_size
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, not {chunk}")
    calls, where = _load_cudart(cudart, backend)
    # Interior chunk edges on page boundaries: two registrations must never share a
    # page (CUDA pins whole pages; overlapping ones fail as already registered).
    step = max(min(chunk, _PIN_CALL_MAX) // page * page, page)
    edges = [addr, *range(addr - addr % page + step, addr + size, step), addr + size]
    pieces = [(a, z - a) for a, z in zip(edges, edges[1:]) if z > a]
    if calls is None:
        pin = CudaPin(addr, size, int(flags), None, None)
        pin._give_up(f"CUDA not available: {where}", strict, err=errno.ENOENT)
        return pin
    nthreads = min(max(1, threads or 1), len(pieces))
    pin = CudaPin(addr, size, int(flags), calls, where, nthreads)
    if not pieces:  # a zero length: nothing to register
        pin.ok = True
        pin._ended.set()
        return pin
    # A new thread's current device is 0: registering from it would create a context
    # on GPU 0 (hundreds of MiB there) for an engine that runs on GPU 3.  Each worker
    # first selects the caller's device.
    device = _cuda_current_device(calls)
    fault = (lambda: _do_prefault(addr, size, backend=backend)) if prefault else None
    if not background:
        try:
            pin._run(pieces, nthreads, device, fault, strict)
        except BaseException:  # no pin is returned, so nothing may stay registered
            pin._undo()
            raise
        return pin
    pin._worker = threading.Thread(
        target=pin._run,
        args=(pieces, nthreads, device, fault, False),
        name="pin_for_cuda",
        daemon=True,
    )
    try:
        pin._worker.start()
    except RuntimeError as err:  # "can't start new thread": a pids or memory limit
        pin._give_up(f"could not start the registering thread: {err}", strict, err, errno.EAGAIN)
    except BaseException:  # an interrupt inside start(): the thread may run; undo it
        pin.close()
        raise
    return pin


# ---------------------------------------------------------------------------
# status: counters and advice.
# ---------------------------------------------------------------------------


def _status_extra(report: Dict[str, Any], topo: Topology, backend: Backend) -> None:
    """Add counters, the process's remote share and advice to the status report."""
    warnings: List[str] = report["warnings"]
    text: List[str] = report.setdefault("extra_text", [])
    snap = counters(backend=backend)
    report["counters"] = snap.to_json()
    warnings.extend(
        f"could not read: {problem}"
        for problem in snap.problems
        if f"could not read: {problem}" not in warnings
    )
    if any(c.numastat for c in snap):
        text += ["", "COUNTERS (numastat since boot, pages)"]
        cols = tuple(
            zip(
                NUMASTAT_FIELDS,
                ("numa_hit", "numa_miss", "foreign", "interleave", "local_node", "other_node"),
                (14, 12, 12, 11, 14, 12),
            )
        )
        text.append(f"  {'node':>4}" + "".join(f" {h:>{w}}" for _, h, w in cols))
        for per_node in snap:
            cells = [f" {getattr(per_node, k):>{w}}" for k, _, w in cols]
            text.append(f"  {per_node.node:>4}" + "".join(cells))
        text.append(f"  remote allocations (other_node): {snap.remote_ratio:.2%} of pages")
    # The process's own pages (the running system, or the simulated process).
    maps = None
    if backend.has_process:
        maps = _read_optional(backend, _maps_path("self"))
    if maps is not None:
        # Read and parsed once, for the remote share and the interleave check.
        rs, entries = _remote_share("self", maps, REMOTE_SHARE_THRESHOLD, topo, backend)
        report["process"]["remote_share"] = rs.to_json()
        if rs.total_bytes:
            per = ", ".join(
                f"node {nid}: {format_kib(v // 1024)}"
                for nid, v in sorted(rs.bytes_by_node.items())
            )
            text += [
                "",
                "PROCESS PAGES",
                f"  {per}; {rs.share:.1%} remote to the CPUs' {_nodes_txt(rs.local_nodes)}",
            ]
        if rs.warning and len(topo.nodes_with_memory) > 1:
            warnings.append(rs.warning)
        if (
            topo.thp == "always"
            and len(topo.nodes_with_memory) > 1
            and any(entry.mode in ("interleave", "weighted interleave") for entry in entries)
        ):
            warnings.append(
                "THP is 'always' and this process has interleaved regions: a "
                "first touch places a whole 2 MiB huge page on one node, so interleave"
                " spreads huge pages, not 4 KiB pages; use THP 'madvise' or "
                "madvise(MADV_NOHUGEPAGE) on those regions for an even spread"
            )
    # Huge pages reserved on one general-purpose node only.
    general = sorted(topo.nodes_with_cpus & topo.nodes_with_memory)
    sizes: Set[int] = set()
    if len(general) > 1:
        sizes = {sz for nid in general for sz in topo.nodes[nid].hugepages}
    for sz in sorted(sizes):
        on = [
            nid for nid in general if topo.nodes[nid].hugepages.get(sz, HugePages(0, 0)).total > 0
        ]
        if len(on) == 1:
            warnings.append(
                f"{format_kib(sz).replace('.0 ', ' ')} huge pages are configured "
                f"on node {on[0]} only: workers on other nodes that use them "
                "get remote memory; reserve them per node (nodeN/hugepages/"
                f"hugepages-{sz}kB/nr_hugepages)"
            )
    # GPUs whose node has (almost) no free memory.
    for gpu in report["gpus"]:
        node = gpu.get("node")
        c = snap.nodes.get(node)
        if c is None:
            continue
        if (
            node in topo.nodes_with_memory
            and c.mem_total_kb
            and c.available_kb < 0.05 * c.mem_total_kb
        ):
            warnings.append(
                f"GPU {gpu['address']}: its node {node} has {format_kib(c.available_kb)}"
                f" available of {format_kib(c.mem_total_kb)} (< 5%): pinned host "
                "buffers for it will come from another node"
            )
        elif topo.nodes_with_memory and node not in topo.nodes_with_memory:
            # nearest() sorts all of its (non-empty) pool: there is a first
            near = topo.nearest(node, topo.nodes_with_memory)[0]
            warnings.append(
                f"GPU {gpu['address']}: its node {node} has no memory; host "
                f"buffers for it come from node {near}"
            )


# -- end of observation section --------------------------------------------------------


# ===========================================================================
# Configuration: numa_utils' own environment variables, read when a call needs them.
# ===========================================================================


def configure(*, env_prefix: str) -> str:
    """Read numa_utils' variables under ``env_prefix``: ``configure(env_prefix=
    "LIGHTLLM_")`` makes LIGHTLLM_NUMA_STRICT count instead of NUMA_UTILS_NUMA_STRICT.
    Returns the previous prefix.  Variables are read when a call needs them."""
    global _env_prefix
    if not isinstance(env_prefix, str) or not re.fullmatch(
        r"([A-Za-z_][A-Za-z0-9_]*)?", env_prefix
    ):
        raise ValueError(f"invalid environment variable prefix {env_prefix!r}")
    old, _env_prefix = _env_prefix, env_prefix
    return old


# ===========================================================================
# status: the report a person reads instead of `numactl --hardware`.
# ===========================================================================


def _tree_machine(backend: Backend) -> Tuple[Optional[str], Optional[str], Optional[int]]:
    """(release, machine, page size) of the machine a saved tree was taken on, as far
    as the tree tells: proc/sys/kernel/osrelease and arch (Linux 6.1+; gather.py
    saves both) and the smallest kernelpagesize_kB of a saved proc/self/numa_maps.
    None for what it does not tell (never this host's values)."""

    def word(path: str) -> Optional[str]:
        t = _clean(_read_optional(backend, path) or "")
        if 0 < len(t) <= 64 and t.isprintable() and " " not in t:
            return t
        return None

    kb = min(
        map(
            int,
            re.findall(
                r" kernelpagesize_kB=([0-9]{1,8})\b",
                _read_optional(backend, "/proc/self/numa_maps") or "",
            ),
        ),
        default=0,
    )
    page = None
    if kb >= 4 and kb & (kb - 1) == 0:  # a power of two
        page = kb * 1024
    return word("/proc/sys/kernel/osrelease"), word("/proc/sys/kernel/arch"), page


def _package_layout(topo: Topology) -> Dict[str, Any]:
    """Nodes per package with its evidence: the distances inside a package against
    those between packages (SNC on Intel, NPS on AMD split a package into nodes)."""
    pk, k = topo.package_nodes, topo.nodes_per_package
    pkg = {node: package for package, ns in pk.items() for node in ns}
    same: Tuple[Set[int], Set[int]] = (set(), set())  # (between, inside)
    for a, package in pkg.items():
        if a not in topo.nodes:
            continue
        for m, d in topo.nodes[a].distances.items():
            if m != a and m in pkg:
                same[pkg[m] == package].add(d)
    inside, between = sorted(same[1]), sorted(same[0])
    if not pk:
        ev = "no package known"
    elif k:
        ev = f"{k} node{'s' * (k != 1)} per package over {len(pk)} package{'s' * (len(pk) != 1)}"
    else:
        ev = f"packages with different node counts over {len(pk)} packages"
    if k and k > 1:
        ev += f" (SNC{k} on Intel, NPS{k} on AMD)"
    dist = [
        f"{format_cpulist(v)} {where}"
        for v, where in ((inside, "inside a package"), (between, "between packages"))
        if v
    ]
    if dist:
        ev += ": distance " + ", ".join(dist)
    return {
        "nodes_per_package": k,
        "nodes": {str(package): sorted(ns) for package, ns in pk.items()},
        "distance_inside": inside,
        "distance_between": between,
        "evidence": ev,
    }


def _parse_cache_kb(text: str, *, source: Optional[str] = None) -> int:
    """A cache's size file (cacheinfo prints "32K"; "1M" and a bare count also seen) in kB."""
    match = re.match(r"^([0-9]{1,12})([KMG]?)$", _clean(text).upper())
    if not match:
        raise ValueError(f"invalid cache size{_where(source)}: {_short(text)}")
    return int(match.group(1)) << {"": 0, "K": 0, "M": 10, "G": 20}[match.group(2)]


def _llc_json(topo: Topology, backend: Backend, warnings: List[str]) -> List[Dict[str, Any]]:
    """Each last-level cache once: level, size (kB, None if sysfs omits it), CPUs."""
    out = []
    reader = _Reader(backend)
    for llc in sorted({cpu.llc for cpu in topo.cpus.values() if cpu.llc}, key=min):
        folder = f"{_CPU_DIR}/cpu{min(llc)}/cache"
        level: Optional[int] = None
        size: Optional[int] = None
        for idx in reader.listdir(folder):
            if not idx.startswith("index"):
                continue
            lvl = reader.integer(f"{folder}/{idx}/level")
            if lvl is not None and (level is None or lvl > level):
                level, size = lvl, reader.parsed(f"{folder}/{idx}/size", _parse_cache_kb)
        out.append({"level": level, "size_kb": size, "cpus": sorted(llc)})
    warnings.extend(f"could not read: {problem}" for problem in reader.problems)
    return out


def status_report(*, backend: Optional[Backend] = None) -> Dict[str, Any]:
    """Everything ``status --json`` prints, as a dict."""
    backend = _b(backend)
    topo = read_topology(backend=backend)
    tj = _topology_json(topo)
    warnings: List[str] = []
    multi = len(topo.nodes_with_memory) > 1 or len(topo.nodes_with_cpus) > 1
    gpu_rows = [
        dict(_pci_json(gpu), node=gpu.node, node_source=gpu.node_source) for gpu in topo.gpus
    ]
    if multi:
        for gpu in topo.gpus:
            if gpu.numa_node < 0:
                if gpu.node is None:
                    warnings.append(
                        f"GPU {gpu.address}: firmware reports no NUMA node (numa_node=-1)"
                        " and its local CPUs span several nodes; pass the node "
                        "explicitly when binding workers"
                    )
                else:
                    warnings.append(
                        f"GPU {gpu.address}: firmware reports no NUMA node (numa_node=-1);"
                        f" using node {gpu.node} from its local CPUs"
                    )
            if gpu.node is not None:
                ncpus: FrozenSet[int] = frozenset()
                if gpu.node in topo.nodes:
                    ncpus = topo.nodes[gpu.node].cpus
                if ncpus and not (ncpus & topo.allowed_cpus):
                    warnings.append(
                        f"GPU {gpu.address} hangs off node {gpu.node} but this "
                        "process's cpuset allows none of its CPUs "
                        f"({format_cpulist(ncpus)}): its worker will run remote"
                    )
                if gpu.node in topo.nodes_with_memory and gpu.node not in topo.allowed_mems:
                    warnings.append(
                        f"GPU {gpu.address} hangs off node {gpu.node} but this process's "
                        f"cpuset (Mems_allowed_list {format_cpulist(topo.allowed_mems)})"
                        " excludes that node's memory: host buffers for it will be remote"
                    )
    devs = _devices(topo, backend)
    layout = _package_layout(topo)
    if layout["nodes_per_package"] and layout["nodes_per_package"] > 1:
        warnings.append(
            f"{layout['evidence']}: a 'socket' CPU plan spans all of a "
            "package's nodes and bind_for_gpu(memory='socket') prefers all of "
            "them (preferred-many); 'node' keeps a worker on one cluster, "
            "with that cluster's share of the memory bandwidth"
        )
    if topo.numa_balancing and len(topo.nodes_with_memory) > 1:
        warnings.append(
            "numa_balancing is on: the kernel migrates pages behind the "
            "engine's back, which costs tail latency; for serving set "
            "`sysctl -w kernel.numa_balancing=0`"
        )
    restricted = topo.nodes_with_memory - topo.allowed_mems
    if restricted and topo.allowed_mems & topo.nodes_with_memory:
        warnings.append(
            f"the cpuset limits memory to {_nodes_txt(topo.allowed_mems)}; "
            f"{_nodes_txt(restricted)} cannot be used for interleave"
        )
    for node in sorted(topo.nodes_with_cpus - topo.nodes_with_memory):
        warnings.append(
            f"node {node} has CPUs but no memory: its threads always allocate from another node"
        )
    warnings.extend(f"could not read: {problem}" for problem in topo.problems)
    policy: Optional[Dict[str, Any]] = None
    policy_error: Optional[str] = "not the running system"
    if backend.has_process:
        policy_error = None
        try:
            policy = get_policy(backend=backend).to_json()
        except OSError as err:
            policy_error = f"{_errno_reason(err.errno or 0)}: {err.strerror or err}"
    release: Optional[str]
    machine: Optional[str]
    page_size: Optional[int]
    if backend.is_live:
        release, machine, page_size = os.uname()[2], os.uname()[4], backend.page_size
    elif backend.has_process:  # a simulated process: no kernel of its own to name
        release, machine, page_size = None, None, backend.page_size
    else:
        release, machine, page_size = _tree_machine(backend)
    abi: Optional[Abi] = backend.abi
    if not backend.has_process:
        # A saved tree: its own machine's facts, or None ("unknown"), never ours.
        abi = None
        if machine:
            if "64" in machine or machine == "s390x":
                abi = abi_for(machine, 64)
            else:
                abi = abi_for(machine, 32)
        if abi is None:
            warnings.append(
                "the saved tree does not record its machine "
                "(proc/sys/kernel/arch): ABI and syscall numbers unknown"
            )
    if abi is not None and not abi.supported:
        warnings.append(
            f"no syscall table for the {abi.name!r} ABI: memory policies fall back to first-touch"
        )
    on_node: Dict[Optional[int], List[str]] = {}  # node -> its devices' addresses
    for device in devs:
        on_node.setdefault(device.node, []).append(device.address)
    own_pid = None
    if backend.is_live:
        own_pid = os.getpid()
    abi_name = None
    syscalls = None
    if abi is not None:
        abi_name = abi.name
        if abi.syscalls:
            syscalls = dict(abi.syscalls)
    report: Dict[str, Any] = {
        "version": __version__,
        "root": backend.root,
        "nodes": [dict(node, devices=on_node.get(node["id"], [])) for node in tj["nodes"]],
        "gpus": gpu_rows,
        "devices": [device.to_json() for device in devs],
        "packages": layout,
        "process": {
            "pid": own_pid,
            "allowed_cpus": tj["allowed_cpus"],
            "allowed_mems": tj["allowed_mems"],
            "policy": policy,
            "policy_error": policy_error,
        },
        "kernel": {
            "release": release,
            "machine": machine,
            "abi": abi_name,
            "syscalls": syscalls,
            "page_size": page_size,
            "numa": topo.has_node_dir,
            **{
                field: tj[field]
                for field in (
                    "online_nodes",
                    "possible_nodes",
                    "nodes_with_cpus",
                    "nodes_with_memory",
                    "online_cpus",
                )
            },
            "numa_balancing": topo.numa_balancing,
            "thp": topo.thp,
            "thp_settings": _thp_settings(backend),
        },
        **{
            field: tj[field]
            for field in ("cpus", "memory_tiers", "interleave_weights", "interleave_auto")
        },
        "default_memory_nodes": memory_node_choice(topo).to_json(),
        "warnings": warnings,
    }
    report["config"] = config = {}
    for suffix in _ENV_VARS:  # each read alone: every invalid one is its own warning
        name = _env_prefix + suffix
        if os.environ.get(name, "").strip():
            source = "env"
        else:
            source = "default"
        row = config[name] = {"value": os.environ.get(name), "source": source}
        try:
            if suffix == "NUMA_NODES":
                value = _env_nodes(backend)
            else:
                value = _env(suffix)
            row["value"] = to_json(value)
        except ValueError as err:  # worded as the calls that read it refuse it
            report.setdefault("config_error", str(err))
            warnings.append(f"configuration: {err}")
            row["error"] = str(err)
    report["last_level_caches"] = _llc_json(topo, backend, warnings)
    _status_extra(report, topo, backend)
    _status_regions(report, backend)
    return report


def _env_shown(row: Mapping[str, Any]) -> str:
    """A status config row's value as text: an invalid one is the user's raw text,
    shown escaped and cut as error messages show it (_short)."""
    if "error" in row and isinstance(row["value"], str):
        return _short(row["value"])
    return str(row["value"])


def _env_source(row: Mapping[str, Any]) -> str:
    """A status config row's source as text: "invalid" for a value that was refused."""
    if "error" in row:
        return "invalid"
    return str(row["source"])


def _section(title: str, rows: List[str]) -> List[str]:
    """A titled block of the status text with its blank line; nothing without rows."""
    if not rows:
        return []
    return [title, *rows, ""]


def _node_of(data: Dict[str, Any]) -> str:
    if data["node"] is None:
        return "?"
    return str(data["node"])


def _node_how(data: Dict[str, Any]) -> str:
    """How a device's node was found, when not from its numa_node file."""
    if data["node_source"] == "numa_node":
        return ""
    return f" ({data['node_source']})"


def _render_tiers(rep: Dict[str, Any]) -> List[str]:
    """MEMORY: kind, tier, HMAT figures and weight per node, and the default nodes."""
    out: List[str] = []
    nodes = [node for node in rep["nodes"] if node["kind"] not in (None, "no-memory")]
    weights = rep["interleave_weights"]
    if len(nodes) > 1 or rep["memory_tiers"]:
        out.append(
            "MEMORY (tier: lower is faster; HMAT access class 0; weighted-interleave weight)"
        )
        for node in nodes:
            access = node["access"]
            if access:
                read_mbps = access["read_bandwidth_mbps"] or "?"
                write_mbps = access["write_bandwidth_mbps"] or "?"
                read_ns = access["read_latency_ns"] or "?"
                write_ns = access["write_latency_ns"] or "?"
                initiators = format_cpulist(access["initiators"]) or "?"
                perf = (
                    f"{read_mbps}/{write_mbps} MB/s r/w, {read_ns}/{write_ns} ns "
                    f"from node {initiators}"
                )
            else:
                perf = "no HMAT figures"
            tier = node["tier"]
            if tier is None:
                tier = "-"
            if weights is None:
                w = "-"
            else:
                w = weights.get(str(node["id"]), "-")
            out.append(
                f"  {node['id']:>4}  {node['kind']:<12} tier {tier!s:<3} weight {w!s:<3} "
                f"{perf}; {node['kind_evidence']}"
            )
        if weights is None:
            out.append("  weighted interleave: not in this kernel (Linux 6.9+)")
    d = rep["default_memory_nodes"]
    if d["left_out"]:
        every = format_cpulist([*map(int, d["left_out"]), *d["nodes"]])
        out += [
            f"  default memory nodes (nodes=None, NUMA_NODES unset): "
            f"{format_cpulist(d['nodes'])} ({d['basis']})",
            *(f"    left out: node {key}: {why}" for key, why in d["left_out"].items()),
            f"    to use them anyway pass nodes=[...] or set NUMA_NODES (e.g. NUMA_NODES={every})",
        ]
    if out:
        out.append("")
    return out


def _cores_in(cpu_rows: Mapping[str, Any], cpus: Iterable[int]) -> Set[Tuple[Any, Any]]:
    """The (package, core) pairs of ``cpus`` that status_report's CPU rows name."""
    cores = set()
    for cpu in cpus:
        row = cpu_rows.get(str(cpu))
        if row is not None:
            cores.add((row["package"], row["core"]))
    return cores


def _cpu_summary(rep: Dict[str, Any]) -> str:
    """ "2 packages x 32 cores x 2 threads; LLC: 8 x 32 MiB L3 (per 8 cores)", the way
    lscpu and lstopo summarise a machine (from status_report's cpus and caches)."""
    cores: Dict[Any, Set[Any]] = {}
    threads: Set[int] = set()
    for cpu in rep["cpus"].values():
        if cpu["online"]:
            cores.setdefault(cpu["package"], set()).add(cpu["core"])
            threads.add(len(cpu["siblings"]) or 1)
    if not cores:
        return "CPUs: none online"

    def count(ns: Iterable[int], one: str) -> str:  # "2 packages", "5-6 cores"
        lo, hi = min(ns), max(ns)
        if lo == hi:
            span = str(lo)
        else:
            span = f"{lo}-{hi}"
        if hi == 1:
            return f"{span} {one}"
        return f"{span} {one}s"

    out = (
        f"CPUs: {count([len(cores)], 'package')} x "
        f"{count([len(value) for value in cores.values()], 'core')} x {count(threads, 'thread')}"
    )
    llcs = rep["last_level_caches"]
    if llcs:
        kinds = sorted({(x["size_kb"], x["level"]) for x in llcs}, key=str)
        per = {len(_cores_in(rep["cpus"], x["cpus"])) for x in llcs}
        names: List[str] = []
        for kb, lvl in kinds:
            if lvl:
                name = f"L{lvl}"
            else:
                name = "cache"
            if kb:
                name = format_kib(kb).replace(".0 ", " ") + " " + name
            names.append(name)
        what = ", ".join(names)
        out += f"; LLC: {len(llcs)} x {what} (per {count(per, 'core')})"
    return out


def _render_status(rep: Dict[str, Any]) -> str:
    k = rep["kernel"]
    if rep["root"] == "/":
        where = "this machine"
    else:
        where = f"saved tree {rep['root']}"
    head = f"numa_utils {rep['version']} status: {where}"
    if k["release"] or k["machine"]:
        head += f" (Linux {k['release'] or '?'}, {k['machine'] or '?'})"
    if k["page_size"] is None:
        page = "unknown"
    else:
        page = f"{k['page_size'] // 1024} KiB"
    abi_line = f"ABI {k['abi'] or 'unknown'}, page size {page}"
    if not k["numa"]:
        abi_line += "; kernel without NUMA (no node directory)"
    nodes = rep["nodes"]
    out = [
        head,
        abi_line,
        "",
        f"NODES: {len(nodes)} online ({format_cpulist(k['online_nodes']) or '-'}) "
        f"of {len(k['possible_nodes'])} possible "
        f"({format_cpulist(k['possible_nodes']) or '-'}); CPUs on "
        f"{_nodes_txt(k['nodes_with_cpus'])}; memory on "
        f"{_nodes_txt(k['nodes_with_memory'])}",
        _cpu_summary(rep),
    ]
    out.append(f"PACKAGES: {rep['packages']['evidence']}")
    w = max([len(format_cpulist(node["cpus"])) for node in nodes] + [4])
    out.append(
        f"  {'node':>4}  {'cpus':<{w}}  {'memory':>11}  {'free':>11}  hugepages (free/total)"
    )
    for node in nodes:
        hp = (
            "  ".join(
                f"{format_size(int(sz) << 10)}: {h['free']} free/{h['total']}"
                for sz, h in node["hugepages"].items()
                if h["total"]
            )
            or "-"
        )
        out.append(
            f"  {node['id']:>4}  {format_cpulist(node['cpus']) or '-':<{w}}  "
            f"{format_kib(node['mem_total_kb']):>11}  {format_kib(node['mem_free_kb']):>11}  "
            f"{hp}"
        )
    out.append("")
    ids = [node["id"] for node in nodes]
    cw = max([4] + [len(str(i)) + 1 for i in ids])
    row, keys = "  " + f"{{:>{cw}}}" * (len(ids) + 1), [str(j) for j in ids]
    table = []
    if len(ids) > 1:
        table.append(row.format("", *ids))
        for node in nodes:
            table.append(row.format(node["id"], *(node["distances"].get(k, "?") for k in keys)))
    out += _section("DISTANCES", table)
    out += _section(
        "GPUS",
        [
            f"  {gpu['address']}  {gpu['vendor_name']:<6} {gpu['device']}  node "
            f"{_node_of(gpu)}{_node_how(gpu)}  local cpus "
            f"{format_cpulist(gpu['local_cpus']) or '-'}"
            for gpu in rep["gpus"]
        ],
    )
    p = rep["process"]
    if p["policy"]:
        pol = p["policy"]["text"]
    else:
        pol = f"unknown ({p['policy_error']})"
    nb = k["numa_balancing"]
    if nb is None:
        balancing = "-"
    elif nb:
        balancing = f"{nb} (on)"
    else:
        balancing = f"{nb} (off)"
    if p["pid"]:
        process_head = f"PROCESS (pid {p['pid']})"
    else:
        process_head = "PROCESS"
    allowed_cpus = f"  allowed cpus   {format_cpulist(p['allowed_cpus']) or '-'}"
    if p["allowed_cpus"] == k["online_cpus"]:
        allowed_cpus += " (all online)"
    allowed_mems = f"  allowed mems   {format_cpulist(p['allowed_mems']) or '-'}"
    if p["allowed_mems"] == k["nodes_with_memory"]:
        allowed_mems += " (all)"
    devs = sorted(rep["devices"], key=lambda d: (d["node"] is None, d["node"] or 0, d["address"]))
    out += [
        *_section(
            "DEVICES (PCI functions by node)",
            [
                f"  {_node_of(d):>4}  {d['address']}  {d['kind']:<7} {d['vendor'][2:]}:"
                f"{d['device'][2:]}  {' '.join(d['names']) or '-'}{_node_how(d)}"
                for d in devs
            ],
        ),
        *_render_tiers(rep),
        process_head,
        allowed_cpus,
        allowed_mems,
        f"  memory policy  {pol}",
        "",
        "KERNEL",
        f"  numa_balancing {balancing}",
        f"  THP            {k['thp'] or '-'}"
        + "".join(
            f", {node} {value}" for node, value in k["thp_settings"].items() if node != "enabled"
        ),
    ]
    if rep["warnings"]:
        warnings_head = "WARNINGS"
    else:
        warnings_head = "WARNINGS: none"
    out += [
        *rep["extra_text"],
        "",
        *_section(
            "CONFIGURATION (environment)",
            [
                f"  {name:<34} {_env_shown(value):<12} ({_env_source(value)})"
                for name, value in rep["config"].items()
            ],
        ),
        warnings_head,
        *(f"  - {wtext}" for wtext in rep["warnings"]),
    ]
    # A saved tree is anyone's, and names in it (and regions') reach these lines:
    # each line is escaped whole, a newline in a name included.
    return "\n".join(map(printable, out)) + "\n"


# ===========================================================================
# Command line.
# ===========================================================================


def backend_for_root(root: Optional[str] = None) -> Backend:
    """The backend for ``root`` as ``--root`` takes it: the running system for None
    or "/"; else a saved tree, a folder (holding sys/ and proc/) or a tree saved in
    one file (read by numa_utils_sim.py, which must be beside this file).  A folder
    that is not a saved tree is a ValueError that says so (and names DIR/root, where
    tools/gather.py puts the tree); a missing one, FileNotFoundError."""
    root = root or "/"
    if root == "/":
        return default_backend()
    if not os.path.exists(root):
        raise FileNotFoundError(errno.ENOENT, "no such tree", root)
    # A folder without sys/ or proc/ would read as an empty one-node machine;
    # tools/gather.py puts the tree in DIR/root: say so.
    if os.path.isdir(root) and not any(
        os.path.isdir(os.path.join(root, d)) for d in ("sys", "proc")
    ):
        sub = os.path.join(root, "root")
        if os.path.isdir(sub):
            raise ValueError(
                f"--root {root}: not a saved tree (no sys/ or proc/ in it); did you mean {sub}?"
            )
        raise ValueError(f"--root {root}: not a saved tree (no sys/ or proc/ in it)")
    if os.path.isfile(root):
        # A tree saved in one file: the simulator's file reads archives.
        sim = _sibling("numa_utils_sim")
        if sim is None:
            raise ValueError(
                f"--root {root}: a saved tree in one file needs numa_utils_sim.py beside "
                f"{os.path.basename(__file__)} (or unpack it and give its folder)"
            )
        return LinuxBackend(sim.SavedArchive(root).subtree())
    return LinuxBackend(root)


def _print_json(data: Any) -> None:
    """Indented for a person at a terminal; compact for a pipe (json's C encoder
    only runs without indent: 4x faster on a 1,024-CPU report)."""
    import json

    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty:
        text = json.dumps(data, indent=2)
    else:
        text = json.dumps(data, separators=(",", ":"))
    sys.stdout.write(text + "\n")


def _commands(what: str) -> Any:
    """The numa_utils_cli module, or a ValueError naming the file to copy."""
    if __name__ == "__main__":
        # `python -m numa_utils`, `python numa_utils.py`: the CLI's own `import
        # numa_utils` gets this module instead of executing the file a second time.
        name = (
            __spec__.name
            if __spec__ is not None
            else os.path.splitext(os.path.basename(__file__))[0]
        )
        sys.modules.setdefault(name, sys.modules[__name__])
    cli = _sibling("numa_utils_cli")
    if cli is None:
        raise ValueError(
            f"{what} needs numa_utils_cli.py: copy it beside "
            f"{os.path.basename(__file__)}, or `pip install numa-utils`"
        )
    return cli


def _cmd_status(args: Any) -> int:
    if args.env_prefix is not None:
        configure(env_prefix=args.env_prefix)
    fmt = args.format  # None: text, or json with --json
    if fmt is None and args.json:
        fmt = "json"
    if args.write is not None and fmt != "nfd":
        raise ValueError("--write goes with --format nfd")
    rep = status_report(backend=backend_for_root(args.root))
    if fmt == "json":
        rep.pop("extra_text", None)
        _print_json(rep)
    elif fmt == "prometheus":
        sys.stdout.write(_commands("status --format prometheus")._render_prometheus(rep))
    elif fmt == "nfd":
        return int(_commands("status --format nfd")._status_nfd(rep, args))
    else:
        sys.stdout.write(_render_status(rep))
    return 0


def _build_parser(commands: Sequence[Callable[[Any], None]] = ()) -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog=_prog(),
        description="NUMA topology, memory policy and placement for inference engines.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # The flags the commands share: --root and --json; --json alone for the commands
    # that act on this system (numa_utils_cli's run).
    common, live = (argparse.ArgumentParser(add_help=False) for _ in range(2))
    common.add_argument(
        "--root",
        metavar="TREE",
        default=None,
        help="read a saved sysfs/procfs tree (a folder, or the one file "
        "tools/gather.py --archive writes: .txt or .tar.gz) instead "
        "of this system",
    )
    for c in (common, live):
        c.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("status", parents=[common], help="topology, GPUs, process limits and advice")
    p.add_argument(
        "--format",
        choices=["text", "json", "prometheus", "nfd"],
        default=None,
        help="output format (default text; --json is --format json)",
    )
    p.add_argument(
        "--write",
        metavar="DIR",
        default=None,
        help="--format nfd: write DIR/numa-utils atomically (NFD's features.d)",
    )
    p.add_argument(
        "--expiry",
        metavar="TIME",
        default="1h",
        help="--format nfd: the labels expire after TIME (90s, 30m, 1h, 2d; default 1h)",
    )
    p.add_argument(
        "--env-prefix",
        metavar="PREFIX",
        default=None,
        help="read the variables under this prefix, as the engine's "
        "nu.configure(env_prefix=...) does (default NUMA_UTILS_)",
    )
    p.set_defaults(func=_cmd_status)
    sub.common = common  # type: ignore[attr-defined]
    sub.common_live = live  # type: ignore[attr-defined]
    for add in commands:
        add(sub)
    return parser


# The commands numa_utils_cli.py serves; a copy of numa_utils.py alone serves status.
_CLI_COMMANDS = ("numactl", "run", "plan", "region", "maps", "cleanup", "watch", "fit", "threads")


def _call(prog: str, args: Any) -> int:
    global _cli_verbose
    _cli_verbose = bool(args.verbose)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError) as err:
        sys.stderr.write(f"{prog} {args.command}: {err}\n")
        return 2


def _run(raw: List[str], commands: Sequence[Callable[[Any], None]]) -> int:
    parser = _build_parser(commands)
    return _call(parser.prog, parser.parse_args(raw))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status.  ``status`` is served here;
    every other command, and the full help, by numa_utils_cli when it is there."""
    if argv is None:
        argv = sys.argv[1:]
    raw = list(argv)
    lead = 0
    while raw[lead : lead + 1] in (["-v"], ["--verbose"]):
        lead += 1
    word = raw[lead] if lead < len(raw) else ""
    if word != "status":
        try:
            return int(_commands(word).main(raw))
        except ImportError as err:  # a numa_utils_cli of another version
            sys.stderr.write(f"{_prog()}: {err}\n")
            return 2
        except ValueError as err:  # no numa_utils_cli (the CLI's main raises none)
            if word in _CLI_COMMANDS:
                sys.stderr.write(f"{_prog()} {word}: {err}\n")
                return 2
    return _run(raw, ())


if __name__ == "__main__":
    raise SystemExit(main())
