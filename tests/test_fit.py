"""fit(): its verdicts against what the simulated kernel then does, its limits and
reasons, SharedRegion.create's refusal, the CLI, and a real small /dev/shm."""

import errno
import json
import os
import subprocess
import sys

import pytest
from conftest import (
    FIXTURES,
    IN_PRIVATE_SHM,
    MapLimited,
    fixture_root,
    hook_call,
    nu,
    nur,
    saved_backend,
    sim,
)

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("NUMA_UTILS_") or name in ("NUMA_NODES",):
            monkeypatch.delenv(name)


# Each tree with what limits it: small free memory per node (free_kb), huge pages on
# some nodes only, a cgroup, a small /dev/shm.
TREES = {
    "qemu-x86_64-two-node": dict(free_kb={0: 48 << 10, 1: 12 << 10}, shm_size=40 * MiB),
    "four-node-asym": dict(
        free_kb={0: 20 << 10, 1: 20 << 10, 2: 20 << 10, 3: 4 << 10}, cgroup={"memory.max": 30 * MiB}
    ),
    "dual-socket-8gpu": dict(
        free_kb={0: 40 << 10, 1: 40 << 10},
        cgroup={"hugetlb.2MB.max": 24 * MiB, "memory.high": 60 * MiB},
    ),
    "sparse-ids": dict(
        free_kb={
            0: 30 << 10,
            250: 30 << 10,
            251: 30 << 10,
            252: 30 << 10,
            253: 30 << 10,
            254: 30 << 10,
            255: 30 << 10,
        },
        shm_size=16 * MiB,
    ),
    "single-node": dict(free_kb={0: 24 << 10}, cgroup={"memory.high": 20 * MiB}),
}
assert set(TREES) <= set(FIXTURES)


def node_sets(name):
    mem = sorted(nu.read_topology(backend=sim(name)).nodes_with_memory)
    return [None, mem[:1], mem[-1:], mem[:2]] if len(mem) > 1 else [None, mem]


def outcome(name, size, nodes, hugepages, kind, required, monkeypatch):
    """What the simulated kernel does with the allocation when nothing checks first:
    (created and prefaulted, and huge pages as asked on every node; per-node bytes)."""
    b = sim(name, **TREES[name])
    monkeypatch.setattr(nur, "_fit_or_raise", lambda *a: (hugepages, None))
    try:
        r = nur.SharedRegion.create(
            "m", size, policy="interleave", nodes=nodes, hugepages=hugepages, kind=kind, backend=b
        )
    except OSError:
        return False, None
    finally:
        monkeypatch.undo()
    with r:  # all that create maps, the record's room too: what fit() weighs
        placed = nu.placement(r.address, r._mapped, backend=b)
        obj = next(o for o in b.kernel.objects.values() if o.npages)
        served = hugepages != "thp" or obj.thp
        return served or not required, placed


CASES = [
    (t, n, h, k, req)
    for t in TREES
    for n in node_sets(t)
    for h in (False, "2M", "1G", "thp")
    for k in ("sysv", "posix")
    for req in (True, False)
]


@pytest.mark.parametrize("size", [8 * MiB, 20 * MiB])
@pytest.mark.parametrize(
    "tree,nodes,huge,kind,required",
    CASES,
    ids=[f"{t}-{n}-{h}-{k}-{'req' if r else 'fallback'}" for t, n, h, k, r in CASES],
)
def test_fit_verdict_is_what_the_simulated_allocation_does(
    tree, nodes, huge, kind, required, size, monkeypatch
):
    b = sim(tree, **TREES[tree])
    try:
        verdict = nur.fit(
            size, nodes=nodes, hugepages=huge, kind=kind, hugepages_required=required, backend=b
        )
    except ValueError:  # hugetlb on /dev/shm: refused as an argument
        assert huge not in (False, "thp") and kind == "posix"
        return
    use = huge if verdict.hugepages != "off" or huge == "thp" else False
    if verdict.hugepages_fallback and huge != "thp":
        use = False
    ok, placed = outcome(tree, size, nodes, use, kind, required, monkeypatch)
    if ok and huge not in (False, "thp") and use and required:
        ok = placed == {f.node: f.needed for f in verdict.nodes if f.needed}
    assert bool(verdict) == ok, verdict.reason
    if ok and verdict.exact:
        assert placed == {f.node: f.needed for f in verdict.nodes if f.needed}
    if not verdict:
        assert verdict.reason and ":" in verdict.reason


