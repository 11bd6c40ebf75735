# SPDX-License-Identifier: Apache-2.0
"""A simulated Linux kernel behind numa_utils' Backend interface: a test kit.

Copy ``numa_utils_sim.py`` beside ``numa_utils.py`` in your tests (or install
numa-utils) and run your own code on a modelled multi-node machine::

    import numa_utils as nu
    from numa_utils_sim import SimulatedBackend

    sim = SimulatedBackend("fake_sysfs/sparse-ids/root")
    with nu.use_backend(sim):
        ...                                   # every numa_utils call sees the model

numa_utils is imported as a sibling module: ``pkg.numa_utils`` when this file is
vendored as ``pkg.numa_utils_sim``, else the top-level ``numa_utils``.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import os
import re
import stat
import struct
import threading
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Mapping,
    NoReturn,
    Optional,
    Sequence,
    Tuple,
    Type,
)

__version__ = "0.1.0"
# numa_utils releases (major.minor) whose Backend interface and syscall layer this
# simulator models.
_MODELS = ("0.1",)

if TYPE_CHECKING:
    from typing import NamedTuple as _Record

    import numa_utils as _nu
    from numa_utils_regions import ShmStat
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
    _Record = _nu._Record

Backend = _nu.Backend
# The kernel's own numbers for the shared memory this file models (uapi ipc.h, shm.h,
# asm-generic fcntl.h and mman-common.h), stated here rather than taken from the
# library, so that a wrong number there fails against the model.
IPC_CREAT, IPC_EXCL = 0o1000, 0o2000
LOCK_SH, LOCK_EX, LOCK_NB, LOCK_UN = 1, 2, 4, 8
MADV_HUGEPAGE = 14
SHM_HUGETLB, SHM_HUGE_SHIFT, SHM_RDONLY = 0o4000, 26, 0o10000
_CGROUP = "/sys/fs/cgroup"
GetFlag = _nu.GetFlag
LinuxBackend = _nu.LinuxBackend
MADV_POPULATE_READ = 22  # Linux 5.14+
MADV_POPULATE_WRITE = _nu.MADV_POPULATE_WRITE
MbindFlag = _nu.MbindFlag
Mode = _nu.Mode
ModeFlag = _nu.ModeFlag
SHM_DEST = 0o1000  # in shm_perm.mode: IPC_RMID done, attached still
Topology = _nu.Topology
_DEFAULT_PAGE = {"ppc64": 65536, "ppc64le": 65536}  # page size where not 4 KiB
_MAX_MAP_COUNT = 65530  # vm.max_map_count by default (DEFAULT_MAX_MAP_COUNT, include/linux/mm.h)
_MODE_FLAGS_MASK = _nu._MODE_FLAGS_MASK
_NODE_DIR = _nu._NODE_DIR
_THP_DIR = _nu._THP_DIR
_WI_DIR = _nu._WI_DIR
_buffer_address = _nu._buffer_address
_encode_nodemask = _nu._encode_nodemask
format_size = _nu.format_size
_oserror = _nu._oserror
_pointer_bits = _nu._pointer_bits
_selected = _nu._selected
_short = _nu._short
abi_for = _nu.abi_for
decode_nodemask = _nu.decode_nodemask
format_cpulist = _nu.format_cpulist
read_topology = _nu.read_topology


# -- saved trees in one file -------------------------------------------------------
# Read into memory, never unpacked: nothing of an archive is written to disk.
_TREE_MAX_TOTAL = 128 << 20  # an archive's bytes, uncompressed
# What an archive may hold in memory, its names and folders included: a member's name
# makes each of its folders (up to 128, each keyed by its whole path), so a small
# archive of deep, distinct names would otherwise take gigabytes.  Each entry counts
# its path and about what a dict slot, a key and a value cost besides.
_TREE_ROOM_PER_BYTE = 4
_TREE_ROOM_EXTRA = 4 << 20
_TREE_ENTRY_COST = 128
_TEXT_ARCHIVE = b"# numa_utils saved tree"
_PCT_RE = re.compile(rb"%([0-9A-Fa-f]{2})")
_ENTRY_RE = re.compile(rb"(?m)^>>> ([^\n]*)\n?")
_UNESCAPE_RE = re.compile(rb"(?m)^\\")


def _unquote(b: bytes) -> str:
    if b"%" in b:
        b = _PCT_RE.sub(lambda m: bytes((int(m.group(1), 16),)), b)
    return b.decode("utf-8", "surrogateescape")


# Saved trees: every lookup walks the tree's own links (SavedTree._walk).
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
    small ones kept).  SavedTree walks its links itself (``link``); a saved tree in
    one file (text archive, tar) is a SavedArchive, which has the same five methods."""

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
    archive, which SavedArchive reads)."""
    mode = os.stat(path).st_mode  # a stat opens nothing: a FIFO, a device
    if stat.S_ISREG(mode):
        raise ValueError(
            f"{path}: a saved tree in one file (text archive or tar): open_tree(path) reads it"
        )
    if not stat.S_ISDIR(mode):
        raise ValueError(f"{path}: not a saved tree (neither a folder nor a regular file)")
    return _SavedFolder(path)


class SavedTree:
    """A saved tree read as if it were "/", for ``LinuxBackend(tree)``: absolute
    paths ("/sys/devices/system/node/online") looked up in ``source`` (a folder, or a
    SavedArchive) with every link followed inside it."""

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

    def _walk(self, path: str, base: str = "") -> str:
        """``path`` inside the tree with every link followed, iteratively: at most 40
        links per lookup (the kernel's MAXSYMLINKS), 512 components deep, and
        _TREE_MAX_STEPS components walked in this tree in all, so that no tree of
        links (chains that double, loops, 2,000-component targets) costs more.
        ``base``: an already resolved folder to start from."""
        cur = base.split("/") if base else []
        todo = path.split("/")[::-1]
        links = 0
        while todo:
            c = todo.pop()
            self._steps += 1
            if self._steps > _TREE_MAX_STEPS or len(cur) > 512 or len(todo) > 4096:
                raise _nu._oserror(errno.ELOOP, path, f"links too deep or too many in {self.path}")
            if c in ("", ".", ".."):
                if c == ".." and cur:
                    cur.pop()
                continue
            cur.append(c)
            link = self.source.link("/".join(cur))
            if link is None:
                continue
            links += 1
            if links > 40:
                raise _nu._oserror(errno.ELOOP, path, f"in {self.path}")
            if link.startswith("/"):
                cur = []  # from the tree's root
            else:
                cur = cur[:-1]  # from the link's folder
            todo.extend(link.split("/")[::-1])
        return "/".join(cur)

    def _rel(self, path: str, leaf_too: bool = True) -> str:
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
                    base = self._rel(head)
                else:
                    base = self._real_paths.setdefault(head, self._walk(head))
            got = f"{base}/{leaf}" if base else leaf  # most leaves: a plain name
            if leaf in ("", ".", "..") or leaf_too and self.source.link(got) is not None:
                got = self._walk(leaf, base)
            elif not leaf_too:
                return got
            self._real_paths[rel] = got
        return got

    def __init__(self, source: Any) -> None:
        self.source = source
        self.path: str = source.path
        self._real_paths: Dict[str, str] = {}
        self._steps = 0

    def read_text(self, path: str) -> str:
        limit = self._SYSFS_MAX_READ if path.startswith("/sys/") else self._TREE_MAX_READ
        try:
            return str(self.source.read(self._rel(path, False), path, limit))
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
        return str(self.source.read(self._rel(path), path, limit))

    def listdir(self, path: str) -> List[str]:
        return list(self.source.listdir(self._rel(path), path))

    def exists(self, path: str) -> bool:
        try:
            rel = self._rel(path)
        except OSError as err:
            if err.errno == errno.ELOOP:  # a loop is worth a warning, not "absent"
                raise
            return False
        return bool(self.source.exists(rel))

    def realpath(self, path: str) -> str:
        return "/" + self._rel(path)

    def machine(
        self,
    ) -> Tuple[Optional[str], Optional[str], Optional[int], Optional[_nu.Abi]]:
        """(release, machine, page size, ABI) of the machine this tree was taken on, as
        far as it tells: proc/sys/kernel/osrelease and arch (Linux 6.1+; gather.py
        saves both), the smallest kernelpagesize_kB of a saved proc/self/numa_maps,
        and the ABI of that machine.  None for what it does not tell (never this
        host's values): status shows these."""

        def text(path: str) -> str:
            try:
                return self.read_text(path)
            except OSError:
                return ""

        def word(path: str) -> Optional[str]:
            t = _nu._clean(text(path))
            if 0 < len(t) <= 64 and t.isprintable() and " " not in t:
                return t
            return None

        kb = min(
            map(
                int,
                re.findall(
                    r" kernelpagesize_kB=([0-9]{1,8})\b",
                    text("/proc/self/numa_maps"),
                ),
            ),
            default=0,
        )
        page = None
        if kb >= 4 and kb & (kb - 1) == 0:  # a power of two
            page = kb * 1024
        arch = word("/proc/sys/kernel/arch")
        abi = None
        if arch:
            bits = 32
            if "64" in arch or arch == "s390x":
                bits = 64
            abi = _nu.abi_for(arch, bits)
        return word("/proc/sys/kernel/osrelease"), arch, page, abi


class SavedArchive:
    """A saved tree in one file, read-only: a text archive (one ``>>> PATH`` line per
    entry, then its contents: fake_sysfs/README.md has the format) or a tar, plain or
    compressed (tools/gather.py --archive), held in memory and never unpacked, so no
    member name or link can reach outside it.  Names are relative, without ".." and
    at most 4,096 bytes and 128 components; only files, folders and symbolic links
    (followed by SavedTree inside the tree).  ``LinuxBackend(open_tree(path))``
    reads it as a saved folder is read; SimulatedBackend takes the path itself."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.files: Dict[str, bytes] = {}
        self.links: Dict[str, str] = {}
        self.dirs: Dict[str, Dict[str, None]] = {"": {}}
        self._room = 0  # bytes the entries may still take (_count)
        mode = os.stat(path).st_mode  # a stat opens nothing: a FIFO, a device
        if not stat.S_ISREG(mode):
            self._bad("not a regular file")
        try:
            data = _read_regular(path, _TREE_MAX_TOTAL)
        except OSError as e:
            if e.errno != errno.EFBIG:
                raise
            self._bad(f"more than {_TREE_MAX_TOTAL >> 20} MiB")
        (self._text if data.startswith(_TEXT_ARCHIVE) else self._tar)(data)

    def link(self, rel: str) -> Optional[str]:
        """The target of ``rel`` when it is a symbolic link (its folder resolved)."""
        return self.links.get(rel)

    def exists(self, rel: str) -> bool:
        return rel in self.files or rel in self.dirs or rel in self.links

    def _bad(self, why: str) -> NoReturn:
        raise ValueError(f"{self.path}: not a saved tree archive ({why})")

    def _count(self, name: str, rel: str) -> None:
        """Count one more entry, ``rel``, against the archive's room."""
        self._room -= len(rel) + _TREE_ENTRY_COST
        if self._room < 0:
            self._bad(
                f"refused member {_short(name, 60)}: its names and folders take more "
                f"memory than {_TREE_ROOM_PER_BYTE} times the archive's size"
            )

    def _add(self, name: str, data: Optional[bytes] = None, link: Optional[str] = None) -> None:
        rel = name.rstrip("/")
        odd = "/" + rel + "/"
        if "//" in odd or "/./" in odd or rel.startswith("./"):
            rel = "/".join(p for p in name.split("/") if p not in ("", "."))
        head, _, leaf = rel.rpartition("/")
        if (
            name.startswith("/")
            or not rel
            or "/../" in f"/{rel}/"
            or rel.count("/") >= 128
            or len(name) > 4096
            or (link is not None and len(link) > 4096)
        ):
            self._bad(
                f"refused member {_short(name, 60)}: names are relative, "
                "without '..', at most 4,096 bytes and 128 components"
            )
        if head not in self.dirs:  # its folders, made once each
            d = ""
            for p in head.split("/"):
                sub = f"{d}/{p}" if d else p
                if sub in self.files or sub in self.links:
                    self._bad(f"refused member {_short(name, 60)}: {sub!r} is not a folder")
                if sub not in self.dirs:
                    self._count(name, sub)
                self.dirs[d][p] = None
                self.dirs.setdefault(sub, {})
                d = sub
        if (
            rel in self.dirs
            and (data is not None or link is not None)
            or rel in self.links
            or (rel in self.files and data is None)
        ):
            self._bad(f"refused member {_short(name, 60)}: named twice")
        self._count(name, rel)
        self.dirs[head][leaf] = None
        if data is not None:
            self.files[rel] = data
        elif link is not None:
            self.links[rel] = link
        else:
            self.dirs.setdefault(rel, {})

    def _tar(self, data: bytes) -> None:
        import io
        import tarfile
        import zlib

        kind = {b"\x1f\x8b": "gzip", b"BZ": "bz2", b"\xfd7": "lzma"}.get(data[:2])
        try:
            if kind is not None:
                mod = __import__(kind)
                bad: Tuple[Type[BaseException], ...] = (
                    OSError,
                    EOFError,
                    ValueError,
                    zlib.error,
                    getattr(mod, "LZMAError", OSError),
                )
                try:
                    with mod.open(io.BytesIO(data)) as z:
                        data = z.read(_TREE_MAX_TOTAL + 1)
                except bad as e:
                    self._bad(f"{kind}: {e}")
                if len(data) > _TREE_MAX_TOTAL:
                    self._bad(f"more than {_TREE_MAX_TOTAL >> 20} MiB uncompressed")
            self._room = _TREE_ROOM_PER_BYTE * len(data) + _TREE_ROOM_EXTRA
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
                for m in tar:
                    if m.isdir():
                        self._add(m.name)
                    elif m.issym():
                        self._add(m.name, link=m.linkname)
                    elif (
                        m.isfile()
                        and m.type != tarfile.GNUTYPE_SPARSE
                        and m.offset_data + m.size <= len(data)
                    ):
                        self._add(m.name, data[m.offset_data : m.offset_data + m.size])
                    else:
                        self._bad(
                            f"refused member {_short(m.name, 60)}: only files, "
                            "folders and symbolic links, whole"
                        )
                end = tar.offset
        except (tarfile.TarError, EOFError) as e:
            self._bad(str(e) or type(e).__name__)
        # tarfile stops quietly at a header it cannot read: only the end-of-archive
        # block says that nothing was cut off.
        if data[end : end + 512] != bytes(512):
            self._bad(f"truncated or damaged at byte {end}")

    def _text(self, data: bytes) -> None:
        import base64

        self._room = _TREE_ROOM_PER_BYTE * len(data) + _TREE_ROOM_EXTRA
        parts = _ENTRY_RE.split(data)  # preamble, then (header, body) pairs
        if any(ln and not ln.startswith(b"#") for ln in parts[0].split(b"\n")):
            self._bad("text before the first '>>> PATH' line")
        for i in range(1, len(parts), 2):
            head, *flags = parts[i].split(b" ")
            name, body = _unquote(head), parts[i + 1]
            if flags[:1] == [b"->"] and len(flags) == 2 and not body:
                self._add(name, link=_unquote(flags[1]))
            elif name.endswith("/") and not flags and not body:
                self._add(name)
            elif flags == [b"base64"]:
                try:
                    self._add(name, base64.b64decode(body.replace(b"\n", b""), validate=True))
                except ValueError as e:
                    self._bad(f"{_short(name, 60)}: {e}")
            elif flags in ([], [b"noeol"]):
                if b"\\" in body:
                    body = _UNESCAPE_RE.sub(b"", body)
                self._add(name, body[:-1] if flags and body.endswith(b"\n") else body)
            else:
                self._bad(f"bad entry line {_short(parts[i].decode('utf-8', 'replace'))}")

    def subtree(self) -> SavedArchive:
        """The saved root in the archive: root/ (as tools/gather.py writes it) or the
        archive's top when that holds sys/ or proc/."""
        for base in ("root", ""):
            if any(f"{base}/{d}".lstrip("/") in self.dirs for d in ("sys", "proc")):
                break
        else:
            raise ValueError(f"{self.path}: no sys/ or proc/ in the archive (nor under root/)")
        if base:
            p, top = base + "/", self.dirs[base]
            self.files = {k[len(p) :]: v for k, v in self.files.items() if k.startswith(p)}
            self.links = {k[len(p) :]: v for k, v in self.links.items() if k.startswith(p)}
            self.dirs = {k[len(p) :]: v for k, v in self.dirs.items() if k.startswith(p)}
            self.dirs[""] = top
        return self

    def read(self, rel: str, path: str, limit: int) -> str:
        """``rel``'s text; ELOOP when it is a link (LinuxBackend then follows it)."""
        data = self.files.get(rel)
        if data is None:
            if rel in self.links:
                err = errno.ELOOP
            elif rel in self.dirs:
                err = errno.EISDIR
            else:
                err = errno.ENOENT
            raise OSError(err, os.strerror(err), path)
        if len(data) > limit:
            raise OSError(errno.EFBIG, f"larger than {limit >> 20} MiB", path)
        return data.decode("utf-8", "replace")

    def listdir(self, rel: str, path: str) -> List[str]:
        names = self.dirs.get(rel)
        if names is None:
            err = errno.ENOTDIR if rel in self.files else errno.ENOENT
            raise OSError(err, os.strerror(err), path)
        return list(names)


def open_tree(path: str) -> SavedTree:
    """The saved tree at ``path`` for LinuxBackend: a folder, or a tree saved in one
    file (text archive or tar, as its SavedArchive)."""
    if os.path.isfile(path):
        return SavedTree(SavedArchive(path).subtree())
    return SavedTree(_saved_folder(os.path.abspath(path)))


class _Pol(_Record):
    """A struct mempolicy."""

    mode: int  # Mode value, without flags
    flags: int  # ModeFlag bits
    nodes: FrozenSet[int]  # effective nodes (after cpuset)
    user_nodes: FrozenSet[int]  # as the caller gave them (reported for =static/=relative)
    home_node: int = -1

    def describe(self) -> str:
        """The policy as /proc/<pid>/numa_maps prints it (mpol_to_str)."""
        return str(_nu.PolicyInfo(Mode(self.mode), self.flags, self.nodes))


# The header line of /proc/sysvipc/shm (ipc/shm.c sysvipc_shm_proc_show).
_SYSVIPC_HEADER = (
    "       key      shmid perms                  size  cpid  lpid nattch"
    "   uid   gid  cuid  cgid      atime      dtime      ctime          "
    "         rss                  swap\n"
)

# ===========================================================================
# SimulatedBackend: a model of the kernel's memory-policy semantics behind the same
# seam, so that multi-node logic runs on single-node machines.  It sits at the raw
# syscall boundary: it gets the syscall number and plain integer arguments, decodes
# them with the simulated ABI's table and the kernel's own maxnode/mask rules
# (mm/mempolicy.c), and reads and writes "user memory" through a pipe so that a bad
# pointer gives EFAULT, as in the kernel, instead of crashing the test process.
# ===========================================================================


class _Intervals:
    """Non-overlapping [start, end) -> value intervals (policies by address/page)."""

    def __init__(self) -> None:
        self.items: List[Tuple[int, int, Any]] = []

    def set(self, start: int, end: int, value: Any) -> None:
        out = []
        for s, e, v in self.items:
            if e <= start or s >= end:
                out.append((s, e, v))
                continue
            if s < start:
                out.append((s, start, v))
            if e > end:
                out.append((end, e, v))
        if value is not None:
            out.append((start, end, value))
        out.sort(key=lambda t: t[0])
        self.items = out

    def get(self, pos: int) -> Any:
        for s, e, v in self.items:
            if s <= pos < e:
                return v
        return None

    def pieces(self, start: int, end: int) -> List[Tuple[int, int, Any]]:
        """[start, end) cut at interval edges, each piece with its value (or None)."""
        cuts = {start, end}
        for s, e, _ in self.items:
            if start < s < end:
                cuts.add(s)
            if start < e < end:
                cuts.add(e)
        edges = sorted(cuts)
        return [(a, z, self.get(a)) for a, z in zip(edges, edges[1:])]


class _Runs:
    """A per-page sequence of ints held as runs of one value: a sparse object's node,
    dirty and mapcount and its mappings' mapped flags, so that memory goes by runs,
    not by pages (a 32 GiB object bound to one node, touched or not, is a few runs).
    Read and written by index and sliced as the flat arrays are; ``runs`` and
    ``fill`` work a range at a time."""

    __slots__ = ("size", "starts", "vals")

    def __init__(self, size: int, value: int) -> None:
        self.size = size
        self.starts: List[int] = [0] if size else []  # where each run begins
        self.vals: List[int] = [value] if size else []  # never two equal in a row

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            start, stop, _ = key.indices(self.size)
            part = _Runs(max(stop - start, 0), 0)
            part.starts, part.vals = [], []
            for a, _, value in self.runs(start, stop):
                part.starts.append(a - start)
                part.vals.append(value)
            return part
        if not 0 <= key < self.size:
            raise IndexError(key)
        return self.vals[bisect.bisect_right(self.starts, key) - 1]

    def __setitem__(self, key: int, value: int) -> None:
        self.fill(key, key + 1, value)

    def runs(self, start: int, stop: int) -> List[Tuple[int, int, int]]:
        """[start, stop) as (start, end, value) runs."""
        stop = min(stop, self.size)
        if start >= stop:
            return []
        first = bisect.bisect_right(self.starts, start) - 1  # the run holding start
        past = bisect.bisect_left(self.starts, stop)  # the first run from stop on
        edges = [start] + self.starts[first + 1 : past] + [stop]
        return list(zip(edges, edges[1:], self.vals[first:past]))

    def fill(self, start: int, stop: int, value: int) -> None:
        """Set [start, stop) to ``value``."""
        if start < stop:
            self._splice(start, stop, [start], [value])

    def assign(self, start: int, values: List[int]) -> None:
        """Set [start, start + len(values)) to ``values`` (one splice, not one per
        value: a run of pages faulted at once)."""
        starts: List[int] = []
        vals: List[int] = []
        for i, value in enumerate(values):
            if not vals or vals[-1] != value:
                starts.append(start + i)
                vals.append(value)
        if vals:
            self._splice(start, start + len(values), starts, vals)

    def _splice(self, start: int, stop: int, starts: List[int], vals: List[int]) -> None:
        """Replace [start, stop) by the runs ``starts``/``vals`` (starts[0] == start)."""
        first = bisect.bisect_left(self.starts, start)  # runs from here on are
        past = bisect.bisect_right(self.starts, stop)  # replaced up to here
        if stop < self.size:
            after = self.vals[past - 1]  # the value at stop, kept
            if after != vals[-1]:
                starts.append(stop)
                vals.append(after)
        if first > 0 and self.vals[first - 1] == vals[0]:
            del starts[0], vals[0]  # one run with the one before
        self.starts[first:past] = starts
        self.vals[first:past] = vals


# Simulated shmids and fds start past INT_MAX: the kernel's ipc ids and fds are ints
# >= 0, and either truncated to the syscall's int is negative, so a real shmctl, shmat,
# close or mmap handed one fails (EINVAL, EBADF) and never reaches a host object;
# Python's os functions refuse them (OverflowError).  Still >= 0, as real ones are.
_SIM_ID_BASE = 1 << 31


def _map_noreserve() -> int:
    """MAP_NORESERVE on this host (not every Python's mmap module names it)."""
    machine = os.uname().machine
    if machine.startswith(("ppc", "sparc")):
        return 0x40
    if machine.startswith("mips"):
        return 0x400
    return 0x4000


class _SimObject:
    """A shared memory object (SysV segment, tmpfs/memfd file): the shared policy and
    the pages live here, so every process mapping it sees the same placement.

    Per-page state is kept in flat arrays (node id or -1, dirty flag, how many page
    tables map the page), so a 1 GiB object (262,144 pages) renders in milliseconds.
    A ``sparse`` object (larger than the kernel's ``sparse_above``) keeps them as
    runs (_Runs) and its memory as a MAP_NORESERVE mapping: only the pages touched
    for real (a record, a test's data) take memory, however large it is.
    """

    def __init__(
        self,
        name: str,
        size: int,
        page: int,
        *,
        shared_policy: bool = True,
        path: Optional[str] = None,
        sparse: bool = False,
    ) -> None:
        self.name = name
        self.size = size
        self.page = page
        self.npages = (size + page - 1) // page
        self.policy = _Intervals()  # by page index
        self.sparse = sparse
        self.node: Any = None  # page index -> node, -1 (array or _Runs)
        self.dirty: Any = None
        self.mapcount: Any = None
        self.new_pages()
        # hugetlbfs has no shared policy (no set_policy vm op): the policy lives in
        # each process's VMA, which is why every attacher must mbind its own mapping.
        self.shared_policy = shared_policy
        self.path = path if path is not None else "/" + name  # numa_maps file=
        self.deleted = False
        self.backing: Optional[Any] = None  # real memory standing in for it
        self.thp = False  # MADV_HUGEPAGE given and honoured
        self.resv = 0  # huge pages reserved for it, not faulted yet

    def new_pages(self) -> None:
        """Fresh per-page state for ``npages`` pages, none faulted yet."""
        import array

        if self.sparse:
            self.node = _Runs(self.npages, -1)
            self.dirty = _Runs(self.npages, 0)
            self.mapcount = _Runs(self.npages, 0)
            return
        self.node = array.array("h", [-1]) * self.npages
        self.dirty = bytearray(self.npages)
        self.mapcount = array.array("i", [0]) * self.npages

    def new_flags(self) -> Any:
        """A mapping's per-page "mapped" flags, all clear."""
        if self.sparse:
            return _Runs(self.npages, 0)
        return bytearray(self.npages)

    def resident(self) -> int:
        """How many of its pages are allocated."""
        if self.sparse:
            return sum(end - a for a, end, n in self.node.runs(0, self.npages) if n >= 0)
        return sum(1 for n in self.node if n >= 0)

    def address(self) -> int:
        """Where the object's memory is, aligned to its page size as the kernel
        aligns every mapping (the host's pages may be smaller than simulated ones)."""
        import mmap as _mmap

        length = max(self.npages, 1) * self.page + self.page
        if self.backing is None and self.sparse:
            flags = _mmap.MAP_SHARED | _map_noreserve()
            try:
                self.backing = _mmap.mmap(-1, length, flags=flags)
            except OSError as e:
                raise _oserror(
                    e.errno or errno.ENOMEM,
                    "map_object",
                    f"simulated: no address space for a sparse {format_size(length)}B object "
                    "(vm.overcommit_memory=2 commits MAP_NORESERVE too)",
                ) from None
        if self.backing is None:
            self.backing = _mmap.mmap(-1, length)
        base = _buffer_address(self.backing)
        return (base + self.page - 1) // self.page * self.page

    def label(self) -> str:
        path = self.path + (" (deleted)" if self.deleted else "")
        # seq_path(m, path, "\n\t= ") escapes these four characters as octal.
        for ch in "\n\t= ":
            path = path.replace(ch, f"\\{ord(ch):03o}")
        return "file=" + path

    def free_pages(self, kernel: _SimKernel) -> None:
        pool = kernel.pool(self.page)
        kernel.reserve(self, -self.resv)
        if self.sparse:
            for a, end, n in self.node.runs(0, len(self.node)):
                if n >= 0:
                    pool[n] = pool.get(n, 0) + end - a
                    kernel.charge(self, a - end)
            return
        for n in self.node:
            if n >= 0:
                pool[n] = pool.get(n, 0) + 1
                kernel.charge(self, -1)


class _SimMapping:
    """One VMA of a simulated process."""

    __slots__ = (
        "start",
        "end",
        "obj",
        "obj_page",
        "label",
        "mapped",
        "policy",
        "page",
        "attach_id",
    )

    def __init__(
        self,
        start: int,
        end: int,
        obj: Optional[_SimObject] = None,
        obj_page: int = 0,
        label: Optional[str] = "",
        mapped: Any = None,
        policy: Optional[_Intervals] = None,
        page: int = 0,
        attach_id: int = 0,
    ) -> None:
        self.start = start
        self.end = end
        self.obj = obj  # shared object, or None: private anon
        self.obj_page = obj_page  # page index in obj at ``start``
        self.label = label  # numa_maps "file=..."; None: the object's
        self.mapped = mapped  # shared: pages in this page table (bytearray, _Runs)
        self.policy = policy  # per-VMA policy of a hugetlb mapping
        self.page = page  # page size (hugetlb: the huge size)
        self.attach_id = attach_id  # one shmat/mmap call (for unmapping)


class _SimShm:
    """A SysV segment (ipc/shm.c struct shmid_kernel)."""

    def __init__(
        self,
        key: int,
        shmid: int,
        size: int,
        mode: int,
        uid: int,
        gid: int,
        cuid: int,
        cgid: int,
        cpid: int,
        obj: _SimObject,
    ) -> None:
        self.key, self.shmid, self.size, self.mode = key, shmid, size, mode
        self.uid, self.gid, self.cuid, self.cgid = uid, gid, cuid, cgid
        self.cpid, self.obj = cpid, obj
        self.lpid = 0
        self.nattch = 0
        import time

        self.used = int(time.time())  # latest shm_atime/dtime/ctime
        self.dest = False  # IPC_RMID while attached (SHM_DEST)


class _SimFile(_Record):
    """A file in the simulated /dev/shm (tmpfs)."""

    name: str
    mode: int
    uid: int
    gid: int
    obj: _SimObject


# Objects larger than this many bytes are sparse (_SimObject): reserved address
# space, per-page state as runs.  SimulatedBackend(sparse_above=...) sets it.  Up to
# it, flat arrays (8 bytes a page: 4 MiB at 2 GiB) keep faulting and numa_maps of
# the 1 GiB regions most tests make fast; above it, an interleaved range costs one
# run per faulted page.
SPARSE_ABOVE = 2 << 30


class _SimKernel:
    """State shared by every simulated process: topology, free pages, objects."""

    def __init__(
        self,
        topo: Topology,
        page: int,
        free_kb: Optional[Mapping[int, int]],
        max_numnodes: int,
        numa: bool,
    ) -> None:
        self.topo = topo
        self.page = page
        self.numa = numa
        self.max_numnodes = max_numnodes
        self.free_pages: Dict[int, int] = {}
        for n in topo.nodes_with_memory:
            kb = (free_kb or {}).get(n, topo.nodes[n].mem_free_kb if n in topo.nodes else 0)
            self.free_pages[n] = kb * 1024 // page
        self.objects: Dict[str, _SimObject] = {}
        self.fail: Dict[str, Tuple[int, Optional[int]]] = {}  # name -> (errno, times)
        self.next_pid = 4242
        self.clock = 0  # thread starts so far: each new thread's start time differs
        self.calls: List[Tuple[str, Tuple[int, ...]]] = []
        # Shared memory: SysV segments by shmid, /dev/shm files by name.
        self.shm: Dict[int, _SimShm] = {}
        self.next_shmid = 0
        self.files: Dict[str, _SimFile] = {}
        self.flocks: Dict[str, Dict[Tuple[int, int], int]] = {}  # object -> (pid, fd)
        self.next_attach = 0
        self.procs: List[Any] = []  # weakrefs to every process
        # Weighted interleave (mm/mempolicy.c iw_table): supported?, weights, auto.
        self.wi = topo.interleave_weights is not None
        self.wi_weights: Dict[int, int] = dict(topo.interleave_weights or {})
        self.wi_auto = topo.interleave_auto
        self.lock = threading.RLock()  # prefault threads fault concurrently
        # Huge page pools per size (kB) and node; cgroup v2 limits and what is charged
        # ("memory", "hugetlb.2MB" -> bytes); the size of the tmpfs on /dev/shm.
        self.huge_free = {
            kb: {n: nd.hugepages[kb].free for n, nd in topo.nodes.items() if kb in nd.hugepages}
            for kb in {kb for nd in topo.nodes.values() for kb in nd.hugepages}
        }
        self.cgroup: Dict[str, int] = {}
        self.charged: Dict[str, int] = {}
        self.shm_size: Optional[int] = None
        self.sparse_above = SPARSE_ABOVE  # objects larger than this are sparse
        # The machine's huge page sizes (kB; its hstates: the hugepages-<kB>kB
        # folders) and the default one, which SHM_HUGETLB without a size gets; pages
        # reserved and not yet faulted, per size (resv_hugepages).
        self.huge_sizes = frozenset(self.huge_free)
        self.huge_default_kb = 2048
        self.huge_resv: Dict[int, int] = {}
        self.max_map_count = _MAX_MAP_COUNT  # VMAs a process may hold

    def sparse(self, size: int) -> bool:
        return size > self.sparse_above

    def task(self, tid: int) -> Optional[SimulatedBackend]:
        """The live process one of whose threads has id ``tid`` (ids are kernel-wide:
        a process's and its threads' come from one space)."""
        for ref in self.procs:
            proc: Optional[SimulatedBackend] = ref()
            if proc is None or proc.dead:
                continue
            if tid == proc.pid or tid in proc.thread_affinity:
                return proc
        return None

    def read_huge_sizes(self, files: Backend) -> None:
        """The huge page sizes and the default one, as the saved machine has them."""
        listed = (
            files.listdir("/sys/kernel/mm/hugepages")
            if files.exists("/sys/kernel/mm/hugepages")
            else []
        )
        kbs = [int(d[10:-2]) for d in listed if re.fullmatch(r"hugepages-\d+kB", d)]
        self.huge_sizes = frozenset(kbs) | frozenset(self.huge_free)
        meminfo = _nu.parse_meminfo(_nu._read_optional(files, "/proc/meminfo") or "")
        self.huge_default_kb = meminfo.get("Hugepagesize", 2048)

    def reserve(self, obj: _SimObject, pages: int) -> None:
        """Huge pages reserved for ``obj`` (pages < 0: given back, or used by faults)."""
        kb = obj.page // 1024
        pages = max(pages, -obj.resv)
        obj.resv += pages
        self.huge_resv[kb] = self.huge_resv.get(kb, 0) + pages

    def pool(self, page: int) -> Dict[int, int]:
        return self.free_pages if page == self.page else self.huge_free.setdefault(page // 1024, {})

    def charge(self, obj: _SimObject, pages: int) -> None:
        """Charge (or with pages < 0 uncharge) ``pages`` of ``obj``: memory.max and
        memory.high (no swap: shared memory above high is never reclaimed, the
        allocating task stalls) or hugetlb.<size>.max; the /dev/shm tmpfs size."""
        name = "memory" if obj.page == self.page else f"hugetlb.{format_size(obj.page)}B"
        used = self.charged.get(name, 0) + pages * obj.page
        shm = obj.path.startswith("/dev/shm/")
        for lim in (f"{name}.max", f"{name}.high"):
            if pages > 0 and used > self.cgroup.get(lim, used):
                raise _oserror(errno.ENOMEM, "page fault", f"simulated: cgroup {lim}")
        if (
            pages > 0
            and shm
            and self.shm_size is not None
            and self.charged.get("/dev/shm", 0) + obj.page > self.shm_size
        ):
            raise _oserror(errno.EFAULT, "page fault", "simulated: /dev/shm is full")
        self.charged[name] = used
        if shm:
            self.charged["/dev/shm"] = self.charged.get("/dev/shm", 0) + pages * obj.page


def _shm_stat(*fields: Any, **more: Any) -> ShmStat:
    """A numa_utils_regions.ShmStat: only that file asks the model for one."""
    return _nu._sibling("numa_utils_regions").ShmStat(*fields, **more)  # type: ignore[no-any-return]


class SimulatedBackend(Backend):
    """One process on a simulated kernel, topology from a fake_sysfs tree.

    ``arch`` picks the ABI (syscall table, word size, byte order) and the page size
    (64 KiB on ppc64).  ``fail(name, errno)`` makes a syscall fail (EPERM like Docker's
    default seccomp profile, ENOSYS, EINVAL, ENOMEM ...).  ``numa=False`` models a
    kernel built without CONFIG_NUMA (every policy syscall ENOSYS, no numa_maps).
    ``process()`` gives another process on the same kernel (shared objects, free
    memory).  Shared memory objects larger than ``sparse_above`` bytes (default
    SPARSE_ABOVE, 2 GiB) are sparse: address space only, real memory for the
    pages touched for real, placement still page by page (kept as runs), so a
    test can make an engine's 32 GiB region on a smaller host.  Policies (of a
    range, and of each Python thread), first touch by the faulting thread's CPUs,
    interleave by page offset, bind, preferred, spill to the nearest node when one
    is full, the cpuset and vm.max_map_count (the saved machine's, else 65530) are
    modelled; the placement is rendered as /proc/self/numa_maps, the VMAs as
    /proc/self/maps.
    """

    is_live = False
    has_process = True

    def __init__(
        self,
        root: str,
        *,
        arch: str = "x86_64",
        page_size: Optional[int] = None,
        mems_allowed: Optional[Iterable[int]] = None,
        cpus_allowed: Optional[Iterable[int]] = None,
        free_kb: Optional[Mapping[int, int]] = None,
        cap_sys_nice: bool = True,
        numa: bool = True,
        populate: bool = True,
        max_numnodes: Optional[int] = None,
        uid: int = 1000,
        gid: int = 1000,
        weighted_interleave: Optional[bool] = None,
        cgroup: Optional[Mapping[str, int]] = None,
        shm_size: Optional[int] = None,
        sparse_above: int = SPARSE_ABOVE,
        pid: Optional[int] = None,
        _kernel: Optional[_SimKernel] = None,
    ) -> None:
        if ".".join(_nu.__version__.split(".")[:2]) not in _MODELS:
            raise RuntimeError(
                f"numa_utils_sim {__version__} models numa_utils "
                f"{', '.join(_MODELS)}, not {_nu.__version__} "
                f"({_nu.__file__}): copy both from one release"
            )
        if isinstance(sparse_above, bool) or not isinstance(sparse_above, int) or sparse_above < 0:
            raise ValueError(f"sparse_above={sparse_above!r}: a size in bytes, an int >= 0")
        self.root = os.path.abspath(root)
        self._files = LinuxBackend(open_tree(self.root))
        bits = 32 if arch in ("i386", "i686", "arm", "armv7l", "x32") else 64
        self.abi = abi_for(arch, bits)
        self.page_size = page_size if page_size else _DEFAULT_PAGE.get(self.abi.name, 4096)
        if _kernel is None:
            topo = read_topology(backend=self._files)
            if max_numnodes is None:
                max_numnodes = {"aarch64": 64, "ppc64le": 256, "ppc64": 256}.get(
                    self.abi.name, 1024
                )
            _kernel = _SimKernel(
                topo, self.page_size, free_kb, max_numnodes, numa and topo.has_node_dir
            )
            # MPOL_WEIGHTED_INTERLEAVE is Linux 6.9+: a tree with its sysfs weights is
            # such a kernel, unless the caller says otherwise.
            if weighted_interleave is not None:
                _kernel.wi = weighted_interleave
                if weighted_interleave and not _kernel.wi_weights:
                    _kernel.wi_weights = {n: 1 for n in topo.possible_nodes}
            _kernel.cgroup, _kernel.shm_size = dict(cgroup or {}), shm_size
            _kernel.sparse_above = sparse_above
            _kernel.read_huge_sizes(self._files)
            # The saved machine's vm.max_map_count, else the kernel's default.
            limit = _nu._read_optional(self._files, "/proc/sys/vm/max_map_count") or ""
            _kernel.max_map_count = _nu._uint(limit.strip()) or _MAX_MAP_COUNT
        self.kernel = _kernel
        topo = _kernel.topo
        if pid is None:
            pid = _kernel.next_pid
            _kernel.next_pid += 1
        elif _kernel.task(pid) is not None:
            raise ValueError(f"pid {pid} is in use")
        self.pid = pid  # given: a pid reused after its task exited
        self.cap_sys_nice = cap_sys_nice
        self.populate = populate
        self.cpus_allowed = (
            frozenset(cpus_allowed) if cpus_allowed is not None else topo.allowed_cpus
        )
        self.mems_allowed = (
            frozenset(mems_allowed) if mems_allowed is not None else topo.allowed_mems
        )
        # The main thread's CPUs and policy (the one that made this process), and the
        # others' own: a Python thread that set none has the main thread's (the kernel
        # gives a new thread its creator's), and its own die with it.
        self.affinity = self.cpus_allowed
        self.main_thread = threading.get_ident()
        self.main_policy: Optional[_Pol] = None
        self._own = threading.local()
        self.thread_affinity: Dict[int, FrozenSet[int]] = {}  # other threads: tid ->
        self.thread_names: Dict[int, str] = {self.pid: "python3"}  # tid -> comm
        self.thread_start: Dict[int, int] = {}  # other threads: tid -> start time
        self.mappings: List[_SimMapping] = []
        self.policy = _Intervals()  # private ranges: by address
        self.pages: Dict[int, int] = {}  # private: page address -> node
        self._il_prev: Dict[int, int] = {}
        self._il_weight: Dict[int, int] = {}  # tid -> weight left at _il_prev
        self._numbers = {v: k for k, v in (self.abi.syscalls or {}).items()}
        self._pipe: Optional[Tuple[int, int]] = None
        self._keep: List[Any] = []
        self.uid, self.gid = uid, gid
        self.fds: Dict[int, _SimFile] = {}
        self.shm_attached: Dict[int, int] = {}  # address -> shmid
        self.dup_maps: Dict[int, int] = {}  # address -> further mappings there
        self.dead = False
        self.boottime = 0  # set it: this process is in a time namespace of its own
        import weakref

        _kernel.procs.append(weakref.ref(self))

    def __repr__(self) -> str:
        return f"SimulatedBackend({self.root!r}, arch={self.abi.name!r}, pid={self.pid})"

    # -- processes, failures, inspection ---------------------------------------------
    def process(self, **kw: Any) -> SimulatedBackend:
        """Another process on the same simulated kernel (``pid=``: reusing the id of
        a task that has exited)."""
        return SimulatedBackend(
            self.root, arch=self.abi.name, page_size=self.page_size, _kernel=self.kernel, **kw
        )

    def fail(self, name: str, err: int, times: Optional[int] = None) -> None:
        """Make syscall ``name`` ("mbind", "*" for every policy call) fail with errno."""
        self.kernel.fail[name] = (err, times)

    def clear_failures(self) -> None:
        self.kernel.fail.clear()

    def add_thread(
        self,
        affinity: Optional[Iterable[int]] = None,
        name: str = "python3",
        tid: Optional[int] = None,
    ) -> int:
        """Another thread in this process (for binding tests) named ``name`` (its
        /proc/self/task/TID/comm); returns its tid.  ``tid``: the id of a task that
        has exited, reused (its start time differs)."""
        k = self.kernel
        if tid is None:
            tid = k.next_pid
            k.next_pid += 1
        elif k.task(tid) is not None:
            raise ValueError(f"tid {tid} is in use")
        self.thread_affinity[tid] = frozenset(affinity) if affinity is not None else self.affinity
        self.thread_names[tid] = name
        k.clock += 1
        self.thread_start[tid] = 100 * tid + k.clock
        return tid

    def end_thread(self, tid: int) -> None:
        """Thread ``tid`` exits."""
        del self.thread_affinity[tid]

    def _call_gettid(self) -> int:
        return self.pid

    def _call_threads(self) -> List[int]:
        return sorted([self.pid, *self.thread_affinity])

    @property
    def topology(self) -> Topology:
        return self.kernel.topo

    def thread_cpus(self) -> FrozenSet[int]:
        """The calling thread's CPUs (first touch is per thread)."""
        mine: FrozenSet[int] = getattr(self._own, "cpus", self.affinity)
        return mine

    def thread_policy(self) -> Optional[_Pol]:
        """The calling thread's policy (set_mempolicy is per thread)."""
        if threading.get_ident() == self.main_thread:
            return self.main_policy
        pol: Optional[_Pol] = getattr(self._own, "policy", self.main_policy)
        return pol

    def current_cpu(self) -> Optional[int]:
        return min(self.thread_cpus(), default=None)

    def local_node(self) -> int:
        cpu = self.current_cpu()
        node = self.kernel.topo.node_of_cpu(cpu) if cpu is not None else None
        return node if node is not None else min(self.kernel.topo.online_nodes or {0})

    # -- files --------------------------------------------------------------------------
    def _is_own_proc(self, path: str, leaf: str) -> bool:
        return path in (
            f"/proc/self/{leaf}",
            f"/proc/{self.pid}/{leaf}",
            f"/proc/thread-self/{leaf}",
        )

    def read_text(self, path: str) -> str:
        if self._is_own_proc(path, "numa_maps"):
            if not self.kernel.numa:
                raise FileNotFoundError(errno.ENOENT, "no numa_maps (kernel without NUMA)", path)
            return self.render_numa_maps()
        if self._is_own_proc(path, "maps"):
            return self.render_maps()
        if self._is_own_proc(path, "status"):
            return self._render_status()
        comm = re.match(r"^/proc/(?:self|\d+)/task/(\d+)/comm$", path)
        if comm and int(comm.group(1)) in self.call("threads"):
            return self.thread_names.get(int(comm.group(1)), "") + "\n"
        task = re.match(rf"^/proc/(?:self|{self.pid})/task/(\d+)/stat$", path)
        if task and int(task.group(1)) in self.call("threads"):
            return self._render_task_stat(int(task.group(1)))
        if path == "/proc/sys/vm/max_map_count":
            return f"{self.kernel.max_map_count}\n"
        if path == "/proc/sysvipc/shm":
            return self._render_sysvipc()
        k = self.kernel
        if path == "/proc/self/cgroup" and k.cgroup:
            return "0::/sim\n"
        if path.startswith(_CGROUP + "/sim/") and k.cgroup:
            leaf = path[len(_CGROUP) + 5 :]
            if leaf.endswith(".current") or leaf in k.cgroup:
                return f"{k.cgroup.get(leaf, k.charged.get(leaf[:-8], 0))}\n"
        # What fit() reads is what this kernel has left: MemFree and free huge pages
        # (no page cache to reclaim).
        m = re.match(
            rf"^{_NODE_DIR}/node(\d+)/(meminfo|hugepages/hugepages-(\d+)kB/"
            r"free_hugepages)$",
            path,
        )
        if m and m.group(3):
            return f"{k.huge_free.get(int(m.group(3)), {}).get(int(m.group(1)), 0)}\n"
        g = re.match(r"^/sys/kernel/mm/hugepages/hugepages-(\d+)kB/(free|resv)_hugepages$", path)
        if g and int(g.group(1)) in k.huge_sizes:
            return f"{self._huge_count(int(g.group(1)), g.group(2))}\n"
        if path == "/proc/meminfo":
            kb = k.huge_default_kb
            return re.sub(
                r"(?m)^HugePages_(Free|Rsvd):(\s+)\d+",
                lambda x: f"HugePages_{x.group(1)}:{x.group(2)}{self._huge_count(kb, x.group(1))}",
                self._files.read_text(path),
            )
        if m:
            free = k.free_pages.get(int(m.group(1)), 0) * k.page // 1024
            return re.sub(
                r"(MemFree|Active\(file\)|Inactive\(file\)):(\s+)\d+",
                lambda x: f"{x.group(1)}:{x.group(2)}{free if x.group(1) == 'MemFree' else 0}",
                self._files.read_text(path),
            )
        if path.startswith(_WI_DIR + "/"):
            leaf = self._wi_leaf(path)
            if leaf == "auto":
                return "true\n" if self.kernel.wi_auto else "false\n"
            return f"{self._il_w(int(leaf[4:]))}\n"
        return self._files.read_text(path)

    def _huge_count(self, kb: int, which: str) -> int:
        """Free (all nodes) or reserved huge pages of ``kb`` kB, as the kernel counts
        them in /sys/kernel/mm/hugepages and /proc/meminfo."""
        if which.lower() == "free":
            return sum(self.kernel.huge_free.get(kb, {}).values())
        return self.kernel.huge_resv.get(kb, 0)

    def _wi_leaf(self, path: str) -> str:
        """The weighted_interleave file ``path`` names; ENOENT when the simulated
        kernel has no such file."""
        leaf = path[len(_WI_DIR) + 1 :]
        k = self.kernel
        if not k.wi or not (
            (leaf == "auto" and k.wi_auto is not None)
            or (leaf.startswith("node") and leaf[4:].isdigit() and int(leaf[4:]) in k.wi_weights)
        ):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        return leaf

    def write_text(self, path: str, text: str) -> None:
        """The weighted-interleave weights (root only, 1-255, as sysfs node_store)."""
        if not path.startswith(_WI_DIR + "/"):
            raise _oserror(errno.EACCES, f"open {path}", "not modelled as writable")
        leaf = self._wi_leaf(path)
        if self.uid != 0:
            raise _oserror(errno.EACCES, f"open {path}")
        t = text.strip()
        if leaf == "auto":
            if t not in ("true", "false", "1", "0"):
                raise _oserror(errno.EINVAL, f"write {path}")
            self.kernel.wi_auto = t in ("true", "1")
            return
        if not t.isdigit() or not 1 <= int(t) <= 255:
            raise _oserror(errno.EINVAL, f"write {path}", "weight must be 1-255")
        self.kernel.wi_weights[int(leaf[4:])] = int(t)
        if self.kernel.wi_auto is not None:
            self.kernel.wi_auto = False  # writing a weight leaves auto mode (6.16)

    def _il_w(self, node: int) -> int:
        return self.kernel.wi_weights.get(node, 1)

    def _il_period(self, pol: _Pol) -> List[int]:
        """One period of the interleave walk, indexed by ilx % its length (mm/mempolicy.c
        interleave_nid, weighted_interleave_nid): the nodes in id order, each repeated
        ``weight`` times under weighted interleave."""
        order = sorted(pol.nodes)
        if pol.mode == Mode.WEIGHTED_INTERLEAVE:
            order = [n for n in order for _ in range(self._il_w(n))]
        return order

    def _wi_next(self, order: Sequence[int]) -> int:
        """The per-task counter for allocations without an interleave index
        (mm/mempolicy.c weighted_interleave_nodes: il_prev, il_weight)."""
        tid = threading.get_ident()
        prev = self._il_prev.get(tid, -1)
        if not self._il_weight.get(tid) or prev not in order:
            nxt = [n for n in order if n > prev]
            prev = nxt[0] if nxt else order[0]
            self._il_prev[tid] = prev
            self._il_weight[tid] = self._il_w(prev)
        self._il_weight[tid] -= 1
        return prev

    def listdir(self, path: str) -> List[str]:
        if path.rstrip("/") == "/dev/shm":
            return sorted(self.kernel.files)
        if path.rstrip("/") == _WI_DIR:
            if not self.kernel.wi:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            return [f"node{n}" for n in sorted(self.kernel.wi_weights)] + (
                ["auto"] if self.kernel.wi_auto is not None else []
            )
        return self._files.listdir(path)

    def exists(self, path: str) -> bool:
        if self._is_own_proc(path, "numa_maps"):
            return self.kernel.numa
        if path.startswith("/dev/shm/"):
            return path[9:] in self.kernel.files
        if path.rstrip("/") == _WI_DIR:
            return self.kernel.wi
        if path.startswith(_WI_DIR + "/"):
            return _nu._read_optional(self, path) is not None
        return self._files.exists(path)

    def realpath(self, path: str) -> str:
        return self._files.realpath(path)

    def _render_task_stat(self, tid: int) -> str:
        """/proc/self/task/TID/stat (proc(5)) with the fields numa_utils reads: the
        state (field 3), the start time (22) and the CPU it last ran on (39)."""
        fields = ["S"] + ["0"] * 49  # fields 3-52
        fields[19] = str(self.thread_start.get(tid, 100 * self.pid + self.boottime))
        fields[36] = str(min(self.call("sched_getaffinity", tid), default=0))
        return f"{tid} ({self.thread_names.get(tid, '')}) {' '.join(fields)}\n"

    def _render_status(self) -> str:
        base = _nu._read_optional(self._files, "/proc/self/status") or ""
        lines = [
            ln
            for ln in base.splitlines()
            if not ln.startswith(("Cpus_allowed_list", "Mems_allowed_list", "Pid:"))
        ]
        lines.append(f"Pid:\t{self.pid}")
        lines.append(f"Cpus_allowed_list:\t{format_cpulist(self.affinity)}")
        lines.append(f"Mems_allowed_list:\t{format_cpulist(self.mems_allowed)}")
        return "\n".join(lines) + "\n"

    # -- user memory, through a pipe: a bad pointer is EFAULT, not a crash -------------
    def _fds(self) -> Tuple[int, int]:
        if self._pipe is None:
            self._pipe = os.pipe()
        return self._pipe

    def _copy_from_user(self, addr: int, n: int) -> bytes:
        if n == 0:
            return b""
        if addr == 0:
            raise _oserror(errno.EFAULT, "copy_from_user")
        r, w = self._fds()
        out = bytearray()
        for off in range(0, n, 32768):
            k = min(32768, n - off)
            try:
                os.write(w, (ctypes.c_char * k).from_address(addr + off))
            except OSError:
                raise _oserror(errno.EFAULT, "copy_from_user") from None
            out += os.read(r, k)
        return bytes(out)

    def _copy_to_user(self, addr: int, data: bytes) -> None:
        if not data:
            return
        if addr == 0:
            raise _oserror(errno.EFAULT, "copy_to_user")
        r, w = self._fds()
        for off in range(0, len(data), 32768):
            chunk = data[off : off + 32768]
            os.write(w, chunk)
            try:
                os.readv(r, [(ctypes.c_char * len(chunk)).from_address(addr + off)])
            except OSError:
                os.read(r, len(chunk))
                raise _oserror(errno.EFAULT, "copy_to_user") from None

    # -- syscall entry --------------------------------------------------------------------
    def _call_syscall(self, nr: int, *args: int) -> int:
        name = self._numbers.get(nr)
        k = self.kernel
        k.calls.append((name or str(nr), tuple(args)))
        for key in (name, "*"):
            err = self._take_failure(key) if key is not None else None
            if err is not None:
                raise _oserror(err, name or f"syscall {nr}")
        if name is None or not k.numa:
            raise _oserror(errno.ENOSYS, f"syscall {nr}")
        # Scalars are truncated to the ABI's word; a 32-bit ABI simulated on a 64-bit
        # host keeps host-sized pointers (its "user memory" is the host's).
        width = _pointer_bits(self.abi)
        words = [a & ((1 << width) - 1) for a in args] + [0] * 6
        with k.lock:  # threads call at once (prefault's); user memory goes through one pipe
            return int(getattr(self, "_sys_" + name)(*words[:6]))

    def _signed(self, v: int, bits: int = 32) -> int:
        v &= (1 << bits) - 1
        return v - (1 << bits) if v >> (bits - 1) else v

    # -- kernel helpers (mm/mempolicy.c) ---------------------------------------------
    def _get_nodes(self, nmask: int, maxnode: int) -> FrozenSet[int]:
        maxnode = (maxnode - 1) & ((1 << self.abi.word_bits) - 1)
        if maxnode == 0 or nmask == 0:
            return frozenset()
        if maxnode > self.page_size * 8:
            raise _oserror(errno.EINVAL, "get_nodes", "maxnode too large")
        w = self.abi.word_bits
        nwords = (maxnode + w - 1) // w
        raw = self._copy_from_user(nmask, nwords * w // 8)
        nodes = frozenset(n for n in decode_nodemask(raw, self.abi) if n < maxnode)
        if any(n >= self.kernel.max_numnodes for n in nodes):
            raise _oserror(errno.EINVAL, "get_nodes", "node beyond MAX_NUMNODES")
        return nodes

    def _sanitize(self, mode: int) -> Tuple[int, int]:
        flags = mode & _MODE_FLAGS_MASK
        mode &= ~_MODE_FLAGS_MASK
        if mode < 0 or mode >= 7 or (mode == Mode.WEIGHTED_INTERLEAVE and not self.kernel.wi):
            raise _oserror(errno.EINVAL, "mempolicy", "invalid mode")
        if flags & ModeFlag.STATIC_NODES and flags & ModeFlag.RELATIVE_NODES:
            raise _oserror(errno.EINVAL, "mempolicy", "static and relative")
        if flags & ModeFlag.NUMA_BALANCING and mode not in (Mode.BIND, Mode.PREFERRED_MANY):
            raise _oserror(errno.EINVAL, "mempolicy", "balancing needs bind")
        return mode, flags

    def _mpol_new(self, mode: int, flags: int, nodes: FrozenSet[int]) -> Optional[_Pol]:
        if mode == Mode.DEFAULT:
            if nodes:
                raise _oserror(errno.EINVAL, "mempolicy", "default takes no nodes")
            return None
        if not nodes:
            if mode == Mode.PREFERRED:
                if flags & (ModeFlag.STATIC_NODES | ModeFlag.RELATIVE_NODES):
                    raise _oserror(errno.EINVAL, "mempolicy")
                mode = Mode.LOCAL
            elif mode != Mode.LOCAL:
                raise _oserror(errno.EINVAL, "mempolicy", "empty nodemask")
        elif mode == Mode.LOCAL:
            raise _oserror(errno.EINVAL, "mempolicy", "local takes no nodes")
        if mode == Mode.LOCAL:
            return _Pol(Mode.LOCAL, flags, frozenset(), frozenset())
        allowed = self.mems_allowed & self.kernel.topo.nodes_with_memory
        if flags & ModeFlag.RELATIVE_NODES:
            # mpol_relative_nodemask: fold the user mask onto the allowed nodes.
            order = sorted(allowed)
            eff = frozenset(order[n % len(order)] for n in nodes) if order else frozenset()
        else:
            eff = nodes & allowed
        if not eff:
            raise _oserror(errno.EINVAL, "mempolicy", "no allowed node in the mask")
        if mode == Mode.PREFERRED:
            eff = frozenset({min(eff)})
        return _Pol(mode, flags, eff, nodes)

    # -- syscalls -----------------------------------------------------------------------
    def _sys_set_mempolicy(self, mode: int, nmask: int, maxnode: int, *_: int) -> int:
        m, f = self._sanitize(self._signed(mode))
        nodes = self._get_nodes(nmask, maxnode)
        pol = self._mpol_new(m, f, nodes)
        if threading.get_ident() == self.main_thread:
            self.main_policy = pol
        else:
            self._own.policy = pol
        return 0

    def _sys_mbind(
        self, start: int, length: int, mode: int, nmask: int, maxnode: int, flags: int
    ) -> int:
        m, f = self._sanitize(self._signed(mode))  # kernel_mbind: int lmode = mode
        nodes = self._get_nodes(nmask, maxnode)
        if flags & ~7:
            raise _oserror(errno.EINVAL, "mbind", "invalid flags")
        if flags & MbindFlag.MOVE_ALL and not self.cap_sys_nice:
            raise _oserror(errno.EPERM, "mbind", "MPOL_MF_MOVE_ALL needs CAP_SYS_NICE")
        if start % self.page_size:
            raise _oserror(errno.EINVAL, "mbind", "unaligned start")
        if m == Mode.DEFAULT:
            flags &= ~MbindFlag.STRICT
        length = (length + self.page_size - 1) // self.page_size * self.page_size
        end = start + length
        if end >= 1 << _pointer_bits(self.abi):
            raise _oserror(errno.EINVAL, "mbind")
        if end == start:
            return 0
        pol = self._mpol_new(m, f, nodes)
        self._ensure_mapped(start, end)
        self._split(start)  # mbind splits VMAs at the range edges
        self._split(end)
        for mp in self._mappings_in(start, end):
            a, z = max(start, mp.start), min(end, mp.end)
            if mp.obj is not None:
                p0 = mp.obj_page + (a - mp.start) // mp.page
                self._pol_store(mp).set(p0, p0 + (z - a + mp.page - 1) // mp.page, pol)
            else:
                self.policy.set(a, z, pol)
        if flags & (MbindFlag.MOVE | MbindFlag.MOVE_ALL | MbindFlag.STRICT) and pol:
            misplaced = self._misplaced(start, end, pol)
            if flags & (MbindFlag.MOVE | MbindFlag.MOVE_ALL):
                for addr in misplaced:
                    if self._may_move(addr, flags):
                        node = self._alloc(pol, self._ilx(addr), self._pool_at(addr))
                        self._move_page(addr, node)
            elif misplaced:
                raise _oserror(errno.EIO, "mbind", "MPOL_MF_STRICT: misplaced pages")
        return 0

    def _sys_get_mempolicy(
        self, policy: int, nmask: int, maxnode: int, addr: int, flags: int, *_: int
    ) -> int:
        if flags & ~7:
            raise _oserror(errno.EINVAL, "get_mempolicy", "invalid flags")
        nr_node_ids = max(self.kernel.topo.possible_nodes, default=0) + 1
        if nmask and maxnode < nr_node_ids:
            raise _oserror(errno.EINVAL, "get_mempolicy", "maxnode < nr_node_ids")
        tid = threading.get_ident()
        value = 0
        if flags & GetFlag.MEMS_ALLOWED:
            if flags & (GetFlag.NODE | GetFlag.ADDR):
                raise _oserror(errno.EINVAL, "get_mempolicy")
            nodes = self.mems_allowed
        else:
            if flags & GetFlag.ADDR:
                if self._mapping_at(addr) is None:
                    raise _oserror(errno.EFAULT, "get_mempolicy", "address not mapped")
                pol = self._vma_policy(addr)
            elif addr:
                raise _oserror(errno.EINVAL, "get_mempolicy", "address without MPOL_F_ADDR")
            else:
                pol = self.thread_policy()
            if flags & GetFlag.NODE:
                if flags & GetFlag.ADDR:
                    page = addr - addr % self.page_size
                    node = self._node_of_page(page)
                    if node is None:
                        self._fault(page)
                        node = self._node_of_page(page)
                    value = node if node is not None else 0
                elif pol is not None and pol.mode == Mode.INTERLEAVE:
                    order = sorted(pol.nodes)
                    prev = self._il_prev.get(tid, -1)
                    nxt = [n for n in order if n > prev]
                    value = nxt[0] if nxt else order[0]
                elif pol is not None and pol.mode == Mode.WEIGHTED_INTERLEAVE:
                    order = sorted(pol.nodes)
                    prev = self._il_prev.get(tid, -1)
                    nxt = [n for n in order if n > prev] or order
                    value = prev if self._il_weight.get(tid) else nxt[0]
                else:
                    raise _oserror(errno.EINVAL, "get_mempolicy", "MPOL_F_NODE")
            else:
                value = (pol.mode | (pol.flags & _MODE_FLAGS_MASK)) if pol else 0
            if pol is None or pol.mode in (Mode.DEFAULT, Mode.LOCAL):
                nodes = frozenset()
            elif pol.flags & (ModeFlag.STATIC_NODES | ModeFlag.RELATIVE_NODES):
                nodes = pol.user_nodes
            else:
                nodes = pol.nodes
        if nmask:
            copy = ((maxnode - 1 + 63) // 64) * 8
            w = self.abi.word_bits
            nbytes = (nr_node_ids + w - 1) // w * (w // 8)
            if copy > nbytes:
                if copy > self.page_size:
                    raise _oserror(errno.EINVAL, "get_mempolicy")
                self._copy_to_user(nmask + nbytes, bytes(copy - nbytes))
                copy = nbytes
            self._copy_to_user(nmask, _encode_nodemask(nodes, copy // (w // 8), self.abi))
        if policy:
            self._copy_to_user(
                policy, struct.pack((">" if self.abi.byteorder == "big" else "<") + "i", value)
            )
        return 0

    def _sys_move_pages(
        self, pid: int, count: int, pages: int, nodes: int, status: int, flags: int
    ) -> int:
        if flags & ~(MbindFlag.MOVE | MbindFlag.MOVE_ALL):
            raise _oserror(errno.EINVAL, "move_pages")
        if flags & MbindFlag.MOVE_ALL and not self.cap_sys_nice:
            raise _oserror(errno.EPERM, "move_pages")
        if self._signed(pid) not in (0, self.pid):
            raise _oserror(errno.ESRCH, "move_pages")
        wb = _pointer_bits(self.abi) // 8
        raw = self._copy_from_user(pages, count * wb)
        addrs = [
            int.from_bytes(raw[i * wb : (i + 1) * wb], self.abi.byteorder) for i in range(count)
        ]
        e = ">" if self.abi.byteorder == "big" else "<"
        targets = None
        if nodes:
            targets = list(struct.unpack(f"{e}{count}i", self._copy_from_user(nodes, 4 * count)))
            for t in targets:
                if (
                    t < 0
                    or t >= self.kernel.max_numnodes
                    or t not in self.kernel.topo.nodes_with_memory
                ):
                    raise _oserror(errno.ENODEV, "move_pages")
                if t not in self.mems_allowed:
                    raise _oserror(errno.EACCES, "move_pages")
        out = []
        for i, a in enumerate(addrs):
            page = a - a % self.page_size
            if self._mapping_at(page) is None:
                out.append(-errno.EFAULT)
                continue
            found = self._node_of_page(page)
            if found is None:
                out.append(-errno.ENOENT)
                continue
            node = found
            if targets is not None and targets[i] != node:
                if not self._may_move(page, flags):
                    out.append(-errno.EACCES)  # mm/migrate.c add_page_for_migration
                    continue
                if self._pool_at(page).get(targets[i], 0) <= 0:
                    out.append(-errno.ENOMEM)
                    continue
                self._move_page(page, targets[i])
                node = targets[i]
            out.append(node)
        self._copy_to_user(status, struct.pack(f"{e}{count}i", *out))
        return 0

    def _sys_migrate_pages(self, pid: int, maxnode: int, old: int, new: int, *_: int) -> int:
        if self._signed(pid) not in (0, self.pid):
            raise _oserror(errno.ESRCH, "migrate_pages")
        old_n = self._get_nodes(old, maxnode)
        new_n = self._get_nodes(new, maxnode)
        if not new_n <= self.mems_allowed and not self.cap_sys_nice:
            raise _oserror(errno.EPERM, "migrate_pages")
        if not new_n <= self.kernel.topo.nodes_with_memory:
            raise _oserror(errno.EINVAL, "migrate_pages")
        src, dst = sorted(old_n), sorted(new_n)
        if not src or not dst:
            return 0
        remap = {s: dst[i % len(dst)] for i, s in enumerate(src)}
        # Every page of the process on the old nodes, whatever its mapping's policy;
        # with CAP_SYS_NICE the kernel asks for MPOL_MF_MOVE_ALL (kernel_migrate_pages).
        flags = MbindFlag.MOVE
        if self.cap_sys_nice:
            flags = MbindFlag.MOVE_ALL
        for page, node in list(self._all_pages()):
            if node in remap and remap[node] != node and self._may_move(page, flags):
                self._move_page(page, remap[node])
        return 0

    def _sys_set_mempolicy_home_node(
        self, start: int, length: int, home: int, flags: int, *_: int
    ) -> int:
        if flags or start % self.page_size:
            raise _oserror(errno.EINVAL, "set_mempolicy_home_node")
        if home >= self.kernel.max_numnodes or home not in self.kernel.topo.online_nodes:
            raise _oserror(errno.EINVAL, "set_mempolicy_home_node")
        end = start + (length + self.page_size - 1) // self.page_size * self.page_size
        for a, z, pol in self.policy.pieces(start, end):
            if pol is None:
                continue
            if pol.mode not in (Mode.BIND, Mode.PREFERRED_MANY):
                raise _oserror(errno.EOPNOTSUPP, "set_mempolicy_home_node")
            self.policy.set(a, z, pol._replace(home_node=home))
        return 0

    # -- memory ---------------------------------------------------------------------------
    def map_object(
        self,
        name: str,
        size: int,
        *,
        create: bool = True,
        label: Optional[str] = None,
        page_size: Optional[int] = None,
        path: Optional[str] = None,
    ) -> int:
        """Map shared object ``name`` (created if needed) into this process; its address.

        Real memory stands behind it (one anonymous mapping per object, shared by every
        simulated process) so that data written by one process is seen by the others.
        ``page_size`` larger than the base page makes a hugetlb object (per-VMA policy,
        " huge" in numa_maps).
        """
        k = self.kernel
        obj = k.objects.get(name)
        if obj is None:
            if not create:
                raise _oserror(errno.ENOENT, "map_object", name)
            pg = page_size or self.page_size
            obj = _SimObject(
                name, size, pg, shared_policy=pg == self.page_size, path=path, sparse=k.sparse(size)
            )
            k.objects[name] = obj
        addr = obj.address()
        first = self._find_mapping(addr)
        if first is not None and first.start == addr and first.obj is obj:
            # Mapped here already (a region's record read by its own process): the
            # kernel gives another address, this model shares one and counts it.
            self.dup_maps[addr] = self.dup_maps.get(addr, 0) + 1
            return addr
        self._vma_room("mmap")
        k.next_attach += 1
        mp = _SimMapping(
            addr,
            addr + obj.npages * obj.page,
            obj,
            0,
            label,
            obj.new_flags(),
            None if obj.shared_policy else _Intervals(),
            obj.page,
            k.next_attach,
        )
        self.unmap(addr)
        self._drop_private(mp.start, mp.end)
        self.mappings.append(mp)
        self.mappings.sort(key=lambda m: m.start)
        return addr

    def unmap(self, addr: int) -> None:
        """Remove the mapping made at ``addr`` (all its VMAs, if mbind split it)."""
        first = self._find_mapping(addr)
        if first is None or first.start != addr:
            self.mappings = [m for m in self.mappings if m.start != addr]
            return
        gone = [
            m
            for m in self.mappings
            if m.obj is not None and first.obj is not None and m.attach_id == first.attach_id
        ] or [first]
        for m in gone:
            if m.obj is not None and m.obj.sparse:
                mc = m.obj.mapcount
                for a, end, count in self._mapped_runs(m, mc, 0, len(m.mapped)):
                    mc.fill(a, end, count - 1)
            elif m.obj is not None and m.mapped is not None:
                mc = m.obj.mapcount
                for idx in (i for i, f in enumerate(m.mapped) if f):
                    mc[m.obj_page + idx] -= 1
        self.mappings = [m for m in self.mappings if all(m is not g for g in gone)]

    def _drop_private(self, start: int, end: int) -> None:
        """A new mapping replaces private memory the simulator saw at those addresses
        earlier (a freed test buffer whose addresses the host reused), as mmap does."""
        keep: List[_SimMapping] = []
        for m in self.mappings:
            if m.obj is not None or m.end <= start or m.start >= end:
                keep.append(m)
                continue
            if m.start < start:
                keep.append(_SimMapping(m.start, start, label=m.label))
            if m.end > end:
                keep.append(_SimMapping(end, m.end, label=m.label))
        self.mappings = keep
        for page in [p for p in self.pages if start <= p < end]:
            node = self.pages.pop(page)
            self.kernel.free_pages[node] = self.kernel.free_pages.get(node, 0) + 1
        self.policy.set(start, end, None)

    def remove_object(self, name: str) -> None:
        obj = self.kernel.objects.pop(name, None)
        if obj is not None:
            obj.free_pages(self.kernel)
            obj.node = obj.node[:0]

    def _ensure_mapped(self, start: int, end: int) -> None:
        """Unknown addresses are private anonymous memory (the test's own buffers)."""
        page = self.page_size
        start -= start % page
        end = (end + page - 1) // page * page
        covered = sorted((m.start, m.end) for m in self.mappings if m.end > start and m.start < end)
        pos = start
        for s, e in covered + [(end, end)]:
            if s > pos:
                self.mappings.append(_SimMapping(pos, s, page=page))
            pos = max(pos, e)
        # Adjacent private anonymous ranges are one VMA, as the kernel merges them.
        merged: List[_SimMapping] = []
        for m in sorted(self.mappings, key=lambda m: m.start):
            last = merged[-1] if merged else None
            if (
                last is not None
                and last.obj is None
                and m.obj is None
                and last.end == m.start
                and last.label == m.label
            ):
                last.end = m.end
            else:
                merged.append(m)
        self.mappings = merged

    def _mappings_in(self, start: int, end: int) -> List[_SimMapping]:
        return [m for m in self.mappings if m.end > start and m.start < end]

    def _mapping_at(self, addr: int) -> Optional[_SimMapping]:
        found = self._find_mapping(addr)
        if found is not None:
            return found
        # Memory the simulator has not seen yet but the host process really has
        # mapped (a test's own buffer) is private anonymous memory; an address
        # that is not readable is unmapped (EFAULT), as in the kernel.
        page = addr - addr % self.page_size
        try:
            self._copy_from_user(page, 1)
        except OSError:
            return None
        self._ensure_mapped(page, page + self.page_size)
        return self._find_mapping(addr)

    def _find_mapping(self, addr: int) -> Optional[_SimMapping]:
        """The mapping holding ``addr``, without inventing one (see _mapping_at)."""
        for m in self.mappings:
            if m.start <= addr < m.end:
                return m
        return None

    def _vma_room(self, what: str) -> None:
        """ENOMEM when this process holds vm.max_map_count VMAs (mm/vma.c
        __split_vma; mm/mmap.c do_mmap): a split, a mapping or a thread stack fails."""
        if len(self.mappings) >= self.kernel.max_map_count:
            raise _oserror(errno.ENOMEM, what, "vm.max_map_count VMAs mapped")

    def _split(self, addr: int) -> None:
        """Split the object mapping holding ``addr`` there (mbind splits VMAs)."""
        mp = self._find_mapping(addr)
        if mp is None or mp.obj is None or mp.start == addr:
            return
        self._vma_room("mbind")
        if (addr - mp.start) % mp.page:
            # hugetlb VMAs split only at huge page boundaries (hugetlb_vm_op_split).
            raise _oserror(errno.EINVAL, "mbind", "not aligned to the huge page size")
        cut = (addr - mp.start) // mp.page
        assert mp.mapped is not None
        tail = _SimMapping(
            addr,
            mp.end,
            mp.obj,
            mp.obj_page + cut,
            mp.label,
            mp.mapped[cut:],
            mp.policy,
            mp.page,
            mp.attach_id,
        )
        mp.end, mp.mapped = addr, mp.mapped[:cut]
        self.mappings.append(tail)
        self.mappings.sort(key=lambda m: m.start)

    def _pol_store(self, mp: _SimMapping) -> _Intervals:
        assert mp.obj is not None
        if mp.obj.shared_policy or mp.policy is None:
            return mp.obj.policy
        return mp.policy

    def _vma_policy(self, addr: int) -> Optional[_Pol]:
        mp = self._mapping_at(addr)
        if mp is not None and mp.obj is not None:
            pol: Optional[_Pol] = self._pol_store(mp).get(
                mp.obj_page + (addr - mp.start) // mp.page
            )
            return pol
        found: Optional[_Pol] = self.policy.get(addr)
        return found

    def _ilx(self, addr: int) -> int:
        mp = self._mapping_at(addr)
        if mp is not None and mp.obj is not None:
            return mp.obj_page + (addr - mp.start) // mp.page
        # Anonymous memory: vm_pgoff is the virtual page number, so the interleave
        # index is the page's virtual page number (mm/mempolicy.c get_vma_policy).
        return addr // self.page_size

    def _node_of_page(self, page: int) -> Optional[int]:
        mp = self._mapping_at(page)
        if mp is not None and mp.obj is not None:
            idx = (page - mp.start) // mp.page
            if mp.mapped is not None and not mp.mapped[idx]:
                return None
            n = mp.obj.node[mp.obj_page + idx]
            return n if n >= 0 else None
        return self.pages.get(page - page % self.page_size)

    def _mapped_runs(
        self, mp: _SimMapping, seq: _Runs, i0: int, i1: int
    ) -> List[Tuple[int, int, int]]:
        """The runs of ``seq`` (a sparse object's node, dirty or mapcount) over the
        pages of [i0, i1) (indices into the mapping) that mapping ``mp`` maps:
        (start, end, value), indices into the object."""
        assert mp.mapped is not None
        base = mp.obj_page
        i1 = min(i1, len(seq) - base)  # remove_object emptied it: nothing
        out = []
        for a, end, flag in mp.mapped.runs(i0, i1):
            if flag:
                out += seq.runs(base + a, base + end)
        return out

    def _all_pages(self) -> Iterator[Tuple[int, int]]:
        yield from list(self.pages.items())
        for mp in list(self.mappings):
            if mp.obj is None or mp.mapped is None:
                continue
            if mp.obj.sparse:
                for a, end, node in self._mapped_runs(mp, mp.obj.node, 0, len(mp.mapped)):
                    for key in range(a, end):
                        if node >= 0:
                            yield mp.start + (key - mp.obj_page) * mp.page, node
                continue
            for idx, flag in enumerate(mp.mapped):
                if flag:
                    node = mp.obj.node[mp.obj_page + idx]
                    if node >= 0:
                        yield mp.start + idx * mp.page, node

    def _may_move(self, page: int, flags: int) -> bool:
        """Whether a migration with ``flags`` moves ``page``: MPOL_MF_MOVE only the
        pages no other page table maps (another process's mapping of the same
        shared memory), MPOL_MF_MOVE_ALL every page (mm/mempolicy.c
        migrate_folio_add)."""
        mp = self._find_mapping(page)
        if flags & MbindFlag.MOVE_ALL or mp is None or mp.obj is None:
            return True
        count: int = mp.obj.mapcount[mp.obj_page + (page - mp.start) // mp.page]
        return count <= 1

    def _move_page(self, page: int, node: Optional[int]) -> None:
        if node is None:
            return
        mp = self._mapping_at(page)
        pool = self._pool_at(page)
        old: Optional[int]
        if mp is not None and mp.obj is not None:
            key = mp.obj_page + (page - mp.start) // mp.page
            held: int = mp.obj.node[key]
            old = held if held >= 0 else None
            mp.obj.node[key] = node
        else:
            old = self.pages.get(page)
            self.pages[page] = node
        if old is not None:
            pool[old] = pool.get(old, 0) + 1
        pool[node] = pool.get(node, 0) - 1

    def _pool_at(self, page: int) -> Dict[int, int]:
        """The free pages a page at ``page`` comes from: its huge page size's pool in
        a hugetlb mapping, else the base pages."""
        mp = self._find_mapping(page)
        if mp is not None and mp.obj is not None:
            return self.kernel.pool(mp.obj.page)
        return self.kernel.free_pages

    def _misplaced(self, start: int, end: int, pol: _Pol) -> List[int]:
        out = []
        want = self._il_period(pol)
        for mp in self._mappings_in(start, end):
            step = mp.page or self.page_size
            if mp.obj is not None and mp.obj.sparse:
                out += self._misplaced_sparse(mp, start, end, pol, want)
                continue
            for page in range(max(start, mp.start), min(end, mp.end), step):
                node = self._node_of_page(page)
                if node is not None and self._is_misplaced(pol, want, page, node):
                    out.append(page)
        return out

    def _is_misplaced(self, pol: _Pol, want: List[int], page: int, node: int) -> bool:
        """Whether ``page``, on ``node``, is where policy ``pol`` would not put it
        (``want``: the nodes an interleave takes in turn)."""
        if pol.mode in (Mode.INTERLEAVE, Mode.WEIGHTED_INTERLEAVE):
            return node != want[self._ilx(page) % len(want)]
        if pol.mode in (Mode.BIND, Mode.PREFERRED, Mode.PREFERRED_MANY):
            return node not in pol.nodes
        return False

    def _misplaced_sparse(
        self, mp: _SimMapping, start: int, end: int, pol: _Pol, want: List[int]
    ) -> List[int]:
        """_misplaced in a sparse object's mapping: its faulted pages only."""
        out = []
        i0 = (max(start, mp.start) - mp.start) // mp.page
        i1 = (min(end, mp.end) - mp.start + mp.page - 1) // mp.page
        assert mp.obj is not None
        for a, z, node in self._mapped_runs(mp, mp.obj.node, i0, i1):
            if node < 0:
                continue
            for key in range(a, z):
                page = mp.start + (key - mp.obj_page) * mp.page
                if self._is_misplaced(pol, want, page, node):
                    out.append(page)
        return out

    def _alloc(
        self, pol: Optional[_Pol], ilx: Optional[int], free: Optional[Dict[int, int]] = None
    ) -> Optional[int]:
        """The node a new page goes to (mm/mempolicy.c alloc_pages_mpol), or None (OOM);
        ``free``: the pool (base pages, or one huge page size)."""
        k = self.kernel
        pool = k.free_pages if free is None else free
        topo = k.topo
        allowed = sorted((self.mems_allowed & topo.nodes_with_memory) or topo.nodes_with_memory)
        local = self.local_node()

        def has_room(n: int) -> bool:
            return pool.get(n, 0) > 0

        def nearest_with_room(origin: int, among: Iterable[int]) -> Optional[int]:
            for n in topo.nearest(origin, among):
                if has_room(n):
                    return n
            return None

        if pol is None:
            pol = self.thread_policy()
        if pol is None or pol.mode in (Mode.DEFAULT, Mode.LOCAL):
            return nearest_with_room(local, allowed)
        if pol.mode in (Mode.INTERLEAVE, Mode.WEIGHTED_INTERLEAVE):
            if ilx is None and pol.mode == Mode.WEIGHTED_INTERLEAVE:
                target = self._wi_next(sorted(pol.nodes))
            else:
                order = self._il_period(pol)
                target = order[(ilx or 0) % len(order)]
            return target if has_room(target) else nearest_with_room(target, allowed)
        if pol.mode == Mode.PREFERRED:
            target = min(pol.nodes)
            return target if has_room(target) else nearest_with_room(target, allowed)
        origin = pol.home_node if pol.home_node >= 0 else local
        if pol.mode == Mode.BIND:
            return nearest_with_room(origin, pol.nodes)  # strict: OOM otherwise
        # PREFERRED_MANY: the mask first, then anywhere allowed.
        n = nearest_with_room(origin, pol.nodes)
        return n if n is not None else nearest_with_room(origin, allowed)

    def _fault_object(self, mp: _SimMapping, i0: int, i1: int, write: bool) -> None:
        """Fault pages [i0, i1) of object mapping ``mp`` (indices into the mapping)."""
        obj = mp.obj
        assert obj is not None and mp.mapped is not None
        k = self.kernel
        free = k.pool(obj.page)
        nodes, dirty, mc, mapped = obj.node, obj.dirty, obj.mapcount, mp.mapped
        base = mp.obj_page
        for a, z, pol in self._pol_store(mp).pieces(base + i0, base + i1):
            il = (
                self._il_period(pol)
                if pol is not None and pol.mode in (Mode.INTERLEAVE, Mode.WEIGHTED_INTERLEAVE)
                else None
            )
            if obj.sparse:
                self._fault_runs(mp, a, z, pol, il, write)
                continue
            cached: Optional[int] = None
            for key in range(a, z):
                if nodes[key] < 0:
                    nodes[key] = cached = self._place(obj, key, pol, il, free, cached)
                if write:
                    dirty[key] = 1
                idx = key - base
                if not mapped[idx]:
                    mapped[idx] = 1
                    mc[key] += 1

    def _place(
        self,
        obj: _SimObject,
        key: int,
        pol: Optional[_Pol],
        il: Optional[List[int]],
        free: Dict[int, int],
        cached: Optional[int],
    ) -> int:
        """The node new page ``key`` of ``obj`` goes to, taken from ``free`` and
        charged: by ``il`` (an interleave period), else ``cached`` (the node of the
        page before) while it has room, else _alloc."""
        node: Optional[int]
        if il is not None:
            want = il[key % len(il)]
            node = want if free.get(want, 0) > 0 else self._alloc(pol, key, free)
        elif cached is not None and free.get(cached, 0) > 0:
            node = cached
        else:
            node = self._alloc(pol, key, free)
        if node is None:
            raise _oserror(errno.ENOMEM, "page fault", "simulated OOM")
        self.kernel.charge(obj, 1)
        if obj.resv:
            self.kernel.reserve(obj, -1)
        free[node] = free.get(node, 0) - 1
        return node

    def _fault_runs(
        self,
        mp: _SimMapping,
        a: int,
        z: int,
        pol: Optional[_Pol],
        il: Optional[List[int]],
        write: bool,
    ) -> None:
        """_fault_object's pages [a, z) (object indices) of a sparse object: each
        run of unfaulted pages gets its nodes in one splice, then the flags of the
        pages faulted (all, or those before a page that failed) are set by range."""
        obj = mp.obj
        assert obj is not None and mp.mapped is not None
        free = self.kernel.pool(obj.page)
        base = mp.obj_page
        done = a
        try:
            for p, q, held in obj.node.runs(a, z):
                new: List[int] = []
                try:
                    cached: Optional[int] = None
                    for key in range(p, q):
                        if held >= 0:
                            break
                        cached = self._place(obj, key, pol, il, free, cached)
                        new.append(cached)
                finally:
                    obj.node.assign(p, new)
                    done = p + len(new) if held < 0 else q
        finally:
            if write:
                obj.dirty.fill(a, done, 1)
            for p, q, flag in mp.mapped.runs(a - base, done - base):
                if flag:
                    continue  # mapped here already
                for r0, r1, count in obj.mapcount.runs(base + p, base + q):
                    obj.mapcount.fill(r0, r1, count + 1)
            mp.mapped.fill(a - base, done - base, 1)

    def _fault(self, page: int, write: bool = True) -> None:
        mp = self._mapping_at(page)
        if mp is None:
            self._ensure_mapped(page, page + self.page_size)
            mp = self._mapping_at(page)
        assert mp is not None
        if mp.obj is not None:
            idx = (page - mp.start) // mp.page
            self._fault_object(mp, idx, idx + 1, write)
            return
        page -= page % self.page_size
        if page not in self.pages:
            node = self._alloc(self.policy.get(page), self._ilx(page))
            if node is None:
                raise _oserror(errno.ENOMEM, "page fault", "simulated OOM")
            self.pages[page] = node
            self.kernel.free_pages[node] -= 1

    def _populate(self, addr: int, length: int, write: bool) -> None:
        page = self.page_size
        start = addr - addr % page
        end = addr + length
        with self.kernel.lock:
            self._ensure_mapped(start, end)
            for mp in self._mappings_in(start, end):
                a, z = max(start, mp.start), min(end, mp.end)
                if mp.obj is not None:
                    i0 = (a - mp.start) // mp.page
                    i1 = (z - mp.start + mp.page - 1) // mp.page
                    self._fault_object(mp, i0, i1, write)
                else:
                    for p in range(a, z, page):
                        self._fault(p, write)

    def touch(self, addr: int, length: int) -> None:
        self._populate(addr, length, True)

    def map_private(self, addr: int, length: int, label: str = "") -> None:
        """[addr, addr+length) of this process's memory (a test's buffer) as one
        private mapping that numa_maps labels ``label``: "" (anonymous), "heap",
        "stack", or "file=PATH" (a file's private copy-on-write pages).  Its pages
        are placed as anonymous pages are; what the simulator saw there is gone."""
        page = self.page_size
        start = addr - addr % page
        end = -(-(addr + length) // page) * page
        self._drop_private(start, end)
        self.mappings.append(_SimMapping(start, end, label=label, page=page))
        self.mappings.sort(key=lambda m: m.start)

    def _call_mincore(self, addr: int, length: int) -> int:
        err = self._take_failure("mincore")  # injectable; not a policy syscall
        if err is not None:
            raise _oserror(err, "mincore")
        page, count = self.page_size, 0
        with self.kernel.lock:
            p = addr - addr % page
            while p < addr + length:
                mp = self._mapping_at(p)
                if mp is not None and mp.obj is not None and mp.obj.sparse:
                    stop = min(addr + length, mp.end)
                    count += self._resident_base(mp, p, stop)
                    p = stop
                    continue
                if mp is not None and mp.obj is not None:  # the object's pages
                    count += mp.obj.node[mp.obj_page + (p - mp.start) // mp.page] >= 0
                else:
                    count += p in self.pages
                p += page
        return count

    def _resident_base(self, mp: _SimMapping, start: int, stop: int) -> int:
        """mincore's count of base pages in [start, stop) of a sparse object's
        mapping: each allocated page (huge ones too) counts its base pages."""
        obj = mp.obj
        assert obj is not None
        base = self.page_size
        i0 = mp.obj_page + (start - mp.start) // mp.page
        i1 = mp.obj_page + (stop - mp.start + mp.page - 1) // mp.page
        count = 0
        for a, z, node in obj.node.runs(i0, i1):
            lo = max(start, mp.start + (a - mp.obj_page) * mp.page)
            hi = min(stop, mp.start + (z - mp.obj_page) * mp.page)
            if node >= 0 and hi > lo:
                count += (hi - lo + base - 1) // base
        return count

    def _call_madvise(self, addr: int, length: int, advice: int) -> None:
        self._maybe_fail("madvise")
        if addr % self.page_size:
            raise _oserror(errno.EINVAL, "madvise")
        if advice == MADV_HUGEPAGE:  # shmem THP serves only where enabled
            on = _selected(_nu._read_optional(self, f"{_THP_DIR}/shmem_enabled")) in (
                "advise",
                "within_size",
                "always",
                "force",
            )
            for mp in self._mappings_in(addr, addr + length):
                if mp.obj is not None:
                    mp.obj.thp = on
        if advice in (MADV_POPULATE_READ, MADV_POPULATE_WRITE):
            if not self.populate:
                raise _oserror(errno.EINVAL, "madvise", "MADV_POPULATE_* needs Linux 5.14")
            if advice == MADV_POPULATE_WRITE:
                self._populate(addr, length, True)
            else:
                # A read fault on private anonymous memory maps the zero page (nothing
                # allocated); on shared memory it allocates the page.
                for mp in self._mappings_in(addr, addr + length):
                    if mp.obj is not None:
                        a, z = max(addr, mp.start), min(addr + length, mp.end)
                        self._populate(a, z - a, False)

    def _task(self, tid: int, what: str) -> SimulatedBackend:
        """The process of thread ``tid`` (0: this thread), any process's: a thread id
        names one task in the whole pid namespace (kernel/sched/core.c find_process_by_pid)."""
        if tid == 0:
            return self
        proc = self.kernel.task(tid)
        if proc is None:
            raise _oserror(errno.ESRCH, what)
        return proc

    def _call_sched_getaffinity(self, pid: int = 0) -> FrozenSet[int]:
        proc = self._task(pid, "sched_getaffinity")
        if pid == 0:
            return self.thread_cpus()
        if pid == proc.pid:
            return proc.affinity
        return proc.thread_affinity[pid]

    def _call_cpuset_cpus(self) -> Optional[FrozenSet[int]]:
        return self.cpus_allowed

    def _call_sched_setaffinity(self, pid: int, cpus: Iterable[int]) -> None:
        proc = self._task(pid, "sched_setaffinity")
        # Another user's task needs CAP_SYS_NICE (check_same_owner).
        if proc.uid != self.uid and not self.cap_sys_nice:
            raise _oserror(errno.EPERM, "sched_setaffinity")
        want = frozenset(cpus) & proc.cpus_allowed & self.kernel.topo.online_cpus
        if not want:
            raise _oserror(errno.EINVAL, "sched_setaffinity", "no allowed CPU in the set")
        if pid == 0 and threading.get_ident() != self.main_thread:
            self._own.cpus = want
        elif pid in (0, proc.pid):
            proc.affinity = want
        else:
            proc.thread_affinity[pid] = want

    # -- shared memory: SysV (ipc/shm.c) and POSIX (/dev/shm on tmpfs) ---------------
    def _take_failure(self, key: str) -> Optional[int]:
        """Use up one failure injected with fail(key, ...); its errno, or None."""
        k = self.kernel
        with k.lock:  # prefault threads call madvise concurrently
            if key not in k.fail:
                return None
            err, times = k.fail[key]
            if times is not None:
                if times <= 1:
                    del k.fail[key]
                else:
                    k.fail[key] = (err, times - 1)
            return err

    def _maybe_fail(self, name: str) -> None:
        """Error injection for the non-policy calls: only an exact name matches."""
        self.kernel.calls.append((name, ()))
        err = self._take_failure(name)
        if err is not None:
            raise _oserror(err, name)

    def _call_geteuid(self) -> int:
        return self.uid

    def _call_statvfs(self, path: str) -> Optional[Tuple[int, int]]:
        size = self.kernel.shm_size if path == "/dev/shm" else None
        return None if size is None else (size, size - self.kernel.charged.get("/dev/shm", 0))

    def _perm_ok(self, uid: int, gid: int, mode: int, want: int) -> bool:
        """ipc/util.c ipcperms and generic_permission: want is an rwx triple (0-7)."""
        if self.uid == 0:  # CAP_IPC_OWNER / CAP_DAC_OVERRIDE
            return True
        granted = mode >> 6 if self.uid == uid else mode >> 3 if self.gid == gid else mode
        return not (want & ~granted & 7)

    def _shm_lookup(self, shmid: int, what: str) -> _SimShm:
        seg = self.kernel.shm.get(shmid)
        if seg is None:
            raise _oserror(errno.EINVAL, what, f"no segment {shmid}")
        return seg

    def _shm_destroy(self, seg: _SimShm) -> None:
        self.kernel.shm.pop(seg.shmid, None)
        self.remove_object(seg.obj.name)

    def _call_shmget(self, key: int, size: int, flags: int) -> int:
        self._maybe_fail("shmget")
        k = self.kernel
        key &= 0xFFFFFFFF
        seg = (
            None
            if key == 0
            else next((s for s in k.shm.values() if s.key == key and not s.dest), None)
        )
        if seg is not None:
            if flags & IPC_CREAT and flags & IPC_EXCL:
                raise _oserror(errno.EEXIST, "shmget", f"key 0x{key:08x}")
            if size > seg.size:
                raise _oserror(errno.EINVAL, "shmget", "segment smaller than size")
            if not self._perm_ok(seg.uid, seg.gid, seg.mode, (flags >> 6 | flags >> 3 | flags) & 7):
                raise _oserror(errno.EACCES, "shmget")
            return seg.shmid
        if not flags & IPC_CREAT and key != 0:
            raise _oserror(errno.ENOENT, "shmget", f"key 0x{key:08x}")
        if size < 1:
            raise _oserror(errno.EINVAL, "shmget", "size 0")
        page = self.page_size
        if flags & SHM_HUGETLB:
            page = self._huge_page(flags)
            self._reserve_check(page, (size + page - 1) // page)
        k.next_shmid += 1
        shmid = _SIM_ID_BASE + k.next_shmid
        name = f"SYSV{key:08x}#{shmid}"
        self.kernel.objects[name] = obj = _SimObject(
            name,
            size,
            page,
            shared_policy=page == self.page_size,
            path=f"/SYSV{key:08x}",
            sparse=k.sparse(size),
        )
        obj.deleted = True  # shm files are never linked anywhere
        if page != self.page_size:
            k.reserve(obj, obj.npages)
        k.shm[shmid] = _SimShm(
            key, shmid, size, flags & 0o777, self.uid, self.gid, self.uid, self.gid, self.pid, obj
        )
        return shmid

    def _huge_page(self, flags: int) -> int:
        """The huge page size SHM_HUGETLB ``flags`` ask for: log2 of it in the
        SHM_HUGE_SHIFT bits, 0 for the machine's default size (ipc/shm.c newseg,
        hstate_sizelog): a size the machine has no hstate for is EINVAL."""
        shift = (flags >> SHM_HUGE_SHIFT) & 0x3F
        k = self.kernel
        kb = (1 << shift) // 1024 if shift else k.huge_default_kb
        if kb not in k.huge_sizes:
            raise _oserror(errno.EINVAL, "shmget", f"no {kb} kB huge page size on this machine")
        return kb * 1024

    def _reserve_check(self, page: int, pages: int) -> None:
        """hugetlb_acct_memory: the pages must be free and not reserved by another
        segment, and free on the nodes this process may use (allowed_mems_nr)."""
        k = self.kernel
        kb = page // 1024
        pool = k.pool(page)
        unreserved = sum(pool.values()) - k.huge_resv.get(kb, 0)
        allowed = sum(pool.get(n, 0) for n in self.mems_allowed)
        if pages > unreserved or pages > allowed:
            raise _oserror(
                errno.ENOMEM,
                "shmget",
                f"{pages} {kb} kB huge pages asked, {max(unreserved, 0)} free and unreserved, "
                f"{allowed} free on the allowed nodes",
            )

    def _call_shmat(self, shmid: int, flags: int = 0) -> int:
        self._maybe_fail("shmat")
        seg = self._shm_lookup(shmid, "shmat")
        want = 4 if flags & SHM_RDONLY else 6
        if not self._perm_ok(seg.uid, seg.gid, seg.mode, want):
            raise _oserror(errno.EACCES, "shmat")
        addr = self.map_object(seg.obj.name, seg.size)
        seg.nattch += 1
        seg.lpid = self.pid
        seg.used = max(seg.used, int(__import__("time").time()))
        self.shm_attached[addr] = shmid
        return addr

    def _call_shmdt(self, addr: int) -> None:
        self._maybe_fail("shmdt")
        shmid = self.shm_attached.get(addr)
        if shmid is None:
            raise _oserror(errno.EINVAL, "shmdt", "not an attach address")
        if self.dup_maps.get(addr):
            self.dup_maps[addr] -= 1
        else:
            del self.shm_attached[addr]
            self.unmap(addr)
        seg = self.kernel.shm.get(shmid)
        if seg is not None:
            seg.nattch -= 1
            seg.lpid = self.pid
            seg.used = max(seg.used, int(__import__("time").time()))
            if seg.dest and seg.nattch <= 0:
                self._shm_destroy(seg)

    def _call_shm_stat(self, shmid: int) -> ShmStat:
        self._maybe_fail("shm_stat")
        seg = self._shm_lookup(shmid, "shmctl(IPC_STAT)")
        if not self._perm_ok(seg.uid, seg.gid, seg.mode, 4):
            raise _oserror(errno.EACCES, "shmctl(IPC_STAT)")
        return _shm_stat(
            0 if seg.dest else seg.key,
            seg.shmid,
            seg.uid,
            seg.gid,
            seg.cuid,
            seg.cgid,
            seg.mode | (SHM_DEST if seg.dest else 0),
            seg.size,
            seg.nattch,
            seg.cpid,
            seg.lpid,
            used=seg.used,
        )

    def _call_shm_rmid(self, shmid: int) -> None:
        self._maybe_fail("shm_rmid")
        seg = self._shm_lookup(shmid, "shmctl(IPC_RMID)")
        if self.uid not in (0, seg.uid, seg.cuid):
            raise _oserror(errno.EPERM, "shmctl(IPC_RMID)")
        if seg.nattch <= 0:
            self._shm_destroy(seg)
        else:
            seg.dest = True  # the key is free again from now on

    def _render_sysvipc(self) -> str:
        out = [_SYSVIPC_HEADER]
        for seg in sorted(self.kernel.shm.values(), key=lambda s: s.shmid):
            key = 0 if seg.dest else seg.key
            key = key - (1 << 32) if key >= 1 << 31 else key
            rss = seg.obj.resident() * seg.obj.page
            mode = seg.mode | (SHM_DEST if seg.dest else 0)
            out.append(
                f"{key:10d} {seg.shmid:10d}  {mode:4o} {seg.size:21d} "
                f"{seg.cpid:5d} {seg.lpid:5d}  {seg.nattch:5d} {seg.uid:5d} "
                f"{seg.gid:5d} {seg.cuid:5d} {seg.cgid:5d} {seg.used:10d} "
                f"{seg.used:10d} {seg.used:10d} {rss:21d} {0:21d}\n"
            )
        return "".join(out)

    def _call_shm_open(self, name: str, flags: int, mode: int) -> int:
        self._maybe_fail("shm_open")
        k = self.kernel
        if not name or "/" in name or name in (".", ".."):
            raise _oserror(errno.EINVAL, "shm_open", repr(name))
        f = k.files.get(name)
        if f is not None:
            if flags & os.O_CREAT and flags & os.O_EXCL:
                raise _oserror(errno.EEXIST, "shm_open", name)
            want = 6 if flags & os.O_ACCMODE == os.O_RDWR else 4
            if flags & getattr(os, "O_PATH", 0):
                want = 0  # O_PATH: no permission asked, none needed
            if want and not self._perm_ok(f.uid, f.gid, f.mode, want):
                raise _oserror(errno.EACCES, "shm_open", name)
        elif not flags & os.O_CREAT:
            raise _oserror(errno.ENOENT, "shm_open", name)
        else:
            k.next_attach += 1
            obj = _SimObject(
                f"dev/shm/{name}#{k.next_attach}", 0, self.page_size, path=f"/dev/shm/{name}"
            )
            k.objects[obj.name] = obj
            f = k.files[name] = _SimFile(name, mode & 0o7777, self.uid, self.gid, obj)
        k.next_attach += 1
        fd = _SIM_ID_BASE + k.next_attach
        self.fds[fd] = f
        return fd

    def _file(self, fd: int, what: str) -> _SimFile:
        f = self.fds.get(fd)
        if f is None:
            raise _oserror(errno.EBADF, what)
        return f

    def _call_ftruncate(self, fd: int, size: int) -> None:
        self._maybe_fail("ftruncate")
        f = self._file(fd, "ftruncate")
        obj = f.obj
        if obj.backing is not None and size > obj.size:
            raise _oserror(errno.EBUSY, "ftruncate", "growing a mapped simulated file")
        old = obj.npages
        obj.size = size
        obj.npages = (size + obj.page - 1) // obj.page
        if obj.npages > old:  # never mapped (no backing), so no page faulted yet
            obj.sparse = self.kernel.sparse(size)
            obj.new_pages()
        if size:
            obj.address()

    def _call_fstat(self, fd: int) -> ShmStat:
        f = self._file(fd, "fstat")
        linked = 1 if self.kernel.files.get(f.name) is f else 0  # st_nlink
        return _shm_stat(0, fd, f.uid, f.gid, f.uid, f.gid, f.mode, f.obj.size, linked, 0, 0)

    def _call_close(self, fd: int) -> None:
        f = self._file(fd, "close")
        self.kernel.flocks.get(f.obj.name, {}).pop((self.pid, fd), None)
        del self.fds[fd]

    def _call_flock(self, fd: int, op: int) -> None:
        """fs/locks.c flock: one lock per open file; shared ones coexist.  A call
        that would block fails with EDEADLK (one simulated thread cannot wait)."""
        self._maybe_fail("flock")
        held = self.kernel.flocks.setdefault(self._file(fd, "flock").obj.name, {})
        me = (self.pid, fd)
        if op & LOCK_UN:
            held.pop(me, None)
            return
        want = LOCK_EX if op & LOCK_EX else LOCK_SH
        if any(h != me and (want == LOCK_EX or m == LOCK_EX) for h, m in held.items()):
            raise _oserror(errno.EWOULDBLOCK if op & LOCK_NB else errno.EDEADLK, "flock")
        held[me] = want

    # Start times as /proc/PID/stat shows them: since boot, as the reader's time
    # namespace counts it (``boottime``: its offset, as `unshare --time --boottime`).
    def _call_pid_start(self, pid: int) -> Optional[str]:
        for ref in self.kernel.procs:
            p = ref()
            if p is not None and p.pid == pid and not p.dead:
                return str(100 * pid + self.boottime)
        return None

    def _call_whoami(self) -> Dict[str, Any]:
        timens = "time:[4026531834]"
        if self.boottime:
            timens = f"time:[{4026540000 + self.pid}]"
        return {
            "pid": self.pid,
            "start": str(100 * self.pid + self.boottime),
            "boot": "simulated",
            "pidns": "pid:[4026531836]",
            "timens": timens,
        }

    def exit(self) -> None:
        """This process dies (as by kill -9): its SysV segments are detached, its
        files closed (their flocks dropped) and unmapped."""
        for addr in list(self.shm_attached):
            self.call("shmdt", addr)
        for fd in list(self.fds):
            self.call("close", fd)
        for m in [m for m in self.mappings if m.obj is not None]:
            self.call("munmap", m.start, m.end - m.start)
        self.dead = True

    def _call_shm_unlink(self, name: str) -> None:
        self._maybe_fail("shm_unlink")
        f = self.kernel.files.get(name)
        if f is None:
            raise _oserror(errno.ENOENT, "shm_unlink", name)
        if self.uid not in (0, f.uid):  # sticky /dev/shm: only the owner
            raise _oserror(errno.EPERM, "shm_unlink", name)
        del self.kernel.files[name]
        f.obj.deleted = True
        self._reap(f.obj)

    def _reap(self, obj: _SimObject) -> None:
        """Free a deleted file's pages once no process maps it."""
        if not obj.deleted or obj.name.startswith("SYSV"):
            return
        for ref in self.kernel.procs:
            proc = ref()
            if proc is not None and any(m.obj is obj for m in proc.mappings):
                return
        self.remove_object(obj.name)

    def _call_mmap(self, length: int, fd: int, huge: bool = False) -> int:
        self._maybe_fail("mmap")
        f = self._file(fd, "mmap")
        if length <= 0 or length > f.obj.npages * f.obj.page:
            raise _oserror(errno.EINVAL if length <= 0 else errno.ENXIO, "mmap")
        if huge:
            raise _oserror(errno.EINVAL, "mmap", "MAP_HUGETLB on a tmpfs file")
        return self.map_object(f.obj.name, f.obj.size)

    def _call_munmap(self, addr: int, length: int) -> None:
        self._maybe_fail("munmap")
        if self.dup_maps.get(addr):
            self.dup_maps[addr] -= 1
            return
        mp = self._find_mapping(addr)
        self.unmap(addr)
        if mp is not None and mp.obj is not None:
            self._reap(mp.obj)

    # -- /proc/self/numa_maps -------------------------------------------------------------
    def _counts(self, mp: _SimMapping) -> Tuple[Dict[int, int], int, int]:
        """An object mapping's mapped pages: by node, how many dirty, the most page
        tables mapping one."""
        import collections
        from itertools import compress

        obj = mp.obj
        assert obj is not None and mp.mapped is not None
        if obj.sparse:
            counts: Dict[int, int] = collections.Counter()
            every = len(mp.mapped)
            for a, z, node in self._mapped_runs(mp, obj.node, 0, every):
                if node >= 0:
                    counts[node] += z - a
            dirty = sum((z - a) * flag for a, z, flag in self._mapped_runs(mp, obj.dirty, 0, every))
            maps = self._mapped_runs(mp, obj.mapcount, 0, every)
            return counts, dirty, max((count for _, _, count in maps), default=0)
        a, z = mp.obj_page, mp.obj_page + len(mp.mapped)
        sel = mp.mapped
        counts = collections.Counter(compress(obj.node[a:z], sel))
        counts.pop(-1, None)
        if not counts:
            return counts, 0, 0
        dirty = sum(compress(obj.dirty[a:z], sel))
        return counts, dirty, max(compress(obj.mapcount[a:z], sel))

    def render_numa_maps(self) -> str:
        import collections

        lines = []
        default = self.thread_policy()
        base_kb = self.page_size // 1024
        private = sorted(self.pages.items())
        keys = [p for p, _ in private]
        for mp in sorted(self.mappings, key=lambda m: m.start):
            if mp.obj is not None:
                obj = mp.obj
                assert mp.mapped is not None
                pol = self._pol_store(mp).get(mp.obj_page) or default
                text = f"{mp.start:08x} {pol.describe() if pol else 'default'}"
                text += " " + (mp.label if mp.label else obj.label())
                if obj.page != self.page_size:
                    text += " huge"
                counts, dirty, mapmax = self._counts(mp)
                total = sum(counts.values())
                if total:
                    if dirty:
                        text += f" dirty={dirty}"
                    if total != dirty:  # and != anon, which is 0 for shmem
                        text += f" mapped={total}"
                    if mapmax > 1:
                        text += f" mapmax={mapmax}"
                    text += "".join(f" N{n}={c}" for n, c in sorted(counts.items()))
                    text += f" kernelpagesize_kB={obj.page // 1024}"
                lines.append(text)
                continue
            for a, z, pol in self.policy.pieces(mp.start, mp.end):
                p = pol or default
                text = f"{a:08x} {p.describe() if p else 'default'}"
                if mp.label:
                    text += " " + mp.label
                lo, hi = bisect.bisect_left(keys, a), bisect.bisect_left(keys, z)
                counts = collections.Counter(n for _, n in private[lo:hi])
                total = hi - lo
                if total:
                    text += f" anon={total} dirty={total}"
                    text += "".join(f" N{n}={c}" for n, c in sorted(counts.items()))
                    text += f" kernelpagesize_kB={base_kb}"
                lines.append(text)
        return "".join(line + "\n" for line in lines)

    def render_maps(self) -> str:
        """/proc/self/maps (fs/proc/task_mmu.c show_map_vma): the VMAs of
        render_numa_maps, each "start-end perms offset dev inode path"; shared
        memory objects are shared mappings (s), the rest private (p)."""
        lines = []
        for mp in sorted(self.mappings, key=lambda m: m.start):
            if mp.obj is not None:
                path = mp.obj.path + " (deleted)" * mp.obj.deleted
                offset = mp.obj_page * mp.page
                head = f"{mp.start:08x}-{mp.end:08x} rw-s {offset:08x} 00:01 1"
                lines.append(f"{head} {path.replace(chr(10), _NEWLINE_ESCAPE)}")
                continue
            path = _MAPS_LABELS.get(mp.label or "", (mp.label or "")[len("file=") :])
            for a, z, _ in self.policy.pieces(mp.start, mp.end):
                lines.append(f"{a:08x}-{z:08x} rw-p 00000000 00:00 0 {path}")
        return "".join(line + "\n" for line in lines)


# What /proc/PID/maps names a private mapping that numa_maps labels so; a file's path
# is written with its newlines escaped (seq_file_path(m, file, "\n")).
_MAPS_LABELS = {"": "", "heap": "[heap]", "stack": "[stack]"}
_NEWLINE_ESCAPE = "\\012"


def backend_for_root(root: Optional[str] = None) -> _nu.Backend:
    """The backend for ``root`` as ``--root`` takes it: the running system for None
    or "/"; else a saved tree, a folder (holding sys/ and proc/) or a tree saved in
    one file (an archive, as tools/gather.py --archive writes it).  A folder that is
    not a saved tree is a ValueError that says so (and names DIR/root, where
    tools/gather.py puts the tree); a missing one, FileNotFoundError."""
    root = root or "/"
    if root == "/":
        return _nu.default_backend()
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
    return _nu.LinuxBackend(open_tree(root))
