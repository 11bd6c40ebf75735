"""The vendoring promise: numa_utils.py copied alone, under another name, in a package,
imports without touching the system and works."""

import json
import os
import subprocess
import sys
import textwrap

from conftest import REPO, fixture_root, fixture_tree


def _run(code, cwd):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _vendor(tmp_path, engine, *files):
    """Copy ``files`` into ``<engine>/utils/``, a package, as an engine vendors them."""
    pkg = tmp_path / engine / "utils"
    pkg.mkdir(parents=True)
    (tmp_path / engine / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    for name in files:
        (pkg / name).write_text((REPO / name).read_text())


def test_copy_under_another_name_in_a_package(tmp_path):
    _vendor(tmp_path, "lightllm", "numa_utils.py")
    p = _run(
        """
        import sys
        from lightllm.utils import numa_utils as nu
        assert "numa_utils" not in sys.modules, "imported itself by its own name"
        assert nu.read_topology().nodes  # the running system: a saved tree needs the simulator
        assert nu.main(["status"]) == 0 and nu.main(["status", "--json"]) == 0
        print("ok")
    """,
        tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert "ok" in p.stdout


def test_copy_alone_without_envs(tmp_path):
    (tmp_path / "vendored_numa.py").write_text((REPO / "numa_utils.py").read_text())
    p = _run(
        """
        import json, io, contextlib, vendored_numa as nu
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert nu.main(["status", "--json"]) == 0
        rep = json.loads(out.getvalue())
        assert rep["config"]["NUMA_UTILS_NUMA_STRICT"] == {"value": False, "source": "default"}
        print("ok")
    """,
        tmp_path,
    )
    assert p.returncode == 0, p.stderr


def test_import_reads_nothing_and_loads_no_library(tmp_path):
    """Nothing happens at import: no /sys or /proc file opened, no library loaded."""
    (tmp_path / "vendored_copy.py").write_text((REPO / "numa_utils.py").read_text())
    p = _run(
        """
        import builtins, io, os, sys, ctypes
        opened = []
        real_open = io.open
        def spy(file, *a, **k):
            opened.append(str(file))
            return real_open(file, *a, **k)
        builtins.open = io.open = spy
        os_open = os.open
        def spy_os(path, *a, **k):
            opened.append(str(path))
            return os_open(path, *a, **k)
        os.open = spy_os
        loaded = []
        real_cdll = ctypes.CDLL.__init__
        def cdll_spy(self, name, *a, **k):
            loaded.append(name)
            return real_cdll(self, name, *a, **k)
        ctypes.CDLL.__init__ = cdll_spy
        import vendored_copy
        bad = [f for f in opened if f.startswith(("/sys", "/proc"))]
        assert not bad, bad
        assert not loaded, loaded
        print("ok")
    """,
        tmp_path,
    )
    assert p.returncode == 0, p.stderr


def test_engine_prefix_set_with_configure(tmp_path):
    one = fixture_tree("single-node", tmp_path / "one")
    _vendor(tmp_path, "engine", "numa_utils.py", "envs.py", "numa_utils_sim.py")
    p = _run(
        f"""
        import os
        from engine.utils import numa_utils as nu
        from engine.utils.numa_utils_sim import open_tree
        nu.configure(env_prefix="LIGHTLLM_")
        os.environ["LIGHTLLM_ENABLE_NUMA_INTERLEAVE"] = "yes"
        rep = nu.status_report(backend=nu.LinuxBackend(open_tree({one!r})))
        cfg = rep["config"]
        assert cfg["LIGHTLLM_ENABLE_NUMA_INTERLEAVE"] == {{"value": True, "source": "env"}}, cfg
        os.environ["LIGHTLLM_NUMA_STRICT"] = "maybe"
        rep = nu.status_report(backend=nu.LinuxBackend(open_tree({one!r})))
        assert "LIGHTLLM_NUMA_STRICT" in rep["config_error"], rep.get("config_error")
        print("ok")
    """,
        tmp_path,
    )
    assert p.returncode == 0, p.stderr


def test_copy_alone_answers_other_commands_with_one_line(tmp_path):
    """Without numa_utils_cli.py beside it, a command other than status is one line
    naming the file to copy, and exit status 2; status still works."""
    one = fixture_tree("single-node", tmp_path / "one")
    _vendor(tmp_path, "lightllm", "numa_utils.py")
    # -S: no site-packages, where tox (pip install .) puts an installed numa_utils_cli
    # that the copy would rightly use.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for argv in (["maps", "self"], ["numactl", "--show"], ["-v", "plan"]):
        p = subprocess.run(
            [sys.executable, "-S", "-m", "lightllm.utils.numa_utils", *argv],
            cwd=str(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert p.returncode == 2, (argv, p.stderr)
        assert len(p.stderr.splitlines()) == 1 and "numa_utils_cli.py" in p.stderr, p.stderr
    status = [sys.executable, "-S", "-m", "lightllm.utils.numa_utils", "status"]
    p = subprocess.run(status, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "NODE" in p.stdout.upper(), p.stderr
    # A saved tree is read by the simulator's file: without it, one line naming it.
    p = subprocess.run(
        [*status, "--root", one], cwd=str(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert "numa_utils_sim.py" in p.stderr, p.stderr


def test_cli_and_sim_found_as_siblings_in_a_package(tmp_path):
    _vendor(
        tmp_path,
        "engine",
        "numa_utils.py",
        "numa_utils_cli.py",
        "numa_utils_regions.py",
        "numa_utils_threads.py",
        "numa_utils_sim.py",
    )
    p = _run(
        f"""
        import io, contextlib, json, sys
        from engine.utils import numa_utils as nu
        from engine.utils.numa_utils_sim import SimulatedBackend
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert nu.main(["plan", "--root", {fixture_root("dual-socket-8gpu")!r},
                            "--json"]) == 0
        assert json.loads(out.getvalue())
        assert not hasattr(nu, "SimulatedBackend")  # the library names no simulator
        sim = SimulatedBackend({fixture_root("four-node-asym")!r})
        with nu.use_backend(sim):
            assert len(nu.read_topology().nodes) == 4
        assert nu.default_backend() is not sim
        assert "numa_utils" not in sys.modules and "numa_utils_cli" not in sys.modules
        print("ok")
    """,
        tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert "ok" in p.stdout


def test_cli_refuses_a_library_of_another_version(tmp_path):
    (tmp_path / "numa_utils.py").write_text(
        (REPO / "numa_utils.py").read_text().replace('__version__ = "', '__version__ = "9', 1)
    )
    (tmp_path / "numa_utils_cli.py").write_text((REPO / "numa_utils_cli.py").read_text())
    p = subprocess.run(
        [sys.executable, "numa_utils.py", "maps", "self"],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.splitlines()) == 1 and "another" not in p.stderr, p.stderr
    assert "numa_utils_cli 0" in p.stderr and "not 9" in p.stderr, p.stderr


def test_simulator_refuses_a_library_it_does_not_model(tmp_path):
    (tmp_path / "numa_utils.py").write_text(
        (REPO / "numa_utils.py").read_text().replace('__version__ = "', '__version__ = "9', 1)
    )
    (tmp_path / "numa_utils_sim.py").write_text((REPO / "numa_utils_sim.py").read_text())
    p = _run(
        f"""
        from numa_utils_sim import SimulatedBackend
        try:
            SimulatedBackend({fixture_root("single-node")!r})
        except RuntimeError as e:
            print("refused:", e)
    """,
        tmp_path,
    )
    assert p.returncode == 0 and "refused: numa_utils_sim" in p.stdout, p.stderr


def test_library_names_no_simulator():
    import ast

    tree = ast.parse((REPO / "numa_utils.py").read_text())
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    assert not classes & {"SimulatedBackend", "_SimKernel"}, classes
    checks = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and getattr(n.func, "id", None) == "isinstance"
        and "Simulated" in ast.dump(n)
    ]
    assert not checks


def test_foreign_envs_beside_a_vendored_copy_is_never_executed(tmp_path):
    """numa_utils imports or executes no file found by its name: an engine's own
    envs module (in the package, or top level) that does work or raises at import
    leaves SharedRegion.create and status alone."""
    _vendor(tmp_path, "other", "numa_utils.py", "numa_utils_regions.py", "numa_utils_sim.py")
    marker = tmp_path / "executed"
    bad = f"open({str(marker)!r}, 'w').close()\nraise RuntimeError('engine envs broke')\n"
    (tmp_path / "other" / "utils" / "envs.py").write_text(bad)
    (tmp_path / "other" / "envs.py").write_text(bad)
    (tmp_path / "envs.py").write_text(bad)
    (tmp_path / "other" / "utils" / "numa_utils_envs.py").write_text(bad)
    p = _run(
        f"""
        import os
        os.environ["NUMA_UTILS_ENABLE_NUMA_INTERLEAVE"] = "1"
        from other.utils import numa_utils as nu, numa_utils_regions as nur
        from other.utils.numa_utils_sim import SimulatedBackend
        s = SimulatedBackend({fixture_root("dual-socket-8gpu")!r})
        with nur.SharedRegion.create("kv", 8 << 20, backend=s) as r:
            assert r.policy.mode == "interleave", r.policy
        rep = nu.status_report(backend=s)
        assert rep["config"]["NUMA_UTILS_ENABLE_NUMA_INTERLEAVE"]["value"] is True
        print("ok")
    """,
        tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert "ok" in p.stdout
    assert not marker.exists(), "a foreign envs.py was executed"


def test_status_env_prefix(tmp_path):
    env = {**os.environ, "LIGHTLLM_NUMA_STRICT": "1", "LIGHTLLM_NUMA_NODES": "garbage"}
    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "numa_utils.py"),
            "status",
            "--json",
            "--env-prefix",
            "LIGHTLLM_",
            "--root",
            fixture_root("single-node"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["config"]["LIGHTLLM_NUMA_STRICT"] == {"value": True, "source": "env"}
    assert "NUMA_UTILS_NUMA_STRICT" not in rep["config"]
    assert any("LIGHTLLM_NUMA_NODES='garbage'" in w for w in rep["warnings"]), rep["warnings"]


def _clean_run(args, cwd):
    """``python -S`` with no PYTHONPATH: only what ``cwd`` holds is importable."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-S", *args],
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _engine_tree(tmp_path, folder, files):
    """``engine/<folder>/`` as a package holding ``files`` ({name: repo file}), beside
    decoys that must never be imported: the engine's own ``engine/utils/numa_utils.py``
    (SGLang and vLLM have one) and top-level numa_utils files.  Returns the file each
    decoy touches when imported."""
    marker = tmp_path / "decoy-imported"
    decoy = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\ndef engine_helper(): pass\n"
    for pkg in ("engine", f"engine/{folder}", "engine/utils"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    for name, source in files.items():
        (tmp_path / "engine" / folder / name).write_text((REPO / source).read_text())
    if "numa_utils.py" not in files or folder != "utils":
        (tmp_path / "engine" / "utils" / "numa_utils.py").write_text(decoy)
    for name in (
        "numa_utils.py",
        "numa_utils_cli.py",
        "numa_utils_regions.py",
        "numa_utils_threads.py",
        "numa_utils_sim.py",
    ):
        (tmp_path / name).write_text(decoy)
    return marker


def test_vendored_in_a_vendor_subpackage_works_as_pip_does(tmp_path):
    """Issue 27 section 4: engine/_vendor/numa_utils.py with numa_utils_cli.py and
    numa_utils_sim.py beside it: the CLI, the simulator and `python -m` all find the
    library as engine._vendor.numa_utils, never the engine's own utils/numa_utils.py
    nor a top-level numa_utils."""
    names = (
        "numa_utils.py",
        "numa_utils_cli.py",
        "numa_utils_regions.py",
        "numa_utils_threads.py",
        "numa_utils_sim.py",
    )
    marker = _engine_tree(tmp_path, "_vendor", {n: n for n in names})
    tree = fixture_tree("dual-socket-8gpu", tmp_path / "tree")
    archive = fixture_root("four-node-asym")
    p = _clean_run(["-m", "engine._vendor.numa_utils", "status", "--root", tree], tmp_path)
    assert p.returncode == 0 and "NODE" in p.stdout.upper(), p.stderr
    p = _clean_run(["-m", "engine._vendor.numa_utils", "plan", "--root", tree, "--json"], tmp_path)
    assert p.returncode == 0 and len(json.loads(p.stdout)) == 8, p.stderr
    p = _clean_run(["-m", "engine._vendor.numa_utils", "status", "--root", archive], tmp_path)
    assert p.returncode == 0, p.stderr  # a one-file tree: read by the simulator beside it
    code = f"""
        import sys
        from engine._vendor import numa_utils as nu
        from engine._vendor.numa_utils_sim import SimulatedBackend
        from engine._vendor import numa_utils_cli as cli
        from engine._vendor import numa_utils_regions as nur
        assert cli._nu is nu and sys.modules["engine._vendor.numa_utils_sim"]._nu is nu
        assert nur.nu is nu and cli._nur is nur
        with nur.SharedRegion.create("kv", 4 << 20, layout="parts:bind:0/1/2/3",
                                    backend=SimulatedBackend({archive!r})) as r:
            assert r.policy and r.layout.nodes == {{0, 1, 2, 3}}
        assert nu.main(["fit", "8M", "--root", {tree!r}]) == 0
        print("ok")
    """
    p = _clean_run(["-c", textwrap.dedent(code)], tmp_path)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr
    assert not marker.exists(), marker.read_text()


def test_renamed_copy_serves_status_and_hands_itself_to_its_cli(tmp_path):
    """A copy the engine renamed (engine/utils/numa_place.py) beside the engine's own
    utils/numa_utils.py: alone it serves the API and status, and other commands get one
    line naming the file to copy; with numa_utils_cli.py and numa_utils_sim.py copied
    beside it, as that line says, they use the renamed copy, never the engine's
    numa_utils (before: an AttributeError traceback from the engine's module)."""
    marker = _engine_tree(tmp_path, "utils", {"numa_place.py": "numa_utils.py"})
    for name in (
        "numa_utils_cli.py",
        "numa_utils_regions.py",
        "numa_utils_threads.py",
        "numa_utils_sim.py",
    ):  # an installed CLI would serve
        (tmp_path / name).unlink()
    (tmp_path / "engine" / "utils" / "numa_utils.py").write_text(
        (tmp_path / "numa_utils.py").read_text()
    )
    tree = fixture_tree("dual-socket-8gpu", tmp_path / "tree")
    run = ["-m", "engine.utils.numa_place"]
    p = _clean_run([*run, "status"], tmp_path)
    assert p.returncode == 0 and "NODE" in p.stdout.upper(), p.stderr
    p = _clean_run([*run, "plan", "--root", tree], tmp_path)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert "numa_utils_cli.py: copy it beside numa_place.py" in p.stderr
    # No package index has numa_utils: the other way is a checkout's `pip install .`.
    assert "`pip install .` from a numa_utils checkout" in p.stderr, p.stderr
    code = """
        from engine.utils import numa_place as nu
        assert nu.read_topology().nodes
        assert nu.main(["status"]) == 0
        print("ok")
    """
    p = _clean_run(["-c", textwrap.dedent(code)], tmp_path)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr
    assert not marker.exists(), marker.read_text()
    for name in (
        "numa_utils_cli.py",
        "numa_utils_regions.py",
        "numa_utils_threads.py",
        "numa_utils_sim.py",
    ):
        (tmp_path / "engine" / "utils" / name).write_text((REPO / name).read_text())
    p = _clean_run([*run, "plan", "--root", tree, "--json"], tmp_path)
    assert p.returncode == 0 and len(json.loads(p.stdout)) == 8, p.stderr
    p = _clean_run([*run, "status", "--root", fixture_root("four-node-asym")], tmp_path)
    assert p.returncode == 0, p.stderr  # the simulator beside it reads the one-file tree
    code = f"""
        from engine.utils import numa_place as nu
        assert nu.main(["maps", "self", "--json"]) == 0
        assert nu.main(["plan", "--root", {tree!r}]) == 0
        print("ok")
    """
    p = _clean_run(["-c", textwrap.dedent(code)], tmp_path)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr
    assert not marker.exists(), marker.read_text()
    # Imported by itself, the CLI cannot know the library's new name: it finds the
    # engine's numa_utils, and says so in one ImportError, not an AttributeError.
    p = _clean_run(["-c", "import engine.utils.numa_utils_cli"], tmp_path)
    assert (
        p.stderr.strip()
        .splitlines()[-1]
        .startswith("ImportError: numa_utils_cli found engine.utils.numa_utils")
    ), p.stderr
    assert "which is not numa_utils" in p.stderr
