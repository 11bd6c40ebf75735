# SPDX-License-Identifier: Apache-2.0
"""Issue 12, one named test per finding: hostile neighbours and broken inputs never
hang, blow up, print a traceback or leak.  Saved trees are corrupted copies in
tmp_path; /dev/shm and SysV cases run in private IPC+mount namespaces."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import (
    REPO,
    cli,
    fixture_root,
    fixture_text,
    fixture_tree,
    nu,
    nur,
    nusim,
    run_private_shm,
    saved_backend,
    sim,
)

MiB = 1 << 20
BIG = "9" * 400


def _cli(*args, timeout=60, cwd=REPO, prefix=(sys.executable, "-m", "numa_utils")):
    out = subprocess.run(
        [*prefix, *args], capture_output=True, text=True, timeout=timeout, cwd=str(cwd)
    )
    return out.returncode, out.stdout, out.stderr


def _one_line_error(rc, err):
    assert rc == 2, err
    assert "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith(("usage:", " "))]
    assert len(lines) == 1, err


@pytest.fixture
def tree(tmp_path):
    """A writable copy of the dual-socket fixture's saved tree."""
    dst = tmp_path / "t"
    fixture_tree("dual-socket-8gpu", dst)
    return dst


def _topology_in_child(root, timeout=20):
    """read_topology over ``root`` in a child: a hang fails the test, not the run."""
    code = (
        "import json, numa_utils as nu, numa_utils_sim as nusim; t = nu.read_topology("
        f"backend=nu.LinuxBackend(nusim.open_tree({str(root)!r}))); "
        "print(json.dumps(list(t.problems)))"
    )
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=str(REPO)
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), time.monotonic() - t0


# -- saved trees: FIFOs, devices, symlinks ----------------------------------------------

NODE = "sys/devices/system/node"
CPU = "sys/devices/system/cpu"


@pytest.mark.parametrize("rel", ["proc/self/status", f"{NODE}/node0/meminfo", f"{CPU}/online"])
def test_fifo_in_saved_tree_does_not_block(tree, rel):
    (tree / rel).unlink()
    os.mkfifo(tree / rel)
    problems, _ = _topology_in_child(tree)
    if rel != "proc/self/status":  # status is optional: read_optional drops it
        assert any("not a regular file" in p and rel in p for p in problems), problems


def test_symlink_to_dev_zero_in_saved_tree_is_not_followed_out(tree):
    (tree / CPU / "online").unlink()
    os.symlink("/dev/zero", tree / CPU / "online")  # absolute: inside the tree
    (tree / NODE / "online").unlink()
    os.symlink("../../../../../../../../dev/zero", tree / NODE / "online")
    b = saved_backend(str(tree))
    assert b.realpath(f"/{CPU}/online") == "/dev/zero"  # the tree's dev/zero
    assert b.realpath(f"/{NODE}/online") == "/dev/zero"
    problems, secs = _topology_in_child(tree)
    assert secs < 20


def test_relative_symlink_leaving_tree_is_not_read_nor_printed(tree, tmp_path):
    (tmp_path / "secret").write_text("Cpus_allowed_list:\tSECRET-TEXT\n")
    (tree / "proc/self/status").unlink()
    os.symlink("../../../secret", tree / "proc/self/status")
    (tree / NODE / "node0/meminfo").unlink()
    os.symlink("../../../../../../secret", tree / NODE / "node0/meminfo")
    rc, out, err = _cli("status", "--root", str(tree))
    assert rc == 0 and "SECRET" not in out + err
    rc, out, err = _cli("status", "--json", "--root", str(tree))
    assert rc == 0 and "SECRET" not in out + err


def test_absolute_symlink_inside_tree_resolves_in_tree(tree):
    node1 = (tree / NODE / "node1/meminfo").read_text()
    (tree / NODE / "node0/meminfo").unlink()
    os.symlink(f"/{NODE}/node1/meminfo", tree / NODE / "node0/meminfo")
    b = saved_backend(str(tree))
    assert b.read_text(f"/{NODE}/node0/meminfo") == node1


