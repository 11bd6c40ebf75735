"""Shared test setup.  The suite reaches the module under test through ONE line:"""

import functools
import os
import pathlib
import re
from types import MappingProxyType

import pytest

import numa_utils as nu  # noqa: F401  <- point the whole suite at another copy here
import numa_utils_cli as cli  # noqa: F401  the commands beyond status
import numa_utils_regions as nur  # noqa: F401  shared-memory regions, counters, CUDA pinning
import numa_utils_sim as nusim  # noqa: F401  the simulator
import numa_utils_threads as nut  # noqa: F401  thread roles, settle, remote share

REPO = pathlib.Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO / "fake_sysfs"
# One text archive per saved machine (fake_sysfs/README.md has the format): its
# root/ tree, SOURCE.md and expected.json.  Read in place, never unpacked per test.
FIXTURES = sorted(p.name[:-4] for p in FIXTURES_DIR.glob("*.txt")) if FIXTURES_DIR.is_dir() else []
assert FIXTURES, "no fixtures found under fake_sysfs/"


# -- the saved machines, each parsed once per process -----------------------------------
# A SimulatedBackend, LinuxBackend(open_tree(...)) and --root parse their archive each
# time (0.05-0.1 s, more than most tests take): test_fit alone makes 1,200 backends.
# The archives under fake_sysfs/ are parsed once per process instead, keyed by the
# file's identity, time and size (an edited one is parsed again), and held read-only;
# each caller still gets a SavedTree of its own (its link cache and walk budget
# fresh).  Every other tree (the damaged copies test_hostile and test_archive make,
# folders, temporary archives) is read by numa_utils_sim itself, every time.
_parsed = {}


def _parsed_archive(path: str, root_only: bool) -> "nusim.SavedArchive":
    st = os.stat(path)
    key = (path, root_only, st.st_ino, st.st_mtime_ns, st.st_size)
    got = _parsed.get(key)
    if got is None:
        got = nusim.SavedArchive(path)
        if root_only:
            got.subtree()
        got.files, got.links = MappingProxyType(got.files), MappingProxyType(got.links)
        got.dirs = MappingProxyType(got.dirs)
        _parsed[key] = got
    return got


def _is_fixture(path) -> bool:
    path = os.path.abspath(path)
    return os.path.dirname(path) == str(FIXTURES_DIR) and os.path.isfile(path)


_open_tree = nusim.open_tree


def _open_tree_parsed_once(path: str) -> "nusim.SavedTree":
    if _is_fixture(path):
        return nusim.SavedTree(_parsed_archive(os.path.abspath(path), True))
    return _open_tree(path)


nusim.open_tree = _open_tree_parsed_once


def fixture_archive(name: str) -> "nusim.SavedArchive":
    """Fixture ``name``'s whole archive (root/, SOURCE.md, expected.json), read-only."""
    return _parsed_archive(fixture_root(name), False)


def fixture_root(name: str) -> str:
    """The saved machine ``name``: its archive, which --root, LinuxBackend and
    SimulatedBackend read as they read a folder."""
    return str(FIXTURES_DIR / f"{name}.txt")


def saved_backend(path) -> "nu.LinuxBackend":
    """A LinuxBackend over the saved tree at ``path``: a folder, or a tree saved in one
    file (numa_utils_sim.SavedArchive reads those)."""
    return nu.LinuxBackend(nusim.open_tree(str(path)))


def fixture_text(name: str, rel: str) -> str:
    """One file of fixture ``name``: "SOURCE.md", "expected.json", "root/proc/meminfo"."""
    return fixture_archive(name).files[rel].decode()


# A copy of a tree is one new file per entry: dual-socket-8gpu's 3,435 cost 1-2 s of
# CPU on a busy disk, more than the test that damages the copy.  A hard link costs
# about a thirtieth of that, so each process writes each fixture out once, whole (its
# "pristine" folder, under the session's temporary folder), and a copy links its files
# to those, making only its folders and symbolic links.  A test that writes into a
# linked file in place writes into the pristine one too: every pristine file is
# written with modification time 0, and one whose time, size or mode is no longer
# what it was written with is written again before the next copy links to it.
_pristine = {}
_pristine_base = []
_session_tmp = []  # the session's tmp_path_factory, for the hook below (pytest_pyfunc_call)


