"""pin_for_cuda's ways out: every one leaves nothing registered but a returned pin.

The fake runtime built here keeps the driver's table of registered ranges, so a test
reads what stays pinned after a thread that cannot start, an exception or a Ctrl-C
midway.  The same source builds CUDA's names (libcudart) and ROCm's (libamdhip64).
"""

import ctypes
import errno
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import nu, nur, shared_library, sim

FAKE_RUNTIME = r"""
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <unistd.h>
#ifdef HIP
#define API(name) hip##name
#else
#define API(name) cuda##name
#endif
#define MAXR 4096
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int last_error;
unsigned long long reg_start[MAXR];
int n_registered = 0;            /* ranges registered now */
int n_calls = 0;                 /* register calls made */
int n_unregister_errors = 0;     /* unregister of an address not registered */
int n_device_pointer = 0;        /* device-pointer calls made */
int fail_at = -1;                /* this register call (from 0) fails: out of memory */
int sigint_at = -1;              /* this one succeeds, then raises SIGINT in its thread */
int delay_us = 0;                /* each register call takes this long */
int unregister_delay_us = 0;     /* each unregister call takes this long */
long long device_offset = 0;     /* a registered address's device address: + this */
long long device_skew = 0;       /* ... + this times its row in the table */

static int row(void *p) {
    for (int i = 0; i < n_registered; i++)
        if (reg_start[i] == (unsigned long long)p) return i;
    return -1;
}
int API(HostRegister)(void *p, size_t n, unsigned int flags) {
    if (delay_us) usleep(delay_us);
    pthread_mutex_lock(&mu);
    int k = n_calls++, rc = 0;
    if (k == fail_at) rc = 2;
    else if (row(p) >= 0 || n_registered == MAXR) rc = 712;  /* already registered */
    else reg_start[n_registered++] = (unsigned long long)p;
    if (rc) last_error = rc;
    pthread_mutex_unlock(&mu);
    if (k == sigint_at) raise(SIGINT);
    return rc;
}
int API(HostUnregister)(void *p) {
    if (unregister_delay_us) usleep(unregister_delay_us);
    pthread_mutex_lock(&mu);
    int i = row(p), rc = 0;
    if (i < 0) { rc = 713; n_unregister_errors++; last_error = rc; }
    else reg_start[i] = reg_start[--n_registered];
    pthread_mutex_unlock(&mu);
    return rc;
}
int API(HostGetDevicePointer)(void **dev, void *p, unsigned int flags) {
    pthread_mutex_lock(&mu);
    int i = row(p);
    n_device_pointer++;
    if (i >= 0 && flags == 0) *dev = (char *)p + device_offset + device_skew * i;
    pthread_mutex_unlock(&mu);
    if (i < 0 || flags) { last_error = 1; return 1; }
    return 0;
}
int API(GetLastError)(void) { int e = last_error; last_error = 0; return e; }
const char *API(GetErrorString)(int e) {
    return e == 2 ? "out of memory (fake)" : e == 713 ? "not registered (fake)" : "error (fake)";
}
int current_device = 0, n_set_device = 0;  /* the caller's; SetDevice calls made */
int API(GetDevice)(int *d) { *d = current_device; return 0; }
int API(SetDevice)(int d) {
    pthread_mutex_lock(&mu);
    n_set_device += d == current_device;
    pthread_mutex_unlock(&mu);
    return 0;
}
"""

MiB = 1 << 20
# An address range nobody maps: the fake never touches the memory it registers.
BASE = 1 << 44


class FakeRuntime:
    """The fake built as ``soname`` in its own folder; its counters read live."""

    def __init__(self, folder, soname="libcudart.so.12", hip=False):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = shared_library(FAKE_RUNTIME, folder / soname, *(["-DHIP"] if hip else []))
        self.lib = ctypes.CDLL(self.path)  # the same handle pin_for_cuda gets

    def __getattr__(self, name):
        return ctypes.c_int.in_dll(self.lib, name).value

    def set(self, name, value):
        kind = ctypes.c_longlong if name.startswith("device_") else ctypes.c_int
        kind.in_dll(self.lib, name).value = value