def test_symlink_loop_in_tree_is_an_error_not_a_recursion(tree):
    os.symlink("b", tree / "a")
    os.symlink("a", tree / "b")
    with pytest.raises(OSError):
        saved_backend(str(tree)).read_text("/a")


def test_oversized_file_in_saved_tree_is_refused(tree):
    with open(tree / CPU / "online", "wb") as f:
        f.truncate(nusim.SavedTree._TREE_MAX_READ + 4096)
    with pytest.raises(OSError) as e:
        saved_backend(str(tree)).read_text(f"/{CPU}/online")
    assert "larger than" in str(e.value)


# -- ID lists bounded by the kernel's limits, parsers linear ------------------------------


def test_parse_cpulist_bounded_and_fast():
    t0 = time.monotonic()
    for text in ("0-16777216", "0-16777215", "8192", "0-8192"):
        with pytest.raises(ValueError):
            nu.parse_cpulist(text)
    assert nu.parse_cpulist("0-8191") == frozenset(range(8192))
    assert max(nu.parse_cpulist("8191")) == nu.MAX_CPUS - 1
    with pytest.raises(ValueError):
        nu._parse_nodelist("1024")
    assert nu._parse_nodelist("0-1023") == frozenset(range(1024))
    assert time.monotonic() - t0 < 2


def test_parse_cpulist_many_chunks_is_linear():
    text = ",".join(["0-8191:3/7"] * 20000)
    t0 = time.monotonic()
    got = nu.parse_cpulist(text)
    assert got == frozenset(c for c in range(8192) if c % 7 < 3)
    assert time.monotonic() - t0 < 5


def test_parse_cpumap_is_linear_and_bounded():
    with pytest.raises(ValueError):
        nu.parse_cpumap(",".join(["ffffffff"] * (1 << 17)))  # 1 MB, 4M bits
    full = nu.parse_cpumap(",".join(["ffffffff"] * 256))  # 8192 bits
    assert full == frozenset(range(8192))
    with pytest.raises(ValueError):
        nu.parse_cpumap("1," + ",".join(["00000000"] * 256))


@pytest.mark.parametrize(
    "rel,text",
    [
        (f"{CPU}/possible", "0-16777215"),
        (f"{NODE}/online", "0-16777215"),
        (f"{CPU}/cpu0/topology/thread_siblings_list", "0-16777216"),
    ],
)
def test_huge_id_list_in_tree_is_malformed_not_expanded(tree, rel, text):
    (tree / rel).write_text(text + "\n")
    problems, secs = _topology_in_child(tree)
    assert any(rel in p for p in problems), problems
    rc, out, err = _cli("status", "--json", "--root", str(tree))
    assert rc == 0 and len(out) < 5 * MiB


def test_numa_maps_policy_node_list_bounded():
    line = "7f0000000000 bind:0-16777216 anon=1 dirty=1 N0=1 kernelpagesize_kB=4\n"
    t0 = time.monotonic()
    with pytest.raises(ValueError):
        nu.parse_numa_maps(line)
    assert time.monotonic() - t0 < 1


def test_region_nodes_bounded():
    rc, _, err = _cli("region", "k", "1M", "--policy", "bind", "--nodes", "0-16777216")
    _one_line_error(rc, err)


# -- crashes that must be warnings or one-line errors -----------------------------------


def test_node_dir_a_file_is_a_problem(tree):
    shutil.rmtree(tree / NODE)
    (tree / NODE).write_text("not a directory\n")
    t = nu.read_topology(backend=saved_backend(str(tree)))
    assert any(NODE in p for p in t.problems), t.problems


def test_node_dir_unreadable_is_a_problem(tree):
    class Denied(nu.LinuxBackend):
        def listdir(self, path):
            if path.rstrip("/") == f"/{NODE}":
                raise PermissionError(13, "Permission denied")
            return super().listdir(path)

    (tree / NODE / "online").unlink()
    t = nu.read_topology(backend=Denied(nusim.open_tree(str(tree))))
    assert any("cannot list" in p and NODE in p for p in t.problems), t.problems


