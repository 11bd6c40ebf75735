"""The benchmark harness runs end to end and writes its report (never checks speed:
issue 7 keeps speed thresholds out of the test suite)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SECTIONS = {
    "prefault": "## 1. Prefault",
    "maps": "## 2. numa_maps",
    "maps_file": "## 2b. maps --file",
    "topology": "## 3. Topology",
    "import": "## 4. Import",
    "hot": "## 6. Hot commands",
}


@pytest.mark.slow
def test_quick_run(tmp_path):
    """One `python -m bench all --quick` (about 15 s here); then its report."""
    if not (REPO / "bench" / "__main__.py").exists():
        pytest.skip("no bench/ in this checkout")
    out = tmp_path
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "all",
            "--quick",
            "--size",
            "16M",
            "--rounds",
            "2",
            "--vmas",
            "2000",
            "--out",
            str(out),
        ],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_report(out)
    check_sections_measured(out)


def check_report(out):
    report = json.loads((out / "all-quick.json").read_text())
    md = (out / "all-quick.md").read_text()

    assert report["command"].startswith("python -m bench all --quick")
    assert "--out DIR" in report["command"]  # no machine paths in reports
    assert report["machine"]["cpus_allowed"] >= 1
    names = [s["name"] for s in report["sections"]]
    assert names == list(SECTIONS)
    for s in report["sections"]:
        assert s["status"] in ("ok", "skipped"), (s["name"], s["reason"])
        assert SECTIONS[s["name"]] in md
        if s["status"] == "skipped":
            assert s["reason"], s["name"]
            continue
        for k in s["skipped"]:
            assert k["reason"], k  # every skip says why
        for r in s["rows"]:
            assert r["n"] >= 1 and r["min"] <= r["median"] <= r["max"], r
        for c in s["comparisons"]:
            assert {"ratio_of_medians", "median_round_ratio", "target", "met"} <= set(c)
    assert "| contender | metric | min | median | max | n | note |" in md


def check_sections_measured(out):
    report = json.loads((out / "all-quick.json").read_text())
    by = {s["name"]: s for s in report["sections"]}
    # The baselines need nothing from numa_utils' unfinished parts, so they always run.
    pre = by["prefault"]
    assert pre["status"] == "ok"
    contenders = {r["contender"] for r in pre["rows"]}
    assert any(c.startswith("plain Python loop") for c in contenders)
    assert pre["params"]["leaked_sysv_segments"] == 0
    assert pre["params"]["leaked_dev_shm_files"] == 0
    assert by["maps"]["status"] == "ok"
    assert by["maps"]["params"]["vmas_in_helper"] >= 2000
    assert by["maps_file"]["status"] == "ok"
    assert {c["metric"] for c in by["maps_file"]["comparisons"]} == {"peak RSS MiB", "time"}
    assert by["topology"]["status"] == "ok"
    assert any(r["contender"].startswith("read_topology()") for r in by["topology"]["rows"])
    assert by["import"]["status"] == "ok"
    assert any(r["metric"] == "wall ms" for r in by["import"]["rows"])
    check_hot(by["hot"])


def check_hot(sec):
    """The hot commands' section: measured, own work reported, and each reference
    tool either compared or skipped with the reason."""
    assert sec["status"] == "ok", sec["reason"]
    rows = {r["contender"] for r in sec["rows"]}
    assert {
        "python -m numa_utils maps PID: own work (less the floor)",
        "python -m numa_utils status --root TREE: own work (less the floor)",
    } <= rows
    skipped = {k["contender"]: k["reason"] for k in sec["skipped"]}
    cmps = {c["what"]: c for c in sec["comparisons"]}
    for cmd, ref, tool in (
        ("maps", "numastat -p PID", "numastat"),
        ("status", "lstopo-no-graphics (HWLOC_FSROOT=TREE)", "lstopo-no-graphics"),
    ):
        if ref in skipped:
            assert f"{tool} not found" in skipped[ref]
            continue
        own = cmps[f"{cmd} own work / {ref}"]
        whole = cmps[f"{cmd} whole process / {ref}"]
        assert own["ratio_of_medians"] < whole["ratio_of_medians"]  # the floor is > 0
    assert (
        "numastat -p PID" in skipped
        or cmps["maps own work / numastat -p PID"]["target"] == "<= 1.0"
    )
    status = cmps.get("status own work / lstopo-no-graphics (HWLOC_FSROOT=TREE)")
    if status and "hwloc's" not in sec["params"]["tree"]:
        assert status["target"] is None  # a stand-in tree is not judged
        assert any("snapshot not given" in n for n in sec["notes"])


def test_own_work_is_taken_round_by_round():
    sys.path.insert(0, str(REPO))
    try:
        from bench.hot import own_work
    finally:
        sys.path.remove(str(REPO))
    cmd = [{"s": 0.30}, None, {"s": 0.50}, {"s": 0.20}]
    floor = [{"s": 0.10}, {"s": 0.10}, None, {"s": 0.15}]
    got = own_work(cmd, floor)
    assert got[1] is None and got[2] is None
    assert [round(x["s"], 9) for x in (got[0], got[3])] == [0.2, 0.05]


@pytest.mark.slow
def test_hot_smoke(tmp_path):
    """`python -m bench hot --quick`: the hot commands against numastat and lstopo,
    one round, a few seconds; no speed is checked.  ``--baseline`` (here this same
    checkout) puts another checkout's maps beside this one's."""
    argv = [
        sys.executable,
        "-m",
        "bench",
        "hot",
        "--quick",
        "--rounds",
        "1",
        "--vmas",
        "500",
        "--out",
        str(tmp_path),
        "--baseline",
        str(REPO),
    ]
    proc = subprocess.run(
        argv,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "hot-quick.json").read_text())
    (sec,) = report["sections"]
    check_hot(sec)
    assert "## 6. Hot commands' own work" in (tmp_path / "hot-quick.md").read_text()
    rows = {r["contender"] for r in sec["rows"]}
    assert "python -m numa_utils maps PID [baseline]: own work (less its floor)" in rows
    cmps = {c["what"] for c in sec["comparisons"]}
    assert "maps own work / maps own work [baseline]" in cmps
    assert "DIR" in report["command"] and str(REPO) not in report["command"]