@pytest.fixture
def fake(tmp_path):
    return FakeRuntime(tmp_path / "cuda")


@pytest.fixture
def fake_hip(tmp_path):
    return FakeRuntime(tmp_path / "rocm", "libamdhip64.so.6", hip=True)


def _failing_start(name):
    """Thread.start that fails, as under a pids limit, for the thread named ``name``."""
    start = threading.Thread.start

    def fake_start(thread):
        if thread.name == name:
            raise RuntimeError("can't start new thread")
        start(thread)

    return fake_start


def _calls_after_return(fake, pin):
    """Register calls made after pin_for_cuda returned (a thread left running)."""
    made = fake.n_calls
    time.sleep(0.2)
    return fake.n_calls - made


# -- a worker thread that cannot start ------------------------------------------------


def test_pin_thread_that_cannot_start_unregisters_all_and_names_it(fake, monkeypatch):
    fake.set("delay_us", 2000)
    monkeypatch.setattr(threading.Thread, "start", _failing_start("pin_for_cuda-2"))
    pin = nur.pin_for_cuda(BASE, 64 * MiB, chunk=MiB, threads=4, cudart=fake.path)
    assert _calls_after_return(fake, pin) == 0  # no thread left registering
    assert not pin and pin.ready and pin.chunks == ()
    assert fake.n_registered == 0 and fake.n_unregister_errors == 0
    assert "could not start registering thread 3 of 4: can't start new thread" in pin.reason
    assert "prefault" not in pin.reason
    pin.close()
    assert fake.n_registered == 0
    with pytest.raises(OSError, match="can't start new thread") as caught:
        nur.pin_for_cuda(BASE, 64 * MiB, chunk=MiB, threads=4, strict=True, cudart=fake.path)
    assert caught.value.errno == errno.EAGAIN
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert fake.n_registered == 0


def test_pin_background_thread_that_cannot_start_is_a_reason(fake, monkeypatch):
    monkeypatch.setattr(threading.Thread, "start", _failing_start("pin_for_cuda"))
    pin = nur.pin_for_cuda(BASE, 8 * MiB, chunk=MiB, background=True, cudart=fake.path)
    assert not pin and pin.ready and fake.n_calls == 0
    assert "could not start the registering thread: can't start new thread" in pin.reason
    pin.close()
    with pytest.raises(OSError) as caught:
        nur.pin_for_cuda(BASE, MiB, background=True, strict=True, cudart=fake.path)
    assert caught.value.errno == errno.EAGAIN


def test_pin_background_thread_selects_the_callers_device(fake):
    # A new thread's current device is 0: the background thread, like each of the
    # pool's, selects the caller's first; the caller's own thread never needs to.
    fake.set("current_device", 3)
    pin = nur.pin_for_cuda(BASE, 4 * MiB, chunk=MiB, background=True, cudart=fake.path)
    assert pin.wait(10) and pin and fake.n_set_device == 1
    pin.close()
    pin = nur.pin_for_cuda(BASE, 4 * MiB, chunk=MiB, threads=2, cudart=fake.path)
    assert pin and fake.n_set_device == 2
    pin.close()


def test_pin_without_set_device_registers_from_every_thread(fake):
    # A runtime with cudaGetDevice but no cudaSetDevice: no thread selects a device,
    # and the pool still registers every chunk.
    class NoSetDevice(ctypes.CDLL):
        def __getattr__(self, name):
            if name == "cudaSetDevice":
                raise AttributeError(name)
            return super().__getattr__(name)

    fake.set("current_device", 3)
    lib = NoSetDevice(fake.path)
    pin = nur.pin_for_cuda(BASE, 4 * MiB, chunk=MiB, threads=2, cudart=lib)
    assert pin and len(pin.chunks) == 4 and fake.n_set_device == 0
    pin.close()
    pin = nur.pin_for_cuda(BASE, 4 * MiB, chunk=MiB, background=True, cudart=lib)
    assert pin.wait(10) and pin and fake.n_set_device == 0
    pin.close()