def test_node_dir_with_non_ascii_digit_is_ignored(tree):
    (tree / NODE / "node\u00b3").mkdir()
    (tree / NODE / "online").unlink()
    t = nu.read_topology(backend=saved_backend(str(tree)))
    assert set(t.nodes) == {0, 1}


def test_huge_memtotal_in_status_text(tree):
    p = tree / NODE / "node0/meminfo"
    p.write_text(p.read_text().replace("MemTotal:", f"MemTotal:  {BIG} kB\nX:", 1))
    rc, out, err = _cli("status", "--root", str(tree))
    assert rc == 0 and "Traceback" not in err
    assert "invalid meminfo value" in out


def test_huge_cli_sizes_are_one_line_errors():
    rc, _, err = _cli("region", "kv", BIG)
    _one_line_error(rc, err)
    assert "invalid size" in err
    rc, _, err = _cli("maps", "--root", fixture_root("single-node"), "--min-size", BIG, "self")
    _one_line_error(rc, err)


def test_watch_interval_inf_and_nan():
    for v in ("inf", "nan", "1e300", "-1", "0"):
        rc, _, err = _cli("watch", "--interval", v, "--count", "1")
        _one_line_error(rc, err)


# -- shared memory: SIZE_MAX, signals, /dev/shm neighbours -------------------------------


@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_size_beyond_size_t_refused_before_any_syscall(kind):
    s = sim("single-node")
    with pytest.raises(ValueError, match="size_t"):
        nur.SharedRegion.create("big", 2**64 + 2**20, kind=kind, backend=s)
    assert not s.kernel.objects and not s.listdir("/dev/shm")
    assert len(s.read_text("/proc/sysvipc/shm").splitlines()) == 1


_FIFO = r"""
import os, subprocess, sys
import numa_utils as nu, numa_utils_regions as nur, numa_utils_threads as nut
os.mkfifo("/dev/shm/numa_utils-x")
os.symlink("/etc/hostname", "/dev/shm/numa_utils-y")
os.mknod("/dev/shm/numa_utils-z", 0o666 | 0o020000, os.makedev(1, 5))   # /dev/zero
for args in (["cleanup"], ["cleanup", "--remove", "--json"]):
    out = subprocess.run([sys.executable, "-m", "numa_utils", *args], capture_output=True,
                         text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert "numa_utils-x" not in out.stdout and "numa_utils-y" not in out.stdout, out.stdout
for name in ("x", "y", "z"):
    try:
        nur.SharedRegion.attach(name, kind="posix")
        raise SystemExit("attached a non-regular file")
    except OSError:
        pass
out = subprocess.run([sys.executable, "-m", "numa_utils", "region", "x", "1M", "--kind",
                      "posix"], capture_output=True, text=True, timeout=10)
assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
assert "not a region" in out.stderr and "cleanup" not in out.stderr, out.stderr
assert sorted(os.listdir("/dev/shm")) == ["numa_utils-x", "numa_utils-y", "numa_utils-z"]
print("ok")
"""


