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

Nodes: one rule for every function that takes them (ids, or a list as text: "0-1,4").
A node this machine does not have (not online) is a mistake in the program or its
configuration: ValueError naming it and the nodes that exist, strict or not.  A node it
has that this process's cpuset forbids is a fact of the environment: a call that places
memory or CPUs leaves it out (``dropped``, reason "cpuset" with a hint; falsy when
nothing is left) and raises OSError only under strict; a call that only asks about a
node (local_devices, choose_node) answers.  The raw syscalls (mbind, ...) pass ids to
the kernel, and parse_nodestring keeps numactl's grammar and refusals.
"""

from __future__ import annotations

import enum
import errno
import itertools
import os
import re
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
            fields = ns.get("__annotations__", {})
            defaults = [ns.pop(f) for f in fields if f in ns]
            base = collections.namedtuple(
                name, fields, defaults=defaults, module=ns.get("__module__")
            )
            ns["__slots__"] = ()
            ns.setdefault("__repr__", _record_repr)
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
    "NotLiveError",
    "default_backend",
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
    "prefault",
    "placement",
    "NumaMapsEntry",
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
    # starting processes bound: what works here, any start, a multiprocessing context
    "can_bind",
    "BindCheck",
    "bound_start",
    "StartRecord",
    "spawn_context",
    # PCI devices: NICs, RDMA, NVMe, GPUs
    "Device",
    "DEVICE_KINDS",
    "devices",
    "device_distance",
    "local_devices",
    "LocalDevices",
    # numactl's node/CPU list grammar; CLI
    "parse_nodestring",
    "main",
    "configure",
]

if TYPE_CHECKING:
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
        level = logging.WARNING
        if _cli_verbose:
            level = logging.INFO
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
    lsb_first = bin(value)[:1:-1]  # "0b110" -> "011"
    return frozenset(m.start() for m in re.finditer("1", lsb_first))


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
        lo = int(g[0])
        used = int(g[2] or 1)
        group = int(g[3] or 1)
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
            pat = (1 << min(used, span)) - 1
            width = group
            while width < span:
                pat |= pat << width
                width *= 2
            bits |= (pat & ((1 << span) - 1)) << lo
    return _set_bits(bits)


def _printable_char(char: str) -> str:
    if char.isprintable():
        return char
    return repr(char)[1:-1]


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
    ordered = sorted(set(ids))
    runs = itertools.groupby(enumerate(ordered), lambda pair: pair[1] - pair[0])
    parts = []
    for _, run in runs:
        span = [cpu for _, cpu in run]
        if len(span) == 1:
            parts.append(str(span[0]))
        else:
            parts.append(f"{span[0]}-{span[-1]}")
    return ",".join(parts)


# -- how records print: a log line -------------------------------------------------
# Sets of ids as lists ({0-47,96-143}), fields at their default left out, and, while
# the line is longer than _REPR_MAX, the longest value cut to its kind and size: the
# detail is in the fields and to_json().
_REPR_MAX = 300


def _repr_value(value: Any) -> str:
    """A record's field as the record's repr writes it."""
    if isinstance(value, (set, frozenset)) and all(type(item) is int for item in value):
        return "{" + format_cpulist(value) + "}"
    if isinstance(value, _abc.Mapping):
        items = ", ".join(f"{key!r}: {_repr_value(value[key])}" for key in value)
        return "{" + items + "}"
    return repr(value)


def _repr_cut(value: Any) -> str:
    """A field's value cut to what it is: a text's start, how many items a collection
    holds, the type of anything else (a record, a number)."""
    if isinstance(value, str):
        return repr(value[:40] + "...")
    if isinstance(value, _abc.Sized) and not hasattr(value, "_fields"):
        return f"<{len(value)} ...>"
    return f"{type(value).__name__}(...)"


def _repr_fields(record: Any) -> Dict[str, str]:
    """A record's fields that are not at their default, as its repr writes them."""
    defaults = record._field_defaults
    shown = {}
    for name, value in zip(record._fields, record):
        if name not in defaults or value != defaults[name]:
            shown[name] = _repr_value(value)
    return shown


def _repr_width(head: str, shown: Dict[str, str]) -> int:
    """The length of the line ``head(name=text, ...)``: each field costs its name, its
    text, "=" and ", " (the last one's ", " pays for the parentheses)."""
    fields = sum(len(name) + len(text) + 3 for name, text in shown.items())
    return len(head) + fields


def _cut_to_fit(record: Any, head: str, shown: Dict[str, str]) -> None:
    """Cut ``shown``, the fields of ``record`` (named ``head``) as text, the longest
    first, until its line is at most _REPR_MAX."""
    for name in sorted(shown, key=lambda name: -len(shown[name])):
        if _repr_width(head, shown) <= _REPR_MAX:
            return
        shown[name] = _repr_cut(getattr(record, name))


def _record_repr(record: Any) -> str:
    """Every record's repr (_RecordMeta installs it)."""
    head = type(record).__name__
    shown = _repr_fields(record)
    _cut_to_fit(record, head, shown)
    fields = ", ".join(f"{name}={text}" for name, text in shown.items())
    return f"{head}({fields})"


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
    for word in words:
        if not _HEX_WORD.fullmatch(word):
            raise ValueError(
                f"invalid CPU mask{_where(source)}: word {word[:40]!r} of {_short(text)}"
            )
    hex_digits = "".join(word.rjust(8, "0") for word in words)
    value = int(hex_digits, 16)
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
    every_line = len(pairs) == s.count("\n") + 1
    if every_line and not any(field.startswith("Node ") for field, _ in pairs):
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
    lowered = machine.lower()
    table_name = _MACHINE_ALIASES.get(lowered, lowered)
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
    byteorder: ByteOrder = sys.byteorder  # an unknown machine: this interpreter's
    if table_name in _BIG_ENDIAN:
        byteorder = "big"
    elif known:
        byteorder = "little"
    return Abi(name, pointer_bits, byteorder, table)


def _nodes_txt(ids: Iterable[int]) -> str:
    """ "node 0" / "nodes 0-1,4": the word agrees with the count."""
    some = sorted(ids)
    if not some:
        return "nodes -"
    if len(some) == 1:
        return f"node {some[0]}"
    return f"nodes {format_cpulist(some)}"


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
        to see it overrides this one method.  numa_utils_regions adds the shared-memory
        operations (shmget, shm_open, mmap, ...; its _serve_shared_memory lists them).

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
                fn.argtypes = args
                fn.restype = res
            _libc = lib
        return _libc


def _allowed_from_status(
    backend: Backend, pid: Union[int, str] = "self"
) -> Tuple[Optional[FrozenSet[int]], Optional[FrozenSet[int]]]:
    """(Cpus_allowed_list, Mems_allowed_list) of /proc/<pid>/status; None for a file
    or line that is not there.  A malformed list raises ValueError naming it."""
    path = f"/proc/{pid}/status"
    cpus: Optional[FrozenSet[int]] = None
    mems: Optional[FrozenSet[int]] = None
    for line in (_read_optional(backend, path) or "").splitlines():
        name, _, value = line.partition(":")
        if name == "Cpus_allowed_list":
            cpus = parse_cpulist(value, source=f"{path} {name}")
        elif name == "Mems_allowed_list":
            mems = _parse_nodelist(value, source=f"{path} {name}")
    return cpus, mems


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
    pages = len(starts)
    if pages:
        starts[0] = addr  # the first page from addr itself
    iov = array.array("Q", [1]) * (2 * pages)  # (start, length 1) per page
    iov[0::2] = starts
    base = iov.buffer_info()[0]
    r, w = os.pipe()
    try:
        for i in range(0, pages, _IOV_MAX):
            count = min(_IOV_MAX, pages - i)
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


# Kernel operations a sibling serves on the running system, by name: what
# numa_utils_regions adds (shared memory), which no engine that keeps its own mapping
# needs.  A backend's own _call_<name> comes first: the simulator models them.
_LINUX_OPERATIONS: Dict[str, Callable[..., Any]] = {}


