# SPDX-License-Identifier: Apache-2.0
"""Checks of numa_utils against a kernel: real (inside the QEMU guests of vm/, or
natively on a multi-node machine) or simulated (numa_utils_sim.SimulatedBackend).

Each check is a plain function ``check_<name>(env) -> dict``: it raises
AssertionError when the kernel and numa_utils disagree, ``Skip`` when it does not
apply (with the reason), and otherwise returns what it saw, for the log. ``env``
carries the module under test (``env.nu``), the backend (``env.backend``) and what
the topology must be (``env.expect``, the dict vm/run.py writes to
/vmtest/expect.json: nodes, cpus per node, distances, memory-only nodes, allowed
mems).

Two kinds of checks:
- ``check_<name>``: use numa_utils' public API only, so the same function runs
  against SimulatedBackend on the host and against the real kernel in a guest.
  Where the two disagree, the simulator is wrong.
- ``check_raw_<name>``: standard library and ctypes only, with the syscall numbers
  of KERNEL_FACTS.md section 1 written out here independently of numa_utils. They
  prove the guest's plumbing (and the kernel's behaviour) without trusting the
  module, and only run against a real kernel.

This file is copied into every guest with numa_utils.py; keep it stdlib-only and
importable on Python 3.8+.
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import platform
import struct
import subprocess
import sys
import threading
import time
import traceback

# --------------------------------------------------------------------------
# Environment


class Skip(Exception):
    """The check does not apply here; the message says why."""


class Env:
    """What a check gets: the module, a backend, the expected topology."""

    def __init__(self, nu, backend, expect: dict, *, real: bool):
        self.nu = nu
        # the siblings beside the core: shared-memory regions, and thread roles
        self.nur = self.nut = None
        if nu is not None:
            import numa_utils_regions as nur
            import numa_utils_threads as nut

            self.nur, self.nut = nur, nut
        self.backend = backend
        self.expect = expect
        self.real = real  # True: a real kernel (guest or native)

    @property
    def arch(self) -> str:
        return self.expect.get("arch") or platform.machine()

    @property
    def numa(self) -> bool:
        return bool(self.expect.get("numa", True))

    @property
    def expected_nodes(self):
        return sorted(int(n) for n in self.expect["nodes"])

    @property
    def memory_nodes(self):
        """Nodes this process may allocate from, as the topology promises."""
        allowed = self.expect.get("allowed_mems")
        nodes = [n for n in self.expected_nodes if self.expect["nodes"][str(n)]["mem_mb"] > 0]
        return [n for n in nodes if allowed is None or n in allowed]

    @property
    def default_nodes(self):
        """Nodes a ``nodes=None`` call uses (issue 11: default_memory_nodes leaves out
        GPU memory, movable-only, slower-tier and far CPU-less nodes): the
        expectation's "default_memory_nodes" when it names them, else memory_nodes."""
        d = self.expect.get("default_memory_nodes")
        return sorted(d) if d is not None else self.memory_nodes

    @property
    def page_size(self) -> int:
        ps = getattr(self.backend, "page_size", None)
        return ps or mmap.PAGESIZE

    def need(self, *names: str):
        """The numa_utils attributes a check uses; Skip when one is missing."""
        homes = [m for m in (self.nu, self.nur, self.nut) if m is not None]
        found = {n: m for m in reversed(homes) for n in dir(m) if n in names}
        missing = [n for n in names if n not in found]
        if self.nu is None or missing:
            raise Skip(f"numa_utils has no {', '.join(missing) or 'module'} yet")
        return [getattr(found[n], n) for n in names]

    def need_real(self, why: str = "raw syscalls need a real kernel"):
        if not self.real:
            raise Skip(why)

    def need_numa(self):
        if not self.numa:
            raise Skip("kernel without NUMA (see check_*no_numa*)")


def make_env(expect: dict, nu=None, backend=None, *, real: bool) -> Env:
    return Env(nu, backend, expect, real=real)


def all_checks():
    """The check functions of this module, in file order."""
    mod = sys.modules[__name__]
    fns = [getattr(mod, n) for n in dir(mod) if n.startswith("check_")]
    return sorted(fns, key=lambda f: f.__code__.co_firstlineno)


