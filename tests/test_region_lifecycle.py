# SPDX-License-Identifier: Apache-2.0
"""A region's life as cleanup judges it: the last-use slot that numa_utils' own
attach and close write (and cleanup's look never does), one live region per name,
creators in other time namespaces, zombies and damaged records, forked children,
and locks held by other users.  Simulated processes first; then the issue's repros
on the real kernel, inside private IPC+mount namespaces (conftest.private_shm)."""

import json
import os
import struct
import time
import zlib

import pytest
from conftest import fixture_root, nu, nur, nusim, run_private_shm, sim

MiB = 1 << 20


def _made(proc, name, kind):
    return nur.SharedRegion.create(name, MiB, kind=kind, prefault=False, backend=proc)


def _row(s, name, **kw):
    (row,) = nur._our_segments(s, [name], **kw)
    return row


def _counts(s):
    return (
        len(s.read_text("/proc/sysvipc/shm").splitlines()) - 1,
        len(s.listdir("/dev/shm")),
        len(s.kernel.objects),
    )


def _drop(s, name, kind):
    with nur.SharedRegion.attach(name, kind=kind, backend=s.process()) as r:
        r.remove()


# -- the last-use slot ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_cleanup_keeps_a_region_its_last_user_closed_just_now(kind):
    s = sim("single-node")
    creator = s.process()
    _made(creator, "lu", kind).close()
    creator.exit()
    time.sleep(0.6)  # older than the minimum age below
    worker = s.process()
    nur.SharedRegion.attach("lu", kind=kind, backend=worker).close()
    worker.exit()  # detached just now, then gone
    row = _row(s, "lu", remove=True, min_age=0.5)
    assert row["action"] == "keep", row
    assert row["why"].startswith("used 0 s ago (minimum age 0.5 s)"), row
    alive = s.process()  # a last user still running keeps it past the minimum age
    nur.SharedRegion.attach("lu", kind=kind, backend=alive).close()
    time.sleep(0.6)
    row = _row(s, "lu", remove=True, min_age=0.5)
    assert row["action"] == "keep", row
    assert row["why"] == f"last user (pid {alive.pid}) is alive", row
    alive.exit()
    assert _row(s, "lu", remove=True, min_age=0.5)["action"] == "removed"
    assert _counts(s) == (0, 0, 0)


@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_cleanup_dry_run_changes_nothing_remove_does(kind):
    s = sim("single-node")
    creator = s.process()
    _made(creator, "dry", kind).close()
    creator.exit()
    time.sleep(0.6)
    looks = [_row(s, "dry", min_age=0.5) for _ in range(3)]  # a monitor listing
    assert [r["action"] for r in looks] == ["would remove"] * 3, looks
    assert _row(s, "dry", remove=True, min_age=0.5)["action"] == "removed"
    assert _counts(s) == (0, 0, 0)


def _flip_byte(address):
    """Damage one byte for sure: every bit of it inverted (writing a fixed value
    leaves it as it was when it already held that value: 1 run in 256 here, where
    the byte is the low one of a time stamp)."""
    cell = nu.ctypes.c_ubyte.from_address(address)
    cell.value ^= 0xFF


def test_last_use_slot_layout():
    s = sim("single-node")
    p = s.process()
    r = _made(p, "slot", "sysv")
    raw = bytes((nu.ctypes.c_char * 64).from_address(r.address + r.size))
    magic, fmt, pid, used, pidns, timens, boot, start, crc = struct.unpack("<8sIIdQQI16sI", raw)
    assert (magic, fmt, pid) == (b"numa_use", 1, p.pid)
    assert abs(used - time.time()) < 5
    assert (pidns, timens) == (4026531836, 4026531834)
    assert boot == zlib.crc32(b"simulated") and start.rstrip(b"\0") == str(100 * p.pid).encode()
    assert crc == zlib.crc32(raw[:60])
    # damaged: proves nothing, so the region stays (and says how to fix it)
    _flip_byte(r.address + r.size + 16)
    r.close()  # rewrites the slot: damage it after
    nur.SharedRegion.attach("slot", backend=s.process()).close()
    q = s.process()
    a = nur.SharedRegion.attach("slot", backend=q)
    _flip_byte(a.address + a.size + 16)
    q.exit()
    p.exit()
    row = _row(s, "slot", remove=True, min_age=0)
    assert row["action"] == "keep" and "last-use slot damaged" in row["why"], row
    _drop(s, "slot", "sysv")


# -- one live region per name --------------------------------------------------------


class _Hooked(nusim.SimulatedBackend):
    """A simulated process whose shmget runs ``hooks[(key, flags)]`` first."""

    hooks: dict = {}

    def call(self, name, *args):
        if name == "shmget":
            key, _, flags = args
            hook = self.hooks.pop((key, flags), None)
            if hook is not None:
                hook()
        return super().call(name, *args)


