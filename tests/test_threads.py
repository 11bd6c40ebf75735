"""Thread roles: thread_plan over every saved machine, pin_threads / pinned on the
simulator and on real threads (in a child process, so the test process is never
pinned), and instance_plans."""

import errno
import functools
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import (
    FIXTURES,
    REPO,
    fixture_root,
    fixture_tree,
    hook_call,
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


def tree(name):
    return saved_backend(fixture_root(name))


def _gpu_count(name):
    return len(nu.gpu_plans(environ={}, backend=tree(name)))


GPU_FIXTURES = [f for f in FIXTURES if _gpu_count(f)]
# Roles that fit the smallest GPU share of the saved machines (old-kernel-cpumap).
SMALL_ROLES = {"copy": 1, "compute": "rest"}


# -- an OpenMP reader written here, from the specifications, not from the library ------


def _expand(item):
    """ "3", "3-6" or "3-9:2" (GNU's stride) -> a list of CPUs."""
    first, _, stride = item.partition(":")
    low, _, high = first.partition("-")
    high = high or low
    return list(range(int(low), int(high) + 1, int(stride or 1)))


def omp_places_cpus(text):
    """OMP_PLACES as an explicit list of places: "{0},{1,2},{5}"."""
    cpus = []
    for place in re.findall(r"\{([^}]*)\}", text):
        for item in place.split(","):
            cpus.extend(_expand(item.strip()))
    assert re.sub(r"\{[^}]*\}", "", text).strip(",") == "", text
    return cpus


def gomp_cpus(text):
    """GOMP_CPU_AFFINITY: CPUs, ranges and strided ranges, space- or comma-separated."""
    cpus = []
    for item in re.split(r"[\s,]+", text.strip()):
        cpus.extend(_expand(item))
    return cpus


def kmp_cpus(text):
    """KMP_AFFINITY's explicit proclist=[...]."""
    settings = text.split(",")
    assert "explicit" in settings, text
    found = re.search(r"proclist=\[([^\]]*)\]", text)
    assert found, text
    cpus = []
    for item in found.group(1).split(","):
        cpus.extend(_expand(item))
    return cpus


def check_omp(env, cpus):
    assert int(env["OMP_NUM_THREADS"]) == len(cpus)
    assert sorted(omp_places_cpus(env["OMP_PLACES"])) == sorted(cpus)
    assert env["OMP_PROC_BIND"] in ("close", "spread", "master", "primary", "true")
    assert sorted(gomp_cpus(env["GOMP_CPU_AFFINITY"])) == sorted(cpus)
    assert sorted(kmp_cpus(env["KMP_AFFINITY"])) == sorted(cpus)


def test_omp_reader_reads_what_the_specifications_allow():
    assert omp_places_cpus("{0},{1,2},{4-5}") == [0, 1, 2, 4, 5]
    assert gomp_cpus("0 3-5 8-12:2") == [0, 3, 4, 5, 8, 10, 12]
    assert kmp_cpus("granularity=fine,explicit,proclist=[0,2-3]") == [0, 2, 3]


# -- properties over every saved machine -------------------------------------------------


def check_plan(topo, plan, smt):
    """Roles disjoint, inside the cpuset and the plan's node, one SMT rule, and every
    CPU of the node either in a role or in left_out."""
    allowed = topo.allowed_cpus & topo.online_cpus
    seen = set()
    for role, cpus in plan.roles.items():
        assert cpus, role
        assert not cpus & seen, f"role {role} shares CPUs"
        seen |= cpus
        assert cpus <= allowed
        assert cpus <= topo.nodes[plan.node].cpus
        for cpu in cpus:
            siblings = topo.cpus[cpu].siblings & allowed
            if smt == "core":
                assert siblings <= cpus, f"role {role}: CPU {cpu} without its siblings"
            else:
                assert siblings & seen == {cpu}, f"role {role}: two siblings of CPU {cpu}"
    left = set()
    for why, cpus in plan.left_out.items():
        assert cpus and why
        assert not cpus & seen, why
        left |= cpus
    assert seen | left >= topo.nodes[plan.node].cpus & topo.online_cpus
    check_omp(plan.omp_env, plan.roles["compute"])
    assert json.loads(json.dumps(plan.to_json()))["roles"]["compute"]


@pytest.mark.parametrize("name", GPU_FIXTURES)
@pytest.mark.parametrize("smt", nut.SMT_RULES)
def test_gpu_roles_disjoint_within_and_across_gpus(name, smt):
    b = tree(name)
    topo = nu.read_topology(backend=b)
    plans = [
        nut.thread_plan(gpu, roles=SMALL_ROLES, smt=smt, environ={}, backend=b)
        for gpu in range(_gpu_count(name))
    ]
    shared_cores = any("exclusive plans share cores" in n for p in plans for n in p.notes)
    everywhere = set()
    for plan in plans:
        if shared_cores:  # more GPUs than cores on a node: said, and falsy or shared
            continue
        assert plan, plan.notes
        assert plan.pci and plan.node in topo.nodes_with_cpus
        check_plan(topo, plan, smt)
        assert not plan.cpus & everywhere, f"GPU {plan.gpu} shares CPUs with another GPU"
        everywhere |= plan.cpus
    if name in ("dual-socket-8gpu", "mi300x-8gpu", "container-cpuset"):
        assert everywhere, "the property must be checked on the big machines"


@pytest.mark.parametrize("name", GPU_FIXTURES)
def test_slices_by_physical_gpu_whatever_cuda_visible_devices_says(name):
    b = tree(name)
    count = _gpu_count(name)
    for physical in range(count):
        alone = nut.thread_plan(
            0, roles=SMALL_ROLES, environ={"CUDA_VISIBLE_DEVICES": str(physical)}, backend=b
        )
        full = nut.thread_plan(physical, roles=SMALL_ROLES, environ={}, backend=b)
        assert alone.pci == full.pci and alone.roles == full.roles


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("smt", nut.SMT_RULES)
def test_node_roles_on_every_node_of_every_machine(name, smt):
    b = tree(name)
    topo = nu.read_topology(backend=b)
    allowed = topo.allowed_cpus & topo.online_cpus
    for node in sorted(topo.nodes_with_cpus):
        if not topo.nodes[node].cpus & allowed:
            continue
        plan = nut.thread_plan(node=node, roles=SMALL_ROLES, smt=smt, backend=b)
        if len(topo.cores_of(topo.nodes[node].cpus & allowed)) < 2:
            assert not plan and plan.shared == ("compute",)
            continue
        assert plan and plan.node == node and plan.gpu is None
        check_plan(topo, plan, smt)


def test_default_roles_on_a_big_gpu_share():
    b = tree("dual-socket-8gpu")
    plan = nut.thread_plan(0, environ={}, backend=b)
    assert list(plan.roles) == ["feeder", "copy", "progress", "compute"]
    cores = {role: len(nu.read_topology(backend=b).cores_of(c)) for role, c in plan.roles.items()}
    assert cores == {"feeder": 1, "copy": 1, "progress": 1, "compute": 9}
    assert plan.left_out["planned for another GPU"]
    assert plan.memory_nodes == (0,)


def test_cpuset_cpus_are_left_out_with_the_reason():
    b = tree("container-cpuset")
    topo = nu.read_topology(backend=b)
    plan = nut.thread_plan(node=0, roles=SMALL_ROLES, backend=b)
    outside = plan.left_out["outside this process's cpuset"]
    assert outside and not outside & topo.allowed_cpus and plan.cpus <= topo.allowed_cpus


def test_too_few_cores_shares_and_says_so():
    b = tree("qemu-x86_64-two-node")  # one CPU per node
    plan = nut.thread_plan(node=0, backend=b)
    assert not plan and plan.shared == ("copy", "progress", "compute")
    assert any("no core left" in n for n in plan.notes)
    with pytest.raises(OSError, match="no core left"):
        nut.thread_plan(node=0, strict=True, backend=b)


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({}, "one of the two"),
        ({"gpu": 0, "node": 0}, "one of the two"),
        ({"node": 0, "roles": {}}, "no roles"),
        ({"node": 0, "roles": {"a": 0}}, "number of cores"),
        ({"node": 0, "roles": {"a": True}}, "number of cores"),
        ({"node": 0, "roles": {"a": "rest", "b": "rest"}}, "only one role"),
        ({"node": 0, "smt": "two"}, "smt must be"),
        ({"node": 7}, "no NUMA node"),
    ],
)
def test_thread_plan_rejects_bad_input(kw, msg):
    with pytest.raises(ValueError, match=msg):
        nut.thread_plan(backend=tree("dual-socket-8gpu"), **kw)