def test_matrix_has_both_verdicts():
    # The matrix is only a check if some cases fit and some do not, for every reason.
    seen = {}
    for t, n, h, k, req in CASES:
        try:
            r = nur.fit(
                20 * MiB,
                nodes=n,
                hugepages=h,
                kind=k,
                hugepages_required=req,
                backend=sim(t, **TREES[t]),
            )
        except ValueError:
            continue
        seen.setdefault(bool(r), set()).add(r.reason.split(" (")[0][:40])
    assert len(seen[True]) >= 2 and len(seen[False]) >= 4, seen


def test_limits_name_their_source_and_fix():
    b = sim("qemu-x86_64-two-node", shm_size=64 * MiB, cgroup={"memory.max": 100 * MiB})
    r = nur.fit(256 * MiB, kind="posix", backend=b)
    assert not r
    assert r.reason.startswith("256.0 MiB needed, /dev/shm allows 64.0 MiB")
    # 256 MiB of data and the record's room: 257m.
    assert "/dev/shm is a 64.0 MiB tmpfs" in r.reason and "--shm-size=257m" in r.reason
    assert "kind='sysv'" in r.reason
    names = {x.name: x for x in r.limits}
    assert names["cgroup memory.max"].source == "/sys/fs/cgroup/sim/memory.max"
    assert names["cgroup memory.max"].allows == 100 * MiB
    r = nur.fit(200 * MiB, kind="sysv", backend=b)  # /dev/shm does not apply
    assert not r and "memory.max allows 100.0 MiB" in r.reason and "docker" in r.reason


def test_memory_current_is_subtracted_and_nodes_report_both_sides():
    b = sim("qemu-x86_64-two-node", cgroup={"memory.max": 40 * MiB})
    with nur.SharedRegion.create("a", 16 * MiB, policy="interleave", backend=b):
        r = nur.fit(30 * MiB, backend=b.process())
        assert not r and "allows 24.0 MiB" in r.reason
        # Both regions' records' rooms count: 40 MiB - 16 MiB - two rooms.
        assert nur.fit(24 * MiB - 2 * nur._RECORD_ROOM, backend=b.process())
        assert not nur.fit(24 * MiB - nur._RECORD_ROOM + 4096, backend=b.process())
    n = {f.node: f for f in nur.fit(8 * MiB, backend=b).nodes}
    assert n[0].needed == 4 * MiB + nur._RECORD_ROOM and n[1].needed == 4 * MiB
    assert n[0].available > 4 * MiB


def test_hugepages_required_names_node_and_counts_and_fallback_says_why():
    b = sim("sparse-ids")  # 2 MiB pages on node 0 only
    r = nur.fit(8 * MiB, nodes=[0, 250], hugepages="2M", backend=b)
    assert not r and "250" in r.reason and "hugepages_required=False" in r.reason
    r = nur.fit(8 * MiB, nodes=[0, 250], hugepages="2M", hugepages_required=False, backend=b)
    assert r and r.hugepages == "off" and "250" in r.hugepages_fallback
    ok = nur.fit(8 * MiB, nodes=[0], hugepages="2M", backend=b)
    # 8 MiB of data: the record is in a record segment of base pages, no huge page
    assert ok and ok.hugepages == "2048kB" and ok.nodes[0].needed == 8 * MiB
    with pytest.raises(OSError, match="node.*250"):
        nur.SharedRegion.create(
            "h", 8 * MiB, nodes=[0, 250], hugepages="2M", policy="interleave", backend=b
        )
    with nur.SharedRegion.create(
        "h",
        8 * MiB,
        nodes=[0, 250],
        hugepages="2M",
        policy="interleave",
        hugepages_required=False,
        backend=b,
    ) as reg:
        assert reg.page_size == 4096 and "250" in reg.hugepages_fallback


def test_create_refuses_before_making_anything():
    b = sim("qemu-x86_64-two-node", shm_size=64 * MiB)
    with pytest.raises(OSError) as e:
        nur.SharedRegion.create("big", 256 * MiB, kind="posix", backend=b)
    assert e.value.errno == errno.ENOSPC and "--shm-size" in str(e.value)
    assert not b.kernel.files and not b.kernel.objects
    assert {call[0] for call in b.kernel.calls} <= {"get_mempolicy"}  # a read: placed_by