def test_two_creates_of_one_name_never_both_succeed_sim():
    s = sim("single-node")
    keys = nur._sysv_keys("twin")
    b1 = _made(s.process(), "twin", "sysv")  # B1 holds the first key
    a = _Hooked(fixture_root("single-node"), _kernel=s.kernel)
    made = []
    a.hooks = {
        (keys[0], 0): b1.destroy,  # B1 goes while A looks at it
        (keys[1], nur.IPC_CREAT | nur.IPC_EXCL | 0o600): lambda: made.append(
            _made(s.process(), "twin", "sysv")  # B2 takes the first key
        ),
    }
    with pytest.raises(FileExistsError, match="exists"):
        _made(a, "twin", "sysv")
    assert a.hooks == {} and made[0].ipc_key == keys[0]
    rows = nur._our_segments(s, ["twin"])
    assert [r["key"] for r in rows] == [f"0x{keys[0]:08x}"], rows
    made[0].destroy()
    assert _counts(s) == (0, 0, 0)


def _named(s, ikey, name):
    """A segment under ``ikey`` named ``name`` by its record, not yet made (no slot)."""
    shmid = s.call(
        "shmget", ikey, 3 * 4096 + nur._RECORD_ROOM, nur.IPC_CREAT | nur.IPC_EXCL | 0o600
    )
    addr = s.call("shmat", shmid)
    rec = {"key": name, "kind": "sysv", "size": 3 * 4096, "page_size": 4096, **s.call("whoami")}
    nur._record_write(addr, 3 * 4096 + nur._RECORD_ROOM, rec)
    return shmid, addr


def test_racing_creators_the_earlier_key_wins(monkeypatch):
    monkeypatch.setattr(nur, "_TWIN_WAIT", 0.3)
    s = sim("single-node")
    keys = nur._sysv_keys("race")
    # Being made under an earlier key: the later one gives way at once.
    other, stranger = s.process(), s.process(uid=1001)
    theirs = stranger.call("shmget", keys[0], MiB, nur.IPC_CREAT | 0o600)  # passed by
    early = []

    def name_first_key():
        stranger.call("shm_rmid", theirs)
        early.append(_named(other, keys[0], "race"))

    hook = _Hooked(fixture_root("single-node"), _kernel=s.kernel)
    hook.hooks = {(keys[1], nur.IPC_CREAT | nur.IPC_EXCL | 0o600): name_first_key}
    t0 = time.monotonic()
    with pytest.raises(FileExistsError, match=f"region 'race' exists .*0x{keys[0]:08x}"):
        _made(hook, "race", "sysv")
    assert early and time.monotonic() - t0 < 0.3
    other.call("shmdt", early[0][1])
    other.call("shm_rmid", early[0][0])
    shmid, addr = _named(other, keys[1], "race")
    # Being made under a later key: the earlier waits; one that never ends loses it.
    t0 = time.monotonic()
    with pytest.raises(FileExistsError, match="exists"):
        _made(s.process(), "race", "sysv")
    assert time.monotonic() - t0 >= 0.3
    # ... and one that undoes itself meanwhile leaves the name to the earlier key.
    gone = []

    def undo():
        gone.append(1)
        other.call("shmdt", addr)
        other.call("shm_rmid", shmid)

    class Undoing(nusim.SimulatedBackend):
        def call(self, name, *args):
            if name == "shm_stat" and args[0] == shmid and not gone:
                undo()
            return super().call(name, *args)

    r = _made(Undoing(fixture_root("single-node"), _kernel=s.kernel), "race", "sysv")
    assert r.ipc_key == keys[0] and gone
    r.destroy()
    assert _counts(s) == (0, 0, 0)


# -- who is gone ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_creator_in_another_time_namespace_is_not_judged_gone(kind):
    s = sim("single-node")
    creator = s.process()
    creator.boottime = 100000  # `unshare --time --boottime 100000`
    _made(creator, "tns", kind).close()
    row = _row(s, "tns", remove=True, min_age=0)
    assert row["action"] == "keep", row
    assert "another time namespace" in row["why"], row
    creator.exit()  # gone for real: no such pid
    assert _row(s, "tns", remove=True, min_age=0)["action"] == "removed"
    assert _counts(s) == (0, 0, 0)


def test_another_users_file_under_the_name_says_whose():
    s = sim("single-node")
    other = s.process(uid=1001)
    other.call("close", other.call("shm_open", "numa_utils-theirs", os.O_RDWR | os.O_CREAT, 0o600))
    with pytest.raises(FileExistsError) as e:
        _made(s.process(), "theirs", "posix")
    assert "belongs to uid 1001" in str(e.value), e.value
    assert "cleanup --remove" not in str(e.value), e.value
    other.call("shm_unlink", "numa_utils-theirs")


