# SPDX-License-Identifier: Apache-2.0
"""The layout's numbers: the library names no simulator, the repository tracks at most
1,000 files, and numa_utils.py stays within its content budget and density limits.

Every figure is layout-independent or measured on the formatter's layout (`ruff format
--check` runs in the lint step, so the file on disk is the formatter's).  Size is
counted in AST nodes, so a line saved by packing saves nothing.  Each density figure
must meet its target.  The AST count, over its target, is checked twice: the target
(xfail, strict, so meeting it fails until the mark goes) and a ceiling that fails as
soon as a change grows the file without saying what it added.
"""

import ast
import io
import shutil
import statistics
import subprocess
import sys
import tokenize
from dataclasses import dataclass

import pytest
from conftest import REPO, nu, nur

LIBRARY = REPO / "numa_utils.py"
MAX_TRACKED_FILES = 1000

# The issue's targets.  AST nodes: 56,000 for the capabilities the file had when the
# budget was set, 64,000 at the end of the round with what it adds.
MAX_AST_NODES = 64_000
MAX_AST_NODES_TODAY = 56_000
MAX_TOKENS_PER_LINE = 7.5
MAX_MEDIAN_FUNCTION_DENSITY = 9.0
MAX_CONDITIONALS_PER_KLOC = 15
MAX_FORWARD_REFERENCES = 10
MAX_FORWARD_DISTANCE = 1000
MAX_ONE_LETTER_SHARE = 0.08


@dataclass
class Figures:
    code_lines: int
    ast_nodes: int
    tokens_per_line: float
    median_function_density: float
    conditionals_per_kloc: float
    chained_conditionals: int
    nested_comprehensions: int
    backslashes: int
    forward_references: int
    far_forward_references: int
    one_letter_share: float


def _docstring_lines(tree):
    lines = set()
    for node in ast.walk(tree):
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if not isinstance(node, kinds) or not node.body:
            continue
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            if isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def _forward_references(tree):
    """(user, name, distance in lines) for each top-level def or class that names a
    top-level def or class defined below it."""
    defined = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined[node.name] = node.lineno
    found = set()
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            continue
        for name in ast.walk(node):
            if not isinstance(name, ast.Name) or not isinstance(name.ctx, ast.Load):
                continue
            where = defined.get(name.id, 0)
            if where > node.lineno:
                found.add((node.name, name.id, where - node.lineno))
    return found


