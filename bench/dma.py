"""Benchmark 5 (GPU hosts): pinned host buffers by NUMA placement, H2D and D2H GB/s.

    python -m bench dma [--size 1G] [--rounds 6]

For each visible GPU, one page-aligned anonymous host buffer per placement:
- first-touch: no policy, written by this (unpinned) thread;
- interleave: ``numa_utils.interleave`` over every allowed memory node;
- bind to the GPU's node: ``numa_utils.bind(buf, [node])`` with the node from
  ``numa_utils.gpu_node`` when this checkout has it, else the GPU's PCI numa_node in
  sysfs (bus id from the CUDA runtime, so CUDA_VISIBLE_DEVICES is respected).
Each buffer is written once (pages land under its policy), page-locked with
cudaHostRegister (portable), and copied to and from a device buffer of the same size,
in the seed's ABBA order (A B C, C B A, ...) after one warm-up copy each.
CUDA comes from torch when it imports, else from libcudart through ctypes.  Skips with
the reason when neither is there or no GPU is visible.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from typing import Any, Callable, Dict, Optional, Tuple

from . import common, prefault
from .common import Section, Skip

H2D, D2H = 1, 2  # cudaMemcpyKind
REGISTER_PORTABLE = 1  # cudaHostRegisterPortable


class _Cudart:
    """The few CUDA runtime calls needed, through ctypes."""

    name = "libcudart (ctypes)"

    def __init__(self) -> None:
        lib = None
        names = [
            ctypes.util.find_library("cudart"),
            "libcudart.so",
            "libcudart.so.13",
            "libcudart.so.12",
            "libcudart.so.11.0",
        ]
        for n in names:
            if not n:
                continue
            try:
                lib = ctypes.CDLL(n)
                break
            except OSError:
                continue
        if lib is None:
            raise Skip("neither torch nor libcudart could be loaded")
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        for fn, args in (
            ("cudaGetDeviceCount", [ctypes.POINTER(ctypes.c_int)]),
            ("cudaSetDevice", [ctypes.c_int]),
            ("cudaDeviceGetPCIBusId", [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]),
            ("cudaHostRegister", [vp, sz, ctypes.c_uint]),
            ("cudaHostUnregister", [vp]),
            ("cudaMalloc", [ctypes.POINTER(vp), sz]),
            ("cudaFree", [vp]),
            ("cudaMemcpy", [vp, vp, sz, ctypes.c_int]),
            ("cudaDeviceSynchronize", []),
            ("cudaGetErrorString", [ctypes.c_int]),
        ):
            f = getattr(lib, fn)
            f.argtypes = args
            f.restype = ctypes.c_char_p if fn == "cudaGetErrorString" else ctypes.c_int
        self.lib = lib

    def _ok(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self.lib.cudaGetErrorString(rc)
            text = msg.decode() if msg else "?"
            raise RuntimeError(f"{what}: CUDA error {rc} ({text})")

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        rc = self.lib.cudaGetDeviceCount(ctypes.byref(n))
        if rc != 0:
            raise Skip(f"cudaGetDeviceCount failed (error {rc}): no usable GPU")
        return n.value

    def bus_id(self, dev: int) -> Optional[str]:
        buf = ctypes.create_string_buffer(64)
        if self.lib.cudaDeviceGetPCIBusId(buf, 64, dev) != 0:
            return None
        return buf.value.decode()

    def register(self, addr: int, size: int) -> None:
        self._ok(self.lib.cudaHostRegister(addr, size, REGISTER_PORTABLE), "cudaHostRegister")

    def unregister(self, addr: int) -> None:
        self.lib.cudaHostUnregister(addr)

    def alloc(self, dev: int, size: int) -> Any:
        self._ok(self.lib.cudaSetDevice(dev), "cudaSetDevice")
        p = ctypes.c_void_p()
        self._ok(self.lib.cudaMalloc(ctypes.byref(p), size), "cudaMalloc")
        return p.value

    def free(self, dev: int, mem: Any) -> None:
        self.lib.cudaSetDevice(dev)
        self.lib.cudaFree(mem)

    def copy(self, dev: int, mem: Any, addr: int, size: int, kind: int) -> float:
        self._ok(self.lib.cudaSetDevice(dev), "cudaSetDevice")
        t0 = time.perf_counter()
        if kind == H2D:
            rc = self.lib.cudaMemcpy(mem, addr, size, H2D)
        else:
            rc = self.lib.cudaMemcpy(addr, mem, size, D2H)
        self._ok(rc, "cudaMemcpy")
        self._ok(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        return time.perf_counter() - t0


class _Torch:
    """The same calls through torch (cudaHostRegister via torch.cuda.cudart())."""

    name = "torch"

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.cudart: Optional[_Cudart] = None
        try:
            self.cudart = _Cudart()  # only for PCI bus ids, if loadable
        except Skip:
            pass
        self._host: Dict[int, Any] = {}

    def device_count(self) -> int:
        if not self.torch.cuda.is_available():
            raise Skip("torch imports but torch.cuda.is_available() is False")
        return int(self.torch.cuda.device_count())

    def bus_id(self, dev: int) -> Optional[str]:
        p = self.torch.cuda.get_device_properties(dev)
        if all(hasattr(p, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        return self.cudart.bus_id(dev) if self.cudart else None

    def register(self, addr: int, size: int) -> None:
        rc = self.torch.cuda.cudart().cudaHostRegister(addr, size, REGISTER_PORTABLE)
        if int(getattr(rc, "value", rc)) != 0:
            raise RuntimeError(f"cudaHostRegister: CUDA error {rc}")
        arr = (ctypes.c_uint8 * size).from_address(addr)
        self._host[addr] = self.torch.frombuffer(arr, dtype=self.torch.uint8)

    def unregister(self, addr: int) -> None:
        self._host.pop(addr, None)
        self.torch.cuda.cudart().cudaHostUnregister(addr)

    def alloc(self, dev: int, size: int) -> Any:
        return self.torch.empty(size, dtype=self.torch.uint8, device=f"cuda:{dev}")

    def free(self, dev: int, mem: Any) -> None:
        del mem
        self.torch.cuda.empty_cache()

    def copy(self, dev: int, mem: Any, addr: int, size: int, kind: int) -> float:
        host = self._host[addr]
        self.torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        if kind == H2D:
            mem.copy_(host, non_blocking=True)
        else:
            host.copy_(mem, non_blocking=True)
        self.torch.cuda.synchronize(dev)
        return time.perf_counter() - t0


def load_cuda() -> Any:
    try:
        import torch  # noqa: PLC0415
    except Exception:
        return _Cudart()
    return _Torch(torch)


class HostBuffer:
    """Anonymous page-aligned memory with a policy, written once (first touch)."""

    def __init__(self, size: int) -> None:
        lib = prefault.libc()
        addr = lib.mmap(
            None,
            size,
            mmap.PROT_READ | mmap.PROT_WRITE,
            mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
            -1,
            0,
        )
        if addr in (None, ctypes.c_void_p(-1).value):
            raise prefault._err("mmap")
        self.addr = int(addr)
        self.size = size
        self.registered = False

    def touch(self) -> None:
        ctypes.memset(self.addr, 1, self.size)  # a write per page: real allocation

    def close(self) -> None:
        if self.addr:
            prefault.libc().munmap(ctypes.c_void_p(self.addr), self.size)
            self.addr = 0


def _gpu_node(nu: Any, cuda: Any, dev: int) -> Tuple[Optional[int], str]:
    fn = getattr(nu, "gpu_node", None)
    if callable(fn):
        try:
            node = fn(dev)
            if node is not None:
                return int(node), "numa_utils.gpu_node"
        except NotImplementedError:
            pass
        except Exception as e:  # fall through to sysfs, say why
            common.log(f"dma: gpu_node({dev}) failed: {e!r}")
    bus = cuda.bus_id(dev)
    if not bus:
        return None, "no PCI bus id from the CUDA runtime"
    path = f"/sys/bus/pci/devices/{bus.lower()}/numa_node"
    try:
        with open(path) as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return None, f"cannot read {path}"
    if node < 0:
        return None, f"firmware reports no NUMA node for {bus} (numa_node -1)"
    return node, f"sysfs numa_node of {bus}"


def run(*, size: int, rounds: int, log: Callable[[str], None] = common.log) -> Section:
    sec = Section("dma", "5. Pinned host buffers: H2D/D2H by placement")
    cuda = load_cuda()
    ngpu = cuda.device_count()
    if ngpu < 1:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise Skip(f"no CUDA device visible (CUDA_VISIBLE_DEVICES={visible!r})")
    nu = common.numa_utils()
    size = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
    sec.params = {
        "size": common.fmt_size(size),
        "rounds": rounds,
        "gpus": ngpu,
        "cuda_via": cuda.name,
    }
    buffers: Dict[str, HostBuffer] = {}

    def make(label: str, apply: Optional[Callable[[HostBuffer], Any]]) -> HostBuffer:
        b = HostBuffer(size)
        buffers[label] = b
        if apply is not None:
            res = apply(b)
            if not res:
                why = getattr(res, "reason", res)
                sec.notes.append(f"{label}: policy not applied ({why}); pages land first-touch")
        b.touch()
        try:
            where = nu.placement(b.addr, size)
            sec.notes.append(f"{label} placement (bytes per node): {where}")
        except Exception:
            pass
        cuda.register(b.addr, size)
        b.registered = True
        return b

    try:
        make("first-touch", None)
        make("interleave", lambda b: nu.interleave(b.addr, size))
        for dev in range(ngpu):
            node, how = _gpu_node(nu, cuda, dev)
            sec.notes.append(f"GPU {dev}: node {node} ({how})")
            labels = ["first-touch", "interleave"]
            if node is not None:
                bl = f"bind node {node}"
                if bl not in buffers:
                    make(bl, lambda b, node=node: nu.bind(b.addr, [node], size))
                labels.append(bl)
            else:
                sec.skip_contender(f"GPU {dev} bind-to-GPU-node", how)
            mem = cuda.alloc(dev, size)
            try:
                for lab in labels:  # warm-up, not measured
                    cuda.copy(dev, mem, buffers[lab].addr, size, H2D)
                    cuda.copy(dev, mem, buffers[lab].addr, size, D2H)
                contenders = []
                for lab in labels:

                    def fn(lab: str = lab, dev: int = dev, mem: Any = mem) -> Dict[str, float]:
                        a = buffers[lab].addr
                        h = cuda.copy(dev, mem, a, size, H2D)
                        d = cuda.copy(dev, mem, a, size, D2H)
                        return {"H2D": size / h / 1e9, "D2H": size / d / 1e9}

                    contenders.append((f"GPU {dev} {lab}", fn))
                log(f"dma: GPU {dev}, {len(labels)} placements x {rounds} rounds")
                samples, skipped = common.alternate(contenders, rounds, log=log)
            finally:
                cuda.free(dev, mem)
            for name, why in skipped.items():
                sec.skip_contender(name, why)
            for name, _ in contenders:
                if name in samples:
                    sec.row(name, "H2D GB/s", samples[name], key="H2D")
                    sec.row(name, "D2H GB/s", samples[name], key="D2H")
            names = [f"GPU {dev} {lab}" for lab in labels]
            if len(names) == 3 and all(n in samples for n in names):
                for key in ("H2D", "D2H"):
                    sec.compare(
                        f"GPU {dev} bind-to-GPU-node / first-touch",
                        key + " GB/s",
                        samples[names[2]],
                        samples[names[0]],
                        key=key,
                    )
                    sec.compare(
                        f"GPU {dev} bind-to-GPU-node / interleave",
                        key + " GB/s",
                        samples[names[2]],
                        samples[names[1]],
                        key=key,
                    )
    finally:
        for b in buffers.values():
            if b.registered:
                cuda.unregister(b.addr)
            b.close()
    _pin_stalls(nu, cuda, size, sec, log)
    sec.notes.append("GB/s = buffer bytes / (copy + device synchronize) / 1e9")
    return sec


def _pin_stalls(nu: Any, cuda: Any, size: int, sec: Section, log: Callable[[str], None]) -> None:
    """numa_utils.pin_for_cuda at its default stall budget (1 GiB per call) against
    one call for the whole buffer: total time, longest call (how long every other
    CUDA call of the process waits behind the driver's lock), registered GB/s."""
    nur = common.sibling("numa_utils_regions")
    if not hasattr(nur, "CudaPinProgress"):
        sec.skip_contender("pin_for_cuda stalls", "this numa_utils has no progress")
        return
    lib = getattr(cuda, "lib", None) or getattr(getattr(cuda, "cudart", None), "lib", None)
    for label, chunk in (("pin_for_cuda 1 GiB calls", 1 << 30), ("one call", size)):
        b = HostBuffer(size)
        try:
            b.touch()
            t0 = time.perf_counter()
            pin = nur.pin_for_cuda(b.addr, size, chunk=chunk, cudart=lib)
            total = time.perf_counter() - t0
            if not pin:
                sec.skip_contender(label, str(pin.reason))
                continue
            log(f"dma: {label}: {total:.3f} s, longest call {pin.progress.longest_s:.3f} s")
            sec.value_row(label, "register total s", [total])
            sec.value_row(label, "longest stall s", [pin.progress.longest_s])
            sec.value_row(label, "register GB/s", [size / total / 1e9])
            pin.close()
        finally:
            b.close()
