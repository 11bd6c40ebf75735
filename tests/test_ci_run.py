# SPDX-License-Identifier: Apache-2.0
""".ci/run's package step installs only what is missing and never upgrades: run that
step of the script with stand-ins for id, dpkg-query and apt-get (issue 15)."""

import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

STUBS = {
    "id": 'echo 0\n',
    "dpkg-query": ('pkg="${@: -1}"\n'
                   'case " $ABSENT " in *" $pkg "*) echo "unknown ok not-installed";;\n'
                   '  *) printf "install ok installed";; esac\n'),
    "apt-get": 'echo "apt-get $*" >> "$LOG"\n',
}


def _apt_step():
    text = (REPO / ".ci" / "run").read_text()
    start = text.index("APT_PACKAGES=(")
    end = text.index('step "Python interpreters"')
    return "set -euo pipefail\nstep() { :; }\n" + text[start:end]


def _run(tmp_path, missing):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        p = bin_dir / name
        p.write_text("#!/usr/bin/env bash\n" + body)
        p.chmod(0o755)
    log = tmp_path / "apt.log"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", LOG=str(log),
               ABSENT=" ".join(missing))
    env.pop("CI_SKIP_APT", None)
    out = subprocess.run(["bash", "-c", _apt_step()], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout, log.read_text().splitlines() if log.exists() else []


def test_nothing_missing_runs_no_apt_get(tmp_path):
    out, calls = _run(tmp_path, [])
    assert calls == [] and "nothing to do" in out


def test_only_the_missing_are_installed_without_upgrades(tmp_path):
    out, calls = _run(tmp_path, ["hwloc", "cpio"])
    assert calls[0] == "apt-get update -q"
    (install,) = [c for c in calls if " install " in c]
    assert install.split()[-2:] == ["cpio", "hwloc"]
    assert "--no-upgrade" in install.split()
    assert not any("upgrade" == w for c in calls for w in c.split())


# -- conftest's session check: the host as the suite found it ---------------------------

LEAKY = '''
import ctypes, os

def test_leaves_things_behind():
    open("/dev/shm/nu-leak-probe", "w").close()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.shmget(0x4E0C1C1C, 4096, 0o1600) >= 0         # IPC_CREAT | 0600
    with open("/usr/local/bin/numactl", "w") as fh:
        fh.write("#!/bin/sh\\n")
'''
CLEAN = '''
def test_clean(tmp_path):
    (tmp_path / "x").write_text("ok")
'''


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
    sh = ("mount -t tmpfs -o mode=1777 tmpfs /dev/shm && "
          "mount -t tmpfs tmpfs /usr/local/bin && exec \"$@\"")
    return subprocess.run(
        ["unshare", "--ipc", "--mount", "--propagation", "private", "sh", "-c", sh, "sh",
         sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
         "-p", "no:xdist", "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
        capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=env)


def test_session_check_fails_a_run_that_leaves_the_host_changed(tmp_path):
    out = _session(tmp_path, LEAKY)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 passed" in out.stdout                  # the test passed; the session failed
    assert "the suite did not leave the host as it found it" in out.stdout
    for line in ("/usr/local/bin/numactl written", "/dev/shm/nu-leak-probe left behind",
                 "SysV segment key 0x4e0c1c1c shmid"):
        assert line in out.stdout, out.stdout


def test_session_check_passes_a_clean_run(tmp_path):
    out = _session(tmp_path, CLEAN)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "did not leave the host" not in out.stdout
