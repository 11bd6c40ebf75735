# SPDX-License-Identifier: Apache-2.0
"""The numa-utils commands beyond ``status``: numactl, run, plan, region, maps,
cleanup, watch, fit, threads, and the exports: systemd, numactl, taskset, Prometheus,
and for a fleet Node Feature Discovery labels, OCI and NRI memory policy, Slurm and Ray.

``python -m numa_utils CMD`` and the ``numa-utils`` script reach this module when it
is installed or sits beside numa_utils.py; it imports numa_utils as a sibling
(``pkg.numa_utils`` when vendored as ``pkg.numa_utils_cli``, else the top-level one)
and refuses a numa_utils of another version, whose private helpers it uses.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import struct
import sys
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
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

__version__ = "0.1.0"

if TYPE_CHECKING:
    import argparse

    import numa_utils as _nu
else:
    _nu = globals().get("_NUMA_UTILS_LIBRARY")  # the core that loaded this file, by any name
    if _nu is None:
        try:  # beside this file in the engine's package (vendored), else the top-level one
            from . import numa_utils as _nu
        except ImportError:
            import numa_utils as _nu
    if not hasattr(_nu, "_check_sibling"):
        raise ImportError(
            f"{__name__.rpartition('.')[2]} found {_nu.__name__} "
            f"({getattr(_nu, '__file__', '?')}), which is not numa_utils: keep the "
            "library's file name beside it, or import it through the library"
        )
    _nu._check_sibling(__name__, __version__)

if TYPE_CHECKING:
    import numa_utils_regions as _nur
    import numa_utils_threads as _nut
else:
    _nur = _nu._sibling("numa_utils_regions")
    if _nur is None:
        raise ImportError("numa_utils_cli needs numa_utils_regions.py beside it")


class _LoadedOnUse:
    """A sibling module loaded when one of its names is first read.  Only the thread
    commands, ``watch`` and ``status`` use numa_utils_threads; loading it with this
    module cost every other command 3-4 ms of start-up (``maps`` of a big process is
    timed against ``numastat -p``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        module = _nu._sibling(self.name)
        if module is None:
            raise ImportError(f"numa_utils_cli needs {self.name}.py beside it")
        return getattr(module, attr)


if not TYPE_CHECKING:
    _nut = _LoadedOnUse("numa_utils_threads")


def _read_optional(backend: _nu.Backend, path: str) -> Optional[str]:
    """The text of ``path``; None when it cannot be read (absent, denied, gone)."""
    try:
        return backend.read_text(path)
    except OSError:
        return None


_MAPS_CATS = ("Huge", "Heap", "Stack", "Private")


def _maps_cat(e: _nu.NumaMapsEntry) -> str:
    return "Huge" if e.huge else "Heap" if e.heap else "Stack" if e.stack else "Private"


def _rests(text: str) -> List[str]:
    """Each line's rest (all but its address) of ``text``, whole lines: the text cut
    at every newline followed by an address and a space, so the expression stops
    only at newlines (a tenth less CPU than ``findall`` of ``^[0-9a-f]+ (.*)$``
    taking every character into its group).  A line without an address stays
    joined to the line before it: fewer rests than lines, which the caller checks."""
    return re.split(r"\n[0-9a-f]+ ", "\n" + text[:-1])[1:]


class _MapsScan:
    """Per-node totals and numastat -p categories over numa_maps chunks, with the work
    per line done in C: one regular expression takes every line's rest (all but its
    address), lines with the same rest (most of a big process: "default anon=1
    dirty=1 N0=1 ...") are counted together, and only each distinct rest is parsed in
    Python.  The addresses are taken only where they are shown: of every line for
    JSON, else of the few lines a table row or a region needs (found by their rest)."""

    def __init__(self, default_kb: int) -> None:
        self.default_kb = default_kb
        self.totals: Dict[int, int] = {}
        self.cats: Dict[str, Dict[int, int]] = {c: {} for c in _MAPS_CATS}
        self.nvmas = 0
        self.known: Dict[str, Tuple[_nu.NumaMapsEntry, Any]] = {}  # rest -> (entry, JSON)
        self.rests: Dict[str, int] = {}  # the last chunk's distinct rests
        self.regions: Dict[str, List[int]] = {}  # region file -> its VMAs' starts
        self.text = ""  # the last chunk, and its pairs when taken
        self.pairs: List[Tuple[str, str]] = []

    def entry(self, rest: str) -> Tuple[_nu.NumaMapsEntry, Any]:
        got = self.known.get(rest)
        if got is None:
            if len(self.known) > 4096:  # bounded: a file of all-distinct lines
                self.known.clear()
            got = self.known[rest] = (self.entry_of("0 " + rest), None)
        return got

    def entry_of(self, line: str) -> _nu.NumaMapsEntry:
        """One whole numa_maps line parsed (ValueError naming it when malformed)."""
        return _nu.parse_numa_maps(line, page_size_kb=self.default_kb)[0]

    def chunk(self, text: str, addresses: bool = False) -> List[Tuple[str, str]]:
        """Add one chunk of whole lines to the totals; returns its (address in hex,
        rest) pairs with ``addresses``, else []."""
        import collections
        from operator import itemgetter

        self.text = text
        pairs: List[Tuple[str, str]] = []
        if addresses:
            pairs = re.findall(r"(?am)^0*([0-9a-f]+) (.*)$", text)
            rests = list(map(itemgetter(1), pairs))
        else:
            rests = _rests(text)
        if len(rests) != text.count("\n"):
            # A line the expression did not take (malformed, empty, an upper-case
            # address): the full parser names a bad one.
            pairs = [
                (f"{self.entry_of(line).start:x}", line.partition(" ")[2])
                for line in text.split("\n")
                if line
            ]
            rests = list(map(itemgetter(1), pairs))
        self.pairs = pairs
        self.nvmas += len(rests)
        self.rests = collections.Counter(rests)
        ours: Dict[str, str] = {}  # rest -> the region file it maps
        for rest, times in self.rests.items():
            try:
                e = self.entry(rest)[0]
            except ValueError:  # name the whole line, address included
                for a, r in self.lines_of({rest}):
                    self.entry_of(a + " " + r)
                raise
            if e.file is not None and _region_file(e.file, e.deleted):
                ours[rest] = e.file
            row = self.cats[_maps_cat(e)]
            for n, c in e.pages.items():
                kb = c * e.page_size_kb * times
                self.totals[n] = self.totals.get(n, 0) + kb
                row[n] = row.get(n, 0) + kb
        for a, r in self.lines_of(set(ours)):
            self.regions.setdefault(ours[r], []).append(int(a, 16))
        return pairs

    def lines_of(self, wanted: Set[str]) -> List[Tuple[str, str]]:
        """(address in hex, rest) of the chunk's lines whose rest is in ``wanted``, in
        file order: each rest found as " REST\\n" by the string search, and taken where
        what comes before it on its line is one word (its own address, not the head of
        a longer rest that ends the same way)."""
        if not self.pairs and sum(self.rests[r] for r in wanted) > 256:
            # Many lines wanted (--all): every address at once is cheaper.
            self.pairs = re.findall(r"(?am)^0*([0-9a-f]+) (.*)$", self.text)
        if self.pairs:
            return [(a, r) for a, r in self.pairs if r in wanted]
        text, hits = self.text, []
        for r in wanted:
            needle, left = f" {r}\n", self.rests[r]
            pos = text.find(needle)
            while pos >= 0 and left:
                start = text.rfind("\n", 0, pos) + 1
                if " " not in text[start:pos]:
                    hits.append((start, text[start:pos].lstrip("0") or "0", r))
                    left -= 1
                pos = text.find(needle, pos + 1)
        return [(a, r) for _, a, r in sorted(hits)]

    def rows(self, min_kb: int) -> List[str]:
        """Table rows of the chunk's VMAs with at least ``min_kb`` resident (all when
        0), in file order; each distinct rest is formatted once."""
        tails: Dict[str, str] = {}
        for r in self.rests:
            e = self.entry(r)[0]
            if e.pages_total * e.page_size_kb >= min_kb:
                name = _maps_name(e)
                if len(name) > 28:  # keep the verdict column in line: the
                    name = "..." + name[-25:]  # end of a path says the most
                verdict = (
                    _nur.placement_verdict(e.bytes_per_node, e.mode)
                    if e.pages
                    else "nothing faulted in"
                )
                tails[r] = (
                    f"{_nu.format_kib(e.pages_total * e.page_size_kb):>10}  "
                    f"{e.policy:<22}  {name:<28}  {verdict}\n"
                )
        return [f"  {a:>14}  " + tails[r] for a, r in self.lines_of(set(tails))]

    def json(self, pairs: List[Tuple[str, str]], tty: bool) -> str:
        """The chunk's VMAs as JSON objects, each after a comma.  Each distinct rest is
        encoded once; per line only the address changes, joined in C."""
        import json
        from itertools import chain, repeat
        from operator import itemgetter

        frags: Dict[str, str] = {}
        for rest in self.rests:
            e, frag = self.entry(rest)
            if frag is None:
                d = e.to_json()
                d["verdict"] = _nur.placement_verdict(e.bytes_per_node, e.mode) if e.pages else None
                del d["start"]
                frag = (
                    json.dumps(d, indent=2).replace("\n", "\n    ")[1:]
                    if tty
                    else json.dumps(d, separators=(",", ":"))[1:]
                )
                self.known[rest] = (e, frag)
            frags[rest] = frag
        return "".join(
            chain.from_iterable(
                zip(
                    repeat(',\n    {\n      "start": "0x' if tty else ',{"start":"0x'),
                    map(itemgetter(0), pairs),
                    repeat('",'),
                    map(frags.__getitem__, map(itemgetter(1), pairs)),
                )
            )
        )


def _maps_name(e: _nu.NumaMapsEntry) -> str:
    """What a VMA maps, for the table: its file (escaped: another user names it) or
    its kind."""
    name = e.kind
    if e.file is not None:
        name = _nu.printable(e.file)
    if e.deleted:
        name += " (deleted)"
    if e.huge:
        name += " [huge]"
    return name


def _region_file(path: str, deleted: bool) -> bool:
    """Whether a numa_maps path is a numa_utils region's: /dev/shm/numa_utils-NAME, or
    a SysV segment (/SYSV<key> (deleted)) of our key family."""
    return (
        path.startswith("/dev/shm/" + _nur.POSIX_PREFIX)
        and not deleted
        or (
            deleted
            and re.fullmatch("/SYSV[0-9a-f]{8}", path) is not None
            and int(path[5:], 16) & _nur.SYSV_KEY_MASK == _nur.SYSV_KEY_PREFIX
        )
    )


# A line of /proc/PID/maps (fs/proc/task_mmu.c show_map_vma): start-end, permissions,
# file offset, device major:minor, inode.  A SysV segment's inode is its shmid.
_PROC_MAPS_RE = re.compile(
    r"(?m)^([0-9a-f]+)-([0-9a-f]+) \S+ ([0-9a-f]+) ([0-9a-f]+):([0-9a-f]+) ([0-9]+) "
)


class _Vma(NamedTuple):
    """A VMA of a region's file, as /proc/PID/maps shows it."""

    start: int
    end: int
    base: int  # where the mapping of offset 0 of the file is
    dev: int
    ino: int


def _region_vmas(b: _nu.Backend, pid: str, starts: Set[int]) -> Dict[int, _Vma]:
    """The VMAs of /proc/PID/maps that start at one of ``starts``, by start."""
    out: Dict[int, _Vma] = {}
    for text in _nu._whole_lines(_read_chunks(b, f"/proc/{pid}/maps")):
        for m in _PROC_MAPS_RE.finditer(text):
            start = int(m.group(1), 16)
            if start in starts:
                dev = os.makedev(int(m.group(4), 16), int(m.group(5), 16))
                base = start - int(m.group(3), 16)
                out[start] = _Vma(start, int(m.group(2), 16), base, dev, int(m.group(6)))
    return out


def _mapped_file_record(pid: str, path: str, vma: _Vma) -> Tuple[int, Optional[Dict[str, Any]]]:
    """(size, identity record) of the tmpfs file that ``vma`` of process ``pid`` maps,
    read with no lock and no mapping.  Opened through /proc/PID/map_files, which is
    that file whatever its path names here (another mount namespace, a folder
    replaced by a link); where that is refused (it needs CAP_SYS_ADMIN), by ``path``
    only while it is a regular file of /dev/shm here with the VMA's device and inode,
    checked before the open (lstat: no link followed) and after it.  Else ValueError:
    layout unknown."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(f"/proc/{pid}/map_files/{vma.start:x}-{vma.end:x}", flags)
    except PermissionError:
        fd = -1
    if fd < 0:
        if os.path.dirname(path) != "/dev/shm":  # a folder on the way could be a link
            raise ValueError(f"layout unknown: {path} is not a file of /dev/shm here")
        _check_mapped_file(os.stat(path, follow_symlinks=False), path, vma)
        fd = os.open(path, flags | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        _check_mapped_file(st, path, vma)
        return st.st_size, _nur.read_identity_record(
            lambda off, n: os.pread(fd, n, off), st.st_size, path
        )
    finally:
        os.close(fd)


def _check_mapped_file(st: os.stat_result, path: str, vma: _Vma) -> None:
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (vma.dev, vma.ino):
        raise ValueError(
            f"layout unknown: {path} here is not the file the process maps "
            "(another mount namespace, or replaced)"
        )


def _same_ipc_namespace(pid: str) -> bool:
    """Whether process ``pid`` sees this process's SysV segments (True when its
    namespace cannot be read: its memory, read next, is refused then too)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/ipc") == os.readlink("/proc/self/ns/ipc")
    except OSError:
        return True


def _sysv_record(
    pid: str, path: str, vma: _Vma, shm: Mapping[int, _nur.ShmStat], shmem: Optional[int]
) -> Tuple[int, Optional[Dict[str, Any]], bool]:
    """(size, identity record, removed) of the SysV segment mapped at ``vma``: the
    segment is found by its shmid (the VMA's inode), as IPC_RMID sets its key to 0
    (removed, still attached); its record is read from /proc/PID/mem (never an
    attach: see read_identity_record), and only at a mapping on ``shmem``, the
    kernel's shared-memory mount."""
    key = int(path[5:], 16)
    row = shm.get(vma.ino)
    if row is None or not _same_ipc_namespace(pid) or row.key not in (0, key):
        raise ValueError(f"layout unknown: shmid {vma.ino} is not in /proc/sysvipc/shm here")
    room = _room_mapping(pid, key, shmem)
    if room is None and vma.dev != shmem:
        raise _not_shared_memory(path, vma.dev)
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:

        def read_at(base: int) -> Callable[[int, int], bytes]:
            return lambda off, n: os.pread(fd, n, base + off)

        if room is not None:  # a huge-page region's record segment
            rec = _nur.read_identity_record(read_at(room[0]), room[1], f"record segment of {path}")
            if rec is not None and rec.get("data_key") == key and rec["size"] == row.size:
                return row.size, rec, row.key == 0
        if vma.dev != shmem:
            raise _not_shared_memory(path, vma.dev)
        rec = _nur.read_identity_record(read_at(vma.base), row.size, f"{path} at {vma.base:#x}")
    finally:
        os.close(fd)
    return row.size, rec, row.key == 0


def _not_shared_memory(path: str, dev: int) -> ValueError:
    return ValueError(
        f"layout unknown: {path} is not on shared memory (device "
        f"{os.major(dev)}:{os.minor(dev)}), so it was not opened"
    )


def _room_mapping(pid: str, key: int, shmem: Optional[int]) -> Optional[Tuple[int, int]]:
    """(address, bytes) of process ``pid``'s mapping, on ``shmem`` (the kernel's
    shared-memory mount), of the record segment of the huge-page segment that was
    made under SysV key ``key`` (numa_utils.record_segment_key: its path keeps that
    key after a removal); None when it maps none."""
    want = f" /SYSV{_nur.record_segment_key(key):08x} (deleted)"
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            m = _PROC_MAPS_RE.match(line)
            if m is None or not line.rstrip("\n").endswith(want) or int(m.group(3), 16):
                continue
            if os.makedev(int(m.group(4), 16), int(m.group(5), 16)) == shmem:
                return int(m.group(1), 16), int(m.group(2), 16) - int(m.group(1), 16)
    return None


def _shmem_device() -> Optional[int]:
    """The device of the kernel's internal shared-memory mount, where every SysV
    segment of base pages lives, as every memfd does: a memfd's, made and closed
    here (None where memfd_create is refused)."""
    try:
        fd = os.memfd_create("numa_utils-probe", os.MFD_CLOEXEC)
    except OSError:
        return None
    try:
        return os.fstat(fd).st_dev
    finally:
        os.close(fd)