@pytest.fixture(scope="session", autouse=True)
def _session_folders(tmp_path_factory):
    _session_tmp.append(tmp_path_factory)
    _pristine_base.append(tmp_path_factory.mktemp("pristine"))
    yield
    _pristine_base.clear()
    _pristine.clear()
    _session_tmp.clear()


def _write_pristine(path: pathlib.Path, data: bytes) -> None:
    if path.exists():
        path.unlink()
    path.write_bytes(data)
    os.chmod(path, 0o644)
    os.utime(path, ns=(0, 0))


def _pristine_tree(name: str):
    """Fixture ``name`` written out whole, checked: the folder, or None outside a session."""
    if not _pristine_base:
        return None
    a = fixture_archive(name)
    base = _pristine.get(name)
    if base is None:
        base = _pristine_base[0] / name
        for rel in a.dirs:
            (base / rel).mkdir(parents=True, exist_ok=True)
        for rel, data in a.files.items():
            _write_pristine(base / rel, data)
        _pristine[name] = base
        return base
    for rel, data in a.files.items():
        st = os.lstat(base / rel)
        if (st.st_mtime_ns, st.st_size, st.st_mode) != (0, len(data), 0o100644):
            _write_pristine(base / rel, data)
    return base


def fixture_tree(name: str, dst, sub: str = "root") -> str:
    """A writable copy of fixture ``name``'s ``sub`` folder made at ``dst`` (for tests
    that damage a tree); ``dst`` as a string.  Its files are hard links to the
    process's pristine copy (see above): two copies made in one test share them, so a
    write in place into one shows in the other (unlink the file first to part them)."""
    a = fixture_archive(name)
    src = _pristine_tree(name)
    dst = pathlib.Path(dst)
    pre = sub + "/" if sub else ""
    dst.mkdir(parents=True, exist_ok=True)
    for rel in a.dirs:
        if rel.startswith(pre):
            (dst / rel[len(pre) :]).mkdir(parents=True, exist_ok=True)
    for rel, data in a.files.items():
        if rel.startswith(pre):
            try:
                if src is None:  # outside a pytest session
                    raise FileNotFoundError
                os.link(src / rel, dst / rel[len(pre) :])
            except OSError:  # no pristine copy, or another file system
                (dst / rel[len(pre) :]).write_bytes(data)
    for rel, target in a.links.items():
        if rel.startswith(pre):
            os.symlink(target, dst / rel[len(pre) :])
    return str(dst)


# The fake GPU runtimes (test_pin, test_observe, test_gpu) are C built as shared
# libraries, one per test: their counters are the library's globals, fresh in each
# loaded copy.  The compiler runs once per process for each source; each test gets a
# copy of the file (a copy, not a link: the loader takes a second path to the same
# file for the library it already loaded, counters and all).
_built = {}


def shared_library(source: str, dst, *flags: str) -> str:
    """C ``source`` built as a shared library at ``dst`` (with -lpthread and
    ``flags``), a file of its own; skips the calling test without a C compiler."""
    import shutil
    import subprocess

    key = (source, flags)
    if key not in _built:
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            pytest.skip("no C compiler (cc or gcc) to build a fake GPU runtime")
        where = _session_tmp[0].mktemp("lib") if _session_tmp else pathlib.Path(dst).parent
        (where / "lib.c").write_text(source)
        out = where / "lib.so"
        subprocess.run(
            [cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(where / "lib.c"), "-lpthread"]
            + list(flags),
            check=True,
            capture_output=True,
        )
        _built[key] = out
    shutil.copyfile(_built[key], dst)
    return str(dst)


def hook_call(backend, name, replacement):
    """Make ``backend.call(name, *args)`` return ``replacement(*args)``, on this one
    backend object; its other calls go on as before.  Returns the original operation,
    ``original(*args)``, for a replacement that wraps it."""
    original = backend.call

    def call(called, *args):
        if called == name:
            return replacement(*args)
        return original(called, *args)

    backend.call = call
    return functools.partial(original, name)


def sim(name: str, **kw):
    """A SimulatedBackend over fixture ``name``."""
    return nusim.SimulatedBackend(fixture_root(name), **kw)


