# SPDX-License-Identifier: Apache-2.0
"""Every code block in README.md runs here, so the guide cannot drift from the code.

Rules (for whoever adds a README section):

- Each fenced block names its language.  ```python and ```sh blocks run; ```text
  (and json, toml, ini, yaml) are not code.  A block that must not run is preceded
  by ``<!-- not run: why -->`` on the line(s) just above its fence.
- The blocks of one ``## `` or ``### `` section run in order as one test, on one
  simulated machine: ``SimulatedBackend`` over ``fake_sysfs/dual-socket-8gpu.txt``
  (2 sockets, 8 GPUs), or the fixture named by ``<!-- fixture: NAME -->`` above any
  block of the section.  Blocks call the API as an engine would, without
  ``backend=``: that machine is the default.
- Each section runs as an engine that vendored numa_utils: its own ``python -I``
  process (tests/readme_runner.py) whose only copies are ``enginepkg/`` files, and
  ``import numa_utils as nu`` in a block imports ``enginepkg.numa_utils``
  (``myengine._vendor.numa_utils``, the vendoring example's name, is the same copy).
  Under ``## API guide`` only ``numa_utils.py`` is there (``lib``); elsewhere
  ``numa_utils_sim.py`` and ``numa_utils_cli.py`` too (``cli``).  A block that needs
  more says so on the line above it: ``<!-- vendored: lib+sim -->`` (the simulator
  beside the library) or ``<!-- vendored: cli -->``; from that block on, the
  section has those files.  Top-level ``numa_utils*`` modules cannot be imported.
- ``<!-- process: NAME -->`` runs a block as another process on the same machine
  (own variables, own simulated process: shared memory is shared, ``remove=True``
  and detaches count as in the kernel).  Unmarked blocks are process "main".
  ``<!-- process: NAME (dies) -->``: that process is killed after the block.
- A section must leave no shared memory region behind, and no region ever touches
  this host's /dev/shm or SysV IPC (they live in the simulated kernel).
- ```sh blocks run with bash -e in a scratch folder that links to every top-level
  entry of the repository (files they write stay there); ``python3`` is the
  interpreter running the tests.  A block that installs into ``/usr/local`` (as a
  reader would) runs with ``/usr/local`` redirected into the test's temporary
  folder, whose ``bin/`` comes first on PATH; a block that writes any other absolute
  path fails: the suite never writes outside its temporary folders.
- A block that needs numpy or torch where it is not installed is skipped (the
  section still runs, then reports the skip).
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, fixture_root

README = REPO / "README.md"
RUN = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
TEXT = {"text", "json", "toml", "ini", "yaml"}
RUNNER = REPO / "tests" / "readme_runner.py"
DEFAULT_FIXTURE = "dual-socket-8gpu"
MARK = re.compile(r"^\s*<!--\s*(not run|process|fixture|vendored)\s*:\s*(.*?)\s*-->\s*$")


def _blocks(text):
    """(section, line, lang, code, marks) for every fenced block."""
    out, section, part, marks = [], "(top)", "(top)", {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = part = line[3:].strip()
        elif line.startswith("### "):
            section = f"{part} / {line[4:].strip()}"
        m = MARK.match(line)
        if m:
            marks[m.group(1)] = m.group(2)
        elif line.startswith("```"):
            lang = line[3:].strip()
            start = i + 1
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                i += 1
            out.append((section, start, lang, "\n".join(lines[start:i]) + "\n", marks))
            marks = {}
        elif line.strip():
            marks = {}
        i += 1
    return out


BLOCKS = _blocks(README.read_text()) if README.exists() else []
SECTIONS = []
for _b in BLOCKS:
    if RUN.get(_b[2]) and "not run" not in _b[4] and _b[0] not in SECTIONS:
        SECTIONS.append(_b[0])


def test_every_block_is_classified():
    assert BLOCKS, "no code blocks found in README.md"
    for section, line, lang, _code, marks in BLOCKS:
        assert lang in RUN or lang in TEXT, (
            f"README.md:{line} ({section}): name the block's language (python, sh, text)"
        )
        if "not run" in marks:
            assert marks["not run"], f"README.md:{line}: say why it is not run"
    assert SECTIONS, "no runnable block in README.md"


@pytest.fixture
def scratch(tmp_path):
    """A folder that looks like the repository (links to its entries) and a bin/ whose
    python3 is this interpreter."""
    work = tmp_path / "work"
    work.mkdir()
    for entry in os.listdir(REPO):
        if entry not in (".git", ".tox") and not entry.startswith(".pytest"):
            os.symlink(REPO / entry, work / entry)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python3", "python"):
        os.symlink(sys.executable, bin_dir / name)
    return work, bin_dir


PREFIX = "/usr/local"
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


def _redirected(code, prefix):
    """``code`` with /usr/local moved under ``prefix``; fails on any other absolute
    path the block would write."""
    code = re.sub(re.escape(PREFIX) + r"(?![\w.-])", str(prefix), code)
    outside = [p for p in _writes(code) if not p.startswith(str(prefix) + "/")]
    assert not outside, (
        f"sh block writes outside the scratch folder: {outside}; "
        f"install under {PREFIX} (redirected in the test) or mark it "
        "<!-- not run: why -->"
    )
    return code


def _run_sh(code, line, work, bin_dir):
    prefix = work.parent / "usr-local"
    code = _redirected(code, prefix)
    env = dict(
        os.environ,
        PATH=os.pathsep.join([str(prefix / "bin"), str(bin_dir), os.environ.get("PATH", "")]),
    )
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        ["bash", "-e", "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, (
        f"README.md:{line}: sh block failed ({out.returncode}):\n{code}\n{out.stderr[-3000:]}"
    )


MODES = ("lib", "lib+sim", "cli")
LIBRARY_SECTION = "API guide"  # what numa_utils.py alone must serve


def _mode(section, marks):
    """The files a block runs with: its ``vendored`` mark, else its section's."""
    mode = marks.get("vendored") or ("lib" if section.split(" / ")[0] == LIBRARY_SECTION else "cli")
    assert mode in MODES, f"<!-- vendored: {mode} -->: one of {', '.join(MODES)}"
    return mode


