"""bind_to_node / bind_for_gpu on SimulatedBackend, and for real (in child processes, so
that the test process itself is never pinned), plus the `run` command."""

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ON_LINUX, fixture_root, live_kernel_has_policy_syscalls, nu, saved_backend, sim


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("NUMA_UTILS_") or name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
            monkeypatch.delenv(name)


# -- simulated ---------------------------------------------------------------------------


def test_bind_to_node_cpus_and_memory():
    b = sim("dual-socket-8gpu")
    topo = b.topology
    r = nu.bind_to_node(1, backend=b)
    assert r and r.cpus_applied and r.cpus == topo.nodes[1].cpus
    assert b.call("sched_getaffinity", 0) == topo.nodes[1].cpus
    assert r.memory.applied and r.memory.mode == "preferred" and r.memory.nodes == {1}
    pol = nu.get_policy(backend=b)
    assert (pol.mode, pol.nodes) == (nu.Mode.PREFERRED, {1})
    assert r.threads_changed == (b.pid,)
    assert json.loads(json.dumps(r.to_json()))["cpus"] == sorted(topo.nodes[1].cpus)


@pytest.mark.parametrize(
    "memory, mode, nodes",
    [
        ("bind", nu.Mode.BIND, {0}),
        ("interleave", nu.Mode.INTERLEAVE, {0, 1}),
        ("local", nu.Mode.LOCAL, set()),
    ],
)
def test_bind_memory_modes(memory, mode, nodes):
    b = sim("dual-socket-8gpu")
    r = nu.bind_to_node(0, memory=memory, backend=b)
    assert r.memory.applied
    pol = nu.get_policy(backend=b)
    assert (pol.mode, pol.nodes) == (mode, nodes)


def test_memory_none_and_cpus_false_touch_nothing():
    b = sim("dual-socket-8gpu")
    before = b.call("sched_getaffinity", 0)
    r = nu.bind_to_node(1, cpus=False, memory=None, backend=b)
    assert r and r.memory is None and not r.cpus_applied and r.cpu_reason == "not requested"
    assert b.call("sched_getaffinity", 0) == before
    assert not [c for c in b.kernel.calls if c[0] == "set_mempolicy"]


def test_eperm_on_set_mempolicy_still_binds_cpus(caplog):
    b = sim("dual-socket-8gpu")
    b.fail("set_mempolicy", errno.EPERM)
    r = nu.bind_to_node(1, memory="bind", backend=b)
    assert r.cpus_applied and b.call("sched_getaffinity", 0) == b.topology.nodes[1].cpus
    assert not r.memory.applied and r.memory.reason == "EPERM"
    assert "CAP_SYS_NICE" in r.memory.hint
    assert not r  # not everything asked was applied
    assert "not applied" in caplog.text


def test_eperm_strict_raises_before_touching_cpus():
    b = sim("dual-socket-8gpu")
    b.fail("set_mempolicy", errno.EPERM)
    before = b.call("sched_getaffinity", 0)
    with pytest.raises(PermissionError):
        nu.bind_to_node(1, memory="bind", strict=True, backend=b)
    assert b.call("sched_getaffinity", 0) == before


def test_strict_from_envs(monkeypatch):
    b = sim("dual-socket-8gpu")
    b.fail("set_mempolicy", errno.EPERM)
    monkeypatch.setenv("NUMA_UTILS_NUMA_STRICT", "1")
    with pytest.raises(PermissionError):
        nu.bind_to_node(1, backend=b)
    monkeypatch.setenv("NUMA_UTILS_NUMA_STRICT", "sometimes")
    with pytest.raises(ValueError, match="NUMA_UTILS_NUMA_STRICT"):
        nu.bind_to_node(1, backend=b)