def pytest_configure(config):
    for marker, text in (
        ("vm", "boots real kernels under QEMU (tox -e vm); vm(long=True): starts first"),
        ("realkernel", "needs the running kernel's NUMA syscalls"),
        (
            "slow",
            "takes more than a few seconds and checks what does not depend on the "
            "Python running it: tox runs it in py311 only",
        ),
        (
            "private_shm",
            "runs in private IPC+mount namespaces (own /dev/shm, own SysV "
            "IPC); skips where unshare is not allowed",
        ),
    ):
        config.addinivalue_line("markers", f"{marker}: {text}")


def pytest_collection_modifyitems(items):
    """The guests marked vm(long=True) (the numactl matrices: 3-5 minutes each under
    TCG, a third of the tier) start first: with two workers the tier then ends about
    when half its work is done, not one long guest after everything else."""
    items.sort(key=lambda item: not any(m.kwargs.get("long") for m in item.iter_markers("vm")))


@pytest.fixture
def numa():
    """The module under test."""
    return nu


@pytest.fixture(autouse=True)
def _fresh_warnings():
    # warn-once state is per process; tests that count warnings need it empty.
    nu._warned.clear()
    yield


def live_kernel_has_policy_syscalls() -> bool:
    try:
        nu.get_mempolicy()
        return True
    except OSError:
        return False


ON_LINUX = os.name == "posix" and os.path.isdir("/proc/self")


# -- private IPC + mount namespaces for real shared-memory tests -------------------------
# Tests that create SysV segments or /dev/shm files on the real kernel run inside
# `unshare --ipc --mount` with a fresh tmpfs on /dev/shm: they never see or touch the
# host's segments and files, and whatever they leak dies with the namespace.

PRIVATE_SHM_ENV = "NUMA_UTILS_TEST_IN_PRIVATE_SHM"
IN_PRIVATE_SHM = os.environ.get(PRIVATE_SHM_ENV) == "1"
_PRIVATE_SH = 'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"'
_private_why = []


def private_shm_command(argv):
    """``argv`` wrapped to run in private IPC and mount namespaces with its own /dev/shm."""
    return [
        "unshare",
        "--ipc",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        _PRIVATE_SH,
        "sh",
        *argv,
    ]


def private_shm_unavailable():
    """None when private namespaces work here, else why not (cached)."""
    import shutil
    import subprocess

    if not _private_why:
        why = None
        if shutil.which("unshare") is None or not os.path.isdir("/dev/shm"):
            why = "no unshare(1) or no /dev/shm"
        else:
            try:
                out = subprocess.run(
                    private_shm_command(["true"]), capture_output=True, text=True, timeout=30
                )
                if out.returncode != 0:
                    why = (
                        "cannot make private IPC+mount namespaces here: "
                        + (out.stderr.strip().splitlines() or ["?"])[-1]
                    )
            except (OSError, subprocess.TimeoutExpired) as e:
                why = f"unshare failed: {e}"
        _private_why.append(why)
    return _private_why[0]


