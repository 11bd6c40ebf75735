"""Observation: counters, remote share, watch, choose_node, pin_for_cuda, prometheus,
status advice (issue 8)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import math
import mmap
import os
import re

import pytest
from conftest import (
    FIXTURES,
    cli,
    fixture_archive,
    fixture_root,
    fixture_text,
    fixture_tree,
    nu,
    nur,
    nusim,
    nut,
    saved_backend,
    shared_library,
    sim,
)

NUMA_FIXTURES = [f for f in FIXTURES if "root/sys/devices/system/node" in fixture_archive(f).dirs]
MiB = 1 << 20


class Overlay(nu.LinuxBackend):
    """A saved tree with some files replaced (text) or made unreadable (an exception)."""

    def __init__(self, root, files):
        super().__init__(nusim.open_tree(root))
        self.files = dict(files)

    def read_text(self, path):
        if path in self.files:
            v = self.files[path]
            if isinstance(v, BaseException):
                raise v
            return v
        return super().read_text(path)

    def exists(self, path):
        if path in self.files:
            return not isinstance(self.files[path], BaseException)
        return super().exists(path)


def tree(name):
    return saved_backend(fixture_root(name))


def no_sleep(_seconds):
    pass


# ---------------------------------------------------------------------------
# Counters
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, want",
    [
        ("numa_hit 5\nnuma_miss 0\n", {"numa_hit": 5, "numa_miss": 0}),
        ("numa_hit 5\n\0", {"numa_hit": 5}),
        ("", {}),
        ("  \n\nother_node 17\n\n", {"other_node": 17}),
    ],
)
def test_parse_numastat(text, want):
    assert nur._parse_numastat(text) == want


@pytest.mark.parametrize("text", ["numa_hit\n", "numa_hit -1\n", "numa_hit 1 2\n", "numa_hit x\n"])
def test_parse_numastat_rejects_garbage(text):
    with pytest.raises(ValueError, match="invalid numastat line in F"):
        nur._parse_numastat(text, source="F")
    assert nur._parse_numastat("numa_miss 3\n" + text, lenient=True) == {"numa_miss": 3}


@pytest.mark.parametrize("name", FIXTURES)
def test_counters_every_fixture(name):
    b = tree(name)
    topo = nu.read_topology(backend=b)
    snap = nur.counters(backend=b)
    assert set(snap.nodes) == set(topo.online_nodes)
    assert snap.page_size == b.page_size and not snap.is_delta
    for c in snap:
        assert c.mem_total_kb == topo.nodes[c.node].mem_total_kb
        assert c.available_kb >= c.mem_free_kb >= 0
    if name in NUMA_FIXTURES:
        assert snap.total("numa_hit") > 0
        assert any(set(nur.NUMASTAT_FIELDS) <= set(c.numastat) for c in snap)
    else:
        # No node directory: node 0 from /proc/meminfo, no numastat (documented).
        assert list(snap.nodes) == [0] and snap[0].numastat == {}
        assert snap[0].mem_total_kb > 0 and snap.remote_ratio == 0.0
    json.dumps(snap.to_json())


def test_counters_missing_and_malformed_files_do_not_crash():
    node = "/sys/devices/system/node"
    b = Overlay(
        fixture_root("dual-socket-8gpu"),
        {
            f"{node}/node0/numastat": FileNotFoundError(errno.ENOENT, "gone"),
            f"{node}/node1/numastat": "numa_hit 10\nnuma_miss oops\nother_node 4\n",
            f"{node}/node1/meminfo": PermissionError(errno.EACCES, "denied"),
        },
    )
    snap = nur.counters(backend=b)
    assert snap[0].numastat == {} and snap[0].numa_hit == 0  # missing: empty
    assert dict(snap[1].numastat) == {"numa_hit": 10, "other_node": 4}  # good lines kept
    assert snap[1].meminfo == {} and snap[1].available_kb == 0
    assert any("numa_miss oops" in p for p in snap.problems)
    assert any("node1/meminfo" in p for p in snap.problems)


def test_bad_numastat_line_keeps_the_good_ones(tmp_path):
    # A negative counter (seen in a generated tree once) is one bad line: it must
    # not hide the other counters, and status reports it.
    root = tmp_path / "root"
    fixture_tree("memoryless-cpu-node", root)
    (root / "sys/devices/system/node/node0/numastat").write_text(
        "numa_hit 0\nnuma_miss 17\nnuma_foreign 8\ninterleave_hit 1100\n"
        "local_node -17\nother_node 17\n"
    )
    b = saved_backend(str(root))
    snap = nur.counters(backend=b)
    assert snap[0].numa_miss == 17 and "local_node" not in snap[0].numastat
    assert snap.problems
    assert "could not read: invalid numastat line" in _warnings(b)
    assert not nur.counters(backend=tree("memoryless-cpu-node")).problems


def _nc(node, stat, mem):
    return nur.NodeCounters(node, stat, mem)


def test_difference_operator():
    before = nur.Counters(
        100.0,
        10.0,
        {
            0: _nc(0, {"numa_hit": 100, "other_node": 5}, {"MemFree": 1000, "MemTotal": 4000}),
            1: _nc(1, {"numa_hit": 50, "other_node": 50}, {"MemFree": 500}),
        },
        4096,
    )
    after = nur.Counters(
        102.5,
        12.5,
        {
            0: _nc(0, {"numa_hit": 160, "other_node": 25}, {"MemFree": 800, "MemTotal": 4000}),
            1: _nc(1, {"numa_hit": 7, "other_node": 3}, {"MemFree": 600}),  # reset
            2: _nc(2, {"numa_hit": 9}, {}),  # came online
        },
        4096,
    )
    d = after - before
    assert d.is_delta and d.seconds == pytest.approx(2.5) and d.timestamp == 102.5
    assert d[0].numa_hit == 60 and d[0].other_node == 20
    assert d[0].mem_free_kb == -200 and d[0].mem_total_kb == 0
    assert d[1].numa_hit == 7 and d[1].other_node == 3  # counters restarted at 0
    assert d[2].numa_hit == 9
    assert d.remote_pages == 23
    assert d.total("numa_hit") == 76
    # remote_ratio = other / (local + other); no local_node fields here -> all remote
    assert d.remote_ratio == 1.0
    with pytest.raises(TypeError):
        _ = after - 3


def test_counters_live_difference():
    if not os.path.isdir("/sys/devices/system/node"):
        pytest.skip("this machine has no /sys/devices/system/node")
    before = nur.counters()
    bytearray(8 * MiB)
    after = nur.counters()
    d = after - before
    assert d.seconds is not None and d.seconds >= 0
    assert all(v >= 0 for c in d for v in c.numastat.values())
    assert set(d.nodes) == set(after.nodes)


# ---------------------------------------------------------------------------
# Remote share and watch, on the simulator
# ---------------------------------------------------------------------------


def _node_cpus(b, node):
    return nu.read_topology(backend=b).nodes[node].cpus


def _interleaved_region(owner, name, pages):
    size = pages * owner.page_size
    addr = owner.map_object(name, size)
    res = nu.interleave(addr, size, nodes=[0, 1], backend=owner)
    assert res, res
    owner.touch(addr, size)
    return addr, size


def test_watch_pid_interleaved_region_is_half_remote():
    """Done-when: a region interleaved over the 2 simulated nodes shows 50/50 and a
    remote share near 50% for a process bound to node 0."""
    base = sim("dual-socket-8gpu")
    worker = base.process(cpus_allowed=_node_cpus(base, 0))
    _interleaved_region(worker, "kv-cache", 256)
    samples = list(cli.watch(interval=0.5, count=2, pid=worker.pid, backend=worker, sleep=no_sleep))
    assert len(samples) == 2
    proc = samples[-1]["process"]
    assert proc["error"] is None
    assert proc["share_by_node"] == {"0": 0.5, "1": 0.5}
    assert proc["bytes_by_node"] == {"0": 128 * 4096, "1": 128 * 4096}
    assert proc["local_nodes"] == [0]
    assert proc["remote_share"] == pytest.approx(0.5, abs=0.02)
    assert proc["over_threshold"] is True
    assert {r["node"] for r in samples[0]["nodes"]} == {0, 1}
    json.dumps(samples)
    text = cli._render_watch(samples[0], True)
    assert "50.0" in text and "remote" in text and "ABOVE THRESHOLD" in text

    # A second process on node 1 attaching the same shared object sees the same split.
    other = base.process(cpus_allowed=_node_cpus(base, 1))
    addr = other.map_object("kv-cache", 256 * 4096, create=False)
    other.touch(addr, 256 * 4096)
    rs = nut.remote_share(other.pid, backend=other)
    assert dict(rs.bytes_by_node) == {0: 128 * 4096, 1: 128 * 4096}
    assert rs.local_nodes == {1} and rs.share == pytest.approx(0.5)


def test_watch_pid_shared_region_from_the_shm_section():
    """The same, the way an engine does it: one process creates an interleaved
    SharedRegion, a worker bound to node 0 attaches and prefaults it."""
    base = sim("dual-socket-8gpu")
    owner = base.process()
    with nur.SharedRegion.create(
        "obs-kv", 512 * 4096, policy="interleave", nodes=[0, 1], backend=owner
    ) as region:
        assert region.policy
        worker = base.process(cpus_allowed=_node_cpus(base, 0))
        with nur.SharedRegion.attach("obs-kv", prefault=True, backend=worker) as mine:
            proc = next(
                cli.watch(count=1, interval=0, pid=worker.pid, backend=worker, sleep=no_sleep)
            )["process"]
            assert proc["share_by_node"] == {"0": 0.5, "1": 0.5}
            assert proc["remote_share"] == pytest.approx(0.5, abs=0.02)
            assert nu.placement(mine.address, mine.size, backend=worker) == {
                0: 256 * 4096,
                1: 256 * 4096,
            }


def test_remote_share_bound_memory_is_local_or_remote():
    base = sim("dual-socket-8gpu")
    p = base.process(cpus_allowed=_node_cpus(base, 0))
    buf = mmap.mmap(-1, 64 * 4096)
    assert nu.bind(buf, [0], backend=p)
    p.touch(nu.buffer_range(buf)[0], 64 * 4096)
    rs = nut.remote_share("self", backend=p)
    assert rs.share == 0.0 and rs.warning is None and rs.cpus == _node_cpus(base, 0)
    q = base.process(cpus_allowed=_node_cpus(base, 0))
    buf2 = mmap.mmap(-1, 64 * 4096)
    assert nu.bind(buf2, [1], backend=q)
    q.touch(nu.buffer_range(buf2)[0], 64 * 4096)
    rs = nut.remote_share(q.pid, backend=q)
    assert rs.share == 1.0 and rs.remote_bytes == 64 * 4096
    assert rs.warning and "100%" in rs.warning
    assert not nut.remote_share(q.pid, threshold=1.0, backend=q).over_threshold


def test_remote_share_memoryless_cpu_node_counts_nearest_memory_as_local():
    base = sim("memoryless-cpu-node")
    p = base.process(cpus_allowed=_node_cpus(base, 0))  # node 0 has no memory
    buf = mmap.mmap(-1, 16 * 4096)
    p.touch(nu.buffer_range(buf)[0], 16 * 4096)
    rs = nut.remote_share("self", backend=p)
    assert rs.local_nodes == {1, 2}  # both at distance 12
    assert rs.total_bytes == 16 * 4096 and rs.share == 0.0


def test_remote_share_unreadable_process_is_a_value():
    rs = nut.remote_share(1 << 30, backend=nu.LinuxBackend("/"))
    assert rs.error and rs.total_bytes == 0 and rs.share == 0.0
    rs = nut.remote_share("self", backend=tree("dual-socket-8gpu"))  # no numa_maps saved
    assert rs.error and "numa_maps" in rs.error


def test_remote_share_kernel_page_size_units():
    text = (
        "7f0000000000 interleave:0-1 anon=4 dirty=4 N0=2 N1=2 kernelpagesize_kB=64\n"
        "7f1000000000 bind:1 file=/dev/hugepages/x huge dirty=1 N1=1 "
        "kernelpagesize_kB=2048\n"
        "7f2000000000 default\n"
        "7f3000000000 default anon=1 N0=1\n"
    )
    assert nu._entries_bytes(nu.parse_numa_maps(text)) == {
        0: 2 * 65536 + 4096,
        1: 2 * 65536 + 2 * MiB,
    }


# ---------------------------------------------------------------------------
# watch on this machine, through the command line
# ---------------------------------------------------------------------------


def test_watch_cli_live(capsys):
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    assert nu.main(["watch", "--count", "2", "--interval", "0.1", "--pid", "self", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line in lines:
        s = json.loads(line)
        assert s["seconds"] > 0 and s["nodes"]
        assert s["process"]["total_bytes"] > 0
    assert nu.main(["watch", "--count", "2", "--interval", "0.1", "--pid", str(os.getpid())]) == 0
    out = capsys.readouterr().out
    assert "numastat changes per interval" in out and f"pid {os.getpid()}:" in out


def test_watch_cli_saved_tree(capsys):
    assert (
        nu.main(
            [
                "watch",
                "--root",
                fixture_root("sparse-ids"),
                "--count",
                "1",
                "--interval",
                "0.01",
                "--json",
            ]
        )
        == 0
    )
    s = json.loads(capsys.readouterr().out)
    assert [r["node"] for r in s["nodes"]] == [0, 8, 250, 251, 252, 253, 254, 255]
    assert all(r["numa_hit"] == 0 for r in s["nodes"])  # a saved tree does not move
    with pytest.raises(SystemExit):
        nu.main(["watch", "--interval", "0"])


# ---------------------------------------------------------------------------
# choose_node
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURES)
def test_choose_node_every_fixture(name):
    b = tree(name)
    topo = nu.read_topology(backend=b)
    res = nut.choose_node(backend=b)
    assert res and res.reason.startswith(f"node {res.node}: ")
    considered = {c.node for c in res.candidates}
    assert res.node in considered
    if topo.has_node_dir:
        for n in considered:
            assert topo.nodes[n].cpus & topo.allowed_cpus, (n, "has no allowed CPU")
    assert json.loads(json.dumps(res.to_json())) == {
        "node": res.node,
        "reason": res.reason,
        "gpu_node": res.gpu_node,
        "candidates": [dict(c._asdict()) for c in res.candidates],
    }
    for g in nu.gpus(backend=b):
        r = nut.choose_node(gpu=g.pci, backend=b)
        assert r.node in considered and f"GPU {g.pci}" in r.reason
    if nu.gpus(backend=b):
        assert "CUDA device 0 (GPU" in nut.choose_node(gpu=0, environ={}, backend=b).reason


def test_choose_node_gh200_gpu_memory_nodes_are_never_candidates():
    b = tree("gh200")
    res = nut.choose_node(gpu=0, backend=b)
    assert res.node == 0 and res.gpu_node == 0
    assert [c.node for c in res.candidates] == [0]  # HBM node 1, MIG nodes 2-8
    assert "GPU 0009:01:00.0) is on node 0" in res.reason


def test_choose_node_gpu_on_memory_only_node_takes_nearest_cpu_node():
    pci = "/sys/bus/pci/devices"
    b = Overlay(fixture_root("gh200"), {f"{pci}/0009:01:00.0/numa_node": "1\n"})
    res = nut.choose_node(gpu="0009:01:00.0", backend=b)
    assert res.node == 0 and res.gpu_node == 1
    assert "has no CPUs" in res.reason
    # cxl: the expander (node 2) is nearer to node 0 (50) than to node 1 (60).
    b = Overlay(fixture_root("cxl-memory-node"), {f"{pci}/0000:c1:00.0/numa_node": "2\n"})
    res = nut.choose_node(gpu="c1:00.0", backend=b)
    assert res.node == 0 and "nearest" in res.reason


def test_choose_node_cxl_never_picks_the_memory_only_node():
    b = tree("cxl-memory-node")
    assert {c.node for c in nut.choose_node(backend=b).candidates} == {0, 1}
    assert nut.choose_node(gpu="0000:c1:00.0", backend=b).node == 1
    assert nut.choose_node(loads={0: 1}, backend=b).node == 1


def test_choose_node_container_cpuset():
    b = tree("container-cpuset")  # CPUs 20-27,52-59: node 1
    res = nut.choose_node(backend=b)
    assert res.node == 1 and [c.node for c in res.candidates] == [1]
    res = nut.choose_node(gpu="0000:17:00.0", backend=b)  # GPU on node 0
    assert res.node == 1 and res.gpu_node == 0 and "cpuset" in res.reason
    res = nut.choose_node(exclude=[1], backend=b)
    assert not res and res.node is None and "excluded: 1" in res.reason


def test_choose_node_after_binding_still_sees_the_cpuset():
    b = sim("dual-socket-8gpu")
    assert nu.bind_to_node(0, memory=None, backend=b)  # affinity now node 0 only
    res = nut.choose_node(loads={0: 5}, backend=b)
    assert [c.node for c in res.candidates] == [0, 1] and res.node == 1


def test_choose_node_sparse_ids():
    b = tree("sparse-ids")
    assert {c.node for c in nut.choose_node(backend=b).candidates} == {0, 8}
    assert nut.choose_node(gpu="0035:03:00.0", backend=b).node == 8
    assert nut.choose_node(loads={0: 3}, backend=b).node == 8
    assert nut.choose_node(loads={8: 3}, backend=b).node == 0
    assert nut.choose_node(exclude=[0], backend=b).node == 8
    assert nut.choose_node(exclude=[8], loads={0: 9}, backend=b).node == 0


def test_choose_node_dual_socket_loads_gpu_and_memory():
    b = tree("dual-socket-8gpu")
    assert nut.choose_node(loads={0: 4, 1: 3}, backend=b).node == 1
    res = nut.choose_node(loads={0: 3, 1: 4}, backend=b)
    assert res.node == 0 and "3 worker(s)" in res.reason
    assert "; 3 worker(s) already there (fewest among 2 fitting node(s))" in res.reason
    assert "page cache); 3 worker(s)" in res.reason  # no need_bytes: nothing needed
    # Equal loads and distances: the node with more memory available (node 1).
    assert nut.choose_node(loads={0: 2, 1: 2}, backend=b).node == 1
    # GPU 4 in PCI order is 0000:9b:00.0 on node 1: the GPU wins over loads.
    res = nut.choose_node(gpu=4, loads={1: 10}, backend=b)
    assert res.node == 1 and "9b:00.0" in res.reason
    assert res.reason.endswith("; 10 worker(s) already there")  # the GPU decided
    snap = nur.counters(backend=b)
    a0, a1 = snap[0].available_kb, snap[1].available_kb
    assert a0 < a1
    need = (a0 + 1) * 1024  # only node 1 fits
    res = nut.choose_node(need_bytes=need, loads={1: 5}, backend=b)
    assert res.node == 1 and [c.fits for c in res.candidates] == [False, True]
    needed = f"(MemFree + reclaimable page cache) for the {nu.format_kib(a0 + 1)} needed; "
    assert res.reason.endswith(needed + "5 worker(s) already there")
    res = nut.choose_node(gpu=0, need_bytes=need, backend=b)  # GPU 0 is on node 0
    assert res.node == 1 and "lacks the memory" in res.reason
    res = nut.choose_node(need_bytes=(a1 + 1) * 1024, backend=b)
    assert res.node == 1 and "no node has" in res.reason


def test_choose_node_memoryless_cpu_nodes_lose_on_distance():
    b = tree("memoryless-cpu-node")
    res = nut.choose_node(backend=b)
    assert res.node in (1, 2)
    c0 = next(c for c in res.candidates if c.node == 0)
    assert c0.memory_node in (1, 2) and c0.memory_distance == 12
    res = nut.choose_node(gpu=0, backend=b)  # GPU on memoryless node 0
    assert res.node == 0 and "nearest memory node" in res.reason


def test_choose_node_unknown_gpu_node_and_bad_gpu():
    b = tree("gpu-numa-unknown")
    res = nut.choose_node(gpu="0000:00:05.0", backend=b)
    assert res.gpu_node is None and "unknown" in res.reason
    assert nut.choose_node(gpu="0000:80:00.0", loads={1: 3}, backend=b).node == 1
    with pytest.raises(ValueError, match="no GPU 99"):
        nut.choose_node(gpu=99, backend=b)
    with pytest.raises(ValueError, match="no GPU at PCI address"):
        nut.choose_node(gpu="0000:ff:00.0", backend=b)
    with pytest.raises(TypeError):
        nut.choose_node(gpu=1.5, backend=b)


def test_choose_node_other_gpu_fixtures():
    assert nut.choose_node(gpu="0000:c1:00.0", backend=tree("four-node-asym")).node == 3
    assert nut.choose_node(gpu=4, backend=tree("mi300x-8gpu")).node == 1
    assert nut.choose_node(backend=tree("no-node-dir")).node == 0


# ---------------------------------------------------------------------------
# pin_for_cuda with a fake libcudart
# ---------------------------------------------------------------------------

FAKE_CUDART = r"""
#include <pthread.h>
#include <stddef.h>
#include <unistd.h>
#define MAXC 4096
int n_calls = 0, n_ok = 0, n_unreg = 0, fail_at = -1, fail_code = 2;
int in_flight = 0, max_in_flight = 0, delay_us = 0;
unsigned long long ok_ptr[MAXC], ok_size[MAXC], unreg_ptr[MAXC], tid[MAXC];
unsigned int call_flags[MAXC];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

