# SPDX-License-Identifier: Apache-2.0
"""Every code block in README.md and docs/*.md runs here, as printed, so the
documentation cannot drift from the code.

Rules (for whoever writes a block):

- Each fenced block names its language.  ```python and ```sh blocks run; ```text
  (and json, toml, ini, yaml) are not code.  A block that must not run is preceded
  by ``<!-- not run: why -->`` on the line(s) just above its fence.
- Each block stands alone: it runs in a process of its own (tests/readme_runner.py),
  with nothing from the blocks before it.
- A python block runs as an engine that vendored numa_utils: its process has exactly
  the files the block imports, copied into ``myengine/_vendor/`` (``import
  numa_utils_regions as nur``, ``from numa_utils_sim import SimulatedBackend``, or
  the vendored names ``from myengine._vendor import numa_utils``), with the core
  always and what a file needs beside it (numa_utils_cli.py: the regions and
  threads files).  The test checks that the block loaded every file it was given.
  No top-level ``numa_utils*`` module exists there, installed or not.
- It runs on a simulated one-node machine without a GPU (fake_sysfs/single-node.txt),
  the default of every call made without ``backend=``: what a reader's laptop is.  A
  block that prints a machine's values names its machine in the block (``with
  nu.use_backend(SimulatedBackend("fake_sysfs/dual-socket-8gpu.txt")):``).  A block
  must leave no shared memory region on the machine once its process exits, and no
  region ever touches this host's /dev/shm or SysV IPC (they live in the simulator).
- Output: a ```text block marked ``<!-- output -->``, right after a block (blank
  lines between them only), is what that block prints on stdout; ``...`` stands for
  any text (doctest's ELLIPSIS).  A python block with an output runs a second time
  with another default machine (fake_sysfs/mi300x-8gpu.txt), and must print the same:
  its output cannot come from the machine it did not name.  Values are not shown in
  comments after ``print(...)``: the test refuses those (they are never checked).
- ```sh blocks run with bash -e in a fresh scratch folder that links to every
  top-level entry of the repository (so ``fake_sysfs/...`` and ``python3 -m
  numa_utils`` work as in a checkout), HOME a fresh folder, ``python3`` the
  interpreter running the tests.  A block that writes an absolute path fails: the
  suite never writes outside its temporary folders.
- A block that needs numpy or torch where it is not installed is skipped (reported
  as a skip once every other block of the document passed).
"""

import ast
import doctest
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import REPO, fixture_root

README = REPO / "README.md"
DOCS = [README] + sorted((REPO / "docs").glob("*.md"))
RUN = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
TEXT = {"text", "json", "toml", "ini", "yaml"}
RUNNER = REPO / "tests" / "readme_runner.py"
# The reader's machine (one node, no GPU), then the one that checks that an output
# does not come from it.
MACHINES = ("single-node", "mi300x-8gpu")
MARK = re.compile(r"^\s*<!--\s*(not run|output)\s*(?::\s*(.*?))?\s*-->\s*$")
# What a vendored file needs beside it to import at all.
NEEDS = {"numa_utils_cli.py": ("numa_utils_regions.py", "numa_utils_threads.py")}
VENDORABLE = (
    "numa_utils",
    "numa_utils_regions",
    "numa_utils_threads",
    "numa_utils_cli",
    "numa_utils_sim",
    "envs",
)
PACKAGE = "myengine._vendor"


class Block:
    """One fenced block of a document."""

    def __init__(self, doc, section, line, lang, code, marks):
        self.doc, self.section, self.line = doc, section, line
        self.lang, self.code, self.marks = lang, code, marks
        self.output = None  # the text of its <!-- output --> block, when it has one
        self.files = None  # the runner's test: files other than the block's imports

    @property
    def where(self):
        return f"{self.doc}:{self.line}"

    @property
    def runs(self):
        return RUN.get(self.lang) is not None and "not run" not in self.marks


def _blocks(doc, text):
    """Every fenced block of ``text``, outputs attached to the block they follow."""
    out, section, marks = [], "(top)", {}
    last = None  # the block just closed, while only blank lines and marks follow it
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARK.match(line)
        if m:
            marks[m.group(1)] = m.group(2) or ""
        elif line.startswith("```"):
            lang = line[3:].strip()
            start = i + 1
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                i += 1
            block = Block(doc, section, start, lang, "\n".join(lines[start:i]) + "\n", marks)
            if "output" in marks:
                assert last is not None and last.runs and last.output is None, (
                    f"{block.where}: an output block follows the block it shows, with "
                    "nothing but blank lines between them"
                )
                assert lang == "text", f"{block.where}: an output block is ```text"
                last.output = block.code
            out.append(block)
            last, marks = block, {}
        elif line.strip():
            if line.startswith("#"):
                section = line.lstrip("#").strip()
            marks, last = {}, None
        i += 1
    return out