def test_thp_mode_and_env_default(monkeypatch):
    b = sim("qemu-x86_64-two-node")
    r = nur.fit(8 * MiB, hugepages="thp", backend=b)
    assert not r and "shmem_enabled" in r.reason
    monkeypatch.setenv("NUMA_UTILS_NUMA_HUGEPAGES", "thp")
    r = nur.fit(8 * MiB, hugepages_required=False, backend=b)
    assert r and r.hugepages == "off" and "shmem THP" in r.hugepages_fallback
    assert r.thp == {"enabled": nu.read_topology(backend=b).thp, "defrag": r.thp["defrag"]}


def test_overcommit_shmmax_and_memlock_limits(tmp_path):
    root = tmp_path / "root"
    for path, text in {
        "proc/sys/vm/overcommit_memory": "2\n",
        "proc/sys/kernel/shmmax": str(32 * MiB),
        "proc/sys/kernel/shmall": "1000000",
        "proc/meminfo": "MemTotal: 1000000 kB\nMemFree: 900000 kB\n"
        "CommitLimit: 500000 kB\n"
        "Committed_AS: 480000 kB\n",
        "proc/self/limits": "Max locked memory         8388608       8388608      bytes\n",
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    b = saved_backend(str(root))
    hook_call(b, "geteuid", lambda: 1000)  # root (CAP_IPC_LOCK) has no memlock limit
    r = nur.fit(64 * MiB, policy="default", kind="sysv", pin=True, backend=b)
    names = {x.name: x.allows for x in r.limits}
    assert names["kernel.shmmax"] == 32 * MiB and names["RLIMIT_MEMLOCK"] == 8 * MiB
    assert names["vm.overcommit_memory=2"] == 20000 * 1024
    assert not r and "RLIMIT_MEMLOCK allows 8.0 MiB" in r.reason  # the tightest
    assert "kernel.shmall" in names


def _cli(*args):
    return subprocess.run(
        [sys.executable, nu.__file__, *args], capture_output=True, text=True, timeout=60
    )


def test_cli_fit_exit_codes_and_json(tmp_path):
    root = fixture_root("qemu-x86_64-two-node")
    p = _cli("fit", "64M", "--root", root, "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["ok"] is True and {n["node"] for n in data["nodes"]} == {0, 1}
    p = _cli("fit", "64G", "--root", root, "--nodes", "1")
    assert p.returncode == 1 and "needed" in p.stdout
    p = _cli("fit", "64M", "--root", root, "--huge", "2M", "--kind", "sysv")
    assert p.returncode == 1 and "huge pages" in p.stdout


@pytest.mark.private_shm
def test_host_small_dev_shm_refuses_posix_region_and_leaves_nothing():
    assert IN_PRIVATE_SHM
    p = subprocess.run(
        ["mount", "-o", "remount,size=64m", "/dev/shm"], capture_output=True, text=True
    )
    if p.returncode != 0:
        pytest.skip(f"cannot remount /dev/shm with 64 MiB: {p.stderr.strip()}")
    before = sorted(os.listdir("/dev/shm"))
    r = nur.fit(256 * MiB, kind="posix")
    assert not r and "/dev/shm is a 64.0 MiB tmpfs" in r.reason
    with pytest.raises(OSError) as e:
        nur.SharedRegion.create("fit-test", 256 * MiB, kind="posix")
    assert e.value.errno == errno.ENOSPC and "--shm-size" in str(e.value)
    assert sorted(os.listdir("/dev/shm")) == before
    with nur.SharedRegion.create("fit-test", 32 * MiB, kind="posix") as ok:
        assert ok.prefaulted["bytes"] == 32 * MiB
    assert sorted(os.listdir("/dev/shm")) == before


@pytest.mark.parametrize("size", [-5, 0, True, 1.5, "1G", None, 2**70])
def test_fit_refuses_a_size_create_refuses(size):
    # 26.19: fit(-5), fit(0) and fit(True) said "fits"; fit(1.5) and fit("1G") raised
    # TypeErrors from deep inside.  fit checks the size as create does.
    with pytest.raises(ValueError, match="size"):
        nur.fit(size, backend=sim("dual-socket-8gpu"))


def test_fit_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="kind must be 'sysv' or 'posix'"):
        nur.fit(4096, kind="file", backend=sim("dual-socket-8gpu"))


def test_fit_counts_a_layouts_vmas_against_max_map_count():
    """Issue 27: fit() says how many memory mappings a layout takes and whether
    vm.max_map_count leaves them, and create does what it says."""
    b = MapLimited(
        fixture_root("dual-socket-8gpu"), limit=3000, mapped=500
    )  # 3000 - 500 - 750 kept: 1,750 free
    lay = "blocks:4K:bind:0/1"
    many = nur.fit(16 * MiB, layout=lay, backend=b)  # 4,096 alternating blocks
    assert (many.vmas, many.vmas_free) == (
        nur.Layout.parse(lay).bound(16 * MiB, 4096).vmas + 1,
        1750,
    )
    # Issue 40: past the limit the prefaulting threads place it, and fit says so.
    assert many and many.exact and many.placed_by == "thread"
    assert many.to_json()["vmas"] == 4097 and many.to_json()["vmas_free"] == 1750
    with nur.SharedRegion.create("many", 16 * MiB, layout=lay, strict=True, backend=b) as r:
        assert r.policy.placed_by == "thread"
    few = nur.fit(1 * MiB, layout=nur.Layout.parse(lay), backend=b)
    assert few.exact and (few.vmas, few.vmas_free) == (257, 1750) and few.placed_by == "policy"
    with nur.SharedRegion.create("few", 1 * MiB, layout=lay, strict=True, backend=b) as r:
        assert r.policy.placed_by == "policy" and r.to_json()["vmas"] + 1 == few.vmas
    b.fail("get_mempolicy", errno.EPERM, times=1)  # the policy syscalls denied: by thread
    assert nur.fit(1 * MiB, layout=lay, backend=b).placed_by == "thread"
    plain = nur.fit(16 * MiB, policy="interleave", nodes=[0, 1], backend=b)
    assert plain.exact and plain.vmas == 2
    with pytest.raises(ValueError, match="layout= or nodes="):
        nur.fit(1 * MiB, layout=lay, nodes=[0], backend=b)
    with pytest.raises(ValueError, match="whole 4K pages"):
        nur.fit(1 * MiB, layout="blocks:6K:bind:0/1", backend=b)


def test_cli_fit_layout_json_carries_vmas():
    root = fixture_root("qemu-x86_64-two-node")
    p = _cli("fit", "16M", "--root", root, "--layout", "blocks:4K:bind:0/1", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["vmas"] == 4097 and "vmas_free" in data
    p = _cli("fit", "16M", "--root", root, "--layout", "blocks:4K:bind:0/1")
    assert "memory mappings (VMAs): needs 4097" in p.stdout, p.stdout + p.stderr


def _irregular(count):
    """``count`` extents of 4, 8 and 12 KiB bound in turn to nodes 0 and 1."""
    return nur.Layout.extents([((i % 3 + 1) * 4096, "bind", i % 2) for i in range(count)])


def test_fit_weighs_the_identity_record_a_layout_takes():
    # The layout's text goes into the identity record, whose room is fixed: fit
    # refuses a layout whose record would not fit it, naming the limit, and create
    # refuses it before making anything.
    b = sim("dual-socket-8gpu")
    lay = _irregular(3000)
    verdict = nur.fit(lay.size, layout=lay, backend=b)
    assert not verdict and not verdict.exact, verdict.reason
    assert "identity record" in verdict.reason and f"{nur._RECORD_MAX} bytes" in verdict.reason
    with pytest.raises(ValueError, match="identity record") as e:
        nur.SharedRegion.create("long", lay.size, layout=lay, backend=b)
    assert f"{nur._RECORD_MAX} bytes" in str(e.value)
    assert not b.kernel.shm and not b.kernel.objects
    assert "shmget" not in [name for name, _ in b.kernel.calls]
    # What fit accepts, create makes.
    lay = _irregular(1000)
    assert nur.fit(lay.size, layout=lay, backend=b).exact
    with nur.SharedRegion.create("long", lay.size, layout=lay, backend=b) as r:
        assert len(r.layout) == 1000