def test_unknown_gpu_is_a_falsy_plan_or_strict_error():
    b = tree("dual-socket-8gpu")
    plan = nut.thread_plan(0, environ={"CUDA_VISIBLE_DEVICES": "GPU-nosuch"}, backend=b)
    assert not plan and not plan.cpus and plan.pci is None
    with pytest.raises(OSError, match="not identified"):
        nut.thread_plan(0, environ={"CUDA_VISIBLE_DEVICES": ""}, strict=True, backend=b)


# -- pin_threads and pinned on the simulator ----------------------------------------------


def _engine(name="dual-socket-8gpu"):
    b = sim(name)
    nccl = b.add_thread(name="NCCL WatchDog")
    ucx = b.add_thread(name="ucx-progress")
    other = b.add_thread(name="ZMQbg/1")
    return b, nccl, ucx, other


MATCH = {"copy": "^NCCL", "progress": "ucx"}


def test_pin_threads_by_name_and_lists_the_rest():
    b, nccl, ucx, other = _engine()
    plan = nut.thread_plan(0, environ={}, backend=b)
    r = nut.pin_threads(plan, MATCH, backend=b)
    assert r and r.passes == 1 and not r.late
    assert b.call("sched_getaffinity", nccl) == plan.roles["copy"]
    assert b.call("sched_getaffinity", ucx) == plan.roles["progress"]
    assert set(r.unmatched) == {b.pid, other}
    assert b.call("sched_getaffinity", other) == b.topology.allowed_cpus  # left alone
    by_tid = {pin.tid: pin for pin in r.threads}
    assert by_tid[nccl].name == "NCCL WatchDog" and by_tid[nccl].role == "copy"
    assert by_tid[nccl].before == b.topology.allowed_cpus and by_tid[nccl].ok
    assert by_tid[other].reason == "no role" and not by_tid[other].ok
    assert "inherit" in r.inherit
    json.dumps(nu.to_json(r))


