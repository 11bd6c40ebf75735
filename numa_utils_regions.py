# SPDX-License-Identifier: Apache-2.0
"""Shared-memory regions for numa_utils: SharedRegion (a named region made and attached
with a memory policy, prefaulted, checked and removed), its identity records, layouts
(Layout, Extent), fit, cleanup, node counters, and CUDA pinning (pin_for_cuda).

Vendor it beside numa_utils.py (the core, which it imports) when an engine wants
managed regions or pinning; an engine that keeps its own mapping needs the core alone::

    import numa_utils as nu
    from numa_utils_regions import SharedRegion

    with SharedRegion.create("kv", 1 << 30, policy="interleave") as region:
        print(region.policy, nu.placement(region.buf))
"""

from __future__ import annotations

import enum
import errno
import functools
import os
import re
import stat
import struct
import sys
import threading
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
    "SharedRegion",
    "ShmStat",
    "parse_sysvipc_shm",
    "Layout",
    "Extent",
    "ExtentPlacement",
    "RegionPlacement",
    "placement_verdict",
    "fit",
    "FitResult",
    "FitNode",
    "FitLimit",
    "cleanup",
    "read_identity_record",
    "record_layout",
    "record_segment_key",
    "NodeCounters",
    "NUMASTAT_FIELDS",
    "Counters",
    "counters",
    "CudaPin",
    "CudaHostRegisterFlag",
    "CudaPinProgress",
    "pin_for_cuda",
    "PinnedPool",
    "PinnedBlock",
    "PoolExhausted",
]


# -- the kernel's shared memory: the operations this file adds to the backend seam ----------


class ShmStat(_Record):
    """What IPC_STAT (or fstat, for POSIX) says about a segment: what
    the kernel calls "shm_stat" and "fstat" return (_serve_shared_memory)."""

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


def _ns_link(kind: str) -> str:
    """This process's namespace of ``kind``, as /proc/self/ns/KIND names it
    ("time:[4026531834]"); "" where the kernel has none (time: before Linux 5.6)."""
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return ""


IPC_CREAT, IPC_EXCL, IPC_RMID, IPC_STAT = 0o1000, 0o2000, 0, 2
SHM_RDONLY, SHM_HUGETLB, SHM_HUGE_SHIFT = 0o10000, 0o4000, 26
LOCK_SH, LOCK_EX, LOCK_NB, LOCK_UN = 1, 2, 4, 8  # include/uapi/asm-generic/fcntl.h
MADV_HUGEPAGE = 14
_CGROUP = "/sys/fs/cgroup"


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
            raise ValueError(f"invalid /proc/sysvipc/shm line: {nu._short(line)}") from None


def _sysvipc_stat(text: str, shmid: int) -> ShmStat:
    for row in parse_sysvipc_shm(text):
        if row.id == shmid:
            return row
    raise nu._oserror(errno.EINVAL, "shmctl(IPC_STAT)", f"no segment {shmid}")


def _linux_shmget(backend: nu.LinuxBackend, key: int, size: int, flags: int) -> int:
    # key_t is a C int: 0..2**32-1 wraps to its signed value.
    return int(backend._libc_call("shmget", ctypes.c_int(key).value, size, flags))


def _linux_shmat(backend: nu.LinuxBackend, shmid: int, flags: int = 0) -> int:
    return int(backend._libc_call("shmat", shmid, None, flags))


def _linux_shmdt(backend: nu.LinuxBackend, addr: int) -> None:
    backend._libc_call("shmdt", addr)


def _linux_shm_stat(backend: nu.LinuxBackend, shmid: int) -> ShmStat:
    backend._refuse("shmctl(IPC_STAT)")
    if backend.abi.name not in _SHMID_DS_GENERIC64:
        # Other layouts of struct shmid_ds (ppc64, s390x, 32-bit): the same facts,
        # as text, from the kernel's own table.
        return _sysvipc_stat(backend.read_text("/proc/sysvipc/shm"), shmid)
    buf = ctypes.create_string_buffer(256)
    backend._libc_call("shmctl(IPC_STAT)", shmid, IPC_STAT, buf)
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


def _linux_shm_rmid(backend: nu.LinuxBackend, shmid: int) -> None:
    backend._libc_call("shmctl(IPC_RMID)", shmid, IPC_RMID, None)