@pytest.mark.realkernel
def test_cleanup_immune_to_fifo_symlink_device_in_dev_shm():
    out = run_private_shm(_FIFO, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


_DELETED = r"""
import json, os, subprocess, sys
import numa_utils as nu, numa_utils_regions as nur, numa_utils_threads as nut
names = ["nl\nx", "d (deleted)", "tab\tx"]
held = [nur.SharedRegion.create(n, 1 << 20, kind="posix", prefault=False) for n in names]
# A stale one of a confusable name: "d" is not mapped, "d (deleted)" is.  Its owner
# died without destroying it.
subprocess.run([sys.executable, "-c", "import os, numa_utils_regions as nur; "
                "nur.SharedRegion.create('d', 1 << 20, kind='posix', prefault=False); "
                "os._exit(0)"], check=True)
out = subprocess.run([sys.executable, "-m", "numa_utils", "cleanup", "--remove", "--json",
                      "--min-age", "0"], capture_output=True, text=True, timeout=30)
assert out.returncode == 0, out.stderr
rows = {r["name"]: r["action"] for r in json.loads(out.stdout)["regions"]}
whys = {r["name"]: r["why"] for r in json.loads(out.stdout)["regions"]}
left = set(os.listdir("/dev/shm"))
for r in held:
    assert r.name in left, (r.name, rows)
    assert rows[r.name] == "keep" and whys[r.name].startswith("in use: mapped by 1"), whys
assert "numa_utils-d" not in left and rows["numa_utils-d"] == "removed", rows
print("ok")
"""


@pytest.mark.realkernel
def test_cleanup_remove_matches_mapped_names_with_newline_and_deleted():
    out = run_private_shm(_DELETED, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


# The SIGINT storm: a child creates and destroys regions in a loop while the parent
# sends it SIGINT at random moments; what is left in the namespace afterwards leaked.
_STORM = r"""
import json, os, random, signal, subprocess, sys, time
kind, mask, n, what = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4]
child = r'''
import itertools, os, signal, sys
import numa_utils as nu, numa_utils_regions as nur, numa_utils_threads as nut
kind, mask, what = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
if not mask:
    nur._hold_signals = lambda: None          # the behaviour before issue 12
# Interrupts count (and raise) only inside the calls measured: create, or the
# teardown (close, remove) of a region made with signals quiet.
CREATE = {nur.SharedRegion.create.__func__.__code__} if what != "destroy" else \
    {nur.SharedRegion.close.__code__, nur.SharedRegion.remove.__code__}
hits = [0]
retry_errors = [0]
released = [False]
if what != "destroy":
    # The window measured ends where create() lets the signals go: after that it
    # returns the region (or has undone it), and an interrupt in its last bytecodes,
    # or just after it returned and before `r =` binds the region, is the caller's
    # to handle, as with open().
    hold, release = nur._hold_signals, nur._release_signals

    def _hold():
        released[0] = False
        return hold()

    def _release(held):
        released[0] = True
        release(held)
    nur._hold_signals, nur._release_signals = _hold, _release


def on_sigint(signum, frame):
    # KeyboardInterrupt, as the default handler, but only while create() runs (its
    # frame on the stack, the signals not yet let go): an interrupt in our own loop
    # measures nothing.
    if released[0]:
        return
    while frame is not None:
        if frame.f_code in CREATE:
            hits[0] += 1
            raise KeyboardInterrupt
        frame = frame.f_back


signal.signal(signal.SIGINT, on_sigint)
# First use imports ctypes and loads libc: an interrupt inside Python's import
# machinery (3.8) can leave a half-made module behind, which is Python's to fix and
# not the window measured here.
nur.SharedRegion.create("warm", 1 << 16, kind=kind, prefault=False).destroy()
made = 0
print("ready", flush=True)
for i in itertools.count():
    if os.path.exists("/dev/shm/stop"):
        break
    r = None
    if what == "destroy":
        r = nur.SharedRegion.create(f"s{i}", 1 << 16, kind=kind, prefault=False)
        made += 1
        while True:                 # interrupted teardown: finishing it must work
            try:
                r.destroy()
                break
            except KeyboardInterrupt:
                pass
            except OSError:
                retry_errors[0] += 1
                break
        continue
    try:
        r = nur.SharedRegion.create(f"s{i}", 1 << 16, kind=kind,
                                   prefault=what == "prefault")
    except KeyboardInterrupt:
        pass
    except SystemError as e:
        # CPython 3.8-3.10: a handler that raises while os.stat or os.fstat builds its
        # result surfaces as SystemError from the KeyboardInterrupt.  Outside the held
        # window that is still the same interrupt, the caller's to handle.
        if not isinstance(e.__cause__, KeyboardInterrupt):
            raise
    if r is not None:
        made += 1
        r.destroy()
print(made, hits[0], retry_errors[0], flush=True)
'''
p = subprocess.Popen([sys.executable, "-c", child, kind, "1" if mask else "0", what],
                     stdout=subprocess.PIPE, text=True)
assert p.stdout.readline().strip() == "ready"
rnd = random.Random(12)
for _ in range(n):
    time.sleep(rnd.uniform(0, 0.002))
    p.send_signal(signal.SIGINT)
open("/dev/shm/stop", "w").close()
made, intr, errors = map(int, p.stdout.readline().split())
p.wait(timeout=30)
segs = len(open("/proc/sysvipc/shm").read().splitlines()) - 1
files = len([f for f in os.listdir("/dev/shm") if f.startswith("numa_utils-")])
print(json.dumps({"made": made, "interrupted": intr, "leaked": segs + files,
                  "retry_errors": errors}))
"""


def _storm(kind, mask, n, what="create"):
    out = run_private_shm(_STORM, kind, "1" if mask else "0", str(n), what, timeout=180)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _storms(kind, what, want=100):
    """Storms summed until ``want`` interrupts landed in the calls measured."""
    n = int(os.environ.get("NUMA_UTILS_TEST_STORM_SIGNALS", "300"))
    total = {"interrupted": 0, "leaked": 0, "retry_errors": 0, "made": 0}
    for _ in range(8):  # how many land inside the calls varies from run to run
        got = _storm(kind, True, n, what)
        total = {k: total[k] + got[k] for k in total}
        if total["interrupted"] >= want:
            break
    assert total["interrupted"] >= 10, total  # the storm did land
    return total


@pytest.mark.realkernel
@pytest.mark.parametrize("what", ["create", "prefault"])
@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_sigint_storm_during_create_leaks_nothing(kind, what):
    # The handler of a signal that came while SIGINT/SIGTERM were held runs before
    # they are let go (_run_pending), inside the undo scope: no second interrupt can
    # strike between the first and the undo (that was ~1 in 100 interrupted creates).
    got = _storms(kind, what)
    assert got["leaked"] == 0, got


@pytest.mark.realkernel
@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_close_destroy_interrupted_can_be_finished(kind):
    # Unmapping and marking the region closed happen together, signals held: a retry
    # never raises OSError and never acts on whatever is mapped there by then.
    got = _storms(kind, "destroy")
    assert got["retry_errors"] == 0 and got["leaked"] == 0, got


def test_live_exists_builds_no_stat_result(monkeypatch):
    # read_topology asks exists() (in fit(), before create() holds the signals).  On
    # CPython 3.8-3.10 a handler that raises while os.stat builds its result turns
    # KeyboardInterrupt into SystemError (measured: 1 in 5 to 1 in 40 of the interrupts
    # landing in os.stat, none in os.access): the live backend asks access(F_OK).
    def no_stat(*args, **kwargs):
        raise AssertionError("os.stat called")

    b = nu.LinuxBackend()
    monkeypatch.setattr(os, "stat", no_stat)
    assert b.exists("/proc/self/status") and not b.exists("/proc/self/no-such-file")


# -- the command line --------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("region", "kv", "-5M"),
        ("watch", "--pid", "-5", "--count", "1"),
        ("watch", "--count", "0"),
        ("watch", "--count", "2", "--interval", "0.01", "--pid", "999999999"),
        ("watch", "--count", "1", "--pid", "12x"),
        ("maps", "--page-kb", "0", "self"),
        ("maps", "--page-kb", "-4", "self"),
    ],
    ids=lambda a: " ".join(a),
)
def test_cli_bad_values_exit_2_one_line(args):
    rc, _, err = _cli(*args)
    _one_line_error(rc, err)


