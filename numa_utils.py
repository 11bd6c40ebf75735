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
    res = nu.interleave(buf)                  # over every node this process may use
    if not res:                               # a value, not an exception:
        print("first-touch:", res.reason)     #   "single memory node", "EPERM", ...
    nu.prefault(buf)                          # pages land under the policy
    print(nu.placement(buf))                  # {0: 536870912, 1: 536870912}

Every file read and every syscall goes through a backend object (``LinuxBackend`` for
the running system or a saved tree, ``SimulatedBackend`` for a model of the kernel).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import dataclasses
import enum
import errno
import json
import logging
import os
import platform
import re
import struct
import sys
import threading
from types import MappingProxyType
from typing import (
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
    Tuple,
    Union,
)

__version__ = "0.1.0"

__all__ = [
    # parsers (pure, no I/O)
    "parse_cpulist", "format_cpulist", "parse_cpumap", "parse_meminfo",
    "parse_distance_row", "parse_numa_maps",
    # backends
    "Abi", "abi_for", "Backend", "LinuxBackend", "SimulatedBackend", "NotLiveError",
    "default_backend",
    # topology
    "Topology", "Node", "Cpu", "PciDevice", "HugePages", "read_topology", "to_json",
    # memory policy: raw syscalls
    "Mode", "ModeFlag", "MbindFlag", "GetFlag", "NodeMask",
    "mbind", "set_mempolicy", "get_mempolicy", "move_pages", "migrate_pages",
    "set_mempolicy_home_node",
    # memory policy: safe layer
    "PolicyResult", "Policy", "buffer_range", "interleave", "bind", "prefer",
    "set_local", "apply_policy", "thread_policy", "set_thread_policy", "get_policy",
    "node_of",
    # shared memory, prefault, placement
    "SharedRegion", "prefault", "placement", "NumaMapsEntry",
    # GPU locality and binding
    "gpus", "gpu_node", "cpus_for_gpu", "bind_to_node", "bind_for_gpu",
    # observation
    "NodeCounters", "counters", "choose_node", "pin_for_cuda",
    # CLI
    "main",
]

_log = logging.getLogger(__name__)

# Warnings are logged once per distinct reason, not once per call (an engine may call
# interleave() for every layer of every request: that must not become a log storm).
_warned: set = set()
_warned_lock = threading.Lock()


def _warn_once(key: str, msg: str, *args: Any) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    _log.warning(msg, *args)


def _oserror(err: int, what: str, extra: str = "") -> OSError:
    """errno-first OSError, so callers get PermissionError & co for free."""
    text = f"{what}: {os.strerror(err)}"
    if extra:
        text += f" ({extra})"
    return OSError(err, text)


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
    return f" in {source}" if source else ""


_CHUNK_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+)/(\d+))?)?$")