def test_posix_attach_waits_for_a_lock_a_bounded_time(monkeypatch):
    monkeypatch.setattr(nur, "_LOCK_WAIT", 0.3)
    s = sim("single-node")
    r = _made(s.process(), "locked", "posix")
    hostile = s.process()
    fd = hostile.call("shm_open", "numa_utils-locked", os.O_RDONLY, 0)
    r.close()
    hostile.call("flock", fd, nur.LOCK_EX)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="exclusively locked for 0.3 s by"):
        nur.SharedRegion.attach("locked", kind="posix", backend=s.process())
    assert time.monotonic() - t0 < 5
    hostile.call("close", fd)
    _drop(s, "locked", "posix")


# -- the real kernel -----------------------------------------------------------------
# Each snippet prints one JSON line; run in private namespaces as root (it switches
# users where the repro needs another one).

_REPROS = r"""
import json, os, struct, subprocess, sys, time, zlib
import numa_utils as nu, numa_utils_cli as cli, numa_utils_regions as nur, numa_utils_threads as nut
out = {}

def rows(name, min_age=0.5):
    return {r["region"]: r for r in nur._our_segments(nu.LinuxBackend(), [name], remove=True,
                                                     min_age=min_age)}

# 26.1: a POSIX region whose worker detached just now
subprocess.run([sys.executable, "-c", "import numa_utils as nu, numa_utils_regions as nur\n"
    "nur.SharedRegion.create('lu', 1 << 20, prefault=False, kind='posix').close()"], check=True)
time.sleep(0.7)
w = subprocess.Popen([sys.executable, "-c", "import numa_utils_regions as nur, sys\n"
    "nur.SharedRegion.attach('lu', kind='posix').close(); print('closed', flush=True)\n"
    "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert w.stdout.readline().strip() == "closed"
out["used"] = rows("lu").get("lu", {}).get("why")
time.sleep(0.7)
out["alive"] = rows("lu").get("lu", {}).get("why")
w.stdin.close(); w.wait()
out["gone"] = rows("lu").get("lu", {}).get("action")

# 26.2: a dry run, then --remove
for kind in ("sysv", "posix"):
    subprocess.run([sys.executable, "-c", "import numa_utils as nu, numa_utils_regions as nur, os\n"
        f"nur.SharedRegion.create('dry-{kind}', 1 << 20, prefault=False, kind='{kind}')\n"
        "os._exit(0)"], check=True)
time.sleep(1.6)  # shm_atime and shm_dtime count whole seconds
for kind in ("sysv", "posix"):
    name = f"dry-{kind}"
    dry = nur._our_segments(nu.LinuxBackend(), [name], min_age=1.5)[0]["action"]
    out[name] = [dry, rows(name, 1.5).get(name, {}).get("action")]

# 26.5: a forked child leaving the creator's `with`
for kind in ("sysv", "posix"):
    with nur.SharedRegion.create(f"fork-{kind}", 1 << 20, prefault=False, kind=kind) as r:
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        try:
            nur.SharedRegion.attach(f"fork-{kind}", kind=kind).close()
            out[f"fork-{kind}"] = "attached"
        except OSError as e:
            out[f"fork-{kind}"] = repr(e)

# 26.19: a zombie creator, and a record whose pid is 2**70 (the run goes on)
zombie = os.fork()
if zombie == 0:
    nur.SharedRegion.create("zombie", 1 << 20, prefault=False, kind="posix").close()
    os._exit(0)
while open(f"/proc/{zombie}/stat").read().rpartition(")")[2].split()[0] != "Z":
    time.sleep(0.01)
nur.SharedRegion.create("huge-pid", 1 << 20, prefault=False, kind="posix").close()
path = "/dev/shm/numa_utils-huge-pid"
rec = nur._file_record(path)[1]
rec["pid"] = 2 ** 70
raw = json.dumps(rec).encode()
blob = raw + struct.pack("<8sIII", b"numa_utl", 1, len(raw), zlib.crc32(raw))
fd = os.open(path, os.O_RDWR)
os.pwrite(fd, blob, os.fstat(fd).st_size - len(blob))
os.close(fd)
time.sleep(0.7)
got = {r["region"]: r for r in nur._our_segments(nu.LinuxBackend(), remove=True, min_age=0.5)}
out["zombie"] = got.get("zombie", {}).get("action")
out["huge-pid"] = got.get("huge-pid", {}).get("why")
os.waitpid(zombie, 0)
os.unlink(path)
print(json.dumps(out))
"""


