"""Results print short enough to log: every public result type, on every saved machine,
prints in at most 300 characters (a Topology in at most 2,000), with CPU and node sets
written as lists ("0-47,96-143"); the detail stays one call away (the fields, to_json).
"""

import mmap

import pytest
from conftest import FIXTURES, nu, nur, nut, sim

RESULT_MAX = 300
TOPOLOGY_MAX = 2000


def _records(module):
    """The public record types (namedtuples) of ``module``."""
    for name in module.__all__:
        kind = getattr(module, name)
        if isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields"):
            yield kind


# Every public result type, and the classes that print themselves.
PUBLIC = {
    *_records(nu),
    *_records(nur),
    *_records(nut),
    nu.LocalDevices,
    nur.Counters,
    nur.SharedRegion,
    nur.ExtentPlacement,
    nur.Layout,
}
# Made by no call a simulated machine can answer: pinning needs CUDA.
NOT_MADE_HERE = {nur.CudaPinProgress}


def _made(machine):
    """One value of each result type a call gives on ``machine``, the biggest where a
    call gives several (the node with most CPUs, the device with most local CPUs)."""
    b = sim(machine)
    topo = nu.read_topology(backend=b)
    out = [topo, nu.memory_node_choice(topo), b.abi]
    out.append(max(topo.nodes.values(), key=lambda node: len(node.cpus)))
    out.append(max(topo.cpus.values(), key=lambda cpu: len(cpu.llc or ())))
    out += [h for node in topo.nodes.values() for h in node.hugepages.values()][:1]
    out += [node.access for node in topo.nodes.values() if node.access][:1]
    cpu_node = max(topo.nodes_with_cpus or {0})
    memory = sorted(topo.nodes_with_memory)
    buf = mmap.mmap(-1, 1 << 20)
    with nu.use_backend(b):
        out.append(nu.interleave(buf, nodes=memory))
        out.append(nu.bind_to_node(cpu_node))
        out.append(nu.local_devices(memory, kind="gpu"))
        out += sorted(nu.devices(), key=lambda device: len(device.cpus))[-1:]
        if topo.gpus:
            out += [nu.gpus()[0], nu.gpu_plans()[0], nu.bind_for_gpu(0, "exclusive")]
        if b.has_process and topo.has_node_dir:
            out.append(nu.get_policy())
            out += nu.parse_numa_maps(b.read_text("/proc/self/numa_maps"))[:1]
        fit = nur.fit(1 << 30)
        counters = nur.counters()
        out += [fit, fit.nodes[0], fit.limits[0], counters, next(iter(counters))]
        with nur.SharedRegion.create("r", 1 << 22, layout=f"parts:bind:{memory[-1]}") as region:
            out += [region, region.extents[0], region.layout, b.call("shm_stat", region.shmid)]
            if topo.has_node_dir:  # a kernel without NUMA has no numa_maps
                out += region.placement(by_extent=True)
        plan = nut.thread_plan(node=cpu_node)
        pinned = nut.pin_threads(plan, default="compute")
        out += [plan, pinned, pinned.threads[0], nut.instance_plans(1, gpus_per_instance=0)[0]]
        choice = nut.choose_node()
        out += [nut.remote_share(), choice, choice.candidates[0]]
        out += [nu.can_bind(cpu_node), nut.settle(memory)]
        with nu.bound_start(node=cpu_node) as started:
            pass
        tree = nut.process_tree_plan()
        out += [*started.starts, tree, *tree.groups[:1]]
        with nur.PinnedPool(register=None) as pool:
            if pool.nodes:
                out.append(pool.alloc(1 << 16, node=min(pool.nodes)))
    return out


@pytest.mark.parametrize("machine", FIXTURES)
def test_every_result_prints_short_with_sets_as_lists(machine):
    for value in _made(machine):
        text = repr(value)
        limit = TOPOLOGY_MAX if isinstance(value, nu.Topology) else RESULT_MAX
        assert len(text) <= limit, (type(value).__name__, len(text), text[:3000])
        assert "frozenset(" not in text and "mappingproxy(" not in text, text


def test_every_public_result_type_is_made():
    made = {type(value) for machine in FIXTURES for value in _made(machine)}
    assert PUBLIC - NOT_MADE_HERE <= made, sorted(k.__name__ for k in PUBLIC - made)


def test_a_result_prints_its_cpus_as_a_list_and_keeps_them():
    """The 8-GPU machine's 96-CPU sets: "0-47,96-143" in the text, every CPU in the
    field and in to_json()."""
    with nu.use_backend(sim("dual-socket-8gpu")):
        res = nu.bind_to_node(0)
    assert "cpus={0-47,96-143}" in repr(res), repr(res)
    assert res.cpus == set(range(48)) | set(range(96, 144))
    assert res.to_json()["cpus"] == sorted(res.cpus)


def test_a_long_field_is_cut_to_its_kind_and_size():
    """Over the limit, the longest values give way first: a text to its start, a
    record to its type, a mapping of ids to its keys, a collection to its size."""
    topo = nu.read_topology(backend=sim("mi300x-8gpu"))
    text = repr(topo)
    assert "nodes=<2 ...>" in text and "online_cpus={0-383}" in text, text
    assert "gpus=<8 ...>" in text, text
    fit = nur.fit(1 << 30, backend=sim("sparse-ids"))
    assert fit.reason in repr(fit) or fit.reason[:40] in repr(fit), repr(fit)
