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
}


@pytest.mark.slow
def test_quick_run(tmp_path):
    """One `python -m bench all --quick` (about 15 s here); then its report."""
    if not (REPO / "bench" / "__main__.py").exists():
        pytest.skip("no bench/ in this checkout")
    out = tmp_path
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "all", "--quick", "--size", "16M", "--rounds", "2",
         "--vmas", "2000", "--out", str(out)],
        cwd=str(REPO), capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_report(out)
    check_sections_measured(out)


def check_report(out):
    report = json.loads((out / "all-quick.json").read_text())
    md = (out / "all-quick.md").read_text()

    assert report["command"].startswith("python -m bench all --quick")
    assert "--out DIR" in report["command"]           # no machine paths in reports
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
            assert k["reason"], k                     # every skip says why
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