def _tmpfs_devices(b: _nu.Backend, pid: str) -> Set[int]:
    """The devices of the tmpfs mounts process ``pid`` sees: /proc/PID/mountinfo
    (fs/proc_namespace.c show_mountinfo: major:minor third, the file system type
    first after " - "; a path's spaces are escaped, so " - " is the separator)."""
    out: Set[int] = set()
    for line in (_read_optional(b, f"/proc/{pid}/mountinfo") or "").splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 3 or tail.split(" ", 1)[0] != "tmpfs":
            continue
        major, _, minor = fields[2].partition(":")
        if major.isdigit() and minor.isdigit():
            out.add(os.makedev(int(major), int(minor)))
    return out


def _layout_rows(row: Dict[str, Any], lay: _nur.Layout, vmas: List[_Vma]) -> None:
    """``row``'s extents, one per extent with the VMAs it spans when the layout has
    no more extents than the mapping has VMAs, and its VMAs with the extents each
    holds: the lines shown stay as many as the VMAs, whatever the record says."""
    from bisect import bisect_left, bisect_right

    base, size = vmas[0].base, lay.size or 0
    starts = [v.start for v in vmas]
    row["extent_count"] = lay._extents_before(size)
    for v in vmas:
        off = v.start - base
        held = None
        if off < size:  # the last VMAs may hold only the identity record
            last = lay._extents_before(min(v.end - base, size)) - 1
            held = [lay._extents_before(off + 1) - 1, last]
        row["vmas"].append({"start": f"0x{v.start:x}", "end": f"0x{v.end:x}", "extents": held})
    if row["extent_count"] > len(vmas):
        return
    for x in lay:  # its VMAs: the one holding its start, those inside
        at = base + x.offset
        lo = max(bisect_right(starts, at) - 1, 0)
        row["extents"].append(
            {
                "offset": x.offset,
                "length": x.length,
                "policy": x.policy,
                "nodes": sorted(x.nodes),
                "start": f"0x{at:x}",
                "vmas": [f"0x{v:x}" for v in starts[lo : bisect_left(starts, at + x.length)]],
            }
        )


def _maps_regions(b: _nu.Backend, pid: str, seen: Mapping[str, List[int]]) -> List[Dict[str, Any]]:
    """Each mapping of a region among ``seen`` (numa_maps path -> VMA starts) with
    the layout from its identity record.  A mapping is the VMAs of one file (device
    and inode from /proc/PID/maps) at one base; the record is that file's, never the
    one its path names here."""
    if not seen:
        return []
    files = {v: path for path, starts in seen.items() for v in starts}
    mappings: Dict[Tuple[str, int, int, int], List[_Vma]] = {}
    for v in sorted(_region_vmas(b, pid, set(files)).values()):
        mappings.setdefault((files[v.start], v.dev, v.ino, v.base), []).append(v)
    shm = {st.id: st for st in _nur.parse_sysvipc_shm(_read_optional(b, "/proc/sysvipc/shm") or "")}
    # Only shared memory is opened or read: a file of any other file system may be
    # served by a process (FUSE) that never answers the open or the page fault.
    shmem, tmpfs = _shmem_device(), _tmpfs_devices(b, pid)
    out: List[Dict[str, Any]] = []
    for (path, _, _, base), vmas in sorted(mappings.items(), key=lambda m: m[0][3]):
        sysv = not path.startswith("/dev/")
        row: Dict[str, Any] = {
            "file": path,
            "kind": "sysv" if sysv else "posix",
            "start": f"0x{base:x}",
            "name": None,
            "size": None,
            "layout": None,
            "removed": False,
            "extent_count": None,
            "extents": [],
            "vmas": [],
            "error": None,
        }
        rec = None
        try:
            if sysv:
                seg, rec, row["removed"] = _sysv_record(pid, path, vmas[0], shm, shmem)
            elif vmas[0].dev not in tmpfs:
                raise _not_shared_memory(path, vmas[0].dev)
            else:
                seg, rec = _mapped_file_record(pid, path, vmas[0])
        except (OSError, ValueError) as e:
            row["error"] = str(e)
        try:
            lay = _nur.record_layout(rec) if rec is not None else None
        except ValueError as e:
            rec, lay, row["error"] = None, None, f"damaged identity record ({e})"
        if rec is not None and lay is not None:
            row.update(name=rec["key"], size=rec["size"], layout=str(lay))
            _layout_rows(row, lay, vmas)
        elif row["error"] is None:
            row["error"] = "no identity record: not made by SharedRegion.create"
        out.append(row)
    return out


def _maps_regions_text(rows: List[Dict[str, Any]]) -> str:
    """The regions part of `maps`: every name and path escaped (printable)."""
    out = []
    for r in rows:
        head = f"region {r['name']!r} ({r['kind']} {_nu.printable(r['file'])}"
        if r["removed"]:
            head += ", removed, still attached"
        head += f") at {r['start']}"
        if r["size"]:
            head += f", {_nu.format_size(r['size'])}: layout {r['layout']}"
        if r["error"]:
            head += f": {_nu.printable(r['error'])}"
        out.append(head)
        for i, e in enumerate(r["extents"]):
            out.append(
                f"  extent {i} {e['offset']:#x}+{_nu.format_size(e['length'])} {e['policy']}:"
                f"{_nu.format_cpulist(e['nodes']) or '-'}  at {e['start']}  VMAs "
                + " ".join(v[2:] for v in e["vmas"])
            )
        if r["extent_count"] is not None and not r["extents"]:
            out.append(f"  {r['extent_count']} extents over {len(r['vmas'])} VMAs:")
            out += [_vma_line(v) for v in r["vmas"]]
    return "".join(line + "\n" for line in out)


def _vma_line(vma: Mapping[str, Any]) -> str:
    held = vma["extents"]
    where = f"  VMA {vma['start'][2:]}-{vma['end'][2:]}"
    if held is None:
        return where + "  identity record"
    if held[0] == held[1]:
        return where + f"  extent {held[0]}"
    return where + f"  extents {held[0]}-{held[1]}"


def _read_chunks(b: _nu.Backend, path: str) -> Iterator[str]:
    """A file in decoded pieces of 256 KiB (numa_maps of a large process: bounded
    memory).  On the running system opened now, non-blocking, and refused unless a
    regular file: a FIFO or a device (/dev/zero) would block or never end."""
    if not b.is_live:
        return iter((b.read_text(path),))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path}: not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return _pieces(fd)


def _pieces(fd: int) -> Iterator[str]:
    """``fd``'s text 256 KiB at a time, then ``fd`` closed.  /proc gives a page per
    read: every read goes into one buffer (a new buffer per read cost the kernel a
    mapping, its page faults and an unmapping each time), small enough that a piece is
    still in the cache when it is decoded and parsed (1 MiB pieces: 6% slower)."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    buf = bytearray(1 << 18)
    view = memoryview(buf)
    try:
        end = False
        while not end:
            size = 0
            while size < len(buf) and not end:
                got = os.readv(fd, [view[size:]])
                size += got
                end = not got
            yield decoder.decode(view[:size], end)
    finally:
        os.close(fd)


def _cmd_maps(args: argparse.Namespace) -> int:
    b = None
    if args.file is not None:
        chunks = _read_chunks(_nu.LinuxBackend(), args.file)
        what = _nu.printable(args.file)
    elif args.pid is not None:
        b = _nu._root_backend(args.root)
        if not (args.pid == "self" or args.pid.isdigit()):
            raise ValueError(f"invalid pid {args.pid!r}")
        chunks = _read_chunks(b, f"/proc/{args.pid}/numa_maps")
        what = f"pid {args.pid}"
    else:
        raise ValueError("give a PID or --file PATH")
    scan = _MapsScan(args.page_kb or os.sysconf("SC_PAGE_SIZE") // 1024)
    write = sys.stdout.write

    def regions_of() -> Optional[List[Dict[str, Any]]]:  # a live process's only
        return _maps_regions(b, args.pid, scan.regions) if b is not None and b.is_live else None

    if args.json:
        # {"vmas": [...], "totals_kb": {...}} written chunk by chunk.
        import json

        try:
            tty = sys.stdout.isatty()
        except (AttributeError, ValueError):
            tty = False
        write('{\n  "vmas": [' if tty else '{"vmas":[')
        for text in _nu._whole_lines(chunks):
            before = scan.nvmas
            part = scan.json(scan.chunk(text, addresses=True), tty)
            write(part if before else part[1:])
        totals = {str(n): kb for n, kb in sorted(scan.totals.items())}
        tail = {"totals_kb": totals, "regions": regions_of()}
        if tail["regions"] is None:  # a saved file: no regions to read
            del tail["regions"]
        write(
            "\n  ],\n" + json.dumps(tail, indent=2)[2:] + "\n"
            if tty
            else "]," + json.dumps(tail, separators=(",", ":"))[1:] + "\n"
        )
        return 0
    # Most VMAs of a big process are small: their counters are summed without an
    # entry each, and only the lines shown are parsed in full.  Rows are written as
    # they come (memory bounded), the counts after them.
    min_bytes = 0 if args.all else _nu.parse_size(args.min_size)
    min_kb = 0 if args.all else max(min_bytes // 1024, 1)
    write(f"numa_maps of {what}:\n")
    nshown = 0
    for text in _nu._whole_lines(chunks):
        scan.chunk(text)
        rows = scan.rows(min_kb)
        if rows and not nshown:
            write(f"  {'start':>14}  {'resident':>10}  {'policy':<22}  {'mapping':<28}  verdict\n")
        nshown += len(rows)
        write("".join(rows))
    write(
        f"{scan.nvmas} VMAs; "
        + (
            "all shown"
            if args.all
            else f"{nshown} with >= {_nu.format_kib(min_bytes // 1024)} resident shown "
            "(--all for every VMA)"
        )
        + "\n"
    )
    write(_maps_regions_text(regions_of() or []))
    _print_maps_totals(scan.totals, scan.cats, what)
    return 0


def _print_maps_totals(totals: Dict[int, int], cats: Dict[str, Dict[int, int]], what: str) -> None:
    out: List[str] = []
    nodes = sorted(totals)
    out.append("")
    out.append(f"Per-node memory usage (in MBs) for {what}")
    head = "".join(f"{'Node ' + str(n):>15} " for n in nodes)
    out.append(f"{'':<16} {head}{'Total':>15}")
    for cat in _MAPS_CATS:
        row = cats[cat]
        out.append(
            f"{cat:<16} "
            + "".join(f"{row.get(n, 0) / 1024:>15.2f} " for n in nodes)
            + f"{sum(row.values()) / 1024:>15.2f}"
        )
    out.append("-" * 16 + " " + "".join(f"{'-' * 15} " for _ in nodes) + "-" * 15)
    out.append(
        f"{'Total':<16} "
        + "".join(f"{totals[n] / 1024:>15.2f} " for n in nodes)
        + f"{sum(totals.values()) / 1024:>15.2f}"
    )
    if totals:
        out.append(f"process: {_nur.placement_verdict({n: kb * 1024 for n, kb in totals.items()})}")
    sys.stdout.write("\n".join(out) + "\n")


def _cli_maps(sub: Any) -> None:
    p = sub.add_parser(
        "maps",
        parents=[sub.common],
        help="where a process's memory is, per VMA and per node (numa_maps, like numastat -p)",
    )
    p.add_argument("pid", nargs="?", help="process id (or 'self')")
    p.add_argument("--file", metavar="PATH", help="read a saved numa_maps file instead")
    p.add_argument("--all", action="store_true", help="list every VMA")
    p.add_argument(
        "--min-size",
        default="1M",
        metavar="SIZE",
        help="list VMAs with at least this much resident (default 1M)",
    )
    p.add_argument(
        "--page-kb",
        type=_positive_int,
        default=0,
        metavar="KB",
        help="page size for lines without kernelpagesize_kB (old kernels)",
    )
    p.set_defaults(func=_cmd_maps)


def _cleanup_key(key: Union[int, str]) -> str:
    """A region's key as `cleanup --key` reads it back (_key_args): 0x4e12abcd, or
    the name quoted for a shell."""
    import shlex

    return f"0x{key:08x}" if isinstance(key, int) else shlex.quote(key)


def _key_args(texts: Optional[Sequence[str]]) -> Optional[List[Union[int, str]]]:
    """`cleanup --key` values: each is a name, and also an int key when it reads as
    one (0x1234, 4660)."""
    if texts is None:
        return None
    out: List[Union[int, str]] = []
    for t in texts:
        out.append(t)
        m = re.fullmatch(r"(0[xX][0-9a-fA-F]{1,8})|([0-9]{1,10})", t.strip())
        if m and int(t, 0 if m.group(1) else 10) <= 0xFFFFFFFF:
            out.append(int(t, 0 if m.group(1) else 10))
    return out


def _cmd_cleanup(args: argparse.Namespace) -> int:
    b = _nu._root_backend(args.root)
    if not args.min_age >= 0:
        raise ValueError(f"--min-age {args.min_age}: a number of seconds >= 0")
    rows = _nur.cleanup(_key_args(args.key), args.remove, args.min_age, backend=b)
    if args.json:
        _nu._print_json({"regions": rows, "removed": bool(args.remove)})
        return 0
    out = [
        "Our regions: SysV keys 0x4exxxxxx (any key with --key) and "
        f"/dev/shm/numa_utils-* owned by uid {b.call('geteuid')}; others' are never listed "
        "or touched.  Removed only when proven unused: nobody attached, its creator "
        f"and last user gone, unused for {args.min_age:g} s (--min-age)."
    ]
    if not rows:
        out.append("  none")
    for r in rows:
        ident = (
            f"sysv {r['key']} shmid {r['shmid']}" if r["kind"] == "sysv" else f"posix {r['path']}"
        )
        name = "?"  # no identity record read: the region's name is unknown
        if r["region"] is not None:
            name = _cleanup_key(r["region"])  # as --key takes it
        out.append(
            f"  {name:<16} {ident:<36} {_nu.format_kib(r['size'] // 1024):>10}  "
            f"mode {r['mode']}  attached {r['attached']}  {r['action']}"
            + (f": {r['why']}" if r["action"] == "keep" else "")
        )
    if not args.remove and any(r["stale"] for r in rows):
        out.append("dry run: add --remove to remove the stale ones")
    young = [r for r in rows if r["action"] == "keep" and "(minimum age" in r["why"]]
    if args.remove and young:
        out.append(
            f"kept {len(young)} used in the last {args.min_age:g} s (--min-age): a region "
            "just closed may be attached again at once; --min-age 0 removes it now if "
            "nobody uses it"
        )
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _progress_bar(stream: Any) -> Callable[[int, int], None]:
    import time

    t0 = time.monotonic()
    tty = hasattr(stream, "isatty") and stream.isatty()
    last = [-1]

    def show(done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        if pct == last[0] or (not tty and pct != 100):
            return
        last[0] = pct
        el = time.monotonic() - t0
        rate = done / el / (1 << 30) if el > 0 else 0.0
        bar = "#" * (pct * 30 // 100)
        stream.write(
            f"{chr(13) if tty else ''}prefault [{bar:<30}] {pct:3d}% "
            f"{done / (1 << 30):.2f}/{total / (1 << 30):.2f} GiB "
            f"{rate:.2f} GiB/s" + ("" if tty and pct < 100 else "\n")
        )
        stream.flush()

    return show


def _cmd_region(args: argparse.Namespace) -> int:
    b = _nu._root_backend(args.root)
    nodes = _nu.parse_nodestring(args.nodes, backend=b) if args.nodes else None
    if nodes is not None:
        have = _nu.read_topology(backend=b).nodes_with_memory
        if not nodes or nodes - have:
            raise ValueError(
                f"--nodes {args.nodes}: no memory node "
                f"{_nu.format_cpulist(nodes - have) or '(empty list)'} on this "
                f"machine (memory nodes: {_nu.format_cpulist(have) or '-'})"
            )
    hp: Union[bool, str] = args.hugepages if args.hugepages else False
    region = _nur.SharedRegion.create(
        args.key,
        _nu.parse_size(args.size),
        policy=args.policy,
        nodes=nodes,
        kind=args.kind,
        hugepages=hp,
        threads=args.threads,
        backend=b,
        prefault=not args.no_prefault,
        layout=args.layout,
        progress=None if args.json else _progress_bar(sys.stderr),
    )
    try:
        where = region.placement()
        rep = region.to_json()
        per_ext = region.placement(by_extent=True)
        rep.update(
            prefault=region.prefaulted,
            placement={str(n): v for n, v in sorted(where.items())},
            verdict=_nur.placement_verdict(where, region.policy.mode),
            kept=args.keep,
            extents=[
                dict(
                    e._asdict(),
                    nodes=sorted(e.nodes),
                    ok=p.ok,
                    verdict=p.verdict,
                    placement={str(n): v for n, v in sorted(p.items())},
                )
                for e, p in zip(region.extents, per_ext)
            ],
        )
        if args.json:
            _nu._print_json(rep)
        else:
            pf = region.prefaulted
            lines = [repr(region)]
            if pf:
                gbs = pf["bytes"] / pf["seconds"] / (1 << 30) if pf["seconds"] else 0.0
                lines.append(
                    f"prefault: {pf['method']}, {pf['threads']} threads, "
                    f"{pf['seconds']:.3f} s, {gbs:.2f} GiB/s"
                )
            per = ", ".join(
                f"node {n}: {_nu.format_kib(v // 1024)}" for n, v in sorted(where.items()) if v
            )
            lines.append(
                f"placement: {_nur.placement_verdict(where, region.policy.mode)}"
                + (
                    f" ({per})"
                    if per
                    else " yet: --no-prefault, pages land on first touch"
                    if args.no_prefault
                    else ""
                )
            )
            if len(per_ext) > 1:
                lines += [
                    f"  extent {i} {e.offset:#x}+{_nu.format_size(e.length)} {e.policy}:"
                    f"{_nu.format_cpulist(e.nodes) or '-'}  {p.verdict}"
                    for i, (e, p) in enumerate(zip(region.extents, per_ext))
                ]
            lines.append(
                f"kept: remove with `{_nu._prog()} cleanup --remove --key "
                f"{_cleanup_key(region.key)}` once detached"
                if args.keep
                else "destroyed"
            )
            sys.stdout.write("\n".join(lines) + "\n")
    finally:
        if args.keep:
            region.close()
        else:
            region.destroy()
    return 0


def _cli_cleanup(sub: Any) -> None:
    p = sub.add_parser(
        "cleanup",
        parents=[sub.common],
        help="list (and with --remove, remove) our stale shared memory "
        "regions; never other programs' or users'",
    )
    p.add_argument(
        "--remove", action="store_true", help="remove the stale ones (default: dry run, list only)"
    )
    p.add_argument(
        "--key",
        action="append",
        default=None,
        metavar="KEY",
        help="only the region(s) of this name or int SysV key (0x1234), under any key (repeatable)",
    )
    p.add_argument(
        "--min-age",
        type=float,
        default=_nur.CLEANUP_MIN_AGE,
        metavar="SECONDS",
        help=f"remove only regions unused for this long (default {_nur.CLEANUP_MIN_AGE:g})",
    )
    p.set_defaults(func=_cmd_cleanup)
    p = sub.add_parser(
        "region",
        parents=[sub.common],
        help="create a shared region with a policy, prefault it with a "
        "progress bar, report placement, then destroy it (or --keep)",
    )
    p.add_argument("key", help="region name (SysV key 0x4exxxxxx / /dev/shm/numa_utils-KEY)")
    p.add_argument("size", help="size: 4G, 512M, bytes")
    p.add_argument("--policy", choices=sorted(_nu.MODE_NAMES), default=None)
    p.add_argument(
        "--layout",
        default=None,
        metavar="TEXT",
        help="a policy per extent: parts:bind:0/0/1/1, blocks:2M:bind:0/1, "
        "1G:bind:0;1G:interleave:0-1 (docs/regions.md: layouts)",
    )
    p.add_argument(
        "--nodes",
        default=None,
        metavar="LIST",
        help="node list in numactl's grammar, e.g. 0-1, all, !0",
    )
    p.add_argument("--kind", choices=["sysv", "posix"], default="sysv")
    p.add_argument("--hugepages", default=None, metavar="SIZE", help="2M, 1G")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-prefault", action="store_true")
    p.add_argument("--keep", action="store_true", help="leave the region in place")
    p.set_defaults(func=_cmd_region)


# ---------------------------------------------------------------------------
# CLI: plan and run
# ---------------------------------------------------------------------------

_SYSTEMD_POLICY = MappingProxyType(
    {"prefer": "preferred", "bind": "bind", "interleave": "interleave", "local": "local"}
)
_NUMACTL_OPTION = MappingProxyType(
    {"prefer": "--preferred", "bind": "--membind", "interleave": "--interleave"}
)


def _render_plan_text(plans: List[_nu.GpuPlan], policy: str, root: str) -> str:
    where = "this machine" if root == "/" else f"saved tree {root}"
    if not plans:
        return f"numa_utils plan: {where}, policy {policy}\n  no GPUs found\n"
    memory = plans[0].memory or "unchanged"
    out = [f"numa_utils plan: {where}, policy {plans[0].policy}, memory {memory}"]
    w = max(len(_nu.format_cpulist(p.cpus)) for p in plans)
    w = max(w, 4)
    out.append(f"  {'gpu':>3}  {'pci':<12}  {'node':>4}  {'cpus':<{w}}  memory")
    for p in plans:
        node = "?" if p.cpu_node is None else str(p.cpu_node)
        memtxt = (
            f"{p.memory} {_nu.format_cpulist(p.memory_nodes)}"
            if p.memory and (p.memory_nodes or p.memory == "local")
            else "unchanged"
        )
        extra = (
            f"  (GPU memory on node {_nu.format_cpulist(p.gpu_memory_nodes)})"
            if p.gpu_memory_nodes
            else ""
        )
        out.append(
            f"  {p.gpu!s:>3}  {p.pci or '?':<12}  {node:>4}  "
            f"{_nu.format_cpulist(p.cpus):<{w}}  {memtxt}{extra}"
        )
    notes = sorted({n for p in plans for n in p.notes})
    if notes:
        out.append("NOTES")
        out.extend(f"  - {n}" for n in notes)
    return "\n".join(out) + "\n"


def _drop_in_name(unit: str, index: Optional[int]) -> str:
    """The drop-in of instance ``index`` of template ``unit``: worker@3.service.d/..."""
    stem, dot, suffix = unit.rpartition(".")
    if not dot:
        stem, suffix = unit, "service"
    name = f"{stem if stem.endswith('@') else stem + '@'}{index}.{suffix}"
    return f"{name}.d/50-numa.conf"


def _render_plan_systemd(plans: List[_nu.GpuPlan], unit: str) -> str:
    out = []
    for p in plans:
        out.append(
            f"# {_drop_in_name(unit, p.gpu)}: GPU {p.gpu} ({p.pci or '?'}), node "
            f"{'?' if p.cpu_node is None else p.cpu_node}, policy {p.policy}"
        )
        out.append("[Service]")
        out.append(f"CPUAffinity={_nu.format_cpulist(p.cpus)}")
        if (
            p.memory is not None
            and p.memory in _SYSTEMD_POLICY
            and (p.memory_nodes or p.memory == "local")
        ):
            out.append(f"NUMAPolicy={_SYSTEMD_POLICY[p.memory]}")
            if p.memory != "local":
                out.append(f"NUMAMask={_nu.format_cpulist(p.memory_nodes)}")
        out.append("")
    return "\n".join(out)


def _render_plan_cmd(plans: List[_nu.GpuPlan], fmt: str) -> str:
    out = []
    for p in plans:
        out.append(
            f"# GPU {p.gpu} ({p.pci or '?'}), node "
            f"{'?' if p.cpu_node is None else p.cpu_node}, policy {p.policy}"
        )
        if fmt == "taskset":
            out.append(f"taskset -c {_nu.format_cpulist(p.cpus)}")
            continue
        args = [f"--physcpubind={_nu.format_cpulist(p.cpus)}"]
        if p.memory is not None and p.memory in _NUMACTL_OPTION and p.memory_nodes:
            args.append(f"{_NUMACTL_OPTION[p.memory]}={_nu.format_cpulist(p.memory_nodes)}")
        elif p.memory == "local":
            args.append("--localalloc")
        out.append("numactl " + " ".join(args) + " --")
    return "\n".join(out) + ("\n" if out else "")


# ---------------------------------------------------------------------------
# Fleet exports: labels for Node Feature Discovery (status --format nfd), the policy
# a container runtime applies at birth (plan --format oci, nri), Slurm's gres.conf and
# srun (gres, srun), Ray's custom resources (ray).  Each renders data status and plan
# already hold, in the consumer's own syntax.
# ---------------------------------------------------------------------------

# NFD's local source (nfd-worker reads /etc/kubernetes/node-feature-discovery/
# features.d/*, skipping dot files, ignoring a file over 64 KiB; source/local/local.go):
# one `name=value` line per label, `# +expiry-time=<RFC 3339>` after which the lines
# below it are ignored.  Names and values follow Kubernetes' label rules: a name
# part of at most 63 characters, a value of at most 63, both
# [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?, so no commas: a list of ids is the
# kernel's list with "_" for "," ("0-3_8").
_NFD_PREFIX = "numa-utils.io/"
_NFD_FILE = "numa-utils"
_NFD_MAX_BYTES = 65536
_LABEL_MAX = 63
_NIC_KINDS = ("net", "rdma")
_EXPIRY_UNITS = MappingProxyType({"s": 1, "m": 60, "h": 3600, "d": 86400})


def _label_list(ids: Iterable[int]) -> str:
    """Ids as a label value: "0-3,8" becomes "0-3_8" (a label value has no comma)."""
    return _nu.format_cpulist(ids).replace(",", "_")


def _hugepage_name(size_kb: int) -> str:
    """Kubernetes' name for a huge page size: hugepages-2Mi, hugepages-1Gi."""
    if size_kb % (1 << 20) == 0:
        return f"hugepages-{size_kb >> 20}Gi"
    if size_kb % (1 << 10) == 0:
        return f"hugepages-{size_kb >> 10}Mi"
    return f"hugepages-{size_kb}Ki"


