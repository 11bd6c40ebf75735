# SPDX-License-Identifier: Apache-2.0
"""Issue 40 on a real kernel (run in a 2-node guest at the default vm.max_map_count by
tests/test_vm.py::test_guest_placement_by_thread):

- ``placement_ranks``: a vLLM-shaped layout of 100,000 one-page cells over 2 ranks
  (rank r's cells on node r; 100,001 VMAs by policy, past the limit) is made without
  prefault; each rank, a process bound to its node's CPU, attaches it and faults its
  own cells (region.prefault(rank=)); every page is on its cell's node (move_pages),
  the region is at most 2 VMAs (data, record room) in every process, and each still
  starts a thread and maps a file.
- ``placement_seccomp``: the same in a process whose seccomp filter denies the policy
  syscalls (EPERM, as Docker's default profile) and which is bound to node 0: the
  creator prefaults every cell, and node 1's cells land on node 1.
- ``placement_seccomp_interleave``: a plain interleaved region there lands 50:50.
- ``placement_seccomp_seeds``: the seeds' flow there: interleave() on its own mapping
  is denied, prefault() spreads the pages 50:50 by thread.

Prints one 'VMCHECK {json}' line per check, as guest_runner.py does.
"""

import json
import mmap
import os
import platform
import threading
import traceback

import kernel_checks as kc

import numa_utils as nu
import numa_utils_regions as nur

PAGE = mmap.PAGESIZE
CELLS = 100_000


def report(name, ok, detail, data=None):
    record = {"name": name, "status": "pass" if ok else "fail", "detail": detail}
    record["data"] = data or {}
    print("VMCHECK " + json.dumps(record), flush=True)


def maps_count():
    return len(maps_lines())


def maps_lines():
    with open("/proc/self/maps") as fh:
        return fh.read().splitlines()


def region_vmas(region):
    """The VMAs of this process over ``region``'s mapping (its data and record room)."""
    return kc.vmas_in(region.address, region.address + region._mapped)


def few_vmas(seen):
    """The region's own VMAs (data, record room) at most 2 whatever its cells, and the
    process's growth bounded: what else it maps is the allocator's heap for the
    per-extent lists (anonymous rw-p mappings; 100,000 by policy would be a VMA each)."""
    return seen["vmas"] <= 2 and seen["grew"] <= 16


def warm_up(key, **kw):
    """The same work once, uncounted: what a process maps on first use (libraries, the
    prefault threads' cached stacks, the allocator's arenas) is mapped before the VMAs
    are counted.  ``kw``: region.prefault's (none: no prefault)."""
    lay = nur.Layout.blocks(PAGE, [0, 1])
    with nur.SharedRegion.create(key, CELLS * PAGE, layout=lay, prefault=False) as region:
        if kw:
            region.prefault(**kw)


def thread_and_mmap():
    """Start a thread and map a file: what a process at its map limit cannot do."""
    done = []
    worker = threading.Thread(target=done.append, args=(1,))
    worker.start()
    worker.join()
    with open(f"/tmp/placement_probe_{os.getpid()}", "w+b") as fh:
        fh.write(b"x" * PAGE)
        fh.flush()
        view = mmap.mmap(fh.fileno(), PAGE)
        first = view[0]
        view.close()
    return done == [1] and first == ord("x")


def bind_to(node):
    os.sched_setaffinity(0, nu.read_topology().nodes[node].cpus)


