"""`maps PID` and `status` show the extents of the numa_utils regions they see
(issue 20 item 3), reading identity records without an attach, a mapping or a lock.

Every test runs in private IPC and mount namespaces (conftest's private_shm marker):
the regions it makes live in a /dev/shm and a SysV namespace of its own."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, cli, nu, nur

pytestmark = pytest.mark.private_shm

PAGE = os.sysconf("SC_PAGE_SIZE")


def _maps(pid, *args, prefix=()):
    out = subprocess.run(
        [*prefix, sys.executable, "-m", "numa_utils", "maps", *args, str(pid)],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        timeout=600,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


# The region lives in a holder process that maps looks at: a SysV segment attached by
# the test process itself would change shm_lpid whenever the test spawns `maps` (fork
# on Python < 3.10 opens every attached segment in the child), whatever maps does.
_HOLDER = r"""
import json, sys
import numa_utils as nu, numa_utils_regions as nur, numa_utils_threads as nut
kind, page = sys.argv[1], int(sys.argv[2])
layout = nur.Layout.extents([(4 * page, "bind", [0]), (12 * page, "interleave", [0])])
r = nur.SharedRegion.create(f"maps-{kind}", 16 * page, kind=kind, layout=layout)
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
        before = b.call("shm_stat", r["shmid"]) if kind == "sysv" else None
        rep = json.loads(_maps(holder.pid, "--json"))
        text = _maps(holder.pid)
        if kind == "sysv":  # maps read /proc/PID/mem: no attach, no detach
            after = b.call("shm_stat", r["shmid"])
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
        holder.communicate("", timeout=600)
    assert holder.returncode == 0


def test_maps_without_regions_prints_no_region_part():
    text = _maps(os.getpid())
    assert "region '" not in text
    assert json.loads(_maps(os.getpid(), "--json"))["regions"] == []


def test_maps_reports_a_damaged_record_and_keeps_going():
    r = nur.SharedRegion.create("maps-bad", 4 * PAGE, kind="posix")
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
    layout = nur.Layout.parts([0, 0])
    a = nur.SharedRegion.create("status-p", 8 * PAGE, kind="posix", layout=layout)
    s = nur.SharedRegion.create("status-s", 8 * PAGE, kind="sysv")
    try:
        before = nu.default_backend().call("shm_stat", s.shmid)
        rep = cli.status_report()
        after = nu.default_backend().call("shm_stat", s.shmid)
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
        text = cli._render_status(rep)
        assert "REGIONS (this user's numa_utils shared memory)" in text
        assert "status-p" in text and "1 attached  parts:bind:0/0@" in text
    finally:
        a.destroy()
        s.destroy()
    assert cli.status_report()["regions"] == []


# A process mapping a /dev/shm file whose identity record says what the test wants:
# what anyone who can write a region can make it say.  argv: path, record key,
# layout, data size; prints its pid, waits for stdin to close.
_FORGED = r"""
import json, mmap, os, struct, sys, zlib
path, key, layout, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
seg = size + (16 << 10)
rec = {"key": key, "kind": "posix", "size": size, "page_size": mmap.PAGESIZE, "layout": layout}
raw = json.dumps(rec).encode()
blob = raw + struct.pack("<8sIII", b"numa_utl", 1, len(raw), zlib.crc32(raw))
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, seg)  # sparse: costs nothing
os.pwrite(fd, blob, seg - len(blob))
m = mmap.mmap(fd, seg, mmap.MAP_SHARED, mmap.PROT_READ)
print(os.getpid(), flush=True)
sys.stdin.read()
"""