def _lower_tier_nodes(nodes: List[Dict[str, Any]]) -> List[int]:
    """Memory nodes in a slower memory tier than every node with CPUs (a CXL expander,
    kmem-onlined far memory): the kernel gives them a larger memory_tierN."""
    dram_tiers = [row["tier"] for row in nodes if row["cpus"] and row["tier"] is not None]
    if not dram_tiers:
        return []
    slowest = max(dram_tiers)
    return [row["id"] for row in nodes if row["tier"] is not None and row["tier"] > slowest]


class _Labels:
    """Labels in the order added; a value too long for a label is left out, with a
    comment saying which (the per-node labels carry the same facts)."""

    def __init__(self) -> None:
        self.values: Dict[str, str] = {}
        self.left_out: List[str] = []

    def put(self, name: str, value: Any) -> None:
        text = str(value)
        if len(text) > _LABEL_MAX:
            self.left_out.append(f"{_NFD_PREFIX}{name}: value over {_LABEL_MAX} characters")
            return
        self.values[_NFD_PREFIX + name] = text

    def put_list(self, name: str, ids: Iterable[int]) -> None:
        ids = sorted(ids)
        if ids:
            self.put(name, _label_list(ids))


def _nfd_node_labels(out: _Labels, rep: Dict[str, Any]) -> None:
    """Per node: its kind, GPUs, NICs and persistent huge pages."""
    devices = rep["devices"]
    for row in rep["nodes"]:
        node = row["id"]
        kind = row.get("kind") or "unknown"
        out.put(f"node.{node}.kind", kind)
        gpus = [dev for dev in devices if dev["kind"] == "gpu" and dev["node"] == node]
        nics = [dev for dev in devices if dev["kind"] in _NIC_KINDS and dev["node"] == node]
        if gpus:
            out.put(f"node.{node}.gpus", len(gpus))
        if nics:
            out.put(f"node.{node}.nics", len(nics))
        if kind == "no-memory":
            continue
        for size, pages in sorted(row["hugepages"].items(), key=lambda item: int(item[0])):
            out.put(f"node.{node}.{_hugepage_name(int(size))}", pages["total"])


def _nfd_labels(rep: Dict[str, Any]) -> _Labels:
    """The labels for one machine from its status report."""
    out = _Labels()
    nodes = rep["nodes"]
    out.put("nodes", len(nodes))
    layout = rep["packages"]
    if layout["nodes"]:
        out.put("packages", len(layout["nodes"]))
    if layout["nodes_per_package"]:
        out.put("nodes-per-package", layout["nodes_per_package"])
    kinds: Dict[str, List[int]] = {}
    for row in nodes:
        kinds.setdefault(row.get("kind") or "unknown", []).append(row["id"])
    for kind, ids in kinds.items():
        if kind != "no-memory":
            out.put_list(f"memory-nodes.{kind}", ids)
    out.put_list("memory-nodes.lower-tier", _lower_tier_nodes(nodes))
    gpus = rep["gpus"]  # PCI bus order: nvidia-smi's, CUDA_DEVICE_ORDER=PCI_BUS_ID's
    nics = [dev for dev in rep["devices"] if dev["kind"] in _NIC_KINDS]
    out.put("gpus", len(gpus))
    out.put_list("gpu-nodes", {dev["node"] for dev in gpus if dev["node"] is not None})
    for index, dev in enumerate(gpus):
        out.put(f"gpu.{index}.node", "unknown" if dev["node"] is None else dev["node"])
    out.put("nics", len(nics))
    out.put_list("nic-nodes", {dev["node"] for dev in nics if dev["node"] is not None})
    for index, dev in enumerate(nics):
        out.put(f"nic.{index}.node", "unknown" if dev["node"] is None else dev["node"])
    out.put("weighted-interleave", str(rep["interleave_weights"] is not None).lower())
    if rep["interleave_auto"] is not None:
        out.put("weighted-interleave.auto", str(bool(rep["interleave_auto"])).lower())
    balancing = rep["kernel"]["numa_balancing"]
    out.put("numa-balancing", "unknown" if balancing is None else balancing)
    _nfd_node_labels(out, rep)
    return out


def _expiry_seconds(text: str) -> int:
    """ "90s", "30m", "1h", "2d" (a number alone: seconds) as seconds, at least 1."""
    match = re.fullmatch(r"([0-9]{1,9})([smhd]?)", text.strip())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"--expiry {text!r}: give a positive time such as 90s, 30m, 1h or 2d")
    return int(match.group(1)) * _EXPIRY_UNITS[match.group(2) or "s"]


# RFC 3339 writes a four-digit year: 10000-01-01T00:00:00Z is past its last second.
_RFC3339_END = 253402300800


def _rfc3339_utc(when: float) -> str:
    """The time as NFD's expiry-time directive reads it (Go's time.RFC3339), in UTC."""
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def _render_nfd(rep: Dict[str, Any], expires: float) -> str:
    labels = _nfd_labels(rep)
    out = [
        f"# numa_utils {rep['version']} status --format nfd: Node Feature Discovery "
        "local-source labels",
        f"# +expiry-time={_rfc3339_utc(expires)}",
    ]
    out.extend(f"# left out: {why}" for why in labels.left_out)
    out.extend(f"{name}={value}" for name, value in labels.values.items())
    return "\n".join(out) + "\n"


def _write_atomically(folder: str, name: str, text: str) -> str:
    """Write folder/name as a whole or not at all: a dot file beside it (which NFD
    skips) written and fsynced, then renamed over it; the dot file goes on failure."""
    import tempfile

    path = os.path.join(folder, name)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), 0o644)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dirfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dirfd)  # the rename itself survives a crash
    finally:
        os.close(dirfd)
    return path


def _status_nfd(rep: Dict[str, Any], args: argparse.Namespace) -> int:
    """status --format nfd: print the feature file, or write it into --write DIR."""
    import time

    expires = time.time() + _expiry_seconds(args.expiry)
    if expires >= _RFC3339_END:
        raise ValueError(
            f"--expiry {args.expiry!r}: the labels would expire after the year 9999, "
            "which RFC 3339 cannot write (NFD refuses the file): give a shorter time"
        )
    text = _render_nfd(rep, expires)
    if len(text.encode()) > _NFD_MAX_BYTES:
        raise ValueError(
            f"the feature file would be {len(text.encode())} bytes: "
            "NFD ignores a feature file over 64 KiB"
        )
    if args.write is None:
        sys.stdout.write(text)
        return 0
    if not os.path.isdir(args.write):
        raise FileNotFoundError(errno.ENOENT, f"--write {args.write}: no such directory")
    path = _write_atomically(args.write, _NFD_FILE, text)
    sys.stderr.write(f"numa_utils status: wrote {path}\n")
    return 0


# The OCI runtime spec's linux.memoryPolicy (config-linux.md, "Memory policy"; runc
# 1.4, crun 1.23): "mode" one of the kernel's MPOL_* names, "nodes" a list such as
# "0-3,7" (none for MPOL_LOCAL and MPOL_DEFAULT), optional "flags".  The runtime sets
# it in the container's first process before exec, so no numactl in the image and no
# CAP_SYS_NICE in the pod.
_OCI_MODE = MappingProxyType(
    {"bind": "MPOL_BIND", "interleave": "MPOL_INTERLEAVE", "local": "MPOL_LOCAL"}
)


