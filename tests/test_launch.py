"""Launching an engine's process tree where it belongs (issue 41): can_bind says what
works before anything starts, bound_start and spawn_context bind every start with a
fallback ladder and a record per start, process_tree_plan plans DP groups of TP workers
with an engine core above each, and `plan --tree` prints it."""

import errno
import os
import subprocess
import threading

import pytest
from conftest import fixture_root, hook_call, nu, saved_backend, sim

_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("NUMA_UTILS_") or name in _ENV_NAMES:
            monkeypatch.delenv(name)


def _node_cpus(b, node):
    return nu.read_topology(backend=b).nodes[node].cpus


# -- 1. can_bind: know before starting ------------------------------------------------


def test_can_bind_says_everything_works_on_a_plain_two_node_machine():
    b = sim("dual-socket-8gpu")
    got = nu.can_bind(1, backend=b)
    assert (got.cpu, got.bind, got.preferred, got.interleave) == (True, True, True, True)
    assert got and got.reason is None and got.hint is None


def test_can_bind_names_a_seccomp_denial_and_its_fix():
    b = sim("dual-socket-8gpu")
    b.fail("*", errno.EPERM)  # Docker's default profile without CAP_SYS_NICE
    got = nu.can_bind(1, backend=b)
    assert got.cpu and not (got.bind or got.preferred or got.interleave)
    assert not got and got.reason == "EPERM"
    assert "CAP_SYS_NICE" in got.hint and "seccomp" in got.hint


def test_can_bind_names_a_cpuset_without_the_node():
    b = sim("dual-socket-8gpu", mems_allowed=[0])
    got = nu.can_bind(1, backend=b)
    assert got.cpu and not got.bind and not got.preferred and got.reason == "cpuset"
    assert "cpuset" in got.hint
    assert nu.can_bind(0, backend=b).bind
    node0 = _node_cpus(b, 0)
    b = sim("dual-socket-8gpu", cpus_allowed=node0)
    got = nu.can_bind(1, backend=b)
    assert not got.cpu and got.bind and got.reason == "cpuset"


def test_can_bind_names_a_kernel_without_numa():
    got = nu.can_bind(0, backend=sim("qemu-s390x-no-numa", arch="s390x"))
    assert got.cpu and not got.bind and got.reason == "ENOSYS"
    assert "CONFIG_NUMA" in got.hint


def test_can_bind_on_one_node_has_nothing_to_interleave():
    got = nu.can_bind(0, backend=sim("single-node"))
    assert got.cpu and got.bind and got.preferred and not got.interleave
    assert got.reason == "single-node"


def test_can_bind_never_raises():
    b = sim("dual-socket-8gpu")
    for bad in (99, -1, "1", None, [1], True):
        got = nu.can_bind(bad, backend=b)
        assert not got and not got.cpu and not got.bind and got.reason == "no-node", bad
        assert got.hint
    got = nu.can_bind(0, backend=sim("memoryless-cpu-node"))  # CPUs, no memory
    assert got.cpu and not got.bind and got.reason == "no-memory-node"
    got = nu.can_bind(2, backend=sim("gh200"))  # GPU memory: no CPUs
    assert not got.cpu and got.reason == "no-cpus"
    got = nu.can_bind(0, backend=saved_backend(fixture_root("dual-socket-8gpu")))
    assert not got.cpu and not got.bind and got.reason == "not-live"


def test_can_bind_leaves_the_caller_alone_and_is_cached():
    b = sim("dual-socket-8gpu")
    b.call("sched_setaffinity", 0, {3})
    threads = set()
    original = hook_call(
        b, "syscall", lambda *args: threads.add(threading.get_ident()) or original(*args)
    )
    first = nu.can_bind(1, backend=b)
    assert first.bind and threads and threading.get_ident() not in threads  # another thread
    assert b.call("sched_getaffinity", 0) == {3}
    assert nu.get_policy(backend=b).mode == nu.Mode.DEFAULT
    threads.clear()
    assert nu.can_bind(1, backend=b) is first and not threads  # cached: no syscall
    assert nu.can_bind(0, backend=b) is not first and threads  # per node


def test_can_bind_starts_no_process(monkeypatch):
    def refuse(*args, **kw):
        raise AssertionError("can_bind started a process")

    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    assert nu.can_bind(1, backend=sim("dual-socket-8gpu"))


# -- 2. bound_start: bind any start, with a ladder and a record per start ---------------


def _inside(b):
    """The calling thread's CPUs and memory policy, as a start would pass them on."""
    pol = nu.get_policy(backend=b)
    return b.call("sched_getaffinity", 0), pol.mode, pol.nodes


def test_bound_start_binds_the_block_and_puts_everything_back():
    b = sim("dual-socket-8gpu")
    before = b.call("sched_getaffinity", 0)
    with nu.bound_start(node=1, fallback=("bind", "cpu", "none"), backend=b) as s:
        seen = _inside(b)
    assert seen == (_node_cpus(b, 1), nu.Mode.BIND, {1})
    assert s.plan.cpus == _node_cpus(b, 1) and s.plan.memory_nodes == (1,)
    assert [tuple(r[:3]) for r in s.starts] == [("bind", "bind", None)]
    assert b.call("sched_getaffinity", 0) == before
    assert nu.get_policy(backend=b).mode == nu.Mode.DEFAULT


