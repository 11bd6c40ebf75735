# SPDX-License-Identifier: Apache-2.0
"""Issue 27, section 1, on a real kernel (run in a 2-node guest by
tests/test_vm.py::test_guest_max_map_count): with vm.max_map_count lowered to 1000,

- a layout of 200 rows x 8 ranks on alternating nodes (1,600 VMAs) is refused under
  strict with ENOMEM before any mbind: no mbind call, /proc/self/maps no longer, no
  policy left in /proc/self/numa_maps, no segment left;
- without strict it is interleaved over both nodes, with a falsy policy whose reason
  is "max-map-count";
- after either the process still starts a thread and maps a file;
- a layout within the limit (100 alternating blocks) lands exactly: each extent is one
  VMA in /proc/self/numa_maps with its planned bind node and all its pages there.

Prints one 'VMCHECK {json}' line per check, as guest_runner.py does.
"""

import errno
import json
import mmap
import re
import threading
import traceback

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


def policies_set():
    """The VMAs of this process with a policy other than the default."""
    return [r for r in numa_maps() if not r[1].startswith("default")]


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


def check_strict_refusal(lay):
    b = CountingBackend()
    before, policies = maps_count(), policies_set()
    try:
        region = nur.SharedRegion.create(
            "mc-strict", len(lay) * PAGE, layout=lay, strict=True, backend=b
        )
    except OSError as e:
        refused = e.errno == errno.ENOMEM and "vm.max_map_count 1000" in str(e)
        detail = str(e)[:160]
    else:
        region.destroy()
        refused, detail = False, "created"
    try:
        nur.SharedRegion.attach("mc-strict", backend=b).close()
        left = True
    except FileNotFoundError:
        left = False
    data = dict(mbinds=b.mbinds, maps_before=before, maps_after=maps_count(), left=left)
    data["policies_left"] = len(policies_set()) - len(policies)
    ok = refused and b.mbinds == 0 and data["maps_after"] == before and not left
    ok = ok and data["policies_left"] == 0 and thread_and_mmap()
    report("map_count_strict_refused", ok, detail, data)


def check_fallback(lay):
    b = CountingBackend()
    before = maps_count()
    with nur.SharedRegion.create("mc-fallback", len(lay) * PAGE, layout=lay, backend=b) as region:
        pol = region.policy
        lo, hi = region.address, region.address + region.size
        rows = [r for r in numa_maps() if lo <= r[0] < hi]
        data = dict(
            applied=pol.applied,
            reason=pol.reason,
            layout=str(region.layout),
            mbinds=b.mbinds,
            maps_grew=maps_count() - before,
            vmas=[[hex(r[0]), r[1], r[2]] for r in rows],
        )
        spread = len(rows) == 1 and rows[0][1] == "interleave:0-1" and len(rows[0][2]) == 2
        ok = not pol and pol.reason == "max-map-count" and b.mbinds <= 2 and spread
        ok = ok and data["maps_grew"] <= 3 and thread_and_mmap()
    report("map_count_fallback", ok and thread_and_mmap(), pol.hint[:160], data)


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
    # maps lazily (ctypes, libc), so the refusal below is measured against a warm process.
    checks = [
        ("map_count_within_lands", check_within, (4 * PAGE, 100)),
        ("map_count_strict_refused", check_strict_refusal, (rows,)),
        ("map_count_fallback", check_fallback, (rows,)),
    ]
    for name, check, args in checks:
        try:
            check(*args)
        except Exception as e:  # a check that raised is a failed check, with why
            report(name, False, f"{type(e).__name__}: {e}", {"traceback": traceback.format_exc()})


if __name__ == "__main__":
    main()