def test_region_negative_size_says_size_is_invalid():
    rc, _, err = _cli("region", "kv", "-5M")
    assert rc == 2 and "invalid value '-5M'" in err and "required" not in err


@pytest.mark.parametrize("extra", [(), ("--policy", "bind")])
def test_region_nodes_not_on_machine(extra):
    rc, _, err = _cli("region", "kv", "64M", "--nodes", "1023", *extra)
    _one_line_error(rc, err)
    assert "node argument 1023 is out of range" in err  # libnuma's words (one grammar)


def test_run_help_does_not_offer_root():
    rc, out, _ = _cli("run", "--help")
    assert rc == 0 and "--root" not in out and "--gpu" in out


@pytest.mark.parametrize("folder", ["gather", "fixture", "empty"])
def test_status_root_without_sys_or_proc(tmp_path, folder):
    d = tmp_path / "d"
    if folder == "gather":
        fixture_tree("single-node", d / "root")
    elif folder == "fixture":
        fixture_tree("single-node", d, sub="")  # the archive's layout, unpacked
    else:
        d.mkdir()
    rc, out, err = _cli("status", "--root", str(d))
    _one_line_error(rc, err)
    assert "not a saved tree" in err and not out
    assert ("did you mean" in err) == (folder != "empty")


@pytest.mark.parametrize(
    "name,machine",
    [
        ("gh200", "aarch64"),
        ("qemu-ppc64le-memory-only", "ppc64le"),
        ("qemu-s390x-no-numa", "s390x"),
    ],
)
def test_status_root_describes_the_trees_machine(name, machine):
    rep = cli.status_report(backend=saved_backend(fixture_root(name)))
    k = rep["kernel"]
    release = fixture_text(name, "root/proc/sys/kernel/osrelease")
    assert k["release"] == release.strip()
    assert k["machine"] == machine and k["abi"] == nu.abi_for(machine, 64).name
    assert k["syscalls"] == dict(nu.abi_for(machine, 64).syscalls)
    assert k["page_size"] is None  # the tree does not say: not ours
    text = cli._render_status(rep)
    assert f"ABI {k['abi']}, page size unknown" in text
    no_numa = "page size unknown; kernel without NUMA (no node directory)"
    assert (no_numa in text) == (name == "qemu-s390x-no-numa")