def measure(src):
    tree = ast.parse(src)
    nodes = list(ast.walk(tree))
    docs = _docstring_lines(tree)
    skipped = {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
    }
    code = set()
    tokens = 0
    inside_strings = set()
    for token in tokenize.generate_tokens(io.StringIO(src).readline):
        if token.type == tokenize.STRING and token.end[0] > token.start[0]:
            inside_strings.update(range(token.start[0], token.end[0]))
        if token.type not in skipped and token.start[0] not in docs:
            code.update(range(token.start[0], token.end[0] + 1))
            tokens += 1

    densities = []
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = [n for n in range(node.lineno, node.end_lineno + 1) if n in code]
            if len(lines) >= 8:
                densities.append(sum(1 for _ in ast.walk(node)) / len(lines))

    conditionals = [n for n in nodes if isinstance(n, ast.IfExp)]
    inner = {id(n.orelse) for n in conditionals if isinstance(n.orelse, ast.IfExp)}
    chains = [n for n in conditionals if isinstance(n.orelse, ast.IfExp) and id(n) not in inner]

    comprehension = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
    nested = 0
    for node in nodes:
        if isinstance(node, comprehension):
            below = [m for m in ast.walk(node) if m is not node]
            nested += any(isinstance(m, comprehension) for m in below)

    backslashes = 0
    for number, line in enumerate(src.splitlines(), 1):
        stripped = line.rstrip()
        if stripped.endswith("\\") and number not in inside_strings:
            backslashes += not stripped.lstrip().startswith("#")

    forward = _forward_references(tree)
    bound = [n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    bound += [n.arg for n in nodes if isinstance(n, ast.arg)]
    one_letter = sum(len(name) == 1 for name in bound)

    return Figures(
        code_lines=len(code),
        ast_nodes=len(nodes),
        tokens_per_line=tokens / max(len(code), 1),
        median_function_density=statistics.median(densities) if densities else 0.0,
        conditionals_per_kloc=1000 * len(conditionals) / max(len(code), 1),
        chained_conditionals=len(chains),
        nested_comprehensions=nested,
        backslashes=backslashes,
        forward_references=len(forward),
        far_forward_references=sum(d > MAX_FORWARD_DISTANCE for _, _, d in forward),
        one_letter_share=one_letter / max(len(bound), 1),
    )


# The figures are taken on one Python: each release's ast differs a little (3.8 adds
# Index nodes, 3.12 splits some f-strings), and 3.11 is the lint step's.
REFERENCE_PYTHON = (3, 11)


@pytest.fixture(scope="module")
def figures():
    if sys.version_info[:2] != REFERENCE_PYTHON:
        pytest.skip(f"the budget is counted on Python {REFERENCE_PYTHON[0]}.{REFERENCE_PYTHON[1]}")
    return measure(LIBRARY.read_text(encoding="utf-8"))


SAMPLE = '''"""Module doc,
two lines."""
# a comment
import os


def f(a, value):
    """Doc."""
    x = a if a else value if value else None
    y = [[i for i in row] for row in value]
    z = 1 + \\
        2
    return g(x, y, z)


def g(*args):
    return args
'''


def test_measure_counts_what_the_issue_counts():
    got = measure(SAMPLE)
    # import os; def f; x = ...; y = ...; z = 1 + \\ (2 lines); return; def g; return
    assert got.code_lines == 9
    assert got.ast_nodes == sum(1 for _ in ast.walk(ast.parse(SAMPLE)))
    assert got.chained_conditionals == 1
    assert got.conditionals_per_kloc == pytest.approx(1000 * 2 / 9)
    assert got.nested_comprehensions == 1
    assert got.backslashes == 1
    assert got.forward_references == 1 and got.far_forward_references == 0
    # bound: a, value, x, y, i, row, z, args -> a, x, y, i, z are one letter
    assert got.one_letter_share == pytest.approx(5 / 8)


def test_library_names_no_simulator():
    src = LIBRARY.read_text()
    tree = ast.parse(src)
    defined = [
        n.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and n.name == "SimulatedBackend"
    ]
    assert not defined, "numa_utils.py defines SimulatedBackend"


BACKEND_CLASSES = ("Backend", "LinuxBackend", "SimulatedBackend", "_SavedFolder")


@pytest.mark.parametrize("name", ["numa_utils.py", "numa_utils_cli.py"])
def test_no_isinstance_on_backend_classes(name):
    """A backend says what it can do (``is_live``, ``has_process``); the code never asks
    its class."""
    src = (REPO / name).read_text(encoding="utf-8")
    checks = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if named & set(BACKEND_CLASSES):
                checks.append(ast.get_source_segment(src, node))
    assert not checks, f"{name} tests a backend by its class: {checks}"


# Issue 28 §5: what the CLI needs from the library is public API: at most 5 private
# names.  The 5 left: the command framework status shares with the CLI (_print_json,
# _prog, _run), numactl's strtoul (_strtoul, which parse_nodestring shares) and the
# numa_maps line splitter (_whole_lines).
MAX_CLI_PRIVATE_NAMES = 5


def _cli_private_names():
    """The library's private names numa_utils_cli.py uses (``_nu._name``; dunders such
    as ``__version__`` are not private)."""
    tree = ast.parse((REPO / "numa_utils_cli.py").read_text(encoding="utf-8"))
    return sorted(
        {
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == "_nu"
            and n.attr.startswith("_")
            and not n.attr.endswith("__")
        }
    )


def test_cli_uses_at_most_5_private_library_names():
    names = _cli_private_names()
    assert len(names) <= MAX_CLI_PRIVATE_NAMES, names


def test_repository_tracks_at_most_1000_files():
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    p = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, timeout=60)
    if p.returncode != 0:
        reason = p.stderr.decode(errors="replace").strip()[:200]
        pytest.skip(f"not a git checkout (an sdist or a copied tree): {reason}")
    files = [f for f in p.stdout.split(b"\0") if f]
    assert files, "git ls-files listed nothing"
    assert len(files) <= MAX_TRACKED_FILES, (
        f"{len(files)} tracked files (at most {MAX_TRACKED_FILES})"
    )