def _forged(path, key, layout, size, *, prefix=()):
    """The _FORGED process (``prefix``: a command it runs under) and its pid."""
    p = subprocess.Popen(
        [*prefix, sys.executable, "-c", _FORGED, path, key, layout, str(size)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return p, int(p.stdout.readline())


def _region_lines(text):
    return [ln for ln in text.splitlines() if ln.startswith(("  extent ", "  VMA "))]


def test_maps_lists_no_more_lines_than_vmas_whatever_the_record_says():
    # One VMA whose record says 16,384 extents (blocks:4K over 64 MiB): one line per
    # VMA, the extents counted, not listed.
    holder, pid = _forged("/dev/shm/numa_utils-hb", "hb", "blocks:4K:bind:0@64M", 64 << 20)
    try:
        (row,) = json.loads(_maps(pid, "--json"))["regions"]
        text = _maps(pid)
    finally:
        holder.communicate("", timeout=600)
    assert len(_region_lines(text)) == 1
    assert row["name"] == "hb" and row["error"] is None
    assert row["extent_count"] == (64 << 20) // 4096
    assert len(row["extents"]) <= len(row["vmas"]) == 1
    assert row["vmas"][0]["extents"] == [0, (64 << 20) // 4096 - 1]
    assert f"  {(64 << 20) // 4096} extents over 1 VMAs:" in text


def test_maps_refuses_a_layout_that_costs_more_than_it_can_say():
    # 600 lists of 8,192 node ids in one record: refused from its text, not parsed.
    layout = "parts:bind:" + "/".join(["0-8191"] * 600)
    holder, pid = _forged("/dev/shm/numa_utils-ids", "ids", layout, 600 * PAGE)
    try:
        (row,) = json.loads(_maps(pid, "--json"))["regions"]
    finally:
        holder.communicate("", timeout=600)
    assert row["extents"] == [] and "node ids" in row["error"]


def test_maps_escapes_names_other_users_chose():
    path = "/dev/shm/numa_utils-t\x1b]0;owned\x07\n"
    plain = "/dev/shm/plain\x1b[2J"
    holder, pid = _forged(path, "key\x1b[2J", "parts:bind:0", 4 * PAGE)
    other, _ = _forged(plain, "k", "parts:bind:0", 4 * PAGE)
    try:
        text = _maps(pid, "--all")
        rows = json.loads(_maps(pid, "--json"))["regions"]
    finally:
        holder.communicate("", timeout=600)
        other.communicate("", timeout=600)
    assert not any(c in text for c in "\x1b\x07"), text
    assert "numa_utils-t\\x1b]0;owned\\x07\\n" in text
    assert "region 'key\\x1b[2J' (posix " in text
    assert rows[0]["file"] == path and rows[0]["name"] == "key\x1b[2J"  # JSON: exact


def test_status_escapes_record_keys():
    holder, _ = _forged("/dev/shm/numa_utils-st", "st\x1b[2J\x07", "parts:bind:0", 4 * PAGE)
    try:
        text = cli._render_status(cli.status_report())
    finally:
        holder.communicate("", timeout=600)
    assert "st\\x1b[2J\\x07" in text and "\x1b" not in text and "\x07" not in text


def _inner_shm(*cmd):
    """``cmd`` in a mount namespace of its own with another tmpfs on /dev/shm."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT, "sh", *cmd]


_MOUNT = (
    'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mkdir -m 1777 /dev/shm/numa_utils-d && exec "$@"'
)
_NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


def test_maps_reads_the_file_a_process_maps_not_the_one_its_path_names(tmp_path):
    # Two holders map /dev/shm/numa_utils-same and numa_utils-d/f of a /dev/shm of
    # their own; here the first names another region, and numa_utils-d is a link to
    # a folder whose f says "evil".  maps shows the holders' records (through
    # /proc/PID/map_files); a user without map_files gets "layout unknown".
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv(1)")
    probe = subprocess.run([*_NOBODY, sys.executable, "-c", "pass"], capture_output=True)
    if probe.returncode != 0:  # an interpreter under a folder uid 65534 cannot read
        pytest.skip(f"{sys.executable} does not start as uid 65534: {probe.stderr[-200:]!r}")

    def record_file(path, key):
        p, _ = _forged(path, key, "parts:bind:0", 4 * PAGE)
        p.communicate("", timeout=600)

    record_file("/dev/shm/numa_utils-same", "outer")
    record_file(str(tmp_path / "f"), "evil")
    os.symlink(str(tmp_path), "/dev/shm/numa_utils-d")
    first, pid = _forged(
        "/dev/shm/numa_utils-same", "inner", "parts:bind:0", 4 * PAGE, prefix=_inner_shm(*_NOBODY)
    )
    second, pid2 = _forged(
        "/dev/shm/numa_utils-d/f", "inner2", "parts:bind:0", 4 * PAGE, prefix=_inner_shm()
    )
    try:
        rows = json.loads(_maps(pid, "--json"))["regions"]
        rows += json.loads(_maps(pid2, "--json"))["regions"]
        nobody = json.loads(_maps(pid, "--json", prefix=_NOBODY))["regions"]
    finally:
        first.communicate("", timeout=600)
        second.communicate("", timeout=600)
        os.unlink("/dev/shm/numa_utils-d")
        os.unlink("/dev/shm/numa_utils-same")
    assert [r["name"] for r in rows] == ["inner", "inner2"]
    (row,) = nobody
    assert row["name"] is None and "layout unknown" in row["error"]


_REMOVED = r"""
import json, sys
import numa_utils as nu, numa_utils_regions as nur, numa_utils_threads as nut
page = int(sys.argv[1])
layout = nur.Layout.extents([(4 * page, "bind", [0]), (12 * page, "interleave", [0])])
r = nur.SharedRegion.create("maps-rm", 16 * page, kind="sysv", layout=layout)
r.remove()  # IPC_RMID: key 0 in /proc/sysvipc/shm, still attached here
print(json.dumps({"address": r.address, "shmid": r.shmid}), flush=True)
sys.stdin.read()
r.close()
"""


def test_maps_shows_a_removed_sysv_region_once():
    holder = subprocess.Popen(
        [sys.executable, "-c", _REMOVED, str(PAGE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    try:
        r = json.loads(holder.stdout.readline())
        (row,) = json.loads(_maps(holder.pid, "--json"))["regions"]
        text = _maps(holder.pid)
    finally:
        holder.communicate("", timeout=600)
    assert row["name"] == "maps-rm" and row["removed"] and row["error"] is None
    assert row["start"] == f"0x{r['address']:x}" and len(row["extents"]) == 2
    assert text.count("region 'maps-rm' (sysv ") == 1 and ", removed, still attached)" in text


def test_maps_does_not_open_a_mapped_file_that_is_not_shared_memory(tmp_path):
    # A holder maps a disk file bind-mounted at /dev/shm/numa_utils-disk in a mount
    # namespace of its own: numa_maps names it as a region's file, /proc/PID/maps puts
    # it on the disk's device.  A file system other than tmpfs may be a FUSE server that
    # never answers an open: maps names it (layout unknown) and opens nothing of it,
    # neither /proc/PID/map_files nor the path (strace says what it opened).
    if shutil.which("strace") is None:
        pytest.skip("no strace(1)")
    disk = tmp_path / "on-disk"
    disk.write_bytes(b"")
    bind = (
        'touch /dev/shm/numa_utils-disk && mount --bind "$0" /dev/shm/numa_utils-disk && exec "$@"'
    )
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, str(disk)]
    holder, pid = _forged(
        "/dev/shm/numa_utils-disk", "disk", "parts:bind:0", 4 * PAGE, prefix=prefix
    )
    log = tmp_path / "strace.log"
    trace = ["strace", "-f", "-qq", "-e", "trace=open,openat,openat2,stat,newfstatat,lstat"]
    try:
        (row,) = json.loads(_maps(pid, "--json", prefix=[*trace, "-o", str(log)]))["regions"]
        text = _maps(pid)
    finally:
        holder.communicate("", timeout=600)
        os.unlink("/dev/shm/numa_utils-disk")
    assert row["file"] == "/dev/shm/numa_utils-disk" and row["name"] is None
    assert "is not on shared memory (device " in row["error"] and "not opened" in row["error"]
    assert "is not on shared memory" in text
    calls = log.read_text()
    assert "openat(" in calls  # the trace saw the command's own opens
    assert "map_files" not in calls and "numa_utils-disk" not in calls, calls[-2000:]