def pages_nodes(key, size):
    """The node of every page of region ``key``, seen from this process: it maps the
    pages (a read fault maps a shmem page already there, allocating nothing) and asks
    move_pages."""
    with nur.SharedRegion.attach(key) as region:
        nu.prefault(region.address, size, threads=1)  # shmem: maps the existing pages
        nodes = []
        for at in range(0, size // PAGE, 16384):
            count = min(16384, size // PAGE - at)
            nodes += kc.raw_move_pages_query(region.address + at * PAGE, count, PAGE)
        return nodes


def wrong_cells(nodes, owners):
    """(cell, node) for each page not on its rank's node; ``owners``: node of cell i."""
    return [(i, n) for i, n in enumerate(nodes) if n != owners[i % len(owners)]]


def rank_child(key, rank):
    """A rank's process: bound to its node, attaches the region and faults its cells."""
    bind_to(rank)
    warm_up(f"{key}-warm-{rank}", rank=rank)
    before = maps_lines()
    with nur.SharedRegion.attach(key) as region:
        res = region.prefault(rank=rank)
        after = maps_lines()
        out = {"grew": len(after) - len(before), "vmas": region_vmas(region), "bytes": res["bytes"]}
        out["new"] = sorted(set(after) - set(before))
        out.update(how=res.get("thread_placement"), ok=thread_and_mmap())
        return out


def check_ranks():
    key = "placement-ranks"
    lay = nur.Layout.blocks(PAGE, [0, 1])
    warm_up(f"{key}-warm")
    before = maps_count()
    with nur.SharedRegion.create(key, CELLS * PAGE, layout=lay, prefault=False) as region:
        pol = region.policy
        creator = {"grew": maps_count() - before, "placed_by": pol.placed_by, "reason": pol.reason}
        creator["vmas"] = region_vmas(region)
        ranks = [
            kc.in_child(lambda rank=rank: rank_child(key, rank), timeout=600) for rank in (0, 1)
        ]
        nodes = pages_nodes(key, CELLS * PAGE)
    wrong = wrong_cells(nodes, [0, 1])
    data = dict(creator=creator, ranks=ranks, wrong=wrong[:5], wrong_count=len(wrong))
    ok = pol and pol.placed_by == "thread" and pol.reason == "max-map-count"
    ok = ok and not wrong and len(nodes) == CELLS and few_vmas(creator)
    for got in ranks:
        ok = ok and few_vmas(got) and got["bytes"] == CELLS // 2 * PAGE
        ok = ok and got["ok"]
    report("placement_ranks", ok and thread_and_mmap(), f"{CELLS} cells over 2 ranks", data)


def denied(fn):
    """fn() in a child whose seccomp filter denies the policy syscalls (EPERM) and
    which is bound to node 0."""

    def child():
        bind_to(0)
        kc._seccomp_deny(platform.machine(), kc.RAW_SYSCALLS[platform.machine()])
        return fn()

    return kc.in_child(child, timeout=900)


def made_denied(key, size, **kw):
    """Region ``key`` made and prefaulted in a child that may not set policies, bound
    to node 0 (closed there, not removed): what the child saw, and the node of each of
    its pages as this process sees them; removed after."""

    def make():
        warm_up(f"{key}-warm", threads=None)  # every cell: both places' threads
        before = maps_count()
        region = nur.SharedRegion.create(key, size, **kw)
        pol = region.policy
        out = {"grew": maps_count() - before, "placed_by": pol.placed_by, "reason": pol.reason}
        out["vmas"] = region_vmas(region)
        out.update(how=region.prefaulted.get("thread_placement"), ok=thread_and_mmap())
        out["mask"] = sorted(os.sched_getaffinity(0))
        region.close()
        return out

    made = denied(make)
    try:
        return made, pages_nodes(key, size)
    finally:
        with nur.SharedRegion.attach(key) as region:
            region.remove()


def check_seccomp_layout():
    lay = nur.Layout.blocks(PAGE, [0, 1])
    made, nodes = made_denied("placement-seccomp", CELLS * PAGE, layout=lay)
    wrong = wrong_cells(nodes, [0, 1])
    data = dict(made=made, wrong=wrong[:5], wrong_count=len(wrong))
    node0 = sorted(nu.read_topology().nodes[0].cpus)
    # The VMAs a policy per cell takes are past the limit too: that reason comes first.
    ok = made["placed_by"] == "thread" and made["reason"] in ("EPERM", "max-map-count")
    ok = ok and made["ok"]
    ok = ok and made["how"] == "sched_setaffinity" and made["mask"] == node0
    ok = ok and not wrong and len(nodes) == CELLS and few_vmas(made)
    report("placement_seccomp", ok, f"{CELLS} cells, creator bound to node 0", data)


def check_seccomp_interleave():
    size = 64 << 20
    made, nodes = made_denied("placement-il", size, policy="interleave")
    counts = {node: nodes.count(node) for node in set(nodes)}
    half = size // PAGE // 2
    ok = made["placed_by"] == "thread" and made["reason"] == "EPERM"
    ok = ok and counts == {0: half, 1: half}
    report("placement_seccomp_interleave", ok, f"pages per node {counts}", made)


def check_seccomp_seeds():
    size = 64 << 20

    def make():
        mm = mmap.mmap(-1, size)
        addr = nu.buffer_range(mm)[0]
        res = nu.interleave(addr, size)
        got = nu.prefault(addr, size)
        line = kc.numa_maps_line(addr)
        mm.close()
        return {"reason": res.reason, "prefault": got, "counts": kc.raw_counts(line)}

    made = denied(make)
    counts = {int(k): v for k, v in made["counts"].items() if v}
    half = size // 2
    ok = made["reason"] == "EPERM" and made["prefault"].get("placed_by") == "thread"
    ok = ok and counts == {0: half, 1: half}
    report("placement_seccomp_seeds", ok, f"{counts}", made)


def main():
    checks = [
        ("placement_ranks", check_ranks),
        ("placement_seccomp", check_seccomp_layout),
        ("placement_seccomp_interleave", check_seccomp_interleave),
        ("placement_seccomp_seeds", check_seccomp_seeds),
    ]
    for name, check in checks:
        try:
            check()
        except Exception as e:  # a check that raised is a failed check, with why
            report(name, False, f"{type(e).__name__}: {e}", {"traceback": traceback.format_exc()})


if __name__ == "__main__":
    main()
