# SPDX-License-Identifier: Apache-2.0
"""What real machines' trees broke (issue 19, items 4-6), one named test each.  The
trees are built here in tmp_path, reduced by hand from the real dumps each test names:
only the files the finding needs, with the dump's own values."""

import contextlib
import io
import json
import os

import pytest
from conftest import nu, saved_backend

NODE = "sys/devices/system/node"
CPU = "sys/devices/system/cpu"
TIER = "sys/devices/virtual/memory_tiering"
WI = "sys/kernel/mm/mempolicy/weighted_interleave"


def _write(root, files):
    """``files``: relative path -> text, or ("link", target) for a symlink."""
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, tuple):
            os.symlink(content[1], p)
        else:
            p.write_text(content)
    return root


def _cpus(n, node=None, **extra):
    """cpu0..cpu{n-1}, one core each, package 0, a private L2 (index2)."""
    files = {f"{CPU}/online": f"0-{n - 1}\n", f"{CPU}/possible": f"0-{n - 1}\n"}
    for c in range(n):
        t = f"{CPU}/cpu{c}/topology"
        files.update(
            {
                f"{t}/core_id": f"{c}\n",
                f"{t}/physical_package_id": "0\n",
                f"{t}/thread_siblings_list": f"{c}\n",
            }
        )
        if node is not None:
            files[f"{CPU}/cpu{c}/node{node}"] = ("link", f"../../node/node{node}")
    files.update(extra)
    return files