def _oci_memory_policy(plan: _nu.GpuPlan) -> Optional[Dict[str, str]]:
    """The plan's memory policy as linux.memoryPolicy; None: the plan leaves memory be."""
    if plan.memory == "local":
        return {"mode": "MPOL_LOCAL"}
    if plan.memory is None or not plan.memory_nodes:
        return None
    if plan.memory in ("prefer", "socket"):
        mode = "MPOL_PREFERRED" if len(plan.memory_nodes) == 1 else "MPOL_PREFERRED_MANY"
    elif plan.memory in _OCI_MODE:
        mode = _OCI_MODE[plan.memory]
    else:
        return None
    return {"mode": mode, "nodes": _nu.format_cpulist(plan.memory_nodes)}


def _oci_linux(plan: _nu.GpuPlan) -> Dict[str, Any]:
    """The config.json "linux" fragment for one GPU's container: its cpuset and its
    memory policy.  cpuset.mems only for a bind: a cpuset limit would turn a preference
    into a bind and forbid interleave's other nodes."""
    cpu: Dict[str, str] = {"cpus": _nu.format_cpulist(plan.cpus)}
    policy = _oci_memory_policy(plan)
    if policy is not None and policy["mode"] == "MPOL_BIND":
        cpu["mems"] = policy["nodes"]
    linux: Dict[str, Any] = {"resources": {"cpu": cpu}}
    if policy is not None:
        linux["memoryPolicy"] = policy
    return linux


def _render_plan_oci(plans: List[_nu.GpuPlan]) -> List[Dict[str, Any]]:
    return [{"gpu": plan.gpu, "pci": plan.pci, "linux": _oci_linux(plan)} for plan in plans]


# nri-plugins' memory-policy plugin (cmd/plugins/memory-policy): a pod annotation
# policy.memory-policy.nri.io (every container of the pod) or
# policy.memory-policy.nri.io/container.NAME (one container), whose value is YAML with
# mode, nodes (a string: quoted) and optional flags.  The plugin reads a node list
# starting with a digit, so MPOL_LOCAL (no nodes) has no annotation: local allocation
# is what a container gets without one.
_NRI_KEY = "policy.memory-policy.nri.io"


def _render_plan_nri(plans: List[_nu.GpuPlan], one_pod: bool) -> Dict[str, Any]:
    """{"metadata": {"annotations": {...}}}: the pod-level key for one GPU (plan --gpu
    N), else a key per container named gpu-N."""
    annotations: Dict[str, str] = {}
    for plan in plans:
        policy = _oci_memory_policy(plan)
        if policy is None or "nodes" not in policy or plan.gpu is None:
            continue  # MPOL_LOCAL, or a GPU this process cannot see (no CUDA index)
        key = _NRI_KEY if one_pod else f"{_NRI_KEY}/container.gpu-{plan.gpu}"
        annotations[key] = f'mode: {policy["mode"]}\nnodes: "{policy["nodes"]}"\n'
    return {"metadata": {"annotations": annotations}}


# Slurm.  gres.conf's Cores= takes Slurm's logical core indices, not the kernel's CPU
# ids: core 0 is the first core of the first socket, counted as hwloc's lstopo shows
# them (Core L#), so a hyperthreaded machine's CPUs 0-47,96-143 are cores 0-47.
# srun --cpu-bind=mask_cpu:M0,M1,... gives task i the hexadecimal CPU mask Mi.
def _logical_cores(topo: _nu.Topology) -> Dict[int, int]:
    """CPU id -> Slurm's (hwloc's) logical core index.  hwloc orders objects by their
    first CPU: packages by theirs, then the cores of a package by theirs; a CPU whose
    core is unknown counts as a core of its own."""
    cores: Dict[Tuple[int, int, int], List[int]] = {}
    package_first: Dict[int, int] = {}
    for cpu in topo.cpus.values():
        package = -1 if cpu.package is None else cpu.package
        package_first[package] = min(package_first.get(package, cpu.id), cpu.id)
        if cpu.core is None:
            cores[(package, -1, cpu.id)] = [cpu.id]
        else:
            cores.setdefault((package, cpu.core, -1), []).append(cpu.id)

    def hwloc_order(key: Tuple[int, int, int]) -> Tuple[int, int]:
        return package_first[key[0]], min(cores[key])

    index: Dict[int, int] = {}
    for position, key in enumerate(sorted(cores, key=hwloc_order)):
        for cpu_id in cores[key]:
            index[cpu_id] = position
    return index


# nvidia.ko numbers the GPUs /dev/nvidia0 to /dev/nvidia254; minor 255 is /dev/nvidiactl.
_NVIDIA_GPU_MINORS = range(255)


def _nvidia_minor(backend: _nu.Backend, pci: Optional[str]) -> Tuple[Optional[int], str]:
    """(the /dev/nvidiaN minor the NVIDIA driver gave the GPU at ``pci``, ""), or
    (None, why it is unknown)."""
    if pci is None:
        return None, "not NVIDIA's driver"
    text = _read_optional(backend, f"/proc/driver/nvidia/gpus/{pci}/information") or ""
    match = re.search(r"^Device Minor:(.*)$", text, re.MULTILINE)
    if match is None:
        return None, "not NVIDIA's driver"
    word = match.group(1).strip()
    if re.fullmatch("[0-9]{1,3}", word) is None or int(word) not in _NVIDIA_GPU_MINORS:
        shown = _nu.printable(word if len(word) <= 24 else word[:21] + "...")
        return None, f"Device Minor {shown} is not 0-254"
    return int(word), ""


def _render_plan_gres(plans: List[_nu.GpuPlan], backend: _nu.Backend) -> str:
    topo = _nu.read_topology(backend=backend)
    cores = _logical_cores(topo)
    out = []
    for plan in plans:
        minor, unknown = _nvidia_minor(backend, plan.pci)
        core_ids = {cores[cpu] for cpu in plan.cpus if cpu in cores}
        cpus = _nu.format_cpulist(plan.cpus)
        node = "?" if plan.cpu_node is None else plan.cpu_node
        out.append(f"# GPU {plan.gpu} ({plan.pci or '?'}), node {node}, CPUs {cpus}")
        line = f"Name=gpu File=/dev/nvidia{minor} Cores={_nu.format_cpulist(core_ids)}"
        if minor is None:
            out.append(f"# no /dev/nvidiaN minor known for this GPU ({unknown}):")
            line = f"# Name=gpu File=DEVICE Cores={_nu.format_cpulist(core_ids)}"
        out.append(line)
    return "\n".join(out) + ("\n" if out else "")


def _cpu_mask(cpus: Iterable[int]) -> str:
    return hex(sum(1 << cpu for cpu in set(cpus)))


def _render_plan_srun(plans: List[_nu.GpuPlan]) -> str:
    """One srun option line: task i runs on GPU i's CPUs; a bind plan adds
    --mem-bind=map_mem (task i's memory on its one node)."""
    if not plans:
        return ""
    out = [
        f"# task {task}: GPU {plan.gpu} ({plan.pci or '?'}), CPUs {_nu.format_cpulist(plan.cpus)}"
        for task, plan in enumerate(plans)
    ]
    option = "--cpu-bind=mask_cpu:" + ",".join(_cpu_mask(plan.cpus) for plan in plans)
    if all(plan.memory == "bind" and len(plan.memory_nodes) == 1 for plan in plans):
        option += " --mem-bind=map_mem:" + ",".join(str(plan.memory_nodes[0]) for plan in plans)
    out.append(f"--ntasks-per-node={len(plans)} {option}")
    return "\n".join(out) + "\n"


def _render_plan_ray(plans: List[_nu.GpuPlan]) -> Dict[str, int]:
    """Ray custom resources: numa_node_N, the number of GPUs whose workers run on node
    N's CPUs (``ray start --resources=...``; an actor asks for {"numa_node_0": 1})."""
    counts: Dict[str, int] = {}
    for plan in plans:
        if plan.cpu_node is not None:
            name = f"numa_node_{plan.cpu_node}"
            counts[name] = counts.get(name, 0) + 1
    return counts


def _memory_arg(args: argparse.Namespace) -> Dict[str, Any]:
    """memory= when --memory was given; without it the library reads NUMA_MEMORY_POLICY."""
    return {} if args.memory is None else {"memory": args.memory}


def _cli_policy(args: argparse.Namespace) -> str:
    """The CLI binds when asked to: NUMA_BIND_POLICY's default "none" means "node" here."""
    if args.policy is not None:
        return str(args.policy)
    pol = _nu.bind_policy()
    return "node" if pol == "none" else pol


def _cmd_plan(args: argparse.Namespace) -> int:
    b = _nu._root_backend(args.root)
    if args.tree or args.dp is not None or args.tp is not None:
        return _cmd_tree_plan(args, b)
    if args.roles is not None or args.node is not None:
        return _cmd_role_plan(args, b)
    if args.format == "env":
        raise ValueError("--format env is the OpenMP environment of a role plan: add --roles")
    plans = _nu.gpu_plans(
        _cli_policy(args),
        reserve=args.reserve,
        strict=True if args.strict else None,
        backend=b,
        **_memory_arg(args),
    )
    if args.gpu is not None:
        plans = [p for p in plans if p.gpu == args.gpu]
        if not plans:
            raise ValueError(f"no CUDA device {args.gpu} in the plan")
    fmt = args.format or ("json" if args.json else "text")
    if fmt == "json":
        _nu._print_json([p.to_json() for p in plans])
    elif fmt == "systemd":
        sys.stdout.write(_render_plan_systemd(plans, args.unit))
    elif fmt in ("numactl", "taskset"):
        sys.stdout.write(_render_plan_cmd(plans, fmt))
    elif fmt == "oci":
        _nu._print_json(_render_plan_oci(plans))
    elif fmt == "nri":
        _nu._print_json(_render_plan_nri(plans, args.gpu is not None))
    elif fmt == "gres":
        sys.stdout.write(_render_plan_gres(plans, b))
    elif fmt == "srun":
        sys.stdout.write(_render_plan_srun(plans))
    elif fmt == "ray":
        _nu._print_json(_render_plan_ray(plans))
    else:
        sys.stdout.write(_render_plan_text(plans, _cli_policy(args), b.root))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ValueError("no command given: run (--gpu N | --node N) [options] -- CMD ...")
    if getattr(args, "root", None) not in (None, "/"):
        raise ValueError("run binds the running system; --root is for plan and status")
    b = _nu._root_backend(args.root)
    strict = True if args.strict else None
    if args.gpu is not None:
        _nu.cuda_device(args.gpu, backend=b)  # no such device: a usage error, as --node 99
        res = _nu.bind_for_gpu(
            args.gpu,
            _cli_policy(args),
            reserve=args.reserve,
            threads="all",
            strict=strict,
            backend=b,
            **_memory_arg(args),
        )
    else:
        pol = _cli_policy(args)
        if pol not in ("node", "none"):
            raise ValueError(
                f"--node takes --policy node or none, not {pol!r} (the GPU policies need --gpu)"
            )
        res = _nu.bind_to_node(
            _single_node(args.node, b),
            cpus=pol != "none",
            threads="all",
            strict=strict,
            backend=b,
            **_memory_arg(args),
        )
    if args.json:
        import json

        sys.stderr.write(json.dumps(res.to_json()) + "\n")
    elif not res:
        what = []
        if not res.cpus_applied and res.cpu_reason != "not requested":
            what.append(f"CPU binding ({res.cpu_reason})")
        if res.memory is not None and not res.memory.applied:
            what.append(f"memory policy ({res.memory.reason})")
        sys.stderr.write(
            f"numa_utils run: not applied: {', '.join(what)}; running the command anyway\n"
        )
    e = _exec(cmd)
    sys.stderr.write(f"numa_utils run: cannot run {cmd[0]!r}: {e.strerror or e}\n")
    return 127 if isinstance(e, FileNotFoundError) else 126


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy",
        choices=_nu.BIND_POLICIES + ("none",),
        default=None,
        help="CPU policy (default: NUMA_UTILS_NUMA_BIND_POLICY, else node)",
    )
    p.add_argument(
        "--reserve",
        type=int,
        default=None,
        metavar="N",
        help="physical cores per node left for the OS "
        "(default: NUMA_UTILS_NUMA_RESERVED_CORES, else 0)",
    )
    p.add_argument(
        "--memory",
        choices=_nu.MEMORY_WORDS,
        default=None,
        metavar="MODE",
        help="memory policy: prefer, bind, interleave, weighted-interleave, local, socket, "
        "none, or any mode word a result reports "
        "(default: NUMA_UTILS_NUMA_MEMORY_POLICY, else prefer)",
    )
    p.add_argument("--strict", action="store_true", help="fail instead of falling back")


def _cli_plan(sub: Any) -> None:
    p = sub.add_parser("plan", parents=[sub.common], help="per-GPU CPU and memory plan")
    _add_plan_options(p)
    p.add_argument("--gpu", type=int, default=None, metavar="N", help="only CUDA device N")
    p.add_argument(
        "--node", type=int, default=None, metavar="N", help="CPU roles on node N (no GPU)"
    )
    p.add_argument(
        "--roles",
        default=None,
        metavar="ROLE=N,...",
        help="CPUs per thread role, whole cores each: feeder=1,copy=1,compute=rest "
        "(the GPU's exclusive share; --policy and --memory do not apply)",
    )
    p.add_argument(
        "--smt",
        choices=_nut.SMT_RULES,
        default="core",
        help="whole cores per role, or one CPU each",
    )
    p.add_argument(
        "--format",
        choices=["text", "json", "systemd", "numactl", "taskset", "env", *_FLEET_FORMATS],
        default=None,
        help="output format (default text; --json is --format json; env: a role plan's "
        "OpenMP variables)",
    )
    p.add_argument(
        "--unit",
        default="worker@.service",
        metavar="NAME",
        help="template unit named in --format systemd headers",
    )
    p.add_argument(
        "--tree",
        action="store_true",
        help="an engine's process tree: --dp groups of --tp workers, an engine core above "
        "each (text or json)",
    )
    p.add_argument("--dp", type=int, default=None, metavar="N", help="--tree groups (default 1)")
    p.add_argument(
        "--tp", type=int, default=None, metavar="N", help="--tree workers per group (default 1)"
    )
    p.set_defaults(func=_cmd_plan)


def _cli_run(sub: Any) -> None:
    import argparse

    # run binds the running system: no --root among its options.
    p = sub.add_parser(
        "run",
        parents=[sub.common_live],
        help="bind to a GPU's or node's CPUs and memory, then exec CMD",
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "--gpu",
        type=int,
        metavar="N",
        help="CUDA device N (as this environment's CUDA_VISIBLE_DEVICES numbers it)",
    )
    g.add_argument(
        "--node",
        metavar="N",
        help="NUMA node N: a node id, or +N counted within the cpuset",
    )
    p.add_argument("--root", default=None, help=argparse.SUPPRESS)  # refused, unlisted
    _add_plan_options(p)
    p.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ARGS",
        help="the command, executed without a shell",
    )
    p.set_defaults(func=_cmd_run)


def watch(
    *,
    interval: float = 1.0,
    count: Optional[int] = None,
    pid: Optional[Union[int, str]] = None,
    threshold: Optional[float] = None,
    backend: Optional[_nu.Backend] = None,
    sleep: Optional[Callable[[float], None]] = None,
) -> Iterator[Dict[str, Any]]:
    """Yield one sample per ``interval`` seconds (``count`` samples, or forever):
    per-node numastat changes over the interval, free memory, and for ``pid`` its
    bytes per node and remote share (``RemoteShare.to_json()``; ``threshold`` None:
    numa_utils_threads.REMOTE_SHARE_THRESHOLD).  JSON-ready dicts."""
    import time

    b = backend if backend is not None else _nu.default_backend()
    pause = sleep if sleep is not None else time.sleep
    topo = _nu.read_topology(backend=b)
    before = _nur.counters(backend=b)
    i = 0
    while count is None or i < count:
        pause(max(interval, 0.0))
        after = _nur.counters(backend=b)
        delta = after - before
        rows = []
        for c in after:
            d = delta.nodes.get(c.node)
            row: Dict[str, Any] = {"node": c.node}
            for k in _nur.NUMASTAT_FIELDS:
                row[k] = d.numastat.get(k) if d is not None else None
            row.update(
                mem_total_kb=c.mem_total_kb, mem_free_kb=c.mem_free_kb, available_kb=c.available_kb
            )
            rows.append(row)
        sample: Dict[str, Any] = {
            "time": after.timestamp,
            "seconds": delta.seconds,
            "nodes": rows,
            "remote_ratio": delta.remote_ratio,
        }
        if pid is not None:
            limit = _nut.REMOTE_SHARE_THRESHOLD if threshold is None else threshold
            sample["process"] = _nut.remote_share(
                pid, threshold=limit, topology=topo, backend=b
            ).to_json()
        yield sample
        before = after
        i += 1