# Each figure's target, and for those not met yet a ceiling: the figure when this check
# was written (after `ruff format`, before any rewrite).  No change may raise a ceiling;
# a target not met is xfail (strict: meeting it fails until its ceiling is deleted).

TARGETS = {
    "ast_nodes": MAX_AST_NODES_TODAY,
    "tokens_per_line": MAX_TOKENS_PER_LINE,
    "median_function_density": MAX_MEDIAN_FUNCTION_DENSITY,
    "conditionals_per_kloc": MAX_CONDITIONALS_PER_KLOC,
    "chained_conditionals": 0,
    "nested_comprehensions": 0,
    "backslashes": 0,
    "forward_references": MAX_FORWARD_REFERENCES,
    "far_forward_references": 0,
    "one_letter_share": MAX_ONE_LETTER_SHARE,
}
# Every density figure meets its target (issue 28 §3-4), so the target tests guard them;
# the ceilings that kept each from growing meanwhile are gone.  Only the AST count is
# over its target: MAX_AST_NODES_NOW below keeps it from growing.
NOT_MET = {"ast_nodes"}


def _meets(name, value, limit):
    if name == "one_letter_share":  # "under 8%"
        return value < limit
    return value <= limit


@pytest.mark.xfail(
    strict=True,
    reason="76,094 AST nodes with issue 26's hardening, issue 27's regions at engine "
    "scale and issue 29's thread roles: over the round's 64,000 until the rest of "
    "issue 28's moves and simplifications land (the ceiling below keeps it from growing)",
)
def test_ast_nodes_within_the_round_budget(figures):
    assert figures.ast_nodes <= MAX_AST_NODES


# The size when the hardening round landed: no change may grow the file past it.
# 66,651 at the end of the last session; +268 this one for rewrites that unpacked
# chained conditionals into named steps (_device_node, _device_kind, _share_by_shape,
# CudaPin.to_json as a literal) and the layout bound moved into _record_layout;
# +198 for attach(created_after=), create(existing="reuse", wait=) and replace's
# second look (the LightLLM port's restart race); +71 for status --format nfd's options
# (--write, --expiry) and its hand-over to numa_utils_cli.  Issue 29's thread roles
# (thread_plan, pin_threads, pinned, instance_plans, settle, spawn_context, the threads
# command) add 5,436.  Issue 27: fit(layout=) with vmas/vmas_free and the map-count
# spare's cap (296), a sibling CLI or simulator handed the library that loaded it (87).
# Issue 28: +138 for SharedRegion.create's one read of the topology and NUMA_NODES
# (fit split into fit/_fit, the read passed down) and the one mode vocabulary.
# +52 where the merged branches met (attach's one read beside created_after, fit's layout).
# Issue 27 §2: +2,175 for huge-page regions' record segments (the record out of the
# huge pages, cleanup of the pair, the GH200 first-touch rule).
# +347 for the last chained conditionals and nested comprehensions written as named
# steps (_fit_targets, _fit_share, _fit_available, _cgroup_dirs, _local_memory,
# _cores_in) and plain statements.
# +111 for the public API the CLI now uses instead of private names (issue 28 §5):
# cuda_device() (the lookup `run --gpu` made with _resolve and _gpu_infos) and 13
# names in __all__ (parse_size, format_size, format_kib, printable, ShmStat, ...).
# -137 for the backend seam (33 public members to 8: the forwarding methods and their
# stubs gone) and the CLI's 4 new public names, together.
# +704 and +649 for conditional expressions written as statements (issue 28 §3, parts
# A and B: 241 of 274).  +16: the segments call() returns declared ShmStat for mypy.
# +97 for dense lines written as named steps (issue 28 §3: the median function's
# density from 9.11 to 8.92).  +13: _mask_args, the NULL-mask rule that mbind and
# set_mempolicy each wrote out, written once.  -15: _extent_cpus and remote_share read
# the topology through _topology_or_read, as their neighbours do.
# -1,066 for one pass of simplifications over every section (a repeated check or
# lookup written once, dead branches and unused parameters gone, one identity-record
# reader, one even-split helper, one JSON helper for key-ordered mappings).  +52 for
# two faults that pass found: a PCI folder not named as a bus id (a damaged tree)
# crashed read_topology; thread_plan(pci_bus_id=) of another maker's GPU, a KeyError.
# +30: cpus_for_gpu and bind_for_gpu plan such a GPU with its maker's GPUs too.
# -5: the PCI folder check asks _norm_bus_id, the one definition of a bus id.
MAX_AST_NODES_NOW = (
    67_191
    + 5_436
    + 383
    + 138
    + 52
    + 2_175
    + 347
    + 111
    - 137
    + 704
    + 649
    + 16
    + 97
    + 13
    - 15
    - 1_066
    + 52
    + 30
    - 5
)


