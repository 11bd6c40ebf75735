# SPDX-License-Identifier: Apache-2.0
"""Issues 27 and 40 on a real kernel (run in a 2-node guest by
tests/test_vm.py::test_guest_max_map_count): with vm.max_map_count lowered to 1000,

- a layout of 200 rows x 8 ranks on alternating nodes (1,600 VMAs by policy, past the
  limit) is made under strict with no mbind on its data (the record room's one only):
  the threads that prefault it place every block on its node (move_pages), the data
  is one VMA, the process's VMA count grows by at most 2 beyond its prefault threads'
  stacks, and it still starts a thread and maps a file;
- a layout within the limit (100 alternating blocks) lands exactly by policy: each
  extent is one VMA in /proc/self/numa_maps with its planned bind node and all its
  pages there.

Prints one 'VMCHECK {json}' line per check, as guest_runner.py does.
"""

import json
import mmap
import re
import threading
import traceback

import kernel_checks as kc

import numa_utils as nu
import numa_utils_regions as nur

PAGE = mmap.PAGESIZE
LIMIT = 1000


def report(name, ok, detail, data=None):
    record = {"name": name, "status": "pass" if ok else "fail", "detail": detail}
    record["data"] = data or {}
    print("VMCHECK " + json.dumps(record), flush=True)


def maps_count():
    with open("/proc/self/maps") as fh:
        return fh.read().count("\n")


def numa_maps():
    """(start address, policy word, {node: pages}) per VMA of this process."""
    rows = []
    with open("/proc/self/numa_maps") as fh:
        for line in fh:
            fields = line.split()
            pages = {}
            for field in fields[2:]:
                m = re.fullmatch(r"N(\d+)=(\d+)", field)
                if m:
                    pages[int(m.group(1))] = int(m.group(2))
            rows.append((int(fields[0], 16), fields[1], pages))
    return rows


def thread_and_mmap():
    """Start a thread and map a file: what a process at its map limit cannot do."""
    done = []
    worker = threading.Thread(target=done.append, args=(1,))
    worker.start()
    worker.join()
    with open("/tmp/map_count_probe", "w+b") as fh:
        fh.write(b"x" * PAGE)
        fh.flush()
        view = mmap.mmap(fh.fileno(), PAGE)
        first = view[0]
        view.close()
    return done == [1] and first == ord("x")


class CountingBackend(nu.LinuxBackend):
    """The real backend, counting the mbind calls it makes."""

    mbinds = 0

    def call(self, name, *args):
        if name == "syscall" and args[0] == self.abi.number("mbind"):
            self.mbinds += 1
        return super().call(name, *args)


def check_by_thread(lay):
    b = CountingBackend()
    before = maps_count()
    size = len(lay) * PAGE
    with nur.SharedRegion.create("mc-thread", size, layout=lay, strict=True, backend=b) as region:
        pol = region.policy
        lo = region.address
        nodes = kc.raw_move_pages_query(lo, size // PAGE, PAGE)
        want = [lay[i % len(lay)].nodes for i in range(size // PAGE)]
        wrong = [(i, n) for i, n in enumerate(nodes) if {n} != want[i]]
        threads = region.prefaulted.get("threads", 0)
        data = dict(
            placed_by=pol.placed_by,
            reason=pol.reason,
            mbinds=b.mbinds,
            data_vmas=kc.vmas_in(lo, lo + size),
            maps_grew=maps_count() - before,
            threads=threads,
            wrong=wrong[:5],
            how=region.prefaulted.get("thread_placement"),
        )
        # The data is one VMA. Beyond it the count may grow by the record room and by a
        # stack and guard page per prefault thread: glibc keeps an exited thread's stack
        # for the next, unless the next starts before the kernel has cleared the last
        # one's tid (a race), and then maps a new one.
        ok = pol and pol.placed_by == "thread" and pol.reason == "max-map-count"
        ok = ok and b.mbinds <= 1 and data["data_vmas"] == 1 and not wrong
        ok = ok and data["maps_grew"] <= 2 + 2 * threads
    report("map_count_by_thread", ok and thread_and_mmap(), (pol.hint or "")[:160], data)


def check_within(block, count):
    lay = nur.Layout.blocks(block, [0, 1])
    per_block = block // PAGE
    with nur.SharedRegion.create("mc-within", block * count, layout=lay, strict=True) as region:
        lo = region.address
        rows = {r[0]: r for r in numa_maps() if lo <= r[0] < lo + region.size}
        wrong = []
        for i in range(count):
            row = rows.get(lo + i * block)
            want = (f"bind:{i % 2}", {i % 2: per_block})
            if row is None or (row[1], row[2]) != want:
                wrong.append([i, row and [row[1], row[2]], want])
        data = dict(vmas=len(rows), wrong=wrong[:5], layout_vmas=region.layout.vmas)
        ok = bool(region.policy) and len(rows) == count and not wrong
    report("map_count_within_lands", ok, f"{count} extents of {block} bytes", data)


def main():
    with open("/proc/sys/vm/max_map_count", "w") as fh:
        fh.write(f"{LIMIT}\n")
    # 200 rows x 8 ranks, the ranks' nodes alternating: no two neighbours merge.
    rows = nur.Layout.blocks(PAGE, [0, 1, 0, 1, 0, 1, 0, 1], size=200 * 8 * PAGE)
    # The layout within the limit first: its create and destroy load what the library
    # maps lazily (ctypes, libc), so the count below is measured against a warm process.
    checks = [
        ("map_count_within_lands", check_within, (4 * PAGE, 100)),
        ("map_count_by_thread", check_by_thread, (rows,)),
    ]
    for name, check, args in checks:
        try:
            check(*args)
        except Exception as e:  # a check that raised is a failed check, with why
            report(name, False, f"{type(e).__name__}: {e}", {"traceback": traceback.format_exc()})


if __name__ == "__main__":
    main()