def test_threads_pinned_elsewhere_are_left_alone():
    b = sim("dual-socket-8gpu")
    free = b.add_thread()  # inherits the whole machine
    pinned = b.add_thread(affinity={5})  # an engine pinned this one
    r = nu.bind_to_node(1, backend=b)
    node1 = b.topology.nodes[1].cpus
    assert set(r.threads_changed) == {b.pid, free} and r.threads_skipped == (pinned,)
    assert b.call("sched_getaffinity", free) == node1 and b.call("sched_getaffinity", pinned) == {5}


def test_threads_current_only():
    b = sim("dual-socket-8gpu")
    other = b.add_thread()
    r = nu.bind_to_node(1, threads="current", backend=b)
    assert r.threads_changed == (b.pid,)
    assert b.call("sched_getaffinity", other) == b.cpus_allowed
    with pytest.raises(ValueError):
        nu.bind_to_node(1, threads="some", backend=b)


def test_explicit_cpu_set_is_intersected_with_allowed():
    b = sim("container-cpuset")
    r = nu.bind_to_node(1, cpus={0, 1, 20, 21}, memory=None, backend=b)
    assert r.cpus == {20, 21} and b.call("sched_getaffinity", 0) == {20, 21}
    r = nu.bind_to_node(1, cpus={0, 1}, memory=None, backend=b)
    assert not r.cpus_applied and r.cpu_reason == "cpuset"
    with pytest.raises(OSError):
        nu.bind_to_node(1, cpus={0, 1}, memory=None, strict=True, backend=b)


def test_cpuset_fallback_to_nearest_node():
    b = sim("container-cpuset")
    r = nu.bind_to_node(0, backend=b)  # node 0: no CPU and no memory allowed
    assert r.cpus == b.topology.allowed_cpus and r.cpus_applied
    # The result names the node it bound, and is falsy: not the node asked for.
    assert (r.node, r.asked) == (1, 0) and not r
    r = nu.bind_to_node(0, cpus=False, backend=b)  # memory alone went elsewhere
    assert (r.node, r.asked) == (1, 0) and not r
    r = nu.bind_to_node(0, backend=b)
    assert any("nearest node 1" in n for n in r.notes)
    assert r.memory.applied and r.memory.nodes == {1}  # Mems_allowed_list is 1
    assert any("no memory this process may use" in n for n in r.notes)
    with pytest.raises(OSError):
        nu.bind_to_node(0, strict=True, backend=b)
    with pytest.raises(OSError):
        nu.bind_to_node(0, cpus=False, strict=True, backend=b)


def test_memoryless_node_prefers_nearest_memory_even_strict():
    b = sim("memoryless-cpu-node")
    r = nu.bind_to_node(0, strict=True, backend=b)
    assert r and r.memory.nodes == {1} and r.cpus == b.topology.nodes[0].cpus


def test_cpu_less_node_runs_on_nearest_cpu_node():
    b = sim("gh200")
    r = nu.bind_to_node(1, memory=None, backend=b)
    assert r.cpus == b.topology.nodes[0].cpus
    assert any("no CPUs" in n for n in r.notes)


def test_bad_node_raises():
    with pytest.raises(ValueError):
        nu.bind_to_node(7, backend=sim("dual-socket-8gpu"))


def test_bind_for_gpu_exclusive():
    b = sim("dual-socket-8gpu")
    want = nu.cpus_for_gpu(5, "exclusive", environ={}, backend=b)
    r = nu.bind_for_gpu(5, "exclusive", memory="bind", environ={}, backend=b)
    assert r and r.cpus == want and b.call("sched_getaffinity", 0) == want
    assert r.plan.pci == "0000:bb:00.0" and r.plan.node == 1
    assert nu.get_policy(backend=b).nodes == {1}


def test_bind_for_gpu_reads_the_topology_once(monkeypatch):
    b = sim("dual-socket-8gpu")
    calls = []
    real = nu.read_topology

    def counting(**kw):
        calls.append(kw)
        return real(**kw)

    monkeypatch.setattr(nu, "read_topology", counting)
    r = nu.bind_for_gpu(5, "exclusive", memory="interleave", environ={}, backend=b)
    assert r and r.memory.applied
    assert len(calls) == 1


