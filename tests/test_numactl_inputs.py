"""`numa_utils numactl` on inputs that made it end in a traceback, and exit statuses,
compared with what Debian 12's /usr/bin/numactl 2.0.16 prints for the same command
line (measured in private IPC+mount namespaces; the lines are numactl.c's and shm.c's).

Every case runs the real command, in private namespaces with their own /dev/shm and
SysV IPC, with stdout in strict UTF-8, from an empty working folder."""

import json
import os

import pytest
from conftest import run_private_shm

RUN = r"""
import json, os, subprocess, sys, tempfile
os.mkfifo("/dev/shm/fifo")
os.mkdir("/dev/shm/dir")
argv = [os.fsencode(a.encode("latin-1")) for a in json.loads(sys.argv[1])]
env = dict(os.environ, PYTHONIOENCODING="utf-8:strict")
with tempfile.TemporaryDirectory() as empty:  # removed with the key files made there
    p = subprocess.run([sys.executable.encode(), b"-m", b"numa_utils", b"numactl"] + argv,
                       capture_output=True, env=env, timeout=60, cwd=empty)
print(json.dumps([p.returncode, p.stdout.decode("latin-1"), p.stderr.decode("latin-1")]))
"""


@pytest.fixture(autouse=True)
def _own_tmpdir(tmp_path, monkeypatch):
    """The runs' temporary folder: empty again after each (it was left in /tmp with the
    key file numactl made there, one a case)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    yield
    assert os.listdir(tmp_path) == []


def _numactl(argv):
    got = run_private_shm(RUN, json.dumps(argv))
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


def _case(argv, rc, stderr, stdout=""):
    got_rc, out, err = _numactl(argv)
    assert "Traceback" not in err, err
    assert (got_rc, out) == (rc, stdout), err
    assert err.split("usage:")[0] == stderr


SEG = "numactl: Creating shm key file k mode 0600\n"


def test_shm_length_of_23_digits_is_one_line():
    _case(
        ["--length", "12345678901234567890123", "--shm", "k", "-i", "0"],
        1,
        SEG + "numactl: Creating shared memory segment k id 0 mode 0600 length "
        "17592186044416MB\nnumactl: cannot create shared memory segment: Invalid argument\n",
    )


def test_shm_negative_length_is_one_line():
    _case(
        ["--length", "-5", "--shm", "k", "-i", "0"],
        1,
        SEG + "numactl: Creating shared memory segment k id 0 mode 0600 length "
        "17592186044416MB\nnumactl: cannot create shared memory segment: Invalid argument\n",
    )


def test_shm_key_file_in_missing_folder_is_one_line():
    _case(
        ["--length", "1m", "--shm", "nodir/k", "-i", "0"],
        1,
        "numactl: Creating shm key file nodir/k mode 0600\n"
        "numactl: cannot create key for shm nodir/k\n: No such file or directory\n",
    )


def test_shm_huge_without_reserved_hugepages_is_one_line():
    got_rc, out, err = _numactl(["--length", "2m", "--huge", "--shm", "k", "-i", "0"])
    if "cannot create shared memory segment" not in err and got_rc == 0:
        pytest.skip("this host has 2 MiB huge pages reserved")
    assert (got_rc, out) == (1, "") and "Traceback" not in err, err
    assert err.endswith("numactl: cannot create shared memory segment: Cannot allocate memory\n"), (
        err
    )


def test_file_on_a_fifo_is_ftruncates_error():
    _case(
        ["--length", "1m", "--file", "/dev/shm/fifo", "-i", "0"], 1, "ftruncate: Invalid argument\n"
    )


def test_file_on_a_folder_is_one_line():
    _case(
        ["--length", "1m", "--file", "/dev/shm/dir", "-i", "0"],
        1,
        "numactl: cannot create file /dev/shm/dir: Is a directory\n",
    )


def test_file_length_of_20_digits_is_ftruncates_error():
    _case(
        ["--length", "12345678901234567890", "--file", "/dev/shm/f", "-i", "0"],
        1,
        "ftruncate: Invalid argument\n",
    )


def test_non_utf8_node_list_echoed_as_given():
    _case(
        ["-i\xff", "true"],
        1,
        "libnuma: Warning: unparseable node description `\xff'\n\n",
        stdout="<\xff> is invalid\n",
    )


def test_non_utf8_file_path_with_strict_stdout():
    _case(["--length", "1m", "--file", "/dev/shm/\xff", "-i", "0"], 0, "")


def test_interleave_range_past_unsigned_int_wraps_as_libnuma():
    # numa_bitmask_isbitset(unsigned int): 4294967296 is node 0, and the range's int
    # counter wraps through every node: numactl 2.0.16 exits 0.
    _case(["-i", "0-4294967296", "true"], 0, "")


def test_interleave_range_past_unsigned_long_is_out_of_range():
    _case(
        ["-i", "0-99999999999999999999", "true"],
        1,
        "libnuma: Warning: node argument -1 out of range\n\n",
        stdout="<0-99999999999999999999> is invalid\n",
    )


def test_huge_shmid_fails_as_ftok_key_with_bit_31():
    # strtoul saturates at ULONG_MAX; ftok keeps the low byte, 0xff: a negative key_t,
    # which numactl's sysvkey() takes for a failure.
    _case(
        ["--shmid", "99999999999999999999", "--length", "1m", "--shm", "k", "-i", "0"],
        1,
        SEG + "numactl: cannot get key for newly created shm key file k: "
        "No such file or directory\n",
    )