@pytest.mark.realkernel
def test_real_lifecycle_repros():
    got = run_private_shm(_REPROS, timeout=600)
    assert got.returncode == 0, got.stdout + got.stderr
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert out["used"].startswith("used 0 s ago"), out
    assert out["alive"].startswith("last user (pid ") and out["alive"].endswith("is alive"), out
    assert out["gone"] == "removed", out
    assert out["dry-sysv"] == out["dry-posix"] == ["would remove", "removed"], out
    assert out["fork-sysv"] == out["fork-posix"] == "attached", out
    assert out["zombie"] == "removed", out
    assert out["huge-pid"] == (
        "creator's pid '1180591620717411303424' is not a process id: damaged record"
    ), out


_TWINS = r"""
import json
import numa_utils as nu, numa_utils_regions as nur, numa_utils_threads as nut
keys = nur._sysv_keys("twin")
made = []
class A(nu.LinuxBackend):
    def call(self, name, *args):
        key, flags = (args[0], args[2]) if name == "shmget" else (None, 0)
        if key == keys[0] and flags == 0 and b1:
            b1.pop().destroy()                         # B1 goes while A looks at it
        if key == keys[1] and flags & nur.IPC_CREAT and not made:
            made.append(nur.SharedRegion.create("twin", 1 << 20, prefault=False))  # B2
        return super().call(name, *args)
b1 = [nur.SharedRegion.create("twin", 1 << 20, prefault=False)]
try:
    nur.SharedRegion.create("twin", 1 << 20, prefault=False, backend=A())
    result = "A made it too"
except FileExistsError as e:
    result = str(e)
held = [ln.split()[0] for ln in open("/proc/sysvipc/shm").read().splitlines()[1:]]
print(json.dumps({"a": result, "b2": made[0].ipc_key, "keys": keys[:2],
                  "held": [int(k) & 0xFFFFFFFF for k in held]}))
made[0].destroy()
"""


@pytest.mark.realkernel
def test_real_two_creates_of_one_name_never_both_succeed():
    got = run_private_shm(_TWINS, timeout=600)
    assert got.returncode == 0, got.stdout + got.stderr
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert "exists" in out["a"], out
    assert out["b2"] == out["keys"][0] and out["held"] == [out["keys"][0]], out


_TIMENS = r"""
import json, subprocess, sys, time
import numa_utils as nu, numa_utils_cli as cli, numa_utils_regions as nur, numa_utils_threads as nut
made = []
for kind in ("sysv", "posix"):
    p = subprocess.Popen(["unshare", "--time", "--boottime", "100000", "--fork", sys.executable,
        "-c", "import numa_utils as nu, numa_utils_regions as nur, numa_utils_threads as nut, sys\n"
        f"r = nur.SharedRegion.create('tns-{kind}', 1 << 20, prefault=False, kind='{kind}')\n"
        "r.close(); print('made', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if line != "made":
        print(json.dumps({"skip": p.stderr.read().strip()[-300:]}))
        sys.exit(0)
    made.append(p)
got = {r["region"]: r["why"] for r in nur._our_segments(nu.LinuxBackend(), remove=True,
                                                        min_age=0)}
for p in made:
    p.stdin.close(); p.wait()
gone = {r["region"]: r["action"] for r in nur._our_segments(nu.LinuxBackend(), remove=True,
                                                             min_age=0)}
print(json.dumps({"kept": got, "after": gone}))
"""