def _render_watch(sample: Dict[str, Any], first: bool) -> str:
    import time

    out = []
    stamp = time.strftime("%H:%M:%S", time.localtime(sample["time"]))
    secs = sample["seconds"] or 0.0
    proc = sample.get("process")
    head = (
        f"{'node':>5} {'hit':>10} {'miss':>8} {'foreign':>8} {'interlv':>8} "
        f"{'local':>10} {'other':>8} {'free':>11} {'available':>11}"
    )
    if proc is not None:
        head += f" {'pid mem':>11} {'pid %':>6}"
    if first:
        out.append(f"numastat changes per interval, in pages; memory now ({stamp})")
        out.append(head)
    else:
        out.append(f"-- {stamp} (+{secs:.2f}s)")
    total = proc["total_bytes"] if proc else 0
    for r in sample["nodes"]:
        v = {k: "-" if r[k] is None else str(r[k]) for k in _nur.NUMASTAT_FIELDS}
        line = (
            f"{r['node']:>5} {v['numa_hit']:>10} {v['numa_miss']:>8} "
            f"{v['numa_foreign']:>8} {v['interleave_hit']:>8} {v['local_node']:>10} "
            f"{v['other_node']:>8} {_nu.format_kib(r['mem_free_kb']):>11} "
            f"{_nu.format_kib(r['available_kb']):>11}"
        )
        if proc is not None:
            nb = proc["bytes_by_node"].get(str(r["node"]), 0)
            pct = f"{100.0 * nb / total:.1f}" if total else "-"
            line += f" {_nu.format_kib(nb // 1024):>11} {pct:>6}"
        out.append(line)
    if proc is not None:
        if proc["error"]:
            out.append(f"  pid {proc['pid']}: {proc['error']}")
        else:
            flag = "  ABOVE THRESHOLD" if proc["over_threshold"] else ""
            out.append(
                f"  pid {proc['pid']}: {_nu.format_kib(total // 1024)} mapped, "
                f"{100.0 * proc['remote_share']:.1f}% remote (CPUs "
                f"{_nu.format_cpulist(proc['cpus']) or '-'} -> local memory "
                f"nodes {_nu.format_cpulist(proc['local_nodes']) or '-'}){flag}"
            )
    return "\n".join(out) + "\n"


def _cmd_watch(args: argparse.Namespace) -> int:
    import json

    b = _nu._root_backend(args.root)
    pid: Optional[Union[int, str]] = args.pid
    if args.pid is not None and args.pid != "self":
        text = str(args.pid)
        if not (text.isascii() and text.isdigit() and 0 < len(text) <= 10 and int(text)):
            raise ValueError(f"--pid {text[:40]!r}: a process id (a positive number) or 'self'")
        pid = int(text)
        if not b.exists(f"/proc/{pid}"):
            raise ValueError(f"--pid {pid}: no such process")
    for i, sample in enumerate(watch(interval=args.interval, count=args.count, pid=pid, backend=b)):
        if args.json:
            sys.stdout.write(json.dumps(sample, sort_keys=False) + "\n")
        else:
            sys.stdout.write(_render_watch(sample, i == 0))
        sys.stdout.flush()
    return 0


def _positive_float(text: str) -> float:
    import argparse

    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not 0 < v <= 86400:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds in (0, 86400], not {text[:40]!r}"
        )
    return v


def _positive_int(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < len(text) <= 18 and int(text)):
        import argparse

        raise argparse.ArgumentTypeError(f"must be a whole number > 0, not {text[:40]!r}")
    return int(text)


def _cli_watch(sub: Any) -> None:
    p = sub.add_parser(
        "watch",
        parents=[sub.common],
        help="live per-node allocation counters, free memory, and a process's pages per node",
    )
    p.add_argument(
        "--interval",
        type=_positive_float,
        default=1.0,
        metavar="S",
        help="seconds between samples (default 1)",
    )
    p.add_argument(
        "--count",
        type=_positive_int,
        default=None,
        metavar="N",
        help="stop after N samples (default: until interrupted)",
    )
    p.add_argument(
        "--pid",
        default=None,
        metavar="PID",
        help="also show this process's pages per node and remote share ('self' for this process)",
    )
    p.set_defaults(func=_cmd_watch)


# ---------------------------------------------------------------------------
# fit: the command (python -m numa_utils fit 64G --nodes 0-1 --huge 2M).
# ---------------------------------------------------------------------------


def _cmd_fit(args: argparse.Namespace) -> int:
    b = _nu._root_backend(args.root)
    r = _nur.fit(
        _nu.parse_size(args.size),
        nodes=_nu.parse_nodestring(args.nodes, backend=b) if args.nodes else None,
        policy=args.policy,
        hugepages=args.huge or False,
        kind=args.kind,
        pin=args.pin,
        backend=b,
        layout=args.layout,
    )
    if args.json:
        _nu._print_json(r.to_json())
        return 0 if r else 1
    print(("fits: " if r else "does not fit: ") + r.reason)
    for n in r.nodes:
        huge = ", ".join(
            f"{kb} kB: {h.free}/{h.total} free" for kb, h in n.hugepages.items() if h.total
        )
        print(
            f"  node {n.node}: needs {_nu.format_kib(n.needed >> 10)}, has "
            f"{_nu.format_kib(n.available >> 10)}" + (f" (huge pages {huge})" if huge else "")
        )
    for x in r.limits:
        print(
            f"  {x.name}: allows "
            + (_nu.format_kib(max(x.allows, 0) >> 10) if x.allows is not None else "?")
            + f" ({x.source})"
        )
    print("  THP: " + ", ".join(f"{k} [{v}]" for k, v in r.thp.items()))
    free = "?" if r.vmas_free is None else r.vmas_free
    print(f"  memory mappings (VMAs): needs {r.vmas}, vm.max_map_count leaves {free}")
    print(f"  placed by: {r.placed_by}")
    return 0 if r else 1


def _cli_fit(sub: Any) -> None:
    p = sub.add_parser(
        "fit",
        parents=[sub.common],
        help="would a region of SIZE fit? (exit 0: yes, 1: no, with the limit and the fix)",
    )
    p.add_argument("size", metavar="SIZE", help="bytes (64G, 512M, ...)")
    p.add_argument("--nodes", default=None, help="memory nodes (numactl grammar)")
    p.add_argument("--policy", default="interleave", choices=sorted(_nu.MODE_NAMES))
    p.add_argument("--huge", default=None, help="huge pages: 2M, 1G, thp")
    p.add_argument("--kind", choices=("sysv", "posix"), default="sysv")
    p.add_argument("--pin", action="store_true", help="also pinned with pin_for_cuda")
    p.add_argument(
        "--layout",
        default=None,
        metavar="TEXT",
        help="a policy per extent, as region --layout (instead of --nodes/--policy)",
    )
    p.set_defaults(func=_cmd_fit)


# ---------------------------------------------------------------------------
# status --format prometheus: node_exporter textfile-collector format
# (https://prometheus.io/docs/instrumenting/exposition_formats/).
# ---------------------------------------------------------------------------


def _prom_escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _PromWriter:
    """Collects samples per family, then writes HELP/TYPE and each family's samples
    together (the format wants a family in one block) with no duplicate series."""

    def __init__(self) -> None:
        self.families: Dict[str, Tuple[str, str, Dict[str, str]]] = {}

    def add(self, name: str, kind: str, help_: str, value: Any, **labels: Any) -> None:
        if value is None:
            return
        fam = self.families.setdefault(name, (kind, help_, {}))
        lab = ",".join(f'{k}="{_prom_escape(v)}"' for k, v in labels.items())
        series = f"{name}{{{lab}}}" if lab else name
        if isinstance(value, bool):
            value = int(value)
        fam[2][series] = repr(float(value)) if isinstance(value, float) else str(int(value))

    def text(self) -> str:
        out = []
        for name, (kind, help_, samples) in self.families.items():
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{s} {v}" for s, v in samples.items())
        return "\n".join(out) + "\n"


def _render_prometheus(rep: Dict[str, Any]) -> str:
    w = _PromWriter()
    k = rep["kernel"]
    w.add(
        "numa_utils_info",
        "gauge",
        "numa_utils version and ABI (value is 1).",
        1,
        version=rep["version"],
        abi=k["abi"],
        page_size=k["page_size"],
    )
    w.add(
        "numa_utils_numa_kernel",
        "gauge",
        "1 when the kernel has NUMA support (a node directory in sysfs).",
        k["numa"],
    )
    for n in rep["nodes"]:
        node = str(n["id"])
        w.add(
            "numa_utils_node_cpus",
            "gauge",
            "Number of CPUs on the node.",
            len(n["cpus"]),
            node=node,
        )
        w.add(
            "numa_utils_node_memory_total_bytes",
            "gauge",
            "MemTotal of the node.",
            n["mem_total_kb"] * 1024,
            node=node,
        )
        w.add(
            "numa_utils_node_memory_free_bytes",
            "gauge",
            "MemFree of the node.",
            n["mem_free_kb"] * 1024,
            node=node,
        )
        for to, d in n["distances"].items():
            w.add(
                "numa_utils_node_distance",
                "gauge",
                "SLIT distance from node to node (10 is local).",
                d,
                node=node,
                to=to,
            )
        for sz, h in n["hugepages"].items():
            w.add(
                "numa_utils_node_hugepages",
                "gauge",
                "Persistent huge pages configured on the node.",
                h["total"],
                node=node,
                size_kb=sz,
            )
            w.add(
                "numa_utils_node_hugepages_free",
                "gauge",
                "Free persistent huge pages on the node.",
                h["free"],
                node=node,
                size_kb=sz,
            )
    for c in rep.get("counters", {}).get("nodes", []):
        node = str(c["node"])
        w.add(
            "numa_utils_node_memory_available_bytes",
            "gauge",
            "MemFree plus reclaimable file pages of the node.",
            c["available_kb"] * 1024,
            node=node,
        )
        for f in _nur.NUMASTAT_FIELDS:
            w.add(
                f"numa_utils_node_{f}_pages_total",
                "counter",
                f"numastat {f} of the node, in pages, since boot.",
                c.get(f),
                node=node,
            )
    p = rep["process"]
    usable = p.get("policy") is not None
    w.add(
        "numa_utils_policy_syscalls_usable",
        "gauge",
        "1 when memory policy syscalls work for this process; reason says why not.",
        usable,
        reason="ok" if usable else (p.get("policy_error") or "unknown"),
    )
    w.add(
        "numa_utils_abi_supported",
        "gauge",
        "1 when numa_utils has a syscall table for this ABI.",
        k["syscalls"] is not None,
        abi=k["abi"],
    )
    w.add(
        "numa_utils_numa_balancing",
        "gauge",
        "kernel.numa_balancing (0 off, 1 on, 2 memory tiering).",
        k["numa_balancing"],
    )
    if k["thp"]:
        w.add(
            "numa_utils_thp_enabled",
            "gauge",
            "Transparent huge pages mode in use (value is 1).",
            1,
            mode=k["thp"],
        )
    w.add(
        "numa_utils_process_allowed_cpus",
        "gauge",
        "CPUs this process's cpuset allows.",
        len(p["allowed_cpus"]),
    )
    w.add(
        "numa_utils_process_allowed_memory_nodes",
        "gauge",
        "Memory nodes this process's cpuset allows.",
        len(p["allowed_mems"]),
    )
    rs = p.get("remote_share")
    if rs and not rs.get("error"):
        w.add(
            "numa_utils_process_remote_pages_ratio",
            "gauge",
            "Share of this process's pages off its CPUs' nodes.",
            float(rs["remote_share"]),
        )
    for g in rep["gpus"]:
        w.add(
            "numa_utils_gpu_info",
            "gauge",
            "A GPU and its NUMA node (value is 1).",
            1,
            address=g["address"],
            vendor=g["vendor_name"],
            device=g["device"],
            node="" if g["node"] is None else str(g["node"]),
            node_source=g["node_source"],
        )
        w.add(
            "numa_utils_gpu_numa_node",
            "gauge",
            "NUMA node of the GPU (-1 when unknown).",
            -1 if g["node"] is None else g["node"],
            address=g["address"],
        )
    w.add(
        "numa_utils_warnings",
        "gauge",
        "Number of warnings in the status report.",
        len(rep["warnings"]),
    )
    return w.text()


def _single_node(text: str, b: _nu.Backend) -> int:
    """A node option that takes one node (``run --node``) in numactl's grammar."""
    nodes = _nu.parse_nodestring(str(text), backend=b)
    if len(nodes) != 1:
        raise ValueError(f"{text!r} is {len(nodes)} nodes, not one")
    return next(iter(nodes))


# getopt table: numactl's long options, the short letter each stands for, and whether
# it takes an argument ("=").  --fallback is ours (run's fall-back, see below).
_NUMACTL_OPTS = MappingProxyType(
    {
        "all": "a",
        "interleave=": "i",
        "weighted-interleave=": "w",
        "preferred=": "p",
        "preferred-many=": "P",
        "cpubind=": "c",
        "cpunodebind=": "N",
        "physcpubind=": "C",
        "membind=": "m",
        "show": "s",
        "localalloc": "l",
        "balancing": "b",
        "hardware": "H",
        "shm=": "S",
        "file=": "f",
        "offset=": "o",
        "length=": "L",
        "strict": "t",
        "shmmode=": "M",
        "dump": "d",
        "dump-nodes": "D",
        "shmid=": "I",
        "huge": "u",
        "touch": "T",
        "verify": "V",
        "fallback": "F",
    }
)
# numactl's policy_name(): the mode value get_mempolicy returns, flags included.
_NUMACTL_POLICY = (
    "default",
    "preferred",
    "bind",
    "interleave",
    "local",
    "preferred-many",
    "weighted interleave",
)
_NUMACTL_USAGE = """\
usage: numactl [--all | -a] [--balancing | -b]
               [--interleave= | -i <nodes>] [--weighted-interleave= | -w <nodes>]
               [--preferred= | -p <node>] [--preferred-many= | -P <nodes>]
               [--physcpubind= | -C <cpus>] [--cpunodebind= | -N <nodes>]
               [--membind= | -m <nodes>] [--localalloc | -l] [--fallback] command args ...
       numactl [--show | -s]
       numactl [--hardware | -H]
       numactl [--length | -L <length>] [--offset | -o <offset>] [--shmmode | -M <shmmode>]
               [--strict | -t] [--shmid | -I <id>] --shm | -S <shmkeyfile>
               [--shmid | -I <id>] --file | -f <tmpfsfile>
               [--huge | -u] [--touch | -T] memory policy
(numa_utils's numactl: numactl 2.0.19's options; <nodes>: N,N-N, all, !<nodes>,
+<nodes> (cpuset-relative), netdev:DEV, block:DEV, file:PATH, pci:[SEG:]BUS:DEV[.FN],
ip:HOST; <cpus> likewise without the device forms; <length> takes k/m/g suffixes;
--fallback runs the command even where the system denies the policy.)
"""


class _NumactlExit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _numactl_version() -> Tuple[int, ...]:
    """The numactl release whose behaviour to copy: NUMA_UTILS_NUMACTL_VERSION
    (e.g. 2.0.16: no -w), else 2.0.19."""
    try:
        return tuple(
            int(x) for x in os.environ.get("NUMA_UTILS_NUMACTL_VERSION", "2.0.19").split(".")
        )
    except ValueError:
        return (2, 0, 19)


def _numactl_mask(name: str, ids: Iterable[int]) -> str:
    return f"{name}: " + "".join(f"{i} " for i in sorted(ids)) + "\n"


def _numactl_show(b: _nu.Backend, t: _nu.Topology) -> Tuple[str, int]:
    """numactl --show's text, from this process's policy and affinity."""
    aff = b.call("sched_getaffinity", 0)
    try:
        pol, nodes = _nu.get_mempolicy(backend=b)
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EPERM):
            return (
                _numactl_mask("physcpubind", aff) + "No NUMA support available on this system.\n"
            ), 1
        pol, nodes = 0, frozenset()
    try:
        cur = _nu.get_mempolicy(flags=_nu.GetFlag.NODE, backend=b)[0]
    except OSError:
        cur = 0
    membind = nodes if pol == _nu.Mode.BIND else t.allowed_mems
    pref = {
        int(_nu.Mode.PREFERRED): f"{min(nodes, default=0)}\n",
        _nu.Mode.DEFAULT: "current\n",
        _nu.Mode.INTERLEAVE: f"{cur} (interleave next)\n",
        _nu.Mode.BIND: f"{min(membind, default=-1)}\n",
        _nu.Mode.PREFERRED_MANY: f"{cur} (preferred-many)\n",
    }.get(pol, "")
    out = [
        f"policy: {_NUMACTL_POLICY[pol] if 0 <= pol < len(_NUMACTL_POLICY) else f'[{pol}]'}"
        f"\npreferred node: {pref}"
    ]
    if pol == _nu.Mode.INTERLEAVE:
        out.append(_numactl_mask("interleavemask", nodes) + f"interleavenode: {cur}\n")
    run_nodes = [n for n in sorted(t.allowed_mems) if n in t.nodes and t.nodes[n].cpus & aff]
    out += [
        _numactl_mask("physcpubind", aff),
        _numactl_mask("cpubind", run_nodes),
        _numactl_mask("nodebind", run_nodes),
        _numactl_mask("membind", membind),
        _numactl_mask("preferred", nodes),
    ]
    return "".join(out), 0