def run_private_shm(code, *args, timeout=600):
    """Run the Python snippet ``code`` in private IPC+mount namespaces (a tmpfs of its
    own on /dev/shm), the repository first on sys.path.  Skips the calling test
    with a reason when such namespaces cannot be made here."""
    import subprocess
    import sys

    why = private_shm_unavailable()
    if why:
        pytest.skip(why)
    env = dict(os.environ, PYTHONPATH=str(REPO), **{PRIVATE_SHM_ENV: "1"})
    return subprocess.run(
        private_shm_command([sys.executable, "-c", code, *args]),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
        env=env,
    )


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked ``private_shm`` runs again, alone, in private namespaces; its
    result there is its result here (the body never runs against the host)."""
    if pyfuncitem.get_closest_marker("private_shm") is None or IN_PRIVATE_SHM:
        return None
    import subprocess
    import sys

    why = private_shm_unavailable()
    if why:
        pytest.skip(why)
    env = dict(os.environ, **{PRIVATE_SHM_ENV: "1"})
    # Its temporary folders in this session's: a pytest of its own would make one more
    # under the system's temporary folder and, at its end, delete the oldest there.
    basetemp = ["--basetemp", str(_session_tmp[0].mktemp("private"))] if _session_tmp else []
    out = subprocess.run(
        private_shm_command(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                *basetemp,
                # older pytest-xdist appends "@<xdist_group>" to the node id
                "-rs",
                re.sub(r"@\w+$", "", pyfuncitem.nodeid),
            ]
        ),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(REPO),
        env=env,
    )
    tail = "\n".join(out.stdout.strip().splitlines()[-30:])
    if out.returncode != 0:
        pytest.fail(f"in private namespaces:\n{tail}\n{out.stderr[-2000:]}", pytrace=False)
    if " passed" not in tail:
        pytest.skip(f"in private namespaces: {tail.splitlines()[-1] if tail else '?'}")
    return True


# -- the host as the suite found it ------------------------------------------------------
# Checked once per session, in the process that runs it (the xdist controller, not its
# workers): a test must not install commands for every user of the machine (a numactl
# shim in /usr/local/bin shadows the real numactl), nor leave shared memory behind.
# /proc/sysvipc/shm is what `ipcs -m` prints.

HOST_FILES = ("/usr/local/bin/numactl", "/usr/local/bin/numa-utils")
_host_before = {}
_host_changes = []


def host_state():
    """What the session check compares: HOST_FILES' identities, /dev/shm's names and
    the SysV segments (key, shmid)."""
    files = {}
    for path in HOST_FILES:
        try:
            st = os.lstat(path)
            files[path] = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            files[path] = None
    try:
        shm = set(os.listdir("/dev/shm"))
    except OSError:
        shm = set()
    sysv = set()
    try:
        with open("/proc/sysvipc/shm") as fh:
            next(fh, None)
            for line in fh:
                key, shmid = line.split()[:2]
                sysv.add(f"key {int(key) & 0xFFFFFFFF:#010x} shmid {shmid}")
    except OSError:
        pass
    return {"files": files, "shm": shm, "sysv": sysv}


def host_changes(before, after):
    """One line per thing the session changed or left behind."""
    out = []
    for path, was in before["files"].items():
        now = after["files"].get(path)
        if now != was:
            what = "written" if was is None else "removed" if now is None else "replaced"
            out.append(f"{path} {what}")
    out += [f"/dev/shm/{n} left behind" for n in sorted(after["shm"] - before["shm"])]
    out += [
        f"SysV segment {s} left behind (ipcs -m)" for s in sorted(after["sysv"] - before["sysv"])
    ]
    return out


def _checks_host(config):
    return not IN_PRIVATE_SHM and not hasattr(config, "workerinput")


def pytest_sessionstart(session):
    if _checks_host(session.config):
        _host_before["state"] = host_state()


def pytest_sessionfinish(session, exitstatus):
    if "state" not in _host_before:
        return
    _host_changes[:] = host_changes(_host_before.pop("state"), host_state())
    if _host_changes:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if session.config.pluginmanager.get_plugin("terminalreporter") is None:
            import sys

            sys.stderr.write(
                "the suite did not leave the host as it found it:\n  "
                + "\n  ".join(_host_changes)
                + "\n"
            )


def pytest_terminal_summary(terminalreporter):
    if _host_changes:
        terminalreporter.section(
            "the suite did not leave the host as it found it", sep="!", red=True, bold=True
        )
        for line in _host_changes:
            terminalreporter.write_line(f"  {line}", red=True)
        terminalreporter.write_line(
            "  (a test wrote outside its temporary folders: this run fails)", red=True
        )


@pytest.fixture
def anon():
    """Page-aligned anonymous memory for the simulator to place: (addr, size)."""
    import mmap

    made = []

    def make(size, page=4096):
        mm = mmap.mmap(-1, size + page)
        made.append(mm)
        base = nu.buffer_range(mm)[0]
        return (base + page - 1) // page * page, size

    yield make
    for mm in made:
        mm.close()


class MapLimited(nusim.SimulatedBackend):
    """A simulated machine whose vm.max_map_count and current mappings are given."""

    def __init__(self, root, limit, mapped):
        super().__init__(root)
        self._limit, self._mapped = limit, mapped

    def read_text(self, path):
        if path == "/proc/sys/vm/max_map_count":
            return f"{self._limit}\n"
        if path == "/proc/self/maps":
            return "00400000-00401000 r-xp 00000000 00:00 0\n" * self._mapped
        return super().read_text(path)