def test_status_root_says_what_it_cannot_know(tmp_path):
    d = tmp_path / "t"
    fixture_tree("sparse-ids", d)  # a 5.14 kernel: no arch
    rep = cli.status_report(backend=saved_backend(str(d)))
    assert rep["kernel"]["abi"] is None and rep["kernel"]["machine"] is None
    assert any("does not record its machine" in w for w in rep["warnings"])
    (d / "proc/self").mkdir(exist_ok=True)
    (d / "proc/self/numa_maps").write_text(
        "10000000 default heap anon=2 dirty=2 N0=2 kernelpagesize_kB=64\n"
        "7fff00000000 default file=/x huge anon=1 dirty=1 N0=1 kernelpagesize_kB=2048\n"
    )
    rep = cli.status_report(backend=saved_backend(str(d)))
    assert rep["kernel"]["page_size"] == 65536


def test_status_names_an_abi_without_syscall_table_once(tmp_path):
    # A saved tree from a machine numa_utils has no table for, and a process on one.
    d = tmp_path / "t"
    fixture_tree("sparse-ids", d)
    (d / "proc/sys/kernel/arch").write_text("sparc64\n")
    saved = cli.status_report(backend=saved_backend(str(d)))["warnings"]
    s = sim("dual-socket-8gpu")
    s.abi = nu.abi_for("sparc64", 64)
    live = cli.status_report(backend=s)["warnings"]
    for warnings in (saved, live):
        hits = [w for w in warnings if "no syscall table for the 'sparc64' ABI" in w]
        assert len(hits) == 1, warnings
    assert not any(
        "no syscall table" in w for w in cli.status_report(backend=sim("gh200"))["warnings"]
    )