@pytest.mark.realkernel
def test_real_creator_in_a_time_namespace_is_kept():
    got = run_private_shm(_TIMENS, timeout=600)
    assert got.returncode == 0, got.stdout + got.stderr
    out = json.loads(got.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(f"unshare --time not allowed here: {out['skip']}")
    for kind in ("sysv", "posix"):
        assert "another time namespace" in out["kept"][f"tns-{kind}"], out
        assert out["after"][f"tns-{kind}"] == "removed", out


_LOCKED = r"""
import fcntl, json, os, subprocess, sys, time
import numa_utils as nu, numa_utils_regions as nur, numa_utils_threads as nut
nur._LOCK_WAIT = 0.5
nur.SharedRegion.create("locked", 1 << 20, prefault=False, kind="posix", mode=0o644).close()
holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys\n"
    "os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)\n"
    "fd = os.open('/dev/shm/numa_utils-locked', os.O_RDONLY)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "locked"
t0 = time.monotonic()
try:
    nur.SharedRegion.attach("locked", kind="posix").close()
    result = "attached"
except TimeoutError as e:
    result = str(e)
took = time.monotonic() - t0
holder.stdin.close(); holder.wait()
os.unlink("/dev/shm/numa_utils-locked")
print(json.dumps({"result": result, "took": took, "holder": holder.pid}))
"""


@pytest.mark.realkernel
def test_real_another_users_lock_does_not_block_attach_for_ever():
    if os.geteuid() != 0:
        pytest.skip("needs root to hold the lock as another user")
    got = run_private_shm(_LOCKED, timeout=600)
    assert got.returncode == 0, got.stdout + got.stderr
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert f"by pid {out['holder']} (" in out["result"] and "uid 65534" in out["result"], out
    assert out["took"] < 60, out  # bounded (0.5 s asked here), not for ever


# -- attach(wait=) ---------------------------------------------------------------------


class _LateCreator(nusim.SimulatedBackend):
    """An attacher whose third look finds the region made (by another process)."""

    looks = 0

    def call(self, name, *args):
        if name == "shm_open":
            self.looks += 1
            if self.looks == 3:
                _made(self.creator, "late", "posix").close()
        elif name == "shmget" and args[0] == nur._sysv_key("late") and not args[2]:
            self.looks += 1
            if self.looks == 3:
                _made(self.creator, "late", "sysv").close()
        return super().call(name, *args)


@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_attach_waits_for_a_region_being_made(kind):
    s = sim("single-node")
    late = _LateCreator(fixture_root("single-node"), _kernel=s.kernel)
    late.creator = s.process()
    with pytest.raises(FileNotFoundError):
        nur.SharedRegion.attach("late", kind=kind, backend=late)  # no wait: at once
    r = nur.SharedRegion.attach("late", kind=kind, backend=late, wait=5)
    assert r.size == MiB and late.looks >= 3
    r.close()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"region 'never' not made within 0.2 s: no "):
        nur.SharedRegion.attach("never", kind=kind, backend=s.process(), wait=0.2)
    assert 0.2 <= time.monotonic() - t0 < 2
    for bad in (-1, True, "1", float("nan")):
        with pytest.raises(ValueError, match="a number of seconds"):
            nur.SharedRegion.attach("late", kind=kind, backend=s.process(), wait=bad)
    _drop(s, "late", kind)
    assert _counts(s) == (0, 0, 0)


class _LateAfterSquatter(nusim.SimulatedBackend):
    """An attacher whose third look at the name's first SysV key (another user's
    segment) has its region made meanwhile, under the name's second key."""

    looks = 0

    def call(self, name, *args):
        if name == "shmget" and args[0] == nur._sysv_key("sq") and not args[2]:
            self.looks += 1
            if self.looks == 3:
                _made(self.creator, "sq", "sysv").close()
        return super().call(name, *args)


@pytest.mark.parametrize("mode", [0o644, 0o600])
def test_attach_waits_past_another_users_segment_under_the_name(mode):
    # Another user holds the name's first key with a record naming the region: that
    # segment is not this user's region, so a waiting attach waits past it (create
    # passes it by), and at the deadline names what it found.
    s = sim("single-node")
    squatter = nur.SharedRegion.create(
        "sq", MiB, mode=mode, prefault=False, backend=s.process(uid=1001)
    )
    assert squatter.ipc_key == nur._sysv_key("sq")
    late = _LateAfterSquatter(fixture_root("single-node"), _kernel=s.kernel)
    late.creator = s.process()
    with pytest.raises(PermissionError):  # no wait: at once, as before
        nur.SharedRegion.attach("sq", backend=s.process())
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        nur.SharedRegion.attach("sq", backend=s.process(), wait=0.3)
    assert time.monotonic() - t0 >= 0.3
    assert f"SysV segment 0x{nur._sysv_key('sq'):08x}" in str(e.value), e.value
    assert "uid 1001" in str(e.value) or "Permission denied" in str(e.value), e.value
    r = nur.SharedRegion.attach("sq", backend=late, wait=8)
    assert late.looks >= 3 and r.ipc_key == nur._sysv_keys("sq")[1]
    r.close()
    _drop(s, "sq", "sysv")
    squatter.destroy()
    assert _counts(s) == (0, 0, 0)


@pytest.mark.parametrize("mode", [0o644, 0o600])
def test_posix_attach_waits_past_another_users_file(mode):
    s = sim("single-node")
    other = s.process(uid=1001)
    squatter = nur.SharedRegion.create(
        "psq", MiB, mode=mode, kind="posix", prefault=False, backend=other
    )
    with pytest.raises(PermissionError):
        nur.SharedRegion.attach("psq", kind="posix", backend=s.process())
    with pytest.raises(TimeoutError, match="/dev/shm/numa_utils-psq"):
        nur.SharedRegion.attach("psq", kind="posix", backend=s.process(), wait=0.2)
    squatter.destroy()
    assert _counts(s) == (0, 0, 0)


