"""Launching an engine's process tree where it belongs (issue 41): can_bind says what
works before anything starts, bound_start and spawn_context bind every start with a
fallback ladder and a record per start, process_tree_plan plans DP groups of TP workers
with an engine core above each, and `plan --tree` prints it."""

import errno
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from conftest import (
    FIXTURES,
    ON_LINUX,
    REPO,
    fixture_root,
    fixture_text,
    hook_call,
    live_kernel_has_policy_syscalls,
    nu,
    nut,
    saved_backend,
    sim,
)

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
    for empty in ([], iter([])):  # not "node None", nor a start bound to no CPU
        with pytest.raises(ValueError, match="nodes= names no node"):
            nu.bound_start(nodes=empty, backend=b)
        with pytest.raises(ValueError, match="cpus= names no CPU"):
            nu.bound_start(cpus=empty, backend=b)
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


# -- on the running kernel: children start where the plan says, a refusal is recorded ----

REAL = textwrap.dedent(
    """
    import json, multiprocessing, os, subprocess, sys
    sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
    import numa_utils as nu

    def report(queue=None):
        got = {"cpus": sorted(os.sched_getaffinity(0)), "policy": "denied"}
        try:
            got["policy"] = nu.get_policy().mode.name
        except PermissionError:
            pass
        if queue is None:
            return got
        queue.put(got)

    def forked():
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, json.dumps(report()).encode())
            os._exit(0)
        os.close(write)
        got = json.loads(os.read(read, 4096))
        os.waitpid(pid, 0)
        return got

    def popen():
        code = "import os; print(sorted(os.sched_getaffinity(0)))"
        return json.loads(subprocess.check_output([sys.executable, "-c", code]))

    if __name__ == "__main__":
        out = {"parent": sorted(os.sched_getaffinity(0))}
        if sys.argv[2] == "seccomp":
            import kernel_checks as kc
            kc._seccomp_deny(os.uname().machine, kc.RAW_SYSCALLS[os.uname().machine])
            out["can_bind"] = nu.can_bind(0)._asdict()
        cpu = out["parent"][-1]
        with nu.bound_start(cpus=[cpu], fallback=("bind", "cpu")) as starter:
            out["fork"], out["popen"] = forked(), popen()
        out["starts"] = [record._asdict() for record in starter.starts]
        for method in ("fork", "spawn"):
            ctx = nu.spawn_context(cpus=[cpu], fallback=("bind", "cpu"), method=method)
            queue = ctx.Queue()
            child = ctx.Process(target=report, args=(queue,))
            child.start()
            out[method] = queue.get(timeout=120)
            child.join(120)
            out[method + " starts"] = [record.applied for record in ctx.starts]
        try:
            with nu.bound_start(cpus=[cpu], fallback=("bind",)) as starter:
                out["strict"] = forked()  # must not run
        except OSError as err:
            out["strict"] = err.errno
        out["after"] = sorted(os.sched_getaffinity(0))
        print(json.dumps(out))
    """
)


