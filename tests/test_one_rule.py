"""One mistake, one answer: every public function that takes NUMA nodes answers a node
the machine does not have, and a node this process's cpuset forbids, the same way
(the rule in numa_utils' module docstring):

- a node that does not exist (not online): ValueError naming it and the nodes that
  exist, strict or not (a typo, or a configuration written for another machine);
- a node the cpuset forbids (it exists): a fact of the environment.  A call that places
  memory or CPUs falls back (a value that says "cpuset") and raises OSError only under
  strict; a call that only asks about a node answers for it as for any other.

One table over every such function, on a simulated 1-node and 2-node machine and the
container whose cpuset is node 1 (fake_sysfs/container-cpuset.txt).
"""

import mmap

import pytest
from conftest import nu, nur, nut, sim

MiB = 1 << 20

# (saved machine, the nodes it has, as its message lists them)
MACHINES = [
    ("single-node", "node 0"),
    ("qemu-x86_64-two-node", "nodes 0-1"),
    ("container-cpuset", "nodes 0-1"),
]


def _buffer():
    return mmap.mmap(-1, MiB)


def _existing_region(b, nodes, **kw):
    """attach(policy=, nodes=) to a region made first-touch (its maker asked nothing)."""
    nur.SharedRegion.create("made", MiB, existing="reuse", backend=b).close()
    return nur.SharedRegion.attach("made", policy="bind", nodes=nodes, backend=b, **kw)


def _thread_policy(b, nodes, **kw):
    with nu.thread_policy("bind", nodes, backend=b, **kw) as res:
        return res


def _numa_nodes_variable(b, nodes, monkeypatch, **kw):
    monkeypatch.setenv("NUMA_UTILS_NUMA_NODES", nu.format_cpulist(nodes))
    return nu.interleave(_buffer(), backend=b, **kw)


# name -> (call(backend, nodes, monkeypatch, **strict), what it does with a node):
# "acts" places memory or CPUs (a forbidden node falls back, strict raises); "asks"
# only reads about it (a forbidden node is answered as any other).
CALLS = {
    "apply_policy": (
        lambda b, n, mp, **kw: nu.apply_policy(
            _buffer(), mode="interleave", nodes=n, backend=b, **kw
        ),
        "acts",
    ),
    "interleave": (
        lambda b, n, mp, **kw: nu.interleave(_buffer(), nodes=n, backend=b, **kw),
        "acts",
    ),
    "weighted_interleave": (
        lambda b, n, mp, **kw: nu.weighted_interleave(
            _buffer(), nodes=n, fallback="interleave", backend=b, **kw
        ),
        "acts",
    ),
    "bind": (lambda b, n, mp, **kw: nu.bind(_buffer(), n, backend=b, **kw), "acts"),
    "prefer": (lambda b, n, mp, **kw: nu.prefer(_buffer(), max(n), backend=b, **kw), "acts"),
    "set_thread_policy": (
        lambda b, n, mp, **kw: nu.set_thread_policy("bind", n, backend=b, **kw),
        "acts",
    ),
    "thread_policy": (lambda b, n, mp, **kw: _thread_policy(b, n, **kw), "acts"),
    "NUMA_NODES": (_numa_nodes_variable, "acts"),
    "bind_to_node": (lambda b, n, mp, **kw: nu.bind_to_node(max(n), backend=b, **kw), "acts"),
    "spawn_context": (
        lambda b, n, mp, **kw: nu.spawn_context(node=max(n), backend=b, **kw).plan,
        "acts",
    ),
    "SharedRegion.create": (
        lambda b, n, mp, **kw: nur.SharedRegion.create(
            "r", MiB, policy="bind", nodes=n, backend=b, **kw
        ),
        "acts",
    ),
    "SharedRegion.create(layout=)": (
        lambda b, n, mp, **kw: nur.SharedRegion.create(
            "r", MiB, layout=f"parts:bind:{max(n)}", backend=b, **kw
        ),
        "acts",
    ),
    "SharedRegion.attach": (lambda b, n, mp, **kw: _existing_region(b, n, **kw), "acts"),
    "fit": (lambda b, n, mp: nur.fit(MiB, nodes=n, backend=b), "acts"),
    "thread_plan": (lambda b, n, mp, **kw: nut.thread_plan(node=max(n), backend=b, **kw), "acts"),
    "settle": (lambda b, n, mp, **kw: nut.settle(n, backend=b, **kw), "acts"),
    "local_devices": (lambda b, n, mp: nu.local_devices(max(n), backend=b), "asks"),
    "choose_node": (lambda b, n, mp: nut.choose_node(exclude=n, backend=b), "asks"),
    "set_interleave_weights": (
        lambda b, n, mp: nu.set_interleave_weights({max(n): 1}, backend=b),
        "asks",
    ),
}
HAS_STRICT = [name for name, (call, _) in CALLS.items() if "kw" in call.__code__.co_varnames]
ACTS = [name for name, (_, kind) in CALLS.items() if kind == "acts"]