def test_bind_for_gpu_reordered_visible_devices():
    b = sim("dual-socket-8gpu")
    env = {"CUDA_VISIBLE_DEVICES": "GPU-5eed0007,GPU-5eed0000"}
    r = nu.bind_for_gpu(0, "node", environ=env, backend=b)
    assert r.plan.pci == "0000:db:00.0" and r.node == 1
    assert b.call("sched_getaffinity", 0) == b.topology.nodes[1].cpus


def test_bind_for_gpu_policy_none_leaves_cpus(monkeypatch):
    b = sim("dual-socket-8gpu")
    before = b.call("sched_getaffinity", 0)
    r = nu.bind_for_gpu(6, environ={}, backend=b)  # envs.py default: none
    assert b.call("sched_getaffinity", 0) == before and r.cpu_reason == "not requested"
    assert r.memory.applied and r.memory.nodes == {1}
    monkeypatch.setenv("NUMA_UTILS_NUMA_BIND_POLICY", "exclusive")
    r = nu.bind_for_gpu(6, environ={}, backend=b)
    assert r.cpus == nu.cpus_for_gpu(6, "exclusive", environ={}, backend=b)


def test_bind_for_gpu_unknown_device():
    b = sim("single-node")
    r = nu.bind_for_gpu(0, "node", environ={}, backend=b)
    assert not r and r.cpu_reason == "unknown-node"
    with pytest.raises(OSError):
        nu.bind_for_gpu(0, "node", environ={}, strict=True, backend=b)


def test_saved_tree_is_never_bound():
    b = saved_backend(fixture_root("dual-socket-8gpu"))
    r = nu.bind_to_node(0, backend=b)
    assert not r.cpus_applied and r.cpu_reason == "not-live"
    assert not r.memory.applied and r.memory.reason == "not-live"
    with pytest.raises(nu.NotLiveError):
        nu.bind_to_node(0, memory=None, strict=True, backend=b)


# -- the real kernel, in child processes ---------------------------------------------------

needs_linux = pytest.mark.skipif(not ON_LINUX, reason="needs Linux /proc")
real = [pytest.mark.realkernel, pytest.mark.xdist_group("realkernel"), needs_linux]

_CHILD = (
    "import os, json; s = open('/proc/self/status').read();"
    "maps = open('/proc/self/numa_maps').read() if os.path.exists("
    "'/proc/self/numa_maps') else '';"
    "print(json.dumps({'pid': os.getpid(), 'affinity': sorted(os.sched_getaffinity(0)),"
    "'status': [l for l in s.splitlines() if l.startswith('Cpus_allowed_list')],"
    "'maps': maps.splitlines()[:3]}))"
)


def _node0_cpus():
    topo = nu.read_topology()
    node = min(topo.nodes_with_cpus)
    return node, sorted(topo.nodes[node].cpus & topo.allowed_cpus & topo.online_cpus)