int cudaHostRegister(void *p, size_t n, unsigned int flags) {
    pthread_mutex_lock(&mu);
    int i = n_calls++;
    if (++in_flight > max_in_flight) max_in_flight = in_flight;
    call_flags[i % MAXC] = flags;
    tid[i % MAXC] = (unsigned long long)pthread_self();
    pthread_mutex_unlock(&mu);
    if (delay_us) usleep(delay_us);
    pthread_mutex_lock(&mu);
    in_flight--;
    int rc = (i == fail_at) ? fail_code : 0;
    if (rc == 0) { ok_ptr[n_ok % MAXC] = (unsigned long long)p; ok_size[n_ok % MAXC] = n;
                   n_ok++; }
    pthread_mutex_unlock(&mu);
    return rc;
}

int cudaHostUnregister(void *p) {
    pthread_mutex_lock(&mu);
    unreg_ptr[n_unreg++ % MAXC] = (unsigned long long)p;
    pthread_mutex_unlock(&mu);
    return 0;
}

int current_device = 3, n_set = 0, set_device[MAXC];
int cudaGetDevice(int *dev) { *dev = current_device; return 0; }
int cudaSetDevice(int dev) {
    pthread_mutex_lock(&mu);
    set_device[n_set++ % MAXC] = dev;
    pthread_mutex_unlock(&mu);
    return 0;
}