def _shm_path(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise nu._oserror(errno.EINVAL, "shm_open", repr(name))
    return "/dev/shm/" + name


def _linux_shm_open(backend: nu.LinuxBackend, name: str, flags: int, mode: int) -> int:
    # Anyone can put a FIFO, a symlink or a device node in /dev/shm under one of
    # our names: O_NONBLOCK|O_NOFOLLOW so that opening it cannot block or leave
    # /dev/shm, then a regular file or nothing.
    backend._refuse("shm_open")
    path = _shm_path(name)
    odd = nu._oserror(errno.EINVAL, "shm_open", f"{path} is not a regular file")
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


def _linux_shm_unlink(backend: nu.LinuxBackend, name: str) -> None:
    backend._refuse("shm_unlink")
    os.unlink(_shm_path(name))


def _linux_ftruncate(backend: nu.LinuxBackend, fd: int, size: int) -> None:
    backend._refuse("ftruncate")
    os.ftruncate(fd, size)


def _linux_fstat(backend: nu.LinuxBackend, fd: int) -> ShmStat:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise nu._oserror(errno.EINVAL, "fstat", "not a regular file")
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


def _linux_close(backend: nu.LinuxBackend, fd: int) -> None:
    os.close(fd)


def _linux_mmap(backend: nu.LinuxBackend, length: int, fd: int, huge: bool = False) -> int:
    flags = _MAP_SHARED
    if huge:
        flags |= _MAP_HUGETLB
    return int(backend._libc_call("mmap", None, length, _PROT_READ | _PROT_WRITE, flags, fd, 0))


def _linux_munmap(backend: nu.LinuxBackend, addr: int, length: int) -> None:
    backend._libc_call("munmap", addr, length)


def _linux_flock(backend: nu.LinuxBackend, fd: int, op: int) -> None:
    backend._refuse("flock")
    import fcntl

    fcntl.flock(fd, op)


def _linux_pid_start(backend: nu.LinuxBackend, pid: int) -> Optional[str]:
    backend._refuse("kill")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's: it exists
        pass
    # proc(5): state is field 3, starttime field 22; the command (field 2) may
    # hold ") ".  A zombie (Z) or dead (X) task has exited: its memory is gone.
    fields = (nu._read_optional(backend, f"/proc/{pid}/stat") or "").rpartition(")")[2].split()
    if fields and fields[0] in ("Z", "X"):
        return None
    if len(fields) > 19:
        return fields[19]
    return ""


_ME: Dict[str, Any] = {}  # whoami(), until a fork changes the pid


def _linux_whoami(backend: nu.LinuxBackend) -> Dict[str, Any]:
    # Read once per process (again after a fork): every attach and close writes
    # it into the last-use slot.  Start and timens are read together, so they
    # still belong together after a later setns() into another time namespace.
    pid = os.getpid()
    if _ME.get("pid") != pid:
        boot = nu._read_optional(backend, "/proc/sys/kernel/random/boot_id") or ""
        _ME.clear()
        _ME.update(
            {
                "pid": pid,
                "start": backend.call("pid_start", pid) or "",
                "boot": boot.strip(),
                "pidns": _ns_link("pid"),
                "timens": _ns_link("time"),
            }
        )
    return dict(_ME)


def _serve_shared_memory() -> None:
    """The kernel's shared memory, which this file adds to the backend seam (an engine
    that keeps its own mapping never needs it).  ``backend.call(name, *args)`` takes
    these as it takes the core's operations (``Backend.call``): a backend that models
    them (numa_utils_sim) implements each as its method ``_call_<name>``; on the
    running system LinuxBackend serves them from this file's functions.

    ==================  =========================  ===============================
    name                arguments                  result
    ==================  =========================  ===============================
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
    nu._LINUX_OPERATIONS.update(
        shmget=_linux_shmget,
        shmat=_linux_shmat,
        shmdt=_linux_shmdt,
        shm_stat=_linux_shm_stat,
        shm_rmid=_linux_shm_rmid,
        shm_open=_linux_shm_open,
        shm_unlink=_linux_shm_unlink,
        ftruncate=_linux_ftruncate,
        fstat=_linux_fstat,
        close=_linux_close,
        mmap=_linux_mmap,
        munmap=_linux_munmap,
        flock=_linux_flock,
        pid_start=_linux_pid_start,
        whoami=_linux_whoami,
    )


_serve_shared_memory()


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


# What a record's fields other than its layout may take (about 300 bytes with a short
# key): fit(), which knows no key, weighs a layout's text against the rest.
_RECORD_OTHERS = 512


def _record_too_long(layout: str, others: int) -> str:
    """Why a record carrying ``layout`` (its text) and ``others`` bytes of other fields
    would not fit its room; '' when it fits.  The room is fixed: its size is part of
    what every reader checks (see _record_fields_ok)."""
    if len(layout) + others <= _RECORD_MAX:
        return ""
    return (
        f"a layout of {len(layout)} bytes of text does not fit the identity record, which "
        f"holds {_RECORD_MAX} bytes ({others} of them for its other fields): join "
        "neighbouring extents of one policy, or use a parts: or blocks: rule"
    )


_RECORD_FORMAT = 1


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


_LAYOUT_IDS_MAX = 4 * nu.MAX_NODES  # node ids a record's layout text may spell out


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


# The most bytes a layout covers: what len() can count (2**63-1 on 64-bit machines; a
# mapping is at most 2**57 bytes) and parse_size reads back.
_LAYOUT_MAX = min(sys.maxsize, nu._SIZE_MAX)


def _is_size(value: Any) -> bool:
    """Whether ``value`` is a length a layout can hold: an int from 1 to _LAYOUT_MAX."""
    return type(value) is int and 0 < value <= _LAYOUT_MAX


def _is_node_id(value: Any) -> bool:
    """Whether ``value`` is a node id a kernel can have: an int below MAX_NODES."""
    return type(value) is int and 0 <= value < nu.MAX_NODES


def _gpu_memory_nodes(gpus: List[int], backend: Optional[nu.Backend]) -> List[int]:
    """The host memory node the GPU plans give the worker of each CUDA device in
    ``gpus`` (the one the binding planners use); ValueError for one unknown."""
    plans = nu.gpu_plans(memory="prefer", backend=backend)
    nodes = []
    for gpu in gpus:
        if not 0 <= gpu < len(plans) or not plans[gpu].memory_nodes:
            raise ValueError(f"layout: no host memory node known for CUDA device {gpu!r}")
        nodes.append(plans[gpu].memory_nodes[0])
    return nodes


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
            w = nu._mode_of(str(pol))
            if isinstance(nodes, int):
                ids = frozenset([nodes])
            else:
                ids = frozenset(nodes or ())
            if not all(_is_node_id(node) for node in ids):
                raise ValueError(
                    f"layout: invalid node list {nodes!r}: ids 0 to {nu.MAX_NODES - 1}"
                )
            if (w in (nu.Mode.DEFAULT, nu.Mode.LOCAL)) == bool(ids) and (ids or kind != "extents"):
                if ids:
                    raise ValueError(f"layout: policy {nu._MODE_WORDS[w].word} takes no nodes")
                raise ValueError(f"layout: policy {nu._MODE_WORDS[w].word} needs nodes")
            if w == nu.Mode.PREFERRED and len(ids) != 1:
                raise ValueError("layout: prefer takes one node (prefer-many: several)")
            if kind == "blocks" and not _is_size(length):
                raise ValueError(
                    f"layout: block size {length!r} is not an int from 1 to {_LAYOUT_MAX}"
                )
            if kind == "extents" and not _is_size(length):
                raise ValueError(
                    f"layout: extent length {length!r} is not an int from 1 to {_LAYOUT_MAX}"
                )
            items.append((length, nu._MODE_WORDS[w].word, ids))
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
        nodes: Optional[Sequence[Union[int, Iterable[int]]]] = None,
        policy: str = "bind",
        *,
        size: Optional[int] = None,
        gpus: Optional[Iterable[int]] = None,
        backend: Optional[nu.Backend] = None,
    ) -> Layout:
        """Blocks of ``block_size`` bytes, block i on ``nodes[i % len(nodes)]``: rank
        i % len(nodes) owns it (of_rank).  ``gpus`` (CUDA devices, one per rank, e.g.
        ``range(world)``) instead of ``nodes``: each rank's node is the host memory
        node the GPU plans give its worker (nu.gpu_plans)."""
        if (nodes is None) == (gpus is None):
            raise ValueError("layout: give nodes or gpus")
        if gpus is not None:
            nodes = _gpu_memory_nodes(list(gpus), backend)
        return cls("blocks", [(block_size, policy, node) for node in nodes or ()], size)

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
                    block = nu.parse_size(fields.pop(0))
                if len(fields) != 2:
                    raise ValueError(f"expected {head}:POLICY:NODES[/NODES...]")
                entries = [(block, fields[0], nu._parse_nodelist(e)) for e in fields[1].split("/")]
                whole = None  # without @SIZE: the size of the region it is given to
                if at:
                    whole = nu.parse_size(size)
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
                ext.append((nu.parse_size(fields[0]), fields[1], nu._parse_nodelist(nodelist)))
            return cls("extents", ext)
        except ValueError as e:
            msg = str(e).replace("layout: ", "")
            raise ValueError(f"layout {nu._short(text)}: {msg}") from None

    def __str__(self) -> str:
        es = self._entries
        if self._kind == "extents":
            texts = []
            for length, policy, ids in es:
                if ids:
                    texts.append(f"{nu.format_size(length)}:{policy}:{nu.format_cpulist(ids)}")
                else:
                    texts.append(f"{nu.format_size(length)}:{policy}")
            return ";".join(texts)
        rule = f"{es[0][1]}:" + "/".join(nu.format_cpulist(e[2]) for e in es)
        if self._kind == "blocks":
            rule = f"blocks:{nu.format_size(es[0][0])}:{rule}"
        else:
            rule = f"parts:{rule}"
        if self._size is not None:
            rule += f"@{nu.format_size(self._size)}"
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
        k, unit = len(self._entries), nu.format_size(page)
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
                f"layout {lay}: no memory node {nu.format_cpulist(self.nodes - nodes)}"
                f" on this machine (memory nodes: {nu.format_cpulist(nodes) or '-'})"
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

    def of_rank(self, rank: int) -> List[int]:
        """The numbers of the extents of entry ``rank`` of a parts or blocks rule (a
        rank's cells in a layout made for ranks), which SharedRegion.prefault(rank=)
        faults."""
        count = len(self._entries)
        if self._kind == "extents" or not 0 <= rank < count:
            raise ValueError(f"layout {self}: no rank {rank!r} (a rule of {count} entries has)")
        return list(range(rank, len(self), count))

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
            f"{e.offset:x}+{e.length:x}@cpu:{nu.format_cpulist(e.nodes) or '*'}"
            for e in self._all()
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


# ===========================================================================
# Shared-memory regions and prefault.
# ===========================================================================

# -- shared-memory section -------------------------------------------------------------
# SysV: ipc/shm.c, include/uapi/linux/ipc.h and shm.h; POSIX: glibc's shm_open opens
# a file in the tmpfs mounted at /dev/shm.  Policy before touch (KERNEL_FACTS 4),
# prefault with MADV_POPULATE_WRITE (KERNEL_FACTS 8).

_SYSV_PROBES = 8


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


def _record_room_check(ident: Mapping[str, Any]) -> None:
    """ValueError, before anything is made, when record ``ident`` would not fit its
    room in its largest form (marked being made; a huge-page region's names its data
    key too)."""
    import json

    widest = dict(ident, layout="", making=True, data_key=0xFFFFFFFF)
    others = len(json.dumps(widest, sort_keys=True, separators=(",", ":")))
    why = _record_too_long(ident["layout"], others)
    if why:
        raise ValueError(why)


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


# -- SharedRegion ----------------------------------------------------------------------


class _ReadOnce:
    """What a create or attach reads once for all its extents (a blocks layout may
    have tens of thousands), each when first asked: NUMA_NODES resolved on the
    topology the caller has read (``topology``; None: read when needed), and the
    machine's memory nodes."""

    def __init__(self, backend: nu.Backend, topology: Optional[nu.Topology] = None) -> None:
        self.backend = backend
        self.topology = topology

    @functools.cached_property
    def env_nodes(self) -> Optional[FrozenSet[int]]:
        return nu._env_nodes(self.backend, self.topology)

    @functools.cached_property
    def memory(self) -> nu._MemoryNodes:
        return nu._memory_nodes(self.backend)


def _region_policy(
    policy: Optional[str],
    nodes: Optional[Iterable[int]],
    strict: Optional[bool],
    backend: nu.Backend,
    known: _ReadOnce,
) -> Tuple[nu.Mode, Optional[FrozenSet[int]], bool, bool]:
    """(mode, nodes, strict, explicit) from the arguments and the environment:
    policy=None means interleave when ENABLE_NUMA_INTERLEAVE is set, else first-touch;
    nodes=None means NUMA_NODES, else default_memory_nodes(); strict=None: NUMA_STRICT.
    ``known``: NUMA_NODES, read once for the policy and the layout."""
    if policy is not None and not isinstance(policy, str):
        raise ValueError(f"unknown region policy {policy!r}")
    if policy is not None:
        mode = nu._mode_of(policy)
    elif nu._env("ENABLE_NUMA_INTERLEAVE"):
        mode = nu.Mode.INTERLEAVE
    else:
        mode = nu.Mode.DEFAULT
    if nodes is None and mode not in (nu.Mode.DEFAULT, nu.Mode.LOCAL):
        nodes = known.env_nodes or None
    ids = None
    if nodes is not None:
        topo = known.topology
        if topo is None:
            online = nu._online_nodes(nu._Reader(backend))
        else:
            online = topo.online_nodes
        ids = nu._check_nodes(nodes, online)
    if mode == nu.Mode.PREFERRED and (ids is None or len(ids) != 1):
        raise ValueError("policy='prefer' needs nodes=[one node]")
    return mode, ids, nu._strict_or_env(strict), policy is not None


# Policies whose huge pages come from any allowed node with one free: nodes=None below.
_SPILL_MODES = (nu.Mode.DEFAULT, nu.Mode.LOCAL, nu.Mode.PREFERRED)


def _reserved_kb(topo: nu.Topology, node: int) -> Set[int]:
    """The huge page sizes (kB) with pages reserved on ``node``."""
    if node not in topo.nodes:
        return set()
    return {kb for kb, h in topo.nodes[node].hugepages.items() if h.total}


def _huge_size(
    hugepages: Union[bool, int, str, None], backend: nu.Backend, nodes: Optional[FrozenSet[int]]
) -> int:
    """Huge page size in bytes (0: base pages, or "thp").  True: the size reserved on
    every node of ``nodes``, 2 MiB first; "2M"/"1G"/"2048kB" or a byte count pick one.
    ``nodes`` None or empty (_SPILL_MODES): pages come from where they are (the
    hugetlb allocator falls back along the zonelist): any usable node's size will do."""
    if hugepages in (None, False, 0, "off", "", "thp"):
        return 0
    topo = nu.read_topology(backend=backend)
    targets = nodes or topo.usable_memory_nodes or frozenset(topo.nodes)
    have = {node: _reserved_kb(topo, node) for node in targets}  # the sizes reserved there
    reserved: Dict[str, List[int]] = {}  # what messages say is where: "2048 kB pages"
    for node in sorted(targets | topo.usable_memory_nodes):
        for what in [f"{kb} kB pages" for kb in sorted(_reserved_kb(topo, node))] or ["none"]:
            reserved.setdefault(what, []).append(node)
    seen = "; ".join(f"{what} on {nu._nodes_txt(ns)}" for what, ns in reserved.items())
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
                f"huge pages are not reserved on {nu._nodes_txt(bare)}, where the policy "
                f"places pages ({seen}): reserve some there (e.g. "
                "nodeN/hugepages/hugepages-2048kB/nr_hugepages), place the region where "
                "they are, or use hugepages=False",
            )
        if not sizes_kb:
            raise OSError(
                errno.ENOMEM,
                "no one huge page size is reserved on every node the policy places pages "
                f"on ({seen}): reserve one size on all of "
                f"{nu._nodes_txt(targets)}, or use hugepages=False",
            )
        if 2048 in sizes_kb:
            return 2048 * 1024
        return min(sizes_kb) * 1024
    if isinstance(hugepages, str):
        nbytes = nu.parse_size(hugepages)
    else:
        nbytes = int(hugepages or 0)
    kb = nbytes // 1024
    if kb not in sizes_kb:
        short = [node for node in targets if kb not in have[node]]
        raise OSError(
            errno.ENOMEM,
            f"no {nbytes >> 10} kB huge pages reserved on {nu._nodes_txt(short)} ({seen})",
        )
    return nbytes


def _region_page(
    hugepages: Union[bool, int, str, None],
    kind: str,
    backend: nu.Backend,
    nodes: Optional[FrozenSet[int]],
) -> Tuple[int, int]:
    """(huge page size or 0, the page size the region is mapped with)."""
    huge = _huge_size(hugepages, backend, nodes)
    if huge and kind == "posix":
        raise ValueError("hugepages need kind='sysv' (SHM_HUGETLB): /dev/shm is tmpfs")
    return huge, huge or backend.page_size


def _region_args(backend: nu.Backend, kind: str, size: Any, least: int) -> None:
    """create's and attach's checks, before any system call: a size above the ABI's
    size_t would be truncated (2**64 + 1M gave a 1 MiB segment behind a region
    claiming 2**64 + 1M)."""
    if kind not in ("sysv", "posix"):
        raise ValueError(f"kind must be 'sysv' or 'posix', not {kind!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < least:
        raise ValueError(f"invalid size {size!r}: an int >= {least}")
    size_max = (1 << backend.abi.word_bits) - 1 if backend.abi.word_bits else nu._SIZE_MAX
    if size > size_max:
        raise ValueError(f"size {size} is larger than this ABI's size_t ({size_max})")


# VMAs left to the engine beside a region's layout: its threads' stacks, the files
# and libraries it maps later (each a VMA or more).
_MAP_COUNT_SPARE_MIN = 1024


def _map_count_room(backend: nu.Backend) -> Tuple[int, int]:
    """(vm.max_map_count, the VMAs this process maps now): a saved machine's own limit
    when it has the file, else the kernel's default (65530); 0 where no maps are read."""
    limit = nu._read_optional(backend, "/proc/sys/vm/max_map_count") or ""
    maps = nu._read_optional(backend, "/proc/self/maps") or ""
    return nu._uint(limit.strip()) or 65530, maps.count("\n")


def _map_count_spare(limit: int) -> int:
    """The VMAs kept for the engine: a 16th of vm.max_map_count, at least
    _MAP_COUNT_SPARE_MIN, but never more than a quarter of a low limit (1,000 keeps
    250, not all of it)."""
    spare = max(_MAP_COUNT_SPARE_MIN, limit // 16)
    return min(spare, limit // 4)


def _map_count_check(backend: nu.Backend, need: int, layout: str) -> Tuple[int, str]:
    """(the VMAs vm.max_map_count leaves this process with room kept for the engine;
    why the ``need`` VMAs a policy per run of ``layout`` takes, its runs and the
    record room's one, do not fit there, "" when they do)."""
    limit, mapped = _map_count_room(backend)
    spare = _map_count_spare(limit)
    free = max(limit - mapped - spare, 0)
    if need <= free:
        return free, ""
    why = (
        f"layout {layout} takes {need} memory mappings (VMAs) with a policy per run; "
        f"vm.max_map_count {limit}, less the {mapped} this process maps and {spare} kept "
        f"for the engine, leaves {free}"
    )
    return free, why


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
    hugepages: Mapping[int, nu.HugePages]  # page size in kB -> counts


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
    vmas: int = 2  # memory mappings a policy per run takes: the layout's runs, the record room
    vmas_free: Optional[int] = None  # what vm.max_map_count leaves it
    placed_by: str = "policy"  # or "thread": past vm.max_map_count, or policy calls denied

    def __bool__(self) -> bool:
        return self.ok

    def to_json(self) -> Dict[str, Any]:
        return {key: nu.to_json(value) for key, value in self._asdict().items()}


def _layout_arg(layout: Union[Layout, str, None], online: FrozenSet[int]) -> Optional[Layout]:
    """create's and fit's ``layout``: a Layout, its text (parsed), or None; ValueError
    for a node the machine lacks (``online``: the nodes it has)."""
    lay = Layout.parse(layout) if isinstance(layout, str) else layout
    if lay is not None and not isinstance(lay, Layout):
        raise ValueError(f"layout must be a Layout or its text, not {lay!r}")
    if lay is not None:
        nu._check_nodes(lay.nodes, online)
    return lay


def _cgroup_dirs(backend: nu.Backend) -> List[str]:
    """This process's cgroup v2 directory and its ancestors up to the root, innermost
    first; [] when /proc/self/cgroup names no v2 cgroup."""
    match = re.search(r"^0::\s*(/.*)", nu._read_optional(backend, "/proc/self/cgroup") or "", re.M)
    if match is None:
        return []
    parts = [p for p in match.group(1).strip().split("/") if p]
    dirs = []
    for depth in range(len(parts), -1, -1):
        dirs.append("/".join([_CGROUP, *parts[:depth]]))
    return dirs


def _fit_limits(backend: nu.Backend, huge: int, kind: str, pin: bool, need: int) -> List[FitLimit]:
    """The limits beyond free memory, each with the file it came from."""
    num = nu._Reader(backend).integer  # None: absent, unreadable or "max"
    out: List[FitLimit] = []
    if huge:
        # hugetlb.2MB.max: mm/hugetlb_cgroup.c mem_fmt, as format_size for powers of two < 1 TiB
        names = [f"hugetlb.{nu.format_size(huge)}B.max"]
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
            r"^Max locked memory\s+(\S+)",
            nu._read_optional(backend, "/proc/self/limits") or "",
            re.M,
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
                    f"/dev/shm is a {nu.format_kib(vfs[0] >> 10)} tmpfs",
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
                for seg in parse_sysvipc_shm(nu._read_optional(backend, "/proc/sysvipc/shm") or "")
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
    mi = nu.parse_meminfo(nu._read_optional(backend, "/proc/meminfo") or "")
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
    for line in nu._clean(text).splitlines():
        parts = line.split()
        v = nu._uint(parts[1]) if len(parts) == 2 else None
        if v is not None:
            out[parts[0]] = v
        elif parts and not lenient:
            raise ValueError(f"invalid numastat line{nu._where(source)}: {nu._short(line)}")
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
        nodes = nu.format_cpulist(self.nodes)
        return f"Counters({kind}, nodes {nodes}, remote {self.remote_ratio:.2%})"

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


def counters(*, backend: Optional[nu.Backend] = None) -> Counters:
    """Snapshot of per-node numastat counters and meminfo, for ``after - before``.

    Reads nodeN/numastat and nodeN/meminfo for every online node.  Fallbacks (never
    raises for a missing or malformed file; see ``Counters.problems``): no node
    directory (kernel without NUMA) -> node 0 with /proc/meminfo and no numastat;
    a missing numastat/meminfo file -> an empty mapping for that node.
    """
    import time

    backend = nu._b(backend)
    reader = nu._Reader(backend)
    nodes: Dict[int, NodeCounters] = {}
    if reader.exists(nu._NODE_DIR):
        online = reader.parsed(f"{nu._NODE_DIR}/online", nu._parse_nodelist)
        if online is None:
            online = nu._node_dirs(reader)
        for node in sorted(online):
            folder = f"{nu._NODE_DIR}/node{node}"
            stat = reader.parsed(f"{folder}/numastat", _parse_numastat)
            if stat is None:
                # Missing: no counters.  Malformed (the problem is recorded): keep
                # the lines that do parse rather than lose the whole node.
                t = reader.text(f"{folder}/numastat")
                stat = {}
                if t is not None:
                    stat = _parse_numastat(t, lenient=True)
            mi = reader.parsed(f"{folder}/meminfo", nu.parse_meminfo) or {}
            nodes[node] = NodeCounters(node, MappingProxyType(stat), MappingProxyType(mi))
    else:
        mi = reader.parsed("/proc/meminfo", nu.parse_meminfo) or {}
        nodes[0] = NodeCounters(0, MappingProxyType({}), MappingProxyType(mi))
    return Counters(
        time.time(),
        time.monotonic(),
        MappingProxyType(nodes),
        backend.page_size,
        tuple(reader.problems),
    )


def _fit_targets(topo: nu.Topology, mode: nu.Mode, ids: Optional[FrozenSet[int]]) -> List[int]:
    """The nodes a region's pages go to, as fit() weighs them: every allowed node for
    first-touch and local, else the nodes asked for, else the default ones."""
    allowed = topo.usable_memory_nodes
    if mode in (nu.Mode.DEFAULT, nu.Mode.LOCAL):
        return sorted(allowed)
    if ids is not None:
        return sorted(ids)
    return sorted(nu.default_memory_nodes(topo) or allowed)


def _fit_share(mode: nu.Mode, targets: List[int], npages: int, page: int) -> Dict[int, int]:
    """The bytes each of ``targets`` should hold: an interleave's even share (the first
    nodes one page more), all on the first for prefer, {} when the kernel decides."""
    if mode in (nu.Mode.INTERLEAVE, nu.Mode.WEIGHTED_INTERLEAVE):
        each, extra = divmod(npages, len(targets))
        return {node: (each + (i < extra)) * page for i, node in enumerate(targets)}
    if mode == nu.Mode.PREFERRED:
        return {targets[0]: npages * page}
    return {}


def _fit_available(snap: Counters, node: int, hp: Mapping[int, nu.HugePages], huge: int) -> int:
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
    backend: nu.Backend,
    topo: nu.Topology,
    size: int,
    mode: nu.Mode,
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
        want = nu._env("NUMA_HUGEPAGES")
    thp = nu._thp_settings(backend)
    short: List[str] = []  # why the pages would not all land as asked
    fallback = None
    huge = 0
    if want == "thp":
        if thp.get("shmem_enabled", "never") in ("never", "deny"):
            fallback = (
                f"shmem THP is {thp.get('shmem_enabled', 'absent')!r} "
                f"({nu._THP_DIR}/shmem_enabled): echo advise there"
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
        hp: Mapping[int, nu.HugePages] = MappingProxyType({})
        if node in topo.nodes:
            hp = topo.nodes[node].hugepages
        avail = _fit_available(snap, node, hp, huge)
        needed = share.get(node, 0)
        fnodes.append(FitNode(node, needed, avail, hp))
        if needed > avail and huge:
            short.append(
                f"node {node} has {nu.format_kib(avail >> 10)} free in {huge >> 10} kB huge pages"
                f" of the {nu.format_kib(needed >> 10)} it should hold"
            )
        elif needed > avail:
            short.append(
                f"node {node} has {nu.format_kib(avail >> 10)} free of the "
                f"{nu.format_kib(needed >> 10)} it should hold"
            )
    outside = set(targets) - allowed
    if outside:
        short.append(
            f"node(s) {nu.format_cpulist(outside)} outside cpuset.mems.effective "
            f"({nu.format_cpulist(allowed)}, /proc/self/status Mems_allowed_list): "
            "the policy is refused and pages land first-touch"
        )
    if huge and short and fallback is None and mode != nu.Mode.PREFERRED:
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
    too_long = _record_too_long(str(lay), _RECORD_OTHERS)
    vmas = lay.vmas + 1
    vmas_free, past = _map_count_check(backend, vmas, str(lay))
    placed_by = "policy"
    try:
        nu.get_mempolicy(backend=backend)
    except OSError as err:  # EPERM: the policy syscalls are denied (seccomp)
        if err.errno == errno.EPERM:
            placed_by = "thread"
    if past:
        placed_by = "thread"
    need = _region_mapped(size, page, huge)
    if mode == nu.Mode.BIND:
        pool = frozenset(targets)
        pool_name = f"memory of bound node(s) {nu.format_cpulist(pool)}"
    else:
        pool = allowed
        pool_name = f"memory of allowed node(s) {nu.format_cpulist(pool)}"
    counted_in = f"{nu._NODE_DIR}/node*/meminfo"
    if huge:
        counted_in = f"{nu._NODE_DIR}/node*/hugepages"
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
            f"{nu.format_kib(need >> 10)} needed, {tight.name} allows "
            f"{nu.format_kib(max(tight.allows or 0, 0) >> 10)} ({tight.source}): {tight.fix}"
        )
    if too_long:  # create would refuse it whatever the memory
        reason = too_long
    if huge:
        pages = f"{huge >> 10}kB"
    elif want == "thp" and fallback is None:
        pages = "thp"
    else:
        pages = "off"
    return FitResult(
        tight is None and not too_long,
        tight is None and not short and not too_long,
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
        placed_by,
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
    backend: Optional[nu.Backend] = None,
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
    mappings a policy per run of it takes, against ``vmas_free``, what
    vm.max_map_count (the machine's, else the kernel's default) leaves this process.
    ``placed_by``: how create will place it, "policy" (mbind), or "thread" past that
    limit or where the policy syscalls are denied (EPERM): the threads that prefault
    it place its pages, with no VMA per run (pages faulted later are not placed).
    The layout's text goes into the region's identity record, whose room is fixed
    (16,300 bytes of JSON): a layout whose text takes more than that less 512 bytes
    for the other fields (about 1,300 extents of irregular lengths; a parts: or
    blocks: rule of any count is short) is refused, and ``reason`` names the limit;
    create refuses it before making anything.
    """
    backend = nu._b(backend)
    _region_args(backend, kind, size, 1)
    if layout is not None and nodes is not None:
        raise ValueError("give layout= or nodes=, not both")
    topo = nu.read_topology(backend=backend)
    lay = _layout_arg(layout, topo.online_nodes)
    if lay is not None:
        policy = None  # create weighs a layout's memory as first-touch
    mode, ids, _, _ = _region_policy(policy, nodes, None, backend, _ReadOnce(backend, topo))
    return _fit(backend, topo, size, mode, ids, hugepages, kind, pin, hugepages_required, lay)


def _fit_or_raise(r: FitResult, size: int) -> Tuple[Union[bool, int, str], Optional[str]]:
    """SharedRegion.create's check of fit's answer: (the hugepages mode to use, why it
    fell back) or OSError naming the tightest limit, before anything is made."""
    if not r:
        if "/dev/shm allows" in r.reason:
            err = errno.ENOSPC
        else:
            err = errno.ENOMEM
        raise OSError(err, f"cannot create a {nu.format_kib(size >> 10)} region: {r.reason}")
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
# blocks ends in a shorter block.  Each run of extents with one policy is one mbind and
# one VMA where vm.max_map_count leaves room; past it the threads that prefault the
# region place its pages (see _THREAD_HINT).
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
    return f"{word} {shares} over nodes {nu.format_cpulist(used)}"


# How a region's extents are placed (its policy result's placed_by): by a policy per run
# of the layout ("policy", mbind), which also governs pages faulted later (after a
# swap-in, or in a region not prefaulted), within what vm.max_map_count leaves and where
# the policy syscalls are allowed; else by the threads that prefault it ("thread": no
# VMA per run, but only the pages prefaulted are placed).
_THREAD_HINT = (
    "placed by the threads that prefault it, with no policy on the range: pages faulted "
    "later by another thread (never prefaulted, or reclaimed and faulted again) land "
    "where that thread runs, so prefault it (each rank its own extents)"
)
_NO_CPU_HINT = (
    "placing pages by thread without the policy syscalls (EPERM) needs a CPU of the node "
    "that this process may run on: the node has none, or the cpuset forbids them"
)


def _resolved(lay: Layout, only: Optional[Iterable[int]], known: _ReadOnce) -> List[Extent]:
    """``lay``'s extents (those numbered in ``only``) as prefault takes them: one that
    names no nodes has NUMA_NODES, else default_memory_nodes(), as its policy would
    (read once for a create: ``known``)."""
    default = known.env_nodes or known.memory.default
    chosen = list(lay) if only is None else [lay[number] for number in only]
    return [
        e._replace(nodes=default) if not e.nodes and e.policy not in ("default", "local") else e
        for e in chosen
    ]


def _thread_results(
    backend: nu.Backend,
    addr: int,
    page: int,
    lay: Layout,
    reason: str,
    why: str,
    strict: bool,
    known: _ReadOnce,
) -> List[nu.PolicyResult]:
    """Each extent's result when the region is placed by thread (``reason``, ``why``:
    why not by policy), from prefault's own plan for one page of each kind of extent:
    an extent it cannot place (no allowed CPU on its node under EPERM, or its nodes
    outside Mems_allowed) is reported and left first-touch, OSError under ``strict``."""
    extents = _resolved(lay, None, known)
    kinds = list(dict.fromkeys((e.policy, e.nodes) for e in extents))
    one_page = [(0, page, policy, nodes) for policy, nodes in kinds]
    plan = nu._fault_plan(backend, 0, page, one_page, page, known.topology)
    unplaced = plan[1]["unplaced"]
    results = {}
    for number, (policy, nodes) in enumerate(kinds):
        res = nu.PolicyResult(True, policy, nodes, reason=reason, hint=f"{_THREAD_HINT} ({why})")
        if number in unplaced:
            missing = unplaced[number]
            hint = nu._HINTS["cpuset"] if missing == "cpuset" else _NO_CPU_HINT
            res = res._replace(applied=False, reason=missing, errno=errno.EINVAL, hint=hint)
            res = res._replace(dropped=nodes)
            if strict:
                raise OSError(
                    errno.EINVAL, f"layout {lay}: {policy} over {nu._nodes_txt(nodes)}: {hint}"
                )
        if policy == "default":
            res = nu.PolicyResult(True, "default", frozenset())
        results[policy, nodes] = res._replace(placed_by="thread")
    return [
        results[e.policy, e.nodes]._replace(start=addr + e.offset, length=e.length) for e in extents
    ]


def _whole_policy(results: List[nu.PolicyResult], lay: Layout, placed_by: str) -> nu.PolicyResult:
    """One result for a region's whole layout: its extent's result when it has one,
    else mode "layout" over every node it names, applied when every extent's policy
    was, with the first failure's reason (else the first extent's: why by thread)."""
    if len(results) == 1:
        return results[0]
    failed = [r for r in results if not r.applied]
    first = (failed or results)[0]
    return nu.PolicyResult(
        applied=not failed,
        mode="layout",
        nodes=lay.nodes,
        start=results[0].start,
        length=sum(r.length for r in results),
        reason=first.reason,
        errno=first.errno,
        hint=first.hint,
        dropped=frozenset().union(*(r.dropped | r.nodes for r in failed)),
        placed_by=placed_by,
    )


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


def _slot_write(backend: nu.Backend, addr: int) -> None:
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


def _user_name(backend: nu.Backend, uid: int) -> str:
    """The user name of ``uid`` from /etc/passwd (no NSS: no network behind an
    error message); "not in /etc/passwd" else."""
    for line in (nu._read_optional(backend, "/etc/passwd") or "").splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2] == str(uid):
            return f"user {fields[0]}"
    return "not in /etc/passwd"


def _posix_holder(backend: nu.Backend, pname: str) -> str:
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


def _process_name(backend: nu.Backend, pid: str) -> str:
    """``pid`` with its command and real uid, as far as /proc shows them."""
    comm = (nu._read_optional(backend, f"/proc/{pid}/comm") or "?").strip()
    uid = "?"
    for line in (nu._read_optional(backend, f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("Uid:") and len(line.split()) > 1:
            uid = line.split()[1]
    return f"pid {pid} ({comm!r}, uid {uid})"


def _lock_holder(backend: nu.Backend, fd: int) -> str:
    """Who holds the exclusive flock on file ``fd``, from /proc/locks (fs/locks.c
    lock_get_status: "ID: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE START END")."""
    st: ShmStat = backend.call("fstat", fd)
    want = f"{os.major(st.dev):02x}:{os.minor(st.dev):02x}:{st.ino}"
    for line in (nu._read_optional(backend, "/proc/locks") or "").splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1:4] == ["FLOCK", "ADVISORY", "WRITE"] and fields[5] == want:
            return _process_name(backend, fields[4])
    return "a process not listed in this namespace's /proc/locks"


# A cleanup judging a /dev/shm file holds its exclusive lock for milliseconds; anyone
# who can open the file (every user, for a 0644 region) can hold one for ever.
_LOCK_WAIT = 5.0


def _flock_shared(backend: nu.Backend, fd: int, what: str) -> None:
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


def _vma_entry(backend: nu.Backend, addr: int) -> Optional[nu.NumaMapsEntry]:
    """This process's numa_maps line of the VMA starting at ``addr``; None when there
    is no numa_maps (a kernel without NUMA) or no such line."""
    try:
        text = backend.read_text(nu._maps_path("self"))
    except OSError:
        return None
    first, last = nu._line_at(text, addr)
    if last <= first:
        return None
    try:
        entry = nu._parse_maps_line(text[first:last], nu._page_kb(backend))
    except ValueError:
        return None
    if entry.start != addr:
        return None
    return entry


def _record_page_check(backend: nu.Backend, addr: int, kind: str, page: int, what: str) -> None:
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


def _room_apply(backend: nu.Backend, addr: int, length: int, lay: Layout) -> None:
    """Set the policy of the record's room, [addr, addr+length), in every process that
    maps it: preferred on the
    lowest usable node of those the data's last extent names (else those any extent
    names, else any usable node), so it sits where a bind allows; and never the last
    extent's own policy (bind there when that extent prefers the same node): a VMA
    merges with a neighbour of the same policy, and numa_maps would count the room as
    data.  Where policies are denied (EPERM, ENOSYS, a saved tree) the data's results
    say so already; the room's page then lands as the data's would."""
    mem, allowed, _, _ = nu._memory_nodes(backend)
    usable = mem & allowed
    if not usable:
        return
    if not backend.abi.supported:
        return
    last = lay[len(lay) - 1]
    named = last.nodes or lay.nodes or usable
    mine = named & usable
    node = min(mine or named)
    mode = nu.Mode.PREFERRED
    if last.policy == "prefer" and last.nodes == {node}:
        mode = nu.Mode.BIND
    try:
        nu.mbind(addr, length, mode, [node], backend=backend)
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


def _room_rmid(backend: nu.Backend, shmid: int) -> None:
    """Remove record segment ``shmid`` (-1: none); gone already is no error."""
    try:
        if shmid >= 0:
            backend.call("shm_rmid", shmid)
    except OSError as err:
        if err.errno not in (errno.ENOENT, errno.EINVAL, errno.EIDRM):
            raise


def _huge_vma(backend: nu.Backend, addr: int) -> Optional[bool]:
    """Whether this process maps huge pages (hugetlb) at ``addr``, as numa_maps says;
    None without numa_maps (a kernel without NUMA)."""
    vma = _vma_entry(backend, addr)
    if vma is None:
        return None
    return vma.huge


def _own_segment(backend: nu.Backend, ikey: int) -> Optional[ShmStat]:
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
    backend: nu.Backend, ckey: int
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
    backend: nu.Backend, st: ShmStat, what: str, making: bool = False
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


def _held_by_another(backend: nu.Backend, ikey: int, key: Union[int, str], what: str) -> str:
    """For an int ``key``, which has no other key to try: that ``what`` (SysV key
    ``ikey``) is another user's, and whose, from /proc/sysvipc/shm (which lists every
    segment, whatever its mode); '' for a str key, or when none is listed there."""
    if not isinstance(key, int):
        return ""
    try:
        rows = list(parse_sysvipc_shm(nu._read_optional(backend, "/proc/sysvipc/shm") or ""))
    except ValueError:
        rows = []
    for st in rows:
        if st.key == ikey:
            return (
                f"{what} belongs to uid {st.uid} ({_user_name(backend, st.uid)}; created by "
                f"uid {st.cuid}), not to this user (uid {backend.call('geteuid')}): use "
                f"another key, or ask that user (or root) to run `ipcrm -M 0x{ikey:08x}`"
            )
    return ""


def _room_holder(backend: nu.Backend, ckey: int, key: Union[int, str]) -> str:
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
        return _held_by_another(backend, ckey, key, what)
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


def _theirs(st: ShmStat, euid: int) -> bool:
    """Whether segment or file ``st`` is another user's: owned or made by another uid."""
    return {st.uid, st.cuid} != {euid}


def _check_trust(st: ShmStat, euid: int, trust: bool, what: str) -> None:
    if trust:
        return
    if _theirs(st, euid):
        why = f"belongs to uid {st.uid} (created by uid {st.cuid}), not to this user (uid {euid})"
    elif st.mode & 0o022:
        why = f"has mode {st.mode & 0o777:03o}: other users can write it"
    else:
        return
    raise PermissionError(errno.EPERM, f"{what} {why}; pass trust=True to attach anyway")


def _denied(key: Union[int, str], kind: str, euid: int, err: OSError) -> PermissionError:
    """The kernel's EACCES on attaching ``key``, with the fix: its mode lets only its
    owner map it."""
    return PermissionError(
        errno.EACCES,
        f"{kind} region {key!r}: {err.strerror or err}: its mode does not let this user "
        f"(uid {euid}) map it; to share it with other users the creator passes "
        "mode=0o660 (its group) or mode=0o666 to SharedRegion.create, and they attach "
        "with trust=True",
    )


class _RecordRoom:
    """What a SharedRegion keeps of its record's room: after the data, or a huge-page
    region's record segment (see record_segment_key): its shmid, address and bytes."""

    _b: nu.Backend
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
    backend: nu.Backend,
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
            return f"{who}'s pid {nu._short(repr(pid), 30)} is not a process id: damaged record"
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
    backend: nu.Backend,
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


def _unnamed_why(
    backend: nu.Backend, st: ShmStat, me: Mapping[str, Any], now: float, min_age: float
) -> str:
    """'' when SysV segment ``st``, without a record, is proven what a creator killed
    before the region's first record leaves: nobody attached, no attach or detach for
    ``min_age`` (the kernel's times), and its creator (shm_cpid, as this PID namespace
    sees it) gone.  Only its creator writes a record, so once it is gone nobody can
    attach the segment; else why it is kept."""
    if st.nattch:
        return f"in use: {st.nattch} attached"
    idle = now - st.used
    if idle < min_age:
        return f"used {max(idle, 0):.0f} s ago (minimum age {min_age:g} s)"
    creator = {"pid": st.cpid, "start": "", "boot": "", "pidns": 0, "timens": 0}
    return _gone_why(backend, "creator", creator, me, st.cpid)


def _sysv_verdict(
    backend: nu.Backend,
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
        unnamed = "no numa_utils identity record: not made by SharedRegion.create"
        if keys is None:  # under no key asked for: maybe another program's (ftok)
            return unnamed, None
        why = _unnamed_why(backend, st, me, now, min_age)
        if why:
            why = f"{unnamed}, or being made: {why}"
        return why, None
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
    backend: nu.Backend,
    fd: int,
    st: ShmStat,
    name: str,
    users: int,
    me: Mapping[str, Any],
    now: float,
    min_age: float,
    asked: bool,
) -> Tuple[str, Optional[Dict[str, Any]]]:
    """As _sysv_verdict for the /dev/shm file open at ``fd``; when stale, the
    exclusive lock taken stays held (until ``fd`` is closed) for the removal.  A file
    without a record, of a region ``asked`` for, is what a creator killed before its
    first record leaves when nobody maps it or holds its lock: its creator locks it
    before it has a size, and checks after that it still has its name."""
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
    unnamed = "no numa_utils identity record: not made by SharedRegion.create, or being made"
    if rec is None and not asked:
        return unnamed, None
    if rec is not None:
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
    if rec is None:
        return "", None
    return _idle_why(backend, rec, slot, me, now, min_age), rec


_DATA_JUDGES = "its data segment's row judges it"


def _room_row(
    backend: nu.Backend,
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


def _room_drop(backend: nu.Backend, ikey: int) -> None:
    """Remove the record segment of the segment that was under SysV key ``ikey``."""
    try:
        st, rec, _, _ = _room_peek(backend, record_segment_key(ikey))
    except ValueError:
        return  # damaged: its own row says so
    if st is not None and rec is not None and rec["data_key"] == ikey:
        _room_rmid(backend, st.id)


def _dev_shm_users(backend: nu.Backend, files: Mapping[str, ShmStat]) -> Dict[str, int]:
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
        text = nu._read_optional(backend, f"/proc/{pid}/maps")
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
    backend: nu.Backend,
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
    ``keys`` (names or int keys): only their regions, under any key.

    A creator killed before the region's first record (a base-page region is named
    "making" before its policies; a killed creator may leave less: a bare segment
    or an empty file) leaves one without a record: under a key asked for it is
    proven stale by the kernel's facts (_unnamed_why; a file: nobody maps it or
    holds its lock, which its creator takes before it has a size).  Without
    ``keys``, one without a record is kept: ftok(path, 'N') makes keys 0x4exxxxxx
    too, and another program's segment is never removed."""
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
        sysv_rows = nu._read_optional(backend, "/proc/sysvipc/shm") or ""
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
                    backend, fd, st, name, users.get(name, 0), me, now, min_age, keys is not None
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