def test_gather_saves_arch_and_page_size(tmp_path):
    out = subprocess.run(
        [sys.executable, str(REPO / "tools/gather.py"), str(tmp_path / "g")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rep = cli.status_report(backend=saved_backend(str(tmp_path / "g/root")))
    if os.path.exists("/proc/sys/kernel/arch"):
        assert rep["kernel"]["machine"] == os.uname().machine
    if os.path.exists("/proc/self/numa_maps"):
        assert rep["kernel"]["page_size"] == os.sysconf("SC_PAGE_SIZE")
        assert "file=" not in (tmp_path / "g/root/proc/self/numa_maps").read_text()


def test_hints_name_the_command_the_user_ran(tmp_path):
    _, out, _ = _cli("--help")
    assert out.startswith("usage: ") and " -m numa_utils" in out.splitlines()[0]
    _, out, _ = _cli("--help", prefix=(sys.executable, str(REPO / "numa_utils.py")))
    assert "numa_utils.py" in out.splitlines()[0]
    script = tmp_path / "numa-utils"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "from numa_utils import main\nsys.exit(main())\n"
    )
    _, out, _ = _cli("--help", prefix=(sys.executable, str(script)))
    assert out.splitlines()[0].startswith("usage: numa-utils ")


# -- maps PID: what it opens of another process's mappings -------------------------------


def _dev_hex(dev):
    return f"{os.major(dev):02x}:{os.minor(dev):02x}"


def test_maps_opens_only_mappings_on_shared_memory(tmp_path, monkeypatch):
    """A region's record is read only from a mapping that /proc/PID/maps puts on shared
    memory: a SysV segment on the kernel's shm mount, a file on a tmpfs of the process's
    mountinfo.  Anything else (a FUSE server can block an open or a page fault forever)
    is named, never opened through /proc/PID/map_files nor read in /proc/PID/mem."""
    pid = str(os.getpid())  # a live process: an open that ought not happen would work
    probe = os.memfd_create("probe")
    shm = os.fstat(probe).st_dev  # every memfd and SysV segment lives on that mount
    os.close(probe)
    fuse, tmpfs = os.makedev(0, 0x2A), os.makedev(0, 0x17)
    key = nur.SYSV_KEY_PREFIX | 7
    lines = [  # start, device, inode, path
        (0x7F0000000000, fuse, 123, "/dev/shm/numa_utils-on-fuse"),
        (0x7F0000010000, tmpfs, 124, "/dev/shm/numa_utils-on-tmpfs"),
        (0x7F0000020000, fuse, 32768, f"/SYSV{key:08x} (deleted)"),
        (0x7F0000030000, shm, 32769, f"/SYSV{key + 1:08x} (deleted)"),
    ]
    root = tmp_path / "root"
    (root / "proc" / pid).mkdir(parents=True)
    (root / "proc" / "sysvipc").mkdir()
    (root / "proc" / pid / "maps").write_text(
        "".join(
            f"{s:x}-{s + 0x4000:x} rw-s 00000000 {_dev_hex(d)} {i}  {p}\n" for s, d, i, p in lines
        )
    )
    (root / "proc" / pid / "mountinfo").write_text(
        "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
        "25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw\n"
        "40 25 0:42 / /dev/shm/x rw shared:9 - fuse.evil evil rw,user_id=1000\n"
    )
    (root / "proc" / "sysvipc" / "shm").write_text(
        "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  "
        "cuid  cgid      atime      dtime      ctime\n"
        f"{key} 32768 600 16384 1 1 1 0 0 0 0 0 0 0\n"
        f"{key + 1} 32769 600 16384 1 1 1 0 0 0 0 0 0 0\n"
    )
    opened = []
    real_open = os.open

    def hooked_open(path, *args, **kw):
        if str(path).startswith(str(root)):  # the saved tree's own files
            return real_open(path, *args, **kw)
        opened.append(str(path))
        raise OSError(5, "hooked: not opened in this test")

    seen = {p.replace(" (deleted)", ""): [s] for s, _, _, p in lines}
    monkeypatch.setattr(os, "open", hooked_open)
    rows = {r["file"]: r for r in cli._maps_regions(saved_backend(root), pid, seen)}
    monkeypatch.undo()
    assert opened == [f"/proc/{pid}/map_files/7f0000010000-7f0000014000", f"/proc/{pid}/mem"]
    for path in ("/dev/shm/numa_utils-on-fuse", f"/SYSV{key:08x}"):
        assert rows[path]["name"] is None and "not on shared memory" in rows[path]["error"]
        assert "device 0:42" in rows[path]["error"], rows[path]["error"]
    assert "hooked" in rows["/dev/shm/numa_utils-on-tmpfs"]["error"]
    assert "hooked" in rows[f"/SYSV{key + 1:08x}"]["error"]
