# SPDX-License-Identifier: Apache-2.0
"""Issue 27.2 in a real 2-node guest (tests/test_vm.py test_huge_record_guest): N 2 MiB
huge pages reserved on node 0 only; a region of exactly N pages bound there creates
and prefaults (its record lives in a record segment of base pages); numa_maps shows
only the data's huge pages; a second process attaches it; `maps PID` reads its layout
from the record segment; cleanup removes both segments once its users are gone.

Prints one line "HUGE_RECORD <json>" per step; the host test asserts on them.
Run as root in the guest: python3 /vmtest/huge_record_guest.py
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, "/vmtest")
import numa_utils as nu  # noqa: E402
import numa_utils_regions as nur

N = 4
HUGE = 2 << 20
NAME = "huge-record"
HP = "/sys/devices/system/node/node{}/hugepages/hugepages-2048kB/{}"


def report(step, **data):
    print("HUGE_RECORD " + json.dumps(dict(data, step=step), sort_keys=True), flush=True)


def hugepages(node, what="free_hugepages"):
    with open(HP.format(node, what)) as fh:
        return int(fh.read())


def segments():
    """{key: size} of this IPC namespace's SysV segments."""
    with open("/proc/sysvipc/shm") as fh:
        rows = fh.read().splitlines()[1:]
    return {f"0x{int(r.split()[0]) & 0xFFFFFFFF:08x}": int(r.split()[3]) for r in rows}


def vma_lines(starts):
    """This process's raw numa_maps lines starting at ``starts``."""
    with open("/proc/self/numa_maps") as fh:
        lines = fh.read().splitlines()
    return [ln for ln in lines if int(ln.split()[0], 16) in starts]


def creator(ready_w, go_r):
    verdict = nur.fit(N * HUGE, policy="bind", nodes=[0], hugepages="2M")
    r = nur.SharedRegion.create(NAME, N * HUGE, policy="bind", nodes=[0], hugepages="2M")
    room = r._room()[0]
    maps = nu.parse_numa_maps(open("/proc/self/numa_maps").read())
    huge_lines = [
        {"start": hex(e.start), "pages": e.pages_total, "nodes": e.pages}
        for e in maps
        if e.huge and e.pages_total
    ]
    report(
        "create",
        fit_ok=bool(verdict),
        fit_reason=verdict.reason,
        size=r.size,
        page=r.page_size,
        placement={str(k): v for k, v in r.placement().items()},
        prefaulted=(r.prefaulted or {}).get("bytes"),
        free_node0=hugepages(0),
        segments=segments(),
        ipc_key=f"0x{r.ipc_key:08x}",
        data_line=vma_lines({r.address}),
        room_line=vma_lines({room}),
        huge_lines=huge_lines,
    )
    out = subprocess.run(
        [sys.executable, "/vmtest/numa_utils_cli.py", "maps", str(os.getpid()), "--json"],
        capture_output=True,
        text=True,
    )
    try:
        regions = json.loads(out.stdout).get("regions") or []
    except ValueError:
        regions = [{"error": out.stdout[-500:] + out.stderr[-500:]}]
    report("maps", regions=[{k: x.get(k) for k in ("name", "layout", "error")} for x in regions])
    os.write(ready_w, b"1")
    os.read(go_r, 1)  # the attacher is done
    r.close()  # no destroy: the creator "crashes"; cleanup is left to remove it


def attacher():
    a = nur.SharedRegion.attach(NAME, prefault=True)
    report(
        "attach",
        identity_key=a.identity.get("key"),
        size=a.size,
        page=a.page_size,
        layout=str(a.layout),
        placement={str(k): v for k, v in a.placement().items()},
        data_line=vma_lines({a.address}),
    )
    a.close()


def main():
    with open(HP.format(0, "nr_hugepages"), "w") as fh:
        fh.write(str(N))
    with open(HP.format(1, "nr_hugepages"), "w") as fh:
        fh.write("0")
    report("reserved", node0=hugepages(0, "nr_hugepages"), node1=hugepages(1, "nr_hugepages"))
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        try:
            creator(ready_w, go_r)
        except BaseException as e:  # noqa: BLE001 - the outcome, for the host
            report("create", error=f"{type(e).__name__}: {e}")
        finally:
            os._exit(0)
    os.close(ready_w)  # the creator's end only: a creator that died reads as EOF
    if not os.read(ready_r, 1):
        os.waitpid(pid, 0)
        return
    child = subprocess.run([sys.executable, __file__, "attach"], capture_output=True, text=True)
    sys.stdout.write(child.stdout)
    if child.returncode:
        report("attach", error=child.stderr[-2000:])
    os.write(go_w, b"1")
    os.waitpid(pid, 0)
    rows = nur.cleanup(NAME, remove=True, min_age=0)
    report(
        "cleanup",
        rows=[{k: x.get(k) for k in ("region", "key", "action", "why")} for x in rows],
        segments=segments(),
        free_node0=hugepages(0),
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["attach"]:
        attacher()
    else:
        main()