def _numactl_hardware(t: _nu.Topology) -> str:
    """numactl --hardware's text.  The distance table is print_distances()'s
    printf("% 3d ") (numactl.c): a blank, then at least 3 columns in all."""
    ids = sorted(t.nodes)
    out = [f"available: {len(ids)} nodes ({_nu.format_cpulist(ids)})\n"]
    for n in ids:
        node = t.nodes[n]
        out.append(f"node {n} cpus:" + "".join(f" {c}" for c in sorted(node.cpus)) + "\n")
        out.append(
            f"node {n} size: {node.mem_total_kb >> 10} MB\n"
            f"node {n} free: {node.mem_free_kb >> 10} MB\n"
        )
    if not ids or not t.distance(ids[-1], ids[0]):
        return "".join(out) + "No distance information available.\n"

    def c(v: int) -> str:
        return f" {v}".rjust(3)

    out.append("node distances:\nnode " + "".join(f"{c(i)} " for i in ids) + "\n")
    for i in ids:
        out.append(f"{c(i)}: " + "".join(f"{c(t.distance(i, k) or 0)} " for k in ids) + "\n")
    return "".join(out)


def _memsize(text: str) -> int:
    """numactl's memsize(): strtoul base 0, then an optional k/m/g (anything else ignored)."""
    v, end = _nu._strtoul(text, 0)
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[end : end + 1].upper(), 1)
    return (v or 0) * mult % (1 << 64)  # C's unsigned long


def _cmd_numactl(
    argv: Sequence[str],
    *,
    backend: Optional[_nu.Backend] = None,
    execvp: Callable[[str, List[str]], Any] = os.execvp,
) -> int:
    """``numa_utils numactl ARGS``: numactl's options parsed left to right with
    getopt (stopping at the command), applied as numactl applies them, then exec."""
    try:
        return _Numactl(backend if backend is not None else _nu.default_backend()).run(
            list(argv), execvp
        )
    except _NumactlExit as e:
        return e.code


class _Numactl:
    """numactl's main(): its options applied in order, with the state they leave for
    the options after them (a policy set, --all, --shm's region, the shm options)."""

    def __init__(self, b: _nu.Backend) -> None:
        self.b, self.out, self.err = b, sys.stdout, sys.stderr
        self.ver = _numactl_version()
        self.fallback = False  # --fallback: run the command despite failures
        self.topo: Optional[_nu.Topology] = None
        self.mode: Optional[int] = None  # the memory policy an option set
        self.task: Optional[Tuple[int, FrozenSet[int], int]] = None  # set_mempolicy's
        self.all = self.parsed = self.cpubind = self.balancing = False
        self.strict = self.hardware = self.huge = False
        self.shmopt = ""  # the last of --length/--offset/--shmmode/--huge
        self.length = self.offset = self.shmid = 0
        self.shmmode = 0o600
        self.shm: Optional[Tuple[int, int]] = None  # --shm/--file: address, length

    def usage(self, msg: str = "") -> None:
        if msg:
            self.err.write(f"numactl: {msg}")
            self.out.write("\n")  # numactl's usage_msg ends the line on stdout
            self.out.flush()
        self.err.write(_NUMACTL_USAGE)
        raise _NumactlExit(1)

    def complain(self, msg: str) -> None:
        self.err.write(f"numactl: {msg}\n")
        raise _NumactlExit(1)

    def tp(self) -> _nu.Topology:
        if self.topo is None:
            self.topo = _nu.read_topology(backend=self.b)
        return self.topo

    def available(self) -> bool:
        try:
            _nu.get_mempolicy(backend=self.b)
        except OSError as e:
            return e.errno not in (errno.ENOSYS, errno.EPERM)
        return True

    def checknuma(self) -> None:
        if not self.fallback and not self.available():
            self.complain("This system does not support NUMA policy")

    def setpolicy(self, mode: int) -> None:
        if self.mode is not None:
            self.usage("Conflicting policies")
        self.mode = mode

    def nopolicy(self) -> None:
        if self.mode is not None:
            self.usage("specify policy after --shm/--file")

    def nodes(self, arg: str, cpus: bool = False) -> FrozenSet[int]:
        try:
            got = _nu.parse_nodestring(
                arg,
                cpus=cpus,
                possible=self.all,
                backend=self.b,
                topology=self.tp(),
                devices=_device_node,
            )
        except ValueError as e:
            warn = getattr(e, "warn", f"{e}\n")
            if warn:
                self.err.write(f"libnuma: Warning: {warn}\n")
            self.out.write(f"<{arg}> is invalid\n")
            self.out.flush()
            self.usage()
            raise
        self.parsed = True
        return got

    def call(self, what: str, fn: Callable[[], Any], libnuma: str = "") -> None:
        """Apply; on failure print libnuma's and numactl's perror lines and exit 1,
        or with --fallback warn and go on."""
        try:
            fn()
        except OSError as e:
            text = os.strerror(e.errno or errno.EIO)
            if self.fallback:
                self.err.write(
                    f"numactl: warning: {what}: {text}; running the command "
                    "without it (--fallback)\n"
                )
                return
            if libnuma:
                self.err.write(f"{libnuma}: {text}\n")
            self.err.write(f"{what}: {text}\n")
            if e.errno == errno.EPERM:
                self.err.write(
                    "numactl: the system denies NUMA policy here (a container "
                    "without CAP_SYS_NICE, or seccomp); --fallback runs the "
                    "command anyway\n"
                )
            raise _NumactlExit(1) from None

    def policy(self, mode: int, mask: FrozenSet[int], what: str, flags: int = 0) -> None:
        """The process policy, or with --shm/--file the region's (mbind; --strict)."""
        b, shm = self.b, self.shm
        if shm is None:
            self.call(
                what,
                lambda: _nu.set_mempolicy(mode, mask, mode_flags=flags, backend=b),
                "set_mempolicy",
            )
            self.task = (mode, mask, flags)
        else:
            addr, size = shm
            self.call(
                what,
                lambda: _nu.mbind(
                    addr, size, mode, mask, _nu.MbindFlag.STRICT if self.strict else 0, backend=b
                ),
                "mbind",
            )

    def setaffinity(self, cpus: FrozenSet[int], libnuma: str = "") -> None:
        self.cpubind = True
        self.call("sched_setaffinity", lambda: self.b.call("sched_setaffinity", 0, cpus), libnuma)

    def run(self, argv: List[str], execvp: Callable[[str, List[str]], Any]) -> int:
        import getopt

        opts = dict(_NUMACTL_OPTS)
        if self.ver < (2, 0, 19):
            del opts["weighted-interleave="]
        short = "".join(v + (":" if k.endswith("=") else "") for k, v in opts.items() if v != "F")
        try:
            parsed, cmd = getopt.getopt(argv, short, list(opts))
        except getopt.GetoptError as e:
            o = e.opt
            if e.msg.endswith("not a unique prefix"):
                self.err.write(f"numactl: option '--{o}' is ambiguous\n")
            elif len(o) == 1:
                self.err.write(
                    f"numactl: option requires an argument -- '{o}'\n"
                    if "requires" in e.msg
                    else f"numactl: invalid option -- '{o}'\n"
                )
            elif "requires" in e.msg:
                self.err.write(f"numactl: option '--{o}' requires an argument\n")
            elif "must not have" in e.msg:
                self.err.write(f"numactl: option '--{o}' doesn't allow an argument\n")
            else:
                self.err.write(f"numactl: unrecognized option '--{o}'\n")
            self.usage()
        letter = {"--" + k.rstrip("="): v for k, v in opts.items()}
        self.fallback = ("--fallback", "") in parsed
        for opt, arg in parsed:
            c = letter[opt] if opt.startswith("--") else opt[1]
            if c == "s":
                text, rc = _numactl_show(self.b, self.tp())
                self.out.write(text)
                return rc
            if c == "H" and self.ver < (2, 0, 19):  # 2.0.16 prints at once, 2.0.19 last
                self.option(c, opt, arg)
                break
            self.option(c, opt, arg)
        if self.hardware:
            if not self.available():
                self.out.write("No NUMA available on this system\n")
                return 1
            self.out.write(_numactl_hardware(self.tp()))
            return 0
        if self.shm is not None:
            if cmd:
                self.usage()
            return 0
        if self.strict:
            self.err.write("numactl: warning. Strict flag for process ignored.\n")
        if self.shmopt:
            self.usage(f"shm related option {self.shmopt} for process")
        if not cmd:
            self.usage()
        if self.task and self.task[0] in (_nu.Mode.INTERLEAVE, _nu.Mode.WEIGHTED_INTERLEAVE):
            # Setting the policy again restarts the interleave cursor (il_prev): what
            # Python allocated since would move the child's "interleave next" (which
            # still moves with every page faulted before it asks, ASLR included).
            try:
                _nu.set_mempolicy(self.task[0], self.task[1], backend=self.b)
            except OSError:
                pass
        failed = _exec(cmd, execvp)
        self.complain(f"execution of `{cmd[0]}': {failed.strerror or failed}\n")
        return 1

    def option(self, c: str, opt: str, arg: str) -> None:
        """One option, by its short letter."""
        shm = self.shm
        if c == "H":
            self.nopolicy()
            self.hardware = True
        elif c == "b":
            self.nopolicy()
            self.balancing = True
        elif c in "wi":
            self.checknuma()
            mask = self.nodes(arg)
            mode = _nu.Mode.WEIGHTED_INTERLEAVE if c == "w" else _nu.Mode.INTERLEAVE
            self.setpolicy(mode)
            self.policy(
                _nu.Mode.INTERLEAVE if shm else mode if mask else _nu.Mode.DEFAULT,
                mask,
                "setting interleave mask",
            )
        elif c in "NcC":
            if self.shmopt:
                self.usage(
                    f"{self.shmopt} shm option is not allowed before "
                    + ("-C/--physcpubind" if c == "C" else "-c/--cpubind/--cpunodebind")
                )
            if c == "C":
                self.setaffinity(self.nodes(arg, cpus=True))
                return
            self.checknuma()
            mask = self.nodes(arg)
            t = self.tp()
            self.setaffinity(
                frozenset(x for n in mask if n in t.nodes for x in t.nodes[n].cpus),
                "numa_sched_setaffinity_v2_int() failed",
            )
        elif c == "m":
            self.checknuma()
            self.setpolicy(_nu.Mode.BIND)
            mask = self.nodes(arg)
            flags = _nu.ModeFlag.NUMA_BALANCING if self.balancing and not shm else 0
            try:
                if flags:  # numa_set_membind_balancing: plain bind where unsupported
                    _nu.set_mempolicy(_nu.Mode.BIND, mask, mode_flags=flags, backend=self.b)
                    self.task = (_nu.Mode.BIND, mask, flags)
                    return
            except OSError as e:
                if e.errno == errno.EINVAL:  # the kernel predates the flag
                    flags = 0
            self.policy(_nu.Mode.BIND, mask, "setting membind", flags)
        elif c in "pP":
            self.checknuma()
            mask = self.nodes(arg)
            if shm:  # libnuma's numa_tonode_memory passes preferred-many an
                self.setpolicy(_nu.Mode.PREFERRED_MANY)  # empty mask: EINVAL (2.0.16, kept)
                self.policy(_nu.Mode.PREFERRED_MANY, frozenset(), "setting preferred node")
            elif c == "p":
                if len(mask) != 1:
                    self.usage()
                self.setpolicy(_nu.Mode.PREFERRED)
                self.policy(_nu.Mode.PREFERRED, mask, "setting preferred node")
            else:
                self.setpolicy(_nu.Mode.PREFERRED_MANY)
                try:
                    _nu.set_mempolicy(_nu.Mode.PREFERRED_MANY, mask, backend=self.b)
                except OSError as e:
                    if e.errno == errno.EINVAL and mask and not self.fallback:
                        self.complain("preferred-many requested without kernel support")
                    self.policy(_nu.Mode.PREFERRED_MANY, mask, "setting preferred node")
        elif c == "l":
            self.checknuma()
            self.setpolicy(_nu.Mode.LOCAL)
            self.policy(_nu.Mode.LOCAL, frozenset(), "local allocation")
        elif c == "a":
            if self.parsed:
                self.usage("--all/-a option must be before all cpu/node specifications")
            self.all = True
        elif c == "t":
            self.strict = True
        elif c in "LoMu":
            name = {"L": "--length", "o": "--offset", "M": "--shmmode", "u": "--huge"}[c]
            if shm:
                self.usage(f"{name} must be before shared memory specification")
            self.shmopt = name
            if c == "M":
                if not re.fullmatch(r"[0-7]+", arg):
                    self.usage()
                self.shmmode = int(arg, 8)
            elif c == "L":
                self.length = _memsize(arg)
            elif c == "o":
                self.offset = _memsize(arg)
            else:
                self.huge = True
        elif c == "I":
            v, end = _nu._strtoul(arg, 0)
            if v is None or end != len(arg):
                self.usage()
            self.shmid = v or 0
        elif c in "dD":
            self.complain(
                f"Cannot do {opt} without shared memory.\n"
                if not shm
                else f"{opt} is not implemented by numa_utils numactl: "
                "`numa_utils maps PID` shows the placement"
            )
        elif c in "TV":
            if not shm:
                self.usage(
                    f"{'--touch' if c == 'T' else '--verify'} must be after shared "
                    "memory specification"
                )
            elif c == "T":
                self.b.touch(shm[0], shm[1])
        elif c in "Sf":
            if self.cpubind:
                self.usage("cannot do --cpubind on shared memory\n")
            self.nopolicy()
            self.shm = self.region(*(self.attach_sysv(arg) if c == "S" else self.attach_file(arg)))

    def attach_sysv(self, name: str) -> Tuple[int, int]:
        """numactl --shm KEYFILE: the SysV segment keyed by ftok(KEYFILE, --shmid),
        created with --length when missing.  The region stays after exit."""

        def ftok() -> int:  # ftok(3); numactl takes a key with bit 31 for a failure
            fst = os.stat(name)
            key = (fst.st_ino & 0xFFFF) | ((fst.st_dev & 0xFF) << 16) | ((self.shmid & 0xFF) << 24)
            if key >> 31:
                raise OSError(0, "")
            return key

        try:
            key = ftok()
        except OSError as e:
            self.err.write(f"numactl: Creating shm key file {name} mode {self.shmmode:04o}\n")
            try:
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.shmmode))
            except OSError as e2:
                self.complain(f"cannot create key for shm {name}\n: {e2.strerror}")
            try:
                key = ftok()
            except OSError:  # numactl's nerror() appends the first ftok's errno
                self.complain(
                    f"cannot get key for newly created shm key file {name}"
                    + (f": {e.strerror}" if e.errno else "")
                )
        # numactl's segments, as numactl makes them: `length` bytes, no identity
        # record (SharedRegion's would make them larger than asked).
        b = self.b
        try:
            shmid = b.call("shmget", key, 0, 0)
        except FileNotFoundError:
            if not self.length:
                self.complain("need a --length to create a sysv shared memory segment")
            self.err.write(
                f"numactl: Creating shared memory segment {name} id "
                f"{self.shmid} mode {self.shmmode:04o} length "
                f"{self.length / (1 << 20):.0f}MB\n"
            )
            flags = _nur.IPC_CREAT | self.shmmode
            try:
                if self.huge:
                    flags |= _nur.SHM_HUGETLB  # the default huge page size, as numactl asks
                shmid = b.call("shmget", key, self.length, flags)
            except (OSError, ValueError, OverflowError) as e:  # shmget's size_t
                self.complain(
                    "cannot create shared memory segment: "
                    + os.strerror(
                        getattr(e, "errno", None) or (errno.ENOMEM if self.huge else errno.EINVAL)
                    )
                )
        return b.call("shmat", shmid), b.call("shm_stat", shmid).size

    def attach_file(self, name: str) -> Tuple[int, int]:
        """numactl --file /dev/shm/NAME, created or grown to --length."""
        b = self.b
        if os.path.dirname(os.path.abspath(name)) != "/dev/shm" or self.offset:
            self.complain(
                f"--file {name}: numa_utils numactl maps files in /dev/shm only, without --offset"
            )
        leaf = os.path.basename(name)
        if os.path.isdir(name):
            self.complain(f"cannot create file {name}: {os.strerror(errno.EISDIR)}")
        try:
            fd = b.call("shm_open", leaf, os.O_RDWR, 0)
        except FileNotFoundError:
            if not self.length:
                self.complain("need a --length to create a shared file")
            fd = b.call("shm_open", leaf, os.O_RDWR | os.O_CREAT, self.shmmode)
        except OSError as e:  # a FIFO: numactl opens it, then its ftruncate fails
            self.err.write(f"ftruncate: {os.strerror(e.errno or errno.EINVAL)}\n")
            raise _NumactlExit(1) from None
        try:
            size = b.call("fstat", fd).size
            if self.length > size:
                try:
                    b.call("ftruncate", fd, self.length)
                except (OSError, OverflowError):  # off_t: negative past 2**63
                    self.err.write(f"ftruncate: {os.strerror(errno.EINVAL)}\n")
                    raise _NumactlExit(1) from None
            size = self.length or size
            return b.call("mmap", size, fd), size
        finally:
            b.call("close", fd)

    def region(self, addr: int, size: int) -> Tuple[int, int]:
        """--offset and --length within the region mapped: the range the policy options
        that follow apply to."""
        offset, length = self.offset, self.length or size - self.offset
        if offset >= size or length % self.b.page_size or offset % self.b.page_size:
            self.complain(
                "policy region not page aligned"
                if offset < size
                else f"region offset {offset:#x} beyond its length {size:#x}"
            )
        return addr + offset, length