def _replace_stale(backend: nu.Backend, key: Union[int, str], kind: str) -> None:
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


def _sysv_holder(backend: nu.Backend, ikey: int, key: Union[int, str]) -> str:
    """'' when region ``key`` may take SysV key ``ikey`` or pass it by (free, another
    user's, another region's by its record); else why not, saying what to do."""
    st = _own_segment(backend, ikey)
    if st is None:
        return _held_by_another(backend, ikey, key, f"SysV key 0x{ikey:08x}")
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
            f"`{nu._prog()} cleanup --remove --key {_key_arg(key)}` removes it"
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
            f"attach it, or remove a stale one with `{nu._prog()} cleanup "
            f"--remove --key {_key_arg(region._key)}`"
        )
        raise FileExistsError(errno.EEXIST, f"/dev/shm/{pname} exists: {why}") from None
    region.name = pname  # ours now: removed on any error below
    _flock_shared(b, fd, f"/dev/shm/{pname}")  # before it has a size: never stale
    if not b.call("fstat", fd).nattch:  # unlinked before the lock: a cleanup took it
        region.name = ""  # the name may be another region's by now
        raise FileExistsError(
            errno.EEXIST, f"/dev/shm/{pname} was removed while being made: made again meanwhile?"
        )
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
    if rec.get("making"):
        raise FileNotFoundError(errno.ENOENT, f"{what} is still being made")
    return rec


