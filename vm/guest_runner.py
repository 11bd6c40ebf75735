# SPDX-License-Identifier: Apache-2.0
"""Runs inside a vm/ guest (copied to /vmtest with numa_utils.py and
kernel_checks.py): enters the cgroup the topology asks for, runs every check
against the real kernel and prints one ``VMCHECK {json}`` line per check.
Exit status 0 when no check failed.

Environment knobs (set on the guest command line by tests/test_vm.py):
  NUMA_UTILS_VM_ONLY=a,b          run only these checks
  NUMA_UTILS_VM_WRONG_SYSCALL=mbind=237
                                  patch numa_utils' table for this arch before
                                  running (to show the tier catches a wrong number)
"""

import json
import os
import platform
import sys
import time

sys.path.insert(0, "/vmtest")
T0 = time.monotonic()


def enter_cgroup(mems):
    """Move this process into a cgroup v2 whose cpuset.mems is `mems`."""
    root = "/sys/fs/cgroup"
    with open(f"{root}/cgroup.subtree_control", "w") as fh:
        fh.write("+cpuset")
    cg = f"{root}/numa_utils_check"
    os.makedirs(cg, exist_ok=True)
    with open(f"{cg}/cpuset.mems", "w") as fh:
        fh.write(",".join(str(m) for m in mems))
    with open(f"{cg}/cgroup.procs", "w") as fh:
        fh.write(str(os.getpid()))


def patch_syscall_table(nu, spec):
    """NUMA_UTILS_VM_WRONG_SYSCALL=mbind=237: replace one number of this arch's
    table in the loaded module (its copy of the table, not the kernel's)."""
    from types import MappingProxyType

    name, nr = spec.split("=")
    arch = platform.machine()
    tables = dict(nu.SYSCALL_TABLES)
    table = dict(tables[arch])
    print(f"VMNOTE patching numa_utils {arch} {name}: {table[name]} -> {nr}")
    table[name] = int(nr)
    tables[arch] = MappingProxyType(table)
    nu.SYSCALL_TABLES = MappingProxyType(tables)


def main():
    with open("/vmtest/expect.json") as fh:
        expect = json.load(fh)
    if expect.get("cgroup_mems") is not None:
        enter_cgroup(expect["cgroup_mems"])
    import kernel_checks as kc

    try:
        import numa_utils as nu
    except ImportError as e:
        print(f"VMNOTE numa_utils not importable: {e}")
        nu = None
    wrong = os.environ.get("NUMA_UTILS_VM_WRONG_SYSCALL")
    if wrong and nu is not None:
        patch_syscall_table(nu, wrong)
    backend = None
    if nu is not None and hasattr(nu, "LinuxBackend"):
        backend = nu.LinuxBackend()
    env = kc.make_env(expect, nu, backend, real=True)
    only = [x for x in os.environ.get("NUMA_UTILS_VM_ONLY", "").split(",") if x]
    print(
        f"VMNOTE guest {platform.machine()} {platform.release()} "
        f"topology {expect['topology']} page {kc.mmap.PAGESIZE} "
        f"python {platform.python_version()} started in {time.monotonic() - T0:.1f}s"
    )
    failed = 0
    for rec in kc.run_checks(env, only or None):
        failed += rec["status"] == "fail"
        print("VMCHECK " + json.dumps(rec), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
