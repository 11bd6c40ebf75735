# SPDX-License-Identifier: Apache-2.0
"""The core an engine vendors (issue 37): numa_utils.py alone, under any name, serves
status, --json and the seeds' flow (policy, prefault and placement on the engine's
own mapping); each public name has one home; the core imports the standard library
only and loads a sibling only for the command line."""

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO, cli, nu, nur, nut, run_private_shm

CORE = REPO / "numa_utils.py"
SIBLINGS = {"numa_utils_regions": nur, "numa_utils_threads": nut, "numa_utils_cli": cli}


def test_each_public_name_has_one_home():
    homes = {"numa_utils": set(nu.__all__), "numa_utils_regions": set(nur.__all__)}
    homes["numa_utils_threads"] = set(nut.__all__)
    seen = {}
    for home, names in homes.items():
        for name in names:
            assert name not in seen, f"{name} is public in {seen.get(name)} and {home}"
            seen[name] = home
    for module in SIBLINGS.values():  # the core's names are reached through the core only
        again = set(vars(module)) & set(nu.__all__) - {"main"}  # each file's own entry point
        assert not again, sorted(again)
    for home, module in (("numa_utils_regions", nur), ("numa_utils_threads", nut)):
        assert all(
            getattr(module, name).__module__ == home
            for name in module.__all__
            if callable(getattr(module, name)) and hasattr(getattr(module, name), "__module__")
        )
        assert not set(vars(nu)) & set(module.__all__), "a sibling's name in the core"


def test_core_imports_only_the_standard_library():
    if sys.version_info < (3, 10):
        pytest.skip("sys.stdlib_module_names is Python 3.10+")
    tree = ast.parse(CORE.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module.split(".")[0])
    # typing_extensions only under TYPE_CHECKING (Literal for the type checker)
    assert found - sys.stdlib_module_names <= {"typing_extensions"}, found


def test_core_loads_a_sibling_only_for_the_command_line():
    """_sibling is called from the command line's functions only, and no sibling's
    module name appears in code outside them (messages that name a file are prose)."""
    tree = ast.parse(CORE.read_text(encoding="utf-8"))
    callers = set()
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_sibling":
                    callers.add(fn.name)
    assert callers == {"_commands", "_root_backend"}, callers
    assert "import numa_utils_" not in CORE.read_text(encoding="utf-8")


def _lone_copy(tmp_path, name="vendored_numa"):
    """numa_utils.py copied alone under another name, in a folder of its own."""
    folder = tmp_path / "lone"
    folder.mkdir()
    shutil.copy(CORE, folder / f"{name}.py")
    return folder


def _run(folder, *args):
    """The lone copy run as an engine would: -S, no site-packages, where an installed
    numa_utils_cli (pip install ., as tox does) would rightly serve its commands."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "NUMA_UTILS_"))}
    return subprocess.run(
        [sys.executable, "-E", "-S", *args],
        cwd=str(folder),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_lone_copy_under_another_name_serves_status_and_json(tmp_path):
    folder = _lone_copy(tmp_path)
    p = _run(folder, "vendored_numa.py", "status")
    assert p.returncode == 0, p.stderr
    assert "NODES:" in p.stdout and "PROCESS:" in p.stdout and "CONFIG:" in p.stdout
    p = _run(folder, "-m", "vendored_numa", "status", "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["nodes"] and rep["process"]["allowed_cpus"] and "config" in rep
    assert "counters" not in rep and "regions" not in rep  # the CLI's, not the facts
    p = _run(folder, "vendored_numa.py", "maps", "self")
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert "numa_utils_cli.py" in p.stderr


SEEDS_FLOW = textwrap.dedent(
    """
    import ctypes, json, mmap, os, sys
    repo = os.path.realpath(sys.argv[2])  # the checkout: not importable here
    sys.path[:] = [sys.argv[1]] + [p for p in sys.path if p and os.path.realpath(p) != repo]
    import vendored_numa as nu

    topo = nu.read_topology()
    nodes = sorted(topo.nodes_with_memory & topo.allowed_mems)
    size = 64 * mmap.PAGESIZE * len(nodes)
    out = {"nodes": nodes, "size": size}

    def flow(addr):
        res = nu.interleave(addr, size, nodes=nodes)
        if len(nodes) > 1:
            assert res, (res.reason, res.hint)
        nu.prefault(addr, size, shared=True)
        return {str(k): v for k, v in nu.placement(addr, size).items() if v}

    # LightLLM's way: a SysV segment through ctypes.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    shmid = libc.shmget(0, size, 0o1000 | 0o600)
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    addr = libc.shmat(shmid, None, 0)
    try:
        out["sysv"] = flow(addr)
    finally:
        libc.shmdt(ctypes.c_void_p(addr))
        libc.shmctl(shmid, 0, None)  # IPC_RMID
    # vLLM's offload tier: a /dev/shm file, mapped.
    path = "/dev/shm/seeds-flow"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        m = mmap.mmap(fd, size)
        out["posix"] = flow(m)
        m.close()
    finally:
        os.close(fd)
        os.unlink(path)
    out["siblings"] = sorted(n for n in sys.modules if n.startswith("numa_utils"))
    print(json.dumps(out))
    """
)


def test_lone_copy_places_the_engines_own_mapping(tmp_path):
    """Issue 37 section 4, on this machine: only the renamed core importable; the
    guests (check_own_mapping_flow) and the simulator check the split on several nodes."""
    folder = _lone_copy(tmp_path)
    p = run_private_shm(SEEDS_FLOW, str(folder), str(REPO))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["siblings"] == [], out["siblings"]
    per = out["size"] // len(out["nodes"])
    want = {str(n): per for n in out["nodes"]}
    assert out["sysv"] == want and out["posix"] == want, out
