"""The command line, run as a user runs it: `python -m numa_utils ...` in a subprocess."""

import json
import os
import subprocess
import sys

import pytest
from conftest import FIXTURES, REPO, cli, fixture_root, nu, saved_backend


def run(*args, env=None):
    e = dict(os.environ, PYTHONPATH=str(REPO))
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "numa_utils", *args],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        env=e,
        timeout=600,
    )


def test_status_this_machine_text_and_json():
    p = run("status")
    assert p.returncode == 0, p.stderr
    for part in ("NODES", "PROCESS", "KERNEL", "WARNINGS", "memory policy"):
        assert part in p.stdout
    j = run("status", "--json")
    assert j.returncode == 0, j.stderr
    rep = json.loads(j.stdout)
    for key in ("nodes", "gpus", "process", "kernel", "warnings"):
        assert key in rep
    for n in rep["nodes"]:
        assert set(n) >= {"id", "cpus", "mem_total_kb", "mem_free_kb", "distances"}
        assert n["cpus"] == sorted(n["cpus"])
        assert all(isinstance(k, str) for k in n["distances"])
    assert rep["process"]["pid"] > 0
    assert (
        set(rep["process"]["allowed_cpus"]) == os.sched_getaffinity(0)
        or rep["process"]["allowed_cpus"]
    )


@pytest.mark.parametrize("name", FIXTURES)
def test_status_every_fixture(name):
    """In-process (cheap) for every fixture: text and JSON agree with the reader."""
    b = saved_backend(fixture_root(name))
    rep = cli.status_report(backend=b)
    topo = nu.read_topology(backend=b)
    assert [n["id"] for n in rep["nodes"]] == sorted(topo.nodes)
    assert len(rep["gpus"]) == len(topo.gpus)
    text = cli._render_status(rep)
    assert "NODES" in text and "WARNINGS" in text
    json.dumps(rep)


def test_status_root_subprocess_and_warnings():
    p = run("status", "--json", "--root", fixture_root("dual-socket-8gpu"))
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert len(rep["nodes"]) == 2 and len(rep["gpus"]) == 8
    assert {g["node"] for g in rep["gpus"]} == {0, 1}
    assert any("numa_balancing" in w for w in rep["warnings"])
    txt = run("status", "--root", fixture_root("dual-socket-8gpu")).stdout
    assert "DISTANCES" in txt and "GPUS" in txt and "0-47,96-143" in txt


def test_status_warns_about_cpuset_excluding_gpu_node():
    rep = cli.status_report(backend=saved_backend(fixture_root("container-cpuset")))
    assert any("cpuset" in w and "GPU" in w for w in rep["warnings"]), rep["warnings"]


def test_status_warns_about_unknown_gpu_node():
    rep = cli.status_report(backend=saved_backend(fixture_root("gpu-numa-unknown")))
    assert any("numa_node=-1" in w for w in rep["warnings"]), rep["warnings"]


def test_status_missing_root_is_a_clear_error():
    p = run("status", "--root", "/nonexistent-tree")
    assert p.returncode == 2
    assert "nonexistent-tree" in p.stderr and "Traceback" not in p.stderr


def test_help_and_version():
    assert run("--help").returncode == 0
    v = run("--version")
    assert v.returncode == 0 and nu.__version__ in v.stdout


def test_main_in_process(capsys):
    assert nu.main(["status", "--json", "--root", fixture_root("sparse-ids")]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [n["id"] for n in rep["nodes"]] == [0, 8, 250, 251, 252, 253, 254, 255]


def test_cli_file_runs_as_a_script(tmp_path):
    """`python numa_utils_cli.py CMD` (the file itself, as the guests run it): main()
    runs after every name it reaches is defined."""
    saved = tmp_path / "numa_maps"
    saved.write_text("7f0000000000 default anon=2 dirty=2 N0=2 kernelpagesize_kB=4\n")
    for args in (["maps", "--file", str(saved)], ["status", "--root", fixture_root("single-node")]):
        p = subprocess.run(
            [sys.executable, str(REPO / "numa_utils_cli.py"), *args],
            capture_output=True,
            text=True,
            cwd=str(tmp_path),
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            timeout=600,
        )
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip()


def test_maps_loads_only_what_it_uses(tmp_path):
    """`maps` (timed against `numastat -p` on a process of 60,000 VMAs) loads neither
    numa_utils_threads nor shutil: argparse's help formatter, made for every
    add_argument, measured the terminal through shutil, whose import brings zlib, bz2
    and lzma.  Before 3.9 argparse imports shutil itself."""
    saved = tmp_path / "numa_maps"
    saved.write_text("7f0000000000 default anon=2 dirty=2 N0=2 kernelpagesize_kB=4\n")
    code = (
        "import sys, numa_utils\n"
        "rc = numa_utils.main(['maps', '--file', sys.argv[1]])\n"
        "names = ('numa_utils_cli', 'numa_utils_threads', 'shutil', 'bz2', 'lzma')\n"
        "print(rc, *[name for name in names if name in sys.modules], file=sys.stderr)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(saved)],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=600,
    )
    assert "1 VMAs" in p.stdout, p.stderr
    loaded = p.stderr.split()
    if sys.version_info < (3, 9):
        assert loaded[:2] == ["0", "numa_utils_cli"], loaded
    else:
        assert loaded == ["0", "numa_utils_cli"]


def test_help_follows_columns():
    """The help is wrapped to $COLUMNS, as argparse's own measure of the terminal
    (shutil.get_terminal_size) does: the formatter is given that width."""
    narrow = run("maps", "--help", env={"COLUMNS": "50"})
    wide = run("maps", "--help", env={"COLUMNS": "200"})
    assert narrow.returncode == wide.returncode == 0
    assert max(map(len, narrow.stdout.splitlines())) <= 50
    assert max(map(len, wide.stdout.splitlines())) > 80
    assert "  --min-size SIZE  list VMAs with at least this much resident" in wide.stdout
