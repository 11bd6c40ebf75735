# SPDX-License-Identifier: Apache-2.0
"""Issue 29 on a real kernel (the two-node-smt guest: 2 nodes, 2 cores of 2 threads
each): a process first-touches 64 MiB from node 0, starts threads named like NCCL's and
UCX's, then pins and settles for node 1.  Prints one line 'THREADS {json}' with what
it saw; tests/test_vm.py::test_guest_thread_roles judges it."""

import ctypes
import json
import mmap
import os
import re
import sys
import threading

import numa_utils as nu
import numa_utils_threads as nut

MIB = 1 << 20
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NAME = 15


def masks():
    """tid -> (name, Cpus_allowed_list) for every thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as fh:
            name = fh.read().strip()
        with open(f"/proc/self/task/{tid}/status") as fh:
            found = re.search(r"^Cpus_allowed_list:\s*(\S+)", fh.read(), re.M)
        out[int(tid)] = (name, found.group(1))
    return out


class Worker(threading.Thread):
    """A thread named ``name`` (prctl, as NCCL and UCX name theirs) that, when asked,
    starts a thread of its own and reports the mask that one inherited."""

    def __init__(self, name):
        super().__init__(daemon=True)
        self.comm = name
        self.ready = threading.Event()
        self.ask = threading.Event()
        self.answer = None
        self.done = threading.Event()

    def run(self):
        libc.prctl(PR_SET_NAME, self.comm.encode(), 0, 0, 0)
        self.ready.set()
        self.ask.wait()
        seen = []
        child = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))
        child.start()
        child.join()
        self.answer = seen[0]
        self.done.wait()


def anon_nodes(text):
    """Pages per node of the anonymous (not file-backed) mappings in numa_maps."""
    out = {}
    for line in text.splitlines():
        if "file=" in line:
            continue
        for node, pages in re.findall(r" N(\d+)=(\d+)", line):
            out[node] = out.get(node, 0) + int(pages)
    return out


def spawned_child(queue):
    # The child's first line of Python: where are its own pages, which CPUs has it?
    with open("/proc/self/numa_maps") as fh:
        maps = fh.read()
    queue.put({"anon_pages": anon_nodes(maps), "cpus": sorted(os.sched_getaffinity(0))})


def main():
    topo = nu.read_topology()
    report = {"siblings": {c: sorted(topo.cpus[c].siblings) for c in sorted(topo.cpus)}}
    node0, node1 = sorted(topo.nodes[0].cpus), sorted(topo.nodes[1].cpus)
    os.sched_setaffinity(0, node0)  # the engine started on node 0 ...
    buf = mmap.mmap(-1, 64 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.write(b"\1" * (64 * MIB))  # ... and first-touched its memory there
    report["before"] = nu.placement(buf, method="move_pages")

    workers = [Worker("NCCL WatchDog"), Worker("ucx-progress"), Worker("ZMQbg/1")]
    for worker in workers:
        worker.start()
        worker.ready.wait()
    report["masks_before"] = masks()

    plan = nut.thread_plan(node=1, roles={"comm": 1, "compute": "rest"})
    report["plan"] = plan.to_json()
    match = {"comm": "^(NCCL|ucx)"}
    with nut.pinned(plan, match, default="compute", memory="bind") as pins:
        report["pinned_ok"] = bool(pins)
        report["pins"] = [nu.to_json(p) for p in pins.threads]
        report["masks_pinned"] = masks()
        settled = nut.settle(plan.memory_nodes, budget_ms=None)
        report["settled"] = nu.to_json(settled)
        report["after"] = nu.placement(buf, method="move_pages")
        for worker in workers:
            worker.ask.set()
        report["inherited"] = {}
        for worker in workers:
            while worker.answer is None:
                pass
            report["inherited"][worker.comm] = worker.answer
        seen = []
        main_child = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))
        main_child.start()
        main_child.join()
        report["inherited"]["main"] = seen[0]
    report["masks_restored"] = masks()
    report["policy_restored"] = nu.get_policy().mode.name
    for worker in workers:
        worker.done.set()

    ctx = nu.spawn_context(node=1, fallback=("bind",))
    queue = ctx.Queue()
    proc = ctx.Process(target=spawned_child, args=(queue,))
    proc.start()
    report["spawned"] = queue.get(timeout=600)
    proc.join(600)
    report["spawned_exit"] = proc.exitcode
    report["node0"], report["node1"] = node0, node1
    print("THREADS " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