@pytest.mark.skipif(not ON_LINUX, reason="Linux processes")
@pytest.mark.parametrize("kernel", ["plain", "seccomp"])
def test_children_start_on_the_planned_cpus(tmp_path, kernel):
    if not live_kernel_has_policy_syscalls():
        pytest.skip("the policy syscalls are denied here already")
    script = tmp_path / "real.py"
    script.write_text(REAL)
    p = subprocess.run(
        [sys.executable, str(script), str(REPO), kernel],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    cpu = got["parent"][-1]
    assert got["after"] == got["parent"]  # the parent's own mask came back
    for how in ("fork", "spawn"):
        assert got[how]["cpus"] == [cpu], how
    assert got["popen"] == [cpu] and got["fork"]["cpus"] == [cpu]
    if kernel == "plain":
        assert got["fork"]["policy"] == got["spawn"]["policy"] == "BIND"
        assert [s["applied"] for s in got["starts"]] == ["bind"]
        assert got["fork starts"] == got["spawn starts"] == ["bind"]
        assert got["strict"]["policy"] == "BIND"  # bind works: the strict start ran
        return
    assert got["can_bind"]["cpu"] and not got["can_bind"]["bind"]
    assert got["can_bind"]["reason"] == "EPERM"
    assert got["starts"] == [
        {"asked": "bind", "applied": "cpu", "reason": "EPERM", "hint": got["starts"][0]["hint"]}
    ]
    assert got["fork starts"] == got["spawn starts"] == ["cpu"]
    assert got["strict"] == errno.EPERM  # refused in the parent: no child ran


# -- 3. process_tree_plan: DP groups of TP workers, an engine core above each -----------


def _facts(name):
    """What the saved machine is, from its expected.json (written without numa_utils)."""
    exp = json.loads(fixture_text(name, "expected.json"))
    node_cpus = {n["id"]: set(n["cpus"]) for n in exp["nodes"]}
    gpu_node = {g["address"]: g["numa_node"] for g in exp.get("gpus", [])}
    siblings = {int(cpu): set(c["siblings"] or [int(cpu)]) for cpu, c in exp["cpus"].items()}
    return node_cpus, gpu_node, siblings


def _cores(cpus, siblings):
    return {frozenset(siblings.get(cpu, {cpu}) & cpus) for cpu in cpus}


def _variants(name):
    """(label, backend, environ) for the saved machine as it is, with an inherited
    affinity narrower than the cpuset (a balloon, taskset), with a cpuset without its
    last node, and under CUDA_VISIBLE_DEVICES orders."""
    node_cpus, gpu_node, _ = _facts(name)
    b = sim(name)
    allowed = sorted(b.call("sched_getaffinity", 0))
    yield "plain", b, {}
    narrow = sim(name)
    narrow.call("sched_setaffinity", 0, allowed[: max(1, 3 * len(allowed) // 4)])
    yield "affinity", narrow, {}
    with_cpus = [n for n in sorted(node_cpus) if node_cpus[n] & set(allowed)]
    if len(with_cpus) > 1:
        keep = set(allowed) - node_cpus[with_cpus[-1]]
        yield "cpuset", sim(name, cpus_allowed=keep, mems_allowed=with_cpus[:-1]), {}
    count = len(nu.gpu_plans(environ={}, backend=b))
    if count > 1:
        backwards = ",".join(str(i) for i in reversed(range(count)))
        yield "reversed", sim(name), {"CUDA_VISIBLE_DEVICES": backwards}
        odd = ",".join(str(i) for i in range(1, count, 2))
        yield "odd", sim(name), {"CUDA_VISIBLE_DEVICES": odd}


def _shapes(gpus, nodes):
    """(dp, tp) that fit ``gpus`` GPUs; without GPUs, around the ``nodes`` count."""
    if not gpus:
        return sorted({(1, 1), (1, nodes), (nodes, 1), (2, 1), (2, 2), (nodes + 1, 1)})
    out = {(1, 1), (1, gpus), (gpus, 1)}
    if gpus % 2 == 0:
        out.add((2, gpus // 2))
    return sorted(out)


def check_tree(name, b, environ, dp, tp, what=""):
    node_cpus, gpu_node, siblings = _facts(name)
    tree = nut.process_tree_plan(dp=dp, tp=tp, environ=environ, backend=b)
    affinity = b.call("sched_getaffinity", 0)
    assert [len(g.workers) for g in tree.groups] == [tp] * dp, what
    workers = [w for g in tree.groups for w in g.workers]
    gpus = bool(nu.gpu_plans(environ=environ, backend=b))
    for group in tree.groups:
        assert group.cpus <= affinity, "the process's own affinity was widened"
        for w in group.workers:
            assert w.cpus and w.cpus <= group.cpus, "a parent must hold its children's CPUs"
            assert w.cpus <= node_cpus[w.cpu_node], "a worker spans nodes"
            home = gpu_node.get(w.pci, -1)
            if home >= 0 and node_cpus[home] & affinity:
                assert w.cpu_node == home, f"GPU {w.gpu} is on node {home}"
    # Disjoint wherever the machine allows: every node has a core for each worker
    # planned there (with GPUs: every GPU of the machine, visible or not).
    per_node = {}
    if gpus:
        homes = list(gpu_node.values())
        can = -1 not in homes and all(node_cpus[h] & affinity for h in homes)
        for h in homes:
            per_node[h] = per_node.get(h, 0) + 1
    else:
        for w in workers:
            per_node[w.cpu_node] = per_node.get(w.cpu_node, 0) + 1
        can = True
    can = can and all(
        len(_cores(node_cpus[n] & affinity, siblings)) >= k for n, k in per_node.items()
    )
    if can:
        for i, w in enumerate(workers):
            for other in workers[i + 1 :]:
                assert not w.cpus & other.cpus, f"{what}: workers share CPUs ({tree.notes})"
        for i, g in enumerate(tree.groups):
            for other in tree.groups[i + 1 :]:
                assert not g.cpus & other.cpus
    if not gpus:  # never all on one node by accident: groups take nodes of their own
        usable = [n for n in node_cpus if node_cpus[n] & affinity]
        if dp <= len(usable):
            seen = [set(g.nodes) for g in tree.groups]
            for i, nodes in enumerate(seen):
                assert all(not nodes & other for other in seen[i + 1 :]), seen
    data = tree.to_json()
    assert len(data["groups"]) == dp
    for group, shown in zip(tree.groups, data["groups"]):
        assert nu.parse_cpulist(shown["cpus"]) == group.cpus
        assert shown["nodes"] == sorted(group.nodes)
        for w, row in zip(group.workers, shown["workers"]):
            assert (row["gpu"], nu.parse_cpulist(row["cpus"])) == (w.gpu, w.cpus)
            assert row["nodes"] == [w.cpu_node]
    return tree


@pytest.mark.parametrize("name", FIXTURES)
def test_process_tree_properties_on_every_saved_machine(name):
    checked = 0
    for label, b, environ in _variants(name):
        count = len(nu.gpu_plans(environ=environ, backend=b))
        topo = nu.read_topology(backend=b)
        for dp, tp in _shapes(count, len(topo.nodes_with_cpus)):
            check_tree(name, b, environ, dp, tp, f"{label} dp={dp} tp={tp}")
            checked += 1
    assert checked


def test_process_tree_on_eight_gpus_is_two_nodes_of_four():
    b = sim("dual-socket-8gpu")
    tree = nut.process_tree_plan(dp=2, tp=4, environ={}, backend=b)
    assert [g.nodes for g in tree.groups] == [(0,), (1,)]
    for g in tree.groups:
        assert [w.gpu for w in g.workers] == [4 * g.rank + i for i in range(4)]
        expect = set()
        for w in g.workers:
            assert w.cpus == nu.cpus_for_gpu(w.gpu, "exclusive", environ={}, backend=b)
            expect |= w.cpus
        assert g.cpus == expect
    data = tree.to_json()
    assert data["groups"][0]["workers"][0] == {
        "gpu": 0,
        "pci": "0000:19:00.0",
        "cpus": "0-11,96-107",
        "nodes": [0],
        "memory_nodes": [0],
    }
    assert json.loads(json.dumps(data)) == data


def test_process_tree_without_gpus_spreads_groups_over_nodes():
    b = sim("four-node-asym", cpus_allowed=range(64))  # its GPUs out of sight:
    tree = nut.process_tree_plan(dp=2, tp=2, environ={"CUDA_VISIBLE_DEVICES": ""}, backend=b)
    assert [g.nodes for g in tree.groups] == [(0, 1), (2, 3)]
    assert [w.cpus for w in tree.groups[0].workers] == [set(range(8)) | set(range(32, 40))] + [
        set(range(8, 16)) | set(range(40, 48))
    ]


def test_process_tree_rejects_what_cannot_be_planned():
    b = sim("dual-socket-8gpu")
    with pytest.raises(ValueError, match="9 workers need 9 GPUs; this process sees 8"):
        nut.process_tree_plan(dp=3, tp=3, environ={}, backend=b)
    for bad in ({"dp": 0}, {"tp": -1}, {"dp": 1.5}, {"tp": True}):
        with pytest.raises(ValueError, match="an integer >= 1"):
            nut.process_tree_plan(environ={}, backend=b, **bad)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "numa_utils", *args],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="4,5,6,7,0,1,2,3"),
        timeout=300,
    )


def test_cli_plan_tree_prints_what_the_library_plans():
    root = fixture_root("dual-socket-8gpu")
    p = _cli("plan", "--root", root, "--tree", "--dp", "2", "--tp", "4", "--json")
    assert p.returncode == 0, p.stderr
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7,0,1,2,3"}
    want = nut.process_tree_plan(dp=2, tp=4, environ=env, backend=saved_backend(root))
    assert json.loads(p.stdout) == want.to_json()
    assert json.loads(p.stdout)["groups"][0]["nodes"] == [1]  # device 0 is GPU 4 here
    p = _cli("plan", "--root", root, "--tree", "--dp", "2", "--tp", "4")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "numa_utils plan --tree: 2 groups of 4 workers"
    assert lines[1].split() == ["group", "0:", "CPUs", "48-95,144-191,", "nodes", "1"]
    assert lines[2].split()[:4] == ["GPU", "0", "(0000:9b:00.0):", "CPUs"]
    for bad in (
        ["--dp", "2"],
        ["--tree", "--roles", "compute=rest"],
        ["--tree", "--format", "srun"],
    ):
        p = _cli("plan", "--root", root, *bad)
        assert p.returncode == 2 and "--tree" in p.stderr, (bad, p.stderr)
    p = _cli("plan", "--root", root, "--tree", "--dp", "3", "--tp", "3")
    assert p.returncode == 2 and "9 workers need 9 GPUs" in p.stderr