def _why(err: Exception) -> str:
    """An error's message without its errno."""
    return getattr(err, "strerror", None) or str(err)


def _attach_failed(found: List[Tuple[Exception, bool]], patient: bool, none: str) -> Exception:
    """What an attach raises when no key held its region.  ``found``: why each thing
    under its keys was not it, and whether that may change ("not yet": another user's
    segment or file, another region, a region without its record yet).  Nothing found:
    FileNotFoundError ``none``.  A waiting attach (``patient``) that found only what
    may change: FileNotFoundError naming each, so it waits on and, at its deadline,
    says them all.  Else the first error found."""
    if not found:
        return FileNotFoundError(errno.ENOENT, none)
    if patient and all(later for _, later in found):
        return FileNotFoundError(errno.ENOENT, "; ".join(_why(err) for err, _ in found))
    return found[0][0]


def _sysv_attach(region: SharedRegion, trust: bool, patient: bool) -> Tuple[Dict[str, Any], str]:
    """Map the segment whose identity record names region ``r.key``: (record, what).
    ``patient``: a waiting attach (see _attach_failed)."""
    b, key = region._b, region._key
    euid = b.call("geteuid")
    found: List[Tuple[Exception, bool]] = []
    for ikey in _sysv_keys(key):
        try:
            shmid = b.call("shmget", ikey, 0, 0)
        except FileNotFoundError:
            continue
        what = f"SysV segment 0x{ikey:08x} (shmid {shmid})"
        try:
            st: ShmStat = b.call("shm_stat", shmid)
        except PermissionError as err:  # unreadable: another user's (root reads any)
            why = f"{what}: {err.strerror}: another user's segment under the name's key"
            found.append((PermissionError(err.errno, why), True))
            continue
        except OSError as err:
            if err.errno in (errno.EINVAL, errno.EIDRM):  # removed while we looked
                continue
            raise
        try:
            _check_trust(st, euid, trust, what)
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
                other = ValueError(f"{what}: its identity record names region {rec['key']!r}")
                found.append((other, True))
        except PermissionError as err:
            found.append((err, _theirs(st, euid)))
        except FileNotFoundError as err:
            found.append((err, True))
        except ValueError as err:
            found.append((err, False))
        if region._address:
            b.call("shmdt", region._address)
            region._address = 0
        region._room_close()
        region._room_id = -1
    raise _attach_failed(
        found,
        patient,
        f"no SysV segment with key 0x{_sysv_key(key):08x} ({key!r}) or its other keys",
    )


