"""Helper process for the numa_maps benchmark: holds N VMAs and one touched region.

    python bench/vma_helper.py N REGION_BYTES

Maps the region first (so it sits high, near the end of numa_maps), with a PROT_NONE
guard page below it, then one mapping of N pages whose protections alternate page by
page (read-write, read-only, ...) so the kernel cannot merge them: N VMAs, every page
touched so each numa_maps line carries counters.  Prints "PID ADDRESS LENGTH VMAS"
and waits until its stdin closes.  Standard library only.
"""

import ctypes
import mmap
import os
import sys


def main() -> int:
    n, region = int(sys.argv[1]), int(sys.argv[2])
    page = mmap.PAGESIZE
    region = (region + page - 1) // page * page
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mmap.restype = ctypes.c_void_p
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mprotect.restype = ctypes.c_int
    rw = mmap.PROT_READ | mmap.PROT_WRITE
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS

    def get(length: int) -> int:
        addr = libc.mmap(None, length, rw, flags, -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            e = ctypes.get_errno()
            raise OSError(e, "mmap: " + os.strerror(e))
        return int(addr)

    def protect(addr: int, length: int, prot: int) -> None:
        if libc.mprotect(addr, length, prot) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"mprotect: {os.strerror(e)} (vm.max_map_count too low for {n} VMAs?)")

    guard = get(region + page)
    protect(guard, page, 0)  # PROT_NONE (the mmap module has no name for it)
    addr = guard + page
    ctypes.memset(addr, 1, region)
    big = get(n * page)
    ctypes.memset(big, 1, n * page)  # touch: counters on every line
    for i in range(1, n, 2):
        protect(big + i * page, page, mmap.PROT_READ)
    with open("/proc/self/maps") as f:
        vmas = sum(1 for _ in f)
    sys.stdout.write(f"{os.getpid()} {addr} {region} {vmas}\n")
    sys.stdout.flush()
    sys.stdin.read()  # until the parent closes our stdin
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
