# SPDX-License-Identifier: Apache-2.0
"""Runs the python blocks of one document as an engine that vendored numa_utils would,
each block on its own, in a process of its own.

Usage: ``python -I readme_runner.py SPEC.json``.  SPEC holds the repository, a vendor
folder, the machines and the document's blocks, each with the files it imports (the
test reads them from its import lines).  For each block this process (which has
imported only the vendored core and, privately, the simulator it needs for its
machines) puts exactly the block's files into ``myengine/_vendor/``, then forks; the
child runs the block in a fresh namespace with its stdout and stderr in files.  So no
block sees another's names, modules, regions or settings.

- ``import numa_utils as nu``, ``import numa_utils_regions as nur``, ``from
  numa_utils_regions import SharedRegion`` ... import the vendored copies
  (``myengine._vendor.numa_utils`` and so on, the vendoring example's names, which a
  block may also write).  Top-level ``numa_utils*`` and ``envs`` modules do not exist
  here, even where a test environment installed them: an installed copy cannot stand
  in for a file the block did not vendor, and ``importlib.util.find_spec`` sees none,
  as in an engine.
- The machine: a block runs on the first of SPEC's machines (a simulated one-node
  machine without a GPU), the default of every call it makes without ``backend=``;
  a block that prints machine values names its own machine (``with
  nu.use_backend(SimulatedBackend(...))``).  A block whose output the document shows
  runs again on the second machine, so the test can check that its output does not
  depend on the machine it was not told about.
- After the block, the simulated process exits (as the reader's would); a region left
  on the machine is an error.

The result (SPEC's ``result`` path) is one entry per run: stdout, error (a traceback),
the optional module that was missing (numpy, torch), the vendored files the block
loaded, and the regions it left behind.
"""

import importlib
import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
import types

PACKAGE = "myengine._vendor"
HIDDEN = (
    "numa_utils",
    "numa_utils_cli",
    "numa_utils_sim",
    "numa_utils_regions",
    "numa_utils_threads",
    "numa_utils_envs",
    "envs",
)
# `import numa_utils_x as y`, `import numa_utils_x`, `from numa_utils_x import ...`:
# the vendored copy instead.
IMPORT = re.compile(r"^(\s*)import (numa_utils\w*|envs)(?: as (\w+))?(?=[ \t]*(?:#|$))", re.M)
FROM = re.compile(r"^(\s*)from (numa_utils\w*|envs) import\b", re.M)
OPTIONAL = {"numpy", "torch"}
BLOCK_SECONDS = 240


class _Hide:
    """A meta path finder as it was, except that it finds no top-level numa_utils
    module: what an engine's environment has."""

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name in HIDDEN:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


def vendored_code(code):
    """The block with its numa_utils imports reading the vendored copies."""
    code = IMPORT.sub(lambda m: f"{m[1]}import {PACKAGE}.{m[2]} as {m[3] or m[2]}", code)
    return FROM.sub(rf"\1from {PACKAGE}.\2 import", code)


def _vendor(spec, files):
    """``myengine/_vendor/`` holds exactly ``files`` (copies of the repository's)."""
    pkg = os.path.join(spec["vendor"], *PACKAGE.split("."))
    have = {f for f in os.listdir(pkg) if f.endswith(".py") and f != "__init__.py"}
    for name in have - set(files):
        os.remove(os.path.join(pkg, name))
    for name in set(files) - have:
        shutil.copyfile(os.path.join(spec["repo"], name), os.path.join(pkg, name))
    importlib.invalidate_caches()


def _harness_simulator(nu, repo):
    """The simulator the harness builds its machines with, loaded under a private
    package whose numa_utils is the vendored core: the blocks cannot reach it."""
    harness = types.ModuleType("_readme_harness")
    harness.__path__ = []
    sys.modules["_readme_harness"] = harness
    sys.modules["_readme_harness.numa_utils"] = nu
    loc = importlib.util.spec_from_file_location(
        "_readme_harness.numa_utils_sim", os.path.join(repo, "numa_utils_sim.py")
    )
    sim = importlib.util.module_from_spec(loc)
    sys.modules[loc.name] = sim
    loc.loader.exec_module(sim)
    return sim


def _child(nu, block, machine, out_dir):
    """In the forked child: run the block, write what happened, never return."""
    signal.alarm(BLOCK_SECONDS)
    result = {"error": None, "missing": None}
    stdout = os.open(os.path.join(out_dir, "stdout"), os.O_WRONLY | os.O_CREAT, 0o600)
    stderr = os.open(os.path.join(out_dir, "stderr"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    nu.use_backend(machine)
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(vendored_code(block["code"]), block["where"], "exec"), namespace)
    except ModuleNotFoundError as e:
        if e.name in OPTIONAL:
            result["missing"] = e.name
        else:
            result["error"] = traceback.format_exc()
            if e.name.startswith(PACKAGE + "."):
                result["error"] += (
                    f"(only {PACKAGE}'s copies exist: the files this block imports)\n"
                )
    except BaseException:
        result["error"] = traceback.format_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    prefix = PACKAGE + "."
    result["loaded"] = sorted(m[len(prefix) :] + ".py" for m in sys.modules if m.startswith(prefix))
    namespace.clear()
    machine.exit()
    k = machine.kernel
    result["left"] = [str(v) for v in k.shm.values()] + [str(f) for f in k.files]
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(result, f)
    os._exit(0)


def _run(nu, block, machine, scratch):
    """One block on one machine, in a forked child; its result."""
    out_dir = tempfile.mkdtemp(dir=scratch)
    for name in ("stdout", "stderr"):
        open(os.path.join(out_dir, name), "w").close()
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            _child(nu, block, machine, out_dir)
        finally:
            os._exit(3)
    _pid, status = os.waitpid(pid, 0)
    with open(os.path.join(out_dir, "stdout")) as f:
        stdout = f.read()
    with open(os.path.join(out_dir, "stderr")) as f:
        stderr = f.read()
    try:
        with open(os.path.join(out_dir, "result.json")) as f:
            result = json.load(f)
    except FileNotFoundError:
        result = {"error": f"the block's process ended ({status:#x}) before it finished"}
        result.update(missing=None, loaded=[], left=[])
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
        result["error"] = f"timed out after {BLOCK_SECONDS} s"
    result.update(stdout=stdout, stderr=stderr, seconds=round(time.monotonic() - start, 2))
    return result


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    sys.meta_path[:] = [_Hide(f) for f in sys.meta_path]
    pkg = spec["vendor"]
    for part in PACKAGE.split("."):
        pkg = os.path.join(pkg, part)
        os.makedirs(pkg, exist_ok=True)
        with open(os.path.join(pkg, "__init__.py"), "w"):
            pass
    sys.path.insert(0, spec["vendor"])
    _vendor(spec, ["numa_utils.py"])
    nu = importlib.import_module(PACKAGE + ".numa_utils")
    sim = _harness_simulator(nu, spec["repo"])
    # Made once, never used here: each child gets the machine as it was made.
    machines = [sim.SimulatedBackend(root) for root in spec["machines"]]
    scratch = tempfile.mkdtemp(dir=spec["vendor"])
    results = []
    for block in spec["blocks"]:
        _vendor(spec, block["files"])
        runs = []
        for machine in machines[: block["machines"]]:
            runs.append(_run(nu, block, machine, scratch))
        results.append(runs)
    with open(spec["result"], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