def run_checks(env: Env, names=None):
    """Run every check (or those named); one record per check, never raises."""
    out = []
    for fn in all_checks():
        name = fn.__name__[len("check_") :]
        if names and name not in names:
            continue
        t0 = time.monotonic()
        rec = {"name": name}
        try:
            rec["data"] = _jsonable(fn(env))
            rec["status"] = "pass"
        except Skip as e:
            rec["status"] = "skip"
            rec["detail"] = str(e)
        except NotImplementedError:
            # A stub in numa_utils.py (the module is being written section by
            # section): say which, do not count it as a kernel disagreement.
            rec["status"] = "skip"
            tb = traceback.extract_tb(sys.exc_info()[2])
            rec["detail"] = f"numa_utils.{tb[-1].name} is not implemented yet"
        except Exception as e:  # noqa: BLE001 - a record, not a crash
            rec["status"] = "fail"
            rec["detail"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc(limit=6)
        rec["seconds"] = round(time.monotonic() - t0, 3)
        out.append(rec)
    return out


def _jsonable(obj):
    return json.loads(
        json.dumps(obj, default=lambda o: sorted(o) if isinstance(o, (set, frozenset)) else repr(o))
    )


# --------------------------------------------------------------------------
# Raw kernel interface (stdlib + ctypes): numbers from KERNEL_FACTS.md section 1,
# written here on purpose instead of imported from numa_utils.

RAW_SYSCALLS = {
    #           mbind set_mempolicy get_mempolicy move_pages
    "x86_64": (237, 238, 239, 279),
    "aarch64": (235, 237, 236, 239),
    "ppc64le": (259, 261, 260, 301),
    "ppc64": (259, 261, 260, 301),
    "s390x": (268, 270, 269, 310),
}
AUDIT_ARCH = {
    "x86_64": 0xC000003E,
    "aarch64": 0xC00000B7,
    "ppc64le": 0xC0000015,
    "ppc64": 0x80000015,
    "s390x": 0x80000016,
}

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE, MPOL_LOCAL = 0, 1, 2, 3, 4
MPOL_PREFERRED_MANY = 5
MPOL_WEIGHTED_INTERLEAVE = 6  # Linux 6.9+; EINVAL before
MPOL_F_STATIC_NODES, MPOL_F_RELATIVE_NODES = 1 << 15, 1 << 14
MPOL_F_NODE, MPOL_F_ADDR = 1, 2
MPOL_MF_MOVE = 2
MADV_NOHUGEPAGE = 15
PROT_RW, MAP_PRIVATE_ANON, MAP_SHARED = 0x3, 0x02 | 0x20, 0x01

_libc = None


def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.shmat.restype = ctypes.c_void_p
        _libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        _libc.shmdt.argtypes = [ctypes.c_void_p]
        _libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
        _libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        _libc.prctl.argtypes = [
            ctypes.c_int,
            ctypes.c_ulong,
            ctypes.c_ulong,
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]
    return _libc


def raw_nr(name: str, arch: str = None, table=None) -> int:
    arch = arch or platform.machine()
    nums = (table or RAW_SYSCALLS)[arch]
    return nums[("mbind", "set_mempolicy", "get_mempolicy", "move_pages").index(name)]


def raw_syscall(nr: int, *args: int):
    """-> (return value, errno). Every argument passed as a C long."""
    ctypes.set_errno(0)
    r = libc().syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r, (ctypes.get_errno() if r == -1 else 0)


def nodemask(nodes, nbits: int = None):
    """(c_ulong array, maxnode) for the given node ids; maxnode = bits + 1
    (the kernel's get_nodes() does --maxnode)."""
    nodes = list(nodes)
    top = max(nodes) if nodes else 0
    nbits = max(nbits or 0, top + 1)
    words = (nbits + 63) // 64
    arr = (ctypes.c_ulong * words)()
    for n in nodes:
        arr[n // 64] |= 1 << (n % 64)
    return arr, words * 64 + 1


def raw_mbind(addr, length, mode, nodes=(), flags=0, nr=None):
    if nodes:
        mask, maxnode = nodemask(nodes)
        maskp = ctypes.addressof(mask)
    else:
        mask, maskp, maxnode = None, 0, 0
    nr = nr if nr is not None else raw_nr("mbind")
    return raw_syscall(nr, addr, length, mode, maskp, maxnode, flags)


def possible_nodes() -> int:
    try:
        with open("/sys/devices/system/node/possible") as fh:
            text = fh.read().strip()
        return max(int(x.split("-")[-1]) for x in text.split(",")) + 1
    except OSError:
        return 1


def raw_get_mempolicy(addr=0, flags=0):
    """-> (mode, set of nodes, errno)."""
    nbits = max(possible_nodes(), 64)
    words = (nbits + 63) // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mode = ctypes.c_int(-1)
    r, err = raw_syscall(
        raw_nr("get_mempolicy"),
        ctypes.addressof(mode),
        ctypes.addressof(mask),
        nbits + 1,
        addr,
        flags,
    )
    nodes = {w * 64 + b for w in range(words) for b in range(64) if mask[w] >> b & 1}
    return mode.value, nodes, err


def raw_move_pages_query(addr, npages, page):
    """Node of each page (negative errno for pages not present)."""
    pages = (ctypes.c_void_p * npages)(*[addr + i * page for i in range(npages)])
    status = (ctypes.c_int * npages)()
    r, err = raw_syscall(
        raw_nr("move_pages"), 0, npages, ctypes.addressof(pages), 0, ctypes.addressof(status), 0
    )
    if r < 0:
        raise OSError(err, f"move_pages: {os.strerror(err)}")
    return list(status)


class RawBuffer:
    """Anonymous (or shared) memory from libc mmap, with guard pages either side so
    its VMA never merges with a neighbour's: numa_maps then has one line for it."""

    def __init__(self, npages: int, page: int = None, fd: int = -1, shared=False):
        self.page = page or mmap.PAGESIZE
        self.length = npages * self.page
        self.npages = npages
        flags = MAP_SHARED if shared else MAP_PRIVATE_ANON
        if shared:
            self.base = libc().mmap(None, self.length, PROT_RW, flags, fd, 0)
            self.addr = self.base
            self.maplen = self.length
        else:
            self.maplen = self.length + 2 * self.page
            self.base = libc().mmap(None, self.maplen, PROT_RW, flags, -1, 0)
            self.addr = self.base + self.page
        if self.base in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        libc().madvise(self.base, self.maplen, MADV_NOHUGEPAGE)

    def touch(self):
        ctypes.memset(self.addr, 0x5A, self.length)

    def close(self):
        libc().munmap(self.base, self.maplen)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def numa_maps_line(addr: int, pid="self") -> str:
    """The numa_maps line of the VMA holding addr (a default-policy buffer may
    share its VMA with its guard pages or neighbours; /proc/pid/maps says where
    that VMA starts)."""
    start = None
    with open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                start = lo
                break
    assert start is not None, f"{addr:#x} is not mapped"
    with open(f"/proc/{pid}/numa_maps") as fh:
        for line in fh:
            if line.startswith(f"{start:x} "):
                return line.rstrip("\n")
    raise AssertionError(f"no numa_maps line for {addr:#x} (VMA at {start:#x})")


def vmas_in(lo: int, hi: int) -> int:
    """How many VMAs of this process overlap [lo, hi) (/proc/self/maps)."""
    count = 0
    with open("/proc/self/maps") as fh:
        for line in fh:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            count += start < hi and lo < end
    return count


def raw_counts(line: str) -> dict:
    """{node: bytes} from one numa_maps line (parsed independently of numa_utils)."""
    kb = 4
    pages = {}
    for tok in line.split():
        if tok.startswith("kernelpagesize_kB="):
            kb = int(tok.split("=", 1)[1])
        elif tok[:1] == "N" and "=" in tok and tok[1:].split("=")[0].isdigit():
            n, v = tok[1:].split("=", 1)
            pages[int(n)] = int(v)
    return {n: v * kb * 1024 for n, v in pages.items()}


def even_split(nodes, npages, page):
    per = npages // len(nodes)
    return {n: per * page for n in nodes}


# --------------------------------------------------------------------------
# Raw checks: the kernel itself, no numa_utils involved.


def _read(path):
    with open(path) as fh:
        return fh.read().strip()


def _cpulist(text):
    out = []
    for part in filter(None, text.replace("\0", "").strip().split(",")):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def check_raw_sysfs_topology(env):
    """sysfs says what QEMU was told: nodes, CPUs, distances, memory-only nodes."""
    env.need_real("reads this machine's sysfs")
    base = "/sys/devices/system/node"
    if not env.numa:
        if env.arch == "s390x":
            assert not os.path.exists(base), f"{base} exists on a kernel without NUMA"
            assert not os.path.exists("/proc/self/numa_maps"), "numa_maps without NUMA"
            return {"node_dir": False, "numa_maps": False}
        raise Skip("no-numa on a NUMA kernel: one node, nothing to compare")
    online = _cpulist(_read(f"{base}/online"))
    assert online == env.expected_nodes, (online, env.expected_nodes)
    seen = {}
    for i, n in enumerate(online):
        cpus = _cpulist(_read(f"{base}/node{n}/cpulist"))
        want = env.expect["nodes"][str(n)]["cpus"]
        assert cpus == want, f"node{n} cpus {cpus} != {want}"
        dist = [int(x) for x in _read(f"{base}/node{n}/distance").split()]
        assert dist == env.expect["distances"][i], f"node{n} distance {dist}"
        memkb = 0
        for line in _read(f"{base}/node{n}/meminfo").splitlines():
            if "MemTotal:" in line:
                memkb = int(line.split()[3])
        want_mb = env.expect["nodes"][str(n)]["mem_mb"]
        assert (0 < memkb <= want_mb * 1024) if want_mb else memkb == 0, (
            f"node{n} MemTotal {memkb} kB vs {want_mb} MiB"
        )
        seen[n] = {"cpus": cpus, "mem_kb": memkb}
    has_cpu = _cpulist(_read(f"{base}/has_cpu"))
    # Memory but no CPUs: a node with neither (a generic initiator) is not memory-only.
    memory_only = sorted(set(_cpulist(_read(f"{base}/has_memory"))) - set(has_cpu))
    assert memory_only == env.expect["memory_only"], (memory_only, env.expect["memory_only"])
    mems = None
    for line in _read("/proc/self/status").splitlines():
        if line.startswith("Mems_allowed_list:"):
            mems = _cpulist(line.split(":", 1)[1].strip())
    assert mems == env.expect["allowed_mems"], (mems, env.expect["allowed_mems"])
    return {
        "online": online,
        "memory_only": memory_only,
        "mems_allowed": mems,
        "nodes": seen if len(seen) <= 8 else f"{len(seen)} nodes",
    }


def check_raw_interleave_split(env):
    """mbind(MPOL_INTERLEAVE) with this arch's number, then numa_maps and
    move_pages both show the exact split over the allowed memory nodes."""
    env.need_real()
    env.need_numa()
    nodes = env.memory_nodes
    page = mmap.PAGESIZE
    npages = 8 * len(nodes)
    with RawBuffer(npages) as buf:
        r, err = raw_mbind(buf.addr, buf.length, MPOL_INTERLEAVE, nodes)
        assert r == 0, f"mbind(nr={raw_nr('mbind')}) failed: {os.strerror(err)}"
        buf.touch()
        line = numa_maps_line(buf.addr)
        counts = raw_counts(line)
        want = even_split(nodes, npages, page)
        assert counts == want, f"numa_maps {counts} != {want}: {line}"
        status = raw_move_pages_query(buf.addr, npages, page)
        by_node = {}
        for s in status:
            by_node[s] = by_node.get(s, 0) + page
        assert by_node == want, f"move_pages {by_node} != {want}"
        assert f"kernelpagesize_kB={page // 1024}" in line, line
    return {"nodes": nodes, "page_size": page, "numa_maps": line}


def check_raw_bind_prefer_get(env):
    """MPOL_BIND and MPOL_PREFERRED put the pages on the node asked for, and
    get_mempolicy(MPOL_F_ADDR) reads the policy back."""
    env.need_real()
    env.need_numa()
    nodes = env.memory_nodes
    page = mmap.PAGESIZE
    seen = {}
    target = nodes[-1]
    for mode, name in ((MPOL_BIND, "bind"), (MPOL_PREFERRED, "prefer")):
        with RawBuffer(4) as buf:
            r, err = raw_mbind(buf.addr, buf.length, mode, [target])
            assert r == 0, f"mbind {name}: {os.strerror(err)}"
            got_mode, got_nodes, err = raw_get_mempolicy(buf.addr, MPOL_F_ADDR)
            assert err == 0, f"get_mempolicy: {os.strerror(err)}"
            assert (got_mode, got_nodes) == (mode, {target}), (got_mode, got_nodes)
            buf.touch()
            counts = raw_counts(numa_maps_line(buf.addr))
            assert counts == {target: 4 * page}, f"{name}: {counts}"
            seen[name] = counts
    return {"target": target, "placed": seen}


def _seccomp_deny(arch, numbers, err=errno.EPERM):
    """Install a seccomp filter that fails the given syscalls with err."""
    BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
    ALLOW, ERRNO = 0x7FFF0000, 0x00050000
    prog = [
        (BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (BPF_JEQ_K, 1, 0, AUDIT_ARCH[arch]),
        (BPF_RET_K, 0, 0, ALLOW),
        (BPF_LD_W_ABS, 0, 0, 0),
    ]  # seccomp_data.nr
    n = len(numbers)
    for i, nr in enumerate(numbers):
        prog.append((BPF_JEQ_K, n - i, 0, nr))
    prog += [(BPF_RET_K, 0, 0, ALLOW), (BPF_RET_K, 0, 0, ERRNO | err)]
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    filt = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog), ctypes.addressof(filt))
    lc = libc()
    if lc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if lc.prctl(22, 2, ctypes.addressof(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


def _read_all(fd):
    """Everything a child writes to the pipe ``fd`` until it closes it; closes ``fd``."""
    chunks = []
    while True:
        b = os.read(fd, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    return b"".join(chunks)


def in_child(fn, timeout=60):
    """Run fn() in a forked child; returns what it returned (JSON) or raises."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            res = {"ok": True, "value": _jsonable(fn())}
        except BaseException as e:  # noqa: BLE001
            res = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "tb": traceback.format_exc(limit=6),
            }
        os.write(wfd, json.dumps(res).encode())
        os._exit(0)
    os.close(wfd)
    data = _read_all(rfd)
    os.waitpid(pid, 0)
    res = json.loads(data or b'{"ok": false, "error": "child died"}')
    if not res["ok"]:
        raise AssertionError(f"in child: {res['error']}\n{res.get('tb', '')}")
    return res["value"]


def check_raw_seccomp_eperm(env):
    """A seccomp filter denying the policy syscalls makes mbind fail with EPERM
    (what Docker's default profile does without CAP_SYS_NICE)."""
    env.need_real()
    env.need_numa()
    arch = platform.machine()

    def child():
        _seccomp_deny(arch, RAW_SYSCALLS[arch])
        with RawBuffer(2) as buf:
            r, err = raw_mbind(buf.addr, buf.length, MPOL_INTERLEAVE, env.memory_nodes)
            assert (r, err) == (-1, errno.EPERM), (r, errno.errorcode.get(err, err))
        return {"mbind": "EPERM"}

    return in_child(child)


def check_raw_shared_regions(env):
    """SysV and POSIX shared memory interleaved by the creator keep the exact
    split when a second process attaches and faults every page in."""
    env.need_real()
    env.need_numa()
    nodes = env.memory_nodes
    page = mmap.PAGESIZE
    npages = 8 * len(nodes)
    want = even_split(nodes, npages, page)
    lc = libc()
    out = {}
    # SysV
    shmid = lc.shmget(0, npages * page, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    try:
        addr = lc.shmat(shmid, None, 0)
        r, err = raw_mbind(addr, npages * page, MPOL_INTERLEAVE, nodes)
        assert r == 0, f"mbind on SysV segment: {os.strerror(err)}"

        def attach_sysv():
            a = lc.shmat(shmid, None, 0)
            ctypes.memset(a, 1, npages * page)
            return raw_counts(numa_maps_line(a))

        counts = {int(k): v for k, v in in_child(attach_sysv).items()}
        assert counts == want, f"SysV attacher sees {counts} != {want}"
        out["sysv"] = counts
        lc.shmdt(ctypes.c_void_p(addr))
    finally:
        lc.shmctl(shmid, 0, None)  # IPC_RMID
    # POSIX (a tmpfs file under /dev/shm)
    path = f"/dev/shm/numa_utils_check_{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, npages * page)
        buf = RawBuffer(npages, fd=fd, shared=True)
        r, err = raw_mbind(buf.addr, buf.length, MPOL_INTERLEAVE, nodes)
        assert r == 0, f"mbind on POSIX shm: {os.strerror(err)}"

        def attach_posix():
            fd2 = os.open(path, os.O_RDWR)
            b = RawBuffer(npages, fd=fd2, shared=True)
            b.touch()
            return raw_counts(numa_maps_line(b.addr))

        counts = {int(k): v for k, v in in_child(attach_posix).items()}
        assert counts == want, f"POSIX attacher sees {counts} != {want}"
        out["posix"] = counts
        buf.close()
    finally:
        os.close(fd)
        os.unlink(path)
    return out


def check_raw_numa_maps_kinds(env):
    """One mapping per policy kind the kernel can print; collect the numa_maps
    lines (check_numa_maps_parse feeds them to numa_utils.parse_numa_maps)."""
    env.need_real()
    env.need_numa()
    nodes = env.memory_nodes
    first, last = nodes[0], nodes[-1]
    kinds = [
        ("default", MPOL_DEFAULT, []),
        ("local", MPOL_LOCAL, []),
        ("bind", MPOL_BIND, [first]),
        ("prefer", MPOL_PREFERRED, [last]),
        ("prefer (many)", MPOL_PREFERRED_MANY, nodes[:2]),
        ("interleave", MPOL_INTERLEAVE, nodes),
        ("bind=static", MPOL_BIND | MPOL_F_STATIC_NODES, [first]),
        ("interleave=relative", MPOL_INTERLEAVE | MPOL_F_RELATIVE_NODES, nodes),
    ]
    lines = {}
    bufs = []
    try:
        for name, mode, ns in kinds:
            buf = RawBuffer(2)
            bufs.append(buf)
            r, err = raw_mbind(buf.addr, buf.length, mode, ns)
            assert r == 0, f"mbind {name}: {os.strerror(err)}"
            buf.touch()
            line = numa_maps_line(buf.addr)
            policy = line.split(" ", 1)[1]
            assert policy.startswith(name.split("=")[0]), f"{name}: {line}"
            if "=" in name:
                assert name.split("=")[1] in policy.split(":")[0], f"{name}: {line}"
            lines[name] = line
    finally:
        for b in bufs:
            b.close()
    env.numa_maps_samples = lines
    return lines


def check_raw_cpuset_einval(env):
    """Inside a cgroup whose cpuset.mems excludes a node, asking mbind for that
    node is EINVAL and the allowed node still works (the real EINVAL path)."""
    env.need_real()
    env.need_numa()
    allowed = env.expect.get("cgroup_mems")
    if allowed is None:
        raise Skip("no cpuset restriction in this topology")
    outside = [n for n in env.expected_nodes if n not in allowed]
    with RawBuffer(2) as buf:
        r, err = raw_mbind(buf.addr, buf.length, MPOL_BIND, outside)
        assert (r, err) == (-1, errno.EINVAL), (r, errno.errorcode.get(err, err))
        r, err = raw_mbind(buf.addr, buf.length, MPOL_BIND, allowed)
        assert r == 0, os.strerror(err)
        buf.touch()
        counts = raw_counts(numa_maps_line(buf.addr))
        assert set(counts) <= set(allowed), counts
    return {"outside": outside, "mbind_outside": "EINVAL", "inside": counts}


def check_raw_no_numa(env):
    """A kernel without NUMA (Debian s390x): no node directory, no numa_maps,
    and every policy syscall fails with ENOSYS."""
    env.need_real()
    if env.numa:
        raise Skip("this kernel has NUMA")
    if env.arch != "s390x":
        raise Skip("no-numa topology on a NUMA-enabled kernel")
    assert not os.path.exists("/sys/devices/system/node")
    assert not os.path.exists("/proc/self/numa_maps")
    seen = {}
    with RawBuffer(2) as buf:
        r, err = raw_mbind(buf.addr, buf.length, MPOL_INTERLEAVE, [0])
        seen["mbind"] = errno.errorcode.get(err, err)
        assert (r, err) == (-1, errno.ENOSYS), seen
    r, err = raw_syscall(raw_nr("set_mempolicy"), MPOL_DEFAULT, 0, 0)
    seen["set_mempolicy"] = errno.errorcode.get(err, err)
    assert err == errno.ENOSYS, seen
    _, _, err = raw_get_mempolicy()
    seen["get_mempolicy"] = errno.errorcode.get(err, err)
    assert err == errno.ENOSYS, seen
    return seen


def check_raw_wrong_number_is_caught(env):
    """The number that engines get wrong on aarch64 (237, x86_64's mbind, is
    set_mempolicy there) really fails there: proof the tier can see the bug."""
    env.need_real()
    env.need_numa()
    if env.arch != "aarch64":
        raise Skip("only aarch64 has the 237 trap")
    with RawBuffer(2) as buf:
        r, err = raw_mbind(buf.addr, buf.length, MPOL_INTERLEAVE, env.memory_nodes, nr=237)
        assert r == -1, "syscall(237, <mbind args>) succeeded on aarch64?"
        return {"syscall_237_as_mbind": errno.errorcode.get(err, err)}


TIER_DIR = "/sys/devices/virtual/memory_tiering"
WEIGHTS_DIR = "/sys/kernel/mm/mempolicy/weighted_interleave"


def raw_memory_tiers():
    """{tier id: [nodes]} from memory_tierN/nodelist; None without the folder."""
    if not os.path.isdir(TIER_DIR):
        return None
    return {
        int(name[11:]): _cpulist(_read(f"{TIER_DIR}/{name}/nodelist"))
        for name in os.listdir(TIER_DIR)
        if name.startswith("memory_tier") and name[11:].isdigit()
    }


def raw_access(node, cls=0):
    """nodeN/access<cls>/initiators as the numa_utils record's keys; None if absent."""
    base = f"/sys/devices/system/node/node{node}/access{cls}/initiators"
    if not os.path.isdir(base):
        return None
    rec = {
        "initiators": sorted(
            int(n[4:]) for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit()
        )
    }
    for rw in ("read", "write"):
        rec[f"{rw}_bandwidth_mbps"] = int(_read(f"{base}/{rw}_bandwidth"))
        rec[f"{rw}_latency_ns"] = int(_read(f"{base}/{rw}_latency"))
    return rec


def tier_groups(tiers):
    """{tier: nodes} -> node lists, fastest (lowest id) first."""
    return [sorted(tiers[t]) for t in sorted(tiers)]


def expected_tiers(env):
    """The tiers the kernel must form, fastest first: the topology's own list, else
    (no performance data) one tier holding every node with memory."""
    if env.expect.get("tiers") is not None:
        return env.expect["tiers"]
    return [[n for n in env.expected_nodes if env.expect["nodes"][str(n)]["mem_mb"]]]


def kernel_version():
    """(major, minor) of the running kernel."""
    parts = platform.release().split(".")
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


def check_raw_tiers_hmat(env):
    """Memory tiers and HMAT access class 0 read back exactly as QEMU was told (the
    hmat-tiers guest: node 2 in its own lower tier); without HMAT one tier and no
    access folders."""
    env.need_real()
    env.need_numa()
    tiers = raw_memory_tiers()
    if tiers is None:
        raise Skip(f"no {TIER_DIR} on {platform.release()}")
    assert tier_groups(tiers) == expected_tiers(env), (tiers, expected_tiers(env))
    want = env.expect.get("access") or {}
    seen = {}
    for n in env.expected_nodes:
        got = raw_access(n)
        assert got == want.get(str(n)), f"node{n} access0 {got} != {want.get(str(n))}"
        seen[n] = got
    return {
        "tiers": {str(t): v for t, v in sorted(tiers.items())},
        "access0": seen if want else "none (no HMAT)",
    }


def _nodelist(a, b):
    """Two nodes as numa_maps prints them (the kernel's %*pbl: '0-1', '0,2')."""
    return f"{a}-{b}" if b == a + 1 else f"{a},{b}"


def placement_mb(env):
    """MiB a weighted-interleave check spreads: 64, or 4 where a node is emulated
    CXL memory (about 55x slower than DRAM under TCG)."""
    return 4 if env.expect.get("cxl_mb") else 64


def check_raw_weighted_interleave(env):
    """Linux 6.9+: weight 3 on the first memory node, 1 on the last, then
    mbind(MPOL_WEIGHTED_INTERLEAVE) of 64 MiB gives exactly 3:1 pages in numa_maps
    ('weighted interleave:A,B'); older kernels answer mode 6 with EINVAL."""
    env.need_real()
    env.need_numa()
    nodes = env.memory_nodes
    if len(nodes) < 2:
        raise Skip("one usable memory node")
    a, b = nodes[0], nodes[-1]
    if kernel_version() < (6, 9):
        with RawBuffer(2) as buf:
            r, err = raw_mbind(buf.addr, buf.length, MPOL_WEIGHTED_INTERLEAVE, [a, b])
        assert (r, err) == (-1, errno.EINVAL), (r, errno.errorcode.get(err, err))
        assert not os.path.exists(WEIGHTS_DIR), WEIGHTS_DIR
        return {"kernel": platform.release(), "mbind_mode_6": "EINVAL"}
    paths = {n: f"{WEIGHTS_DIR}/node{n}" for n in (a, b)}
    before = {n: _read(p) for n, p in paths.items()}
    page = mmap.PAGESIZE
    npages = (placement_mb(env) << 20) // page
    try:
        for n, w in ((a, "3"), (b, "1")):
            with open(paths[n], "w") as fh:
                fh.write(w)
        with RawBuffer(npages) as buf:
            r, err = raw_mbind(buf.addr, buf.length, MPOL_WEIGHTED_INTERLEAVE, [a, b])
            assert r == 0, f"mbind(MPOL_WEIGHTED_INTERLEAVE): {os.strerror(err)}"
            buf.touch()
            line = numa_maps_line(buf.addr)
    finally:
        for n, p in paths.items():
            with open(p, "w") as fh:
                fh.write(before[n])
    want = {a: npages * 3 // 4 * page, b: npages // 4 * page}
    assert raw_counts(line) == want, f"numa_maps {raw_counts(line)} != {want}: {line}"
    assert f"weighted interleave:{_nodelist(a, b)}" in line, line
    return {
        "kernel": platform.release(),
        "weights": {a: 3, b: 1},
        "weights_before": before,
        "pages": {n: v // page for n, v in want.items()},
        "numa_maps": line[:120],
    }


# --------------------------------------------------------------------------
# numa_utils API checks: same functions against SimulatedBackend and real kernels.


def check_topology(env):
    """read_topology() equals what QEMU (or the simulator) was told."""
    (read_topology,) = env.need("read_topology")
    topo = read_topology(backend=env.backend)
    nodes = sorted(topo.nodes)
    if not env.numa:
        # No node directory: one node holding every CPU and all memory.
        assert nodes == [0], nodes
        assert sorted(topo.nodes[0].cpus) == list(range(env.expect["cpus"])), topo.nodes[0]
        return {"nodes": nodes, "has_node_dir": getattr(topo, "has_node_dir", None)}
    assert nodes == env.expected_nodes, (nodes, env.expected_nodes)
    for n in nodes:
        node = topo.nodes[n]
        want = env.expect["nodes"][str(n)]
        assert sorted(node.cpus) == want["cpus"], f"node{n} cpus {sorted(node.cpus)}"
        kb = node.mem_total_kb
        assert kb <= want["mem_mb"] * 1024 and (kb == 0) == (want["mem_mb"] == 0), (n, kb)
        dist = [node.distances.get(m) for m in nodes]
        row = env.expect["distances"][nodes.index(n)]
        assert dist == row, f"node{n} distances {dist} != {row}"
    memory_only = sorted(set(topo.nodes_with_memory) - set(topo.nodes_with_cpus))
    assert memory_only == env.expect["memory_only"], memory_only
    assert sorted(topo.mems_allowed) == env.expect["allowed_mems"], sorted(topo.mems_allowed)
    return {
        "nodes": nodes,
        "memory_only": memory_only,
        "mems_allowed": sorted(topo.mems_allowed),
        "distances": env.expect["distances"] if len(nodes) <= 8 else "66x66 ok",
    }


def check_numa_maps_parse(env):
    """Every policy kind the kernel printed (check_raw_numa_maps_kinds) parses."""
    (parse,) = env.need("parse_numa_maps")
    samples = getattr(env, "numa_maps_samples", None)
    if not samples:
        raise Skip("no numa_maps samples from this kernel (check_raw_numa_maps_kinds)")
    out = {}
    for kind, line in samples.items():
        entries = parse(line + "\n")
        entries = list(entries.values()) if isinstance(entries, dict) else list(entries)
        assert len(entries) == 1, (kind, entries)
        e = entries[0]
        got_policy = getattr(e, "policy", None)
        assert got_policy is not None and kind.split("=")[0] in str(got_policy), (kind, e)
        out[kind] = repr(e)[:160]
    return out


# -- helpers for the API checks (work on both backends) ----------------------


class _ApiBuffer:
    """npages of anonymous memory, page aligned for the backend's page size, with
    a guard page either side. On a real kernel THP is turned off for it so one
    fault places one page. ``addr``/``length`` are what the checks pass on."""

    def __init__(self, env, npages, private=False):
        self.env = env
        self.page = env.page_size
        flags = mmap.MAP_SHARED  # Python's default for anonymous memory
        if private:
            flags = mmap.MAP_PRIVATE
        self.mm = mmap.mmap(-1, (npages + 3) * self.page, flags=flags | mmap.MAP_ANONYMOUS)
        if env.real and hasattr(mmap, "MADV_NOHUGEPAGE"):
            self.mm.madvise(mmap.MADV_NOHUGEPAGE)
        self._ref = ctypes.c_char.from_buffer(self.mm)
        base = ctypes.addressof(self._ref)
        self.addr = base + (-base) % self.page + self.page
        self.length = npages * self.page
        self.npages = npages

    def pages(self):
        return [self.addr + i * self.page for i in range(self.npages)]

    def close(self):
        if not self.env.real:
            # SimulatedBackend models no munmap of private memory: keep the
            # mapping alive so the next buffer cannot reuse its addresses.
            self.env.__dict__.setdefault("_keep", []).append(self)
            return
        del self._ref
        self.mm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def backend_numa_maps_line(env, addr) -> str:
    """The numa_maps line (as the backend renders it) of the VMA holding addr:
    the one with the largest start <= addr (numa_maps lists every VMA)."""
    text = env.backend.read_text("/proc/self/numa_maps")
    best, best_start = None, -1
    for line in text.splitlines():
        try:
            start = int(line.split(" ", 1)[0], 16)
        except ValueError:
            continue
        if best_start < start <= addr:
            best, best_start = line, start
    assert best is not None, f"no numa_maps line for {addr:#x}"
    return best


def _split_by_move_pages(env, buf):
    st = env.nu.move_pages(0, buf.pages(), backend=env.backend)
    out = {}
    for s in st:
        out[s] = out.get(s, 0) + buf.page
    return out


def _placement(env, buf):
    """numa_utils.placement() when implemented, else None."""
    try:
        got = env.nu.placement(buf.addr, buf.length, backend=env.backend)
    except NotImplementedError:
        return None
    return {int(k): v for k, v in got.items() if v}


# -- API checks ---------------------------------------------------------------


def check_interleave_split(env):
    """interleave() over every usable node: the exact split in numa_maps, in
    move_pages (and in placement()), and get_policy() reads it back."""
    nu = env.nu
    env.need("interleave", "move_pages", "get_policy")
    env.need_numa()
    nodes = env.default_nodes
    with _ApiBuffer(env, 8 * len(nodes)) as buf:
        res = nu.interleave(buf.addr, buf.length, backend=env.backend)
        if len(nodes) == 1:
            assert not res and res.reason, res
            return {"nodes": nodes, "applied": False, "reason": res.reason}
        assert res, f"interleave not applied: reason={res.reason} errno={res.errno}"
        assert sorted(res.nodes) == nodes, (sorted(res.nodes), nodes)
        pol = nu.get_policy(buf.addr, backend=env.backend)
        assert pol.mode == nu.Mode.INTERLEAVE and sorted(pol.nodes) == nodes, str(pol)
        env.backend.touch(buf.addr, buf.length)
        want = even_split(nodes, buf.npages, buf.page)
        line = backend_numa_maps_line(env, buf.addr)
        assert raw_counts(line) == want, f"numa_maps {raw_counts(line)} != {want}: {line}"
        by_mp = _split_by_move_pages(env, buf)
        assert by_mp == want, f"move_pages {by_mp} != {want}"
        placed = _placement(env, buf)
        assert placed is None or placed == want, f"placement() {placed} != {want}"
    return {
        "nodes": nodes,
        "split": want,
        "policy": str(pol),
        "numa_maps": line,
        "placement": "checked" if placed is not None else "not implemented",
    }


def check_bind_prefer(env):
    """bind() and prefer() put every page on the node asked for; get_policy()
    and node_of() agree."""
    nu = env.nu
    env.need("bind", "prefer", "get_policy", "node_of")
    env.need_numa()
    target = env.memory_nodes[-1]
    seen = {}
    for name, call, mode in (
        (
            "bind",
            lambda b: nu.bind(b.addr, [target], length=b.length, backend=env.backend),
            nu.Mode.BIND,
        ),
        (
            "prefer",
            lambda b: nu.prefer(b.addr, target, length=b.length, backend=env.backend),
            nu.Mode.PREFERRED,
        ),
    ):
        with _ApiBuffer(env, 4) as buf:
            res = call(buf)
            assert res, f"{name}: reason={res.reason} errno={res.errno}"
            pol = nu.get_policy(buf.addr, backend=env.backend)
            assert pol.mode == mode and set(pol.nodes) == {target}, f"{name}: {pol}"
            env.backend.touch(buf.addr, buf.length)
            counts = raw_counts(backend_numa_maps_line(env, buf.addr))
            assert counts == {target: buf.length}, f"{name}: {counts}"
            assert nu.node_of(buf.addr, backend=env.backend) == target
            seen[name] = {"policy": str(pol), "numa_maps": counts}
    return {"target": target, **seen}


def check_cpuset_einval(env):
    """In a cpuset that excludes a node: raw mbind() of that node is EINVAL (as
    OSError), the safe layer does not apply it, interleave() keeps to the cpuset."""
    nu = env.nu
    env.need("mbind", "bind", "Mode")
    env.need_numa()
    allowed = env.expect.get("cgroup_mems")
    if allowed is None:
        raise Skip("no cpuset restriction in this topology")
    outside = [n for n in env.expected_nodes if n not in allowed]
    out = {}
    with _ApiBuffer(env, 2) as buf:
        try:
            nu.mbind(buf.addr, buf.length, nu.Mode.BIND, outside, backend=env.backend)
            raise AssertionError("mbind of a node outside the cpuset succeeded")
        except OSError as e:
            assert e.errno == errno.EINVAL, e
            out["mbind_outside"] = "EINVAL"
        res = nu.bind(buf.addr, outside, length=buf.length, backend=env.backend)
        assert not res, f"bind outside the cpuset applied: {res}"
        out["bind_outside"] = {"reason": res.reason, "errno": res.errno}
    return out


def _policy_denied_body(env):
    nu = env.nu
    nodes = env.default_nodes
    with _ApiBuffer(env, 4 * len(nodes)) as buf:
        res = nu.interleave(buf.addr, buf.length, backend=env.backend)
        assert not res, f"interleave applied under a filter denying mbind: {res}"
        assert res.errno == errno.EPERM and "EPERM" in str(res.reason), (
            f"reason={res.reason!r} errno={res.errno}"
        )
        env.backend.touch(buf.addr, buf.length)  # memory still usable
        return {"reason": res.reason, "errno": res.errno, "hint": res.hint}


def check_seccomp_fallback(env):
    """With the policy syscalls denied (seccomp SECCOMP_RET_ERRNO|EPERM on a real
    kernel, SimulatedBackend.fail() in the simulator), interleave() falls back:
    not applied, reason EPERM, and the memory is still usable."""
    env.need("interleave")
    env.need_numa()
    if len(env.default_nodes) < 2:
        raise Skip("one usable memory node: interleave() is a no-op before any syscall")
    if env.real:
        arch = platform.machine()

        def child():
            _seccomp_deny(arch, RAW_SYSCALLS[arch])
            return _policy_denied_body(env)

        return {"seccomp": in_child(child)}
    env.backend.fail("*", errno.EPERM)
    try:
        return {"simulated": _policy_denied_body(env)}
    finally:
        env.backend.clear_failures()


def check_no_numa_api(env):
    """Kernel without NUMA: the raw calls raise ENOSYS, the safe layer does not
    apply (with a reason) and memory still works."""
    nu = env.nu
    env.need("mbind", "interleave", "Mode")
    if env.numa:
        raise Skip("this kernel has NUMA")
    with _ApiBuffer(env, 2) as buf:
        try:
            nu.mbind(buf.addr, buf.length, nu.Mode.INTERLEAVE, [0], backend=env.backend)
            raise AssertionError("mbind succeeded on a kernel without NUMA")
        except OSError as e:
            assert e.errno == errno.ENOSYS, e
        res = nu.interleave(buf.addr, buf.length, backend=env.backend)
        assert not res and res.reason, res
        env.backend.touch(buf.addr, buf.length)
    return {"mbind": "ENOSYS", "interleave": {"reason": res.reason, "errno": res.errno}}


def _call(fn, *args, **kw):
    """Call fn with the keyword arguments its signature accepts (the API of
    issue 4 is still settling; the check must not break on an optional name)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kw)
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        kw = {k: v for k, v in kw.items() if k in params}
    return fn(*args, **kw)


def check_shared_regions(env):
    """SharedRegion.create(policy="interleave") in one process, attach + prefault
    in a second: the attacher's placement() is the exact split (SysV and POSIX)."""
    nu = env.nu
    (region_cls,) = env.need("SharedRegion")
    if not hasattr(region_cls, "create") or not hasattr(region_cls, "attach"):
        raise Skip("numa_utils.SharedRegion is not implemented yet")
    env.need_numa()
    nodes = env.default_nodes
    if len(nodes) < 2:
        raise Skip("one usable memory node")
    size = 8 * len(nodes) * env.page_size
    want = even_split(nodes, 8 * len(nodes), env.page_size)
    out = {}
    for kind in ("sysv", "posix"):
        key = f"numa_utils_check_{os.getpid()}_{kind}"
        region = _call(
            region_cls.create,
            key,
            size,
            policy="interleave",
            kind=kind,
            prefault=False,
            backend=env.backend,
        )
        try:

            def attacher(backend, key=key, kind=kind):
                r2 = _call(
                    region_cls.attach, key, size, policy="interleave", kind=kind, backend=backend
                )
                try:
                    _call(nu.prefault, r2.address, r2.size, backend=backend)
                    return {int(k): v for k, v in r2.placement().items() if v}
                finally:
                    r2.close()

            if env.real:
                got = {int(k): v for k, v in in_child(lambda: attacher(env.backend)).items()}
            else:
                got = attacher(env.backend.process())
            assert got == want, f"{kind}: attacher placement {got} != {want}"
            out[kind] = got
        finally:
            region.close()
            _call(region.destroy)
    return out


def check_own_mapping_flow(env):
    """The seeds' flow with the core alone (issue 37 section 4): the engine keeps its
    own mapping, a SysV segment (shmget/shmat, as LightLLM makes its KV cache) or a
    /dev/shm file it maps (as vLLM's offload tier does); the creator and every
    attacher interleave their mapping with nu.interleave, an attacher prefaults it
    with nu.prefault, and nu.placement reads back the exact split."""
    nu = env.nu
    env.need("interleave", "prefault", "placement")
    env.need_numa()
    nodes = env.default_nodes
    if len(nodes) < 2:
        raise Skip("one usable memory node")
    npages = 8 * len(nodes)
    size = npages * env.page_size
    want = even_split(nodes, npages, env.page_size)
    b = env.backend

    def place(backend, addr):
        res = nu.interleave(addr, size, nodes=nodes, backend=backend)
        assert res, f"interleave not applied: {res.reason} {res.errno}"
        nu.prefault(addr, size, threads=1, backend=backend, shared=True)
        return {int(k): v for k, v in nu.placement(addr, size, backend=backend).items() if v}

    def attached(fn):
        """fn(backend) in a second process: a forked child, or the model's."""
        if env.real:
            return {int(k): v for k, v in in_child(lambda: fn(b)).items()}
        return fn(b.process())

    out = {}
    shmid = b.call("shmget", 0, size, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    addr = b.call("shmat", shmid, 0)
    try:
        res = nu.interleave(addr, size, nodes=nodes, backend=b)
        assert res, f"creator's interleave not applied: {res.reason}"

        def sysv(backend):
            a = backend.call("shmat", shmid, 0)
            try:
                return place(backend, a)
            finally:
                backend.call("shmdt", a)

        out["sysv"] = attached(sysv)
    finally:
        b.call("shmdt", addr)
        b.call("shm_rmid", shmid)
    name = f"numa_utils_check_{os.getpid()}_own"
    fd = b.call("shm_open", name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        b.call("ftruncate", fd, size)
        addr = b.call("mmap", size, fd)
        try:
            res = nu.interleave(addr, size, nodes=nodes, backend=b)
            assert res, f"creator's interleave not applied: {res.reason}"

            def posix(backend):
                fd2 = backend.call("shm_open", name, os.O_RDWR, 0)
                a = backend.call("mmap", size, fd2)
                try:
                    return place(backend, a)
                finally:
                    backend.call("munmap", a, size)
                    backend.call("close", fd2)

            out["posix"] = attached(posix)
        finally:
            b.call("munmap", addr, size)
    finally:
        b.call("close", fd)
        b.call("shm_unlink", name)
    for kind, got in out.items():
        assert got == want, f"{kind}: the attacher's placement {got} != {want}"
    return out


def _paused_child(first, then):
    """Fork a child that runs first() and then waits: the function returned lets it
    go on, and returns what then() returned (JSON) or raises what went wrong.  Call
    it on every way out, or the child waits for ever."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd in (ready_r, go_w, out_r):
            os.close(fd)
        try:
            first()
            os.write(ready_w, b"1")
            os.read(go_r, 1)
            res = {"ok": True, "value": _jsonable(then())}
        except BaseException as e:  # noqa: BLE001
            res = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "tb": traceback.format_exc(limit=6),
            }
        os.write(out_w, json.dumps(res).encode())
        os._exit(0)
    for fd in (ready_w, go_r, out_w):
        os.close(fd)
    os.read(ready_r, 1)  # nothing when first() failed: the child has written why
    os.close(ready_r)

    def finish():
        try:
            os.write(go_w, b"1")
        except BrokenPipeError:
            pass
        os.close(go_w)
        data = _read_all(out_r)
        os.waitpid(pid, 0)
        res = json.loads(data or b'{"ok": false, "error": "child died"}')
        if not res["ok"]:
            raise AssertionError(f"in child: {res['error']}\n{res.get('tb', '')}")
        return res["value"]

    finish.pid = pid
    return finish


def check_settle_scope(env):
    """settle() moves only what this process first-touched by accident (issue 38
    section 1).  This process interleaves a SysV segment over the first and last
    node and touches it; a second process attaches and prefaults it; this process
    binds a buffer to the last node and first-touches another there, then calls
    settle([first]): the second process's pages stay split, the bound buffer stays,
    the other buffer moves.  (As root, the whole-process migrate_pages(2) settle
    used to take MPOL_MF_MOVE_ALL and moved the first two as well.)"""
    nu = env.nu
    (settle,) = env.need("settle")
    env.need_numa()
    nodes = env.default_nodes
    if len(nodes) < 2:
        raise Skip("one usable memory node")
    pair = [nodes[0], nodes[-1]]
    first, last = pair
    b = env.backend
    npages = 16
    size = npages * env.page_size
    split = even_split(pair, npages, env.page_size)
    seen = {}

    def attach(backend):
        seen["addr"] = backend.call("shmat", shmid, 0)
        nu.prefault(seen["addr"], size, threads=1, backend=backend, shared=True)

    def placed(backend, addr, length):
        got = nu.placement(addr, length, method="move_pages", backend=backend)
        return {int(k): v for k, v in got.items() if v}

    shmid = b.call("shmget", 0, size, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    addr = b.call("shmat", shmid, 0)
    finish = None
    try:
        res = nu.interleave(addr, size, nodes=pair, backend=b)
        assert res, f"interleave not applied: {res.reason} {res.errno}"
        b.touch(addr, size)
        if env.real:
            finish = _paused_child(lambda: attach(b), lambda: placed(b, seen["addr"], size))
        else:
            other = b.process()
            attach(other)
        # Private memory made after the fork: a page made before it is the child's too
        # (copy-on-write), which MPOL_MF_MOVE leaves where it is.
        with _ApiBuffer(env, npages, private=True) as bound:
            with _ApiBuffer(env, npages, private=True) as loose:
                res = nu.bind(bound.addr, [last], bound.length, backend=b)
                assert res, f"bind not applied: {res.reason} {res.errno}"
                b.touch(bound.addr, bound.length)
                with nu.thread_policy("bind", [last], backend=b):
                    b.touch(loose.addr, loose.length)
                assert placed(b, loose.addr, loose.length) == {last: loose.length}
                r = settle([first], budget_ms=None, backend=b)
                kept = placed(b, bound.addr, bound.length)
                moved = placed(b, loose.addr, loose.length)
        if env.real:
            second = finish()
            finish = None
        else:
            second = placed(other, seen["addr"], size)
    finally:
        if finish is not None:
            finish()
        b.call("shmdt", addr)
        b.call("shm_rmid", shmid)
    second = {int(k): v for k, v in second.items()}
    assert second == split, f"the second process's pages moved: {second} != {split}"
    assert kept == {last: size}, f"the bound buffer moved: {kept}"
    assert moved == {first: size}, f"the first-touched buffer did not move: {moved}"
    assert r.finished and r.scope == "private", r
    assert r.skipped.get("shared", 0) >= size // 2 and r.skipped.get("policy", 0) >= size, r
    assert sum(r.moved.values()) >= size, r
    return {"second": second, "bound": kept, "moved": moved, "result": nu.to_json(r)}


def _named_thread(name):
    """A real thread named ``name`` (PR_SET_NAME) that waits: (thread, its tid, the
    event that ends it)."""
    named, end = threading.Event(), threading.Event()
    tids = []

    def run():
        ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
        tids.append(threading.get_native_id())
        named.set()
        end.wait()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    named.wait()
    return thread, tids[0], end


def _child_with_pid(pid, first):
    """_paused_child(first, ...) given ``pid`` through ns_last_pid (root), once the
    task that had it is gone; Skip when the kernel will not give it."""
    for _ in range(50):
        try:
            _write("/proc/sys/kernel/ns_last_pid", str(pid - 1))
        except OSError as err:
            raise Skip(f"cannot choose the next pid (ns_last_pid: {err})") from None
        finish = _paused_child(first, lambda: None)
        if finish.pid == pid:
            return finish
        finish()
        time.sleep(0.02)
    raise Skip(f"pid {pid} was not given again")


def check_pinned_reused_id(env):
    """pinned() puts back only the threads it pinned (issue 38 section 3): a pinned
    thread exits and another process is given its id (ns_last_pid, root); leaving
    pinned() leaves that process's CPU mask alone and lists the id as exited."""
    nut = env.nut
    env.need("pinned", "ThreadPlan")
    b = env.backend
    cpus = sorted(b.call("sched_getaffinity", 0))
    if len(cpus) < 2:
        raise Skip("one CPU: a pinned mask is the mask it had")
    plan = nut.ThreadPlan(None, None, 0, {"copy": frozenset(cpus[:1])}, "core", {}, {})
    own = {cpus[-1]}  # the other process's mask
    pins = nut.pinned(plan, {"copy": "^NCCL gone"}, backend=b)
    if env.real:
        thread, tid, end = _named_thread("NCCL gone")
        with pins as r:
            pinned = [pin.tid for pin in r.threads if pin.ok]
            end.set()
            thread.join()
            finish = _child_with_pid(tid, lambda: os.sched_setaffinity(0, own))
        try:
            mask = os.sched_getaffinity(finish.pid)
        finally:
            finish()
    else:
        tid = b.add_thread(name="NCCL gone")
        with pins as r:
            pinned = [pin.tid for pin in r.threads if pin.ok]
            b.end_thread(tid)
            stranger = b.process(pid=tid)
            stranger.call("sched_setaffinity", 0, own)
        mask = stranger.call("sched_getaffinity", 0)
    assert pinned == [tid], f"pinned {pinned}, not the thread {tid}"
    assert mask == own, f"pid {tid}, reused by another process, got mask {sorted(mask)}"
    assert pins.exited == [tid] and not pins.restored, (pins.exited, pins.restored)
    return {"tid": tid, "mask": sorted(mask), "exited": pins.exited}


def _raw_hugepages(nodes, count=8, kb=2048):
    """Reserve ``count`` huge pages on each node (root in a guest); False when the
    kernel would not give them all."""
    for n in nodes:
        path = f"/sys/devices/system/node/node{n}/hugepages/hugepages-{kb}kB/nr_hugepages"
        try:
            with open(path, "w") as fh:
                fh.write(str(count))
            if int(_read(path) or 0) < count:
                return False
        except OSError:
            return False
    return True


def check_layout_regions(env):
    """A parts layout (one part per memory node, bound), created in one process and
    attached in a second told nothing: the attacher reads the same layout and each
    extent's pages sit on its node, by raw numa_maps lines (the record's room is a
    VMA of its own, so the last extent's line is its alone), by raw move_pages, and by
    placement(by_extent=True).  Then the same with 2 MiB hugetlb pages, reserved on
    every node, which keep no shared policy: the attacher applies the layout itself."""
    (region_cls,) = env.need("SharedRegion")
    env.need("Layout")
    env.need_numa()
    nodes = env.memory_nodes
    if len(nodes) < 2:
        raise Skip("one usable memory node")
    out = {}
    cases = [("sysv", 0, env.page_size), ("posix", 0, env.page_size)]
    if env.real and _raw_hugepages(nodes):
        cases.append(("sysv", 2 << 20, 2 << 20))
    elif not env.real and all(
        2048 in env.backend.topology.nodes[n].hugepages
        and env.backend.topology.nodes[n].hugepages[2048].total
        for n in nodes
    ):
        cases.append(("sysv", 2 << 20, 2 << 20))
    for kind, huge, page in cases:
        part = 4 * page
        size = part * len(nodes)
        key = f"numa_utils_check_{os.getpid()}_layout_{kind}_{huge}"
        text = "parts:bind:" + "/".join(map(str, nodes))
        region = region_cls.create(
            key,
            size,
            layout=text,
            kind=kind,
            hugepages=f"{huge >> 20}M" if huge else False,
            backend=env.backend,
        )
        try:

            def attacher(backend, key=key, kind=kind, page=page):
                r2 = region_cls.attach(key, kind=kind, prefault=True, backend=backend)
                try:
                    got = {"layout": str(r2.layout), "per": [], "ok": []}
                    for e, pl in zip(r2.extents, r2.placement(by_extent=True)):
                        got["per"].append({int(k): v for k, v in pl.items() if v})
                        got["ok"].append(pl.ok)
                        if env.real:
                            st = raw_move_pages_query(r2.address + e.offset, e.length // page, page)
                            got.setdefault("move_pages", []).append(sorted(set(st)))
                            got.setdefault("raw", []).append(
                                raw_counts(numa_maps_line(r2.address + e.offset))
                            )
                    return got
                finally:
                    r2.close()

            if env.real:
                got = in_child(lambda: attacher(env.backend))
            else:
                got = attacher(env.backend.process())
            name = f"{kind}{'-huge' if huge else ''}"
            assert got["layout"].startswith(text + "@"), f"{name}: {got['layout']}"
            want = [{n: part} for n in nodes]
            per = [{int(k): v for k, v in d.items()} for d in got["per"]]
            assert per == want and all(got["ok"]), f"{name}: per extent {per} != {want}"
            for i, n in enumerate(nodes):
                if "raw" in got:
                    raw = {int(k): v for k, v in got["raw"][i].items() if v}
                    assert raw == {n: part}, f"{name}: numa_maps extent {i}: {raw}"
            for i, n in enumerate(nodes):
                if got.get("move_pages") and got["move_pages"][i]:
                    assert got["move_pages"][i] == [n], (
                        f"{name}: move_pages extent {i}: {got['move_pages'][i]}"
                    )
            out[name] = per
        finally:
            region.close()
            region.destroy()
    return out


# -- tiered memory (issue 11): tiers, HMAT, weighted interleave, the default -----


def _access_dict(acc):
    if acc is None:
        return None
    keys = ("read_bandwidth_mbps", "write_bandwidth_mbps", "read_latency_ns", "write_latency_ns")
    rec = {k: getattr(acc, k) for k in keys}
    rec["initiators"] = sorted(acc.initiators)
    return rec


def _maps_lines_from(env, start, end):
    """The numa_maps lines of VMAs starting in [start, end): this process's own file on
    a real kernel, the simulated one's otherwise."""
    if env.real:
        with open("/proc/self/numa_maps") as fh:
            text = fh.read()
    else:
        text = env.backend.read_text("/proc/self/numa_maps")
    out = []
    for line in text.splitlines():
        if start <= int(line.split(" ", 1)[0], 16) < end:
            out.append(line)
    return out


def check_record_room(env):
    """A region's identity record sits in a room of its own: 64 MiB interleaved over
    two nodes shows exactly equal data pages N0/N1 on the data's numa_maps line, bound
    to the second node its data line holds that node only, and the room is a
    separate line (its own VMA, another policy) whose pages sit on a node the data's
    policy allows (SysV and POSIX; raw numa_maps lines, parsed here)."""
    (region_cls,) = env.need("SharedRegion")
    env.need_numa()
    nodes = env.memory_nodes[:2]
    if len(nodes) < 2:
        raise Skip("one usable memory node")
    size = 64 << 20  # the size issue 26 measured; 256 pages in the simulator
    if not env.real:
        size = 256 * env.page_size
    npages = size // env.page_size
    cases = [
        ("interleave", nodes, even_split(nodes, npages, env.page_size)),
        ("bind", nodes[1:], {nodes[1]: size}),
    ]
    out = {}
    for kind in ("sysv", "posix"):
        for policy, on, want in cases:
            key = f"numa_utils_check_{os.getpid()}_room_{kind}_{policy}"
            region = region_cls.create(
                key, size, policy=policy, nodes=on, kind=kind, backend=env.backend
            )
            try:
                end = region.address + region._mapped
                lines = _maps_lines_from(env, region.address, end)
                name = f"{kind}-{policy}"
                assert len(lines) == 2, f"{name}: {lines}"
                data, room = lines
                got = {n: v for n, v in raw_counts(data).items() if v}
                assert got == want, f"{name}: data {got} != {want}: {data}"
                assert int(room.split()[0], 16) == region.address + region.size, room
                assert room.split()[1] != data.split()[1], f"{name}: {room} / {data}"
                assert set(raw_counts(room)) <= set(on), f"{name}: room {room}"
                pl = {int(n): v for n, v in region.placement().items() if v}
                assert pl == want, f"{name}: placement() {pl}"
                out[name] = {"data": data[:160], "room": room[:160]}
            finally:
                region.close()
                region.destroy()
    return out


def check_tiers_api(env):
    """read_topology(): nodes[n].tier, nodes[n].access (HMAT access class 0) and
    memory_tiers equal what QEMU was told (or the fixture's expectation) and, on a
    real kernel, what the raw sysfs parser above reads."""
    (read_topology,) = env.need("read_topology")
    env.need_numa()
    topo = read_topology(backend=env.backend)
    if not all(
        hasattr(n, "tier") and hasattr(n, "access") for n in topo.nodes.values()
    ) or not hasattr(topo, "memory_tiers"):
        raise Skip("numa_utils has no Node.tier / Node.access / Topology.memory_tiers yet")
    if env.real:
        tiers = raw_memory_tiers()
        want_groups = tier_groups(tiers) if tiers is not None else []
        assert tiers is None or want_groups == expected_tiers(env), (tiers, env.expect)
        want_access = {str(n): raw_access(n) for n in env.expected_nodes}
    elif env.expect.get("tiers") is not None or env.expect.get("access") is not None:
        want_groups = env.expect.get("tiers") or []
        want_access = env.expect.get("access") or {}
    else:
        raise Skip("this fixture's expected.json has no tier/HMAT expectation")
    got_tiers = {int(t): sorted(v) for t, v in topo.memory_tiers.items()}
    assert tier_groups(got_tiers) == want_groups, f"memory_tiers {got_tiers} != {want_groups}"
    out = {}
    for n, node in sorted(topo.nodes.items()):
        tier = next((t for t, v in got_tiers.items() if n in v), None)
        assert node.tier == tier, f"node{n}.tier {node.tier} but memory_tiers {got_tiers}"
        acc = _access_dict(node.access)
        assert acc == want_access.get(str(n)), f"node{n}.access {acc} != {want_access.get(str(n))}"
        out[n] = {"tier": node.tier, "access": acc}
    return {
        "memory_tiers": {str(t): v for t, v in sorted(got_tiers.items())},
        "nodes": out if len(out) <= 8 else f"{len(out)} nodes",
    }


def check_default_memory_nodes(env):
    """default_memory_nodes(topology) is what the topology expects (hmat-tiers: the
    two DRAM nodes, node 2 left out) or at least every usable node with CPUs; an
    explicit node list still reaches every usable node."""
    nu = env.nu
    dmn, read_topology = env.need("default_memory_nodes", "read_topology")
    env.need("interleave")
    env.need_numa()
    got = sorted(dmn(read_topology(backend=env.backend)))
    usable = env.memory_nodes
    want = env.expect.get("default_memory_nodes")
    if want is not None:
        want = [n for n in want if n in usable] or usable[:1]
        assert got == want, f"default_memory_nodes {got} != {want}"
    else:
        with_cpus = [n for n in usable if env.expect["nodes"][str(n)]["cpus"]]
        assert got and set(with_cpus) <= set(got) <= set(usable), (got, usable)
    out = {"default": got, "usable": usable}
    if len(usable) > len(got) >= 1:
        with _ApiBuffer(env, 8 * len(usable)) as buf:
            res = nu.interleave(buf.addr, buf.length, nodes=usable, backend=env.backend)
            assert res and sorted(res.nodes) == usable, f"explicit nodes: {res}"
            env.backend.touch(buf.addr, buf.length)
            counts = raw_counts(backend_numa_maps_line(env, buf.addr))
            assert counts == even_split(usable, buf.npages, buf.page), counts
            out["explicit_all"] = counts
    return out


def check_weighted_interleave_api(env):
    """interleave_weights() / set_interleave_weights() / weighted_interleave(): 3:1
    weights over the first and last memory node give exactly 3:1 pages and are
    restored after; where the kernel has no weighted interleave (interleave_weights()
    is None: Linux < 6.9) the call is falsy with a reason."""
    nu = env.nu
    env.need("interleave_weights", "set_interleave_weights", "weighted_interleave")
    env.need_numa()
    usable = env.memory_nodes
    if len(usable) < 2:
        raise Skip("one usable memory node")
    a, b = usable[0], usable[-1]
    weights = nu.interleave_weights(backend=env.backend)
    npages = (placement_mb(env) << 20) // env.page_size if env.real else 64
    with _ApiBuffer(env, npages) as buf:
        if weights is None:
            res = _call(
                nu.weighted_interleave, buf.addr, buf.length, nodes=[a, b], backend=env.backend
            )
            assert not res and res.reason, f"no weights on this kernel, yet {res}"
            env.backend.touch(buf.addr, buf.length)
            return {"weights": None, "reason": res.reason, "errno": res.errno}
        admin = env.backend
        if not env.real and getattr(env.backend, "uid", 0) != 0:
            # The weights are root-writable only: an unprivileged process gets EACCES;
            # a root process on the same simulated kernel sets them for everyone.
            try:
                nu.set_interleave_weights({a: 3}, backend=env.backend)
                raise AssertionError("set_interleave_weights succeeded without root")
            except PermissionError:
                pass
            admin = env.backend.process(uid=0)
        prev = nu.set_interleave_weights({a: 3, b: 1}, backend=admin)
        try:
            assert {n: prev.get(n) for n in (a, b)} == {n: weights.get(n) for n in (a, b)}, (
                f"set_interleave_weights returned {prev}, weights were {weights}"
            )
            now = nu.interleave_weights(backend=env.backend)
            assert (now[a], now[b]) == (3, 1), now
            res = _call(
                nu.weighted_interleave, buf.addr, buf.length, nodes=[a, b], backend=env.backend
            )
            assert res, f"weighted_interleave not applied: {res}"
            env.backend.touch(buf.addr, buf.length)
            line = backend_numa_maps_line(env, buf.addr)
        finally:
            nu.set_interleave_weights(prev, backend=admin)
    want = {a: npages * 3 // 4 * buf.page, b: npages // 4 * buf.page}
    assert raw_counts(line) == want, f"numa_maps {raw_counts(line)} != {want}: {line}"
    assert f"weighted interleave:{_nodelist(a, b)}" in line, line
    after = nu.interleave_weights(backend=env.backend)
    assert after == weights, f"weights not restored: {after} != {weights}"
    return {
        "weights_before": weights,
        "pages": {n: v // buf.page for n, v in want.items()},
        "numa_maps": line[:120],
    }


def check_suggest_weights(env):
    """suggest_weights(topology) ranks the nodes by HMAT bandwidth: more bandwidth,
    never a smaller weight; twice the bandwidth, a larger one; weights 1..255."""
    nu = env.nu
    suggest, read_topology = env.need("suggest_weights", "read_topology")
    env.need_numa()
    topo = read_topology(backend=env.backend)
    bw = {
        n: node.access.read_bandwidth_mbps
        for n, node in topo.nodes.items()
        if getattr(node, "access", None) is not None
    }
    if len(bw) < 2:
        raise Skip("fewer than two nodes with HMAT bandwidth here")
    w = nu.suggest_weights(topo)
    assert isinstance(w, dict) and set(bw) <= set(w), (w, bw)
    assert all(isinstance(v, int) and 1 <= v <= 255 for v in w.values()), w
    for m in bw:
        for n in bw:
            if bw[m] > bw[n]:
                assert w[m] >= w[n], f"node{m} {bw[m]} MB/s > node{n} {bw[n]} MB/s: {w}"
            if bw[m] >= 2 * bw[n]:
                assert w[m] > w[n], f"node{m} {bw[m]} MB/s >= 2x node{n}: {w}"
    return {"bandwidth": bw, "weights": w}


# -- devices, generic initiators, packages, CXL (issue 22) ----------------------
#
# The raw checks compare the guest's sysfs with the QEMU definition (vm/run.py
# TOPOLOGIES: "pci", "generic_initiators", "packages", "cxl_mb"); the API checks
# that need numa_utils.devices() / local_devices() / nodes_per_package skip with
# 'needs numa_utils.devices' until the module has them.

PCI_DIR = "/sys/bus/pci/devices"


def _pci_addr(part):
    p = part.split(":")
    return len(p) == 3 and len(p[2]) == 4 and p[2][2] == "."


def raw_pci_function(addr):
    """One PCI function as vm/run.py's "pci" entries spell it, from sysfs."""
    d = f"{PCI_DIR}/{addr}"
    real = os.path.realpath(d)
    path = [p for p in real.split("/") if _pci_addr(p)]
    names = []
    for cls in ("net", "nvme", "infiniband"):
        base = f"/sys/class/{cls}"
        for name in sorted(os.listdir(base)) if os.path.isdir(base) else ():
            if os.path.realpath(f"{base}/{name}/device") == real:
                names.append(name)
    drv = f"{d}/driver"
    return {
        "class": _read(f"{d}/class"),
        "vendor": _read(f"{d}/vendor"),
        "device": _read(f"{d}/device"),
        "numa_node": int(_read(f"{d}/numa_node")),
        "local_cpulist": _cpulist(_read(f"{d}/local_cpulist")),
        "driver": os.path.basename(os.path.realpath(drv)) if os.path.exists(drv) else None,
        "names": names,
        "root_port": path[0] if len(path) > 1 else None,
    }


def check_raw_pci_locality(env):
    """Each PCI function QEMU put behind the expander on node 1 shows class, ids,
    numa_node 1, local_cpulist 1, its driver, its kernel names and its root port;
    the root ports themselves are on node 1 too."""
    env.need_real("reads this machine's sysfs")
    want = env.expect.get("pci")
    if not want:
        raise Skip("no PCI devices on a node in this topology")
    got = {addr: raw_pci_function(addr) for addr in want}
    for addr, w in want.items():
        assert got[addr] == w, f"{addr}: {got[addr]} != {w}"
        port = raw_pci_function(w["root_port"])
        assert (port["numa_node"], port["local_cpulist"]) == (w["numa_node"], w["local_cpulist"]), (
            port
        )
    return got


def check_raw_generic_initiator(env):
    """A node with neither CPUs nor memory standing for a device: listed in
    has_generic_initiator (5.10+), online, in neither has_cpu nor has_memory nor
    this process's Mems_allowed."""
    env.need_real("reads this machine's sysfs")
    gi = env.expect.get("generic_initiators")
    if gi is None:
        raise Skip("no generic-initiator node in this topology")
    base = "/sys/devices/system/node"
    assert _cpulist(_read(f"{base}/has_generic_initiator")) == gi
    status = dict(line.split(":", 1) for line in _read("/proc/self/status").splitlines())
    mems = _cpulist(status["Mems_allowed_list"].strip())
    for n in gi:
        assert n in _cpulist(_read(f"{base}/online")), n
        assert n not in _cpulist(_read(f"{base}/has_cpu")), n
        assert n not in _cpulist(_read(f"{base}/has_memory")), n
        assert n not in mems, (n, mems)
        assert _cpulist(_read(f"{base}/node{n}/cpulist")) == []
    return {"has_generic_initiator": gi, "mems_allowed": mems}


def _package_nodes(env):
    """{package: [nodes with CPUs in it]} from the QEMU definition."""
    out = {}
    for n, node in sorted(env.expect["nodes"].items(), key=lambda kv: int(kv[0])):
        for c in node["cpus"]:
            nodes = out.setdefault(env.expect["packages"][c], [])
            if int(n) not in nodes:
                nodes.append(int(n))
    return out


def check_raw_packages(env):
    """physical_package_id of every CPU is what -smp sockets= made; with several
    nodes per package (SNC/NPS) every distance inside a package is smaller than
    every distance between packages."""
    env.need_real("reads this machine's sysfs")
    packages = env.expect.get("packages")
    if packages is None:
        raise Skip("no package layout in this topology")
    got = [
        int(_read(f"/sys/devices/system/cpu/cpu{c}/topology/physical_package_id"))
        for c in range(env.expect["cpus"])
    ]
    assert got == packages, f"physical_package_id {got} != {packages}"
    per = _package_nodes(env)
    dist = {
        n: [int(x) for x in _read(f"/sys/devices/system/node/node{n}/distance").split()]
        for ns in per.values()
        for n in ns
    }
    inside = [dist[a][b] for ns in per.values() for a in ns for b in ns if a != b]
    across = [
        dist[a][b]
        for p, ns in per.items()
        for q, ms in per.items()
        if p != q
        for a in ns
        for b in ms
    ]
    if inside and across:
        assert max(inside) < min(across), (inside, across)
    want = env.expect.get("nodes_per_package")
    if want is not None:
        assert all(len(ns) == want for ns in per.values()), per
    return {
        "packages": got,
        "nodes_by_package": per,
        "inside": sorted(set(inside)),
        "across": sorted(set(across)),
    }


def check_raw_cxl_node(env):
    """The CXL Type-3 expander is a committed region whose memory kmem onlined as
    a CPU-less node; MPOL_BIND of a few MiB lands there (numa_maps, move_pages)."""
    env.need_real()
    mb = env.expect.get("cxl_mb")
    if not mb:
        raise Skip("no CXL memory in this topology")
    base = "/sys/devices/system/node"
    cxl = [n for n in env.expect["memory_only"]]
    assert len(cxl) == 1, cxl
    n = cxl[0]
    regions = [r for r in os.listdir("/sys/bus/cxl/devices") if r.startswith("region")]
    assert regions and _read(f"/sys/bus/cxl/devices/{regions[0]}/commit") == "1", regions
    assert n in _cpulist(_read(f"{base}/has_memory")) and n not in _cpulist(
        _read(f"{base}/has_cpu")
    ), n
    kb = int(_read(f"{base}/node{n}/meminfo").split("MemTotal:")[1].split()[0])
    assert 0.75 * mb * 1024 <= kb <= mb * 1024, f"node{n} MemTotal {kb} kB of {mb} MiB"
    page = mmap.PAGESIZE
    npages = (4 << 20) // page
    t0 = time.monotonic()
    with RawBuffer(npages) as buf:
        r, err = raw_mbind(buf.addr, buf.length, MPOL_BIND, [n])
        assert r == 0, os.strerror(err)
        buf.touch()
        counts = raw_counts(numa_maps_line(buf.addr))
        assert counts == {n: buf.length}, counts
        assert set(raw_move_pages_query(buf.addr, npages, page)) == {n}
    return {
        "node": n,
        "mem_total_kb": kb,
        "region": regions[0],
        "bind_4MiB": counts,
        "seconds": round(time.monotonic() - t0, 2),
    }


def check_pci_topology_api(env):
    """read_topology() and gpus() on the guest with devices on node 1: no QEMU
    device is a GPU (its vendor ids are not NVIDIA's, AMD's or Intel's display
    ones), and the CPUs and nodes are as QEMU made them."""
    gpus, read_topology = env.need("gpus", "read_topology")
    if not env.expect.get("pci"):
        raise Skip("no PCI devices on a node in this topology")
    found = gpus(backend=env.backend)
    assert not [g for g in found if g.pci in env.expect["pci"]], found
    topo = read_topology(backend=env.backend)
    packages = {c: topo.cpus[c].package for c in sorted(topo.cpus)}
    assert [packages[c] for c in sorted(packages)] == env.expect["packages"], packages
    return {"gpus": [g.pci for g in found], "packages": packages}


def check_generic_initiator_api(env):
    """Today's API on a generic-initiator node: read_topology() has it with no CPUs
    and no memory, default_memory_nodes() leaves it out, an explicit bind to it
    is refused with a reason (it has no memory)."""
    nu = env.nu
    read_topology, dmn = env.need("read_topology", "default_memory_nodes")
    gi = env.expect.get("generic_initiators")
    if not gi:
        raise Skip("no generic-initiator node in this topology")
    topo = read_topology(backend=env.backend)
    out = {}
    for n in gi:
        node = topo.nodes[n]
        assert not node.cpus and node.mem_total_kb == 0, node
        assert n not in topo.nodes_with_memory and n not in dmn(topo), n
        with _ApiBuffer(env, 2) as buf:
            res = nu.bind(buf.addr, [n], length=buf.length, backend=env.backend)
            assert not res and res.reason, f"bind to node {n} without memory: {res}"
        out[n] = {"kind": node.kind, "bind": res.reason}
    return out


def check_packages_api(env):
    """read_topology(): each CPU's package as -smp sockets= made it; with two nodes
    per package default_memory_nodes() keeps every DRAM node of every package."""
    read_topology, dmn = env.need("read_topology", "default_memory_nodes")
    packages = env.expect.get("packages")
    if packages is None:
        raise Skip("no package layout in this topology")
    topo = read_topology(backend=env.backend)
    got = [topo.cpus[c].package for c in sorted(topo.cpus)]
    assert got == packages, got
    dram = sorted(n for n in env.memory_nodes if env.expect["nodes"][str(n)]["cpus"])
    assert set(dram) <= set(dmn(topo)), (dram, dmn(topo))
    return {"packages": got, "default_memory_nodes": sorted(dmn(topo))}


def check_cxl_api(env):
    """numa_utils on the CXL node: CPU-less, in a slower tier than DRAM, not a
    default memory node; bind() of a fresh 4 MiB mapping to it puts every page
    there (placement() and numa_maps); weighted interleave over DRAM + CXL is
    check_weighted_interleave_api (4 MiB here)."""
    nu = env.nu
    read_topology, dmn = env.need("read_topology", "default_memory_nodes")
    env.need("bind", "placement")
    if not env.expect.get("cxl_mb"):
        raise Skip("no CXL memory in this topology")
    (n,) = env.expect["memory_only"]
    topo = read_topology(backend=env.backend)
    node = topo.nodes[n]
    assert not node.cpus and node.mem_total_kb > 0, node
    assert n not in dmn(topo), dmn(topo)
    dram_tier = topo.nodes[0].tier
    assert node.tier is not None and dram_tier is not None and node.tier > dram_tier, (
        node.tier,
        dram_tier,
    )
    npages = (4 << 20) // env.page_size if env.real else 16
    with _ApiBuffer(env, npages) as buf:
        res = nu.bind(buf.addr, [n], length=buf.length, backend=env.backend)
        assert res, f"bind to the CXL node: {res}"
        env.backend.touch(buf.addr, buf.length)
        placed = _placement(env, buf)
        counts = raw_counts(backend_numa_maps_line(env, buf.addr))
        assert counts == {n: buf.length}, counts
        assert placed is None or placed == {n: buf.length}, placed
    return {
        "node": n,
        "kind": node.kind,
        "tier": node.tier,
        "dram_tier": dram_tier,
        "default": sorted(dmn(topo)),
        "bind": counts,
    }


# -- the device API of issue 22: run once numa_utils has it ---------------------

_KIND_OF_CLASS = {0x03: "display", 0x02: "net", 0x0108: "nvme"}


def _need_devices(env):
    if env.nu is None or not hasattr(env.nu, "devices"):
        raise Skip("needs numa_utils.devices")


def _int(v):
    return int(v, 16) if isinstance(v, str) else int(v)


def _want_kind(w):
    cls = int(w["class"], 16)
    return _KIND_OF_CLASS.get(cls >> 8, _KIND_OF_CLASS.get(cls >> 16, "other"))


def check_devices_api(env):
    """devices(): each function QEMU put on node 1 with its kind, ids, node 1 and
    node 1's CPUs, its kernel names and a path through its root port; devices('gpu')
    agrees with gpus()."""
    _need_devices(env)
    nu = env.nu
    want = env.expect.get("pci")
    if not want:
        raise Skip("no PCI devices on a node in this topology")
    found = {d.address: d for d in nu.devices(backend=env.backend)}
    out = {}
    for addr, w in want.items():
        assert addr in found, f"{addr} not in devices(): {sorted(found)}"
        d = found[addr]
        assert d.kind == _want_kind(w), (addr, d.kind)
        assert (_int(d.vendor), _int(d.device), _int(d.pci_class)) == (
            int(w["vendor"], 16),
            int(w["device"], 16),
            int(w["class"], 16),
        ), d
        assert d.node == w["numa_node"] and d.node_source, d
        assert sorted(d.cpus) == w["local_cpulist"], d
        assert sorted(d.names) == sorted(w["names"]), d
        assert w["root_port"] in str(d.path) and addr in str(d.path), d.path
        assert [
            x.address for x in nu.devices(d.kind, backend=env.backend) if x.address == addr
        ] == [addr], d.kind
        out[addr] = {"kind": d.kind, "node": d.node, "names": list(d.names)}
    gpus = sorted(g.pci for g in nu.gpus(backend=env.backend))
    assert sorted(d.address for d in nu.devices("gpu", backend=env.backend)) == gpus
    return out


def _nic(env):
    return next(a for a, w in env.expect["pci"].items() if _want_kind(w) == "net")


def check_local_devices_api(env):
    """local_devices(): the NIC on node 1 is 'local' to node 1 and 'remote' to node 0
    (another package), and a buffer bound to node 1 gives the NIC first."""
    _need_devices(env)
    nu = env.nu
    if not env.expect.get("pci"):
        raise Skip("no PCI devices on a node in this topology")
    nic = _nic(env)
    far = [
        n
        for n in env.expected_nodes
        if env.expect["nodes"][str(n)]["cpus"] and n != env.expect["pci"][nic]["numa_node"]
    ][0]
    near = env.expect["pci"][nic]["numa_node"]
    got = {}
    for where, rel in ((near, "local"), (far, "remote")):
        ranked = nu.local_devices(where, "net", backend=env.backend)
        assert ranked and ranked[0][0].address == nic and ranked[0][1] == rel, ranked
        got[where] = [(d.address, r) for d, r in ranked]
    with _ApiBuffer(env, 4) as buf:
        res = nu.bind(buf.addr, [near], length=buf.length, backend=env.backend)
        assert res, res
        env.backend.touch(buf.addr, buf.length)
        ranked = nu.local_devices(buf.mm, "net", backend=env.backend)
        assert ranked and ranked[0][0].address == nic and ranked[0][1] == "local", ranked
        got["buffer"] = [(d.address, r) for d, r in ranked]
    return got


def check_generic_initiator_kind(env):
    """A generic-initiator node has Node.kind 'generic-initiator' and is never a
    default memory node."""
    _need_devices(env)
    gi = env.expect.get("generic_initiators")
    if not gi:
        raise Skip("no generic-initiator node in this topology")
    topo = env.nu.read_topology(backend=env.backend)
    for n in gi:
        assert topo.nodes[n].kind == "generic-initiator", topo.nodes[n]
        assert n not in env.nu.default_memory_nodes(topo)
    return {n: topo.nodes[n].kind_evidence for n in gi}


def check_nodes_per_package_api(env):
    """Topology.nodes_per_package and the JSON key nodes_per_package name the
    layout: 2 on the SNC2/NPS2 guest."""
    _need_devices(env)
    want = env.expect.get("nodes_per_package")
    if want is None:
        raise Skip("this topology does not fix nodes per package")
    topo = env.nu.read_topology(backend=env.backend)
    assert topo.nodes_per_package == want, topo.nodes_per_package
    assert env.nu.to_json(topo)["nodes_per_package"] == want
    return {"nodes_per_package": want}


# -- fit(): its verdicts against what the kernel then does -------------------------

_CG = "/sys/fs/cgroup"
_HP = "/sys/devices/system/node/node{}/hugepages/hugepages-2048kB/nr_hugepages"


def _write(path, text):
    with open(path, "w") as fh:
        fh.write(str(text))


def _shm_names():
    """The SysV segments (shmid) and /dev/shm files there are now."""
    lines = (_read("/proc/sysvipc/shm") or "").splitlines()[1:]
    return {int(ln.split()[1]) for ln in lines if ln.split()}, set(os.listdir("/dev/shm"))


def _remove_new(before):
    """Remove what a killed child left behind (it had no chance to clean up)."""
    ids, files = _shm_names()
    for shmid in ids - before[0]:
        libc().shmctl(shmid, 0, None)  # IPC_RMID
    for name in files - before[1]:
        os.unlink(f"/dev/shm/{name}")


def _fit_and_create(env, cgroup, size, **kw):
    """In a forked child (inside ``cgroup`` when given): fit()'s verdict, then
    SharedRegion.create + prefault with its up-front checks bypassed.  Returns
    (verdict dict, real outcome: "ok" or what stopped it, a signal included)."""
    nu, nur = env.nu, env.nur
    rfd, wfd = os.pipe()
    before = _shm_names()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        code = 0
        try:
            if cgroup:
                _write(f"{cgroup}/cgroup.procs", os.getpid())
            r = nur.fit(size, backend=env.backend, **kw)
            os.write(
                wfd,
                (
                    json.dumps(
                        {
                            "ok": bool(r),
                            "exact": r.exact,
                            "reason": r.reason,
                            "needed": {f.node: f.needed for f in r.nodes if f.needed},
                        }
                    )
                    + "\n"
                ).encode(),
            )
            huge = kw.get("hugepages", False)
            nur._fit_or_raise = lambda *a: (huge, None)
            # create's own "no huge pages on that node" refusal too (asked about node
            # 0, where the check reserves them): the kernel decides.
            page = nur._region_page
            nur._region_page = lambda h, k, b, n: page(h, k, b, frozenset([0]))
            key = f"numa_utils_check_{os.getpid()}_fit"
            region = nur.SharedRegion.create(key, size, prefault=True, backend=env.backend, **kw)
            # All that create maps, the record's room too: what fit() weighs.
            mapped = nu.placement(region.address, region._mapped, backend=env.backend)
            placed = {n: v for n, v in mapped.items() if v}
            region.close()
            region.destroy()
            os.write(wfd, (json.dumps({"placed": placed}) + "\n").encode())
        except BaseException as e:  # noqa: BLE001 - the outcome, for the parent
            os.write(wfd, (json.dumps(f"{type(e).__name__}: {e}") + "\n").encode())
            code = 1
        os._exit(code)
    os.close(wfd)
    data = _read_all(rfd)
    _, status = os.waitpid(pid, 0)
    _remove_new(before)
    lines = [json.loads(x) for x in data.decode().splitlines() if x]
    if not lines:
        raise AssertionError(f"fit child died before fit() answered (status {status})")
    if not isinstance(lines[0], dict):
        raise AssertionError(f"fit() raised: {lines[0]}")
    real = lines[1] if len(lines) > 1 else None
    if isinstance(real, dict):
        real = {int(k): v for k, v in real["placed"].items()}
    if os.WIFSIGNALED(status):
        real = f"killed by signal {os.WTERMSIG(status)}"
    return lines[0], real or f"child exited {status} without an outcome"


def _near(placed, want, page):
    """The same nodes, each within a page of its share: the kernel starts a shared
    region's interleave where its offset says, so which nodes hold the remainder's
    extra page is its choice, not fit()'s."""
    return set(placed) == set(want) and all(abs(placed[n] - want[n]) <= page for n in want)


def _fit_case(env, out, name, cgroup, size, **kw):
    """One case: fit() says yes exactly when the region is made and prefaulted (and,
    for huge pages, which fit() requires where the policy asks, they are there)."""
    kw.setdefault("policy", "interleave")  # fit()'s default, not create()'s
    verdict, real = _fit_and_create(env, cgroup, size, **kw)
    out[name] = {"fit": verdict["ok"], "reason": verdict["reason"], "real": real}
    ok = isinstance(real, dict)
    if ok and kw.get("hugepages"):
        # fit() gives each node its share under interleave; under bind, none (any
        # bound node will do).
        want = {int(k): v for k, v in verdict["needed"].items()}
        ok = _near(real, want, 2 << 20) if want else set(real) <= set(kw.get("nodes") or real)
    elif ok and verdict["exact"] and verdict["needed"]:
        want = {int(k): v for k, v in verdict["needed"].items()}
        assert _near(real, want, env.page_size), f"{name}: fit() expects {want}, placed {real}"
    assert verdict["ok"] == ok, (
        f"{name}: fit() says {verdict['ok']} ({verdict['reason']}, needed "
        f"{verdict['needed']}), the kernel: {real}"
    )


def _cgroup_child(controllers):
    """A cgroup v2 child of the root with these controllers; (path, mounted by us)."""
    mounted = False
    if not os.path.exists(f"{_CG}/cgroup.controllers"):
        subprocess.run(["mount", "-t", "cgroup2", "none", _CG], check=True)
        mounted = True
    have = (_read(f"{_CG}/cgroup.controllers") or "").split()
    use = [c for c in controllers if c in have]
    if use:
        _write(f"{_CG}/cgroup.subtree_control", " ".join("+" + c for c in use))
    cg = f"{_CG}/numa_utils_fit_{os.getpid()}"
    os.mkdir(cg)
    return cg, mounted, use


def check_fit_real(env):
    """fit()'s verdict against the real SharedRegion.create + prefault (its own
    check bypassed, in a child so a SIGBUS or an OOM kill ends only the child): a
    region that fits, one over a cgroup's memory.max, 2 MiB huge pages reserved on
    node 0 only (asked on node 0, then on the node without), one over the cgroup's
    hugetlb.2MB.max, and POSIX regions against a 64 MiB /dev/shm."""
    env.need_real("fit() against the kernel's own allocation")
    env.need_numa()
    env.need("fit", "SharedRegion", "_fit_or_raise", "_region_page")
    if os.geteuid() != 0:
        raise Skip("needs root: cgroups, nr_hugepages, remounting /dev/shm")
    nodes = env.default_nodes
    if len(nodes) < 2 or nodes[0] != 0:
        raise Skip(f"needs two memory nodes from node 0 ({nodes})")
    MiB = 1 << 20
    out = {}
    _fit_case(env, out, "fits", None, 8 * MiB)
    for n in sorted(set(env.memory_nodes) - set(nodes))[:1]:
        # A node nodes=None leaves out (CXL: about 55x slower, so 4 MiB at most).
        _fit_case(env, out, f"node{n}-fits", None, 4 * MiB, nodes=[n])
    cg, mounted, ctrls = _cgroup_child(["memory", "hugetlb"])
    hp = [_HP.format(n) for n in nodes]
    saved_hp = [_read(p) for p in hp] if all(os.path.exists(p) for p in hp) else None
    shm_opts = None
    try:
        if "memory" in ctrls:
            _write(f"{cg}/memory.max", 24 * MiB)
            _fit_case(env, out, "memory.max-fits", cg, 8 * MiB)
            _fit_case(env, out, "memory.max-over", cg, 48 * MiB)
        else:
            out["memory.max"] = "skipped: no memory controller"
        if saved_hp is None:
            out["hugetlb"] = "skipped: no 2 MiB huge pages"
        else:
            _write(hp[0], 16)  # 32 MiB on node 0 only
            for p in hp[1:]:
                _write(p, 0)
            assert int(_read(hp[0]) or 0) == 16, "node 0 would not reserve 16 huge pages"
            for pol in ("interleave", "bind"):
                # interleave spills to node 0 (no nodemask for hugetlb), bind fails.
                for n in nodes[:2]:  # the node with them, one without
                    _fit_case(
                        env,
                        out,
                        f"hugetlb-{pol}-node{n}",
                        None,
                        8 * MiB,
                        nodes=[n],
                        policy=pol,
                        hugepages="2M",
                    )
            if "hugetlb" in ctrls:
                _write(f"{cg}/hugetlb.2MB.max", 8 * MiB)
                _fit_case(env, out, "hugetlb.2MB.max-fits", cg, 4 * MiB, nodes=[0], hugepages="2M")
                _fit_case(env, out, "hugetlb.2MB.max-over", cg, 16 * MiB, nodes=[0], hugepages="2M")
            else:
                out["hugetlb.2MB.max"] = (
                    f"skipped: no hugetlb controller in {_CG}/cgroup.controllers"
                )
        shm_opts = next(
            ln.split()[3]
            for ln in (_read("/proc/mounts") or "").splitlines()
            if ln.split()[1:3] == ["/dev/shm", "tmpfs"]
        )
        subprocess.run(["mount", "-o", "remount,size=64M", "/dev/shm"], check=True)
        _fit_case(env, out, "posix-fits", None, 32 * MiB, kind="posix")
        _fit_case(env, out, "posix-over", None, 96 * MiB, kind="posix")
    finally:
        if shm_opts is not None:
            size = [o for o in shm_opts.split(",") if o.startswith("size=")]
            subprocess.run(
                ["mount", "-o", "remount," + (size[0] if size else "size=50%"), "/dev/shm"],
                check=False,
            )
        if saved_hp is not None:
            for p, v in zip(hp, saved_hp):
                _write(p, v or 0)
        os.rmdir(cg)
        if mounted:
            subprocess.run(["umount", _CG], check=False)
    verdicts = [v["fit"] for v in out.values() if isinstance(v, dict)]
    assert True in verdicts and False in verdicts, f"no case of each verdict: {out}"
    return out


# --------------------------------------------------------------------------
# Launching bound (issue 41): can_bind, bound_start, spawn_context


def _status_cpus(pid):
    """The Cpus_allowed_list a process runs with, from /proc/<pid>/status."""
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return _cpulist(line.split(":", 1)[1])
    raise AssertionError(f"/proc/{pid}/status has no Cpus_allowed_list")


def _sleeper_cpus(how, nu, kw):
    """Start a child that sleeps (os.fork, subprocess.Popen, or a spawn_context
    Process), read its CPUs from /proc/<pid>/status, stop it."""
    if how == "fork":
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        try:
            return _status_cpus(pid)
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    if how == "popen":
        child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(600)"])
        try:
            return _status_cpus(child.pid)
        finally:
            child.kill()
            child.wait()
    ctx = nu.spawn_context(method="fork", **kw)
    proc = ctx.Process(target=time.sleep, args=(600,))
    proc.start()
    try:
        return _status_cpus(proc.pid), [tuple(r[:3]) for r in ctx.starts]
    finally:
        proc.kill()
        proc.join()


def _launch(env, node, want):
    """bound_start(nodes=[node]) with the ladder bind -> cpu: what it recorded, where
    its children ran (a real kernel), and whether the strict ladder (bind alone)
    refused in the parent.  ``want``: the reason bind must fail with (None: it works)."""
    nu = env.nu
    kw = {"nodes": [node], "fallback": ("bind", "cpu"), "backend": env.backend}
    applied = "cpu" if want else "bind"
    out = {}
    with nu.bound_start(**kw) as starter:
        planned = sorted(starter.plan.cpus)
        if env.real:
            out["fork"] = _sleeper_cpus("fork", nu, kw)
            out["popen"] = _sleeper_cpus("popen", nu, kw)
        else:
            out["inside"] = sorted(env.backend.call("sched_getaffinity", 0))
    if env.real:
        out["context"], context_starts = _sleeper_cpus("context", nu, kw)
        assert context_starts == [("bind", applied, want)], context_starts
    for how in ("fork", "popen", "context", "inside"):
        assert out.get(how, planned) == planned, f"{how} child on {out[how]}, planned {planned}"
    starts = [tuple(r[:3]) for r in starter.starts]
    assert starts == [("bind", applied, want)], starts
    ran = []
    try:
        with nu.bound_start(**dict(kw, fallback=("bind",))):
            ran.append("the start")
        strict = "started"
    except OSError as err:
        strict = errno.errorcode.get(err.errno, err.errno)
    assert (strict == "started") == (want is None) and ran == ["the start"] * (want is None)
    return dict(out, planned=planned, starts=starts, strict=strict)


def _bind_check(env, node, want):
    check = env.nu.can_bind(node, backend=env.backend)
    assert check.cpu, check
    assert check.bind == check.preferred == (want is None), check
    if want is not None:
        assert check.reason == want and check.hint, check
    else:
        assert check.reason in (None, "single-node"), check
    return check._asdict()


def check_launch(env):
    """can_bind says what binding to a node can do here, and why not; children started
    inside bound_start (os.fork, Popen) and by a spawn_context run on the planned CPUs
    (/proc/<pid>/status); each start records the rung it got and why; a strict ladder
    fails in the parent, before any child.  Also with the policy syscalls denied
    (seccomp on a real kernel, SimulatedBackend.fail in the simulator), and in the
    cpuset guest, whose cgroup has no memory on node 1."""
    env.need("can_bind", "bound_start", "spawn_context")
    nodes = env.expect["nodes"]
    affinity = set(env.backend.call("sched_getaffinity", 0))
    placed = [n for n in env.expected_nodes if set(nodes[str(n)]["cpus"]) & affinity]
    node = ([n for n in placed if nodes[str(n)]["mem_mb"]] or placed)[-1]
    allowed = env.expect.get("allowed_mems")
    want = None
    if not env.numa:
        want = "ENOSYS"
    elif allowed is not None and node not in allowed:
        want = "cpuset"
    out = {"node": node, "can_bind": _bind_check(env, node, want)}
    out["launch"] = _launch(env, node, want)
    if not env.numa:
        return out
    denied = want or "EPERM"  # the cpuset is seen before any syscall
    if env.real:
        arch = platform.machine()

        def child():
            _seccomp_deny(arch, RAW_SYSCALLS[arch])
            return {
                "can_bind": _bind_check(env, node, denied),
                "launch": _launch(env, node, denied),
            }

        out["seccomp"] = in_child(child, timeout=300)
        return out
    backend = env.backend
    env.backend = backend.process()  # another process: can_bind caches per process
    backend.fail("*", errno.EPERM)
    try:
        out["denied"] = {
            "can_bind": _bind_check(env, node, denied),
            "launch": _launch(env, node, denied),
        }
    finally:
        backend.clear_failures()
        env.backend = backend
    return out


# --------------------------------------------------------------------------
# PinnedPool (issue 42): placed on the node asked, before it is pinned.

IO_URING_SETUP, IO_URING_REGISTER = 425, 427  # one number on every arch (Linux 5.1+)
IORING_REGISTER_BUFFERS = 0


def check_pool_cross_node(env):
    """A thread whose CPUs are all on the first node allocates a PinnedPool block
    for the last memory node: every page is there (first touch would put them on
    the thread's node)."""
    nu, nur = env.nu, env.nur
    env.need("PinnedPool", "placement")
    env.need_numa()
    nodes = env.memory_nodes
    first, last = nodes[0], nodes[-1]
    cpus = env.expect["nodes"][str(first)]["cpus"]
    if len(nodes) < 2 or not cpus:
        raise Skip("needs two memory nodes, the first with CPUs")
    backend = env.backend
    before = backend.call("sched_getaffinity", 0)
    backend.call("sched_setaffinity", 0, cpus)
    try:
        pool = nur.PinnedPool([first, last], register=None, backend=backend)
        page = backend.page_size
        blk = pool.alloc(64 * page + 1, node=last)
        got = nu.placement(blk.address, blk.size, backend=backend)
        by_pool = pool.placement()[last]
        pool.close()
    finally:
        backend.call("sched_setaffinity", 0, before)
    assert blk.node == last and blk.size == 65 * page, blk
    assert got == {last: 65 * page}, got
    assert by_pool == {last: 65 * page}, by_pool
    return {"thread_on": first, "asked": last, "placement": got}


def _raw_move_pages_to(addr, npages, page, node):
    """move_pages(MPOL_MF_MOVE) of each page to ``node``: its return value."""
    pages = (ctypes.c_void_p * npages)(*[addr + i * page for i in range(npages)])
    nodes = (ctypes.c_int * npages)(*([node] * npages))
    status = (ctypes.c_int * npages)()
    r, err = raw_syscall(
        raw_nr("move_pages"),
        0,
        npages,
        ctypes.addressof(pages),
        ctypes.addressof(nodes),
        ctypes.addressof(status),
        MPOL_MF_MOVE,
    )
    if r < 0:
        raise OSError(err, f"move_pages: {os.strerror(err)}")
    return r


def check_raw_pinned_cannot_move(env):
    """A long-term pin (io_uring registered buffers pin as cudaHostRegister does,
    FOLL_LONGTERM) keeps move_pages from moving a page; the unpinned buffer beside
    it moves.  So a pinned pool must be placed before it is pinned."""
    env.need_real()
    env.need_numa()
    nodes = env.memory_nodes
    if len(nodes) < 2:
        raise Skip("needs two memory nodes")
    src, dst = nodes[0], nodes[-1]
    params = (ctypes.c_uint32 * 30)()  # struct io_uring_params: 120 bytes
    fd, err = raw_syscall(IO_URING_SETUP, 4, ctypes.addressof(params))
    if fd < 0:
        raise Skip(f"no io_uring in this kernel: io_uring_setup: {errno.errorcode.get(err)}")
    pinned, loose = RawBuffer(8), RawBuffer(8)
    try:
        for buf in (pinned, loose):
            r, err = raw_mbind(buf.addr, buf.length, MPOL_BIND, [src])
            assert r == 0, f"mbind: {os.strerror(err)}"
            buf.touch()
        iov = (ctypes.c_uint64 * 2)(pinned.addr, pinned.length)  # struct iovec
        r, err = raw_syscall(
            IO_URING_REGISTER, fd, IORING_REGISTER_BUFFERS, ctypes.addressof(iov), 1
        )
        assert r == 0, f"IORING_REGISTER_BUFFERS: {os.strerror(err)}"
        unmoved = {}
        after = {}
        for name, buf in (("pinned", pinned), ("loose", loose)):
            unmoved[name] = _raw_move_pages_to(buf.addr, buf.npages, buf.page, dst)
            after[name] = raw_move_pages_query(buf.addr, buf.npages, buf.page)
    finally:
        os.close(fd)  # unregisters the buffers
        pinned.close()
        loose.close()
    assert after["loose"] == [dst] * 8, after
    assert after["pinned"] == [src] * 8, after
    return {"from": src, "to": dst, "not_moved": unmoved, "nodes_after": after}