# -- an exception or an interrupt midway ----------------------------------------------


def _raising_register(fake, exc, at):
    """The fake as a CDLL whose register call ``at`` (from 0), once made, raises
    ``exc``: the chunk is registered and the exception comes before its result."""
    lib = ctypes.CDLL(fake.path)
    real = lib.cudaHostRegister
    real.restype, real.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    made = []

    def register(ptr, size, flags):
        rc = real(ptr, size, flags)
        made.append(rc)
        if len(made) == at + 1:
            raise exc
        return rc

    lib.cudaHostRegister = register
    return lib


@pytest.mark.parametrize("threads", [1, 4])
def test_pin_exception_midway_unregisters_all_and_names_it(fake, threads):
    fake.set("delay_us", 1000)
    lib = _raising_register(fake, ValueError("a wrapper broke"), 5)
    pin = nur.pin_for_cuda(BASE, 64 * MiB, chunk=MiB, threads=threads, cudart=lib)
    assert _calls_after_return(fake, pin) == 0
    assert not pin and pin.ready and pin.chunks == ()
    assert fake.n_registered == 0 and fake.n_calls < 64
    assert "registering stopped by ValueError('a wrapper broke')" in pin.reason


@pytest.mark.parametrize("threads", [1, 4])
def test_pin_keyboard_interrupt_midway_is_raised_with_nothing_registered(fake, threads):
    fake.set("delay_us", 1000)
    lib = _raising_register(fake, KeyboardInterrupt(), 5)
    with pytest.raises(KeyboardInterrupt):
        nur.pin_for_cuda(BASE, 64 * MiB, chunk=MiB, threads=threads, cudart=lib)
    assert fake.n_registered == 0 and fake.n_calls < 64
    assert fake.n_unregister_errors == 0  # the cut-short chunk was registered: undone once


# Ctrl-C in a process pinning in the foreground: raised by the fake inside call 10 (in
# whichever thread makes it), or sent 0.3 s in by a timer, as a user would.
_CHILD = r"""
import ctypes, importlib.util, json, os, signal, sys, threading
module, lib, threads, when = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, os.path.dirname(module))
import numa_utils_regions as nur
signal.signal(signal.SIGINT, signal.default_int_handler)
fake = ctypes.CDLL(lib)
ctypes.c_int.in_dll(fake, "delay_us").value = 20000
if when == "call":
    ctypes.c_int.in_dll(fake, "sigint_at").value = 10
else:
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
interrupted = False
try:
    pin = nur.pin_for_cuda(1 << 44, 64 << 20, chunk=1 << 20, threads=threads, cudart=lib)
except KeyboardInterrupt:
    interrupted = True
read = lambda name: ctypes.c_int.in_dll(fake, name).value
print(json.dumps({"interrupted": interrupted, "registered": read("n_registered"),
                  "calls": read("n_calls")}))
"""


@pytest.mark.parametrize("when", ["call", "timer"])
@pytest.mark.parametrize("threads", [1, 4])
def test_pin_ctrl_c_in_a_foreground_pin_leaves_nothing_registered(fake, threads, when):
    argv = [sys.executable, "-c", _CHILD, nu.__file__, fake.path, str(threads), when]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["interrupted"] and got["calls"] < 64, got
    assert got["registered"] == 0, got
    assert "unregister failed" not in out.stderr