def _run_cli(*args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("NUMA_UTILS_")}
    e.update(env or {})
    p = subprocess.Popen(
        [sys.executable, nu.__file__, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=e,
    )
    out, err = p.communicate(timeout=60)
    return p.pid, p.returncode, out, err


@pytest.mark.parametrize("memory, shown", [("bind", "bind:"), ("prefer", "prefer:")])
def test_run_execs_child_with_affinity_and_policy(memory, shown, request):
    for m in real:
        request.applymarker(m)
    node, cpus = _node0_cpus()
    pid, rc, out, err = _run_cli(
        "run", "--node", str(node), "--memory", memory, "--", sys.executable, "-c", _CHILD
    )
    assert rc == 0, err
    child = json.loads(out)
    assert child["pid"] == pid  # exec'd in place: no shell, no fork
    assert child["affinity"] == cpus
    assert child["status"] == [f"Cpus_allowed_list:\t{nu.format_cpulist(cpus)}"]
    if not live_kernel_has_policy_syscalls():
        pytest.skip("memory policy syscalls unavailable here (seccomp / no NUMA)")
    assert child["maps"], "no /proc/self/numa_maps"
    assert all(f" {shown}{node}" in line for line in child["maps"]), child["maps"]


def test_done_when_run_node0_prints_allowed_cpus(request):
    for m in real:
        request.applymarker(m)
    node, cpus = _node0_cpus()
    _, rc, out, err = _run_cli(
        "run",
        "--node",
        str(node),
        "--",
        sys.executable,
        "-c",
        "import os; print(os.sched_getaffinity(0))",
    )
    assert rc == 0, err
    assert out.strip() == str(set(cpus))


def test_run_errors():
    _, rc, _, err = _run_cli("run", "--node", "0", "--", "no-such-command-xyz")
    assert rc == 127 and "no-such-command-xyz" in err
    _, rc, _, err = _run_cli("run", "--node", "0")
    assert rc == 2 and "no command" in err
    _, rc, _, err = _run_cli("run", "--node", "0", "--policy", "exclusive", "--", "true")
    assert rc == 2 and "--gpu" in err
    _, rc, _, err = _run_cli("run", "--root", fixture_root("gh200"), "--node", "0", "--", "true")
    assert rc == 2 and "--root" in err
    _, rc, _, _ = _run_cli("run", "--gpu", "0", "--node", "0", "--", "true")
    assert rc == 2


def test_run_gpu_that_does_not_exist_is_a_usage_error(request):
    """Issue 12: like --node 99, a CUDA device the machine does not have is exit 2
    with one line naming it, and the command is not run."""
    for m in real:
        request.applymarker(m)
    if nu.gpus():
        pytest.skip("this machine has GPUs")
    _, rc, out, err = _run_cli(
        "run", "--gpu", "0", "--", sys.executable, "-c", "print('child ran')"
    )
    assert rc == 2 and "child ran" not in out
    assert "no CUDA device 0" in err and len(err.strip().splitlines()) == 1


def test_real_bind_to_node_in_a_child(request):
    for m in real:
        request.applymarker(m)
    node, cpus = _node0_cpus()
    code = textwrap.dedent("""
        import importlib.util, json, os, sys, threading, time
        spec = importlib.util.spec_from_file_location("nu_child", sys.argv[1])
        m = importlib.util.module_from_spec(spec)
        sys.modules["nu_child"] = m
        spec.loader.exec_module(m)
        done, ready, tids = threading.Event(), threading.Barrier(3), {}

        def pin():      # an engine thread pinned to one CPU before we bind
            tids["pinned"] = threading.get_native_id()
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
            ready.wait()
            done.wait()

        def free():
            tids["free"] = threading.get_native_id()
            ready.wait()
            done.wait()

        ts = [threading.Thread(target=pin), threading.Thread(target=free)]
        for t in ts:
            t.start()
        ready.wait()
        r = m.bind_to_node(int(sys.argv[2]), memory="bind")
        out = r.to_json()
        out["tids"] = tids
        out["free_aff"] = sorted(os.sched_getaffinity(tids["free"]))
        done.set()
        for t in ts:
            t.join()
        print(json.dumps(out))
    """)
    p = subprocess.run(
        [sys.executable, "-c", code, nu.__file__, str(node)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["cpus_applied"] and r["cpus"] == cpus
    assert r["tids"]["free"] in r["threads_changed"] and r["free_aff"] == cpus
    if len(cpus) > 1:  # pinned to one CPU: narrower than the process, left alone
        assert r["tids"]["pinned"] in r["threads_skipped"]
    if live_kernel_has_policy_syscalls():
        assert r["memory"]["applied"] and r["memory"]["nodes"] == [node]
    else:
        assert r["memory"]["reason"] in ("EPERM", "ENOSYS")
    assert r["cpus_applied"]