class LinuxBackend(Backend):
    """The Linux kernel, or a saved tree of it.

    ``root="/"`` is the running system.  A saved tree (a folder holding ``sys/`` and
    ``proc/``, or a tree saved in one file) is read through numa_utils_sim, which
    walks its links inside it: ``LinuxBackend(numa_utils_sim.open_tree(path))``, or
    any object with ``path`` and the file methods below (``read_text``, ``listdir``,
    ``exists``, ``realpath``; ``machine()``, what it knows of its machine).
    Files are then read from the tree and every syscall is refused with NotLiveError,
    so a tree gathered on another machine never drives this machine's kernel.
    """

    def __init__(self, root: Any = "/", *, abi: Optional[Abi] = None) -> None:
        tree: Any = None
        if not isinstance(root, str):
            tree, root = root, root.path
        elif os.path.abspath(root or "/") != "/":
            raise ValueError(
                f"LinuxBackend({root!r}): a saved tree is read by numa_utils_sim: "
                "LinuxBackend(numa_utils_sim.open_tree(path))"
            )
        self.root = os.path.abspath(root or "/")
        self.is_live = tree is None
        if abi is None:
            abi = abi_for()
        self.abi = abi
        self.page_size = os.sysconf("SC_PAGE_SIZE")
        self._tree = tree

    def __repr__(self) -> str:
        return f"LinuxBackend(root={self.root!r})"

    def call(self, name: str, *args: Any) -> Any:
        served = _LINUX_OPERATIONS.get(name)
        if served is None or hasattr(self, "_call_" + name):
            return super().call(name, *args)
        return served(self, *args)

    def read_text(self, path: str) -> str:
        if self._tree is not None:
            return str(self._tree.read_text(path))
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def listdir(self, path: str) -> List[str]:
        if self._tree is not None:
            return list(self._tree.listdir(path))
        return os.listdir(path)

    def exists(self, path: str) -> bool:
        if self._tree is not None:
            return bool(self._tree.exists(path))
        # access, not stat: on CPython 3.8-3.10 a signal handled while os.stat
        # builds its result leaves a SystemError in place of the KeyboardInterrupt.
        return os.access(path, os.F_OK)

    def realpath(self, path: str) -> str:
        if self._tree is not None:
            return str(self._tree.realpath(path))
        return os.path.realpath(path)

    def _refuse(self, what: str) -> None:
        if not self.is_live:
            raise NotLiveError(
                errno.EOPNOTSUPP,
                f"{what}: backend reads the saved tree {self.root!r}, not the running system",
            )

    def _call_syscall(self, nr: int, *args: int) -> int:
        # c_long wraps an unsigned value (an address, -1 as a u64) as C would.
        words = [ctypes.c_long(a) for a in (nr, *args)]
        return int(self._libc_call(f"syscall {nr}", *words))

    def _call_madvise(self, addr: int, length: int, advice: int) -> None:
        self._libc_call("madvise", addr, length, advice)

    def _call_sched_getaffinity(self, pid: int = 0) -> FrozenSet[int]:
        if not self.is_live:
            return frozenset(_allowed_from_status(self)[0] or ())
        return frozenset(os.sched_getaffinity(pid))

    def _call_sched_setaffinity(self, pid: int, cpus: Iterable[int]) -> None:
        self._refuse("sched_setaffinity")
        os.sched_setaffinity(pid, cpus)

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
        vec = ctypes.create_string_buffer(max(1, min((length + page - 1) // page, 1 << 20)))
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
        fn = getattr(_get_libc(), what.replace("(", " ").split()[0])  # "shmctl(IPC_STAT)"
        ctypes.set_errno(0)
        res = fn(*args)
        # -1 for the int-returning calls; NULL or MAP_FAILED ((void *) -1, unsigned
        # through c_void_p) for shmat and mmap.
        if res in (-1, None, ctypes.c_void_p(-1).value):
            raise _oserror(ctypes.get_errno() or errno.EIO, what)
        return res


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


def _check_sibling(module: str, version: str) -> None:
    """Called by numa_utils_regions, _threads and _cli as each loads: one line naming
    both files when this core is of another release."""
    if version != __version__:
        raise ImportError(
            f"{module.rpartition('.')[2]} {version} needs numa_utils {version}, "
            f"not {__version__} ({__file__}): copy both from one release"
        )


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
        unknown = 1 << 16
        return sorted(set(among), key=lambda n: (self.distance(node, n) or unknown, n))


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


def _online_nodes(reader: _Reader) -> FrozenSet[int]:
    """The nodes this machine has, as read_topology() finds them: the online ones
    (node 0 without a node directory), cheaply."""
    if not reader.exists(_NODE_DIR):
        return frozenset({0})
    online = reader.parsed(f"{_NODE_DIR}/online", _parse_nodelist)
    if online is None:
        online = _node_dirs(reader)
    return frozenset(online)


def _hugepages(reader: _Reader, base: str) -> Dict[int, HugePages]:
    out: Dict[int, HugePages] = {}
    for name in sorted(reader.listdir(base)):
        m = re.match(r"^hugepages-([0-9]+)kB$", name)
        if m:
            size_kb = int(m.group(1))
            out[size_kb] = HugePages(
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
        if got is not None and (got or not nonempty):
            return got
    return None


def _possible_cpus(reader: _Reader) -> FrozenSet[int]:
    """cpu/possible (else present), else the cpuN folders."""
    listed = _first_parsed(reader, (f"{_CPU_DIR}/possible", f"{_CPU_DIR}/present"))
    if listed is not None:
        return frozenset(listed)
    ids = (_id_of(name, "cpu") for name in reader.listdir(_CPU_DIR))
    return frozenset(i for i in ids if i is not None and i < MAX_CPUS)


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
        return listed[cpu]
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
        if type(node) is not int or node < 0:  # True is not node 1
            raise ValueError(f"invalid NUMA node id {node!r}")
    return ids


def _check_nodes(nodes: Union[str, Iterable[int]], have: FrozenSet[int]) -> FrozenSet[int]:
    """``nodes`` (ids, or a list as text: "0-1,4") as a frozenset of nodes this machine
    has (``have``: the online ones); ValueError naming those it lacks and the nodes it
    has (the module's rule)."""
    if isinstance(nodes, str):
        nodes = _parse_nodelist(nodes, source="nodes")
    ids = _node_ids(nodes)
    if ids - have:
        raise ValueError(f"no NUMA {_nodes_txt(ids - have)} (this machine has {_nodes_txt(have)})")
    return ids


def _swap_words(raw: bytes, abi: Abi) -> bytes:
    """Little-endian bytes as the ABI's words, and back (the same on little-endian ABIs)."""
    if abi.byteorder == "little":
        return raw
    wb = abi.word_bits // 8
    words = (raw[i : i + wb] for i in range(0, len(raw), wb))
    return b"".join(word[::-1] for word in words)


def _encode_nodemask(nodes: Iterable[int], words: int, abi: Abi) -> bytes:
    """``words`` unsigned longs in the ABI's byte order; nodes beyond them are left out."""
    bits = words * abi.word_bits
    mask = sum(1 << i for i in set(nodes) if i < bits)
    return _swap_words(mask.to_bytes(bits // 8, "little"), abi)


def decode_nodemask(raw: bytes, abi: Abi) -> FrozenSet[int]:
    word = abi.word_bits // 8
    whole_words = raw[: len(raw) // word * word]
    little = _swap_words(whole_words, abi)
    return _set_bits(int.from_bytes(little, "little"))


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
        if abi is None:
            abi = abi_for()
        self.abi = abi
        self.nodes = ids = _node_ids(nodes)
        w = abi.word_bits
        need = max(bits, max(ids, default=0) + 1)
        self.words = (need + w - 1) // w
        self.bits = self.words * w
        # Room for what get_mempolicy writes: ALIGN(maxnode - 1, 64) / 8 bytes.
        self.nbytes = ((self.bits + 63) // 64) * 8
        self.buffer = ctypes.create_string_buffer(
            _encode_nodemask(ids, self.words, abi), self.nbytes
        )
        self.address = ctypes.addressof(self.buffer)

    @property
    def maxnode(self) -> int:
        return self.bits + 1

    def read(self) -> FrozenSet[int]:
        """Decode the buffer (after the kernel wrote into it)."""
        return decode_nodemask(self.buffer.raw[: self.bits // 8], self.abi)

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
    value = int.from_bytes(pol.raw, backend.abi.byteorder, signed=True)
    return value, mask.read()


def _pointer_bits(abi: Abi) -> int:
    # Equal to abi.word_bits on a real kernel; a 32-bit ABI simulated on a 64-bit
    # host keeps host-sized pointers.
    return max(abi.word_bits, ctypes.sizeof(ctypes.c_void_p) * 8)


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
    import array

    backend = _b(backend)
    if nodes is not None and len(nodes) != len(pages):
        raise ValueError("move_pages: pages and nodes differ in length")
    # The ABI's pointers and ints, in its byte order (a simulated kernel's may differ
    # from this host's).
    typecode = "I"
    if _pointer_bits(backend.abi) == 64:
        typecode = "Q"
    addresses = array.array(typecode, pages)
    targets = array.array("i", [] if nodes is None else nodes)
    status = array.array("i", bytes(4 * len(pages)))
    swap = backend.abi.byteorder != sys.byteorder
    if swap:
        addresses.byteswap()
        targets.byteswap()
    targets_address = 0
    if nodes is not None:
        targets_address = targets.buffer_info()[0]
    backend.call(
        "syscall",
        backend.abi.number("move_pages"),
        pid,
        len(pages),
        addresses.buffer_info()[0],
        targets_address,
        status.buffer_info()[0],
        int(flags),
    )
    if swap:
        status.byteswap()
    return status.tolist()


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
    online = reader.parsed(f"{_CPU_DIR}/online", parse_cpulist, possible)
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
            if cpu in llc_of:
                llc = llc_of[cpu]
            else:
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
    return cpus, online & possible


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
        path: Tuple[str, ...] = (addr,)  # no host bridge in the link (a saved tree)
        for i, part in enumerate(parts):
            if re.match(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}$", part):
                path = tuple(parts[i:])
                break
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
        offline = possible - online
        keep = reader.online(frozenset(weights) - offline, online, f"{_WI_DIR}/node*")
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
    candidates = dict.fromkeys(n for n in names if n is not None)  # in order, once each
    for name in candidates:
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
                node_id = node.value
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


def to_json(obj: Any) -> Any:
    """JSON-ready data for any numa_utils value (Topology, results, entries ...)."""
    if obj is None or type(obj) in (int, str, float, bool):  # most calls: a leaf
        return obj
    if isinstance(obj, Topology):
        return _topology_json(obj)
    if callable(getattr(obj, "to_json", None)):
        return obj.to_json()
    if isinstance(obj, tuple) and hasattr(obj, "_asdict"):
        return _record_json(obj)
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
    distances = {"distances": _sorted_json(node.distances)}
    hugepages = {"hugepages": _sorted_json(node.hugepages)}
    return _record_json(node, distances=distances, hugepages=hugepages)


def _cpu_json(cpu: Cpu) -> Dict[str, Any]:
    """Cpu's fields but its id (the key it is listed under: no keys in its place)."""
    return _record_json(cpu, id={})


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
    if not near:  # an empty pool (a damaged tree lists no CPU node)
        return ()
    shortest = topo.distance(node, near[0])
    return tuple(n for n in near if topo.distance(node, n) == shortest)


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
    ordered = sorted(cards, key=lambda gpu: (gpu.cpu_node, gpu.pci))
    home = {m: _home_cpu_node(topo, m) for m in free}
    if None not in home.values():
        plan: Dict[str, Tuple[int, ...]] = {}
        for cpu_node, members in itertools.groupby(ordered, lambda gpu: gpu.cpu_node):
            own = [m for m in free if home[m] == cpu_node]
            plan.update(_share_out(own, list(members)))
        if len(plan) == len(cards):  # every CPU node's GPUs got their share
            return plan
    return _share_out(free, ordered)


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
        if nv.numa_node is not None and nv.pci in pcis and nv.numa_node not in topo.nodes_with_cpus:
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
    uuids = dict(driver)
    for nv in nvml or ():
        if nv.uuid:
            uuids[nv.pci] = nv.uuid
    out = []
    for dev in topo.gpus:
        node = dev.node
        how = dev.node_source
        cpu_node = None
        if node is not None:
            cpu_node = _nearest_cpu_node(topo, node)
            if cpu_node != node:
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
    order = sorted(online)
    for node in order:
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
                reader.online(possible, online, f"{where} (a column per possible node)")
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
        if node in gi:
            if node in links:
                why += "; standing for " + ", ".join(links[node])
            else:
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
        problems=tuple(dict.fromkeys(reader.problems)),  # each once (devices: read twice)
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
# The default memory nodes.  Memory tiers (mm/memory-tiers.c: a lower tier id is faster;
# DRAM is tier 4) and HMAT drive the kernel's own demotion; we follow them, and without
# them fall back to evidence that has no false positives on plain machines.
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
    for node in cpu_nodes:
        for other in cpu_nodes:
            if other != node or len(cpu_nodes) == 1:
                distances.append(topo.distance(node, other))
    return max((d for d in distances if d is not None), default=None)


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
        out = [nid for nid in sorted(cands) if test(topo.nodes[nid])]
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
    known_tiers = {}
    for nid in cands:
        tier = topo.nodes[nid].tier
        if tier is not None:
            known_tiers[nid] = tier
    with_cpus = cands & topo.nodes_with_cpus
    tiers_tell = len(known_tiers) == len(cands) and len(set(known_tiers.values())) > 1
    if tiers_tell:
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
        cpu_nodes = sorted(with_cpus or (topo.nodes_with_cpus & set(topo.nodes)))
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
    old_mask = NodeMask(old, abi=backend.abi, bits=bits)
    new_mask = NodeMask(new, abi=backend.abi, bits=bits)
    nr = backend.abi.number("migrate_pages")
    return int(
        backend.call("syscall", nr, pid, old_mask.maxnode, old_mask.address, new_mask.address)
    )


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
    end = -(-(addr + length) // page) * page  # rounded up
    return start, end - start


# ===========================================================================
# Memory policy: the safe layer engines call.  Never raises for the machine or the
# environment unless strict=True (a wrong argument, such as a node the machine does not
# have, is a ValueError); returns a PolicyResult that is truthy when the policy was
# applied and otherwise says why, with the memory left usable under first-touch.
# ===========================================================================

_HINTS = MappingProxyType(
    {
        "EPERM": "memory policy syscalls are denied: in a container add CAP_SYS_NICE (docker run "
        "--cap-add SYS_NICE) or use a seccomp profile that allows mbind/set_mempolicy/"
        "get_mempolicy",
        "ENOSYS": "the kernel has no NUMA memory policy support (CONFIG_NUMA off)",
        "unsupported-arch": "no syscall table for this CPU architecture/ABI",
        "cpuset": "this process's cpuset (Cpus_allowed_list, Mems_allowed_list in "
        "/proc/self/status) forbids the requested nodes (dropped): ask for allowed ones, or "
        "start the process in a cgroup whose cpuset.cpus and cpuset.mems include them",
        "single-node": "only one memory node is usable: nothing to spread",
        "not-live": "the backend reads a saved tree, not the running system",
        "disabled": "disabled by configuration",
        "EINVAL": "the kernel rejected the policy (EINVAL)",
        "no-memory-node": "the requested nodes have no memory (CPUs only): ask for nodes "
        "with memory",
        "no-cpus": "the node has no CPUs: run on the CPUs of its nearest node (bind_to_node does)",
        "no-node": "no such NUMA node: read_topology().online_nodes lists them",
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
    # Why not applied ("EPERM", "single-node", ...), or why not all as asked: "cpuset"
    # or "no-memory-node" for the ``dropped`` nodes, "resident-unmoved".
    reason: Optional[str] = None
    errno: Optional[int] = None
    hint: Optional[str] = None
    dropped: FrozenSet[int] = frozenset()  # requested nodes left out (cpuset, no memory)
    # Bytes of the range already in memory that the call left where they are (a
    # policy places new pages; move=True migrates these).  Reason "resident-unmoved".
    resident_unmoved: int = 0
    placed_by: str = ""  # "policy": the kernel's; "thread": by prefault's threads (regions)

    def __bool__(self) -> bool:
        return self.applied

    def to_json(self) -> Dict[str, Any]:
        return _record_json(self)


class PolicyInfo(_Record):
    """A policy read back from the kernel (get_policy)."""

    mode: Mode
    flags: int
    nodes: FrozenSet[int]

    def __str__(self) -> str:
        """The policy as /proc/<pid>/numa_maps prints it (mpol_to_str; the kernel
        never sets both static and relative)."""
        s = _MODE_WORDS[self.mode].kernel
        flag_words = zip(reversed(ModeFlag), _MAPS_FLAG_NAMES)
        words = [word for flag, word in flag_words if self.flags & flag]
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


class _MemoryNodes(_Record):
    """The machine's nodes as a policy call weighs them (_memory_nodes)."""

    mem: FrozenSet[int]  # the nodes with memory
    allowed: FrozenSet[int]  # Mems_allowed: those the cpuset allows
    default: FrozenSet[int]  # default_memory_nodes()
    online: FrozenSet[int]  # the nodes the machine has


def _memory_nodes(backend: Backend) -> _MemoryNodes:
    """The machine's nodes with memory, allowed, by default and online, cheaply: the
    whole topology is read only when a memory node lacks CPUs or normal memory or the
    kernel has several memory tiers (otherwise the default is every allowed node)."""
    reader = _Reader(backend)  # what it cannot read is read_topology's to report
    online = _online_nodes(reader)
    if not reader.exists(_NODE_DIR):
        return _MemoryNodes(online, online, online, online)
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
    tier_dirs = reader.listdir(_TIER_DIR)
    tiers = tuple(sorted(name for name in tier_dirs if name.startswith("memory_tier")))
    try:  # every memory node has CPUs and normal memory
        plain = all(t is None or mem <= parse_cpulist(t) for t in texts)
    except ValueError:
        plain = False
    if plain and len(tiers) < 2:
        default = mem & allowed or mem  # every allowed one (all, if the cpuset allows none)
        return _MemoryNodes(mem, allowed, default, online)
    # A tiered machine: the whole topology decides (~10 ms), once per distinct state
    # of these files (an engine may interleave every layer of every request).
    # Each dict operation is atomic: two threads at worst both read the topology.
    key = (type(backend).__name__, backend.root, mem, allowed, texts, tiers)
    default = _default_cache.get(key)
    if default is None:
        if len(_default_cache) > 64:
            _default_cache.clear()
        default = _default_cache[key] = default_memory_nodes(backend=backend)
    return _MemoryNodes(mem, allowed, default, online)


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


def _env_spellings() -> Tuple[Dict[str, str], Dict[str, str]]:
    """({another spelling of one of our variables: ours}, {a suffix, and its words after
    NUMA_, which a typo keeps: ours}) for the prefix in effect."""
    spelled, words = {}, {}
    for suffix in _ENV_VARS:
        ours = _env_prefix + suffix
        spelled[suffix] = spelled["NUMA_UTILS_" + suffix] = ours
        words[suffix] = words[suffix.split("NUMA_", 1)[-1]] = ours
    return spelled, words


def _env_ignored() -> Dict[str, str]:
    """{variable set that numa_utils does not read: the name it reads closest to it}:
    one of ours without the prefix in effect (NUMA_NODES), or a name under the prefix
    close to one of ours (NUMA_UTILS_INTERLAVE).  Only close names: an engine's prefix
    holds the engine's own variables, ours the test and command-line ones."""
    import difflib

    spelled, words = _env_spellings()
    found = {}
    for name in os.environ:
        rest = name[len(_env_prefix) :]
        if name.startswith(_env_prefix) and rest in _ENV_VARS:
            continue  # ours
        if name in spelled:
            found[name] = spelled[name]
            continue
        if _env_prefix and name.startswith(_env_prefix):
            for close in difflib.get_close_matches(rest, words, n=1, cutoff=0.8):
                found[name] = words[close]
    return found


def _warn_env_ignored() -> None:
    """Warn once about each variable set that is not read, once per prefix."""
    for name, ours in _env_ignored().items():
        _warn_once(f"env:{name}", "numa_utils: %s is not read; did you mean %s?", name, ours)
    _warned.add("env:" + _env_prefix)


def _env(suffix: str) -> Any:
    """The typed value of <prefix><suffix>, read now; its default when unset or empty.
    A malformed value raises ValueError naming the variable.  The first read under a
    prefix warns about each variable set that is not read (_env_ignored)."""
    default, kind = _ENV_VARS[suffix]
    name = _env_prefix + suffix
    if "env:" + _env_prefix not in _warned:
        _warn_env_ignored()
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    word = raw.lower()
    if kind == "bool":
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off"):
            return False
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
    node_of = {cpu: info.node for cpu, info in topo.cpus.items() if info.node is not None}
    return _read_devices(_Reader(backend), node_of, topo.nodes_with_cpus, topo.online_nodes)


def devices(kind: Optional[str] = None, *, backend: Optional[Backend] = None) -> List[Device]:
    """The PCI functions (bridges aside) in PCI order, with kind, node, local CPUs,
    kernel names and bus path; ``kind``: only those of one of DEVICE_KINDS.  The
    "gpu" ones are the GPUs gpus() describes."""
    if kind is not None and kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device kind {kind!r}; one of {', '.join(DEVICE_KINDS)}")
    backend = _b(backend)
    found = _devices(read_topology(backend=backend), backend)
    return [device for device in found if kind in (None, device.kind)]


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
    sign, digits = match.groups()
    if digits[1:2] in ("x", "X"):
        value = int(digits, 16)
    elif digits[0] == "0":
        value = int(digits, 8)
    else:
        value = int(digits)
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
    if not text:
        return frozenset()
    invert = text.startswith("!")
    relative = text.startswith("+", invert)
    i = invert + relative
    mask: Set[int] = set()

    def number(j: int, missing: str, out_of_range: str) -> Tuple[int, int]:
        """The id at text[j:] (the v-th allowed id for "+LIST") and where it ends;
        libnuma's refusals name the text (CPUs) or its "%ld" (nodes)."""
        value, end = _strtoul(text, j)
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
                shown: object = text[j:]
            elif value >> 63:
                shown = value - (1 << 64)  # as libnuma's "%ld" prints it
            else:
                shown = value
            raise NodeListError(f"{what} argument {shown} {out_of_range}", blank=True)
        return value, end

    while True:
        rest = text[i:]
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
            i = len(text)
            break
        v, i = number(i, f"unparseable {what} description `{rest}'", "is out of range")
        mask.add(v & 0xFFFFFFFF)
        if text.startswith("-", i):
            v2, i = number(i + 1, f"missing {what} argument {text[i + 1 :]}", "out of range")
            lo = v & 0xFFFFFFFF
            hi = lo + v2 - v  # the loop's int wraps: ids lo..hi modulo 2**32
            mask.update(node for node in order if lo <= node <= hi or node <= hi - (1 << 32))
        if not text.startswith(",", i):
            break
        i += 1
    if i != len(text):
        raise NodeListError(f"trailing characters in {what} list {text!r}", warn=False)
    if invert:  # libnuma flips ids below the count, not the allowed set
        mask ^= set(range(conf))
    return frozenset(mask)


def _env_nodes(
    backend: Optional[Backend], topo: Optional[Topology] = None
) -> Optional[FrozenSet[int]]:
    """NUMA_NODES resolved on the machine (on ``topo`` when given), or None when unset:
    against every node it has ("all", "!0", "+1"), as nodes passed to a call are; the
    call then applies the cpuset."""
    text = _env("NUMA_NODES")
    if text is None:
        return None
    topo = _topology_or_read(topo, backend)
    unrestricted = topo._replace(allowed_mems=frozenset(topo.nodes))
    try:
        return parse_nodestring(text, backend=backend, topology=unrestricted)
    except ValueError as err:
        raise ValueError(
            f"{_env_prefix}NUMA_NODES={_short(text)}: {_cut(str(err))} "
            f"(this machine has {_nodes_txt(topo.nodes)})"
        ) from None


def _left_out(res: PolicyResult, memory: _MemoryNodes, strict: bool, what: str) -> PolicyResult:
    """``res`` over the nodes it asks for that have memory the cpuset allows; the rest
    ``dropped``, with the reason: "cpuset" when the cpuset forbids some, else
    "no-memory-node".  None left, or any dropped under strict: the fallback (OSError
    under strict)."""
    usable = memory.mem & memory.allowed
    dropped = res.nodes - usable
    if not dropped:
        return res
    res = res._replace(nodes=res.nodes & usable, dropped=dropped)
    why = "no-memory-node"
    if dropped & memory.mem:
        why = "cpuset"
    if strict or not res.nodes:
        what = f"{what} on {_nodes_txt(dropped)}"
        return _fallback(res, strict, what, why, errno.EINVAL)
    return res._replace(reason=why, hint=_HINTS[why])


# The last page range each backend was denied a policy for (EPERM, a container's seccomp
# profile): the next prefault() of it places its pages by thread.
_denied: Dict[Backend, Tuple[int, int, Mode, FrozenSet[int]]] = {}


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
    memory: Optional[_MemoryNodes] = None,
) -> PolicyResult:
    """apply_policy.  SharedRegion passes ``count_resident=False``: a region it
    creates is fresh, and an attached one's pages were placed by the creator under
    the same shared policy; the mincore walk costs ~50 ms per 8 GiB of shmem.
    ``memory``: the machine's memory nodes, read once by a caller that applies many
    extents; such a caller resolves NUMA_NODES once too, into ``nodes`` (None: unset),
    and it is not read here."""
    backend = _b(backend)
    strict_ = _strict_or_env(strict)
    m = _mode_of(mode)
    takes_nodes = m not in (Mode.DEFAULT, Mode.LOCAL)
    if nodes is None and memory is None and takes_nodes:
        nodes = _env_nodes(backend)
    mname = _MODE_WORDS[m].result
    what = f"{mname} policy"
    start = size = 0  # no buffer: the calling thread's policy
    if buf is not None:
        start, size = _page_range(*buffer_range(buf, length), page_size or backend.page_size)
    explicit = nodes is not None
    if memory is None:
        memory = _memory_nodes(backend)
    want = memory.default
    if nodes is not None:
        want = _check_nodes(nodes, memory.online)
    res = PolicyResult(False, mname, want, start, size)
    if not enabled:
        return res._replace(reason="disabled", hint=_HINTS["disabled"])
    if not takes_nodes:
        want = frozenset()
        res = res._replace(nodes=want)
    else:
        if not want:
            return _fallback(res, strict_, what, "EINVAL", errno.EINVAL)
        # Intersect with the cpuset first (the kernel would fail the whole call with
        # EINVAL only when nothing is left, silently dropping the rest).
        res = _left_out(res, memory, strict_, what)
        want = res.nodes
        if not want:
            return res
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
        if err == errno.EPERM and size and want:  # prefault() places it by thread
            if len(_denied) > 64:  # backends made and dropped (the simulator's)
                _denied.clear()
            _denied[backend] = (start, start + size, m, want)
        reason = _errno_reason(err)
        # Before 6.9 mode 6 is an invalid mode: never a silent plain interleave.
        if err == errno.EINVAL and m == Mode.WEIGHTED_INTERLEAVE:
            reason = "no-weighted-interleave"
        return _fallback(res, strict_, what, reason, err)
    res = res._replace(applied=True, placed_by="policy")
    if size and not move and count_resident and m != Mode.DEFAULT:
        try:  # mincore counts base pages, also in a hugetlb mapping
            resident = backend.call("mincore", start, size) * backend.page_size
        except (OSError, NotImplementedError):
            resident = 0  # unknown: claim nothing
        if resident and res.reason is None:  # a reason given already ("cpuset") stays
            res = res._replace(
                reason="resident-unmoved",
                hint=_HINTS["resident-unmoved"],
            )
        res = res._replace(resident_unmoved=resident)
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
    if fallback and res.reason == "no-weighted-interleave":
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
        self.mode = mode
        self.nodes = nodes
        self.kw = kw
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
    return PolicyInfo(_mode_of(value), value & _MODE_FLAGS_MASK, nodes)


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
    that is not an int (True, 1.0) or not a node of this machine, or a weight
    outside 1-255."""
    backend = _b(backend)
    for node, weight in weights.items():
        # True == 1 and 1.0 == 1 pass the lookup below, then name file "nodeTrue".
        if isinstance(node, bool) or not isinstance(node, int):
            raise ValueError(f"interleave weight node id must be an int, not {node!r}")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 255:
            raise ValueError(f"interleave weight for node {node} must be 1-255, not {weight!r}")
    _check_nodes(weights, _online_nodes(_Reader(backend)))
    before = interleave_weights(backend=backend)
    if before is None:
        raise OSError(
            errno.ENOTSUP, f"this kernel has no weighted interleave (Linux 6.9+: {_WI_DIR})"
        )
    for node in weights:
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
        kb = {node: count * self.page_size_kb for node, count in self.pages.items()}
        return _record_json(  # the fields in order, "kb" after "page_size_kb"
            self,
            start={"start": f"0x{self.start:x}"},
            pages={"pages": _sorted_json(self.pages)},
            page_size_kb={"page_size_kb": self.page_size_kb, "kb": _sorted_json(kb)},
        )


# The policies numa_maps prints: each mode's kernel word, and "unknown" (mpol_to_str).
_POLICY_NAMES = frozenset([words.kernel for words in _MODE_WORDS.values()] + ["unknown"])
_MapsPolicy = Tuple[str, FrozenSet[int], Tuple[str, ...]]  # (mode, nodes, flags)


def _parse_policy(text: str, line: str) -> _MapsPolicy:
    """ "bind=relative|balancing:0-1" -> ("bind", {0, 1}, ("relative", "balancing"))."""
    name, _, nodelist = text.partition(":")
    mode, _, flagtext = name.partition("=")
    if mode not in _POLICY_NAMES:
        raise ValueError(f"invalid numa_maps line: unknown policy {_short(text)}: {_short(line)}")
    flags: Tuple[str, ...] = ()
    if flagtext:
        flags = tuple(flagtext.split("|"))
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


_POLICIES: Dict[str, _MapsPolicy] = {}  # a few per host


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
    spaced = " ".join(parts[1:3])
    if spaced.startswith(("prefer (many)", "weighted interleave")):
        i, pol = 3, spaced
    parsed = _POLICIES.get(pol)
    if parsed is None:
        if len(_POLICIES) > 256:
            _POLICIES.clear()
        parsed = _POLICIES[pol] = _parse_policy(pol, line)
    pages: Dict[int, int] = {}
    kw: Dict[str, Any] = {"page_size_kb": default_kb}  # fields the line sets
    for tok in parts[i:]:
        key, eq, val = tok.partition("=")
        if not tok:
            continue  # two spaces in a row
        if tok in ("heap", "stack", "huge"):
            kw[tok] = True
        elif tok.startswith("stack:") and tok[6:].isdigit():
            kw["stack"] = True  # "stack:<tid>": kernels before 3.x
        elif not key or not eq:
            raise ValueError(f"invalid numa_maps line: token {_short(tok)}: {_short(line)}")
        elif key[:1] == "N" and key[1:].isdigit() and val.isdigit():
            pages[int(key[1:])] = int(val)
        elif key == "file":
            path = _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), val)
            deleted = path.endswith(" (deleted)")
            if deleted:
                path = path[:-10]
            kw.update(file=path, deleted=deleted)
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
    import collections

    page = backend.page_size
    pages = range(addr - addr % page, addr + max(size, 1), page)
    seen: collections.Counter[int] = collections.Counter()
    for lo in range(0, len(pages), 16384):  # pages per call
        seen.update(move_pages(pid, pages[lo : lo + 16384], backend=backend))
    return {n: c * page for n, c in sorted(seen.items()) if n >= 0}


def _page_kb(backend: Backend) -> int:
    return max(backend.page_size // 1024, 1)


def _line_at(text: str, addr: int) -> Tuple[int, int]:
    """(start, end) offsets of the last line of ``text`` whose VMA starts at or before
    ``addr`` (a binary search: lines are sorted by address); (0, 0) when none does."""
    lo, hi, found = 0, len(text), (0, 0)
    while lo < hi:
        line = text.rfind("\n", 0, (lo + hi) // 2) + 1  # a line start, >= lo
        end = text.find("\n", line)
        if end < 0:  # the last line, without its "\n"
            end = len(text)
        if int(text[line : text.index(" ", line)], 16) <= addr:
            found, lo = (line, end), end + 1
        else:
            hi = line
    return found


def _entries_bytes(entries: Iterable[NumaMapsEntry]) -> Dict[int, int]:
    import collections

    out: collections.Counter[int] = collections.Counter()
    for entry in entries:
        out.update(entry.bytes_per_node)
    return dict(out)


def _placement_in(text: str, start: int, end: int, default_kb: int) -> Dict[int, int]:
    """Bytes per node of the VMAs of address-sorted numa_maps ``text`` that hold
    [start, end): the one holding ``start`` and those starting before ``end``."""
    first = _line_at(text, start)[0]
    last = _line_at(text, end - 1)[1]
    return _entries_bytes(iter_numa_maps(text[first:last], page_size_kb=default_kb))


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


_SIZE_MAX = (1 << 64) - 1  # the largest size_t of any ABI; Abi.bits narrows it
_SIZE_SHIFTS = MappingProxyType({"T": 40, "G": 30, "M": 20, "K": 10})  # binary units


def parse_size(text: str) -> int:
    """Bytes in a size as people and numactl write it: "4G", "512M", "1.5g", "2MiB",
    "1048576" (binary units; ValueError for anything else or past 2**64-1)."""
    match = re.match(r"^\s*([0-9]{1,20}(?:\.[0-9]{1,20})?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*$", text)
    if not match:
        raise ValueError(f"invalid size {_short(text)} (e.g. 4G, 512M, 1048576)")
    whole, _, frac = match.group(1).partition(".")
    shift = _SIZE_SHIFTS.get(match.group(2).upper(), 0)
    n = int(whole) << shift
    if frac:  # rounded down to a byte
        n += (int(frac) << shift) // 10 ** len(frac)
    if n > _SIZE_MAX:
        raise ValueError(f"invalid size {_short(text)}: more than 2**64-1 bytes")
    return n


def format_size(n: int) -> str:
    """The shortest exact form parse_size reads back: 2M, 1536K, 4097."""
    for unit, shift in _SIZE_SHIFTS.items():
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


# -- prefault ----------------------------------------------------------------------------
# A new page goes where the range's policy (mbind) says, else the faulting thread's
# (set_mempolicy), else to its CPU's node (mm/mempolicy.c): threads whose policy, or
# (EPERM) whose CPUs, are on an extent's nodes place the pages they prefault there.
_Extents = Iterable[Tuple[int, int, Any, Iterable[int]]]  # (offset, length, policy, nodes)


class _Place(_Record):
    """A prefault thread's own policy (None: its creator's) and CPUs (empty: idem)."""

    mode: Optional[Mode]
    nodes: FrozenSet[int]
    cpus: FrozenSet[int]


_AS_MADE = _Place(None, frozenset(), frozenset())
_Places = Tuple[Tuple[_Place, ...], str]  # the places of an extent's threads, why not all


def _places(
    topo: Topology, cpus: FrozenSet[int], by_policy: bool, mode: Mode, nodes: FrozenSet[int]
) -> _Places:
    """Where the threads faulting an extent of ``mode`` over ``nodes`` are, granule by
    granule, and "no-cpu" when, placed by CPU, a node has none in ``cpus`` (else "")."""
    if mode in (Mode.DEFAULT, Mode.LOCAL) or not nodes:
        return (_AS_MADE,), ""
    groups = [nodes]
    if mode in (Mode.INTERLEAVE, Mode.WEIGHTED_INTERLEAVE) and not by_policy:
        groups = [frozenset({node}) for node in sorted(nodes)]
    places = []
    for group in groups:
        node_cpus = [topo.nodes[node].cpus for node in group if node in topo.nodes]
        on = cpus & frozenset().union(*node_cpus)
        if by_policy:
            places.append(_Place(mode, group, on))
        elif on:
            places.append(_Place(None, group, on))
    if len(places) < len(groups):
        return tuple(places) or (_AS_MADE,), "no-cpu"
    return tuple(places), ""


def _fault_plan(
    backend: Backend, start: int, span: int, extents: _Extents, page: int, topo: Optional[Topology]
) -> Tuple[Dict[_Place, List[Tuple[int, int]]], Dict[str, Any]]:
    """The page ranges of ``extents`` (offsets from ``start``, within ``span`` bytes) by
    the place of the threads that fault them, and what prefault reports of it (``topo``:
    None: read)."""
    how = "set_mempolicy"
    try:  # a thread that cannot set its policy (EPERM: seccomp; ENOSYS) places by CPU
        set_mempolicy(*get_mempolicy(backend=backend), backend=backend)
    except OSError:
        how = "sched_setaffinity"
    topo = _topology_or_read(topo, backend)
    allowed_cpus = backend.call("cpuset_cpus") or topo.allowed_cpus
    cpus = allowed_cpus & topo.online_cpus
    memory = _memory_nodes(backend)
    known: Dict[Tuple[Any, FrozenSet[int]], _Places] = {}
    groups: Dict[_Place, List[Tuple[int, int]]] = {}
    unplaced: Dict[int, str] = {}
    facts = {"placed_by": "thread", "thread_placement": how, "unplaced": unplaced, "granularity": 0}
    for number, (offset, length, policy, nodes) in enumerate(extents):
        if not 0 <= offset <= offset + length <= span:
            raise ValueError(f"extent {number} ({offset}+{length}) is not in the {span} bytes")
        key = (policy, frozenset(nodes))
        if key not in known:
            usable = key[1] & memory.mem & memory.allowed
            known[key] = _places(topo, cpus, how == "set_mempolicy", _mode_of(policy), usable)
            if key[1] and not usable:  # Mems_allowed forbids them all
                known[key] = ((_AS_MADE,), "cpuset")
        places, why = known[key]
        if why:
            unplaced[number] = why
        lo = start + offset
        hi = lo + length
        step = max(length, page)
        if len(places) > 1:  # an interleave by CPU: node by node, at most 2 MiB at a time
            share = min(2 << 20, length // len(places))
            step = max(page, share // page * page)
            facts["granularity"] = step
        for place, at in zip(itertools.cycle(places), range(lo, hi, step)):
            end = min(at + step, hi)
            ranges = groups.setdefault(place, [])
            if ranges and sum(ranges[-1]) == at:  # the place's last range ends here: join it
                at = ranges.pop()[0]
            ranges.append((at, end - at))
    return groups, facts


def prefault(
    buf: Any,
    length: Optional[int] = None,
    threads: Optional[int] = None,
    *,
    backend: Optional[Backend] = None,
    progress: Optional[Callable[[int, int], Any]] = None,
    page_size: Optional[int] = None,
    shared: bool = False,
    extents: Optional[_Extents] = None,
    topology: Optional[Topology] = None,
) -> Dict[str, Any]:
    """Fault every page of ``buf`` in, for writing, under the range's memory policy.

    MADV_POPULATE_WRITE (Linux 5.14+) in ``threads`` threads (default: the allowed
    CPUs, at most 32; NUMA_PREFAULT_THREADS) on disjoint page-aligned pieces; the
    calls release the GIL.  Older kernels: a write of each page's own byte, done in
    C (contents are kept).  ``progress(done_bytes, total_bytes)`` is called from the
    calling thread; an exception it raises (KeyboardInterrupt included) stops the
    workers and propagates.  ``page_size``: the huge page size for hugetlb memory.
    ``shared=True`` (shared memory): the old-kernel fallback only reads each page,
    which allocates it there, so a concurrent writer's data is never rewritten.
    Returns {"bytes", "threads", "method", "seconds"}.

    ``extents`` ([(offset, length, policy, nodes)], as a Layout): only those, each by
    threads (one per node at least) on its nodes by their own policy or, where that
    is denied (EPERM), their CPUs (any the cpuset allows; an interleave goes node by
    node), as is a buffer whose policy interleave() could not set (EPERM); the result
    adds "placed_by": "thread", "thread_placement" (set_mempolicy, sched_setaffinity),
    "granularity", "unplaced" ({extent: "cpuset"/"no-cpu"}).  ``topology``: if read.
    """
    import time

    backend = _b(backend)
    addr, size = buffer_range(buf, length)
    pg = page_size or backend.page_size
    start, span = _page_range(addr, size, pg)
    t0 = time.monotonic()
    if span == 0:
        return {"bytes": 0, "threads": 0, "method": "none", "seconds": 0.0}
    want = threads
    if want is None:
        want = _env("NUMA_PREFAULT_THREADS")
    if want is None:
        try:
            cpus = len(backend.call("sched_getaffinity", 0))
        except OSError:
            cpus = os.cpu_count() or 1
        # Page population scales with cores until memory bandwidth runs out.
        want = max(1, min(cpus, 32))
    if want < 1:
        raise ValueError("threads must be >= 1")
    denied = _denied.get(backend)
    if extents is None and denied and denied[0] <= start <= start + span <= denied[1]:
        extents = [(0, span, *denied[2:])]
        del _denied[backend]  # placed now
    groups = {_AS_MADE: [(start, span)]}
    facts: Dict[str, Any] = {}
    if extents is not None:
        groups, facts = _fault_plan(backend, start, span, extents, pg, topology)
    total = sum(count for ranges in groups.values() for at, count in ranges)
    # Pieces of at least 16 MiB per thread: below that a thread costs more than it saves.
    want = min(int(want), total // max(pg, 16 << 20) or 1)
    quarter = min(64 << 20, total // (4 * want))  # four pieces per thread, at most 64 MiB
    chunk = max(pg, quarter // pg * pg)
    jobs: List[Tuple[_Place, Iterator[Tuple[int, int]]]] = []
    for place, ranges in groups.items():
        pieces: List[Tuple[int, int]] = []
        for lo, count in ranges:
            for at in range(lo, lo + count, chunk):
                pieces.append((at, min(chunk, lo + count - at)))
        place_bytes = sum(count for at, count in ranges)
        share = max(1, want * place_bytes // total)
        if place.cpus:
            share = min(share, len(place.cpus))
        # next() on one iterator is atomic: the place's threads share its pieces.
        jobs += [(place, iter(pieces))] * min(share, len(pieces))
    method = ["populate_write"]
    done = [0] * len(jobs)
    errors: List[BaseException] = []
    stop = threading.Event()

    def fault(at: int, count: int) -> None:
        # EINVAL: no MADV_POPULATE_WRITE (or a mapping it cannot populate): touch pages.
        if method[0] == "populate_write":
            try:
                backend.call("madvise", at, count, MADV_POPULATE_WRITE)
                return
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise
                method[0] = "touch"
        if backend.is_live:
            _touch_iov(at, count, pg, write=not shared)
        else:
            backend.touch(at, count)

    def work(job: int) -> None:
        place, pieces = jobs[job]
        try:
            if place.cpus:
                backend.call("sched_setaffinity", 0, place.cpus)
            if place.mode is not None:
                set_mempolicy(place.mode, place.nodes, backend=backend)
            for at, count in pieces:
                if stop.is_set():
                    break
                fault(at, count)
                done[job] += count
        except BaseException as err:  # re-raised in the calling thread
            errors.append(err)
            stop.set()

    # Threads, even one: the caller's own policy and CPUs are never changed.
    workers = [
        threading.Thread(target=work, args=(job,), name=f"numa_utils-prefault-{job}", daemon=True)
        for job in range(len(jobs))
    ]
    try:
        for worker in workers:
            worker.start()
        # Wait on each worker in turn: waiting on one that has ended would spin (and
        # call progress) until the slowest piece is done.
        for worker in workers:
            while worker.is_alive():
                worker.join(0.05)
                if progress is not None and not errors:
                    progress(sum(done), total)
    finally:
        stop.set()
        for worker in workers:
            if worker.ident is not None:  # started (joining one never started raises)
                worker.join()
    if errors:
        raise errors[0]
    if progress is not None:
        progress(total, total)
    seconds = time.monotonic() - t0
    return {"bytes": total, "threads": len(jobs), "method": method[0], "seconds": seconds, **facts}


# -- fit: will an allocation succeed, checked before anything is made -------------------

_THP_DIR = "/sys/kernel/mm/transparent_hugepage"


def _selected(text: Optional[str]) -> Optional[str]:
    match = re.search(r"\[([\w-]+)\]", text or "")
    return match.group(1) if match else None


def _thp_settings(backend: Backend) -> Dict[str, str]:
    return {
        n: w
        for n in ("enabled", "defrag", "shmem_enabled")
        if (w := _selected(_read_optional(backend, f"{_THP_DIR}/{n}")))
    }


def _prog() -> str:
    """The command the user typed, for messages and hints: "numa-utils" (the
    installed script), "python3 -m numa_utils" (or a vendored copy's module path),
    "python3 numa_utils.py"."""
    py = os.path.basename(sys.executable or "") or "python3"
    script = ""
    if sys.argv:
        script = sys.argv[0]
    if __name__ == "__main__":
        if __spec__ is not None and __spec__.name:
            return f"{py} -m {__spec__.name}"
        return f"{py} {script or 'numa_utils.py'}"
    argv0 = os.path.basename(script)
    if argv0 in ("numa-utils", "numa_utils"):
        return argv0
    return f"{py} -m {__name__}"


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
    word = str(memory)
    if word.strip().lower() == "socket":
        return "socket"
    mode = _mode_of(word)
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
    cpuset = backend.call("cpuset_cpus") or frozenset()
    usable = cpuset & topo.online_cpus
    if usable:
        return topo._replace(allowed_cpus=usable)
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
    """How two devices reach each other, named as ``nvidia-smi topo -m`` does, from their
    sysfs bus paths: "PIX" (at most one bridge or one switch between them), "PXB" (several
    bridges, no host bridge), "PHB" (through their host bridge), "NODE" (different host
    bridges of one node), "SYS" (different or unknown nodes).  A saved tree that kept no
    links has no paths: NODE or SYS.  ``a``/``b``: Devices or PCI addresses."""
    if isinstance(a, str) or isinstance(b, str):
        found = {device.address: device for device in devices(backend=backend)}
        try:
            if isinstance(a, str):
                a = found[_norm_bus_id(a)]
            if isinstance(b, str):
                b = found[_norm_bus_id(b)]
        except KeyError as err:
            raise ValueError(f"no PCI device {err.args[0]} (see devices())") from None
    path_a = a.path
    path_b = b.path
    if path_a[:1] == path_b[:1] and path_a[0].startswith("pci"):
        shared = len(os.path.commonprefix([path_a, path_b]))
        if shared == 1:
            return "PHB"  # only the host bridge in common
        if max(len(path_a), len(path_b)) - shared <= 2:
            return "PIX"
        return "PXB"
    if a.node is not None and a.node == b.node:
        return "NODE"
    return "SYS"


class LocalDevices(List[Tuple[Device, str]]):
    """local_devices()'s answer: (device, relation) pairs, nearest first.
    ``fell_back``: no device of the kind was local, so all of them are listed."""

    fell_back: bool = False

    def __repr__(self) -> str:
        pairs = ", ".join(f"{device.address} {relation}" for device, relation in self)
        return _cut(f"LocalDevices([{pairs}], fell_back={self.fell_back})", _REPR_MAX - 20)


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
        where = [where]
    if isinstance(where, (set, frozenset, list, tuple)):
        nodes = _check_nodes(where, topo.online_nodes)
    else:
        nodes = frozenset(placement(where, backend=backend))
        if not nodes:  # no page placed yet: the node of its first page, if any
            first = node_of(where, backend=backend)
            if first is not None:
                nodes = frozenset({first})
    pkg = {nid: package for package, ns in topo.package_nodes.items() for nid in ns}
    home = {nid: pkg.get(_nearest_cpu_node(topo, nid)) for nid in topo.nodes}  # type: ignore[arg-type]
    mine = {home.get(nid) for nid in nodes} - {None}

    def rank(device: Device) -> Tuple[int, int, str]:
        """(relation: 0 local, 1 near, 2 remote; the NUMA distance; PCI address)."""
        device_node = device.node
        if device_node in nodes:
            relation = 0
        elif device_node is not None and home.get(device_node) in mine:
            relation = 1
        else:
            relation = 2
        nearest = 1 << 16  # no distance known: after every known one
        if device_node is not None:
            for node in nodes:
                distance = topo.distance(node, device_node)
                if distance is not None:
                    nearest = min(nearest, distance)
        return relation, nearest, device.address

    ranked = sorted(
        (rank(device), device) for device in _devices(topo, backend) if device.kind == kind
    )
    fell_back = not strict and all(r[0] for r, _ in ranked)
    out = LocalDevices((device, _RELATIONS[r[0]]) for r, device in ranked if fell_back or not r[0])
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
    for item in raw.split(","):
        t = item.strip()
        folded = t.lower()
        got: Optional[_Resolved] = None
        prefix = t[:4].upper()
        if re.match(r"^-?\d+$", t):
            index = int(t)
            if 0 <= index < len(base):
                got = base[index]
        elif prefix == "GPU-":
            hits = [g for u, g in uuids.items() if u.startswith(folded)]
            if len(hits) == 1:
                got = _Resolved(hits[0], "uuid")
            elif not uuids:
                got = _Resolved(
                    None, "uuid unknown: no NVML and no NVIDIA driver entries to match it against"
                )
        elif prefix == "MIG-":
            match = re.match(r"^MIG-(GPU-[0-9a-fA-F-]+)/\d+/\d+$", t)
            if match and match.group(1).lower() in uuids:
                got = _Resolved(uuids[match.group(1).lower()], "mig (parent uuid)")
            elif folded in migs:
                got = _Resolved(migs[folded], "mig (nvml)")
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
    cuda_visible = env.get("CUDA_VISIBLE_DEVICES")
    if fam[0].vendor == "amd":
        # HIP: ROCR_VISIBLE_DEVICES first, then HIP_VISIBLE_DEVICES (or
        # CUDA_VISIBLE_DEVICES); indexes are in PCI order.
        for raw in (
            env.get("ROCR_VISIBLE_DEVICES"),
            env.get("HIP_VISIBLE_DEVICES", cuda_visible),
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
    if cuda_visible is not None:
        base = _apply_visible(base, cuda_visible, uuids, migs, notes)
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
    noted = tuple(notes)
    if device >= len(vis):
        cvd = env.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None:
            how = f"no CUDA device {device}: {len(vis)} visible (CUDA_VISIBLE_DEVICES={cvd!r})"
        else:
            how = f"no CUDA device {device}: {len(vis)} visible"
        return _Resolved(None, how, noted)
    return vis[device]._replace(notes=noted)


def gpu_node(
    device: int,
    *,
    pci_bus_id: Optional[str] = None,
    strict: Optional[bool] = None,
    environ: Optional[Mapping[str, str]] = None,
    backend: Optional[Backend] = None,
) -> Optional[int]:
    """The node whose CPUs every plan gives CUDA device ``device``'s worker, as _plan_all
    decides for them all: the GPU's node with CPUs, else (a cpuset without it) the nearest
    allowed node, else (numa_node -1) the node with the most cores per GPU; each fallback
    logged once (strict: OSError); None when the GPU is not found or no node is allowed.
    CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER from ``environ`` (default os.environ);
    ``pci_bus_id`` short-cuts the lookup."""
    backend = _b(backend)
    st = _strict_or_env(strict)
    _, _, found, plan = _device_plan(
        backend, device, pci_bus_id, environ, policy="node", reserve=0, memory=None, strict=st
    )
    if found.gpu is None:
        _fail(st, f"CUDA device {device}: node unknown ({found.how})")
        return None
    return plan.cpu_node


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
    for cpu in sorted(whole):
        info = topo.cpus.get(cpu)
        domain = whole
        if info is not None and info.llc:
            domain = info.llc
        groups.setdefault(domain, []).append(cpu)
    return sorted(map(tuple, groups.values()))


_Planned = Dict[str, Tuple[Optional[int], FrozenSet[int], List[str]]]


def _plan_all(
    topo: Topology, infos: List[GpuInfo], policy: str, reserve: int, strict: bool
) -> _Planned:
    """pci -> (cpu node, CPUs, notes) for every GPU of the family, planned together."""
    fam = _family(infos)
    allowed = topo.allowed_cpus & topo.online_cpus
    notes: Dict[str, List[str]] = {gpu.pci: [] for gpu in fam}
    free = {nid: topo.nodes[nid].cpus & allowed for nid in topo.nodes}
    # reserve: the first ``reserve`` usable cores of every node (core 0 of a node takes
    # most interrupts and housekeeping), kept out of every policy; one core stays.
    reserved: Set[int] = set()
    for nid in topo.nodes:
        cores = topo.cores_of(free[nid])
        if reserve >= len(cores) > 0:
            _fail(
                strict,
                f"reserve={reserve} would leave no core on node {nid} "
                f"({len(cores)} usable); keeping one",
            )
        skip = min(reserve, len(cores) - 1)
        reserved.update(cpu for core in cores[:skip] for cpu in core)
    pool = {node: free[node] - reserved for node in free}
    usable = [node for node in pool if pool[node]]
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
    # GPUs with unknown nodes go, in PCI order, where allowed cores per GPU are highest
    # (whatever the reserve: gpu_node names the same node).
    for gpu in fam:
        if eff[gpu.pci] is None and usable:
            placed = list(eff.values())
            best = max(
                usable,
                key=lambda node: (len(topo.cores_of(free[node])) / (placed.count(node) + 1), -node),
            )
            _fail(
                strict,
                f"GPU {gpu.pci}: NUMA node unknown ({gpu.node_source}); planned on "
                f"node {best}, the node with the most cores per GPU",
                notes[gpu.pci],
            )
            eff[gpu.pci] = best
    out: _Planned = {}
    for gpu in fam:
        node = eff[gpu.pci]
        gpu_notes = notes[gpu.pci]
        if node is None:
            out[gpu.pci] = (
                None,
                allowed,
                gpu_notes + ["no usable node: all allowed CPUs"],
            )
            continue
        node_cpus = pool[node]
        group = [p for p, m in eff.items() if m == node]
        rank = group.index(gpu.pci)
        k = len(group)
        if policy == "node":
            cpus = node_cpus
        elif policy == "socket":
            pkgs = {topo.cpus[cpu].package for cpu in topo.nodes[node].cpus if cpu in topo.cpus}
            cpus = (
                frozenset(
                    cpu
                    for cpu in allowed - reserved
                    if cpu in topo.cpus and topo.cpus[cpu].package in pkgs
                )
                or node_cpus
            )
        else:
            if policy == "core-complex":
                units = _cache_domains(topo, node_cpus)
            else:
                units = topo.cores_of(node_cpus)
            unit_count = len(units)
            if unit_count >= k:  # chunk ``rank`` of k near-equal ones, first ones longer
                run = _chunks(unit_count, k)[rank]
                mine = units[run.start : run.stop]
            elif policy == "exclusive":
                _fail(
                    strict,
                    f"node {node} has {unit_count} usable cores for {k} GPUs: "
                    "exclusive plans share cores",
                    gpu_notes,
                )
                mine = [units[rank % unit_count]]
            else:
                mine = [units[rank * unit_count // k]]
                gpu_notes.append(
                    f"node {node} has {unit_count} last-level caches for {k} GPUs: they are shared"
                )
            cpus = frozenset(cpu for u in mine for cpu in u)
        out[gpu.pci] = (node, cpus, gpu_notes)
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
    planned: _Planned,
) -> GpuPlan:
    """The plan of ``found``'s GPU from _plan_all's ``planned``; ``extra``: notes put first."""
    gpu = found.gpu
    if gpu is None:
        return GpuPlan(
            index,
            None,
            None,
            None,
            topo.allowed_cpus,
            memory,
            (),
            policy,
            notes=(
                *extra,
                found.how,
                "GPU not identified: all allowed CPUs, memory policy unchanged",
            ),
        )
    n, cpus, notes = planned.get(gpu.pci, (None, topo.allowed_cpus, []))
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
        (*extra, *notes),
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
    cpu_reason: Optional[str]  # why not as asked: "not requested", "EPERM", "cpuset", ...
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


_ThreadsSet = Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[Tuple[int, int], ...]]


def _set_affinity(
    backend: Backend, cpus: FrozenSet[int], threads: str, notes: List[str]
) -> _ThreadsSet:
    """Pin the calling thread, and with threads="all" every other thread of the process
    that is not pinned already (affinity narrower than the calling thread's was)."""
    before = backend.call("sched_getaffinity", 0)
    me = backend.call("gettid")
    backend.call("sched_setaffinity", 0, cpus)
    changed = [me]
    skipped = []
    failed = []
    if threads == "all":
        try:
            tids = backend.call("threads")
        except OSError as err:
            tids = []
            notes.append(f"cannot list this process's threads: {err.strerror or err}")
        for tid in tids:
            if tid == me:
                continue
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
    _check_nodes([node], topo.online_nodes)
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
        if mem == "socket":
            mode = Mode.PREFERRED_MANY
        else:
            mode = MODE_NAMES[mem]
        if not mnodes and mode != Mode.LOCAL:  # local ignores the nodes
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
    done: _ThreadsSet = ((), (), ())
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
    applied = reason is None
    if not applied:
        want = frozenset()  # nothing bound
    elif used != node:  # bound, on the nearest node the cpuset allows
        reason = "cpuset"
    return BindResult(
        used,
        want,
        applied,
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
    explicit set (intersected with the allowed CPUs).  ``memory``: "prefer" (default, or
    NUMA_MEMORY_POLICY), "bind", "interleave" or "weighted-interleave" (every usable
    memory node except GPU memory), "socket" (prefer-many over the package's nodes),
    "local" or None (any mode word a result reports is taken); set through the safe
    layer for the calling thread and the threads it creates later (set_mempolicy is per
    thread): call this early.  ``threads``: "all" also re-pins this process's other
    threads, except those pinned elsewhere already; "current" only the calling thread.
    Memory is applied before CPUs, so a strict failure leaves both alone.
    """
    backend = _b(backend)
    st = _strict_or_env(strict)
    mem = _memory_or_env(memory)
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


def _node_slice(
    topo: Topology, node: int, reserve: int, strict: bool, notes: List[str]
) -> Tuple[int, FrozenSet[int], Dict[str, FrozenSet[int]]]:
    """Node ``node``'s allowed CPUs (the nearest node's when it has none) but the first
    ``reserve`` cores (one core stays), and the reserved ones."""
    _check_nodes([node], topo.online_nodes)
    cpu_node = _nearest_cpu_node(topo, node)
    if cpu_node is None:
        _fail(strict, f"node {node}: no node with CPUs near it; no thread plan", notes)
        return node, frozenset(), {}
    if cpu_node != node:
        notes.append(f"node {node} has no CPUs: using node {cpu_node}'s")
    usable = topo.nodes[cpu_node].cpus & topo.allowed_cpus & topo.online_cpus
    cores = topo.cores_of(usable)
    skip = min(reserve, len(cores) - 1)
    reserved = frozenset(cpu for core in cores[:skip] for cpu in core)
    cpus = usable - reserved
    if not cpus:
        _fail(strict, f"this process's cpuset allows no CPU on node {cpu_node}", notes)
    return cpu_node, cpus, {f"reserved (reserve={reserve})": reserved}


# ---------------------------------------------------------------------------
# Starting processes bound.  A child inherits the CPU mask and the memory policy of
# the thread that starts it (fork and exec keep both): binding that thread for the
# start binds the child from its first instruction, with no numactl binary and no
# change at the call site.  can_bind says beforehand what works; bound_start binds a
# block's starts down a fallback ladder and records what each got; spawn_context is
# a multiprocessing context whose Process.start goes through bound_start.
# ---------------------------------------------------------------------------


class BindCheck(_Record):
    """What binding to one node can do in this process (can_bind).  Truthy when CPU
    binding and every memory policy work."""

    node: Any  # the node asked about
    cpu: bool = False  # the calling thread can run on the node's CPUs
    bind: bool = False  # MPOL_BIND on the node
    preferred: bool = False  # MPOL_PREFERRED
    interleave: bool = False  # MPOL_INTERLEAVE, with another node to spread over
    reason: Optional[str] = None  # why the first of them fails: "EPERM", "cpuset", ...
    hint: Optional[str] = None  # the fix

    def __bool__(self) -> bool:
        return self.cpu and self.bind and self.preferred and self.interleave


def _cpu_rung(backend: Backend, cpus: FrozenSet[int]) -> Optional[str]:
    """Put the calling thread on ``cpus``; why it cannot be (None: it is)."""
    if not cpus:
        return "cpuset"
    try:
        backend.call("sched_setaffinity", 0, cpus)
    except NotLiveError:
        return "not-live"
    except OSError as err:
        return _errno_reason(err.errno or errno.EIO)
    return None


def _rung_policy(rung: str, nodes: Tuple[int, ...], backend: Backend) -> thread_policy:
    """A thread_policy for memory rung ``rung`` on ``nodes``, never strict (its result
    says why not); "preferred" over several nodes is preferred-many."""
    mode = _mode_of(rung)
    if mode == Mode.PREFERRED and len(nodes) > 1:
        mode = Mode.PREFERRED_MANY
    return thread_policy(mode, nodes, strict=False, backend=backend)


def _probe_node(backend: Backend, node: int) -> BindCheck:
    """can_bind's trial, in a thread of its own.  It puts back what it changes: a backend
    with one mask and policy per process (the simulator) must still find the caller's."""
    topo = _planning_topology(backend)
    if node not in topo.nodes:
        return BindCheck(node, reason="no-node", hint=_HINTS["no-node"])
    own = topo.nodes[node].cpus
    before = backend.call("sched_getaffinity", 0)
    cpu = _cpu_rung(backend, own & topo.allowed_cpus)
    if cpu is None:
        backend.call("sched_setaffinity", 0, before)
    if not own:
        cpu = "no-cpus"
    reasons = [cpu]
    for word in ("bind", "preferred", "interleave"):
        with _rung_policy(word, (node,), backend) as result:
            reasons.append(result.reason)
    if reasons[3] is None and len(topo.usable_memory_nodes) < 2:
        reasons[3] = "single-node"
    first = next(filter(None, reasons), None)
    cpu_ok, bind, preferred, interleave = [reason is None for reason in reasons]
    return BindCheck(node, cpu_ok, bind, preferred, interleave, first, _HINTS.get(first or ""))


_bind_checks: Dict[Tuple[int, int, int], Tuple[Backend, BindCheck]] = {}


def can_bind(node: int, *, backend: Optional[Backend] = None) -> BindCheck:
    """Whether this process can bind to ``node``: CPU binding, and the bind, preferred
    and interleave memory policies, each tried in a throwaway thread (the caller's mask
    and policy stay as they are; no process is started).  ``reason`` names the first
    that fails ("EPERM": seccomp or no CAP_SYS_NICE, "cpuset", "ENOSYS", "single-node",
    "no-cpus", ...) and ``hint`` the fix.  Cached per node and process; never raises."""
    b = _b(backend)
    if type(node) is not int:
        hint = _HINTS["no-node"]
        return BindCheck(node, reason="no-node", hint=hint)
    pid = os.getpid()  # a child may live under another seccomp filter
    key = pid, id(b), node
    cached = _bind_checks.get(key)
    if cached is not None:
        return cached[1]
    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(1, "numa_utils can_bind") as pool:
            future = pool.submit(_probe_node, b, node)
            found = future.result()
    except (OSError, ValueError, RuntimeError) as err:  # no topology, no thread
        why = str(err)
        found = BindCheck(node, reason="unreadable", hint=why)
    _bind_checks[key] = b, found  # the backend held: its id stays its own
    return found


class StartRecord(_Record):
    """What one bound start got (bound_start's block, a spawn_context child)."""

    asked: str  # the ladder's first rung: "bind", "preferred", "cpu", ...
    applied: str  # the first rung that applied; "none": the start ran unbound
    reason: Optional[str] = None  # why the rung asked failed: "EPERM", "cpuset", ...
    hint: Optional[str] = None  # the fix


# The ladder bound_start walks by default: the worker's memory preferred on its node
# with its CPUs, else its CPUs alone, else unbound (recorded, logged once).
_FALLBACK = ("preferred", "cpu", "none")
_NO_MEMORY_RUNGS = ("cpu", "none")


def _ladder(fallback: Iterable[str], strict: bool) -> Tuple[str, ...]:
    """The rungs of ``fallback`` checked; the first alone when ``strict``."""
    if isinstance(fallback, str):
        raise ValueError(f"fallback={fallback!r}: give a sequence of rungs")
    rungs = tuple(fallback)
    if not rungs:
        raise ValueError("fallback: give at least one rung")
    for rung in rungs:
        if rung not in _NO_MEMORY_RUNGS:
            _mode_of(rung)  # ValueError: unknown memory policy
    if strict:
        return rungs[:1]
    return rungs


def _own_memory(topo: Topology, held: Set[int]) -> Tuple[int, ...]:
    """Memory for a process on nodes ``held``: theirs (a cpuset that forbids it is
    the policy's to report), else the nearest nodes with memory."""
    own = held & topo.nodes_with_memory
    if not own:
        for node in held:
            own.update(_plan_memory(topo, [], node, "bind"))
    return tuple(sorted(own))


def _start_plan(
    backend: Backend,
    where: Tuple[Any, ...],
    policy: str,
    memory: Optional[str],
    strict: Optional[bool],
    environ: Optional[Mapping[str, str]],
) -> GpuPlan:
    """bound_start's plan for ``where`` (gpu, node, nodes, cpus; one given): a GPU's share
    under ``policy``, the CPUs of the nodes (whole cores; NUMA_RESERVED_CORES left out), or
    the CPUs given (the kernel keeps those in the cpuset), with memory on their nodes."""
    gpu, node, nodes, cpus = where
    given = len(where) - where.count(None)
    if given != 1:
        raise ValueError("bound_start: give one of a CUDA device index, node=, nodes= or cpus=")
    pol, res, mem, st = _plan_args(policy, None, memory, strict)
    if gpu is not None:
        plan = _device_plan(backend, gpu, None, environ, pol, res, mem, st)[3]
        return plan
    topo = _planning_topology(backend)
    notes: List[str] = []
    want: FrozenSet[int] = frozenset()
    held: Set[int] = set()
    if cpus is None:
        held.update([node] if nodes is None else nodes)
        if not held:
            raise ValueError("bound_start: nodes= names no node")
        for each in sorted(held):
            _, share, _ = _node_slice(topo, each, res, st, notes)
            want |= share
    else:
        want = frozenset(cpus)
        if not want:
            raise ValueError("bound_start: cpus= names no CPU")
        for cpu in want:
            found = topo.node_of_cpu(cpu)
            if found is not None:
                held.add(found)
    memory_nodes = _own_memory(topo, held)
    return GpuPlan(None, None, None, None, want, mem, memory_nodes, pol, notes=tuple(notes))


class bound_start:
    """Context manager: every process the calling thread starts in the block
    (``Process.start()``, ``subprocess.Popen``, ``os.fork``) starts bound, CPUs and
    memory policy, from its first instruction; the thread's own are put back after.

    Where: CUDA device ``gpu``'s share under plan ``policy`` (one of BIND_POLICIES, as
    cpus_for_gpu), the CPUs of ``node`` or of the node set ``nodes``, or ``cpus`` (an
    operator's list); memory on their nodes.  ``fallback``: the rungs tried in order
    until one applies: a memory policy ("bind", "preferred", "interleave", ...) with the
    CPUs, "cpu" (CPUs alone) or "none" (unbound).  Each entry adds a StartRecord to
    ``starts`` (``asked``, ``applied``, ``reason``, ``hint``); a fallback is logged
    once.  When no rung applies, or ``strict`` and the first does not, entering raises
    OSError: in the parent, before any child exists.  ``plan`` is the GpuPlan.
    """

    def __init__(
        self,
        gpu: Optional[int] = None,
        *,
        node: Optional[int] = None,
        nodes: Optional[Iterable[int]] = None,
        cpus: Optional[Iterable[int]] = None,
        policy: str = "exclusive",
        fallback: Iterable[str] = _FALLBACK,
        strict: Optional[bool] = None,
        environ: Optional[Mapping[str, str]] = None,
        backend: Optional[Backend] = None,
    ) -> None:
        self.backend = _b(backend)
        self.fallback = _ladder(fallback, _strict_or_env(strict))
        memory = None  # the first memory rung's word plans the memory nodes
        for rung in self.fallback:
            if rung not in _NO_MEMORY_RUNGS:
                memory = rung
                break
        where = gpu, node, nodes, cpus
        self.plan = _start_plan(self.backend, where, policy, memory, strict, environ)
        self.starts: List[StartRecord] = []
        self._undo = threading.local()  # what each thread in a block puts back

    def _climb(self) -> Tuple[str, Optional[thread_policy], Optional[str]]:
        """Walk the ladder, memory before CPUs: the rung that took ("none" when none
        did; a rung that fails leaves nothing changed), its policy to undo, and why
        the first rung failed."""
        plan = self.plan
        backend = self.backend
        first = None
        for rung in self.fallback:
            policy = None
            why = None
            if rung not in _NO_MEMORY_RUNGS:
                policy = _rung_policy(rung, plan.memory_nodes, backend)
                why = policy.__enter__().reason
            if why is None and rung != "none":
                why = _cpu_rung(backend, plan.cpus)
            if why is None:
                return rung, policy, first
            if policy is not None:
                policy.__exit__(None, None, None)
            if first is None:
                first = why
        return "none", None, first

    def __enter__(self) -> bound_start:
        before = self.backend.call("sched_getaffinity", 0)
        applied, policy, first = self._climb()
        record = StartRecord(self.fallback[0], applied, first, _HINTS.get(first or ""))
        self.starts.append(record)  # a start refused has its record too
        if applied not in self.fallback:  # no rung took, not even "none"
            err = getattr(errno, first or "", errno.EINVAL)
            raise OSError(err, f"bound start: {record}")
        if first:
            _warn_once(str(record), "numa_utils: bound start fell back: %s", record)
        self._undo.state = applied, before, policy
        return self

    def __exit__(self, *exc: Any) -> None:
        applied, before, policy = self._undo.state
        if applied != "none":
            self.backend.call("sched_setaffinity", 0, before)
        if policy is not None:
            policy.__exit__(None, None, None)


def spawn_context(gpu: Optional[int] = None, *, method: str = "spawn", **where: Any) -> Any:
    """A multiprocessing context whose children start bound: each ``Process.start()`` runs
    in a ``bound_start(gpu, **where)`` block (``node=``, ``nodes=``, ``cpus=``, ``policy=``,
    ``fallback=``, ...).  ``ctx.plan`` is the plan (a GpuPlan), ``ctx.starts`` a StartRecord
    per start.  ``method``: "spawn" or "fork" (a forkserver's children are forked by the
    server, which this cannot bind).  Use the context as multiprocessing's own
    (``ctx.Process``, ``ctx.Pool``, ``ProcessPoolExecutor(mp_context=ctx)``).
    """
    if method not in ("spawn", "fork"):
        raise ValueError(f"spawn_context: method must be 'spawn' or 'fork', not {method!r}")
    starter = bound_start(gpu, **where)
    import multiprocessing

    base: Any = multiprocessing.get_context(method)

    class BoundProcess(base.Process):  # type: ignore[misc]
        def start(self) -> None:
            with starter:
                super().start()

        def __reduce__(self) -> Any:
            # a spawned child unpickles a process of the plain kind: this class is local
            return object.__new__, (base.Process,), self.__dict__

    context = type(base)()
    context.Process = BoundProcess
    context.plan = starter.plan
    context.starts = starter.starts
    return context


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
    old = _env_prefix
    _env_prefix = env_prefix
    return old


# ===========================================================================
# status: the report a person reads instead of `numactl --hardware`.
# ===========================================================================


def status_report(*, backend: Optional[Backend] = None) -> Dict[str, Any]:
    """The facts ``status --json`` prints, as a dict: nodes, CPUs, memory, distances,
    GPUs and devices by node, the process's cpuset and policy, the kernel and the
    environment in effect.  numa_utils_cli.status_report adds counters, regions,
    caches, packages and advice."""
    return _status_facts(_b(backend))[0]


def _status_facts(backend: Backend) -> Tuple[Dict[str, Any], Topology]:
    """status_report's report, and the topology it was read from."""
    topo = read_topology(backend=backend)
    tj = _topology_json(topo)
    warnings = [f"could not read: {problem}" for problem in topo.problems]
    devs = _devices(topo, backend)
    policy: Optional[Dict[str, Any]] = None
    policy_error: Optional[str] = "not the running system"
    if backend.has_process:
        policy_error = None
        try:
            policy = get_policy(backend=backend).to_json()
        except OSError as err:
            policy_error = f"{_errno_reason(err.errno or 0)}: {err.strerror or err}"
    release: Optional[str] = None
    machine: Optional[str] = None
    page_size: Optional[int] = backend.page_size
    abi: Optional[Abi] = backend.abi
    own_pid = None
    if backend.is_live:
        uts = os.uname()
        release = uts.release
        machine = uts.machine
        own_pid = os.getpid()
    elif not backend.has_process:  # a saved tree: its machine as far as it tells, never ours
        page_size = None
        abi = None
        tree: Any = getattr(backend, "_tree", None)
        if hasattr(tree, "machine"):
            release, machine, page_size, abi = tree.machine()
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
        "gpus": [
            dict(_pci_json(gpu), node=gpu.node, node_source=gpu.node_source) for gpu in topo.gpus
        ],
        "devices": [device.to_json() for device in devs],
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
    report["config_ignored"] = _env_ignored()
    for suffix in _ENV_VARS:  # each read alone: every invalid one is its own warning
        name = _env_prefix + suffix
        raw = os.environ.get(name)
        source = "default"
        if raw and raw.strip():
            source = "env"
        row = config[name] = {"value": raw, "source": source}
        try:
            if suffix == "NUMA_NODES":
                value = _env_nodes(backend)
            else:
                value = _env(suffix)
            row["value"] = to_json(value)
        except ValueError as err:  # worded as the calls that read it refuse it
            message = str(err)
            report.setdefault("config_error", message)
            warnings.append(f"configuration: {message}")
            row["error"] = message
    return report, topo


# ===========================================================================
# Command line.
# ===========================================================================


def _root_backend(root: Optional[str] = None) -> Backend:
    """The backend for ``root`` as ``--root`` takes it: the running system for None
    or "/"; a saved tree through numa_utils_sim.backend_for_root, when that file is
    beside this one."""
    if (root or "/") == "/":
        return default_backend()
    sim = _sibling("numa_utils_sim")
    if sim is None:
        raise ValueError(
            f"--root {root}: a saved tree is read by numa_utils_sim.py: copy it beside "
            f"{os.path.basename(__file__)}"
        )
    return sim.backend_for_root(root)  # type: ignore[no-any-return]


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
            f"{os.path.basename(__file__)}, or `pip install .` from a numa_utils checkout"
        )
    return cli


def _render_facts(report: Mapping[str, Any]) -> str:
    """The status facts as an outline, one fact per line: what this file alone
    prints (numa_utils_cli draws them as tables and adds its advice).  A saved tree
    is anyone's, and names in it reach these lines: each line is escaped whole, a
    newline in a name included."""
    out: List[str] = []

    def put(key: str, value: Any, indent: str) -> None:
        if isinstance(value, list):
            value = _outline_list(value)
        if isinstance(value, dict) and value:
            out.append(f"{indent}{key}:")
            for name, item in value.items():
                put(str(name), item, indent + "  ")
        elif value in (None, "", {}):
            out.append(f"{indent}{key}: -")
        else:
            out.append(f"{indent}{key}: {value}")

    for key, value in report.items():
        put(key.upper(), value, "")
    return "\n".join(map(printable, out)) + "\n"


def _outline_list(rows: List[Any]) -> Any:
    """A list as the status outline shows it: ids as a range list ("0-3,8"), words
    on one line, and rows (dicts) each under its id or address."""
    if all(type(row) is int for row in rows):
        return format_cpulist(rows)
    if not any(isinstance(row, dict) for row in rows):
        return ", ".join(map(str, rows))
    keyed = {}
    for i, row in enumerate(rows):
        key = i
        if isinstance(row, dict):
            key = row.get("id", row.get("address", i))
        keyed[key] = row
    return keyed


def _lone_status(raw: List[str]) -> int:
    """``status`` served by this file alone: the facts as an outline or JSON."""
    import argparse

    global _cli_verbose
    parser = argparse.ArgumentParser(
        prog=_prog(),
        description="NUMA facts of this machine.  Every other command, and the advice in "
        "status, come from numa_utils_cli.py beside this file.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser("status", help="topology, GPUs, devices, process limits, configuration")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--root", metavar="TREE", help="read a saved tree (needs numa_utils_sim.py)")
    p.add_argument(
        "--env-prefix",
        metavar="PREFIX",
        help="read the variables under this prefix, as nu.configure(env_prefix=...) does",
    )
    args = parser.parse_args(raw)
    _cli_verbose = args.verbose
    try:
        if args.env_prefix is not None:
            configure(env_prefix=args.env_prefix)
        report = status_report(backend=_root_backend(args.root))
        if args.json:
            _print_json(report)
        else:
            sys.stdout.write(_render_facts(report))
    except BrokenPipeError:
        return 0
    except (OSError, ValueError) as err:
        sys.stderr.write(f"{_prog()} status: {err}\n")
        return 2
    return 0


# The commands numa_utils_cli.py serves; a copy of numa_utils.py alone serves status.
_CLI_COMMANDS = ("numactl", "run", "plan", "region", "maps", "cleanup", "watch", "fit", "threads")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status.  numa_utils_cli serves every
    command when it is beside this file; without it, ``status`` (the facts) is served
    here and every other command names the file to copy."""
    raw = list(sys.argv[1:] if argv is None else argv)
    word = ""
    for arg in raw:
        if arg not in ("-v", "--verbose"):
            word = arg
            break
    try:
        return int(_commands(word).main(raw))
    except ImportError as err:  # a numa_utils_cli of another version
        sys.stderr.write(f"{_prog()}: {err}\n")
        return 2
    except ValueError as err:  # no numa_utils_cli (the CLI's main raises none)
        if word in _CLI_COMMANDS:
            sys.stderr.write(f"{_prog()} {word}: {err}\n")
            return 2
    return _lone_status(raw)


if __name__ == "__main__":
    raise SystemExit(main())