# The SIGINT storm: a child pins again and again while a thread of its own sends it
# SIGINT every 0-3 ms; the handler raises KeyboardInterrupt only inside pin_for_cuda
# (an interrupt in the loop itself measures nothing).  A second interrupt lands in the
# undo of the first, in a join, in Thread.start: the fake's table must end empty
# after each round.
_STORM = r"""
import ctypes, importlib.util, json, os, random, signal, sys, threading, time
module, lib, threads, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, os.path.dirname(module))
import numa_utils_regions as nur
fake = ctypes.CDLL(lib)
ctypes.c_int.in_dll(fake, "delay_us").value = 300
registered = ctypes.c_int.in_dll(fake, "n_registered")
code = nur.pin_for_cuda.__code__


def on_sigint(signum, frame):
    while frame is not None:
        if frame.f_code is code:
            raise KeyboardInterrupt
        frame = frame.f_back


signal.signal(signal.SIGINT, on_sigint)
leaked = interrupted = 0
for i in range(rounds):
    stop = threading.Event()

    def storm(rnd=random.Random(i)):
        while not stop.is_set():
            time.sleep(rnd.uniform(0, 0.003))
            os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=storm)
    sender.start()
    pin = None
    try:
        pin = nur.pin_for_cuda(1 << 44, 64 << 20, chunk=1 << 20, threads=threads, cudart=lib)
    except KeyboardInterrupt:
        interrupted += 1
    stop.set()
    sender.join()
    if pin is not None:
        pin.close()
    leaked += registered.value > 0
    registered.value = 0
print(json.dumps({"interrupted": interrupted, "leaked": leaked}))
"""


