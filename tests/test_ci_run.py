# SPDX-License-Identifier: Apache-2.0
""".ci/run checks for the commands the tests run and installs a package only where
its command is missing, never upgrading: its package step runs here on a PATH of
stand-ins (id, apt-get, python3 and the commands a host "has").  The whole script
builds no guest image: tox's vm environment does (tox.ini).  Then conftest's session
check: the suite leaves the host as it found it."""

import configparser
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

RUN = REPO / ".ci" / "run"
# Which Debian 12 package ships each command (packages.debian.org, bookworm file
# lists): lstopo-no-graphics is in both hwloc and hwloc-nox, and the two conflict,
# so hwloc-nox (no X) is the one to add; numastat ships with numactl.
WANT = {
    "qemu-system-x86_64": "qemu-system-x86",
    "qemu-system-aarch64": "qemu-system-arm",
    "qemu-system-ppc64": "qemu-system-ppc",
    "qemu-system-s390x": "qemu-system-misc",
    "cpio": "cpio",
    "strace": "strace",
    "lstopo-no-graphics": "hwloc-nox",
    "numactl": "numactl",
    "numastat": "numactl",
    "systemd-analyze": "systemd",
    "gcc": "gcc",
    "python3": "python3",
    "python3:pip": "python3-pip",
    "python3:ensurepip": "python3-venv",
    "git": "git",
    "/etc/ssl/certs/ca-certificates.crt": "ca-certificates",
}
CA = "/etc/ssl/certs/ca-certificates.crt"


def _table():
    text = RUN.read_text()
    body = text[text.index("NEEDS=(") + 7 : text.index("\n)\n", text.index("NEEDS=("))]
    rows = [re.sub(r"#.*", "", x).strip() for x in body.splitlines()]
    return dict(r.strip('"').split() for r in rows if r)


def _apt_step():
    text = RUN.read_text()
    start = text.index("NEEDS=(")
    end = text.index('step "Python interpreters"')
    return "set -euo pipefail\nstep() { :; }\n" + text[start:end]


def _stub(path, body):
    path.write_text("#!" + shutil.which("bash") + "\n" + body)
    path.chmod(0o755)


def _run(tmp_path, absent=(), modules=("pip", "ensurepip"), uid=0):
    """The package step on a PATH holding only stand-ins: every command of the table
    but ``absent``; python3 imports only ``modules``.  Returns (stdout, apt-get calls)."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    for cmd in [c for c in WANT if ":" not in c and not c.startswith("/")] + ["apt-get"]:
        if cmd not in absent and cmd != "python3":
            _stub(bin_dir / cmd, 'echo "${0##*/} $*" >> "$LOG"\n')
    _stub(bin_dir / "id", f"echo {uid}\n")
    if "python3" not in absent:
        # `python3 -c "import M"` succeeds for the modules this host "has"
        _stub(
            bin_dir / "python3", 'case " $MODULES " in *" ${2#import }"*) exit 0;; esac; exit 1\n'
        )
    env = {
        "PATH": str(bin_dir),
        "LOG": str(log),
        "MODULES": " ".join(modules),
        "HOME": str(tmp_path),
    }
    out = subprocess.run(
        [shutil.which("bash"), "-c", _apt_step()],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout + out.stderr, log.read_text().splitlines() if log.exists() else []


def _installed(calls):
    (install,) = [c for c in calls if c.startswith("apt-get install ")]
    assert "--no-upgrade" in install.split()
    return install.split()[install.split().index("--no-upgrade") + 1 :]


def test_the_table_maps_each_command_to_its_debian_package():
    assert _table() == WANT


def test_the_table_has_every_qemu_the_vm_tests_boot():
    wanted = set(re.findall(r'"binary": "(qemu-system-\w+)"', (REPO / "vm" / "run.py").read_text()))
    assert wanted and wanted <= set(_table())


def test_nothing_missing_runs_no_apt_get(tmp_path):
    out, calls = _run(tmp_path)
    if os.path.exists(CA):
        assert calls == [] and "all present: nothing to do" in out
    else:
        assert _installed(calls) == ["ca-certificates"]


@pytest.mark.parametrize(
    "absent,modules,want",
    [
        # hwloc-nox's lstopo-no-graphics is there: no hwloc package, whatever else is missing
        (["cpio"], ("pip", "ensurepip"), ["cpio"]),
        (["lstopo-no-graphics", "cpio"], ("pip", "ensurepip"), ["cpio", "hwloc-nox"]),
        (["numastat"], ("pip", "ensurepip"), ["numactl"]),
        (["numactl", "numastat"], ("pip", "ensurepip"), ["numactl"]),  # once
        (
            ["qemu-system-s390x", "systemd-analyze"],
            ("pip",),
            ["qemu-system-misc", "systemd", "python3-venv"],
        ),
        (["python3"], (), ["python3", "python3-pip", "python3-venv"]),
    ],
)
def test_only_the_missing_commands_packages_are_installed(tmp_path, absent, modules, want):
    out, calls = _run(tmp_path, absent, modules)
    assert calls[0] == "apt-get update -q"
    got = _installed(calls)
    assert [p for p in got if p != "ca-certificates"] == want
    assert not any(w == "upgrade" for c in calls for w in c.split())
    for cmd in absent:
        assert re.search(rf"^  {re.escape(cmd)} +missing \(Debian package ", out, re.M), out


def test_not_root_installs_nothing_and_says_what_is_missing(tmp_path):
    out, calls = _run(tmp_path, ["strace"], uid=1000)
    assert calls == []
    assert "not root (or no apt-get): not installing strace" in out


# -- the guest images: built by the vm environment, and only there ------------------------


def _whole_run(tmp_path, *args):
    """.ci/run, whole, copied into a repository of its own that has a vm/build.py, and
    a .ci/.venv whose python logs its arguments instead of running tox: what .ci/run
    asked of it, one line a call."""
    if shutil.which("bash") is None or shutil.which("timeout") is None:
        pytest.skip("no bash or no timeout(1)")
    repo = tmp_path / "repo"
    (repo / ".ci" / ".venv" / "bin").mkdir(parents=True)
    (repo / "vm").mkdir()
    (repo / "vm" / "build.py").write_text("raise SystemExit('not to be run')\n")
    shutil.copy(RUN, repo / ".ci" / "run")
    log = tmp_path / "python.log"
    _stub(repo / ".ci" / ".venv" / "bin" / "python", 'echo "$*" >> "$LOG"\n')
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LOG": str(log), "CI_SKIP_APT": "1"}
    out = subprocess.run(
        [shutil.which("bash"), str(repo / ".ci" / "run"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return log.read_text().splitlines()


@pytest.mark.parametrize("args", [(), ("-e", "py311,lint")])
def test_ci_run_builds_no_image_itself(tmp_path, args):
    want = ["-m tox --version", "-m tox --version", " ".join(["-m", "tox", *args])]
    assert _whole_run(tmp_path, *args) == want  # is tox there; its version; tox itself


def test_only_the_vm_environment_builds_the_images_capped_at_40_minutes():
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(REPO / "tox.ini")
    for name in ini.sections():
        env = ini[name]
        if name == "testenv:vm":
            assert env["commands_pre"].split() == ["timeout", "40m", "python", "vm/build.py"]
            assert "timeout" in env["allowlist_externals"].split()
            assert "NUMA_UTILS_VM_*" in env["pass_env"].split()  # NUMA_UTILS_VM_CACHE
        else:
            assert "build.py" not in env.get("commands_pre", "") + env.get("commands", ""), name


def test_every_python_runs_the_unit_tier_and_one_the_slow_tests():
    """Each py3X line of [testenv] commands (tox's factor conditions, "py311:" and
    "!py311:"): every Python runs everything but the guests; one of them, the tests
    marked slow too (their subject does not depend on the Python)."""
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(REPO / "tox.ini")
    pythons = [
        e.strip() for e in ini["tox"]["envlist"].split(",") if re.fullmatch(r"py3\d+", e.strip())
    ]
    lines = [ln.strip() for ln in ini["testenv"]["commands"].splitlines() if ln.strip()]
    marks = {}
    for py in pythons:
        (line,) = [
            ln
            for ln in lines
            if ln.startswith(f"{py}:") or ln.startswith("!") and not ln.startswith(f"!{py}:")
        ]
        marks[py] = re.search(r'-m "([^"]+)"', line).group(1)
    assert set(marks.values()) == {"not vm", "not vm and not slow"}, marks
    assert [py for py, m in marks.items() if m == "not vm"] == ["py311"], marks


# -- conftest's session check: the host as the suite found it ---------------------------

LEAKY = """
import ctypes, os

