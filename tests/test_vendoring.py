"""The vendoring promise: numa_utils.py copied alone, under another name, in a package,
imports without touching the system and works."""
import subprocess
import sys
import textwrap

from conftest import REPO, fixture_root


def _run(code, cwd):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=str(cwd),
                          capture_output=True, text=True, timeout=60)


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
    p = _run(f"""
        import sys
        from lightllm.utils import numa_utils as nu
        assert "numa_utils" not in sys.modules, "imported itself by its own name"
        t = nu.read_topology(backend=nu.LinuxBackend({fixture_root('four-node-asym')!r}))
        assert len(t.nodes) == 4
        assert nu.main(["status", "--root", {fixture_root('single-node')!r}]) == 0
        print("ok")
    """, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "ok" in p.stdout


def test_copy_alone_without_envs(tmp_path):
    (tmp_path / "vendored_numa.py").write_text((REPO / "numa_utils.py").read_text())
    p = _run("""
        import json, io, contextlib, vendored_numa as nu
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert nu.main(["status", "--json"]) == 0
        rep = json.loads(out.getvalue())
        assert "config" not in rep
        print("ok")
    """, tmp_path)
    assert p.returncode == 0, p.stderr


def test_import_reads_nothing_and_loads_no_library(tmp_path):
    """Nothing happens at import: no /sys or /proc file opened, no library loaded."""
    (tmp_path / "vendored_copy.py").write_text((REPO / "numa_utils.py").read_text())
    p = _run("""
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
    """, tmp_path)
    assert p.returncode == 0, p.stderr


def test_envs_beside_the_copy_in_a_package_with_an_engine_prefix(tmp_path):
    _vendor(tmp_path, "engine", "numa_utils.py", "envs.py")
    p = _run(f"""
        import os
        from engine.utils import envs, numa_utils as nu
        envs.set_prefix("LIGHTLLM_")
        os.environ["LIGHTLLM_ENABLE_NUMA_INTERLEAVE"] = "yes"
        rep = nu.status_report(backend=nu.LinuxBackend({fixture_root('single-node')!r}))
        cfg = rep["config"]
        assert cfg["LIGHTLLM_ENABLE_NUMA_INTERLEAVE"] == {{"value": True, "source": "env"}}, cfg
        os.environ["LIGHTLLM_NUMA_STRICT"] = "maybe"
        rep = nu.status_report(backend=nu.LinuxBackend({fixture_root('single-node')!r}))
        assert "LIGHTLLM_NUMA_STRICT" in rep["config_error"], rep.get("config_error")
        print("ok")
    """, tmp_path)
    assert p.returncode == 0, p.stderr