# Another user (65534) holds the name's first SysV key with a record naming it; a
# worker of user 1000 waits while that user's creator makes the region 0.5 s later.
_SQUATTED = r"""
import json, os, sys, time
import numa_utils_regions as nur

# The other users may not read this interpreter's library: every import first, as root.
with nur.SharedRegion.create("warm", 1 << 20, prefault=False):
    nur.SharedRegion.attach("warm", wait=1).close()


def as_user(uid, fn):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
        try:
            out = fn()
        except BaseException as e:
            out = repr(e)
        os.write(w, json.dumps(out).encode()); os._exit(0)
    os.close(w)
    return pid, r


def result(child):
    pid, r = child
    with os.fdopen(r) as f:
        out = json.loads(f.read())
    os.waitpid(pid, 0)
    return out


def squat(mode):
    nur.SharedRegion.create("sq", 1 << 20, mode=mode, prefault=False).close()
    return hex(nur._sysv_key("sq"))


def worker(wait):
    t0 = time.monotonic()
    try:
        with nur.SharedRegion.attach("sq", wait=wait) as r:
            got = hex(r.ipc_key)
    except OSError as e:
        got = repr(e)
    return [got, time.monotonic() - t0]


def creator():
    time.sleep(0.5)
    with nur.SharedRegion.create("sq", 1 << 20, prefault=False) as r:
        time.sleep(2)  # the worker attaches meanwhile
        return hex(r.ipc_key)


out = {}
for mode in (0o644, 0o600):
    out[oct(mode)] = {"squatter": result(as_user(65534, lambda: squat(mode)))}
    out[oct(mode)]["alone"] = result(as_user(1000, lambda: worker(0.5)))
    w = as_user(1000, lambda: worker(8))
    c = as_user(1000, creator)
    out[oct(mode)]["worker"], out[oct(mode)]["creator"] = result(w), result(c)
    os.system("ipcrm --all=shm")
out["keys"] = [hex(k) for k in nur._sysv_keys("sq")[:2]]
print(json.dumps(out))
"""


@pytest.mark.realkernel
def test_real_attach_waits_past_another_users_squatter():
    if os.geteuid() != 0:
        pytest.skip("needs root to act as two other users")
    got = run_private_shm(_SQUATTED, timeout=600)
    assert got.returncode == 0, got.stdout + got.stderr
    out = json.loads(got.stdout.strip().splitlines()[-1])
    first, second = out["keys"]
    for mode in ("0o644", "0o600"):
        run = out[mode]
        assert run["squatter"] == first, out
        alone, took = run["alone"]
        assert alone.startswith("TimeoutError") and first[2:] in alone and took >= 0.5, out
        assert run["creator"] == second and run["worker"][0] == second, out


# -- a creator killed before the region's first record ------------------------------


class _Killed(Exception):
    """The creator dies here (kill -9): nothing of it runs afterwards."""


def _kill_at(monkeypatch, proc, step):
    """Make ``proc``'s create die (no undo runs) right after its call ``step``
    returns, or in its layout apply ("layout")."""
    from conftest import hook_call

    monkeypatch.setattr(nur, "_undo", lambda held, region: nur._release_signals(held))

    def die(*args, **kw):
        raise _Killed

    if step == "layout":
        monkeypatch.setattr(nur, "_layout_apply", die)
        return
    real = None

    def then_die(*args):
        real(*args)
        die()

    real = hook_call(proc, step, then_die)


_STEPS = [
    ("sysv", "shmget"),
    ("sysv", "shmat"),
    ("sysv", "layout"),
    ("posix", "shm_open"),
    ("posix", "flock"),
    ("posix", "ftruncate"),
    ("posix", "mmap"),
    ("posix", "layout"),
]


@pytest.mark.parametrize("kind, step", _STEPS, ids=[f"{k}-{s}" for k, s in _STEPS])
def test_a_creator_killed_before_the_first_record_leaves_what_replace_frees(
    monkeypatch, kind, step
):
    s = sim("single-node")
    creator = s.process()
    _kill_at(monkeypatch, creator, step)
    with pytest.raises(_Killed):
        nur.SharedRegion.create("oom", MiB, kind=kind, layout="parts:bind:0", backend=creator)
    monkeypatch.undo()
    assert _counts(s) != (0, 0, 0)
    # While its creator lives, the half-made region is kept and the name refused;
    # but a file not yet locked (its creator checks after its lock that it still has
    # its name: the next test).
    (row,) = nur.cleanup("oom", min_age=0, backend=s)
    if step == "shm_open":
        assert row["action"] == "would remove", row
    else:
        assert row["action"] == "keep", row
    with pytest.raises(FileExistsError):
        _made(s.process(), "oom", kind)
    creator.exit()  # killed
    (row,) = nur.cleanup("oom", min_age=0, backend=s)
    assert row["action"] == "would remove", row
    new = nur.SharedRegion.create("oom", MiB, kind=kind, backend=s.process(), existing="replace")
    assert new.created
    new.destroy()
    assert _counts(s) == (0, 0, 0)