def test_default_role_takes_every_other_thread():
    b, nccl, ucx, other = _engine()
    plan = nut.thread_plan(0, environ={}, backend=b)
    r = nut.pin_threads(plan, MATCH, default="compute", backend=b)
    assert r and not r.unmatched
    assert b.call("sched_getaffinity", other) == plan.roles["compute"]
    assert b.call("sched_getaffinity", 0) == plan.roles["compute"]


def test_threads_that_start_during_a_pass_are_pinned_by_the_next():
    b, nccl, ucx, other = _engine()
    plan = nut.thread_plan(0, environ={}, backend=b)
    real = functools.partial(b.call, "sched_setaffinity")
    started = []

    def start_one_then_pin(tid, cpus):
        if not started:
            started.append(b.add_thread(name="NCCL late"))
        real(tid, cpus)

    hook_call(b, "sched_setaffinity", start_one_then_pin)
    r = nut.pin_threads(plan, MATCH, backend=b)
    assert r and r.passes == 2 and r.late == tuple(started)
    assert b.thread_affinity[started[0]] == plan.roles["copy"]


def test_threads_that_never_stop_starting():
    b, nccl, ucx, other = _engine()
    plan = nut.thread_plan(0, environ={}, backend=b)
    real = functools.partial(b.call, "sched_setaffinity")

    def always_one_more(tid, cpus):
        b.add_thread(name="NCCL spawner")
        real(tid, cpus)

    hook_call(b, "sched_setaffinity", always_one_more)
    r = nut.pin_threads(plan, MATCH, backend=b)
    assert r.passes == nut._PIN_PASSES and any("kept starting" in n for n in r.notes)
    with pytest.raises(OSError, match="kept starting"):
        nut.pin_threads(plan, MATCH, strict=True, backend=b)


def test_a_thread_that_exits_is_not_a_failure():
    b, nccl, ucx, other = _engine()
    plan = nut.thread_plan(0, environ={}, backend=b)
    real = functools.partial(b.call, "sched_setaffinity")

    def exits_first(tid, cpus):
        if tid == nccl:
            b.end_thread(nccl)
        real(tid, cpus)

    hook_call(b, "sched_setaffinity", exits_first)
    r = nut.pin_threads(plan, MATCH, backend=b)
    by_tid = {pin.tid: pin for pin in r.threads}
    assert r and by_tid[nccl].reason == "exited"