def parse_cpulist(text: str, *, source: Optional[str] = None) -> FrozenSet[int]:
    """Parse the kernel's list format ("0-3,8,10-11", "0-15:2/4") into a frozenset.

    An empty string is the empty set.  Garbage raises ValueError naming ``source``.
    """
    s = _clean(text)
    if not s:
        return frozenset()
    out: set = set()
    for chunk in s.split(","):
        m = _CHUNK_RE.match(chunk.strip())
        if m is None:
            raise ValueError(
                f"invalid CPU/node list{_where(source)}: chunk {chunk!r} of {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        used = int(m.group(3)) if m.group(3) is not None else 1
        group = int(m.group(4)) if m.group(4) is not None else 1
        if hi < lo or used == 0 or group == 0 or used > group or hi - lo > (1 << 24):
            raise ValueError(
                f"invalid CPU/node list{_where(source)}: chunk {chunk!r} of {text!r}")
        for base in range(lo, hi + 1, group):
            out.update(range(base, min(base + used, hi + 1)))
    return frozenset(out)


def format_cpulist(ids: Iterable[int]) -> str:
    """Compress ids into the kernel's list format: {0,1,2,3,8} -> "0-3,8"."""
    items = sorted(set(ids))
    parts: List[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(parts)


def parse_cpumap(text: str, *, source: Optional[str] = None) -> FrozenSet[int]:
    """Parse a hex mask ("00000000,0000ff00"; 32-bit words, most significant first)."""
    s = _clean(text)
    if not s:
        return frozenset()
    words = s.split(",")
    value = 0
    for w in words:
        w = w.strip()
        if not w or len(w) > 8 or any(c not in "0123456789abcdefABCDEF" for c in w):
            raise ValueError(f"invalid CPU mask{_where(source)}: word {w!r} of {text!r}")
        value = (value << 32) | int(w, 16)
    out = set()
    bit = 0
    while value:
        if value & 1:
            out.add(bit)
        value >>= 1
        bit += 1
    return frozenset(out)


def parse_meminfo(text: str, *, source: Optional[str] = None) -> Dict[str, int]:
    """Parse /proc/meminfo or nodeN/meminfo into {"MemTotal": kB, ...}.

    The "Node N " prefix of per-node files is dropped.  Values without a unit
    (HugePages_Total) are returned as plain counts.
    """
    out: Dict[str, int] = {}
    for line in _clean(text).splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("Node "):
            parts = line.split(None, 2)
            if len(parts) < 3 or not parts[1].isdigit():
                raise ValueError(f"invalid meminfo line{_where(source)}: {line!r}")
            line = parts[2]
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or not key or not fields or len(fields) > 2 or (
            len(fields) == 2 and fields[1] != "kB"
        ):
            raise ValueError(f"invalid meminfo line{_where(source)}: {line!r}")
        try:
            out[key.strip()] = int(fields[0])
        except ValueError:
            raise ValueError(f"invalid meminfo value{_where(source)}: {line!r}") from None
    return out


def parse_distance_row(text: str, *, source: Optional[str] = None) -> Tuple[int, ...]:
    """Parse nodeN/distance ("10 21 21") into a tuple of ints (online-node order)."""
    s = _clean(text)
    try:
        row = tuple(int(x) for x in s.split())
    except ValueError:
        raise ValueError(f"invalid distance row{_where(source)}: {text!r}") from None
    if not row or any(d <= 0 or d > 255 for d in row):
        raise ValueError(f"invalid distance row{_where(source)}: {text!r}")
    return row


def _parse_int(text: str, source: str) -> int:
    s = _clean(text)
    try:
        return int(s, 0) if s.lower().startswith("0x") else int(s)
    except ValueError:
        raise ValueError(f"invalid integer in {source}: {text!r}") from None


# ===========================================================================
# Architectures and syscall numbers.
# Tables from arch/x86/entry/syscalls/syscall_64.tbl, syscall_32.tbl,
# include/uapi/asm-generic/unistd.h (aarch64, riscv64, loongarch64),
# arch/powerpc/kernel/syscalls/syscall.tbl, arch/s390/kernel/syscalls/syscall.tbl,
# arch/arm/tools/syscall.tbl.  x86_64 orders mbind/set/get (237/238/239), every other
# table mbind/get/set: 237 is mbind on x86_64 but set_mempolicy on aarch64.
# ===========================================================================

_NAMES = ("mbind", "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages",
          "set_mempolicy_home_node")


def _table(*nums: int) -> Mapping[str, int]:
    return MappingProxyType(dict(zip(_NAMES, nums)))


_GENERIC = _table(235, 237, 236, 238, 239, 450)

SYSCALL_TABLES: Mapping[str, Mapping[str, int]] = MappingProxyType({
    "x86_64": _table(237, 238, 239, 256, 279, 450),
    "i386": _table(274, 276, 275, 294, 317, 450),
    "aarch64": _GENERIC,
    "riscv64": _GENERIC,
    "loongarch64": _GENERIC,
    "arm": _table(319, 321, 320, 400, 344, 450),
    "ppc64": _table(259, 261, 260, 258, 301, 450),
    "ppc64le": _table(259, 261, 260, 258, 301, 450),
    "s390x": _table(268, 270, 269, 287, 310, 450),
})

# AUDIT_ARCH_* (include/uapi/linux/audit.h), for seccomp filters in tests and tools.
_AUDIT_ARCH = MappingProxyType({
    "x86_64": 0xC000003E, "i386": 0x40000003, "aarch64": 0xC00000B7,
    "riscv64": 0xC00000F3, "loongarch64": 0xC0000102, "arm": 0x40000028,
    "ppc64": 0x80000015, "ppc64le": 0xC0000015, "s390x": 0x80000016,
})

_MACHINE_ALIASES = MappingProxyType({
    "amd64": "x86_64", "x64": "x86_64", "x86-64": "x86_64",
    "i486": "i386", "i586": "i386", "i686": "i386", "x86": "i386",
    "arm64": "aarch64", "armv8l": "arm", "armv7l": "arm", "armv6l": "arm", "armhf": "arm",
    "ppc64el": "ppc64le", "powerpc64le": "ppc64le", "powerpc64": "ppc64",
    "riscv": "riscv64", "loong64": "loongarch64",
})

_BIG_ENDIAN = frozenset({"ppc64", "s390x"})
_DEFAULT_PAGE = MappingProxyType({"ppc64": 65536, "ppc64le": 65536})


@dataclasses.dataclass(frozen=True)
class Abi:
    """The ABI a syscall is made in: table name, word size and byte order."""

    name: str                      # key of SYSCALL_TABLES, or the unknown machine name
    word_bits: int                 # C unsigned long width: nodemask word size
    byteorder: str                 # "little" | "big"
    syscalls: Optional[Mapping[str, int]]   # None: unsupported ABI -> ENOSYS at call time

    @property
    def supported(self) -> bool:
        return self.syscalls is not None

    def number(self, name: str) -> int:
        if self.syscalls is None or name not in self.syscalls:
            raise _oserror(errno.ENOSYS, name,
                           f"no syscall table for the {self.name!r} ABI")
        return self.syscalls[name]


def abi_for(machine: Optional[str] = None, pointer_bits: Optional[int] = None) -> Abi:
    """The ABI for a machine name (``platform.machine()`` style) and pointer size.

    Without arguments: the running interpreter.  A 32-bit interpreter on a 64-bit
    kernel uses the 32-bit table (i386, arm); x32 (x86_64 with 32-bit pointers) is
    refused: its numbers differ and engines do not run there.
    """
    if machine is None:
        machine = platform.machine()
    if pointer_bits is None:
        pointer_bits = ctypes.sizeof(ctypes.c_void_p) * 8
    m = machine.lower()
    m = _MACHINE_ALIASES.get(m, m)
    if m.startswith("arm") and m != "arm":
        m = "arm"
    name = m
    if pointer_bits == 32:
        if m == "x86_64":
            return Abi("x32", 32, "little", None)
        if m == "aarch64":
            name = "arm"
        elif m in ("ppc64", "ppc64le", "s390x", "riscv64", "loongarch64"):
            return Abi(m + "-32", 32, "big" if m in _BIG_ENDIAN else "little", None)
    table = SYSCALL_TABLES.get(name)
    if name in ("x86_64", "aarch64", "riscv64", "loongarch64", "ppc64", "ppc64le",
                "s390x") and pointer_bits != 64:
        table = None
    byteorder = "big" if name in _BIG_ENDIAN else "little"
    if table is None and name not in SYSCALL_TABLES:
        byteorder = sys.byteorder
    return Abi(name, pointer_bits, byteorder, table)


# ===========================================================================
# Backends: the one seam through which every file read and every syscall goes.
# ===========================================================================

class Backend:
    """Interface of a backend.  ``LinuxBackend`` and ``SimulatedBackend`` implement it.

    Paths are absolute system paths ("/sys/devices/system/node/online"); a backend
    maps them onto its root.  Syscall arguments are plain ints (addresses included),
    exactly what the kernel receives.
    """

    root: str = "/"
    abi: Abi
    page_size: int
    is_live: bool = False

    def read_text(self, path: str) -> str:
        raise NotImplementedError

    def listdir(self, path: str) -> List[str]:
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def syscall(self, nr: int, *args: int) -> int:
        """Make syscall ``nr``; return its non-negative result or raise OSError."""
        raise NotImplementedError

    def madvise(self, addr: int, length: int, advice: int) -> None:
        raise NotImplementedError

    def sched_getaffinity(self, pid: int = 0) -> FrozenSet[int]:
        raise NotImplementedError

    def sched_setaffinity(self, pid: int, cpus: Iterable[int]) -> None:
        raise NotImplementedError

    def touch(self, addr: int, length: int) -> None:
        """Write one byte per page of [addr, addr+length): a first touch."""
        raise NotImplementedError

    def current_cpu(self) -> Optional[int]:
        return None

    # Convenience shared by all backends ------------------------------------------------
    def read_optional(self, path: str) -> Optional[str]:
        try:
            return self.read_text(path)
        except OSError:
            return None


_libc_lock = threading.Lock()
_libc: Optional[ctypes.CDLL] = None


def _get_libc() -> ctypes.CDLL:
    """libc, loaded lazily and once, with errno capture."""
    global _libc
    with _libc_lock:
        if _libc is None:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.syscall.restype = ctypes.c_long
            lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            lib.madvise.restype = ctypes.c_int
            _libc = lib
        return _libc


def _as_clong(v: int) -> ctypes.c_long:
    bits = ctypes.sizeof(ctypes.c_long) * 8
    v &= (1 << bits) - 1
    if v >= 1 << (bits - 1):
        v -= 1 << bits
    return ctypes.c_long(v)


class LinuxBackend(Backend):
    """The Linux kernel, or a saved tree of it.

    ``root="/"`` is the running system.  Any other root is a saved tree (a directory
    holding ``sys/`` and ``proc/``): files are read from there and every syscall is
    refused with NotLiveError, so a tree gathered on another machine never drives
    this machine's kernel.
    """

    def __init__(self, root: str = "/", *, abi: Optional[Abi] = None) -> None:
        self.root = os.path.abspath(root) if root else "/"
        self.is_live = self.root == "/"
        self.abi = abi if abi is not None else abi_for()
        self.page_size = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def __repr__(self) -> str:
        return f"LinuxBackend(root={self.root!r})"

    def _path(self, path: str) -> str:
        if self.is_live:
            return path
        return os.path.join(self.root, path.lstrip("/"))

    def read_text(self, path: str) -> str:
        with open(self._path(path), "rb") as f:
            return f.read().decode("utf-8", "replace")

    def listdir(self, path: str) -> List[str]:
        return os.listdir(self._path(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(self._path(path))

    def _refuse(self, what: str) -> None:
        if not self.is_live:
            raise NotLiveError(errno.EOPNOTSUPP,
                               f"{what}: backend reads the saved tree {self.root!r}, "
                               "not the running system")

    def syscall(self, nr: int, *args: int) -> int:
        self._refuse(f"syscall {nr}")
        libc = _get_libc()
        ctypes.set_errno(0)
        res = libc.syscall(ctypes.c_long(nr), *[_as_clong(a) for a in args])
        if res == -1:
            err = ctypes.get_errno()
            raise _oserror(err or errno.EIO, f"syscall {nr}")
        return res

    def madvise(self, addr: int, length: int, advice: int) -> None:
        self._refuse("madvise")
        libc = _get_libc()
        if libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(length), advice) != 0:
            raise _oserror(ctypes.get_errno(), "madvise")

    def sched_getaffinity(self, pid: int = 0) -> FrozenSet[int]:
        if not self.is_live:
            return frozenset(_allowed_from_status(self)[0] or ())
        return frozenset(os.sched_getaffinity(pid))

    def sched_setaffinity(self, pid: int, cpus: Iterable[int]) -> None:
        self._refuse("sched_setaffinity")
        os.sched_setaffinity(pid, set(cpus))

    def touch(self, addr: int, length: int) -> None:
        self._refuse("touch")
        _touch_pages(addr, length, self.page_size)

    def current_cpu(self) -> Optional[int]:
        if not self.is_live:
            return None
        try:
            libc = _get_libc()
            fn = libc.sched_getcpu
            fn.restype = ctypes.c_int
            cpu = fn()
            return cpu if cpu >= 0 else None
        except (AttributeError, OSError):
            return None


def _touch_pages(addr: int, length: int, page: int) -> None:
    """Write a zero byte to each page (memset of 1 byte per page, GIL held)."""
    if length <= 0:
        return
    first = addr - (addr % page)
    p = first
    end = addr + length
    while p < end:
        q = max(p, addr)
        # Read-then-write the same byte keeps the contents: prefault must not lose data.
        b = ctypes.c_ubyte.from_address(q)
        b.value = b.value
        p += page


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


# ===========================================================================
# Topology.  Files: Documentation/ABI/stable/sysfs-devices-node,
# Documentation/ABI/testing/sysfs-devices-system-cpu, drivers/pci/pci-sysfs.c.
# ===========================================================================

_NODE_DIR = "/sys/devices/system/node"
_CPU_DIR = "/sys/devices/system/cpu"
_PCI_DIR = "/sys/bus/pci/devices"

# PCI vendor ids (include/linux/pci_ids.h) of GPU makers, and the classes that count
# as GPUs: 0x03xxxx display controllers, 0x12xxxx processing accelerators.
GPU_VENDORS: Mapping[int, str] = MappingProxyType({
    0x10DE: "nvidia", 0x1002: "amd", 0x8086: "intel",
})
_GPU_CLASSES = (0x03, 0x12)


@dataclasses.dataclass(frozen=True)
class HugePages:
    total: int
    free: int
    surplus: int = 0


@dataclasses.dataclass(frozen=True)
class Node:
    id: int
    cpus: FrozenSet[int]
    mem_total_kb: int
    mem_free_kb: int
    distances: Mapping[int, int]
    hugepages: Mapping[int, HugePages]    # page size in kB -> counts


@dataclasses.dataclass(frozen=True)
class Cpu:
    id: int
    node: Optional[int]
    online: bool
    core: Optional[int]
    package: Optional[int]
    siblings: FrozenSet[int]
    llc: FrozenSet[int]


@dataclasses.dataclass(frozen=True)
class PciDevice:
    address: str                 # "0000:17:00.0"
    vendor: int
    device: int
    pci_class: int
    numa_node: int               # -1: firmware did not say
    local_cpus: FrozenSet[int]

    @property
    def vendor_name(self) -> str:
        return GPU_VENDORS.get(self.vendor, f"0x{self.vendor:04x}")


@dataclasses.dataclass(frozen=True)
class Topology:
    nodes: Mapping[int, Node]
    online_nodes: FrozenSet[int]
    possible_nodes: FrozenSet[int]
    nodes_with_cpus: FrozenSet[int]
    nodes_with_memory: FrozenSet[int]
    cpus: Mapping[int, Cpu]
    online_cpus: FrozenSet[int]
    allowed_cpus: FrozenSet[int]
    allowed_mems: FrozenSet[int]
    gpus: Tuple[PciDevice, ...]
    numa_balancing: Optional[int]
    thp: Optional[str]
    problems: Tuple[str, ...] = ()   # what could not be read, as warnings
    has_node_dir: bool = True

    def node_of_cpu(self, cpu: int) -> Optional[int]:
        c = self.cpus.get(cpu)
        return c.node if c is not None else None

    @property
    def mems_allowed(self) -> FrozenSet[int]:
        return self.allowed_mems

    @property
    def usable_memory_nodes(self) -> FrozenSet[int]:
        """Nodes with memory that this process may allocate from (cpuset applied)."""
        usable = self.nodes_with_memory & self.allowed_mems
        return usable if usable else self.nodes_with_memory

    def distance(self, a: int, b: int) -> Optional[int]:
        n = self.nodes.get(a)
        return n.distances.get(b) if n is not None else None

    def nearest(self, node: int, among: Iterable[int]) -> List[int]:
        """``among`` sorted by distance from ``node`` (unknown distances last), then id."""
        def key(n: int) -> Tuple[int, int]:
            d = self.distance(node, n)
            return (d if d is not None else 1 << 16, n)
        return sorted(set(among), key=key)


def _node_dirs(backend: Backend) -> List[int]:
    out = []
    for name in backend.listdir(_NODE_DIR):
        if name.startswith("node") and name[4:].isdigit():
            out.append(int(name[4:]))
    return sorted(out)


class _Reader:
    """Collects problems (unreadable or malformed files) as warnings, never crashes."""

    def __init__(self, backend: Backend) -> None:
        self.b = backend
        self.problems: List[str] = []

    def text(self, path: str) -> Optional[str]:
        try:
            return self.b.read_text(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            self.problems.append(f"cannot read {path}: {e.strerror or e}")
            return None

    def parsed(self, path: str, parser: Callable[..., Any], default: Any = None) -> Any:
        t = self.text(path)
        if t is None:
            return default
        try:
            return parser(t, source=path)
        except ValueError as e:
            self.problems.append(str(e))
            return default

    def integer(self, path: str) -> Optional[int]:
        t = self.text(path)
        if t is None:
            return None
        try:
            return _parse_int(t, path)
        except ValueError as e:
            self.problems.append(str(e))
            return None

    def listdir(self, path: str) -> List[str]:
        try:
            return self.b.listdir(path)
        except FileNotFoundError:
            return []
        except OSError as e:
            self.problems.append(f"cannot list {path}: {e.strerror or e}")
            return []


def _hugepages(r: _Reader, base: str) -> Dict[int, HugePages]:
    out: Dict[int, HugePages] = {}
    for name in sorted(r.listdir(base)):
        m = re.match(r"^hugepages-(\d+)kB$", name)
        if not m:
            continue
        d = f"{base}/{name}"
        total = r.integer(f"{d}/nr_hugepages")
        free = r.integer(f"{d}/free_hugepages")
        surplus = r.integer(f"{d}/surplus_hugepages")
        out[int(m.group(1))] = HugePages(total or 0, free or 0, surplus or 0)
    return out


def _allowed_from_status(backend: Backend) -> Tuple[Optional[FrozenSet[int]],
                                                     Optional[FrozenSet[int]]]:
    text = backend.read_optional("/proc/self/status")
    cpus = mems = None
    if text is None:
        return None, None
    for line in text.splitlines():
        key, _, val = line.partition(":")
        if key == "Cpus_allowed_list":
            cpus = parse_cpulist(val, source="/proc/self/status Cpus_allowed_list")
        elif key == "Mems_allowed_list":
            mems = parse_cpulist(val, source="/proc/self/status Mems_allowed_list")
    return cpus, mems


def _read_cpus(r: _Reader, node_of: Mapping[int, int]) -> Tuple[Dict[int, Cpu],
                                                                 FrozenSet[int]]:
    possible = r.parsed(f"{_CPU_DIR}/possible", parse_cpulist)
    if possible is None:
        possible = r.parsed(f"{_CPU_DIR}/present", parse_cpulist)
    if possible is None:
        possible = frozenset(int(n[3:]) for n in r.listdir(_CPU_DIR)
                             if n.startswith("cpu") and n[3:].isdigit())
    online = r.parsed(f"{_CPU_DIR}/online", parse_cpulist)
    if online is None:
        online = frozenset(possible)
    cpus: Dict[int, Cpu] = {}
    for c in sorted(possible):
        d = f"{_CPU_DIR}/cpu{c}"
        topo = f"{d}/topology"
        core = package = None
        siblings: FrozenSet[int] = frozenset()
        llc: FrozenSet[int] = frozenset()
        if c in online:
            core = r.integer(f"{topo}/core_id")
            package = r.integer(f"{topo}/physical_package_id")
            siblings = r.parsed(f"{topo}/thread_siblings_list", parse_cpulist) \
                or r.parsed(f"{topo}/core_cpus_list", parse_cpulist) or frozenset()
            best = -1
            for idx in r.listdir(f"{d}/cache"):
                if not idx.startswith("index"):
                    continue
                lvl = r.integer(f"{d}/cache/{idx}/level")
                if lvl is None or lvl <= best:
                    continue
                shared = r.parsed(f"{d}/cache/{idx}/shared_cpu_list", parse_cpulist)
                if shared is not None:
                    best, llc = lvl, shared
        node = node_of.get(c)
        if node is None:
            # Offline CPUs may be missing from the node cpulists; the cpuN/nodeM
            # link still says where they belong.
            for name in r.listdir(d):
                if name.startswith("node") and name[4:].isdigit():
                    node = int(name[4:])
                    break
        cpus[c] = Cpu(c, node, c in online, core, package, siblings, llc)
    return cpus, frozenset(online) & frozenset(possible)


def _read_gpus(r: _Reader) -> Tuple[PciDevice, ...]:
    out = []
    for addr in sorted(r.listdir(_PCI_DIR)):
        d = f"{_PCI_DIR}/{addr}"
        vendor = r.integer(f"{d}/vendor")
        cls = r.integer(f"{d}/class")
        if vendor not in GPU_VENDORS or cls is None or (cls >> 16) not in _GPU_CLASSES:
            continue
        device = r.integer(f"{d}/device") or 0
        numa = r.integer(f"{d}/numa_node")
        local = r.parsed(f"{d}/local_cpulist", parse_cpulist)
        if local is None:
            local = r.parsed(f"{d}/local_cpus", parse_cpumap) or frozenset()
        out.append(PciDevice(addr, vendor, device, cls, -1 if numa is None else numa,
                             local))
    return tuple(out)


def read_topology(*, backend: Optional[Backend] = None) -> Topology:
    """Read NUMA topology from sysfs/procfs through ``backend`` (default: this system).

    Never raises for a missing or malformed file: what could not be read is listed
    in ``Topology.problems`` and a documented fallback is used.
    """
    b = _b(backend)
    r = _Reader(b)
    has_node_dir = b.exists(_NODE_DIR)
    node_cpus: Dict[int, FrozenSet[int]] = {}
    mem: Dict[int, Tuple[int, int]] = {}
    hp: Dict[int, Dict[int, HugePages]] = {}
    rows: Dict[int, Tuple[int, ...]] = {}
    if has_node_dir:
        dirs = _node_dirs(b)
        online = r.parsed(f"{_NODE_DIR}/online", parse_cpulist)
        if online is None:
            online = frozenset(dirs)
        possible = r.parsed(f"{_NODE_DIR}/possible", parse_cpulist)
        if possible is None:
            possible = frozenset(online)
        for n in sorted(online):
            d = f"{_NODE_DIR}/node{n}"
            cl = r.parsed(f"{d}/cpulist", parse_cpulist)
            if cl is None:
                cl = r.parsed(f"{d}/cpumap", parse_cpumap)
            node_cpus[n] = cl or frozenset()
            mi = r.parsed(f"{d}/meminfo", parse_meminfo) or {}
            mem[n] = (mi.get("MemTotal", 0), mi.get("MemFree", 0))
            hp[n] = _hugepages(r, f"{d}/hugepages")
            row = r.parsed(f"{d}/distance", parse_distance_row)
            if row is not None:
                rows[n] = row
        with_cpus = r.parsed(f"{_NODE_DIR}/has_cpu", parse_cpulist)
        if with_cpus is None:
            with_cpus = frozenset(n for n, c in node_cpus.items() if c)
        with_mem = r.parsed(f"{_NODE_DIR}/has_memory", parse_cpulist)
        if with_mem is None:
            with_mem = frozenset(n for n, (t, _) in mem.items() if t > 0)
    else:
        # No node directory (kernel without CONFIG_NUMA): one node 0 with every CPU
        # and all memory.
        online = possible = with_cpus = with_mem = frozenset({0})
        mi = r.parsed("/proc/meminfo", parse_meminfo) or {}
        mem[0] = (mi.get("MemTotal", 0), mi.get("MemFree", 0))
        hp[0] = _hugepages(r, "/sys/kernel/mm/hugepages")
        rows[0] = (10,)
    node_of: Dict[int, int] = {}
    for n, cl in node_cpus.items():
        for c in cl:
            node_of[c] = n
    cpus, online_cpus = _read_cpus(r, node_of)
    if not has_node_dir:
        node_cpus[0] = online_cpus
        cpus = {c: dataclasses.replace(v, node=0) for c, v in cpus.items()}
    order = sorted(online)
    nodes: Dict[int, Node] = {}
    for n in order:
        row = rows.get(n)
        dist: Dict[int, int] = {}
        if row is not None:
            if len(row) == len(order):
                dist = dict(zip(order, row))
            else:
                r.problems.append(f"{_NODE_DIR}/node{n}/distance has {len(row)} entries "
                                  f"for {len(order)} online nodes; distances ignored")
        t, f = mem.get(n, (0, 0))
        nodes[n] = Node(n, frozenset(node_cpus.get(n, frozenset())), t, f,
                        MappingProxyType(dist), MappingProxyType(hp.get(n, {})))
    try:
        allowed_cpus, allowed_mems = _allowed_from_status(b)
    except ValueError as e:
        r.problems.append(str(e))
        allowed_cpus = allowed_mems = None
    if allowed_cpus is None:
        allowed_cpus = online_cpus
    if allowed_mems is None:
        allowed_mems = frozenset(with_mem)
    nb = r.integer("/proc/sys/kernel/numa_balancing")
    thp = None
    t = r.text("/sys/kernel/mm/transparent_hugepage/enabled")
    if t is not None:
        m = re.search(r"\[(\w+)\]", t)
        if m:
            thp = m.group(1)
        else:
            r.problems.append(f"no [selected] THP mode in {t.strip()!r}")
    return Topology(
        nodes=MappingProxyType(nodes),
        online_nodes=frozenset(online), possible_nodes=frozenset(possible),
        nodes_with_cpus=frozenset(with_cpus), nodes_with_memory=frozenset(with_mem),
        cpus=MappingProxyType(cpus), online_cpus=online_cpus,
        allowed_cpus=frozenset(allowed_cpus), allowed_mems=frozenset(allowed_mems),
        gpus=_read_gpus(r), numa_balancing=nb, thp=thp,
        problems=tuple(r.problems), has_node_dir=has_node_dir,
    )


# ---------------------------------------------------------------------------
# JSON: one function turns every public type into JSON-ready data.
# ---------------------------------------------------------------------------

def _topology_json(t: Topology) -> Dict[str, Any]:
    def ids(s: Iterable[int]) -> List[int]:
        return sorted(s)
    return {
        "nodes": [{
            "id": n.id, "cpus": ids(n.cpus), "mem_total_kb": n.mem_total_kb,
            "mem_free_kb": n.mem_free_kb,
            "distances": {str(k): v for k, v in sorted(n.distances.items())},
            "hugepages": {str(k): {"total": h.total, "free": h.free, "surplus": h.surplus}
                          for k, h in sorted(n.hugepages.items())},
        } for n in (t.nodes[i] for i in sorted(t.nodes))],
        "online_nodes": ids(t.online_nodes), "possible_nodes": ids(t.possible_nodes),
        "nodes_with_cpus": ids(t.nodes_with_cpus),
        "nodes_with_memory": ids(t.nodes_with_memory),
        "cpus": {str(c.id): {"node": c.node, "online": c.online, "core": c.core,
                             "package": c.package, "siblings": ids(c.siblings),
                             "llc": ids(c.llc)}
                 for c in (t.cpus[i] for i in sorted(t.cpus))},
        "online_cpus": ids(t.online_cpus),
        "allowed_cpus": ids(t.allowed_cpus), "allowed_mems": ids(t.allowed_mems),
        "gpus": [_pci_json(g) for g in t.gpus],
        "numa_balancing": t.numa_balancing, "thp": t.thp,
        "problems": list(t.problems),
    }


def _pci_json(g: PciDevice) -> Dict[str, Any]:
    return {"address": g.address, "vendor": f"0x{g.vendor:04x}",
            "vendor_name": g.vendor_name, "device": f"0x{g.device:04x}",
            "class": f"0x{g.pci_class:06x}", "numa_node": g.numa_node,
            "local_cpus": sorted(g.local_cpus)}


def to_json(obj: Any) -> Any:
    """JSON-ready data for any numa_utils value (Topology, results, entries ...)."""
    if isinstance(obj, Topology):
        return _topology_json(obj)
    if isinstance(obj, PciDevice):
        return _pci_json(obj)
    if hasattr(obj, "to_json") and callable(obj.to_json):
        return obj.to_json()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.name.lower()
    if isinstance(obj, (frozenset, set)):
        return sorted(to_json(x) for x in obj)
    if isinstance(obj, Mapping):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(x) for x in obj]
    return obj