def _exec(cmd: List[str], execvp: Callable[[str, List[str]], Any] = os.execvp) -> OSError:
    """Exec ``cmd`` without a shell (the memory policy and the affinity survive exec);
    returns the error when it cannot run."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        execvp(cmd[0], cmd)
    except OSError as e:
        return e
    return OSError(errno.ENOEXEC, "exec returned")


def _cli_numactl(sub: Any) -> None:
    # Parsed by _cmd_numactl's own getopt loop (main hands it the raw arguments);
    # registered here so that --help lists it.
    sub.add_parser(
        "numactl", add_help=False, help="numactl's command line: [OPTIONS] CMD ... (numactl 2.0.19)"
    )


# ---------------------------------------------------------------------------
# Before argparse sees them: "-5M" is not a number to argparse (it only knows
# "-5" and "-.5"), so `region kv -5M` said "size required".  Such a token is a
# negative size or number: refused as one, not as an unknown option.
# ---------------------------------------------------------------------------


def _refuse_negative(argv: Sequence[str], prog: str) -> None:
    for tok in argv:
        if tok == "--":
            break  # run's command: passed through untouched
        if re.match(r"-[0-9.]", tok):
            sys.stderr.write(
                f"{prog}: error: invalid value {tok[:40]!r}: sizes and "
                "counts are positive (e.g. 64M)\n"
            )
            raise SystemExit(2)


# ---------------------------------------------------------------------------
# numactl's device forms in node lists (netdev:, block:, file:, pci:, ip:).
# ---------------------------------------------------------------------------


def _device_node(spec: str, b: _nu.Backend) -> FrozenSet[int]:
    """libnuma's device forms (netdev:, block:, file:, pci:, ip:) -> the device's node
    from sysfs, for parse_nodestring(devices=_device_node).  Only a typed command resolves
    them: they stat files and (ip:) may ask a resolver."""
    kind, _, dev = spec.partition(":")
    dev = dev.lstrip()
    cls = "block" if kind in ("block", "file") else "net" if kind != "pci" else ""
    if kind == "pci":
        head, _, func = dev.partition(".")
        parts = head.split(":")
        try:
            nums = [int(x, 16) for x in parts] + [int(func or "0", 16)]
        except ValueError:
            raise _nu.NodeListError(f"Cannot parse PCI device `{dev}'") from None
        if len(parts) == 2:
            nums.insert(0, 0)
        if len(nums) != 4:
            raise _nu.NodeListError(f"Cannot parse PCI device `{dev}'")
        seg, bus, slot, fn = nums
        path = f"/sys/bus/pci/devices/{seg:04x}:{bus:02x}:{slot:02x}.{fn:x}/numa_node"
    else:
        if kind == "file":  # the block device holding the file
            try:
                st = os.stat(dev)
            except OSError:
                raise _nu.NodeListError(f"Cannot stat file {dev}") from None
            d = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
            want = f"{os.major(d)}:{os.minor(d)}"
            names = [
                n
                for n in b.listdir("/sys/class/block")
                if (_read_optional(b, f"/sys/class/block/{n}/dev") or "").strip() == want
            ]
            if not names:
                raise _nu.NodeListError(f"Cannot find block device {want} in sysfs for `{dev}'")
            dev = names[0]
        elif kind == "ip":  # the interface the route to HOST goes through
            dev = _route_device(dev, b)
        if "/" in dev or "." in dev:
            raise _nu.NodeListError(f"Illegal characters in `{dev}' specification")
        path = f"/sys/class/{cls}/{dev}/device/numa_node"
    text = _read_optional(b, path)
    if text is None and kind != "pci":  # a virtio device: its PCI parent knows
        text = _read_optional(b, f"/sys/class/{cls}/{dev}/device/../numa_node")
    try:
        node = int(text.strip()) if text is not None else None
    except ValueError:
        node = None
    if node is None:
        raise _nu.NodeListError(f"Cannot read node mask for {cls} device `{dev}'")
    if node < 0:
        raise _nu.NodeListError(
            f"Kernel does not know node mask for {cls + ' ' if cls else ''}device `{dev}'"
        )
    return frozenset({node})


def _route_device(host: str, b: _nu.Backend) -> str:
    """The interface of the longest-prefix IPv4 route to ``host`` (/proc/net/route).
    An address is used as it is; a name is looked up through the system resolver
    (DNS: it can wait on the network), as numactl does, because a person typed it."""
    import socket

    try:
        packed = socket.inet_pton(socket.AF_INET, host)
    except (OSError, ValueError):
        try:
            packed = socket.inet_aton(socket.gethostbyname(host))
        except (OSError, UnicodeError, ValueError):
            raise _nu.NodeListError(f"Cannot resolve {host}") from None
    addr = struct.unpack("<I", packed)[0]
    best: Tuple[int, str] = (-1, "")
    for line in (_read_optional(b, "/proc/net/route") or "").splitlines()[1:]:
        f = line.split()
        try:
            dst, mask = int(f[1], 16), int(f[7], 16)
        except (IndexError, ValueError):
            continue
        if addr & mask == dst and bin(mask).count("1") > best[0]:
            best = (bin(mask).count("1"), f[0])
    if not best[1]:
        raise _nu.NodeListError(f"Cannot find a route to {host}")
    return best[1]


# Command word -> the function adding its parser, in help order.
# -- thread roles: plan --roles and threads PID -------------------------------------------


def _parse_roles(text: Optional[str]) -> Dict[str, Union[int, str]]:
    """ "feeder=1,copy=1,compute=rest" -> {"feeder": 1, "copy": 1, "compute": "rest"}."""
    if text is None:
        return dict(_nut.DEFAULT_ROLES)
    roles: Dict[str, Union[int, str]] = {}
    for item in text.split(","):
        name, sep, want = (part.strip() for part in item.partition("="))
        if not sep or not name or not (want == "rest" or want.isdigit()):
            raise ValueError(f"--roles: {item!r} is not ROLE=N or ROLE=rest")
        if want == "rest":
            roles[name] = "rest"
        else:
            roles[name] = int(want)
    return roles


def _role_plans(args: argparse.Namespace, b: _nu.Backend) -> List[_nut.ThreadPlan]:
    """One role plan per GPU (or the one --gpu names), or for --node."""
    kw: Dict[str, Any] = {
        "roles": _parse_roles(args.roles),
        "smt": args.smt,
        "reserve": args.reserve,
        "strict": True if args.strict else None,
        "backend": b,
    }
    if args.node is not None:
        return [_nut.thread_plan(node=args.node, **kw)]
    if args.gpu is not None:
        return [_nut.thread_plan(args.gpu, **kw)]
    return [_nut.thread_plan(plan.gpu, **kw) for plan in _nu.gpu_plans(backend=b)]


def _role_plan_title(plan: _nut.ThreadPlan) -> str:
    node = "?" if plan.node is None else str(plan.node)
    if plan.gpu is None:
        return f"node {node}, smt {plan.smt}"
    return f"GPU {plan.gpu} ({plan.pci or '?'}), node {node}, smt {plan.smt}"


def _render_role_text(plans: List[_nut.ThreadPlan], b: _nu.Backend) -> str:
    topo = _nu.read_topology(backend=b)
    out = []
    for plan in plans:
        out.append(f"numa_utils plan --roles: {_role_plan_title(plan)}")
        width = max([len(_nu.format_cpulist(cpus)) for cpus in plan.roles.values()] + [4])
        out.append(f"  {'role':<12}  {'cpus':<{width}}  cores")
        for role, cpus in plan.roles.items():
            cores = len(topo.cores_of(cpus))
            out.append(f"  {role:<12}  {_nu.format_cpulist(cpus):<{width}}  {cores}")
        for why, cpus in plan.left_out.items():
            out.append(f"  left out: {_nu.format_cpulist(cpus)} ({why})")
        for note in plan.notes:
            out.append(f"  - {note}")
    return "\n".join(out) + "\n"


def _render_role_env(plan: _nut.ThreadPlan) -> str:
    import shlex

    out = [f"# {_role_plan_title(plan)}"]
    for role, cpus in plan.roles.items():
        out.append(f"# role {role}: CPUs {_nu.format_cpulist(cpus)}")
    for name, value in plan.omp_env.items():
        out.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(out) + "\n"


def _render_role_systemd(plans: List[_nut.ThreadPlan], unit: str) -> str:
    out = []
    for plan in plans:
        index = plan.gpu
        if index is None:
            index = plan.node
        out.append(f"# {_drop_in_name(unit, index)}: {_role_plan_title(plan)}")
        for role, cpus in plan.roles.items():
            out.append(f"# role {role}: CPUs {_nu.format_cpulist(cpus)}")
        out.append("[Service]")
        out.append(f"CPUAffinity={_nu.format_cpulist(plan.cpus)}")
        if plan.memory_nodes:
            out.append("NUMAPolicy=preferred")
            out.append(f"NUMAMask={_nu.format_cpulist(plan.memory_nodes)}")
        for name, value in plan.omp_env.items():
            out.append(f'Environment="{name}={value}"')
        out.append("")
    return "\n".join(out)


def _render_role_taskset(plans: List[_nut.ThreadPlan]) -> str:
    out = []
    for plan in plans:
        out.append(f"# {_role_plan_title(plan)}")
        for role, cpus in plan.roles.items():
            out.append(f"taskset -c {_nu.format_cpulist(cpus)}  # role {role}")
    return "\n".join(out) + "\n"


_FLEET_FORMATS = ("oci", "nri", "gres", "srun", "ray")  # plan's exports for a fleet


def _cmd_role_plan(args: argparse.Namespace, b: _nu.Backend) -> int:
    if args.node is not None and args.gpu is not None:
        raise ValueError("--gpu and --node: one of the two")
    plans = _role_plans(args, b)
    fmt = args.format or ("json" if args.json else "text")
    if fmt == "json":
        _nu._print_json([plan.to_json() for plan in plans])
    elif fmt == "env":
        if len(plans) != 1:
            raise ValueError("--format env is one worker's environment: add --gpu N or --node N")
        sys.stdout.write(_render_role_env(plans[0]))
    elif fmt == "systemd":
        sys.stdout.write(_render_role_systemd(plans, args.unit))
    elif fmt == "taskset":
        sys.stdout.write(_render_role_taskset(plans))
    elif fmt == "numactl":
        raise ValueError("--roles has no numactl form (one numactl binds one process): use taskset")
    elif fmt in _FLEET_FORMATS:
        raise ValueError(f"--format {fmt} exports the GPU plans: leave out --roles and --node")
    else:
        sys.stdout.write(_render_role_text(plans, b))
    return 0


def _render_tree_text(tree: _nut.ProcessTreePlan) -> str:
    size = len(tree.groups[0].workers)
    out = [f"numa_utils plan --tree: {len(tree.groups)} groups of {size} workers"]
    for group in tree.groups:
        nodes = ",".join(str(node) for node in group.nodes) or "?"
        out.append(f"  group {group.rank}: CPUs {_nu.format_cpulist(group.cpus)}, nodes {nodes}")
        for index, plan in enumerate(group.workers):
            name = f"worker {index}"
            if plan.gpu is not None:
                name = f"GPU {plan.gpu} ({plan.pci or '?'})"
            node = "?" if plan.cpu_node is None else plan.cpu_node
            out.append(f"    {name}: CPUs {_nu.format_cpulist(plan.cpus)}, node {node}")
    for note in tree.notes:
        out.append(f"  - {note}")
    return "\n".join(out) + "\n"


def _cmd_tree_plan(args: argparse.Namespace, b: _nu.Backend) -> int:
    """plan --tree: process_tree_plan, as an operator reads it before launching."""
    if not args.tree:
        raise ValueError("--dp and --tp size a --tree plan: add --tree")
    if any(arg is not None for arg in (args.roles, args.node, args.gpu, args.policy, args.memory)):
        raise ValueError(
            "--tree plans every worker's exclusive share: leave out --gpu, --node, --roles, "
            "--policy and --memory"
        )
    fmt = args.format or ("json" if args.json else "text")
    if fmt not in ("text", "json"):
        raise ValueError(f"--tree prints text or json, not --format {fmt}")
    tree = _nut.process_tree_plan(
        dp=1 if args.dp is None else args.dp,
        tp=1 if args.tp is None else args.tp,
        reserve=args.reserve,
        strict=True if args.strict else None,
        backend=b,
    )
    if fmt == "json":
        _nu._print_json(tree.to_json())
    else:
        sys.stdout.write(_render_tree_text(tree))
    return 0


def _last_cpu(stat: str) -> Optional[int]:
    """proc(5) stat field 39 (processor): the CPU the thread last ran on.  The name
    (field 2) may hold ") ", so the fields are counted after its last ")"."""
    fields = stat.rpartition(")")[2].split()
    if len(fields) > 36 and fields[36].isdigit():
        return int(fields[36])
    return None


def _thread_rows(b: _nu.Backend, pid: str, plan: Optional[_nut.ThreadPlan]) -> List[Dict[str, Any]]:
    """One row per thread of ``pid``: tid, name, allowed CPUs, last CPU and its node,
    and under ``plan`` its role (the role whose CPUs are its mask) and whether it
    strays (allowed CPUs outside the plan)."""
    topo = _nu.read_topology(backend=b)
    base = f"/proc/{pid}/task"
    tids = sorted(int(tid) for tid in b.listdir(base) if tid.isdigit())
    rows = []
    for tid in tids:
        status = _read_optional(b, f"{base}/{tid}/status") or ""
        found = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M)
        allowed: FrozenSet[int] = frozenset()
        if found:
            allowed = _nu.parse_cpulist(found.group(1))
        last = _last_cpu(_read_optional(b, f"{base}/{tid}/stat") or "")
        node = None
        if last is not None:
            node = topo.node_of_cpu(last)
        # The name is the process's own choice: any byte but NUL (prctl PR_SET_NAME);
        # the kernel adds one newline.
        name = _read_optional(b, f"{base}/{tid}/comm") or ""
        if name.endswith("\n"):
            name = name[:-1]
        row: Dict[str, Any] = {
            "tid": tid,
            "name": name,
            "cpus": _nu.format_cpulist(allowed),
            "last_cpu": last,
            "node": node,
        }
        if plan is not None:
            roles = [role for role, cpus in plan.roles.items() if cpus == allowed]
            row["role"] = roles[0] if roles else None
            row["stray"] = not allowed <= plan.cpus
        rows.append(row)
    return rows


def _cmd_threads(args: argparse.Namespace) -> int:
    b = _nu._root_backend(args.root)
    pid = str(args.pid)
    if not b.exists(f"/proc/{pid}/task"):
        raise ValueError(f"no process {pid}")
    plan = None
    if args.roles is not None or args.gpu is not None or args.node is not None:
        if (args.gpu is None) == (args.node is None):
            raise ValueError("a role plan needs --gpu N or --node N")
        args.reserve, args.strict = None, False
        plan = _role_plans(args, b)[0]
    rows = _thread_rows(b, pid, plan)
    if args.json:
        _nu._print_json(rows)
        return 0
    head = f"  {'tid':>7}  {'name':<16}  {'cpus':<16}  {'last':>4}  {'node':>4}"
    if plan is not None:
        head += "  role"
    out = [f"numa_utils threads: process {pid}, {len(rows)} threads", head]
    for row in rows:
        last = "?" if row["last_cpu"] is None else str(row["last_cpu"])
        node = "?" if row["node"] is None else str(row["node"])
        name = _nu.printable(row["name"])  # escaped, as `maps` escapes file names
        line = f"  {row['tid']:>7}  {name:<16}  {row['cpus']:<16}  {last:>4}  {node:>4}"
        if plan is not None:
            line += f"  {row['role'] or '-'}"
            if row["stray"]:
                line += "  STRAY: outside the plan"
        out.append(line)
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _cli_threads(sub: Any) -> None:
    p = sub.add_parser(
        "threads",
        parents=[sub.common],
        help="a process's threads: names, allowed CPUs, last CPU and node, roles",
    )
    p.add_argument("pid", metavar="PID", help="process id ('self': this command)")
    p.add_argument(
        "--gpu", type=int, default=None, metavar="N", help="roles of CUDA device N's plan"
    )
    p.add_argument("--node", type=int, default=None, metavar="N", help="roles of node N's plan")
    p.add_argument("--roles", default=None, metavar="ROLE=N,...", help="as plan --roles")
    p.add_argument("--smt", choices=_nut.SMT_RULES, default="core", help="as plan --smt")
    p.set_defaults(func=_cmd_threads)


def _cli_status(sub: Any) -> None:
    p = sub.add_parser(
        "status", parents=[sub.common], help="topology, GPUs, process limits and advice"
    )
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


_COMMANDS = {
    "status": _cli_status,
    "maps": _cli_maps,
    "cleanup": _cli_cleanup,
    "region": _cli_cleanup,
    "plan": _cli_plan,
    "run": _cli_run,
    "watch": _cli_watch,
    "numactl": _cli_numactl,
    "fit": _cli_fit,
    "threads": _cli_threads,
}


def _terminal_columns() -> int:
    """The terminal's width as shutil.get_terminal_size() gives it to argparse:
    $COLUMNS, else standard output's terminal, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def _build_parser(commands: Sequence[Callable[[Any], None]] = ()) -> argparse.ArgumentParser:
    """The parser of ``commands`` (each adds its own subcommand)."""
    import argparse

    def formatter(prog: str) -> argparse.HelpFormatter:
        # Given its width: without one, argparse's formatter (made for every
        # add_argument) measures the terminal through shutil, and importing shutil
        # imports zlib, bz2 and lzma: 2-3 ms of every command's start-up.
        return argparse.HelpFormatter(prog, width=_terminal_columns() - 2)

    class Parser(argparse.ArgumentParser):
        def __init__(self, **kw: Any) -> None:
            super().__init__(formatter_class=formatter, **kw)

    parser = Parser(
        prog=_nu._prog(),
        description="NUMA topology, memory policy and placement for inference engines.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_nu.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # The flags the commands share: --root and --json; --json alone for the commands
    # that act on this system (numa_utils_cli's run).
    common, live = (Parser(add_help=False) for _ in range(2))
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
    sub.common = common  # type: ignore[attr-defined]
    sub.common_live = live  # type: ignore[attr-defined]
    for add in commands:
        add(sub)
    return parser


def _call(prog: str, args: Any) -> int:
    _nu._cli_verbose = bool(args.verbose)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError) as err:
        sys.stderr.write(f"{prog} {args.command}: {err}\n")
        return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Every numa-utils command (numa_utils.main hands all but ``status`` here)."""
    raw = list(sys.argv[1:] if argv is None else argv)
    lead = 0
    while raw[lead : lead + 1] in (["-v"], ["--verbose"]):
        lead += 1
    if raw[lead : lead + 1] == ["numactl"]:  # numactl's own getopt grammar, not argparse's
        for stream in (sys.stdout, sys.stderr):  # arguments echoed as the bytes given
            getattr(stream, "reconfigure", lambda **kw: None)(errors="surrogateescape")
        return _cmd_numactl(raw[lead + 1 :])
    _refuse_negative(raw, _nu._prog())
    # A typed command builds its own parser only; the help, a mistyped word and its
    # error list every command.
    word = raw[lead] if lead < len(raw) else ""
    adders = (_COMMANDS[word],) if word in _COMMANDS else dict.fromkeys(_COMMANDS.values())
    parser = _build_parser(tuple(adders))
    return _call(parser.prog, parser.parse_args(raw))


def _status_regions(report: Dict[str, Any], backend: _nu.Backend) -> None:
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
    for st in _nur.parse_sysvipc_shm(sysvipc):
        if st.uid == euid and st.key & _nur.SYSV_KEY_MASK == _nur.SYSV_KEY_PREFIX:
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
    for name in sorted(n for n in backend.listdir("/dev/shm") if n.startswith(_nur.POSIX_PREFIX)):
        path = f"/dev/shm/{name}"
        row: Dict[str, Any] = {
            "name": name[len(_nur.POSIX_PREFIX) :],
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
            row["size"], rec = _nur._file_record(path)
            if rec is not None:
                row.update(name=rec["key"], size=rec["size"], layout=str(_nur.record_layout(rec)))
        except (OSError, ValueError) as err:
            row["error"] = str(err)
        rows.append(row)
    if rows:
        lines = ["", "REGIONS (this user's numa_utils shared memory)"]
        for region in rows:
            size = "?"
            if region["size"] is not None:
                size = _nu.format_size(region["size"])
            attached = "?"
            if region["attached"] is not None:
                attached = region["attached"]
            layout = region["layout"] or region.get("error")
            if not layout:
                layout = "layout: `maps PID` or `cleanup` shows it"
            label = region["name"] or region["key"]
            line = f"  {region['kind']:<5}  {label:<24}  {size:>8}  {attached} attached  {layout}"
            lines.append(_nu.printable(line))
        report.setdefault("extra_text", []).extend(lines)


# ---------------------------------------------------------------------------
# status: counters and advice.
# ---------------------------------------------------------------------------


def _status_extra(report: Dict[str, Any], topo: _nu.Topology, backend: _nu.Backend) -> None:
    """Add counters, the process's remote share and advice to the status report."""
    warnings: List[str] = report["warnings"]
    text: List[str] = report.setdefault("extra_text", [])
    snap = _nur.counters(backend=backend)
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
                _nur.NUMASTAT_FIELDS,
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
        maps = _read_optional(backend, _nu._maps_path("self"))
    if maps is not None:
        # Read and parsed once, for the remote share and the interleave check.
        rs, entries = _nut._remote_share("self", maps, _nut.REMOTE_SHARE_THRESHOLD, topo, backend)
        report["process"]["remote_share"] = rs.to_json()
        if rs.total_bytes:
            per = ", ".join(
                f"node {nid}: {_nu.format_kib(v // 1024)}"
                for nid, v in sorted(rs.bytes_by_node.items())
            )
            text += [
                "",
                "PROCESS PAGES",
                f"  {per}; {rs.share:.1%} remote to the CPUs' {_nu._nodes_txt(rs.local_nodes)}",
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
            nid
            for nid in general
            if topo.nodes[nid].hugepages.get(sz, _nu.HugePages(0, 0)).total > 0
        ]
        if len(on) == 1:
            warnings.append(
                f"{_nu.format_kib(sz).replace('.0 ', ' ')} huge pages are configured "
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
                f"GPU {gpu['address']}: its node {node} has {_nu.format_kib(c.available_kb)}"
                f" available of {_nu.format_kib(c.mem_total_kb)} (< 5%): pinned host "
                "buffers for it will come from another node"
            )
        elif topo.nodes_with_memory and node not in topo.nodes_with_memory:
            # nearest() sorts all of its (non-empty) pool: there is a first
            near = topo.nearest(node, topo.nodes_with_memory)[0]
            warnings.append(
                f"GPU {gpu['address']}: its node {node} has no memory; host "
                f"buffers for it come from node {near}"
            )