BLOCKS = []
for _doc in DOCS:
    BLOCKS += _blocks(str(_doc.relative_to(REPO)), _doc.read_text(encoding="utf-8"))
PY_DOCS = sorted({b.doc for b in BLOCKS if b.runs and RUN[b.lang] == "python"})
SH_BLOCKS = [b for b in BLOCKS if b.runs and RUN[b.lang] == "sh"]
# print(...)  # a value: a shown output nobody checks.
PRINT_COMMENT = re.compile(r"^\s*print\(.*\)\s*#")


def test_every_block_is_classified():
    assert BLOCKS, "no code blocks found in README.md and docs/"
    assert len(DOCS) > 1, "no docs/*.md"
    for b in BLOCKS:
        assert b.lang in RUN or b.lang in TEXT, (
            f"{b.where} ({b.section}): name the block's language (python, sh, text)"
        )
        if "not run" in b.marks:
            assert b.marks["not run"], f"{b.where}: say why it is not run"
        if b.runs and RUN[b.lang] == "python":
            for n, line in enumerate(b.code.splitlines()):
                assert not PRINT_COMMENT.match(line), (
                    f"{b.doc}:{b.line + n}: show what a block prints in an output block "
                    "after it (<!-- output -->), where the test checks it"
                )
        if b.lang == "text" and "output" in b.marks:
            assert b.code.strip().strip(".").strip(), f"{b.where}: an output of only `...`"
    assert PY_DOCS and SH_BLOCKS, "no runnable block"


def test_readme_is_short_and_links_every_doc():
    """The README is the first page (at most 200 lines); the rest is in docs/, each
    page reachable from it, and every relative link leads to a file that exists."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    for doc in DOCS[1:]:
        assert f"](docs/{doc.name})" in text, f"README.md does not link docs/{doc.name}"
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if "://" not in target:
                assert (doc.parent / target).exists(), f"{doc.name}: link to {target}"


def vendored_files(code):
    """The files a python block gets: the core, what it imports, what those need."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    files = {"numa_utils.py"}
    for name in names:
        if name.startswith(PACKAGE + "."):
            name = name[len(PACKAGE) + 1 :]
        if name in VENDORABLE:
            files.add(name + ".py")
            files.update(NEEDS.get(name + ".py", ()))
    return sorted(files)


@pytest.mark.parametrize(
    "code,want",
    [
        ("import numa_utils as nu\n", ["numa_utils.py"]),
        ("import numa_utils_regions as nur\n", ["numa_utils.py", "numa_utils_regions.py"]),
        (
            "from numa_utils_sim import SimulatedBackend\nimport numa_utils_threads\n",
            ["numa_utils.py", "numa_utils_sim.py", "numa_utils_threads.py"],
        ),
        (
            "from myengine._vendor import numa_utils_cli as cli\n",
            [
                "numa_utils.py",
                "numa_utils_cli.py",
                "numa_utils_regions.py",
                "numa_utils_threads.py",
            ],
        ),
        ("import numpy as np\nimport envs\n", ["envs.py", "numa_utils.py"]),
    ],
)
def test_a_block_gets_what_it_imports(code, want):
    assert vendored_files(code) == want


@pytest.fixture
def scratch(tmp_path):
    """A folder that looks like the repository (links to its entries), a bin/ whose
    python3 is this interpreter, and an empty HOME."""
    work = tmp_path / "work"
    work.mkdir()
    for entry in os.listdir(REPO):
        if entry not in (".git", ".tox") and not entry.startswith(".pytest"):
            os.symlink(REPO / entry, work / entry)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python3", "python"):
        os.symlink(sys.executable, bin_dir / name)
    home = tmp_path / "home"
    home.mkdir()
    return work, bin_dir, home


def _output_matches(want, got):
    checker = doctest.OutputChecker()
    return checker.check_output(want, got, doctest.ELLIPSIS)


