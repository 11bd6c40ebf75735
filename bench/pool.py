"""Benchmark 7: PinnedPool's alloc/free against a plain per-node free list in Python
and against ``torch.empty(pin_memory=True)`` (where torch is installed and a GPU
answers).

Each round serves the same mixed sizes (4 KiB .. 1 MiB) for one node, frees them in a
shuffled order, and serves them again: the second pass is what a warm pool costs (its
free list), the first includes mapping, binding and prefaulting.  The plain free list
is the fewest lines that keep per-node lists of exact-size buffers (``mmap`` per miss,
no binding, no prefault, no merging): the floor a pool's bookkeeping adds to.
No timing target: the numbers say what the placement and the bookkeeping cost.
"""

from __future__ import annotations

import functools
import mmap
import random
import time
from typing import Any, Dict, List, Optional, Tuple

from . import common
from .common import Section

SIZES = [4096, 12288, 65536, 200000, 1 << 20]


class PlainFreeList:
    """Per-node lists of exact-size buffers: reuse one of the same size, else mmap."""

    def __init__(self) -> None:
        self.free: Dict[int, Dict[int, List[mmap.mmap]]] = {}

    def alloc(self, nbytes: int, node: int) -> Tuple[int, mmap.mmap]:
        same = self.free.setdefault(node, {}).setdefault(nbytes, [])
        if same:
            return node, same.pop()
        return node, mmap.mmap(-1, nbytes)

    def release(self, block: Tuple[int, mmap.mmap]) -> None:
        node, buf = block
        self.free[node][len(buf)].append(buf)


def _round(alloc: Any, free: Any, sizes: List[int], seed: int) -> Dict[str, float]:
    """Seconds per alloc and per free, cold pass and warm pass."""
    out: Dict[str, float] = {}
    rng = random.Random(seed)
    for name in ("cold", "warm"):
        t0 = time.perf_counter()
        blocks = [alloc(n) for n in sizes]
        t1 = time.perf_counter()
        rng.shuffle(blocks)
        for b in blocks:
            free(b)
        t2 = time.perf_counter()
        out[f"{name} alloc us"] = (t1 - t0) / len(sizes) * 1e6
        out[f"{name} free us"] = (t2 - t1) / len(sizes) * 1e6
    return out


def _torch_pinned() -> Optional[str]:
    """Why torch's pinned allocator cannot be timed here, or None."""
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch finds no CUDA device (pin_memory needs one)"
    return None


def run(*, blocks: int, rounds: int, log: Any = common.log) -> Section:
    nur = common.sibling("numa_utils_regions")
    sec = Section("pool", "7. Pinned pool: alloc/free against a plain free list and torch")
    rng = random.Random(1)
    sizes = [rng.choice(SIZES) for _ in range(blocks)]
    sec.params = {"blocks": blocks, "rounds": rounds, "sizes": SIZES}
    samples: Dict[str, List[Any]] = {"PinnedPool": [], "plain free list": [], "torch": []}
    why_torch = _torch_pinned()
    if why_torch:
        sec.skip_contender("torch.empty(pin_memory=True)", why_torch)
    for r in range(rounds):
        pool = nur.PinnedPool("all")
        node = min(pool.nodes)
        sec.params["registered"] = pool.registered or pool.register_why
        got = _round(functools.partial(pool.alloc, node=node), pool.free, sizes, r)
        samples["PinnedPool"].append(got)
        pool.close()
        plain = PlainFreeList()
        got = _round(functools.partial(plain.alloc, node=node), plain.release, sizes, r)
        samples["plain free list"].append(got)
        if why_torch is None:
            import torch

            def t_alloc(n: int) -> Any:
                return torch.empty(n, dtype=torch.uint8, pin_memory=True)

            samples["torch"].append(_round(t_alloc, lambda t: None, sizes, r))
        log(f"pool round {r + 1}/{rounds}")
    for contender, got in samples.items():
        for metric in ("cold alloc us", "warm alloc us", "warm free us"):
            sec.row(contender, metric, got)
    sec.compare(
        "PinnedPool / plain free list",
        "warm alloc us",
        samples["PinnedPool"],
        samples["plain free list"],
    )
    sec.compare(
        "PinnedPool / plain free list",
        "cold alloc us",
        samples["PinnedPool"],
        samples["plain free list"],
        note="cold: the pool binds and prefaults each new mapping, the plain list does neither",
    )
    return sec