def _section_spec(section, work, bin_dir, tmp_path):
    """The runner's input for ``section``: its blocks in order, each with its mode,
    sh blocks already redirected."""
    blocks = [b for b in BLOCKS if b[0] == section and RUN.get(b[2]) and "not run" not in b[4]]
    fixture = next((b[4]["fixture"] for b in blocks if "fixture" in b[4]), DEFAULT_FIXTURE)
    prefix = work.parent / "usr-local"
    env = dict(
        os.environ,
        PATH=os.pathsep.join([str(prefix / "bin"), str(bin_dir), os.environ.get("PATH", "")]),
    )
    env.pop("PYTHONPATH", None)
    out, last = [], 0
    for _section, line, lang, code, marks in blocks:
        mode = _mode(section, marks)
        assert MODES.index(mode) >= last, (
            f"README.md:{line}: a {mode} block after a {MODES[last]} one in {section!r}"
        )
        last = MODES.index(mode)
        name = marks.get("process", "main")
        dies = name.endswith(" (dies)")
        if RUN[lang] == "sh":
            code = _redirected(code, prefix)
        out.append(
            {
                "line": line,
                "lang": RUN[lang],
                "code": code,
                "mode": mode,
                "process": name[: -len(" (dies)")] if dies else name,
                "dies": dies,
            }
        )
    vendor = tmp_path / "vendor"
    (vendor / "enginepkg").mkdir(parents=True)
    (vendor / "enginepkg" / "__init__.py").write_text("")
    shutil.copyfile(REPO / "numa_utils.py", vendor / "enginepkg" / "numa_utils.py")
    return {
        "vendor": str(vendor),
        "repo": str(REPO),
        "fixture": fixture_root(fixture),
        "blocks": out,
        "env": env,
        "result": str(tmp_path / "result.json"),
    }