def _package_layout(topo: _nu.Topology) -> Dict[str, Any]:
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
        f"{_nu.format_cpulist(v)} {where}"
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
    match = re.match(r"^([0-9]{1,12})([KMG]?)$", _nu._clean(text).upper())
    if not match:
        raise ValueError(f"invalid cache size{_nu._where(source)}: {_nu._short(text)}")
    return int(match.group(1)) << {"": 0, "K": 0, "M": 10, "G": 20}[match.group(2)]


def _llc_json(
    topo: _nu.Topology, backend: _nu.Backend, warnings: List[str]
) -> List[Dict[str, Any]]:
    """Each last-level cache once: level, size (kB, None if sysfs omits it), CPUs."""
    out = []
    reader = _nu._Reader(backend)
    for llc in sorted({cpu.llc for cpu in topo.cpus.values() if cpu.llc}, key=min):
        folder = f"{_nu._CPU_DIR}/cpu{min(llc)}/cache"
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


def _render_tiers(rep: Dict[str, Any]) -> List[str]:
    """MEMORY: kind, tier, HMAT figures and weight per node, and the default nodes."""
    out: List[str] = []
    nodes = [node for node in rep["nodes"] if node["kind"] not in (None, "no-memory")]
    weights = rep["interleave_weights"]
    if len(nodes) > 1 or rep["memory_tiers"]:
        out += [
            "MEMORY (node, kind, tier, weighted-interleave weight, HMAT access class 0 figures)",
            "  tier: the kernel's memory tier, its abstract distance / 128: DRAM is tier 4, "
            "lower is faster",
        ]
        for node in nodes:
            access = node["access"]
            if access:
                read_mbps = access["read_bandwidth_mbps"] or "?"
                write_mbps = access["write_bandwidth_mbps"] or "?"
                read_ns = access["read_latency_ns"] or "?"
                write_ns = access["write_latency_ns"] or "?"
                initiators = _nu.format_cpulist(access["initiators"]) or "?"
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
        every = _nu.format_cpulist([*map(int, d["left_out"]), *d["nodes"]])
        var = next(name for name in rep["config"] if name.endswith("NUMA_NODES"))
        out += [
            f"  default memory nodes (nodes=None, {var} unset): "
            f"{_nu.format_cpulist(d['nodes'])} ({d['basis']})",
            *(f"    left out: node {key}: {why}" for key, why in d["left_out"].items()),
            f"    to use them anyway pass nodes=[...] or set {var} (e.g. {var}={every})",
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
                name = _nu.format_kib(kb).replace(".0 ", " ") + " " + name
            names.append(name)
        what = ", ".join(names)
        out += f"; LLC: {len(llcs)} x {what} (per {count(per, 'core')})"
    return out


def status_report(*, backend: Optional[_nu.Backend] = None) -> Dict[str, Any]:
    """Everything ``status --json`` prints: numa_utils.status_report's facts, with
    the packages and caches, memory tiers, node counters, this process's remote
    share, this user's regions and advice."""
    backend = _nu._b(backend)
    report, topo = _nu._status_facts(backend)
    warnings: List[str] = report["warnings"]
    layout = report["packages"] = _package_layout(topo)
    if layout["nodes_per_package"] and layout["nodes_per_package"] > 1:
        warnings.append(
            f"{layout['evidence']}: a 'socket' CPU plan spans all of a "
            "package's nodes and bind_for_gpu(memory='socket') prefers all of "
            "them (preferred-many); 'node' keeps a worker on one cluster, "
            "with that cluster's share of the memory bandwidth"
        )
    _status_advice(warnings, topo)
    report["last_level_caches"] = _llc_json(topo, backend, warnings)
    text = report.setdefault("extra_text", [])
    text += ["", _cpu_summary(report), f"PACKAGES: {layout['evidence']}", *_render_tiers(report)]
    _status_extra(report, topo, backend)
    _status_regions(report, backend)
    return report


def _env_shown(row: Mapping[str, Any]) -> str:
    """A status config row's value as text: an invalid one is the user's raw text,
    shown escaped and cut as error messages show it (_short)."""
    if "error" in row and isinstance(row["value"], str):
        return _nu._short(row["value"])
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


# How a device's node was found, in words, when its numa_node file does not say.
_NODE_HOW = MappingProxyType(
    {
        "local_cpulist": "node from its local CPUs: numa_node is -1",
        "single node": "the only node with CPUs: numa_node is -1",
        "unknown": "numa_node is -1 and its local CPUs do not tell",
    }
)


def _node_how(data: Dict[str, Any]) -> str:
    """How a device's node was found, when not from its numa_node file."""
    if data["node_source"] == "numa_node":
        return ""
    return f"  ({_NODE_HOW.get(data['node_source'], data['node_source'])})"


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
        f"NODES: {len(nodes)} online ({_nu.format_cpulist(k['online_nodes']) or '-'}) "
        f"of {len(k['possible_nodes'])} possible "
        f"({_nu.format_cpulist(k['possible_nodes']) or '-'}); CPUs on "
        f"{_nu._nodes_txt(k['nodes_with_cpus'])}; memory on "
        f"{_nu._nodes_txt(k['nodes_with_memory'])}",
    ]
    w = max([len(_nu.format_cpulist(node["cpus"])) for node in nodes] + [4])
    out.append(
        f"  {'node':>4}  {'cpus':<{w}}  {'memory':>11}  {'free':>11}  hugepages (free/total)"
    )
    for node in nodes:
        hp = (
            "  ".join(
                f"{_nu.format_size(int(sz) << 10)}: {h['free']} free/{h['total']}"
                for sz, h in node["hugepages"].items()
                if h["total"]
            )
            or "-"
        )
        out.append(
            f"  {node['id']:>4}  {_nu.format_cpulist(node['cpus']) or '-':<{w}}  "
            f"{_nu.format_kib(node['mem_total_kb']):>11}  "
            f"{_nu.format_kib(node['mem_free_kb']):>11}  {hp}"
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
            f"{_nu.format_cpulist(gpu['local_cpus']) or '-'}"
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
    allowed_cpus = f"  allowed cpus   {_nu.format_cpulist(p['allowed_cpus']) or '-'}"
    if p["allowed_cpus"] == k["online_cpus"]:
        allowed_cpus += " (all online)"
    allowed_mems = f"  allowed mems   {_nu.format_cpulist(p['allowed_mems']) or '-'}"
    if p["allowed_mems"] == k["nodes_with_memory"]:
        allowed_mems += " (all)"
    devs = sorted(rep["devices"], key=lambda d: (d["node"] is None, d["node"] or 0, d["address"]))
    out += [
        *_section(
            "DEVICES (PCI functions by node: node, address, kind, vendor:device, "
            "kernel names (-: none))",
            [
                f"  {_node_of(d):>4}  {d['address']}  {d['kind']:<7} {d['vendor'][2:]}:"
                f"{d['device'][2:]}  {' '.join(d['names']) or '-'}{_node_how(d)}"
                for d in devs
            ],
        ),
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
        *rep.get("extra_text", ()),
        "",
        *_section(
            "CONFIGURATION (environment)",
            [
                *(
                    f"  {name:<34} {_env_shown(value):<12} ({_env_source(value)})"
                    for name, value in rep["config"].items()
                ),
                *(
                    f"  ignored: {name} (not read; did you mean {ours}?)"
                    for name, ours in rep["config_ignored"].items()
                ),
            ],
        ),
        warnings_head,
        *(f"  - {wtext}" for wtext in rep["warnings"]),
    ]
    # A saved tree is anyone's, and names in it (and regions') reach these lines:
    # each line is escaped whole, a newline in a name included.
    return "\n".join(map(_nu.printable, out)) + "\n"


def _cmd_status(args: Any) -> int:
    """``status``: the core's facts with this file's advice, counters and regions, as
    text, JSON, Prometheus metrics or NFD labels."""
    if args.env_prefix is not None:
        _nu.configure(env_prefix=args.env_prefix)
    fmt = args.format  # None: text, or json with --json
    if fmt is None and args.json:
        fmt = "json"
    if args.write is not None and fmt != "nfd":
        raise ValueError("--write goes with --format nfd")
    rep = status_report(backend=_nu._root_backend(args.root))
    if fmt == "json":
        rep.pop("extra_text", None)
        _nu._print_json(rep)
    elif fmt == "prometheus":
        sys.stdout.write(_render_prometheus(rep))
    elif fmt == "nfd":
        return int(_status_nfd(rep, args))
    else:
        sys.stdout.write(_render_status(rep))
    return 0


def _status_advice(warnings: List[str], topo: _nu.Topology) -> None:
    """The status report's advice on the machine: GPUs without a node or outside the
    cpuset, automatic NUMA balancing, a cpuset that limits memory, CPU-only nodes."""
    multi = len(topo.nodes_with_memory) > 1 or len(topo.nodes_with_cpus) > 1
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
                        f"({_nu.format_cpulist(ncpus)}): its worker will run remote"
                    )
                if gpu.node in topo.nodes_with_memory and gpu.node not in topo.allowed_mems:
                    warnings.append(
                        f"GPU {gpu.address} hangs off node {gpu.node} but this process's "
                        f"cpuset (Mems_allowed_list {_nu.format_cpulist(topo.allowed_mems)})"
                        " excludes that node's memory: host buffers for it will be remote"
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
            f"the cpuset limits memory to {_nu._nodes_txt(topo.allowed_mems)}; "
            f"{_nu._nodes_txt(restricted)} cannot be used for interleave"
        )
    for node in sorted(topo.nodes_with_cpus - topo.nodes_with_memory):
        warnings.append(
            f"node {node} has CPUs but no memory: its threads always allocate from another node"
        )


# Last: `python numa_utils_cli.py CMD` runs main() once every name above is defined.
if __name__ == "__main__":
    raise SystemExit(main())