def test_a_posix_creator_whose_file_is_taken_before_its_lock_leaves_the_new_one(monkeypatch):
    from conftest import hook_call

    s = sim("single-node")
    slow, fast = s.process(), s.process()
    made = []

    def shm_open(*args):
        fd = real(*args)
        if args[1] & os.O_CREAT and not made:  # between its open and its lock
            made.append(
                nur.SharedRegion.create("race", MiB, kind="posix", backend=fast, existing="replace")
            )
        return fd

    real = hook_call(slow, "shm_open", shm_open)
    with pytest.raises(FileExistsError, match="was removed while being made"):
        nur.SharedRegion.create("race", MiB, kind="posix", backend=slow)
    made[0].buffer()[0] = 5
    with nur.SharedRegion.attach("race", kind="posix", backend=s.process()) as r:
        assert r.buffer()[0] == 5
    assert slow.fds == {} and slow.mappings == []
    made[0].destroy()
    assert _counts(s) == (0, 0, 0)


# SIGKILL right after each step of a create of base pages (or inside its layout
# apply), then cleanup of the name, and again, then create(existing="replace").
_KILLED = r"""
import json, os, signal
import numa_utils as nu, numa_utils_regions as nur


class Dying(nu.LinuxBackend):
    step = ""

    def call(self, name, *args):
        out = super().call(name, *args)
        if name == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
        return out


def killed_at(kind, step):
    pid = os.fork()
    if pid == 0:
        backend = Dying()
        backend.step = step
        if step == "layout":
            nur._layout_apply = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        try:
            nur.SharedRegion.create("oom", 1 << 20, kind=kind, layout="parts:bind:0",
                                    backend=backend)
        finally:
            os._exit(3)
    status = os.waitpid(pid, 0)[1]
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


out = {}
for kind, step in [("sysv", "shmget"), ("sysv", "shmat"), ("sysv", "layout"),
                   ("posix", "shm_open"), ("posix", "flock"), ("posix", "ftruncate"),
                   ("posix", "mmap"), ("posix", "layout")]:
    row = out[f"{kind}-{step}"] = {"killed": [killed_at(kind, step)]}
    row["cleanup"] = [r["action"] for r in nur.cleanup("oom", remove=True, min_age=0)]
    row["killed"].append(killed_at(kind, step))
    try:
        nur.SharedRegion.create("oom", 1 << 20, kind=kind, existing="replace").destroy()
        row["replace"] = "made"
    except OSError as e:
        row["replace"] = repr(e)
    row["left"] = [r["action"] for r in nur.cleanup(min_age=0)]
print(json.dumps(out))
"""


@pytest.mark.realkernel
def test_real_a_creator_killed_at_each_step_leaves_what_replace_frees():
    got = run_private_shm(_KILLED, timeout=600)
    assert got.returncode == 0, got.stdout + got.stderr
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert len(out) == 8, out
    for step, row in out.items():
        assert row["killed"] == [True, True], (step, row)
        assert row["cleanup"] == ["removed"], (step, row)
        assert row["replace"] == "made" and row["left"] == [], (step, row)


# -- the library's cleanup, and create(existing=) --------------------------------------


def test_library_cleanup_returns_one_verdict_per_region():
    s = sim("single-node")
    dead = s.process()
    _made(dead, "lib-dead", "sysv").close()
    _made(dead, "lib-dead", "posix").close()
    dead.exit()
    busy = _made(s.process(), "lib-busy", "posix")
    rows = nur.cleanup(min_age=0, backend=s)
    got = {(r["region"], r["kind"]): (r["action"], r["why"]) for r in rows}
    assert got == {
        ("lib-dead", "sysv"): ("would remove", ""),
        ("lib-dead", "posix"): ("would remove", ""),
        ("lib-busy", "posix"): ("keep", "in use: a process holds its lock"),
    }, got
    rows = nur.cleanup("lib-dead", True, 0, backend=s)  # one key, positional arguments
    assert sorted((r["kind"], r["action"]) for r in rows) == [
        ("posix", "removed"),
        ("sysv", "removed"),
    ]
    assert nur.cleanup(["lib-dead"], remove=True, backend=s) == []
    for bad in (-1, True, float("nan"), "30"):
        with pytest.raises(ValueError, match="a number of seconds"):
            nur.cleanup(min_age=bad, backend=s)
    busy.destroy()
    assert _counts(s) == (0, 0, 0)