const char *cudaGetErrorString(int rc) {
    return rc == 2 ? "out of memory (fake)" : "unknown error (fake)";
}
"""


class FakeCudart:
    def __init__(self, path):
        self.path = str(path)
        self.lib = ctypes.CDLL(self.path)  # the same handle pin_for_cuda gets

    def __getattr__(self, name):
        return ctypes.c_int.in_dll(self.lib, name).value

    def set(self, name, value):
        ctypes.c_int.in_dll(self.lib, name).value = value

    def array(self, name, n, ctype=ctypes.c_ulonglong):
        return list((ctype * 4096).in_dll(self.lib, name)[:n])

    def registered(self):
        return sorted(zip(self.array("ok_ptr", self.n_ok), self.array("ok_size", self.n_ok)))


@pytest.fixture
def fake_cudart(tmp_path):
    return FakeCudart(shared_library(FAKE_CUDART, tmp_path / "libcudart_fake.so"))


def test_pin_for_cuda_chunks_flags_threads_and_close(fake_cudart):
    length = 10 * MiB + 123
    buf = mmap.mmap(-1, length)
    addr = nu.buffer_range(buf)[0]
    fake_cudart.set("delay_us", 20000)
    with nur.pin_for_cuda(buf, chunk=MiB, threads=4, cudart=fake_cudart.path) as pin:
        assert pin and pin.reason is None and pin.threads == 4
        assert pin.flags == 1  # portable only
        regs = fake_cudart.registered()
        assert regs == list(pin.chunks) and len(regs) == 11
        assert regs[0][0] == addr and sum(n for _, n in regs) == length
        for (a, n), (b, _) in zip(regs, regs[1:]):
            assert a + n == b and b % mmap.PAGESIZE == 0  # contiguous, aligned
        assert all(n == MiB for _, n in regs[:-1]) and regs[-1][1] == 123
        assert set(fake_cudart.array("call_flags", 11, ctypes.c_uint)) == {1}
        assert 1 < len(set(fake_cudart.array("tid", 11))) <= 4
        assert fake_cudart.max_in_flight > 1  # the GIL was released
        # every other worker thread selected the caller's device (3), none stayed on
        # GPU 0; the calling thread registers too
        assert fake_cudart.n_set == 3 and set(fake_cudart.array("set_device", 3, ctypes.c_int)) == {
            3
        }
        assert fake_cudart.n_unreg == 0
    assert not pin and pin.closed
    assert sorted(fake_cudart.array("unreg_ptr", fake_cudart.n_unreg)) == [a for a, _ in regs]
    pin.close()  # idempotent
    assert fake_cudart.n_unreg == 11


def test_pin_for_cuda_unaligned_start_and_flags(fake_cudart):
    buf = mmap.mmap(-1, 4 * MiB)
    base = nu.buffer_range(buf)[0]
    pin = nur.pin_for_cuda(
        base + 100,
        3 * MiB,
        chunk=MiB + 5,
        threads=1,
        flags=nur.CudaHostRegisterFlag.PORTABLE,
        cudart=fake_cudart.path,
    )
    regs = fake_cudart.registered()
    assert regs[0] == (base + 100, MiB - 100)  # first edge on the chunk grid, aligned
    assert sum(n for _, n in regs) == 3 * MiB and pin.threads == 1
    assert set(fake_cudart.array("call_flags", len(regs), ctypes.c_uint)) == {1}
    pin.close()
    assert fake_cudart.n_unreg == len(regs)


def test_pin_for_cuda_error_rolls_back(fake_cudart):
    buf = mmap.mmap(-1, 8 * MiB)
    fake_cudart.set("fail_at", 3)
    pin = nur.pin_for_cuda(buf, chunk=MiB, threads=2, cudart=fake_cudart.path)
    assert not pin and pin.error == 2 and "out of memory (fake)" in pin.reason
    assert pin.chunks == ()
    ok = [a for a, _ in fake_cudart.registered()]
    assert fake_cudart.n_ok >= 3
    assert pin.progress.bytes == fake_cudart.n_ok * MiB  # the failed call pinned nothing
    assert sorted(fake_cudart.array("unreg_ptr", fake_cudart.n_unreg)) == sorted(ok)
    pin.close()
    assert fake_cudart.n_unreg == len(ok)
    fake_cudart.set("fail_at", fake_cudart.n_calls)  # the next call fails
    with pytest.raises(OSError, match="cudaHostRegister"):
        nur.pin_for_cuda(buf, chunk=MiB, threads=1, strict=True, cudart=fake_cudart.path)


def test_pin_for_cuda_accepts_a_loaded_library_and_empty_buffers(fake_cudart):
    pin = nur.pin_for_cuda(bytearray(0), cudart=fake_cudart.lib)
    assert pin and pin.chunks == () and fake_cudart.n_calls == 0
    assert pin.ready and not pin.closed
    # the prototype is set: a length past 4 GiB reaches the runtime whole
    register = fake_cudart.lib.cudaHostRegister
    assert register.argtypes == [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    assert register.restype is ctypes.c_int
    with pytest.raises(ValueError):
        nur.pin_for_cuda(bytearray(10), chunk=0, cudart=fake_cudart.lib)


def test_pin_for_cuda_not_available_is_a_value():
    buf = bytearray(MiB)
    pin = nur.pin_for_cuda(buf, cudart=os.path.join(os.sep, "nonexistent", "libcudart.so"))
    assert not pin and "CUDA not available" in pin.reason and "repr" not in repr(pin)
    libc = ctypes.util.find_library("c")
    if libc:
        pin = nur.pin_for_cuda(buf, cudart=libc)
        assert not pin and "lacks the CUDA runtime API" in pin.reason
    assert pin.ready and pin.closed and pin.chunks == ()
    with pytest.raises(FileNotFoundError):  # ENOENT: no runtime to register with
        nur.pin_for_cuda(buf, cudart="libcudart-does-not-exist.so", strict=True)
    # The default search never raises: registered where CUDA works, a reason otherwise.
    pin = nur.pin_for_cuda(buf)
    try:
        assert bool(pin) or pin.reason
    finally:
        pin.close()


def test_cudart_search_names_no_absolute_paths_without_torch(monkeypatch):
    monkeypatch.delitem(__import__("sys").modules, "torch", raising=False)
    names = nur._cudart_candidates(nu.LinuxBackend("/"))
    assert "libcudart.so.12" in names and "libcudart.so.13" in names
    assert not any(n.startswith("/") for n in names if n != ctypes.util.find_library("cudart"))


# ---------------------------------------------------------------------------
# status --format prometheus, with a textfile-collector format checker
# ---------------------------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(rf"^({_NAME})(\{{(?:{_LABEL}(?:,{_LABEL})*)?\}})? (\S+)$")
_TYPES = {"counter", "gauge", "untyped", "summary", "histogram"}


def check_textfile(text):
    """Problems with ``text`` as node_exporter textfile-collector input (empty: fine)."""
    problems = []
    if text and not text.endswith("\n"):
        problems.append("does not end with a newline")
    helped, typed, seen_series, finished = set(), {}, set(), set()
    current = None
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            m = re.match(rf"^# (HELP|TYPE) ({_NAME}) (.*)$", line)
            if not m:
                if line.startswith(("# HELP", "# TYPE")):
                    problems.append(f"{i}: malformed {line!r}")
                continue
            kind, name, rest = m.groups()
            if name in finished or (name != current and name in typed):
                problems.append(f"{i}: {name} metadata after its samples")
            if kind == "HELP":
                if name in helped:
                    problems.append(f"{i}: second HELP for {name}")
                helped.add(name)
            else:
                if name in typed:
                    problems.append(f"{i}: second TYPE for {name}")
                if rest not in _TYPES:
                    problems.append(f"{i}: unknown type {rest!r}")
                typed[name] = rest
            if current is not None and current != name:
                finished.add(current)
            current = name
            continue
        m = _SAMPLE.match(line)
        if not m:
            problems.append(f"{i}: not a sample line: {line!r}")
            continue
        name, labels, value = m.groups()
        if name not in typed:
            problems.append(f"{i}: sample of {name} before its TYPE")
        if name in finished:
            problems.append(f"{i}: {name} samples are not in one block")
        if current is not None and current != name:
            finished.add(current)
        current = name
        if typed.get(name) == "counter" and not name.endswith("_total"):
            problems.append(f"{i}: counter {name} does not end in _total")
        pairs = tuple(sorted(re.findall(_LABEL, labels or "")))
        names = [p.split("=", 1)[0] for p in pairs]
        if len(names) != len(set(names)):
            problems.append(f"{i}: repeated label name in {line!r}")
        series = (name, pairs)
        if series in seen_series:
            problems.append(f"{i}: duplicate series {line!r}")
        seen_series.add(series)
        try:
            float(value)
        except ValueError:
            problems.append(f"{i}: value {value!r} is not a float")
    return problems


@pytest.mark.parametrize(
    "bad, what",
    [
        ("m 1\n", "before its TYPE"),
        ("# TYPE m gauge\nm 1\nm 2\n", "duplicate series"),
        ('# TYPE m gauge\nm{a="1"} x\n', "not a float"),
        ("# TYPE m gauge\nm{a=1} 1\n", "not a sample line"),
        ('# TYPE m gauge\nm{1a="x"} 1\n', "not a sample line"),
        ('# TYPE m gauge\nm 1\n# TYPE n gauge\nn 1\nm{a="2"} 1\n', "not in one block"),
        ("# TYPE m counter\nm 1\n", "_total"),
        ("# TYPE m gauge\nm 1", "newline"),
        ("# TYPE m gauge\n# TYPE m gauge\nm 1\n", "second TYPE"),
        ("# TYPE m bogus\nm 1\n", "unknown type"),
    ],
)
def test_textfile_checker_catches(bad, what):
    assert any(what in p for p in check_textfile(bad)), check_textfile(bad)


def test_textfile_checker_accepts_the_spec_example():
    ok = (
        "# HELP http_requests_total The total.\n# TYPE http_requests_total counter\n"
        'http_requests_total{method="post",code="200"} 1027\n'
        'http_requests_total{method="post",code="400"} 3\n'
        '# TYPE x gauge\nx{path="C:\\\\dir\\"q\\"\\n"} +Inf\nx NaN\n'
    )
    assert check_textfile(ok) == []


@pytest.mark.parametrize("name", FIXTURES)
def test_prometheus_every_fixture(name, capsys):
    assert nu.main(["status", "--root", fixture_root(name), "--format", "prometheus"]) == 0
    text = capsys.readouterr().out
    assert check_textfile(text) == []
    topo = nu.read_topology(backend=tree(name))
    for n in topo.online_nodes:
        assert f'numa_utils_node_memory_total_bytes{{node="{n}"}} ' in text
    if name in NUMA_FIXTURES:
        assert "# TYPE numa_utils_node_numa_hit_pages_total counter" in text
    assert 'numa_utils_policy_syscalls_usable{reason="not the running system"} 0' in text
    assert text.count("numa_utils_gpu_info{") == len(topo.gpus)
    values = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert all(not math.isnan(float(v)) for v in values.values())


def test_prometheus_live_and_simulated():
    for b in (nu.LinuxBackend("/"), sim("dual-socket-8gpu")):
        text = cli._render_prometheus(cli.status_report(backend=b))
        assert check_textfile(text) == [], text
        assert "numa_utils_policy_syscalls_usable{" in text
    text = cli._render_prometheus(cli.status_report(backend=sim("dual-socket-8gpu")))
    assert 'numa_utils_policy_syscalls_usable{reason="ok"} 1' in text
    s = sim("dual-socket-8gpu")
    s.fail("get_mempolicy", errno.EPERM)
    text = cli._render_prometheus(cli.status_report(backend=s))
    assert re.search(r'numa_utils_policy_syscalls_usable\{reason="EPERM: [^"]*"\} 0', text)


def test_prometheus_label_escaping():
    w = cli._PromWriter()
    w.add("m", "gauge", "h", 1, a='x"y\\z\nw')
    assert w.text() == '# HELP m h\n# TYPE m gauge\nm{a="x\\"y\\\\z\\nw"} 1\n'
    assert check_textfile(w.text()) == []


# ---------------------------------------------------------------------------
# status: counters and advice
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURES)
def test_status_has_counters_every_fixture(name):
    rep = cli.status_report(backend=tree(name))
    assert {n["node"] for n in rep["counters"]["nodes"]} == {n["id"] for n in rep["nodes"]}
    text = cli._render_status(rep)
    assert ("COUNTERS (numastat since boot, pages)" in text) == (name in NUMA_FIXTURES)
    json.dumps(rep)


def _warnings(b):
    return "\n".join(cli.status_report(backend=b)["warnings"])


def test_status_hugepages_on_one_node_only():
    assert "huge pages are configured on node 0 only" in _warnings(tree("sparse-ids"))
    assert "configured on node" not in _warnings(tree("dual-socket-8gpu"))  # both nodes
    assert "configured on node" not in _warnings(tree("gh200"))  # one CPU node only


def test_status_gpu_node_without_free_memory():
    node1 = "/sys/devices/system/node/node1/meminfo"
    text = fixture_text("dual-socket-8gpu", "root" + node1)
    text = re.sub(r"(MemFree:\s+)\d+", r"\g<1>1024", text)
    text = re.sub(r"((?:Active|Inactive)\(file\):\s+)\d+", r"\g<1>0", text)
    w = _warnings(Overlay(fixture_root("dual-socket-8gpu"), {node1: text}))
    assert w.count("its node 1 has") == 4 and "(< 5%)" in w
    assert "its node 0 has" not in w
    assert "(< 5%)" not in _warnings(tree("dual-socket-8gpu"))
    assert "its node 0 has no memory; host buffers for it come from node 1" in _warnings(
        tree("memoryless-cpu-node")
    )


def test_status_thp_always_with_interleaved_region():
    s = sim("dual-socket-8gpu")  # THP [always]
    buf = mmap.mmap(-1, 32 * 4096)
    assert nu.interleave(buf, nodes=[0, 1], backend=s)
    s.touch(nu.buffer_range(buf)[0], 32 * 4096)
    rep = cli.status_report(backend=s)
    assert any("THP is 'always'" in w for w in rep["warnings"])
    assert rep["process"]["remote_share"]["total_bytes"] == 32 * 4096
    assert "PROCESS PAGES" in cli._render_status(rep)
    reads = []
    real = s.read_text

    def counting(path):
        reads.append(path)
        return real(path)

    s.read_text = counting  # status reads and parses numa_maps once
    cli.status_report(backend=s)
    assert reads.count("/proc/self/numa_maps") == 1
    s2 = sim("four-node-asym")  # THP [madvise]
    buf2 = mmap.mmap(-1, 32 * 4096)
    assert nu.interleave(buf2, backend=s2)
    s2.touch(nu.buffer_range(buf2)[0], 32 * 4096)
    assert "THP is 'always'" not in _warnings(s2)


def test_status_process_mostly_remote():
    base = sim("dual-socket-8gpu")
    p = base.process(cpus_allowed=_node_cpus(base, 0))
    buf = mmap.mmap(-1, 64 * 4096)
    assert nu.bind(buf, [1], backend=p)
    p.touch(nu.buffer_range(buf)[0], 64 * 4096)
    assert "100% of its pages" in _warnings(p)
    q = base.process(cpus_allowed=_node_cpus(base, 1))
    buf2 = mmap.mmap(-1, 64 * 4096)
    assert nu.bind(buf2, [1], backend=q)
    q.touch(nu.buffer_range(buf2)[0], 64 * 4096)
    assert "of its pages" not in _warnings(q)