def _status(root):
    """status --json over ``root``: (exit status, report, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = nu.main(["status", "--json", "--root", str(root)])
    return rc, (json.loads(out.getvalue()) if out.getvalue() else None), err.getvalue()


# -- item 4: node lists that name offline or absent nodes -------------------------------


def _offline_node0(tmp_path):
    """hwloc's tests/hwloc/linux/offline-cpu0-node0, reduced: node 0 is offline (no
    node0 folder, online = 1) while has_memory and has_normal_memory say 0-1 and
    node1/distance has a column per possible node; plus the other lists the kernel
    publishes that can name it (tiers, HMAT initiators, weighted_interleave)."""
    files = _cpus(4, node=1)
    files.update(
        {
            f"{NODE}/online": "1\n",
            f"{NODE}/possible": "0-1\n",
            f"{NODE}/has_memory": "0-1\n",
            f"{NODE}/has_normal_memory": "0-1\n",
            f"{NODE}/has_cpu": "0-1\n",
            f"{NODE}/node1/cpulist": "0-3\n",
            f"{NODE}/node1/distance": "21 10\n",
            f"{NODE}/node1/meminfo": "Node 1 MemTotal:       67108864 kB\n"
            "Node 1 MemFree:        57913400 kB\n",
            f"{TIER}/memory_tier4/nodelist": "0-1\n",
            f"{NODE}/node1/access0/initiators/read_bandwidth": "100000\n",
            f"{NODE}/node1/access0/initiators/node0": ("link", "../../../node0"),
            f"{NODE}/node1/access0/initiators/node1": ("link", "../../../node1"),
            f"{WI}/node0": "3\n",
            f"{WI}/node1": "1\n",
            f"{WI}/node9": "5\n",
        }
    )
    return _write(tmp_path / "offline-cpu0-node0", files)


def test_offline_node_in_kernel_lists_is_cut_once_with_a_warning(tmp_path):
    root = _offline_node0(tmp_path)
    t = nu.read_topology(backend=saved_backend(str(root)))
    assert set(t.nodes) == {1}
    assert t.nodes_with_memory == t.nodes_with_cpus == frozenset({1})
    assert t.nodes[1].has_normal_memory is True
    assert dict(t.nodes[1].distances) == {1: 10}
    assert dict(t.memory_tiers) == {4: frozenset({1})}
    assert t.nodes[1].access.initiators == frozenset({1})
    # node 0 is possible (the kernel has a weight file for it: no warning); node 9 is not
    assert dict(t.interleave_weights) == {1: 1}
    for what in (
        "has_memory",
        "has_normal_memory",
        "has_cpu",
        "node1/distance",
        "memory_tier4/nodelist",
        "access0/initiators",
        "weighted_interleave",
    ):
        assert any(what in p and "not online" in p for p in t.problems), (what, t.problems)
    assert not any("weighted_interleave" in p and "node 0," in p for p in t.problems)
    choice = nu.memory_node_choice(t)  # KeyError: 0 before the lists were cut
    assert choice.nodes == frozenset({1})
    rc, rep, err = _status(root)
    assert rc == 0, err
    assert rep["default_memory_nodes"]["nodes"] == [1]
    assert any("has_memory names node 0" in w for w in rep["warnings"]), rep["warnings"]


def test_online_smaller_than_has_memory_gives_a_report(tmp_path):
    files = _cpus(2, node=0)
    files.update(
        {
            f"{NODE}/online": "0\n",
            f"{NODE}/has_memory": "0-1\n",
            f"{NODE}/node0/cpulist": "0-1\n",
            f"{NODE}/node0/distance": "10\n",
            f"{NODE}/node1/cpulist": "\n",
        }
    )
    rc, rep, err = _status(_write(tmp_path / "t", files))
    assert rc == 0, err
    assert rep["kernel"]["nodes_with_memory"] == [0]
    assert any("has_memory names node 1, not online" in w for w in rep["warnings"])


@pytest.mark.parametrize("size", ["32Q", "1T", "٣K", "9" * 5000, "-1K", "K"])
def test_cache_size_with_unknown_suffix_is_a_warning(tmp_path, size):
    idx = f"{CPU}/cpu0/cache/index2"
    files = _cpus(
        1,
        **{
            f"{idx}/level": "2\n",
            f"{idx}/type": "Unified\n",
            f"{idx}/shared_cpu_list": "0\n",
            f"{idx}/size": size + "\n",
        },
    )
    rc, rep, err = _status(_write(tmp_path / "t", files))
    assert rc == 0, err
    assert rep["last_level_caches"] == [{"level": 2, "size_kb": None, "cpus": [0]}]
    assert any("invalid cache size" in w and f"{idx}/size" in w for w in rep["warnings"])
    assert max(map(len, rep["warnings"])) < 300
    (tmp_path / "t" / idx / "size").write_text("1024K\n")
    assert _status(tmp_path / "t")[1]["last_level_caches"][0]["size_kb"] == 1024


@pytest.mark.parametrize("folder", ["sys", "sys/devices/system", NODE, "sys/kernel/mm", WI])
def test_folder_linking_to_itself_gives_a_report(tmp_path, folder):
    """Found by mutating hwloc's 8em64t-2s2ca2c-buggynuma (status --json exit 2, no
    report): a folder replaced by a link to itself."""
    files = _cpus(2, node=0)
    files.update(
        {
            f"{NODE}/online": "0\n",
            f"{NODE}/node0/cpulist": "0-1\n",
            f"{WI}/node0": "1\n",
            "proc/meminfo": "MemTotal: 1024 kB\n",
        }
    )
    root = _write(tmp_path / "t", files)
    target = root / folder
    if target.exists():
        os.rename(target, str(target) + ".aside")
    target.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target.name, target)
    rc, rep, err = _status(root)
    assert rc == 0, err
    assert any("Too many levels of symbolic links" in w for w in rep["warnings"]), rep["warnings"]


# -- item 5: core_id per CPU -------------------------------------------------------------


def test_core_id_is_read_per_cpu_not_taken_from_a_sibling(tmp_path):
    """util-linux tests/ts/lscpu/dumps (Opteron 6328): cpu0 and cpu1 are thread
    siblings (thread_siblings_list 0-1, one Bulldozer compute unit) with core_id 0
    and 1; lscpu reports 16 distinct cores for 16 CPUs."""
    files = _cpus(4)
    for c in range(4):
        t = f"{CPU}/cpu{c}/topology"
        pair = "0-1" if c < 2 else "2-3"
        files[f"{t}/thread_siblings_list"] = pair + "\n"
    root = _write(tmp_path / "t", files)
    t = nu.read_topology(backend=saved_backend(str(root)))
    assert [t.cpus[c].core for c in range(4)] == [0, 1, 2, 3]
    assert t.cpus[1].siblings == frozenset({0, 1}) and t.cpus[1].package == 0


# -- item 6: caches with only shared_cpu_map ---------------------------------------------


def test_cache_sharing_falls_back_to_shared_cpu_map(tmp_path):
    """The POWER7 and ppc-qemu lscpu dumps: cache/index*/shared_cpu_map, no
    shared_cpu_list (kernels before 2.6.30 had only the map)."""
    files = _cpus(4)
    for c in range(4):
        idx = f"{CPU}/cpu{c}/cache/index2"
        files.update(
            {
                f"{idx}/level": "3\n",
                f"{idx}/type": "Unified\n",
                f"{idx}/size": "4096K\n",
                f"{idx}/shared_cpu_map": "00000003\n" if c < 2 else "0000000c\n",
            }
        )
    root = _write(tmp_path / "t", files)
    t = nu.read_topology(backend=saved_backend(str(root)))
    assert t.cpus[0].llc == t.cpus[1].llc == frozenset({0, 1})
    assert t.cpus[3].llc == frozenset({2, 3})
    rc, rep, err = _status(root)
    assert rc == 0, err
    assert rep["last_level_caches"] == [
        {"level": 3, "size_kb": 4096, "cpus": [0, 1]},
        {"level": 3, "size_kb": 4096, "cpus": [2, 3]},
    ]