def test_ast_nodes_never_grow(figures):
    assert figures.ast_nodes <= MAX_AST_NODES_NOW


_NOT_MET = pytest.mark.xfail(strict=True, reason="readability rewrite (issue 28) under way")


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[_NOT_MET] if n in NOT_MET else []) for n in sorted(TARGETS)],
)
def test_figure_meets_its_target(figures, name):
    value = getattr(figures, name)
    assert _meets(name, value, TARGETS[name]), f"numa_utils.py: {name} is {value}"


def test_enums_are_declared_as_classes():
    """A reader should not count positions to learn that BIND is 2: no functional-form
    enum (``enum.IntEnum("Mode", "DEFAULT PREFERRED ...")``)."""
    tree = ast.parse(LIBRARY.read_text(encoding="utf-8"))
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == "enum":
                calls.append(f"line {node.lineno}: enum.{node.func.attr}(...)")
    assert not calls, calls


def test_memory_policy_constants_match_the_kernel_header():
    """include/uapi/linux/mempolicy.h, written out here, not read from the library."""
    kernel = {
        "DEFAULT": 0,
        "PREFERRED": 1,
        "BIND": 2,
        "INTERLEAVE": 3,
        "LOCAL": 4,
        "PREFERRED_MANY": 5,
        "WEIGHTED_INTERLEAVE": 6,
    }
    assert {m.name: int(m) for m in nu.Mode} == kernel
    flags = {"NUMA_BALANCING": 1 << 13, "RELATIVE_NODES": 1 << 14, "STATIC_NODES": 1 << 15}
    assert {f.name: int(f) for f in nu.ModeFlag} == flags
    assert {f.name: int(f) for f in nu.MbindFlag} == {"STRICT": 1, "MOVE": 2, "MOVE_ALL": 4}
    assert {f.name: int(f) for f in nu.GetFlag} == {"NODE": 1, "ADDR": 2, "MEMS_ALLOWED": 4}


def test_no_module_or_record_level_getattr():
    """Attributes a type checker can see: no module ``__getattr__`` (the simulator is
    imported by whoever needs it) and no record that makes up its fields."""
    tree = ast.parse(LIBRARY.read_text(encoding="utf-8"))
    found = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert "__getattr__" not in found
    records = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and any("_Record" in ast.dump(b) for b in n.bases)
    ]
    assert records, "no _Record classes found: the check would pass vacuously"
    for record in records:
        methods = [m.name for m in record.body if isinstance(m, ast.FunctionDef)]
        assert "__getattr__" not in methods, record.name
    counters = nur.NodeCounters(0, {"numa_hit": 5}, {"MemFree": 7})
    assert (counters.numa_hit, counters.numa_miss, counters.mem_free_kb) == (5, 0, 7)
    with pytest.raises(AttributeError):
        counters.numa_hti  # noqa: B018  (a typo is an error, not 0)


def test_one_argument_parser():
    """argparse reads every command line: no second, hand-written argv reader."""
    for path in (LIBRARY, REPO / "numa_utils_cli.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert not names & {"_quick_args", "_maps_args"}, path.name