def test_denied_pinning_is_falsy_or_strict_error():
    b, nccl, ucx, other = _engine()
    plan = nut.thread_plan(0, environ={}, backend=b)

    def denied(tid, cpus):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    hook_call(b, "sched_setaffinity", denied)
    r = nut.pin_threads(plan, MATCH, backend=b)
    assert not r
    assert {pin.reason for pin in r.threads if pin.role} == {"EPERM"}
    with pytest.raises(OSError, match="not pinned to role copy: EPERM"):
        nut.pin_threads(plan, MATCH, strict=True, backend=b)


@pytest.mark.parametrize(
    "match, default, msg",
    [
        ({"nosuch": "x"}, None, "not in the plan"),
        ({}, "nosuch", "not in the plan"),
        ({"copy": "("}, None, "invalid"),
    ],
)
def test_pin_threads_rejects_bad_roles(match, default, msg):
    b, *_ = _engine()
    plan = nut.thread_plan(0, environ={}, backend=b)
    with pytest.raises(ValueError, match=msg):
        nut.pin_threads(plan, match, default=default, backend=b)


def test_pinned_restores_every_mask_and_the_memory_policy():
    b, nccl, ucx, other = _engine()
    b.call("sched_setaffinity", other, {5, 6})
    before = {tid: b.call("sched_getaffinity", tid) for tid in b.call("threads")}
    policy_before = nu.get_policy(backend=b)
    plan = nut.thread_plan(0, environ={}, backend=b)
    with nut.pinned(plan, MATCH, default="compute", memory="prefer", backend=b) as r:
        assert r
        assert b.call("sched_getaffinity", other) == plan.roles["compute"]
        pol = nu.get_policy(backend=b)
        assert (pol.mode, pol.nodes) == (nu.Mode.PREFERRED, {0})
    after = {tid: b.call("sched_getaffinity", tid) for tid in b.call("threads")}
    assert after == before
    pol = nu.get_policy(backend=b)
    assert (pol.mode, pol.nodes) == (policy_before.mode, policy_before.nodes)


def test_pinned_leaves_an_exited_thread_s_id_when_another_process_reuses_it():
    """A pinned thread exits and an unrelated process gets its id (a small pid_max, a
    PID namespace): leaving pinned() must not overwrite that process's CPU mask (as
    root, any process's)."""
    b, nccl, ucx, other = _engine()
    plan = nut.thread_plan(0, environ={}, backend=b)
    pins = nut.pinned(plan, MATCH, backend=b)
    with pins as r:
        assert {pin.tid for pin in r.threads if pin.ok} == {nccl, ucx}
        b.end_thread(nccl)
        stranger = b.process(pid=nccl)
        stranger.call("sched_setaffinity", 0, {5})
    assert stranger.call("sched_getaffinity", 0) == {5}
    assert pins.exited == [nccl] and pins.restored == [ucx]
    assert b.call("sched_getaffinity", ucx) == b.topology.allowed_cpus


def test_pinned_leaves_a_new_thread_that_got_an_exited_one_s_id():
    b, nccl, ucx, other = _engine()
    plan = nut.thread_plan(0, environ={}, backend=b)
    pins = nut.pinned(plan, MATCH, backend=b)
    with pins:
        b.end_thread(ucx)
        assert b.add_thread({7}, name="ucx-progress", tid=ucx) == ucx  # started later
    assert b.call("sched_getaffinity", ucx) == {7}
    assert pins.exited == [ucx] and pins.restored == [nccl]


def test_pin_threads_records_each_thread_s_start_time():
    b, nccl, ucx, other = _engine()
    plan = nut.thread_plan(0, environ={}, backend=b)
    r = nut.pin_threads(plan, MATCH, backend=b)
    starts = {pin.tid: pin.start for pin in r.threads}
    assert all(starts.values()) and len(set(starts.values())) == len(starts)
    stat = b.read_text(f"/proc/self/task/{nccl}/stat")
    assert starts[nccl] == stat.rpartition(")")[2].split()[19]


# -- real threads of a real process ---------------------------------------------------