def _says(value):
    """The words a call's value gives for what it could not do as asked."""
    if isinstance(value, nu.PolicyResult):
        return value.reason or ""
    if isinstance(value, nu.BindResult):
        return value.cpu_reason or ""
    if isinstance(value, nur.SharedRegion):
        try:
            return value.policy.reason or ""
        finally:
            value.close()
    if isinstance(value, (nur.FitResult, nut.SettleResult)):
        return value.reason or ""
    return " ".join(value.notes)  # plans: GpuPlan, ThreadPlan


@pytest.mark.parametrize("machine, nodes", MACHINES)
@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_node_that_does_not_exist_is_a_value_error_naming_the_nodes_that_do(
    name, machine, nodes, monkeypatch
):
    b = sim(machine)
    missing = max(nu.read_topology(backend=b).nodes) + 1
    call, _ = CALLS[name]
    for strict in [{}, {"strict": True}, {"strict": False}][: 1 + 2 * (name in HAS_STRICT)]:
        with pytest.raises(ValueError) as raised:
            call(b, [0, missing], monkeypatch, **strict)
        # NUMA_NODES in numactl's words: "node argument 2 out of range"
        text = str(raised.value).replace("node argument", "NUMA node")
        assert f"NUMA node {missing} " in text, (strict, text)
        assert f"(this machine has {nodes})" in text, (strict, text)


@pytest.mark.parametrize("name", ["interleave", "bind", "settle", "SharedRegion.create", "fit"])
def test_a_node_list_as_text_gets_the_same_answer(name, monkeypatch):
    """``nodes="0-1"`` (the kernel's list format) is read as the ids it names: on one
    node, the same ValueError as [0, 1]; on two, the same call as [0, 1]."""
    call, _ = CALLS[name]
    with pytest.raises(ValueError, match=r"no NUMA node 1 \(this machine has node 0\)"):
        call(sim("single-node"), "0-1", monkeypatch)
    assert "node" not in _says(call(sim("qemu-x86_64-two-node"), "0-1", monkeypatch))


@pytest.mark.parametrize("name", ACTS)
def test_a_node_the_cpuset_forbids_falls_back_and_strict_raises(name, monkeypatch):
    """container-cpuset: node 0 exists, its CPUs and memory are outside the cpuset."""
    call, _ = CALLS[name]
    value = call(sim("container-cpuset"), [0], monkeypatch)
    assert "cpuset" in _says(value), value
    if name in HAS_STRICT:
        with pytest.raises(OSError, match="cpuset") as raised:
            call(sim("container-cpuset"), [0], monkeypatch, strict=True)
        assert not isinstance(raised.value, ValueError)


@pytest.mark.parametrize("name", ["interleave", "bind", "NUMA_NODES", "SharedRegion.create"])
def test_some_nodes_forbidden_applies_the_rest_and_says_which(name, monkeypatch):
    """Nodes 0-1 in the container: applied on node 1, node 0 in ``dropped``, the
    reason "cpuset" with its hint."""
    call, _ = CALLS[name]
    value = call(sim("container-cpuset"), [0, 1], monkeypatch)
    res = value
    if isinstance(value, nur.SharedRegion):
        res = value.policy
        value.close()
    assert res and res.nodes == {1} and res.dropped == {0}
    assert res.reason == "cpuset" and "Mems_allowed_list" in res.hint


@pytest.mark.parametrize("name", sorted(set(CALLS) - set(ACTS)))
def test_asking_about_a_forbidden_node_answers(name, monkeypatch):
    call, _ = CALLS[name]
    try:
        call(sim("container-cpuset"), [0], monkeypatch)
    except OSError as err:  # set_interleave_weights: the kernel's own refusal
        assert not isinstance(err, ValueError) and "node 0" not in str(err)


@pytest.mark.parametrize("machine, nodes", MACHINES)
@pytest.mark.parametrize("name", ACTS)
def test_a_node_that_exists_and_is_allowed_is_taken(name, machine, nodes, monkeypatch):
    """The table is not vacuous: the last allowed node is placed on, no word said."""
    b = sim(machine)
    node = max(nu.read_topology(backend=b).usable_memory_nodes)
    value = CALLS[name][0](b, [node], monkeypatch)
    assert "cpuset" not in _says(value) and "no NUMA node" not in _says(value)
