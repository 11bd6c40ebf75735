"""`maps PID` and `status` show the extents of the numa_utils regions they see
(issue 20 item 3), reading identity records without an attach, a mapping or a lock.

Every test runs in private IPC and mount namespaces (conftest's private_shm marker):
the regions it makes live in a /dev/shm and a SysV namespace of its own."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, nu

pytestmark = pytest.mark.private_shm

PAGE = os.sysconf("SC_PAGE_SIZE")


def _maps(pid, *args):
    out = subprocess.run(
        [sys.executable, "-m", "numa_utils", "maps", *args, str(pid)],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


# The region lives in a holder process that maps looks at: a SysV segment attached by
# the test process itself would change shm_lpid whenever the test spawns `maps` (fork
# on Python < 3.10 opens every attached segment in the child), whatever maps does.
_HOLDER = r"""
import json, sys
import numa_utils as nu
kind, page = sys.argv[1], int(sys.argv[2])
layout = nu.Layout.extents([(4 * page, "bind", [0]), (12 * page, "interleave", [0])])
r = nu.SharedRegion.create(f"maps-{kind}", 16 * page, kind=kind, layout=layout)
print(json.dumps({"address": r.address, "shmid": r.shmid}), flush=True)
sys.stdin.read()
r.destroy()
"""


@pytest.mark.parametrize("kind", ["posix", "sysv"])
def test_maps_shows_each_extent_of_a_region(kind):
    b = nu.default_backend()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, kind, str(PAGE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    try:
        r = json.loads(holder.stdout.readline())
        before = b.shm_stat(r["shmid"]) if kind == "sysv" else None
        rep = json.loads(_maps(holder.pid, "--json"))
        text = _maps(holder.pid)
        if kind == "sysv":  # maps read /proc/PID/mem: no attach, no detach
            after = b.shm_stat(r["shmid"])
            assert (after.lpid, after.used, after.nattch) == (
                before.lpid,
                before.used,
                before.nattch,
            )
        (row,) = rep["regions"]
        assert row["name"] == f"maps-{kind}" and row["kind"] == kind
        assert row["start"] == f"0x{r['address']:x}" and row["size"] == 16 * PAGE
        assert row["error"] is None
        got = [(e["offset"], e["length"], e["policy"], e["nodes"]) for e in row["extents"]]
        assert got == [(0, 4 * PAGE, "bind", [0]), (4 * PAGE, 12 * PAGE, "interleave", [0])]
        assert row["extents"][0]["vmas"][0] == f"0x{r['address']:x}"
        assert row["extents"][1]["start"] == f"0x{r['address'] + 4 * PAGE:x}"
        assert all(e["vmas"] for e in row["extents"])
        assert f"region 'maps-{kind}' ({kind} " in text
        assert (
            f"  extent 1 {4 * PAGE:#x}+{12 * PAGE // 1024}K interleave:0  at "
            f"0x{r['address'] + 4 * PAGE:x}" in text
        )
        assert set(rep) == {"vmas", "totals_kb", "regions"}
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0


def test_maps_without_regions_prints_no_region_part():
    text = _maps(os.getpid())
    assert "region '" not in text
    assert json.loads(_maps(os.getpid(), "--json"))["regions"] == []


def test_maps_reports_a_damaged_record_and_keeps_going():
    r = nu.SharedRegion.create("maps-bad", 4 * PAGE, kind="posix")
    try:
        path = "/dev/shm/numa_utils-maps-bad"
        size = os.path.getsize(path)
        with open(path, "r+b") as f:  # flip one byte of the record's JSON
            f.seek(size - 40)
            c = f.read(1)
            f.seek(size - 40)
            f.write(bytes([c[0] ^ 1]))
        (row,) = json.loads(_maps(os.getpid(), "--json"))["regions"]
        assert row["extents"] == [] and "damaged identity record" in row["error"]
    finally:
        r.destroy()


def test_status_lists_this_users_regions():
    layout = nu.Layout.parts([0, 0])
    a = nu.SharedRegion.create("status-p", 8 * PAGE, kind="posix", layout=layout)
    s = nu.SharedRegion.create("status-s", 8 * PAGE, kind="sysv")
    try:
        before = nu.default_backend().shm_stat(s.shmid)
        rep = nu.status_report()
        after = nu.default_backend().shm_stat(s.shmid)
        assert (after.lpid, after.used) == (before.lpid, before.used)
        rows = {r["kind"]: r for r in rep["regions"]}
        assert rows["posix"] == {
            "name": "status-p",
            "kind": "posix",
            "key": "/dev/shm/numa_utils-status-p",
            "size": 8 * PAGE,
            "attached": 1,
            "layout": f"parts:bind:0/0@{8 * PAGE // 1024}K",
        }
        assert rows["sysv"]["key"] == f"0x{s.ipc_key:08x}"
        # shm_nattch counts VMAs (ipc/shm.c shm_open runs on each split): the data's
        # and the record room's of this one process.
        assert rows["sysv"]["attached"] == 2 and rows["sysv"]["layout"] is None
        text = nu._render_status(rep)
        assert "REGIONS (this user's numa_utils shared memory)" in text
        assert "status-p" in text and "1 attached  parts:bind:0/0@" in text
    finally:
        a.destroy()
        s.destroy()
    assert nu.status_report()["regions"] == []