REAL_THREADS = textwrap.dedent(
    """
    import ctypes, json, os, sys, threading
    sys.path.insert(0, sys.argv[1])
    import numa_utils as nu, numa_utils_threads as nut, numa_utils_regions as nur

    libc = ctypes.CDLL(None, use_errno=True)
    cpus = sorted(os.sched_getaffinity(0))
    first, last = {cpus[0]}, {cpus[-1]}
    plan = nut.ThreadPlan(None, None, 0, {"copy": frozenset(first), "compute": frozenset(last)},
                         "core", {}, {})
    ready, go, done = threading.Barrier(3), threading.Event(), threading.Event()
    seen = {}

    def worker(name):
        libc.prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME: what /proc shows
        ready.wait()
        go.wait()
        seen[name] = sorted(os.sched_getaffinity(0))
        child = threading.Thread(target=lambda: seen.__setitem__(name + " child",
                                 sorted(os.sched_getaffinity(0))))
        child.start()
        child.join()
        done.wait()

    workers = [threading.Thread(target=worker, args=(n,)) for n in ("NCCL WatchDog", "ucx-prog")]
    for w in workers:
        w.start()
    ready.wait()
    with nut.pinned(plan, {"copy": "^NCCL"}, default="compute") as r:
        go.set()
        while len(seen) < 4:
            pass
        inside = {p.name: sorted(p.after) for p in r.threads}
        ok = bool(r)
    done.set()
    for w in workers:
        w.join()
    print(json.dumps({"ok": ok, "inside": inside, "seen": seen, "cpus": cpus,
                      "main_after": sorted(os.sched_getaffinity(0))}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux threads")
def test_real_threads_pinned_by_name_inherited_and_restored():
    p = subprocess.run(
        [sys.executable, "-c", REAL_THREADS, str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    first, last = [got["cpus"][0]], [got["cpus"][-1]]
    assert got["ok"]
    assert got["seen"]["NCCL WatchDog"] == first
    assert got["seen"]["ucx-prog"] == last  # default role
    # threads started after pinning inherit their creator's mask
    assert got["seen"]["NCCL WatchDog child"] == first
    assert got["seen"]["ucx-prog child"] == last
    assert got["inside"]["NCCL WatchDog"] == first
    assert got["main_after"] == got["cpus"]  # pinned() put the main thread's mask back


# -- instance_plans -------------------------------------------------------------------------


@pytest.mark.parametrize("name", GPU_FIXTURES)
def test_instances_disjoint_on_every_gpu_machine(name):
    b = tree(name)
    count = _gpu_count(name)
    for per in range(1, count + 1):
        plans = nut.instance_plans(count // per, gpus_per_instance=per, backend=b)
        gpus, pcis, cpus = set(), set(), set()
        for plan in plans:
            assert len(plan.gpus) == per and not set(plan.gpus) & gpus
            assert not set(plan.pcis) & pcis
            gpus |= set(plan.gpus)
            pcis |= set(plan.pcis)
            visible = plan.environ["CUDA_VISIBLE_DEVICES"].split(",")
            assert [int(v) for v in visible] == list(plan.gpus)
            shares = nu.gpu_plans("exclusive", environ=plan.environ, backend=b)
            assert {s.pci for s in shares} == set(plan.pcis)
            if not any("share cores" in n for s in shares for n in s.notes):
                assert not plan.cpus & cpus, f"instance {plan.instance} shares CPUs"
            cpus |= plan.cpus
        memory = [n for plan in plans for n in plan.memory_nodes]
        if len(memory) != len(set(memory)):
            assert any("shared with another instance" in n for p in plans for n in p.notes)


@pytest.mark.parametrize("name", FIXTURES)
def test_cpu_only_instances_get_whole_nodes(name):
    b = tree(name)
    topo = nu.read_topology(backend=b)
    usable = [n for n in topo.nodes_with_cpus if topo.nodes[n].cpus & topo.allowed_cpus]
    for n in range(1, len(usable) + 1):
        plans = nut.instance_plans(n, gpus_per_instance=0, backend=b)
        seen_cpus, seen_nodes = set(), set()
        for plan in plans:
            assert plan.cpus and not plan.cpus & seen_cpus
            assert not set(plan.nodes) & seen_nodes
            seen_cpus |= plan.cpus
            seen_nodes |= set(plan.nodes)
            assert plan.cpus <= topo.allowed_cpus
        assert seen_nodes == set(usable)
    with pytest.raises(ValueError, match="CPU-only instances need"):
        nut.instance_plans(len(usable) + 1, gpus_per_instance=0, backend=b)


def test_instance_plans_rejects_bad_input():
    b = tree("dual-socket-8gpu")
    with pytest.raises(ValueError, match="need 9 GPUs"):
        nut.instance_plans(9, backend=b)
    with pytest.raises(ValueError, match="n must be"):
        nut.instance_plans(0, backend=b)
    with pytest.raises(ValueError, match="gpus_per_instance"):
        nut.instance_plans(1, gpus_per_instance=-1, backend=b)


# -- spawn_context: children bound before they start --------------------------------------


def test_spawn_context_rejects_bad_input():
    b = sim("dual-socket-8gpu")
    with pytest.raises(ValueError, match="method must be"):
        nu.spawn_context(node=0, method="forkserver", backend=b)
    with pytest.raises(ValueError, match="give one of a CUDA device index, node="):
        nu.spawn_context(0, node=0, backend=b)


SPAWN = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    import numa_utils as nu


    def child(queue):
        queue.put(sorted(os.sched_getaffinity(0)))  # its first line of Python


    if __name__ == "__main__":
        got = {}
        os.environ["NUMA_UTILS_NUMA_RESERVED_CORES"] = "1"  # the plan leaves one core out
        for method in ("spawn", "fork"):
            ctx = nu.spawn_context(node=0, method=method)
            queue = ctx.Queue()
            proc = ctx.Process(target=child, args=(queue,))
            proc.start()
            got[method] = queue.get(timeout=120)
            proc.join(120)
            got[method + " exit"] = proc.exitcode
            got["planned"] = sorted(ctx.plan.cpus)
        got["parent"] = sorted(os.sched_getaffinity(0))
        print(json.dumps(got))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux processes")
def test_spawned_children_start_on_the_planned_cpus(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    topo = nu.read_topology()
    if len(topo.cores_of(topo.nodes[0].cpus & set(cpus))) < 2:
        pytest.skip("needs two cores on node 0")
    script = tmp_path / "spawn_check.py"
    script.write_text(SPAWN)
    p = subprocess.run(
        [sys.executable, str(script), str(REPO)], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["planned"] and set(got["planned"]) < set(cpus)
    assert got["spawn"] == got["planned"] and got["fork"] == got["planned"]
    assert got["spawn exit"] == 0 and got["fork exit"] == 0
    assert got["parent"] == cpus  # the parent's own mask was put back


EXITED_THREAD = textwrap.dedent(
    """
    import ctypes, json, os, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    import numa_utils_threads as nut

    cpus = sorted(os.sched_getaffinity(0))
    plan = nut.ThreadPlan(None, None, 0, {"copy": frozenset(cpus[:1])}, "core", {}, {})
    named, end, tids = threading.Event(), threading.Event(), []

    def worker():
        ctypes.CDLL(None).prctl(15, b"NCCL gone", 0, 0, 0)  # PR_SET_NAME
        tids.append(threading.get_native_id())
        named.set()
        end.wait()

    thread = threading.Thread(target=worker)
    thread.start()
    named.wait()
    pins = nut.pinned(plan, {"copy": "^NCCL gone"})
    with pins as r:
        pinned = [pin.tid for pin in r.threads if pin.ok]
        end.set()
        thread.join()
        # join() returns when the Python thread is done, a moment before the kernel
        # task is gone (seen on 3.8): wait for the task itself, as the test is about
        # a thread that no longer exists.
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/self/task/{tids[0]}") and time.monotonic() < deadline:
            time.sleep(0.001)
    print(json.dumps({"tid": tids[0], "pinned": pinned, "exited": pins.exited,
                      "restored": pins.restored}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux threads")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to pin")
def test_real_thread_that_exits_while_pinned_is_left_alone_and_listed():
    p = subprocess.run(
        [sys.executable, "-c", EXITED_THREAD, str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["pinned"] == [got["tid"]]
    assert got["exited"] == [got["tid"]] and got["restored"] == []


# -- the command line: plan --roles and threads PID --------------------------------------


def cli_run(*args):
    return subprocess.run(
        [sys.executable, "-m", "numa_utils", *args],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=300,
    )


def test_cli_plan_roles_formats_match_the_library():
    root = fixture_root("dual-socket-8gpu")
    plan = nut.thread_plan(
        1, roles={"feeder": 1, "compute": "rest"}, environ={}, backend=tree("dual-socket-8gpu")
    )
    base = ("plan", "--root", root, "--roles", "feeder=1,compute=rest", "--gpu", "1")
    env = cli_run(*base, "--format", "env")
    assert env.returncode == 0, env.stderr
    exported = dict(re.findall(r"^export (\w+)=(.*)$", env.stdout, re.M))
    assert set(exported) == set(plan.omp_env)
    assert exported["OMP_PLACES"].strip("'") == plan.omp_env["OMP_PLACES"]
    check_omp({k: v.strip("'") for k, v in exported.items()}, plan.roles["compute"])
    js = cli_run(*base, "--json")
    assert js.returncode == 0, js.stderr
    assert json.loads(js.stdout) == [plan.to_json()]
    ts = cli_run(*base, "--format", "taskset")
    assert f"taskset -c {nu.format_cpulist(plan.roles['compute'])}  # role compute" in ts.stdout
    sd = cli_run(*base, "--format", "systemd")
    assert "worker@1.service.d/50-numa.conf" in sd.stdout
    assert f"CPUAffinity={nu.format_cpulist(plan.cpus)}" in sd.stdout
    assert f'Environment="OMP_NUM_THREADS={len(plan.roles["compute"])}"' in sd.stdout
    text = cli_run(*base)
    assert "left out" in text.stdout and "compute" in text.stdout


@pytest.mark.parametrize(
    "args, msg",
    [
        (("--roles", "feeder=x"), "is not ROLE=N or ROLE=rest"),
        (("--format", "env"), "add --roles"),
        (("--roles", "a=1,b=rest", "--format", "env"), "add --gpu N or --node N"),
        (("--node", "0", "--gpu", "0"), "one of the two"),
        (("--node", "0", "--format", "numactl"), "no numactl form"),
    ],
)
def test_cli_plan_roles_refuses_bad_input(args, msg):
    p = cli_run("plan", "--root", fixture_root("dual-socket-8gpu"), *args)
    assert p.returncode == 2 and msg in p.stderr


THREADS_TARGET = textwrap.dedent(
    """
    import ctypes, os, sys, threading
    libc = ctypes.CDLL(None, use_errno=True)
    stop = threading.Event()

    def worker():
        libc.prctl(15, b"NCCL WatchDog", 0, 0, 0)
        os.sched_setaffinity(0, {int(cpu) for cpu in sys.argv[1:]})
        print("ready", flush=True)
        stop.wait()

    threading.Thread(target=worker).start()
    sys.stdin.readline()
    stop.set()
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux threads")
def test_cli_threads_lists_names_masks_roles_and_strays():
    plan = nut.thread_plan(node=0, roles={"copy": 1, "rest": "rest"})
    copy = sorted(plan.roles["copy"])
    target = subprocess.Popen(
        [sys.executable, "-c", THREADS_TARGET, *map(str, copy)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert target.stdout.readline().strip() == "ready"
        args = ("threads", str(target.pid), "--node", "0", "--roles", "copy=1,rest=rest")
        p = cli_run(*args, "--json")
        assert p.returncode == 0, p.stderr
        rows = {row["name"]: row for row in json.loads(p.stdout)}
        nccl = rows["NCCL WatchDog"]
        assert nccl["cpus"] == nu.format_cpulist(copy) and nccl["role"] == "copy"
        assert not nccl["stray"] and nccl["last_cpu"] in copy and nccl["node"] == 0
        text = cli_run("threads", str(target.pid))
        assert text.returncode == 0 and "NCCL WatchDog" in text.stdout
    finally:
        target.stdin.write("\n")
        target.stdin.flush()
        target.wait(60)
    gone = cli_run("threads", str(target.pid))
    assert gone.returncode == 2 and "no process" in gone.stderr


HOSTILE_NAME = b"x\x1b[2J\n9 fake "  # clears the screen, then forges a row


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux threads")
def test_cli_threads_escapes_names_as_maps_does():
    """A thread's name is the process's choice (any byte but NUL, 15 of them): escape
    sequences must not reach the terminal of whoever runs `threads PID` (root), and a
    newline must not forge a row."""
    target = subprocess.Popen(
        [
            sys.executable,
            "-c",
            THREADS_TARGET.replace('b"NCCL WatchDog"', repr(HOSTILE_NAME)),
            *map(str, os.sched_getaffinity(0)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert target.stdout.readline().strip() == "ready"
        text = cli_run("threads", str(target.pid))
        js = cli_run("threads", str(target.pid), "--json")
    finally:
        target.stdin.write("\n")
        target.stdin.flush()
        target.wait(60)
    assert text.returncode == 0, text.stderr
    assert "\x1b" not in text.stdout
    rows = text.stdout.splitlines()[2:]
    assert len(rows) == 2  # the main thread and the worker, one line each
    assert any(row.split()[1:3] == ["x\\x1b[2J\\n9", "fake"] for row in rows), rows
    names = [row["name"] for row in json.loads(js.stdout)]
    assert HOSTILE_NAME.decode() in names  # JSON escapes it itself: the name as it is


def test_a_node_the_cpuset_forbids_is_a_falsy_plan_that_says_why():
    b = sim("dual-socket-8gpu", cpus_allowed=range(0, 48))
    plan = nut.thread_plan(node=1, roles=SMALL_ROLES, backend=b)
    assert not plan and not plan.cpus
    # every role present and empty, none counted as sharing, no OpenMP variables
    assert plan.roles == {role: frozenset() for role in SMALL_ROLES}
    assert plan.shared == () and plan.omp_env == {}
    assert any("allows no CPU on node 1" in note for note in plan.notes)
    assert plan.left_out["outside this process's cpuset"] == b.topology.nodes[1].cpus
    with pytest.raises(OSError, match="allows no CPU on node 1"):
        nut.thread_plan(node=1, roles=SMALL_ROLES, strict=True, backend=b)


def _tree_with_an_amd_gpu(tmp_path):
    """An NVIDIA host (dual-socket-8gpu) with one AMD GPU, 0000:f0:00.0, added on its
    last node with CPUs: (backend, topology read before the addition, that node)."""
    root = fixture_tree("dual-socket-8gpu", tmp_path / "t")
    backend = saved_backend(root)
    topo = nu.read_topology(backend=backend)
    node = max(topo.nodes_with_cpus)
    amd = tmp_path / "t" / "sys" / "bus" / "pci" / "devices" / "0000:f0:00.0"
    amd.mkdir()
    for name, value in (("class", "0x038000"), ("vendor", "0x1002"), ("device", "0x74a1")):
        (amd / name).write_text(value + "\n")
    (amd / "numa_node").write_text(f"{node}\n")
    (amd / "local_cpulist").write_text(nu.format_cpulist(topo.nodes[node].cpus) + "\n")
    return backend, topo, node


def test_a_gpu_of_another_maker_named_by_bus_id_gets_its_own_makers_plan(tmp_path):
    """pci_bus_id= may name a GPU outside the family CUDA numbers (an AMD GPU on a
    host with NVIDIA ones): it is planned with its own maker's GPUs, on its node, not
    a KeyError."""
    backend, topo, node = _tree_with_an_amd_gpu(tmp_path)
    plan = nut.thread_plan(0, pci_bus_id="0000:f0:00.0", reserve=0, backend=backend)
    assert plan.pci == "0000:f0:00.0"
    assert plan.node == node
    # the only GPU of its maker: every allowed CPU of its node is its own
    assert plan.cpus == topo.nodes[node].cpus & topo.allowed_cpus


def test_cpus_for_gpu_of_another_maker_named_by_bus_id_is_planned_on_its_node(tmp_path):
    """cpus_for_gpu agrees with thread_plan for such a GPU: its node's CPUs, not the
    "GPU not planned" fallback of every allowed CPU."""
    backend, topo, node = _tree_with_an_amd_gpu(tmp_path)
    cpus = nu.cpus_for_gpu(0, pci_bus_id="0000:f0:00.0", reserve=0, backend=backend)
    assert set(cpus) == topo.nodes[node].cpus & topo.allowed_cpus