def _posix_attach(region: SharedRegion, trust: bool, patient: bool) -> Tuple[Dict[str, Any], str]:
    """Map /dev/shm/numa_utils-``r.key``, holding its shared flock: (record, what).
    ``patient``: a waiting attach (see _attach_failed)."""
    b, name = region._b, _posix_name(region._key)
    what = f"/dev/shm/{name}"
    try:
        region._fd = fd = b.call("shm_open", name, os.O_RDWR, 0)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"no {what}") from None
    except PermissionError as err:  # another user's file (root opens any)
        theirs = PermissionError(err.errno, f"{what}: {err.strerror}: another user's file")
        raise _attach_failed([(theirs, True)], patient, "") from None
    region.name = name
    st: ShmStat = b.call("fstat", fd)
    euid = b.call("geteuid")
    try:
        _check_trust(st, euid, trust, what)
    except PermissionError as err:
        raise _attach_failed([(err, _theirs(st, euid))], patient, "") from None
    _flock_shared(b, fd, what)  # waits while a cleanup decides on it
    st = b.call("fstat", fd)
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
    lay: Layout, runs: Layout, results: List[nu.PolicyResult], addr: int
) -> List[nu.PolicyResult]:
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
    backend: nu.Backend, addr: int, page: int, lay: Layout, strict: bool, known: _ReadOnce
) -> Optional[List[nu.PolicyResult]]:
    """Each extent's policy on its part of the data at ``addr`` (the record's room
    after the data has its own: _room_apply); None as soon as one is denied (EPERM:
    the region is placed by thread instead).  A default extent is left alone: a
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
            out.append(nu.PolicyResult(True, "default", frozenset(), a, n))
            continue
        try:
            res = nu._apply_policy(
                a,
                n,
                mode=e.policy,
                nodes=e.nodes or known.env_nodes,
                strict=strict,
                page_size=page,
                backend=backend,
                count_resident=False,
                memory=known.memory,
            )
        except PermissionError:  # strict: denied
            return None
        if res.errno == errno.EPERM:
            return None
        out.append(res)
    return _per_extent(lay, runs, out, addr)


def _layout_prefault(
    backend: nu.Backend,
    addr: int,
    lay: Layout,
    page: int,
    threads: Optional[int],
    progress: Optional[Callable[[int, int], Any]],
    held: Optional[Tuple[Any, Callable[[], Any]]] = None,
    only: Optional[Iterable[int]] = None,
    known: Optional[_ReadOnce] = None,
    results: Optional[List[nu.PolicyResult]] = None,
) -> Dict[str, Any]:
    """prefault() of ``lay``'s extents (those numbered in ``only``), each from threads
    on its nodes: their own policy, or their CPUs (which zero its pages where they
    land, and place them where the range has no policy).  ``held``: signals held by
    _open, whose handlers run between progress calls (_run_pending): a long prefault
    stays interruptible while a second signal cannot strike between the first and the
    undo.  ``known``: create's and attach's (the topology and NUMA_NODES read once).
    An extent whose policy ``results`` say was refused (not by EPERM: a mode this
    kernel lacks, a node outside the cpuset) is first-touch, as they say."""
    if known is None:
        known = _ReadOnce(backend)
    numbers = None if only is None else list(only)
    extents = _resolved(lay, numbers, known)
    if results is not None:
        refused = {n for n, res in enumerate(results) if not res.applied}
        for at, number in enumerate(numbers or range(len(extents))):
            if number in refused:
                extents[at] = extents[at]._replace(policy="default", nodes=frozenset())

    def step(done: int, total: int) -> None:
        _run_pending(held)
        if progress is not None:
            progress(done, total)

    out = nu.prefault(
        addr,
        lay._bound_size(),
        threads,
        backend=backend,
        progress=step,
        page_size=page,
        shared=True,
        extents=extents,
        topology=known.topology,
    )
    return dict(out, extents=len(extents))


class RegionPlacement(Dict[int, int]):
    """Bytes per node of a region's pages (SharedRegion.placement), with ``counted``:
    "mapping" (the pages this process has mapped: a process that touched nothing
    counts none) or "object" (the region's pages, whoever touched them)."""

    counted: str = "mapping"


class ExtentPlacement(RegionPlacement):
    """Bytes per node of one extent, with ``ok`` (every page faulted in, each on a
    node of the extent's policy) and a ``verdict`` in words."""

    ok: bool = False
    verdict: str = ""


_MADV_POPULATE_READ = 22  # Linux 5.14+


def _map_resident(backend: nu.Backend, addr: int, length: int) -> None:
    """Map into [addr, addr+length), a mapping of shared memory (SysV or tmpfs), the
    pages its object holds in memory, and no others: mincore counts the object's
    pages whether this process touched them or not, and each run it finds whole is
    read-faulted (MADV_POPULATE_READ), which maps the pages there.  A run with a
    hole is halved until it has none: a read fault on shared memory fills a hole
    with a new page.  OSError where madvise refuses (EINVAL before Linux 5.14)."""
    page = backend.page_size
    todo = [(addr, length)]
    while todo:
        lo, n = todo.pop()
        there = backend.call("mincore", lo, n) * page
        if there >= n:
            backend.call("madvise", lo, n, _MADV_POPULATE_READ)
        elif there:  # 0 < there < n: two pages or more
            half = n // page // 2 * page
            todo += [(lo, half), (lo + half, n - half)]


def _extent_placement(
    backend: nu.Backend, addr: int, seg: int, lay: Layout
) -> List[ExtentPlacement]:
    """Per extent from one numa_maps read: a VMA inside one extent counts for it.  A
    VMA over several (adjacent extents of one policy merge into one VMA, and the last
    extent's VMA holds the identity record) is split by move_pages, or where that is
    denied, by the extents' share of its length (the verdict then says so)."""
    text = backend.read_text(nu._maps_path("self"))
    kb, end = nu._page_kb(backend), addr + seg
    vmas: List[Tuple[int, int, Dict[int, int]]] = []
    for line in text.splitlines():
        start = int(line[: line.index(" ")], 16) if " " in line else -1
        if vmas and vmas[-1][1] > start >= 0:
            vmas[-1] = (vmas[-1][0], start, vmas[-1][2])
        if addr <= start < end:
            vmas.append((start, end, nu._parse_maps_line(line, kb).bytes_per_node))
    out = []
    for e in lay:
        lo, hi = addr + e.offset, addr + e.offset + e.length
        mine = [v for v in vmas if v[0] < hi and v[1] > lo]
        pl, note = ExtentPlacement(), ""
        if not mine or any(v[0] < lo or hi < v[1] for v in mine):
            try:
                pl.update(nu._placement_move_pages(backend, 0, lo, e.length))
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


def _twin(backend: nu.Backend, ikey: int, key: Union[int, str]) -> str:
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
    if rec is None or rec["kind"] != "sysv" or rec.get("making"):
        return ""  # not named yet: its record is still marked being made
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
    policies: List[nu.PolicyResult]  # one per extent
    _policy: nu.PolicyResult

    def __init__(
        self,
        backend: nu.Backend,
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
    def policy(self) -> nu.PolicyResult:
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
            pol = f"{self._policy.mode}:{nu.format_cpulist(self._policy.nodes)}"
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
            f"SharedRegion({self.kind} {ident} {self._key!r}, {nu.format_kib(self._size // 1024)}, "
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
        backend: Optional[nu.Backend] = None,
        layout: Union[Layout, str, None] = None,
        existing: str = "error",
        wait: float = _REUSE_WAIT,
    ) -> SharedRegion:
        """Create region ``key`` (a str name, or an int SysV key) of ``size`` bytes.

        ``layout`` (a Layout or its text) gives each extent its policy; ``policy`` and
        ``nodes`` make the one-extent layout.  The layout goes into the identity
        record, where every attacher reads it.  Each run of extents with one policy
        gets it with mbind (``policy.placed_by`` "policy") where the VMAs that takes
        fit what vm.max_map_count leaves and the policy syscalls are allowed; else the
        threads that prefault the region place each extent (placed_by "thread",
        reason "max-map-count" or "EPERM"): no VMA per run, but only the pages
        prefaulted are placed, so a region whose pages another process may fault
        first, or that can be reclaimed and faulted again, needs the policy.  With
        ``prefault=False`` each rank then faults its own extents
        (``region.prefault(rank=r)``).
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

        backend = nu._b(backend)
        _region_args(backend, kind, size, 1)  # before fit() weighs it
        if existing not in ("error", "replace", "reuse"):
            raise ValueError(f'existing={existing!r}: "error", "replace" or "reuse"')
        if mode & ~0o777:
            raise ValueError(f"mode {mode:o}: permission bits only")
        # The one read of the topology and of NUMA_NODES, for fit() and what follows.
        topo = nu.read_topology(backend=backend)
        known = _ReadOnce(backend, topo)
        pmode, pnodes, strict_, _ = _region_policy(policy, nodes, strict, backend, known)
        fits = _fit(backend, topo, size, pmode, pnodes, hugepages, kind, False, hugepages_required)
        hugepages, huge_note = _fit_or_raise(fits, size)
        if layout is not None and (policy is not None or nodes is not None):
            raise ValueError("give layout= or policy=/nodes=, not both")
        lay = _layout_arg(layout, topo.online_nodes)
        # The nodes the pages come from, where _region_page looks for huge pages.
        if lay is not None:
            page_nodes: Optional[FrozenSet[int]] = lay.nodes
        elif pmode in _SPILL_MODES:
            page_nodes = None  # first-touch, preferred: pages come from where they are
        else:
            page_nodes = pnodes or nu.default_memory_nodes(topo)
        huge, page = _region_page(hugepages, kind, backend, page_nodes)
        size = (size + page - 1) // page * page
        if lay is None:
            if pmode in (nu.Mode.DEFAULT, nu.Mode.LOCAL):
                extent_nodes: Optional[Iterable[int]] = ()  # as mbind: nodes ignored there
            else:
                extent_nodes = pnodes
            lay = Layout.extents([(size, nu._MODE_WORDS[pmode].word, extent_nodes)])
        lay = lay.bound(size, page, nu._memory_nodes(backend).mem)
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
        _record_room_check(ident)
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
        backend: Optional[nu.Backend] = None,
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
        record), polling; TimeoutError after that, naming everything found under the
        name.  While waiting, a segment or file under the name that is another user's
        (whatever its record says), or another region's, counts as not made yet:
        another user cannot make a waiting worker fail at once.  ``created_after`` (a
        time.time() value, such as the engine's start): a region its record says was made before
        then is an earlier run's and counts as not made yet (FileNotFoundError, or
        waited past), so a worker that starts before its creator never maps the
        region a crashed run left.
        """
        backend = nu._b(backend)
        _region_args(backend, kind, size or 0, 0)
        if created_after is not None and _seconds(created_after) is None:
            raise ValueError(f"created_after={created_after!r}: a time.time() value")
        known = _ReadOnce(backend)  # NUMA_NODES, read once for the policy and the layout
        pmode, pnodes, strict_, explicit = _region_policy(policy, nodes, strict, backend, known)
        _region_page(hugepages, kind, backend, pnodes)  # the region's record says its page

        def make(attached: SharedRegion) -> None:
            waiting = wait is not None
            try:
                if kind == "sysv":
                    rec, what = _sysv_attach(attached, trust, waiting)
                else:
                    rec, what = _posix_attach(attached, trust, waiting)
            except PermissionError as err:
                if err.errno != errno.EACCES:  # _check_trust's refusal says what to do
                    raise
                raise _denied(key, kind, backend.call("geteuid"), err) from None
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
            if pmode != nu.Mode.DEFAULT and (
                explicit or (len(lay) == 1 and lay[0].policy == "default")
            ):
                lay = Layout.extents([(data, nu._MODE_WORDS[pmode].word, pnodes)])
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
        backend: nu.Backend,
        kind: str,
        key: Union[int, str],
        make: Callable[[SharedRegion], None],
        created: bool,
        strict: bool,
        prefault: bool,
        threads: Optional[int],
        progress: Optional[Callable[[int, int], Any]],
        known: _ReadOnce,
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
        removes the region.  A region of base pages made here is named being made
        ("making": true in its record, as a huge-page region's record segment is)
        before its policies, whose mbind calls may take long: a creator killed
        meanwhile leaves what cleanup judges by its record.

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
            at, room = region._room()
            _room_apply(backend, at, room, lay)
            if created and region._room_id < 0:  # named before its policies are applied
                _record_write(at, room, dict(rec, making=True))
            # A policy per run where the VMAs fit, else (or where it is denied) by thread.
            placed_by, why = "policy", _map_count_check(backend, lay.vmas + 1, str(lay))[1]
            results = None
            if not why:
                results = _layout_apply(backend, addr, page, lay, strict, known)
            if results is None:
                reason = "max-map-count" if why else "EPERM"
                why = why or "the policy syscalls are denied: add CAP_SYS_NICE for a policy"
                results = _thread_results(backend, addr, page, lay, reason, why, strict, known)
                placed_by = "thread"
            region.policies = results
            region._policy = _whole_policy(results, lay, placed_by)
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
                    backend, addr, lay, page, threads, progress, held, None, known, results
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

    def placement(self, by_extent: bool = False, *, of: str = "mapping") -> Any:
        """Bytes per node of this region's pages, measured: a RegionPlacement whose
        ``counted`` says what it counts.  ``of="mapping"`` (default): the pages this
        process has mapped (its page tables, as numa_maps and move_pages see them): an
        attacher that touched nothing counts none.  ``of="object"``: the region's
        pages, whoever touched them, from any attacher: read through a temporary
        read-only mapping into which only the pages already in memory are mapped
        (_map_resident; no page is faulted in), unmapped again.  A huge-page region
        (mincore sees only this process's huge pages), or a kernel without
        MADV_POPULATE_READ (before 5.14), gives the mapping's count, ``counted``
        "mapping".  ``by_extent=True``: one ExtentPlacement ({node: bytes}, with
        ``ok``, ``verdict`` and ``counted``) per extent."""
        self._check_open()
        if of not in ("mapping", "object"):
            raise ValueError(f'of={of!r}: "mapping" or "object"')
        addr, counted, unmap = self._address, "mapping", None
        if of == "object" and self.page_size == self._b.page_size:
            try:
                addr, unmap = self._object_view()
                counted = "object"
            except OSError as err:
                import logging

                logging.getLogger(__name__).debug("numa_utils: object placement: %s", err)
        out: Sequence[RegionPlacement]
        try:
            if by_extent:
                out = _extent_placement(self._b, addr, self._mapped, self._layout)
            else:
                out = [RegionPlacement(nu.placement(addr, self._size, backend=self._b))]
        finally:
            if unmap is not None:
                unmap()
        for pl in out:
            pl.counted = counted
        if by_extent:
            return out
        return out[0]

    def _object_view(self) -> Tuple[int, Callable[[], Any]]:
        """A temporary read-only mapping of the region's object holding the pages it
        has in memory (_map_resident): (its address, what unmaps it)."""
        import functools

        b = self._b
        if self.kind == "sysv":
            at = b.call("shmat", self.shmid, SHM_RDONLY)
            unmap = functools.partial(b.call, "shmdt", at)
        else:
            at = b.call("mmap", self._mapped, self._fd)
            unmap = functools.partial(b.call, "munmap", at, self._mapped)
        try:
            _map_resident(b, at, self._size)
        except BaseException:
            unmap()
            raise
        return at, unmap

    def prefault(
        self,
        threads: Optional[int] = None,
        *,
        progress: Optional[Callable[[int, int], Any]] = None,
        extents: Optional[Iterable[int]] = None,
        rank: Optional[int] = None,
    ) -> Dict[str, Any]:
        """Fault every page in, or those of the extents numbered in ``extents``, or of
        ``rank``'s (Layout.of_rank), each extent from threads on its nodes: so a rank
        that attached a region made without prefault places its own cells."""
        self._check_open()
        if rank is not None:
            extents = self._layout.of_rank(rank)
        return _layout_prefault(
            self._b,
            self._address,
            self._layout,
            self.page_size,
            threads,
            progress,
            None,
            extents,
            None,
            self.policies,
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
    backend: Optional[nu.Backend] = None,
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
    return _our_segments(nu._b(backend), wanted, remove=remove, min_age=min_age)


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


def _cudart_candidates(backend: nu.Backend) -> List[str]:
    """Where libcudart may be, best first: the copy this process already loaded
    (torch imported it: /proc/self/maps), torch's lib dir and the nvidia-cuda-runtime
    wheel beside it, ctypes.util.find_library, then sonames (libamdhip64's last)."""
    import ctypes.util
    import glob

    out: List[str] = []
    if "torch" in sys.modules and backend.is_live:
        maps = nu._read_optional(backend, "/proc/self/maps") or ""
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


def _load_cudart(cudart: Any, backend: nu.Backend) -> Tuple[Optional[_PinCalls], str]:
    """(the runtime's calls, where it was found) or (None, why not)."""
    if isinstance(cudart, ctypes.CDLL):
        lib = cudart
        where = getattr(cudart, "_name", "libcudart")
    else:
        if cudart is not None:
            names = [os.fspath(cudart)]
        else:
            names = _cudart_candidates(backend)
        found, where, errors = nu._dlopen(_in_library_path(names))
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
        self._releasing: Dict[int, Tuple[int, int]] = {}  # thread id -> chunk it unregisters
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
        """Unregister every chunk, the last first, from any number of threads at once.
        A thread claims a chunk (moves it from the list to ``_releasing``) under the
        lock before its call, so no two threads unregister one chunk.  An interrupt
        before the call returns puts the chunk back, marked unsure: a second call,
        never a chunk left registered with nothing to release it."""
        calls = self._calls
        me = threading.get_ident()
        while True:
            try:
                with self._lock:
                    self.ok = False
                    if not self._registered:
                        break
                    self._releasing[me] = self._registered[-1]
                    del self._registered[-1]
                start = self._releasing[me][0]
                assert calls is not None
                rc = calls.unregister(ctypes.c_void_p(start))
            except BaseException:
                self._unclaim(me)
                raise
            with self._lock:
                del self._releasing[me]
            if rc == 0:
                continue
            calls.clear_error()
            if start not in self._unsure:  # a chunk left in a call may not be registered
                nu._warn_once(
                    f"{calls.api.unregister}:{rc}",
                    "numa_utils: host memory unregister failed: %s: %s",
                    calls.api.unregister,
                    _cuda_error(calls, rc),
                )
        self._ended.set()

    def _unclaim(self, me: int) -> None:
        """Put back the chunk an interrupted thread claimed (its call may not have run)."""
        with self._lock:
            piece = self._releasing.pop(me, None)
            if piece is not None and piece not in self._registered:
                self._unsure.add(piece[0])
                self._registered.append(piece)

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
        nu._fail(False, f"host memory not pinned for CUDA: {reason}")

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
    backend: Optional[nu.Backend] = None,
    layout: Optional[Layout] = None,
) -> CudaPin:
    """Pin ``buf`` (or an address and ``length``; or a SharedRegion) for DMA with
    cudaHostRegister (or ROCm's hipHostRegister), one call per ``chunk`` bytes (default
    1 GiB; never 512 GiB or more).  Each call holds the driver's lock, so the chunk
    bounds how long any other GPU call of the process (a kernel launch, a copy) waits
    behind it.  On a ``layout`` (a region's by default) each chunk is whole rows (a
    block of every rank's, or a part): no row crosses a registration's edge.

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
    backend = nu._b(backend)
    strict = nu._strict_or_env(strict)
    if isinstance(buf, SharedRegion):
        layout = layout or buf.layout
        buf = buf.buffer()
    addr, size = nu.buffer_range(buf, length)
    page = backend.page_size
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, not {chunk}")
    calls, where = _load_cudart(cudart, backend)
    # Interior chunk edges on page boundaries: two registrations must never share a
    # page (CUDA pins whole pages; overlapping ones fail as already registered).
    step = max(min(chunk, _PIN_CALL_MAX) // page * page, page)
    if layout is not None:  # whole rows: a blocks rule's one block per entry, a part
        if layout.size is None:
            layout = layout.bound(size, page)
        row = layout._step() or page
        if layout._kind == "blocks":
            row *= len(layout._entries)
        step = max(step // row, 1) * row
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
    fault = (lambda: nu.prefault(addr, size, backend=backend)) if prefault else None
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
# Pinned host memory per node (PinnedPool): placed before it is pinned, exact in
# size, never lent across nodes.
# ---------------------------------------------------------------------------


class PoolExhausted(MemoryError):
    """A node of a PinnedPool has no free extent for a block, and its budget forbids
    mapping more: the pool never hands out another node's memory instead."""


class PinnedBlock(_Record):
    """A block of a PinnedPool: ``length`` bytes at ``address`` on ``node``;
    ``size``: what it takes from the node (``length`` rounded up to a page)."""

    address: int
    length: int
    node: int
    size: int

    def buffer(self) -> memoryview:
        """The block's bytes as a writable memoryview (no copy)."""
        return memoryview((ctypes.c_char * self.length).from_address(self.address)).cast("B")


class _Arena:
    """One mapping of a pool: bound to its node, prefaulted, then pinned."""

    def __init__(self, mem: Any, addr: int, size: int, node: int, pin: Optional[CudaPin]) -> None:
        self.mem, self.addr, self.size, self.node, self.pin = mem, addr, size, node, pin


def _pool_nodes(spec: Any, topo: nu.Topology, backend: nu.Backend) -> Tuple[FrozenSet[int], str]:
    """(the nodes of a pool, how they were chosen).  "gpu-local": nodes with CPUs and
    memory that host a GPU (each GPU's node as the planners find it); without GPUs,
    every node with CPUs and memory the cpuset allows."""
    dram = topo.nodes_with_cpus & topo.usable_memory_nodes
    if spec in ("all", "cpu"):
        return frozenset(dram), "every node with CPUs and memory the cpuset allows"
    if spec != "gpu-local":
        if isinstance(spec, str):
            ids = nu.parse_nodestring(spec, backend=backend, topology=topo)
        else:
            ids = frozenset(int(n) for n in spec)
        missing = ids - topo.nodes_with_memory
        if not ids or missing:
            raise ValueError(f"PinnedPool nodes {sorted(ids)}: no memory on {sorted(missing)}")
        return ids, "named"
    hosts = {g.cpu_node for g in nu.gpus(backend=backend)}
    local = frozenset(n for n in hosts if n in dram)
    if local:
        return local, "nodes with CPUs that host a GPU"
    if hosts:
        why = "the GPUs' nodes have no memory this process may use: every node with CPUs"
        return frozenset(dram), why
    return frozenset(dram), "no GPU: every node with CPUs and memory the cpuset allows"


def _pool_register(
    register: Optional[str], cudart: Any, backend: nu.Backend
) -> Tuple[Optional[str], str]:
    """(the runtime that pins, "cuda" | "hip" | None; why)."""
    if register not in ("auto", "cuda", "hip", None):
        raise ValueError(f"register must be 'auto', 'cuda', 'hip' or None, not {register!r}")
    if register is None:
        return None, "register=None: a host pool, not pinned"
    if not backend.is_live and cudart is None:
        return None, "a simulated machine: no runtime to pin with"
    calls, where = _load_cudart(cudart, backend)
    if calls is None:
        if register != "auto":
            raise OSError(errno.ENOENT, f"PinnedPool(register={register!r}): {where}")
        return None, f"not pinned: {where}"
    found = calls.api.runtime.lower()
    if register == "auto":
        why = _pin_probe(calls)
        if why:
            return None, f"not pinned: {where} loads but {why}"
    if register not in ("auto", found):
        raise OSError(errno.ENOENT, f"PinnedPool(register={register!r}): {where} is {found}")
    return found, f"pinned with {where}"


def _pin_probe(calls: _PinCalls) -> str:
    """Why ``calls`` cannot pin a page (a runtime without a driver or a GPU), or ""."""
    import mmap

    with mmap.mmap(-1, mmap.PAGESIZE) as page:
        addr = ctypes.c_void_p(nu.buffer_range(page)[0])
        rc = calls.register(addr, mmap.PAGESIZE, 0)
        if rc != 0:
            calls.clear_error()
            return f"cannot pin a page: {_cuda_error(calls, rc)}"
        calls.unregister(addr)
    return ""


class PinnedPool:
    """Host memory per NUMA node, pinned for the GPU (cudaHostRegister, ROCm's
    hipHostRegister) when a runtime loads.

    ``nodes``: "gpu-local" (default: the nodes with CPUs that host a GPU; on a
    machine without GPUs every node with CPUs and memory the cpuset allows), "all",
    a numactl node list ("0,2-3") or node ids.  ``register``: "auto" (default: CUDA's
    or HIP's runtime when one loads, else none), "cuda", "hip" or None (a host pool);
    ``registered`` says which and ``register_why`` why.  ``budget``: the most bytes
    mapped per node (None: no limit), ``reserve``: bytes mapped per node at once.

    Memory is mapped per node, bound there (MPOL_BIND), prefaulted from several
    threads and only then pinned (pinned pages never move), through ``pin_for_cuda``.
    A block takes its length rounded up to a page, never a power of two, and goes
    back to its own node's free list: a node with no room grows within its budget or
    raises PoolExhausted; it never hands out another node's memory.
    """

    def __init__(
        self,
        nodes: Any = "gpu-local",
        register: Optional[str] = "auto",
        backend: Optional[nu.Backend] = None,
        *,
        budget: Optional[int] = None,
        reserve: int = 0,
        chunk: int = 1 << 30,
        cudart: Any = None,
    ) -> None:
        self._backend = nu._b(backend)
        self._topo = nu.read_topology(backend=self._backend)
        self.nodes, self.nodes_why = _pool_nodes(nodes, self._topo, self._backend)
        self.registered, self.register_why = _pool_register(register, cudart, self._backend)
        self.page = self._backend.page_size
        self.budget = budget
        self.chunk = chunk
        self.region: Optional[SharedRegion] = None  # the shared form's region
        self._cudart = cudart
        self._lock = threading.Lock()
        self._arenas: List[_Arena] = []
        self._live: Dict[int, Tuple[PinnedBlock, int]] = {}  # address -> (block, its base)
        self._tensors: Dict[int, int] = {}  # a tensor's data_ptr -> its block's address
        self._free: Dict[int, List[Tuple[int, int, int]]] = {}  # (address, bytes, base)
        self._by_size: Dict[int, List[Tuple[int, int, int]]] = {}  # (bytes, address, base)
        self._mapped: Dict[int, int] = {}
        self._forget()
        if reserve > 0:
            for node in sorted(self.nodes):
                self._grow(node, reserve)

    def _forget(self) -> None:
        """No mapping, no block, no free extent."""
        self._arenas.clear()
        self._live.clear()
        self._tensors.clear()
        for node in self.nodes:
            self._free[node] = []
            self._by_size[node] = []
            self._mapped[node] = 0

    @classmethod
    def shared(
        cls,
        region: SharedRegion,
        nodes: Optional[Iterable[int]] = None,
        register: Optional[str] = "auto",
        *,
        extents: Optional[Iterable[int]] = None,
        chunk: int = 1 << 30,
        cudart: Any = None,
    ) -> PinnedPool:
        """A pool carved from ``region`` (created or attached, e.g. with
        ``layout=Layout.parts([0, 2, 3, 5])``): each extent bound to one node is that
        node's part.  Every process that attaches the region makes its own pool over
        the parts it allocates from: ``nodes`` (default: every node with a part) or
        the extents numbered in ``extents`` (two processes on one node: one part
        each).  Two pools over one part would hand out the same bytes.  The region
        placed and prefaulted its memory; this process pins its parts (pins are per
        process).  A part never grows: a full one raises PoolExhausted.  ``close()``
        unpins; the region stays mapped until its own close()."""
        chosen = []
        for i, ext in enumerate(region.layout):
            if extents is not None and i not in set(extents):
                continue
            if len(ext.nodes) == 1 and (nodes is None or ext.nodes <= set(nodes)):
                chosen.append(ext)
        if not chosen:
            raise ValueError(
                f"PinnedPool.shared: no extent of {region!r} is bound to one node asked"
            )
        own = sorted({n for ext in chosen for n in ext.nodes})
        pool = cls(own, register, region._b, chunk=chunk, cudart=cudart)
        pool.region, pool.budget = region, 0
        for ext in chosen:
            pool._add(region.address + ext.offset, ext.length, min(ext.nodes), None)
        return pool

    def __repr__(self) -> str:
        nodes = nu.format_cpulist(self.nodes)
        return (
            f"PinnedPool(nodes={nodes}, registered={self.registered}, {len(self._live)} block(s))"
        )

    def __enter__(self) -> PinnedPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _round(self, nbytes: int) -> int:
        return -(-nbytes // self.page) * self.page

    def _node_for(self, node: Optional[int], gpu: Optional[int]) -> int:
        """The node a block is for: ``node``, GPU ``gpu``'s node, or this thread's."""
        if gpu is not None and node is not None:
            raise ValueError("give node= or gpu=, not both")
        if gpu is not None:
            node = nu.gpu_node(gpu, strict=True, backend=self._backend)
        if node is None:
            node = self._thread_node()
        if node not in self.nodes:
            pool = nu.format_cpulist(self.nodes)
            raise ValueError(f"node {node} is not in the pool's nodes ({pool})")
        return node

    def _thread_node(self) -> int:
        """The one node of the pool that the calling thread's CPUs are on."""
        here: Set[int] = set()
        for cpu in self._backend.call("sched_getaffinity", 0):
            node = self._topo.node_of_cpu(cpu)
            if node in self.nodes:
                here.add(node)
        if len(here) != 1:
            where = nu.format_cpulist(here) or "no node of the pool"
            raise ValueError(f"alloc: give node= or gpu= (this thread's CPUs are on {where})")
        return here.pop()

    def _grow(self, node: int, size: int) -> None:
        """Map ``size`` bytes (rounded to a page) for ``node``: bind, prefault, pin."""
        import mmap

        size = self._round(size)
        if self.region is not None:
            raise PoolExhausted(
                f"node {node}: its part of {self.region!r} has no free {size} bytes"
            )
        if self.budget is not None and self._mapped[node] + size > self.budget:
            raise PoolExhausted(
                f"node {node}: no free extent of {size} bytes and its budget "
                f"({self.budget} bytes, {self._mapped[node]} mapped) forbids more"
            )
        extra = 0
        if self.page > mmap.PAGESIZE:  # a simulated machine's pages larger than ours
            extra = self.page
        mem = mmap.mmap(-1, size + extra)
        addr = self._round(nu.buffer_range(mem)[0])
        try:
            # one node with memory (or a kernel without NUMA): nothing to bind to
            one = len(self._topo.nodes_with_memory) < 2
            nu.bind(addr, [node], size, strict=not one, backend=self._backend)
            nu.prefault(addr, size, backend=self._backend)
            self._add(addr, size, node, mem)
        except BaseException:
            mem.close()
            raise

    def _add(self, addr: int, size: int, node: int, mem: Any) -> None:
        """Pin placed memory (when the pool pins) and make it ``node``'s to hand out."""
        pin = None
        if self.registered is not None:
            pin = pin_for_cuda(
                addr,
                size,
                chunk=self.chunk,
                strict=True,
                cudart=self._cudart,
                backend=self._backend,
            )
        self._arenas.append(_Arena(mem, addr, size, node, pin))
        self._mapped[node] += size
        self._list(node, addr, size, addr)

    def _put(self, node: int, addr: int, size: int, base: int) -> None:
        """Return an extent of the mapping at ``base`` to ``node``'s free lists, merged
        with its neighbours in that mapping."""
        import bisect

        free = self._free[node]
        i = bisect.bisect_left(free, (addr, 0, 0))
        if i < len(free):
            after, after_size, after_base = free[i]
            if after == addr + size and after_base == base:
                self._unlist(node, after, after_size, base)
                size += after_size
        if i > 0:
            before, before_size, before_base = free[i - 1]
            if before + before_size == addr and before_base == base:
                self._unlist(node, before, before_size, base)
                addr = before
                size += before_size
        self._list(node, addr, size, base)

    def _list(self, node: int, addr: int, size: int, base: int) -> None:
        """A free extent into both of ``node``'s lists: by address, and by size."""
        import bisect

        bisect.insort(self._free[node], (addr, size, base))
        bisect.insort(self._by_size[node], (size, addr, base))

    def _unlist(self, node: int, addr: int, size: int, base: int) -> None:
        import bisect

        free = self._free[node]
        del free[bisect.bisect_left(free, (addr, size, base))]
        sizes = self._by_size[node]
        del sizes[bisect.bisect_left(sizes, (size, addr, base))]

    def _take(self, node: int, size: int) -> Optional[Tuple[int, int]]:
        """(address, base) in the smallest free extent of ``node`` that holds ``size``
        (the lowest address among those of that size)."""
        import bisect

        sizes = self._by_size[node]
        i = bisect.bisect_left(sizes, (size, 0, 0))
        if i == len(sizes):
            return None
        length, addr, base = sizes[i]
        self._unlist(node, addr, length, base)
        if length > size:
            self._list(node, addr + size, length - size, base)
        return addr, base

    def alloc(
        self, nbytes: int, node: Optional[int] = None, gpu: Optional[int] = None
    ) -> PinnedBlock:
        """A block of ``nbytes`` on ``node`` (or GPU ``gpu``'s node; default: the node
        of this thread's CPUs); PoolExhausted when that node has no room."""
        if nbytes <= 0:
            raise ValueError(f"alloc: nbytes must be positive, not {nbytes}")
        node = self._node_for(node, gpu)
        size = self._round(nbytes)
        with self._lock:
            got = self._take(node, size)
            if got is None:
                self._grow(node, size)
                got = self._take(node, size)
            assert got is not None
            blk = PinnedBlock(got[0], nbytes, node, size)
            self._live[got[0]] = (blk, got[1])
        return blk

    def free(self, blk: Any) -> None:
        """Give a block (or a tensor from ``tensor``) back to its node's free list."""
        addr = getattr(blk, "address", None)
        if addr is None and hasattr(blk, "data_ptr"):
            addr = self._tensors.pop(int(blk.data_ptr()), None)
        with self._lock:
            got = None
            if addr is not None:
                got = self._live.pop(addr, None)
            if got is None:
                raise ValueError(f"free: {blk!r} is not a live block of this pool")
            block, base = got
            self._put(block.node, block.address, block.size, base)

    def stats(self) -> Dict[int, Dict[str, Any]]:
        """Per node: bytes mapped, used (blocks' sizes) and free, the largest free
        extent, blocks, budget."""
        out: Dict[int, Dict[str, Any]] = {}
        with self._lock:
            for node in sorted(self.nodes):
                sizes = [extent[1] for extent in self._free[node]]
                out[node] = {
                    "bytes": self._mapped[node],
                    "used": 0,
                    "free": sum(sizes),
                    "largest_free": max(sizes, default=0),
                    "blocks": 0,
                    "budget": self.budget,
                }
            for block, _ in self._live.values():
                row = out[block.node]
                row["used"] += block.size
                row["blocks"] += 1
        return out

    def placement(self) -> Dict[int, Dict[int, int]]:
        """Per pool node, where its mapped pages are, read back from the kernel
        (bytes per node): every byte of node N's memory should be on N.  Empty where
        the kernel cannot say (no NUMA: no numa_maps, no move_pages)."""
        out: Dict[int, Dict[int, int]] = {}
        for node in sorted(self.nodes):
            out[node] = {}
        for arena in list(self._arenas):
            try:
                found = nu.placement(arena.addr, arena.size, backend=self._backend)
            except OSError:
                continue
            mine = out[arena.node]
            for where, nbytes in found.items():
                mine[where] = mine.get(where, 0) + nbytes
        return out

    def fit(self, nbytes: int, node: Optional[int] = None) -> Dict[int, FitResult]:
        """Per node (or for ``node``): would ``nbytes`` more fit there, pinned when the
        pool pins?  Reads only; nothing is mapped."""
        nodes = sorted(self.nodes) if node is None else [self._node_for(node, None)]
        pin = self.registered is not None
        return {
            n: fit(self._round(nbytes), nodes=[n], policy="bind", pin=pin, backend=self._backend)
            for n in nodes
        }

    def tensor(
        self, shape: Any, dtype: Any, node: Optional[int] = None, gpu: Optional[int] = None
    ) -> Any:
        """A torch tensor over a new block (torch.frombuffer: no copy); give it back
        with ``free(tensor)``.  torch is imported here, only when called."""
        import math

        import torch  # type: ignore[import-not-found]

        if isinstance(shape, int):
            shape = (shape,)
        dims = tuple(shape)
        count = math.prod(dims)
        itemsize = torch.empty((), dtype=dtype).element_size()
        blk = self.alloc(max(count * itemsize, 1), node=node, gpu=gpu)
        flat = torch.frombuffer(blk.buffer(), dtype=dtype, count=count)
        self._tensors[int(flat.data_ptr())] = blk.address
        return flat.view(dims)

    def close(self) -> None:
        """Unpin and unmap everything (every block becomes invalid)."""
        with self._lock:
            for arena in self._arenas:
                if arena.pin is not None:
                    arena.pin.close()
                if arena.mem is not None:
                    arena.mem.close()
            self._forget()
