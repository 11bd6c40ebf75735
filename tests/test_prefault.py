# SPDX-License-Identifier: Apache-2.0
"""prefault: MADV_POPULATE_WRITE in threads, the write-per-page fallback in C that
keeps the contents, progress from the calling thread, interruption."""

import errno
import functools
import mmap
import threading
import time

import pytest
from conftest import hook_call, nu, nur, saved_backend, sim

MiB = 1 << 20


def test_sim_prefault_places_under_policy_with_threads():
    s = sim("dual-socket-8gpu")
    addr = s.map_object("buf", 64 * MiB)
    assert nu.interleave(addr, 64 * MiB, backend=s)
    calls = []
    res = nu.prefault(
        addr,
        64 * MiB,
        threads=4,
        backend=s,
        progress=lambda d, t: calls.append((d, t, threading.get_ident())),
    )
    assert res["method"] == "populate_write" and res["threads"] == 4
    assert res["bytes"] == 64 * MiB
    assert nu.placement(addr, 64 * MiB, backend=s) == {0: 32 * MiB, 1: 32 * MiB}
    assert calls and calls[-1][:2] == (64 * MiB, 64 * MiB)
    assert {c[2] for c in calls} == {threading.get_ident()}
    assert all(a[0] <= b[0] for a, b in zip(calls, calls[1:]))


def test_sim_fallback_without_populate():
    s = sim("dual-socket-8gpu", populate=False)
    addr = s.map_object("old", 8 * MiB)
    nu.bind(addr, [1], 8 * MiB, backend=s)
    res = nu.prefault(addr, 8 * MiB, threads=2, backend=s)
    assert res["method"] == "touch"
    assert nu.placement(addr, 8 * MiB, backend=s) == {1: 8 * MiB}


def test_sim_real_errors_propagate():
    s = sim("single-node")
    addr = s.map_object("e", MiB)
    s.fail("madvise", errno.ENOMEM)
    with pytest.raises(OSError) as ei:
        nu.prefault(addr, MiB, backend=s)
    assert ei.value.errno == errno.ENOMEM


def test_bad_arguments():
    s = sim("single-node")
    with pytest.raises(TypeError):
        nu.prefault(0x10000, backend=s)
    with pytest.raises(TypeError):  # a bool is not an address
        nu.prefault(True, 4096, backend=s)
    with pytest.raises(ValueError):
        nu.prefault(0x10000, 4096, threads=0, backend=s)
    assert nu.prefault(0x10000, 0, backend=s)["bytes"] == 0


def test_waiting_for_a_slow_slice_does_not_spin():
    # Slice 0 ends at once, slice 1 takes ~0.2 s: the calling thread must wait on
    # slice 1, not loop on the finished slice 0 (that spun: ~100,000 progress calls).
    s = sim("dual-socket-8gpu")
    addr = s.map_object("slow", 64 * MiB)
    real = functools.partial(s.call, "madvise")

    def madvise(a, length, advice):
        if a >= addr + 32 * MiB:
            time.sleep(0.05)
        return real(a, length, advice)

    hook_call(s, "madvise", madvise)
    calls = []
    res = nu.prefault(addr, 64 * MiB, threads=2, backend=s, progress=lambda d, t: calls.append(d))
    assert res["threads"] == 2 and calls[-1] == 64 * MiB
    assert len(calls) < 100, len(calls)


@pytest.mark.parametrize("exc", [KeyboardInterrupt, ValueError])
def test_progress_exception_stops_workers(exc):
    s = sim("dual-socket-8gpu")
    addr = s.map_object("stop", 256 * MiB)
    seen = []

    def progress(done, total):
        seen.append(done)
        raise exc("stop")

    with pytest.raises(exc):
        nu.prefault(addr, 256 * MiB, threads=4, backend=s, progress=progress)
    assert not [t for t in threading.enumerate() if t.name.startswith("numa_utils-")]
    assert len(seen) == 1  # nothing after the exception


@pytest.mark.realkernel
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_real_prefault_anonymous_keeps_data(threads):
    m = mmap.mmap(-1, 32 * MiB)
    m[0:5] = b"hello"
    m[17 * MiB + 3] = 42
    res = nu.prefault(m, threads=threads)
    assert res["bytes"] == 32 * MiB and res["method"] in ("populate_write", "touch")
    assert m[0:5] == b"hello" and m[17 * MiB + 3] == 42
    assert sum(nu.placement(m).values()) >= 32 * MiB
    m.close()


@pytest.mark.realkernel
def test_real_touch_fallback_keeps_data_and_faults():
    m = mmap.mmap(-1, 8 * MiB)
    m[4096 * 7 + 1] = 7
    m[-1] = 9
    addr, size = nu.buffer_range(m)
    nu._touch_iov(addr + 100, size - 100, 4096)  # unaligned start
    assert m[4096 * 7 + 1] == 7 and m[-1] == 9
    assert sum(nu.placement(m).values()) >= 8 * MiB
    m.close()


@pytest.mark.realkernel
def test_real_fallback_when_populate_is_einval(monkeypatch):
    b = nu.LinuxBackend("/")
    real = functools.partial(b.call, "madvise")

    def madvise(addr, length, advice):
        if advice == nu.MADV_POPULATE_WRITE:
            raise OSError(errno.EINVAL, "old kernel")
        return real(addr, length, advice)

    hook_call(b, "madvise", madvise)
    m = mmap.mmap(-1, 4 * MiB)
    m[123] = 5
    res = nu.prefault(m, threads=2, backend=b)
    assert res["method"] == "touch" and m[123] == 5
    assert sum(nu.placement(m, backend=b).values()) >= 4 * MiB
    m.close()


def test_not_live_backend_refuses():
    b = saved_backend(str(sim("single-node").root))
    with pytest.raises(nu.NotLiveError):
        nu.prefault(0x10000, 4096, backend=b)


@pytest.mark.realkernel
@pytest.mark.private_shm
def test_real_read_touch_allocates_shared_memory_without_writing(tmp_path):
    """Shared memory gets its pages from a read fault (shmem allocates under the
    shared policy), so the regions' fallback never writes a byte back: a store made
    by another process in between cannot be undone."""
    import os

    path = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
    fname = os.path.join(path, f"numa_utils-test-readtouch-{os.getpid()}")
    fd = os.open(fname, os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 4 * MiB)
        m = mmap.mmap(fd, 4 * MiB, mmap.MAP_SHARED, mmap.PROT_READ)  # read-only map
        addr, size = nu.buffer_range(m)
        nu._touch_iov(addr, size, mmap.PAGESIZE, write=False)  # a write would fault
        assert sum(nu.placement(m, method="numa_maps").values()) == 4 * MiB
        m.close()
    finally:
        os.close(fd)
        os.unlink(fname)


def test_removing_an_already_removed_region_is_quiet():
    import errno as _errno

    from conftest import sim

    b = sim("dual-socket-8gpu")
    r = nur.SharedRegion.create("gone-already", 1 << 20, prefault=False, backend=b)
    r.close()
    b.call("shm_rmid", r.shmid)  # `cleanup` (or another process) got there
    with pytest.raises(OSError) as ei:  # what remove() now meets ...
        b.call("shm_rmid", r.shmid)
    assert ei.value.errno in (_errno.EINVAL, _errno.EIDRM)
    r.remove()  # ... and takes as "already removed"
    r.destroy()
