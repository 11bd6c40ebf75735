# SPDX-License-Identifier: Apache-2.0
"""Text output an operator reads at a glance (issue 15): node counts, hugepage
columns, the CPU/cache summary, one unit family in the prefault bar, the `maps`
verdict column, `region --no-prefault`, and "node" vs "nodes"."""

import io
import json
import re

import pytest
from conftest import FIXTURES, cli, fixture_root, fixture_text, nu, nusim, saved_backend, sim


def _status_text(name):
    return cli._render_status(cli.status_report(backend=saved_backend(fixture_root(name))))


@pytest.mark.parametrize("name", FIXTURES)
def test_nodes_line_counts_and_lists(name):
    rep = cli.status_report(backend=saved_backend(fixture_root(name)))
    lines = cli._render_status(rep).splitlines()
    line = next(ln for ln in lines if ln.startswith("NODES:"))
    assert f"PACKAGES: {rep['packages']['evidence']}" in lines  # every machine has one
    k = rep["kernel"]
    m = re.match(
        r"NODES: (\d+) online \((.*?)\) of (\d+) possible \((.*?)\); CPUs on "
        r"(nodes?) (\S+); memory on (nodes?) (\S+)$",
        line,
    )
    assert m, line
    assert int(m.group(1)) == len(rep["nodes"])
    assert int(m.group(3)) == len(k["possible_nodes"]) >= 1
    assert nu.parse_cpulist(m.group(4)) == set(k["possible_nodes"])
    for word, ids, key in (
        (m.group(5), m.group(6), "nodes_with_cpus"),
        (m.group(7), m.group(8), "nodes_with_memory"),
    ):
        assert word == ("node" if len(k[key]) == 1 else "nodes"), line
        assert ids == (nu.format_cpulist(k[key]) or "-")


def test_hugepages_say_which_number_is_free():
    text = _status_text("dual-socket-8gpu")
    assert "hugepages (free/total)" in text
    node0 = json.loads(fixture_text("dual-socket-8gpu", "expected.json"))
    hp = {int(k): v for k, v in node0["nodes"][0]["hugepages"].items()}
    h2m = hp[2048]
    assert h2m["free"] != h2m["total"]  # the fixture tells them apart
    assert f"2M: {h2m['free']} free/{h2m['total']}" in text


def _llc_from_files(root, cpu):
    """(level, size text) of the highest cache level of ``cpu``, read directly from
    the archive's entries."""
    files = nusim.SavedArchive(root).files
    d = f"root/sys/devices/system/cpu/cpu{cpu}/cache/"
    best = (0, None)
    for rel in files:
        if rel.startswith(d + "index") and rel.endswith("/level"):
            lvl = int(files[rel])
            size = files.get(rel[:-5] + "size")
            if lvl > best[0]:
                best = (lvl, size.decode().strip() if size is not None else None)
    return best


@pytest.mark.parametrize(
    "name",
    ["dual-socket-8gpu", "single-node", "sparse-ids", "old-kernel-cpumap", "qemu-x86_64-two-node"],
)
def test_cpu_summary_like_lscpu(name):
    root = fixture_root(name)
    rep = cli.status_report(backend=saved_backend(root))
    line = next(ln for ln in cli._render_status(rep).splitlines() if ln.startswith("CPUs:"))
    cpus = [c for c in rep["cpus"].values() if c["online"]]
    packages = {c["package"] for c in cpus}
    cores = {p: {c["core"] for c in cpus if c["package"] == p} for p in packages}
    per_pkg = sorted({len(v) for v in cores.values()})
    threads = sorted({len(c["siblings"]) or 1 for c in cpus})

    def n(vals, word):
        txt = str(vals[0]) if len(vals) == 1 else f"{vals[0]}-{vals[-1]}"
        return f"{txt} {word}{'' if vals[-1] == 1 else 's'}"

    assert line.startswith(
        f"CPUs: {n([len(packages)], 'package')} x {n(per_pkg, 'core')} x {n(threads, 'thread')}"
    ), line
    llcs = {frozenset(c["llc"]) for c in cpus if c["llc"]}
    assert len(rep["last_level_caches"]) == len(llcs)
    assert f"LLC: {len(llcs)} x " in line
    level, size = _llc_from_files(root, min(min(x) for x in llcs))
    assert f"L{level}" in line
    if size:  # "32768K" -> "32 MiB"
        kb = int(size.rstrip("K"))
        assert rep["last_level_caches"][0]["size_kb"] == kb
        assert nu.format_kib(kb).replace(".0 ", " ") + f" L{level}" in line