def test_leaves_things_behind():
    open("/dev/shm/nu-leak-probe", "w").close()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.shmget(0x4E0C1C1C, 4096, 0o1600) >= 0         # IPC_CREAT | 0600
    with open("/usr/local/bin/numactl", "w") as fh:
        fh.write("#!/bin/sh\\n")
"""
CLEAN = """
def test_clean(tmp_path):
    (tmp_path / "x").write_text("ok")
"""


def _session(tmp_path, body):
    """A pytest session with this suite's conftest as a plugin, run in private IPC and
    mount namespaces with a fresh tmpfs on /dev/shm and on /usr/local/bin: what it
    leaves behind dies with the namespaces."""
    from conftest import PRIVATE_SHM_ENV, private_shm_unavailable

    why = private_shm_unavailable()
    if why:
        pytest.skip(why)
    if not os.path.isdir("/usr/local/bin"):
        pytest.skip("no /usr/local/bin to mount a tmpfs on")
    (tmp_path / "test_probe.py").write_text(body)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]))
    env.pop(PRIVATE_SHM_ENV, None)
    sh = (
        "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && "
        'mount -t tmpfs tmpfs /usr/local/bin && exec "$@"'
    )
    return subprocess.run(
        [
            "unshare",
            "--ipc",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            sh,
            "sh",
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "conftest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "--rootdir",
            str(tmp_path),
            "--basetemp",  # not one more in the system's temporary folder
            str(tmp_path / "basetemp"),
            str(tmp_path / "test_probe.py"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(tmp_path),
        env=env,
    )


def test_session_check_fails_a_run_that_leaves_the_host_changed(tmp_path):
    out = _session(tmp_path, LEAKY)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 passed" in out.stdout  # the test passed; the session failed
    assert "the suite did not leave the host as it found it" in out.stdout
    for line in (
        "/usr/local/bin/numactl written",
        "/dev/shm/nu-leak-probe left behind",
        "SysV segment key 0x4e0c1c1c shmid",
    ):
        assert line in out.stdout, out.stdout


def test_session_check_passes_a_clean_run(tmp_path):
    out = _session(tmp_path, CLEAN)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "did not leave the host" not in out.stdout