@pytest.mark.parametrize("section", SECTIONS)
def test_readme_section(section, scratch, tmp_path):
    work, bin_dir = scratch
    spec = _section_spec(section, work, bin_dir, tmp_path)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = dict(spec["env"], PATH=os.environ.get("PATH", ""))
    p = subprocess.run(
        [sys.executable, "-I", str(RUNNER), str(tmp_path / "spec.json")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, f"section {section!r}:\n{p.stdout[-2000:]}{p.stderr[-6000:]}"
    result = json.loads((tmp_path / "result.json").read_text())
    want = {"numa_utils.py"} | {
        f
        for b in spec["blocks"]
        for f in {
            "lib": (),
            "lib+sim": ("numa_utils_sim.py",),
            "cli": ("numa_utils_sim.py", "numa_utils_cli.py"),
        }[b["mode"]]
    }
    assert set(result["vendored"]) == want
    if result["skipped"]:
        pytest.skip("; ".join(result["skipped"]))


def test_library_sections_run_with_numa_utils_alone():
    """The API guide runs on numa_utils.py alone, the simulator's section with
    numa_utils_sim.py beside it, and only marked blocks need the CLI."""
    modes = {}
    for section, _line, lang, _code, marks in BLOCKS:
        if RUN.get(lang) and "not run" not in marks and section.split(" / ")[0] == LIBRARY_SECTION:
            modes.setdefault(_mode(section, marks), []).append(section)
    assert modes.get("lib"), "no API guide block runs on numa_utils.py alone"
    assert any("machine you do not have" in s for s in modes.get("lib+sim", [])), modes
    assert len(modes.get("cli", [])) <= 1, modes


def test_runner_refuses_top_level_copies(tmp_path):
    """A lib section cannot reach the repository's modules: the runner's vendored
    copy is the only numa_utils there is."""
    spec = {
        "vendor": str(tmp_path / "vendor"),
        "repo": str(REPO),
        "fixture": fixture_root(DEFAULT_FIXTURE),
        "env": dict(os.environ),
        "result": str(tmp_path / "result.json"),
        "blocks": [
            {
                "line": 1,
                "lang": "python",
                "mode": "lib",
                "process": "main",
                "dies": False,
                "code": "import numa_utils_sim\n",
            }
        ],
    }
    (tmp_path / "vendor" / "enginepkg").mkdir(parents=True)
    (tmp_path / "vendor" / "enginepkg" / "__init__.py").write_text("")
    shutil.copyfile(REPO / "numa_utils.py", tmp_path / "vendor/enginepkg/numa_utils.py")
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    p = subprocess.run(
        [sys.executable, "-I", str(RUNNER), str(tmp_path / "spec.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0
    assert "No module named 'numa_utils_sim' (only enginepkg's copy" in p.stderr


@pytest.mark.parametrize(
    "code,want",
    [
        ("mkdir -p /usr/local/bin   # or any directory\n", ["/usr/local/bin"]),
        ("printf 'x > /etc/no' > /usr/local/bin/numactl\n", ["/usr/local/bin/numactl"]),
        ("echo hi >>/etc/motd\ncp a /opt/b\n", ["/etc/motd", "/opt/b"]),
        ("chmod +x /usr/local/bin/numactl\nls /usr/bin >/dev/null\n", ["/usr/local/bin/numactl"]),
        ("cp numa_utils.py myengine/utils/\n", []),
    ],
)
def test_writes_finds_the_paths_a_block_writes(code, want):
    assert _writes(code) == want


def test_blocks_writing_outside_scratch_fail(tmp_path):
    with pytest.raises(AssertionError, match=r"writes outside the scratch folder: \['/etc/x'\]"):
        _redirected("mkdir -p /usr/local/bin\necho > /etc/x\n", tmp_path)
    assert _redirected("cp a /usr/local/bin/b\n", tmp_path) == f"cp a {tmp_path}/bin/b\n"


def test_numactl_shim_block_installs_into_scratch(scratch):
    """The README's shim block, as a reader runs it, writes /usr/local/bin/numactl; in
    the suite it lands in the scratch folder and is the numactl the block runs."""
    work, bin_dir = scratch
    (block,) = [b for b in BLOCKS if "/usr/local/bin/numactl" in b[3]]
    before = os.path.lexists("/usr/local/bin/numactl") and os.lstat("/usr/local/bin/numactl")
    _run_sh(block[3] + "command -v numactl > where\n", block[1], work, bin_dir)
    shim = work.parent / "usr-local" / "bin" / "numactl"
    assert "numa_utils numactl" in shim.read_text()
    assert (work / "where").read_text().strip() == str(shim)
    after = os.path.lexists("/usr/local/bin/numactl") and os.lstat("/usr/local/bin/numactl")
    assert before == after
