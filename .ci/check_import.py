# SPDX-License-Identifier: Apache-2.0
"""Check that importing the given modules does nothing: no file under /sys or /proc
is opened and no shared library is dlopen'ed.  Also reports the import time.

Usage: python .ci/check_import.py [MODULE ...]   (default: numa_utils envs)
Run from the repository root; exit status 1 when a module does work at import.
"""

import os
import re
import subprocess
import sys

# Runs in a fresh interpreter per module so earlier imports cannot hide work.
_PROBE = r"""
import sys
events = []

def hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes)):
        path = args[0].decode() if isinstance(args[0], bytes) else args[0]
        if path.startswith(("/sys", "/proc")):
            events.append("open " + path)
    elif event == "ctypes.dlopen" and not _from_ctypes_init():
        events.append("dlopen " + repr(args[0] if args else None))

def _from_ctypes_init():
    # `import ctypes` itself runs PyDLL(None) (ctypes/__init__.py: pythonapi), a
    # handle on the running program, not a library load; only that one is excused.
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "<module>" and code.co_filename.replace("\\", "/").endswith(
                "ctypes/__init__.py"):
            return True
        frame = frame.f_back
    return False

before = set(sys.modules)
sys.addaudithook(hook)
import importlib
importlib.import_module(sys.argv[1])
for name in sorted(set(sys.modules) - before):
    path = getattr(sys.modules[name], "__file__", None) or ""
    if path.endswith((".so", ".pyd")):
        print("info: extension module " + name)
print("\n".join(events))
"""

_IMPORTTIME = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|\s+(\S.*)$")


def check(module: str) -> bool:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE, module], env=env, capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        print(f"{module}: import failed\n{probe.stderr}")
        return False
    lines = [line for line in probe.stdout.splitlines() if line]
    work = [line for line in lines if not line.startswith("info: ")]

    timing = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    total_us = None
    for line in timing.stderr.splitlines():
        match = _IMPORTTIME.match(line)
        if match and match.group(3).strip() == module:
            total_us = int(match.group(2))
    shown = "?" if total_us is None else f"{total_us / 1000:.1f} ms cumulative"
    print(f"{module}: import time {shown} (Python {sys.version.split()[0]})")
    for line in lines:
        print(f"{module}: " + (line if line.startswith("info: ") else f"at import: {line}"))
    return not work


def main() -> int:
    modules = sys.argv[1:] or ["numa_utils", "envs"]
    ok = all([check(m) for m in modules])
    print("import check: " + ("ok" if ok else "FAILED (work done at import, see above)"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
