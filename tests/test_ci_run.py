# SPDX-License-Identifier: Apache-2.0
""".ci/run's package step installs only what is missing and never upgrades: run that
step of the script with stand-ins for id, dpkg-query and apt-get (issue 15)."""

import os
import shutil
import subprocess

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