def test_bound_start_falls_back_down_the_ladder_and_says_why():
    b = sim("dual-socket-8gpu")
    b.fail("*", errno.EPERM)
    with nu.bound_start(node=1, fallback=("bind", "preferred", "cpu", "none"), backend=b) as s:
        assert b.call("sched_getaffinity", 0) == _node_cpus(b, 1)
    (rec,) = s.starts
    assert (rec.asked, rec.applied, rec.reason) == ("bind", "cpu", "EPERM")
    assert "CAP_SYS_NICE" in rec.hint
    # no CPU binding either (a hypervisor's sched_setaffinity refusal): "none"
    hook_call(b, "sched_setaffinity", lambda *a: (_ for _ in ()).throw(PermissionError(1, "no")))
    with nu.bound_start(node=1, fallback=("bind", "cpu", "none"), backend=b) as s:
        pass
    assert (s.starts[0].applied, s.starts[0].reason) == ("none", "EPERM")


def test_bound_start_strict_fails_in_the_parent_before_the_child():
    b = sim("dual-socket-8gpu")
    b.fail("*", errno.EPERM)
    before = b.call("sched_getaffinity", 0)
    ran = []
    for kw in ({"strict": True}, {"fallback": ("bind", "preferred")}):
        kw.setdefault("fallback", ("bind", "cpu", "none"))
        with pytest.raises(OSError) as err:
            with nu.bound_start(node=1, backend=b, **kw):
                ran.append(kw)  # the start never runs
        assert err.value.errno == errno.EPERM and "bind" in str(err.value)
    assert not ran and b.call("sched_getaffinity", 0) == before
    b = sim("dual-socket-8gpu", mems_allowed=[0])  # a cpuset without node 1
    with pytest.raises(OSError, match="cpuset") as err:
        with nu.bound_start(node=1, fallback=("bind",), backend=b):
            ran.append("cpuset")
    assert err.value.errno == errno.EINVAL and not ran
    with nu.bound_start(node=1, fallback=("bind", "cpu"), backend=b) as s:
        pass
    assert (s.starts[0].applied, s.starts[0].reason) == ("cpu", "cpuset")


def test_bound_start_takes_a_node_set_explicit_cpus_or_a_gpu_plan():
    b = sim("dual-socket-8gpu")
    both = _node_cpus(b, 0) | _node_cpus(b, 1)
    with nu.bound_start(nodes=[0, 1], backend=b) as s:  # preferred over two: many
        assert _inside(b) == (both, nu.Mode.PREFERRED_MANY, {0, 1})
    assert s.plan.cpus == both and s.plan.memory_nodes == (0, 1)
    with nu.bound_start(cpus={50, 51, 144}, fallback=("bind",), backend=b) as s:
        assert _inside(b) == ({50, 51, 144}, nu.Mode.BIND, {1})
    for policy in nu.BIND_POLICIES:
        want = nu.cpus_for_gpu(5, policy, environ={}, backend=b)
        with nu.bound_start(5, policy=policy, environ={}, backend=b) as s:
            assert b.call("sched_getaffinity", 0) == want, policy
        assert s.plan.cpus == want and s.plan.policy == policy and s.plan.gpu == 5
    assert nu.bound_start(nodes=[1], backend=b).plan.cpus == _node_cpus(b, 1)


def test_bound_start_records_every_entry():
    b = sim("dual-socket-8gpu")
    starter = nu.bound_start(node=0, backend=b)
    for _ in range(3):
        with starter:
            pass
    assert [(r.asked, r.applied) for r in starter.starts] == [("preferred", "preferred")] * 3


def test_bound_start_rejects_bad_input():
    b = sim("dual-socket-8gpu")
    for kw in ({}, {"node": 0, "nodes": [0]}, {"node": 0, "cpus": [0]}):
        with pytest.raises(ValueError, match="one of a CUDA device index"):
            nu.bound_start(backend=b, **kw)
    for ladder in ((), "bind"):
        with pytest.raises(ValueError, match="fallback"):
            nu.bound_start(node=0, fallback=ladder, backend=b)
    with pytest.raises(ValueError, match="unknown memory policy 'fast'"):
        nu.bound_start(node=0, fallback=("cpu", "fast"), backend=b)  # never reached: still
    with pytest.raises(ValueError, match="bind policy"):
        nu.bound_start(node=0, policy="nearby", backend=b)
    with pytest.raises(ValueError, match="no NUMA node"):
        nu.bound_start(node=7, backend=b)
    starter = nu.bound_start(cpus=[999], strict=True, backend=b)  # no such CPU
    with pytest.raises(OSError) as err:
        with starter:
            pass
    assert err.value.errno == errno.EINVAL  # the record says so too
    assert [tuple(r[:3]) for r in starter.starts] == [("preferred", "none", "EINVAL")]


def test_spawn_context_records_each_start():
    b = sim("dual-socket-8gpu")
    ctx = nu.spawn_context(nodes=[1], fallback=("bind", "cpu"), backend=b)
    assert isinstance(ctx.plan, nu.GpuPlan) and ctx.plan.cpus == _node_cpus(b, 1)
    assert ctx.starts == []
    with pytest.raises(ValueError, match="method must be"):
        nu.spawn_context(node=0, method="forkserver", backend=b)
