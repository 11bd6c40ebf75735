"""Shared test setup.  The suite reaches the module under test through ONE line:"""
import os
import pathlib

import pytest

import numa_utils as nu  # noqa: F401  <- point the whole suite at another copy here

REPO = pathlib.Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO / "fake_sysfs"
FIXTURES = sorted(p.name for p in FIXTURES_DIR.iterdir()
                  if (p / "root").is_dir()) if FIXTURES_DIR.is_dir() else []
assert FIXTURES, "no fixtures found under fake_sysfs/"


def fixture_root(name: str) -> str:
    """The saved filesystem root of fixture ``name``."""
    return str(FIXTURES_DIR / name / "root")


def sim(name: str, **kw):
    """A SimulatedBackend over fixture ``name``."""
    return nu.SimulatedBackend(fixture_root(name), **kw)


def pytest_configure(config):
    for marker, text in (
        ("vm", "boots real kernels under QEMU (tox -e vm)"),
        ("realkernel", "needs the running kernel's NUMA syscalls"),
        ("slow", "takes more than a few seconds"),
    ):
        config.addinivalue_line("markers", f"{marker}: {text}")


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
