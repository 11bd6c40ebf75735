"""Ids a SimulatedBackend hands out never name a host object: an engine's own cleanup
calling the real shmctl(IPC_RMID) or close() on them fails and removes nothing."""

from conftest import run_private_shm

CODE = r"""
import ctypes, errno, os, sys
sys.path.insert(0, "tests")
import numa_utils as nu, numa_utils_regions as nur, numa_utils_threads as nut
from conftest import sim
libc = ctypes.CDLL(None, use_errno=True)
real = libc.shmget(0, 4096, 0o1600)             # IPC_PRIVATE, IPC_CREAT | 0600
assert real >= 0
b = sim("four-node-asym")
region = nur.SharedRegion.create("kv-test", 1 << 20, backend=b, kind="sysv")
fds = [b.call("shm_open", "kv-fd", os.O_RDWR | os.O_CREAT, 0o600)]
libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
print("shmctl", libc.shmctl(region.shmid, 0, None),          # IPC_RMID
      errno.errorcode.get(ctypes.get_errno()))
SYS_shmctl = 31                                 # x86_64: the kernel's int shmid
print("syscall", libc.syscall(SYS_shmctl, ctypes.c_long(region.shmid), 0, None),
      errno.errorcode.get(ctypes.get_errno()))
libc.close.argtypes = [ctypes.c_int]
print("close", libc.close(fds[0]), errno.errorcode.get(ctypes.get_errno()))
try:
    os.close(fds[0])
except OverflowError:
    print("os.close OverflowError")
print("alive", open("/proc/sysvipc/shm").read().count("\n") - 1, region.shmid, fds[0])
libc.shmctl(real, 0, None)
"""


def test_simulated_shmid_and_fd_fail_on_the_real_syscalls():
    got = run_private_shm(CODE)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert lines[0] == "shmctl -1 EINVAL", got.stdout  # region.shmid
    assert "syscall -1 EINVAL" in lines, got.stdout
    assert "close -1 EBADF" in lines and "os.close OverflowError" in lines
    alive, shmid, fd = lines[-1].split()[1:]
    assert alive == "1", got.stdout  # the real segment survived
    assert int(shmid) > 2**31 - 1 and int(fd) > 2**31 - 1