def _run_python(doc_blocks, work, tmp_path, machines=MACHINES):
    """Runs ``doc_blocks`` (each alone) in one runner; one list of runs per block."""
    spec = {
        "repo": str(REPO),
        "vendor": str(tmp_path / "vendor"),
        "machines": [fixture_root(m) for m in machines],
        "result": str(tmp_path / "result.json"),
        "blocks": [
            {
                "where": b.where,
                "code": b.code,
                "files": b.files or vendored_files(b.code),
                "machines": 1 if b.output is None else len(machines),
            }
            for b in doc_blocks
        ],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMA_UTILS_", "CUDA_"))}
    p = subprocess.run(
        [sys.executable, "-I", str(RUNNER), str(tmp_path / "spec.json")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-6000:]
    return spec, json.loads((tmp_path / "result.json").read_text())


@pytest.mark.parametrize("doc", PY_DOCS)
def test_python_blocks(doc, scratch, tmp_path):
    """Each python block of ``doc`` runs alone, as printed, with exactly the files it
    imports, on a one-node machine without a GPU, and prints what the document shows."""
    work, _bin, _home = scratch
    blocks = [b for b in BLOCKS if b.doc == doc and b.runs and RUN[b.lang] == "python"]
    spec, results = _run_python(blocks, work, tmp_path)
    failures, skipped = [], []
    for b, want, runs in zip(blocks, spec["blocks"], results):
        first = runs[0]
        if first["missing"]:
            skipped.append(f"{b.where} needs {first['missing']}")
            continue
        if first["error"]:
            failures.append(f"{b.where} ({b.section}):\n{first['stderr'][-2000:]}{first['error']}")
            continue
        if first["left"]:
            failures.append(f"{b.where}: regions left behind: {first['left']}")
        if first["loaded"] != want["files"]:
            failures.append(
                f"{b.where}: vendored {want['files']} (what it imports), loaded "
                f"{first['loaded']}: a block gets exactly what it imports"
            )
        if b.output is not None:
            if not _output_matches(b.output, first["stdout"]):
                failures.append(
                    f"{b.where}: prints\n{first['stdout']}the document shows\n{b.output}"
                )
            other = runs[1]
            if other["error"] or other["stdout"] != first["stdout"]:
                failures.append(
                    f"{b.where}: prints another output when the default machine is "
                    f"{MACHINES[1]} (name the machine in the block):\n"
                    f"{other['stdout']}{other['error'] or ''}"
                )
    assert not failures, "\n\n".join(failures)
    if skipped:
        pytest.skip("; ".join(skipped))


# -- sh blocks ---------------------------------------------------------------------

# Commands whose operands (all but options) are written to, and the redirections.
WRITERS = {"mkdir", "cp", "mv", "install", "ln", "touch", "tee", "chmod", "chown", "rm"}


def _writes(code):
    """The absolute paths a sh block writes (redirections, operands of WRITERS)."""
    out = []
    for line in code.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split()
        for i, w in enumerate(words):
            if w in (">", ">>") and i + 1 < len(words):
                out.append(words[i + 1])
            elif re.match(r"^\d?>>?/", w):
                out.append(w.lstrip("0123456789>"))
        if words and words[0] in WRITERS:
            out += [a for a in words[1:] if not a.startswith("-")]
    return [p for p in out if p.startswith("/") and p != "/dev/null"]


def _run_sh(block, work, bin_dir, home):
    outside = _writes(block.code)
    assert not outside, (
        f"{block.where}: the sh block writes outside the scratch folder: {outside}; "
        "write under $HOME or the current folder, or mark it <!-- not run: why -->"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMA_UTILS_", "CUDA_"))}
    env.pop("PYTHONPATH", None)
    env.update(HOME=str(home), PATH=os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]))
    out = subprocess.run(
        ["bash", "-e", "-c", block.code],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (
        f"{block.where}: sh block failed ({out.returncode}):\n{block.code}\n{out.stderr[-3000:]}"
    )
    return out.stdout


@pytest.mark.parametrize("block", SH_BLOCKS, ids=[b.where for b in SH_BLOCKS])
def test_sh_block(block, scratch):
    work, bin_dir, home = scratch
    stdout = _run_sh(block, work, bin_dir, home)
    if block.output is not None:
        assert _output_matches(block.output, stdout), (
            f"{block.where}: prints\n{stdout}the document shows\n{block.output}"
        )


@pytest.mark.parametrize(
    "code,want",
    [
        ("mkdir -p /usr/local/bin   # or any directory\n", ["/usr/local/bin"]),
        ("printf 'x > /etc/no' > /usr/local/bin/numactl\n", ["/usr/local/bin/numactl"]),
        ("echo hi >>/etc/motd\ncp a /opt/b\n", ["/etc/motd", "/opt/b"]),
        ("chmod +x /usr/local/bin/numactl\nls /usr/bin >/dev/null\n", ["/usr/local/bin/numactl"]),
        ("cp numa_utils.py myengine/utils/\n", []),
        ('mkdir -p ~/.local/bin\ncat > "$HOME/x" <<EOF\n', []),
    ],
)
def test_writes_finds_the_paths_a_block_writes(code, want):
    assert _writes(code) == want


def test_numactl_shim_block_stays_in_the_users_home(scratch):
    """The docs' numactl shim, as a reader runs it, lands under HOME (the scratch's
    here), never in /usr/local/bin where it would shadow the real numactl for every
    user, and runs numa_utils' numactl."""
    work, bin_dir, home = scratch
    (block,) = [b for b in SH_BLOCKS if "numactl --hardware" in b.code and "chmod" in b.code]
    assert "/usr/local" not in block.code
    before = os.path.lexists("/usr/local/bin/numactl") and os.lstat("/usr/local/bin/numactl")
    stdout = _run_sh(block, work, bin_dir, home)
    (shim,) = [p for p in home.rglob("numactl") if p.is_file()]
    assert os.access(shim, os.X_OK) and "numa_utils" in shim.read_text()
    assert stdout.startswith("available: "), stdout
    after = os.path.lexists("/usr/local/bin/numactl") and os.lstat("/usr/local/bin/numactl")
    assert before == after


# -- the runner ----------------------------------------------------------------------


def test_runner_runs_each_block_alone_with_exactly_its_files(scratch, tmp_path):
    """No block sees an earlier block's names or regions; a block that does not import
    a file does not have it, even where a test environment installed numa_utils;
    a region left on the machine is reported."""
    work, _bin, _home = scratch
    blocks = [
        Block("t.md", "t", 1, "python", "x = 1\nimport numa_utils_regions\n", {}),
        Block("t.md", "t", 2, "python", "print(x)\n", {}),
        Block("t.md", "t", 3, "python", "import numa_utils\nimport numa_utils_sim\n", {}),
        Block(
            "t.md",
            "t",
            4,
            "python",
            "import importlib.util\nimport numa_utils as nu\n"
            "print(importlib.util.find_spec('numa_utils_regions'), nu.__name__)\n",
            {},
        ),
        Block(
            "t.md",
            "t",
            5,
            "python",
            "from numa_utils_regions import SharedRegion\n"
            "r = SharedRegion.create('left', 1 << 20)\n",
            {},
        ),
    ]
    blocks[2].files = ["numa_utils.py"]  # imports the simulator, which is not there
    spec, results = _run_python(blocks, work, tmp_path, machines=MACHINES[:1])
    (one,), (two,), (three,), (four,), (five,) = results
    assert one["error"] is None and one["loaded"] == ["numa_utils.py", "numa_utils_regions.py"]
    assert "NameError: name 'x' is not defined" in two["error"]
    assert "No module named 'myengine._vendor.numa_utils_sim'" in three["error"]
    assert "only myengine._vendor's copies exist" in three["error"]
    assert four["stdout"] == "None myengine._vendor.numa_utils\n", four
    assert five["error"] is None and len(five["left"]) == 1, five


def test_vendoring_table_holds_for_the_readme_examples():
    """The README's examples run with the files its vendoring table names for their
    use (the simulator aside: it is the example's machine, not the engine's need)."""
    uses = {
        "Bind a worker to its GPU": ["numa_utils.py"],
        "Place an engine's own mapping": ["numa_utils.py"],
        "A shared region for a KV cache": ["numa_utils.py", "numa_utils_regions.py"],
        "Thread roles": ["numa_utils.py", "numa_utils_threads.py"],
    }
    got = {}
    for b in BLOCKS:
        if b.doc == "README.md" and b.section in uses and b.runs:
            got[b.section] = [f for f in vendored_files(b.code) if f != "numa_utils_sim.py"]
    assert got == uses


def test_pip_install_installs_every_file():
    """The docs and the core's hint say `pip install .` from a checkout gives every
    command: pyproject.toml lists each numa_utils*.py file."""
    text = (REPO / "pyproject.toml").read_text()
    listed = re.search(r"^py-modules = \[(.*?)\]", text, re.M | re.S).group(1)
    names = {n.strip().strip('"') for n in listed.split(",")}
    files = {p.stem for p in REPO.glob("numa_utils*.py")}
    assert files <= names, sorted(files - names)
