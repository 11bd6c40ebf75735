# SPDX-License-Identifier: Apache-2.0
"""What a type checker sees of the public API: real types, not ``Any``.

A property built as ``property(lambda self: ...)`` types as ``Any``, so mypy took
``region.address + "x"`` and a misspelt attribute without a word.  Runs mypy on a
small snippet (skips where mypy is not installed; tox's lint environment has it).
"""

import subprocess
import sys

import pytest
from conftest import REPO

SNIPPET = """\
import numa_utils as nu, numa_utils_regions as nur, numa_utils_threads as nut


def use(region: nur.SharedRegion, counters: nur.NodeCounters) -> int:
    reveal_type(region.address)
    reveal_type(region.layout)
    reveal_type(region.size)
    reveal_type(region.policy)
    after: int = region.address + 1
    return after + counters.numa_hti
"""


@pytest.fixture(scope="module")
def mypy_says(tmp_path_factory):
    pytest.importorskip("mypy", reason="mypy is not installed (tox -e lint has it)")
    where = tmp_path_factory.mktemp("typing")
    (where / "snippet.py").write_text(SNIPPET)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-error-summary",
            "--hide-error-context",
            "--no-pretty",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(where / "cache"),
            str(where / "snippet.py"),
        ],
        cwd=str(REPO),
        env={"MYPYPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.stdout.splitlines()


def _about(lines, number):
    """mypy's lines about line ``number`` of the snippet."""
    return [line for line in lines if f"snippet.py:{number}:" in line]


def test_mypy_sees_the_region_address_and_layout_types(mypy_says):
    assert any('Revealed type is "builtins.int"' in line for line in _about(mypy_says, 5))
    assert any(
        'Revealed type is "numa_utils_regions.Layout"' in line for line in _about(mypy_says, 6)
    )
    assert any('Revealed type is "builtins.int"' in line for line in _about(mypy_says, 7))
    assert any("numa_utils.PolicyResult" in line for line in _about(mypy_says, 8))
    assert not _about(mypy_says, 9), mypy_says  # address + 1 is an int


def test_mypy_rejects_a_misspelt_counter(mypy_says):
    errors = _about(mypy_says, 10)
    assert any('has no attribute "numa_hti"' in line for line in errors), mypy_says


def test_no_property_built_from_a_lambda():
    """A property is declared with ``@property`` and a return type, never
    ``property(lambda self: ...)`` (which a type checker sees as ``Any``)."""
    import ast

    source = (REPO / "numa_utils.py").read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "property" and any(isinstance(a, ast.Lambda) for a in node.args):
            found.append(f"line {node.lineno}")
    assert not found, found
