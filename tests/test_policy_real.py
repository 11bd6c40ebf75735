"""The real kernel of this machine (one node is enough): the syscalls work, policies
read back, and a seccomp-denied call falls back with reason EPERM."""

import errno
import mmap

import kernel_checks as kc
import pytest
from conftest import live_kernel_has_policy_syscalls, nu, saved_backend

pytestmark = [
    pytest.mark.realkernel,
    pytest.mark.skipif(
        not live_kernel_has_policy_syscalls(), reason="this kernel or sandbox refuses get_mempolicy"
    ),
]

MiB = 1 << 20


@pytest.fixture
def buf():
    m = mmap.mmap(-1, 4 * MiB)
    yield m
    m.close()


def node0():
    t = nu.read_topology()
    return min(t.usable_memory_nodes)


def test_interleave_over_one_node_applies_and_reads_back(buf):
    n = node0()
    res = nu.interleave(buf, nodes=[n])
    assert res and res.nodes == {n} and res.length == 4 * MiB
    info = nu.get_policy(buf)
    assert info.mode == nu.Mode.INTERLEAVE and info.nodes == {n}
    assert str(info) == f"interleave:{n}"
    buf[:] = b"\1" * len(buf)  # first touch, under the policy
    assert nu.node_of(buf) == n


def test_bind_prefer_local_read_back(buf):
    n = node0()
    page = mmap.PAGESIZE
    assert nu.bind(nu.buffer_range(buf)[0], [n], length=page)
    assert nu.prefer(nu.buffer_range(buf)[0] + page, n, length=page)
    assert nu.set_local(nu.buffer_range(buf)[0] + 2 * page, length=page)
    a = nu.buffer_range(buf)[0]
    assert nu.get_policy(a).mode == nu.Mode.BIND
    assert nu.get_policy(a + page).mode == nu.Mode.PREFERRED
    assert nu.get_policy(a + 2 * page).mode == nu.Mode.LOCAL
    assert nu.get_policy(a + 3 * page).mode == nu.Mode.DEFAULT


def test_thread_policy_real():
    n = node0()
    before = nu.get_policy()
    with nu.thread_policy("bind", [n]) as res:
        assert res
        assert nu.get_policy().mode == nu.Mode.BIND
    assert nu.get_policy() == before


def test_mems_allowed_and_move_pages(buf):
    _, allowed = nu.get_mempolicy(flags=nu.GetFlag.MEMS_ALLOWED)
    t = nu.read_topology()
    assert allowed == t.allowed_mems
    buf[0:1] = b"x"
    a = nu.buffer_range(buf)[0]
    try:
        st = nu.move_pages(0, [a, a + mmap.PAGESIZE])
    except PermissionError:
        pytest.skip("move_pages denied here")
    assert st[0] in t.nodes_with_memory and st[1] == -errno.ENOENT


_SECCOMP_CHILD = r"""
import errno, json, mmap, platform, sys
import kernel_checks as kc
import numa_utils as nu
node = min(nu.read_topology().usable_memory_nodes)
numbers = [nu.SYSCALL_TABLES[nu.abi_for().name][name] for name in
           ("mbind", "set_mempolicy", "get_mempolicy", "move_pages")]
kc._seccomp_deny(platform.machine(), numbers)
m = mmap.mmap(-1, 1 << 20)
res = nu.interleave(m, nodes=[node])
thread = nu.set_thread_policy("bind", [node])
m.write(b"y" * (1 << 20))                      # still usable
try:
    nu.interleave(m, nodes=[node], strict=True)
    raised = None
except PermissionError as e:
    raised = e.errno
print(json.dumps({"reason": res.reason, "errno": res.errno, "hint": res.hint,
                  "thread": thread.reason, "usable": m[:1] == b"y", "strict": raised}))
"""


def test_seccomp_eperm_falls_back():
    """What Docker's default profile does without CAP_SYS_NICE, for real: in a fresh
    process (forking a multi-threaded test process could deadlock the child)."""
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO

    arch = nu.abi_for().name
    if arch not in kc.AUDIT_ARCH:
        pytest.skip(f"no AUDIT_ARCH for {arch}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    p = subprocess.run(
        [sys.executable, "-c", _SECCOMP_CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=str(REPO),
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["reason"] == "EPERM" and got["errno"] == errno.EPERM
    assert "CAP_SYS_NICE" in got["hint"]
    assert got["thread"] == "EPERM" and got["usable"]
    assert got["strict"] == errno.EPERM


def test_saved_tree_refuses_real_syscalls(buf):
    from conftest import fixture_root

    b = saved_backend(fixture_root("dual-socket-8gpu"))
    res = nu.interleave(buf, backend=b)
    assert not res and res.reason == "not-live"
    with pytest.raises(nu.NotLiveError):
        nu.mbind(nu.buffer_range(buf)[0], MiB, nu.Mode.BIND, [0], backend=b)


def test_mincore_counts_what_is_resident(buf):
    """The live backend's mincore: the pages written, none of a range of no length
    (which made a vector of no room and a zero step: ValueError from range())."""
    import ctypes

    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    b = nu.LinuxBackend()
    buf[: 3 * mmap.PAGESIZE] = b"x" * (3 * mmap.PAGESIZE)
    assert b.call("mincore", addr, 4 * MiB) == 3
    assert b.call("mincore", addr, 0) == 0
