# SPDX-License-Identifier: Apache-2.0
"""Runs one README section as an engine that vendored numa_utils would: a process of
its own, started with ``python -I`` (no script folder, no PYTHONPATH on sys.path),
whose only numa_utils files are the ones tests/test_readme.py copied into
``enginepkg/``.

Usage: ``python -I readme_runner.py SPEC.json``.  SPEC holds the vendor folder, the
repository, the fixture and the section's blocks in order, each with the files it
needs vendored (``lib``: numa_utils.py; ``lib+sim``: and numa_utils_sim.py; ``cli``:
and numa_utils_cli.py).  A block that needs more than is there copies the missing
files into ``enginepkg/`` before it runs, as an engine would add them; files are never
taken away.  Top-level ``numa_utils*`` modules cannot be imported at all (an installed
copy would otherwise stand in for a missing file).  The result (the skips) goes to
SPEC's ``result`` path; a failing block is a traceback and exit status 1.
"""

import importlib
import importlib.abc
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import types

FILES = {
    "lib": ("numa_utils.py",),
    "lib+sim": ("numa_utils.py", "numa_utils_sim.py"),
    "cli": ("numa_utils.py", "numa_utils_sim.py", "numa_utils_cli.py"),
}
BLOCKED = ("numa_utils", "numa_utils_cli", "numa_utils_sim", "numa_utils_envs")
IMPORT = re.compile(r"^(\s*)import (numa_utils(?:_sim|_cli)?) as (\w+)\s*$", re.M)
OPTIONAL = {"numpy", "torch"}


class _Refuse(importlib.abc.MetaPathFinder):
    """Top-level numa_utils modules do not exist for a vendoring engine."""

    def find_spec(self, name, path=None, target=None):
        if name in BLOCKED:
            raise ModuleNotFoundError(
                f"No module named {name!r} (only enginepkg's copy is vendored)", name=name
            )
        return None


def vendored_code(code):
    """The block with ``import numa_utils as nu`` (or ``numa_utils_sim``,
    ``numa_utils_cli``) importing the vendored copy."""
    return IMPORT.sub(r"\1from enginepkg import \2 as \3", code)


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    sys.meta_path.insert(0, _Refuse())
    sys.path.insert(0, spec["vendor"])
    pkg_dir = spec["vendor"] + "/enginepkg"
    have = set(FILES["lib"])

    def need(mode):
        for name in FILES[mode]:
            if name not in have:
                shutil.copyfile(spec["repo"] + "/" + name, pkg_dir + "/" + name)
                have.add(name)
        importlib.invalidate_caches()

    need(spec["blocks"][0]["mode"] if spec["blocks"] else "lib")
    from enginepkg import numa_utils as nu

    if "numa_utils_sim.py" in have:
        from enginepkg.numa_utils_sim import SimulatedBackend
    else:
        # The test's machine, which the blocks cannot reach: the simulator loaded
        # under a private package whose numa_utils is the vendored copy.
        harness = types.ModuleType("_readme_harness")
        harness.__path__ = []
        sys.modules["_readme_harness"] = harness
        sys.modules["_readme_harness.numa_utils"] = nu
        loc = importlib.util.spec_from_file_location(
            "_readme_harness.numa_utils_sim", spec["repo"] + "/numa_utils_sim.py"
        )
        sim = importlib.util.module_from_spec(loc)
        sys.modules[loc.name] = sim
        loc.loader.exec_module(sim)
        SimulatedBackend = sim.SimulatedBackend
    # The vendoring example's own package name is the same copy.
    eng, sub = types.ModuleType("myengine"), types.ModuleType("myengine._vendor")
    eng.__path__, sub.__path__ = [], []
    eng._vendor, sub.numa_utils = sub, nu
    sys.modules.update(
        {"myengine": eng, "myengine._vendor": sub, "myengine._vendor.numa_utils": nu}
    )

    machine = SimulatedBackend(spec["fixture"])
    procs = {}  # name -> (backend, namespace)
    skipped = []
    with nu.use_backend(machine):
        for block in spec["blocks"]:
            need(block["mode"])
            where = f"README.md:{block['line']}"
            if block["lang"] == "sh":
                out = subprocess.run(
                    ["bash", "-e", "-c", block["code"]],
                    env=spec["env"],
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                if out.returncode:
                    sys.exit(
                        f"{where}: sh block failed ({out.returncode}):\n"
                        f"{block['code']}\n{out.stderr[-3000:]}"
                    )
                continue
            name = block["process"]
            if name not in procs:
                procs[name] = (
                    machine if not procs else machine.process(),
                    {"__name__": f"readme_{name}"},
                )
            backend, ns = procs[name]
            nu.use_backend(backend)
            try:
                exec(compile(vendored_code(block["code"]), where, "exec"), ns)
            except ModuleNotFoundError as e:
                if e.name not in OPTIONAL:
                    raise
                skipped.append(f"{where} needs {e.name}")
            if block["dies"]:
                backend.exit()
    k = machine.kernel
    if k.shm or k.files:
        sys.exit(f"the section leaves regions behind: {list(k.shm.values())} {list(k.files)}")
    leaked = sorted(m for m in sys.modules if m in BLOCKED)
    if leaked:
        sys.exit(f"imported outside the vendored package: {leaked}")
    with open(spec["result"], "w") as f:
        json.dump({"skipped": skipped, "vendored": sorted(have)}, f)


if __name__ == "__main__":
    main(sys.argv[1])