@pytest.mark.parametrize("threads", [1, 4])
def test_pin_sigint_storm_leaves_nothing_registered(fake, threads):
    argv = [sys.executable, "-c", _STORM, nu.__file__, fake.path, str(threads), "200"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["interrupted"] >= 100, got  # the storm did land
    assert got["leaked"] == 0, got


# -- close() from several threads at once ----------------------------------------------


def _close_from(pin, nthreads):
    """Close ``pin`` from ``nthreads`` threads released at once: what they raised."""
    barrier = threading.Barrier(nthreads)
    errors = []

    def close():
        barrier.wait()
        try:
            pin.close()
        except BaseException as err:  # any error fails the test
            errors.append(err)

    closers = [threading.Thread(target=close) for _ in range(nthreads)]
    for t in closers:
        t.start()
    for t in closers:
        t.join()
    return errors


def test_pin_concurrent_close_unregisters_each_chunk_once(fake):
    # An engine's shutdown path, its signal handler and atexit may all close one
    # background pin: each chunk is unregistered by exactly one of them, none raises.
    fake.set("unregister_delay_us", 50)
    for _ in range(30):
        pin = nur.pin_for_cuda(BASE, 16 * MiB, chunk=MiB, background=True, cudart=fake.path)
        assert pin.wait(10) and pin and fake.n_registered == 16
        assert _close_from(pin, 6) == []
        assert fake.n_registered == 0 and fake.n_unregister_errors == 0
        assert pin.closed and pin.chunks == ()


# -- NUMA_STRICT ----------------------------------------------------------------------


def test_pin_honours_numa_strict(fake, monkeypatch):
    monkeypatch.setenv("NUMA_UTILS_NUMA_STRICT", "1")
    fake.set("fail_at", 2)
    with pytest.raises(OSError, match="out of memory"):
        nur.pin_for_cuda(BASE, 8 * MiB, chunk=MiB, cudart=fake.path)
    assert fake.n_registered == 0
    fake.set("fail_at", fake.n_calls + 2)
    pin = nur.pin_for_cuda(BASE, 8 * MiB, chunk=MiB, strict=False, cudart=fake.path)
    assert not pin and "out of memory" in pin.reason and fake.n_registered == 0


# -- the device pointer of a MAPPED registration --------------------------------------


def test_pin_mapped_returns_the_device_pointer(fake):
    fake.set("device_offset", 1 << 40)
    mapped = nur.CudaHostRegisterFlag.PORTABLE | nur.CudaHostRegisterFlag.MAPPED
    with nur.pin_for_cuda(BASE, 8 * MiB, chunk=MiB, flags=mapped, cudart=fake.path) as pin:
        assert pin and pin.device_pointer == BASE + (1 << 40)
        assert fake.n_device_pointer == 8 and pin.to_json()["device_pointer"] == BASE + (1 << 40)
    assert fake.n_registered == 0
    plain = nur.pin_for_cuda(BASE, 8 * MiB, chunk=MiB, cudart=fake.path)
    assert plain and plain.device_pointer is None and fake.n_device_pointer == 8
    plain.close()


def test_pin_mapped_chunks_apart_on_the_device_are_refused(fake):
    fake.set("device_skew", 1 << 30)  # each chunk's device address elsewhere
    mapped = nur.CudaHostRegisterFlag.MAPPED
    pin = nur.pin_for_cuda(BASE, 4 * MiB, chunk=MiB, flags=mapped, cudart=fake.path)
    assert not pin and "device addresses are not contiguous" in pin.reason
    assert pin.device_pointer is None and fake.n_registered == 0
    one = nur.pin_for_cuda(BASE, 4 * MiB, chunk=4 * MiB, flags=mapped, cudart=fake.path)
    assert one and one.device_pointer == BASE
    one.close()


# -- ROCm: libamdhip64 ----------------------------------------------------------------


def test_pin_through_hip(fake_hip):
    fake_hip.set("device_offset", 1 << 41)
    mapped = nur.CudaHostRegisterFlag.PORTABLE | nur.CudaHostRegisterFlag.MAPPED
    pin = nur.pin_for_cuda(BASE, 6 * MiB, chunk=MiB, threads=2, flags=mapped, cudart=fake_hip.path)
    assert pin and len(pin.chunks) == 6 and fake_hip.n_registered == 6
    assert pin.library == fake_hip.path and pin.device_pointer == BASE + (1 << 41)
    pin.close()
    assert fake_hip.n_registered == 0 and fake_hip.n_unregister_errors == 0
    fake_hip.set("fail_at", fake_hip.n_calls + 3)
    pin = nur.pin_for_cuda(BASE, 6 * MiB, chunk=MiB, cudart=fake_hip.path)
    assert not pin and pin.error == 2 and fake_hip.n_registered == 0
    assert "hipHostRegister(0x" in pin.reason and "out of memory (fake)" in pin.reason


# -- the library the caller names is the one loaded -----------------------------------


def test_pin_named_soname_is_found_in_ld_library_path_set_now(fake, monkeypatch):
    # The loader read LD_LIBRARY_PATH when this process started; a test kit sets it
    # later and names the soname: that copy, not the system's, is the one used.
    monkeypatch.setenv("LD_LIBRARY_PATH", os.path.dirname(fake.path))
    pin = nur.pin_for_cuda(BASE, 2 * MiB, chunk=MiB, cudart="libcudart.so.12")
    assert pin and pin.library == fake.path and fake.n_registered == 2
    pin.close()
    assert fake.n_registered == 0


# -- issue 40: chunks of whole rows on a layout ----------------------------------------------


def test_pin_on_a_layout_registers_whole_rows(fake):
    """A row of vLLM's buffer is one cell of each worker: no registration's edge may
    cut one (vLLM computed chunk = k * row_stride by hand)."""
    cell = 64 * 1024
    lay = nur.Layout.blocks(cell, [0, 1, 0])  # rows of 192 KiB
    size = 40 * 3 * cell
    for chunk, rows in ((100 * 1024, 1), (MiB, 5)):
        pin = nur.pin_for_cuda(BASE, size, chunk=chunk, layout=lay, cudart=fake.path)
        assert pin and {n for _, n in pin.chunks[:-1]} == {rows * 3 * cell}
        assert all((a - BASE) % (3 * cell) == 0 for a, _ in pin.chunks)
        assert sum(n for _, n in pin.chunks) == size
        pin.close()
    pin = nur.pin_for_cuda(BASE, size, chunk=MiB, cudart=fake.path)  # no layout: 1 MiB
    assert {n for _, n in pin.chunks[:-1]} == {MiB}
    pin.close()


def test_pin_a_region_takes_its_layouts_rows(fake):
    s = sim("qemu-x86_64-two-node")
    with nur.SharedRegion.create(
        "pinned", 12 * 2 * 4096, layout="blocks:4K:bind:0/1", prefault=False, backend=s
    ) as r:
        pin = nur.pin_for_cuda(r, chunk=3 * 4096, backend=s, cudart=fake.path)
        assert pin and [n for _, n in pin.chunks] == [2 * 4096] * 12
        assert pin.chunks[0][0] == r.address
        pin.close()