def test_progress_bar_one_unit_family():
    out = io.StringIO()
    show = cli._progress_bar(out)
    show(1 << 30, 2 << 30)
    show(2 << 30, 2 << 30)
    text = out.getvalue()
    assert "2.00/2.00 GiB" in text and "GiB/s" in text
    assert not re.search(r"\bGB/s|\bGB\b", text), text


def _region_cli(monkeypatch, capsys, *argv):
    s = sim("dual-socket-8gpu")
    with nu.use_backend(s):
        assert nu.main(["region", *argv]) == 0
    return capsys.readouterr(), s


def test_region_no_prefault_says_so(monkeypatch, capsys):
    out, s = _region_cli(monkeypatch, capsys, "np", "4M", "--policy", "interleave", "--no-prefault")
    assert "()" not in out.out
    assert "placement: nothing faulted in yet: --no-prefault" in out.out
    assert s.read_text("/proc/sysvipc/shm").count("\n") == 1  # destroyed


def test_region_prefault_units_and_placement(monkeypatch, capsys):
    out, _ = _region_cli(
        monkeypatch, capsys, "pf", "4M", "--policy", "interleave", "--threads", "1"
    )
    assert "GiB/s" in out.out and "GB/s" not in out.out
    assert "GB/s" not in out.err and "GiB" in out.err
    assert (
        "placement: interleaved 50.0/50.0 over nodes 0-1 (node 0: 2.0 MiB, "
        "node 1: 2.0 MiB)" in out.out
    )


def test_maps_verdict_column_stays_in_line(tmp_path, capsys):
    long = "/opt/models/" + "a-very-long-directory-name/" * 4 + "model.safetensors"
    text = (
        f"7f0000000000 interleave:0-1 file={long} dirty=512 N0=256 N1=256 "
        "kernelpagesize_kB=4\n"
        "7f1000000000 default anon=512 dirty=512 N0=512 kernelpagesize_kB=4\n"
        "7f2000000000 bind:1 file=/x dirty=512 N1=512 kernelpagesize_kB=4\n"
    )
    f = tmp_path / "numa_maps"
    f.write_text(text)
    assert nu.main(["maps", "--file", str(f), "--min-size", "1"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if re.match(r"\s+7f[0-9a-f]+ ", ln)]
    assert len(rows) == 3
    cols = {ln.index(v) for ln in rows for v in ("interleaved", "all on node") if v in ln}
    assert len(cols) == 1, rows  # one verdict column
    assert "model.safetensors" in rows[0] and "..." in rows[0]


def test_node_word_agrees_with_count():
    assert nu._nodes_txt([0]) == "node 0"
    assert nu._nodes_txt([1, 0]) == "nodes 0-1"
    assert nu._nodes_txt([]) == "nodes -"
    text = _status_text("single-node")
    assert "CPUs on node 0; memory on node 0" in text
    assert "nodes 0" not in text


def test_status_says_how_a_device_node_was_found_in_words():
    """A device whose firmware gives no node showed "- (local_cpulist)": the words say
    where its node came from, and the DEVICES head what "-" stands for."""
    text = _status_text("gpu-numa-unknown")
    assert "local_cpulist" not in text, text
    gpu = next(line for line in text.splitlines() if line.startswith("  0000:00:07.0"))
    assert "node 1  (node from its local CPUs: numa_node is -1)  local" in gpu, gpu
    device = next(line for line in text.splitlines() if "0000:00:07.0  gpu" in line)
    assert device.endswith("  -  (node from its local CPUs: numa_node is -1)"), device
    assert "kernel names (-: none)" in text, text
    assert "local_cpulist" not in _status_text("single-node")


def test_status_says_what_a_memory_tier_is():
    text = _status_text("qemu-x86_64-hmat-tiers")
    assert "tier 4 " in text and "tier 54 " in text, text
    legend = "  tier: the kernel's memory tier, its abstract distance / 128: DRAM is tier 4, "
    assert legend + "lower is faster\n" in text, text