@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_create_existing_replace_and_reuse(kind):
    s = sim("single-node")
    crashed = s.process()
    old = _made(crashed, "restart", kind)
    old.buffer()[0] = 7
    with pytest.raises(ValueError, match="existing="):
        nur.SharedRegion.create("restart", MiB, kind=kind, backend=s.process(), existing="x")
    alive = s.process()
    with pytest.raises(FileExistsError, match=r"not proven stale \(in use"):
        nur.SharedRegion.create("restart", MiB, kind=kind, backend=alive, existing="replace")
    peer = s.process()
    same = nur.SharedRegion.create("restart", MiB, kind=kind, backend=peer, existing="reuse")
    assert same.buffer()[0] == 7 and not same.created
    same.close()
    with pytest.raises(FileExistsError, match="existing='reuse' attaches only"):
        nur.SharedRegion.create("restart", 2 * MiB, kind=kind, backend=peer, existing="reuse")
    peer.exit()
    crashed.exit()  # its engine died: the restart replaces it
    new = nur.SharedRegion.create("restart", MiB, kind=kind, backend=alive, existing="replace")
    assert new.created and new.buffer()[0] == 0
    new.destroy()
    assert _counts(s) == (0, 0, 0)


@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_attach_created_after_skips_a_crashed_runs_region(kind):
    # A restarted engine's worker starts before its creator: the region a crashed run
    # left is not the one it waits for, and waiting leaves it unattached, so the
    # creator's existing="replace" proves it stale and replaces it.
    s = sim("single-node")
    crashed = s.process()
    old = _made(crashed, "again", kind)
    old.buffer()[0] = 7
    old.close()
    crashed.exit()
    time.sleep(0.01)  # the record keeps milliseconds
    start = time.time()
    worker = s.process()
    with pytest.raises(FileNotFoundError, match="earlier run"):
        nur.SharedRegion.attach("again", kind=kind, backend=worker, created_after=start)
    with pytest.raises(TimeoutError, match="not made within"):
        nur.SharedRegion.attach("again", kind=kind, backend=worker, created_after=start, wait=0.2)
    creator = s.process()
    new = nur.SharedRegion.create("again", MiB, kind=kind, backend=creator, existing="replace")
    assert new.created
    got = nur.SharedRegion.attach("again", kind=kind, backend=worker, created_after=start, wait=1)
    assert got.buffer()[0] == 0 and got.identity["created"] >= start
    got.close()
    for bad in (True, "soon", float("nan")):
        with pytest.raises(ValueError, match="created_after="):
            nur.SharedRegion.attach("again", kind=kind, backend=worker, created_after=bad)
    new.destroy()
    assert _counts(s) == (0, 0, 0)


def test_create_existing_reuse_waits_for_a_peer_making_it(monkeypatch):
    s = sim("single-node")
    first = _made(s.process(), "peer", "posix")
    seen = []
    real_attach = nur.SharedRegion.attach.__func__

    def attach(cls, key, *args, **kw):
        seen.append(kw.get("wait"))
        return real_attach(cls, key, *args, **kw)

    monkeypatch.setattr(nur.SharedRegion, "attach", classmethod(attach))
    peer = s.process()
    same = nur.SharedRegion.create("peer", MiB, kind="posix", backend=peer, existing="reuse")
    again = nur.SharedRegion.create(
        "peer", MiB, kind="posix", backend=peer, existing="reuse", wait=3
    )
    assert not same.created and seen == [nur._REUSE_WAIT, 3]
    same.close()
    again.close()
    first.destroy()
    assert _counts(s) == (0, 0, 0)


@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_cleanup_command_names_regions_and_says_how_to_remove_a_young_one(kind, capsys):
    """`cleanup --remove --key kv` right after `region kv --keep` keeps it for the
    minimum age: the row names the region (what --key takes) and the command says
    why it stayed and how to remove it now."""
    from conftest import cli

    s = sim("single-node")
    maker = s.process()
    _made(maker, "kv", kind).close()
    maker.exit()
    with nu.use_backend(s):
        assert cli.main(["cleanup", "--remove", "--key", "kv"]) == 0
        kept = capsys.readouterr().out
        row = [line for line in kept.splitlines() if "keep:" in line]
        assert len(row) == 1 and row[0].split()[0] == "kv", kept
        assert "minimum age 30 s" in row[0], kept
        assert "--min-age 0 removes it now if nobody uses it" in kept, kept
        assert cli.main(["cleanup", "--remove", "--key", "kv", "--min-age", "0"]) == 0
        removed = capsys.readouterr().out
    assert "kv" in removed and "removed" in removed and "--min-age 0" not in removed, removed
    assert _counts(s) == (0, 0, 0)
