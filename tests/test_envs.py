# SPDX-License-Identifier: Apache-2.0
"""Tests for envs.py, the registry of numa_utils environment variables."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import envs as envs_mod  # the one line to change to test a copy under another name

REPO = Path(__file__).resolve().parent.parent
TABLE_DOC = REPO / "docs" / "environment.md"  # the table of variables
START = "<!-- envs-table:start -->"
END = "<!-- envs-table:end -->"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No test sees a NUMA_UTILS_*/TEST_* variable from the caller, or leaks a prefix."""
    for name in list(os.environ):
        if name.startswith(("NUMA_UTILS_", "LIGHTLLM_", "TEST_")):
            monkeypatch.delenv(name)
    old = envs_mod.set_prefix(envs_mod.DEFAULT_PREFIX)
    yield
    envs_mod.set_prefix(old)


# ---------------------------------------------------------------------------
# One parser per kind: good and bad values
# ---------------------------------------------------------------------------

BOOL_GOOD = [
    ("1", True),
    ("0", False),
    ("true", True),
    ("false", False),
    ("TRUE", True),
    ("False", False),
    ("yes", True),
    ("No", False),
    ("on", True),
    ("OFF", False),
    ("  yes\n", True),
    ("\t0 ", False),
]
BOOL_BAD = ["2", "-1", "y", "n", "t", "enable", "true1", "o n", "1.0", "none", "ja"]


@pytest.mark.parametrize(("text", "want"), BOOL_GOOD, ids=[repr(t) for t, _ in BOOL_GOOD])
def test_parse_bool_good(text, want):
    assert envs_mod.parse_bool(text) is want


@pytest.mark.parametrize("text", BOOL_BAD)
def test_parse_bool_bad(text):
    with pytest.raises(ValueError, match=re.escape(f"X_FLAG={text!r}")):
        envs_mod.parse_bool(text, "X_FLAG")


NODES_GOOD = [
    ("0", (0,)),
    ("0-1,4", (0, 1, 4)),
    (" 3 , 1-2 ", (1, 2, 3)),
    ("4,0-1,1", (0, 1, 4)),
    ("250-255,8,0", (0, 8, 250, 251, 252, 253, 254, 255)),
    ("5-5", (5,)),
    ("1023", (1023,)),
]
NODES_BAD = [
    "",
    " ",
    ",",
    "0,",
    ",1",
    "0,,1",
    "1-",
    "-1",
    "0 1",
    "0-1;2",
    "1024",
    "0-4000000000",
    "\u0661",
    "0;1",
]
# numactl's grammar where only the machine can say: kept as text for numa_utils
NODES_DEFERRED = [
    "all",
    "!0",
    "+1",
    "0x1",
    "010",
    "3-1",
    "netdev:eth0",
    "pci:3b:00.0",
    "0-1:2/4",
    "a",
    "0-x",
    "1.5",
]


@pytest.mark.parametrize(("text", "want"), NODES_GOOD, ids=[t for t, _ in NODES_GOOD])
def test_parse_nodelist_good(text, want):
    assert envs_mod.parse_nodelist(text) == want


@pytest.mark.parametrize("text", NODES_DEFERRED)
def test_parse_nodelist_defers_numactl_grammar(text):
    assert envs_mod.parse_nodelist(f" {text} ", "MY_NODES") == text


@pytest.mark.parametrize("text", NODES_BAD, ids=[repr(t) for t in NODES_BAD])
def test_parse_nodelist_bad(text):
    with pytest.raises(ValueError, match="^MY_NODES="):
        envs_mod.parse_nodelist(text, "MY_NODES")


# (suffix, raw value, expected typed value); every registered variable appears.
GOOD = [
    ("ENABLE_NUMA_INTERLEAVE", "1", True),
    ("ENABLE_NUMA_INTERLEAVE", "off", False),
    ("NUMA_STRICT", "Yes", True),
    ("NUMA_STRICT", "0", False),
    ("NUMA_NODES", "0-1,4", (0, 1, 4)),
    ("NUMA_PREFAULT_THREADS", "1", 1),
    ("NUMA_PREFAULT_THREADS", " 64 ", 64),
    ("NUMA_HUGEPAGES", "off", "off"),
    ("NUMA_HUGEPAGES", "2m", "2M"),
    ("NUMA_HUGEPAGES", "1G", "1G"),
    ("NUMA_HUGEPAGES", "THP", "thp"),
    ("NUMA_HUGEPAGES", "auto", "auto"),
    ("NUMA_BIND_POLICY", "exclusive", "exclusive"),
    ("NUMA_BIND_POLICY", "Core-Complex", "core-complex"),
    ("NUMA_BIND_POLICY", "none", "none"),
    ("NUMA_RESERVED_CORES", "0", 0),
    ("NUMA_RESERVED_CORES", "2", 2),
    ("NUMA_MEMORY_POLICY", "bind", "bind"),
    ("NUMA_MEMORY_POLICY", "INTERLEAVE", "interleave"),
    ("NUMA_MEMORY_POLICY", "none", "none"),
    ("NUMA_MEMORY_POLICY", "socket", "socket"),
    ("NUMA_MEMORY_POLICY", "Preferred", "preferred"),
    ("NUMA_MEMORY_POLICY", "local", "local"),
    ("NUMA_MEMORY_POLICY", "PREFER (MANY)", "prefer (many)"),
]
BAD = [
    ("ENABLE_NUMA_INTERLEAVE", "2"),
    ("NUMA_STRICT", "maybe"),
    ("NUMA_NODES", "0-"),
    ("NUMA_NODES", "0;1"),
    ("NUMA_PREFAULT_THREADS", "0"),
    ("NUMA_PREFAULT_THREADS", "-3"),
    ("NUMA_PREFAULT_THREADS", "four"),
    ("NUMA_PREFAULT_THREADS", "1.5"),
    ("NUMA_PREFAULT_THREADS", "1_000"),
    ("NUMA_HUGEPAGES", "4k"),
    ("NUMA_HUGEPAGES", "yes"),
    ("NUMA_BIND_POLICY", "numa"),
    ("NUMA_BIND_POLICY", "core_complex"),
    ("NUMA_RESERVED_CORES", "-1"),
    ("NUMA_RESERVED_CORES", "+1"),
    ("NUMA_MEMORY_POLICY", "preferable"),
    ("NUMA_MEMORY_POLICY", "prefer-manly"),
]


def test_tables_cover_every_variable():
    assert {s for s, _, _ in GOOD} == set(envs_mod.REGISTRY)
    assert {s for s, _ in BAD} == set(envs_mod.REGISTRY)


@pytest.mark.parametrize(("suffix", "raw", "want"), GOOD, ids=[f"{s}={r}" for s, r, _ in GOOD])
def test_get_good(monkeypatch, suffix, raw, want):
    monkeypatch.setenv("NUMA_UTILS_" + suffix, raw)
    assert envs_mod.get(suffix) == want
    assert envs_mod.effective()["NUMA_UTILS_" + suffix] == (want, "env")


@pytest.mark.parametrize(("suffix", "raw"), BAD, ids=[f"{s}={r}" for s, r in BAD])
def test_get_bad_names_variable_and_value(monkeypatch, suffix, raw):
    monkeypatch.setenv("NUMA_UTILS_" + suffix, raw)
    with pytest.raises(ValueError) as info:
        envs_mod.get(suffix)
    message = str(info.value)
    assert f"NUMA_UTILS_{suffix}" in message
    assert repr(raw) in message
    with pytest.raises(ValueError, match=f"NUMA_UTILS_{suffix}"):
        envs_mod.effective()


@pytest.mark.parametrize("suffix", sorted(envs_mod.REGISTRY))
@pytest.mark.parametrize("raw", [None, "", "   "], ids=["unset", "empty", "blank"])
def test_unset_or_empty_is_default(monkeypatch, suffix, raw):
    if raw is not None:
        monkeypatch.setenv("NUMA_UTILS_" + suffix, raw)
    var = envs_mod.REGISTRY[suffix]
    assert envs_mod.get(suffix) == var.default
    assert envs_mod.effective()["NUMA_UTILS_" + suffix] == (var.default, "default")


def test_defaults():
    assert envs_mod.enable_numa_interleave() is False
    assert envs_mod.numa_strict() is False
    assert envs_mod.numa_nodes() is None
    assert envs_mod.numa_prefault_threads() is None
    assert envs_mod.numa_hugepages() == "off"
    assert envs_mod.numa_bind_policy() == "none"
    assert envs_mod.numa_reserved_cores() == 0
    assert envs_mod.numa_memory_policy() == "prefer"


def test_typed_accessors(monkeypatch):
    values = {
        "ENABLE_NUMA_INTERLEAVE": "on",
        "NUMA_STRICT": "true",
        "NUMA_NODES": "2,0",
        "NUMA_PREFAULT_THREADS": "8",
        "NUMA_HUGEPAGES": "1g",
        "NUMA_BIND_POLICY": "socket",
        "NUMA_RESERVED_CORES": "1",
        "NUMA_MEMORY_POLICY": "bind",
    }
    for suffix, raw in values.items():
        monkeypatch.setenv("NUMA_UTILS_" + suffix, raw)
    assert envs_mod.enable_numa_interleave() is True
    assert envs_mod.numa_strict() is True
    assert envs_mod.numa_nodes() == (0, 2)
    assert envs_mod.numa_prefault_threads() == 8
    assert envs_mod.numa_hugepages() == "1G"
    assert envs_mod.numa_bind_policy() == "socket"
    assert envs_mod.numa_reserved_cores() == 1
    assert envs_mod.numa_memory_policy() == "bind"


def test_unknown_setting():
    with pytest.raises(KeyError, match="NO_SUCH_THING"):
        envs_mod.get("NO_SUCH_THING")


def test_suffix_is_case_insensitive(monkeypatch):
    monkeypatch.setenv("NUMA_UTILS_NUMA_STRICT", "1")
    assert envs_mod.get("numa_strict") is True


# ---------------------------------------------------------------------------
# Read at call time, prefixes
# ---------------------------------------------------------------------------


def test_read_at_call_time_not_import(monkeypatch):
    assert envs_mod.enable_numa_interleave() is False
    monkeypatch.setenv("NUMA_UTILS_ENABLE_NUMA_INTERLEAVE", "1")
    assert envs_mod.enable_numa_interleave() is True
    monkeypatch.setenv("NUMA_UTILS_ENABLE_NUMA_INTERLEAVE", "0")
    assert envs_mod.enable_numa_interleave() is False
    monkeypatch.delenv("NUMA_UTILS_ENABLE_NUMA_INTERLEAVE")
    assert envs_mod.enable_numa_interleave() is False


def test_set_prefix(monkeypatch):
    monkeypatch.setenv("LIGHTLLM_ENABLE_NUMA_INTERLEAVE", "1")
    monkeypatch.setenv("NUMA_UTILS_ENABLE_NUMA_INTERLEAVE", "0")
    assert envs_mod.enable_numa_interleave() is False
    assert envs_mod.set_prefix("LIGHTLLM_") == "NUMA_UTILS_"
    assert envs_mod.get_prefix() == "LIGHTLLM_"
    assert envs_mod.enable_numa_interleave() is True
    assert "LIGHTLLM_ENABLE_NUMA_INTERLEAVE" in envs_mod.effective()
    monkeypatch.setenv("LIGHTLLM_NUMA_STRICT", "bogus")
    with pytest.raises(ValueError, match="LIGHTLLM_NUMA_STRICT='bogus'"):
        envs_mod.numa_strict()


def test_prefix_per_call(monkeypatch):
    monkeypatch.setenv("TEST_NUMA_NODES", "1-2")
    assert envs_mod.numa_nodes() is None
    assert envs_mod.numa_nodes(prefix="TEST_") == (1, 2)
    assert envs_mod.get("NUMA_NODES", prefix="TEST_") == (1, 2)
    assert envs_mod.effective(prefix="TEST_")["TEST_NUMA_NODES"] == ((1, 2), "env")
    assert envs_mod.get_prefix() == "NUMA_UTILS_"  # a per-call prefix changes nothing


def test_empty_prefix(monkeypatch):
    monkeypatch.setenv("NUMA_STRICT", "1")
    assert envs_mod.numa_strict(prefix="") is True


def test_environ_argument():
    environ = {"NUMA_UTILS_NUMA_RESERVED_CORES": "3"}
    assert envs_mod.numa_reserved_cores(environ=environ) == 3
    assert envs_mod.numa_reserved_cores() == 0


@pytest.mark.parametrize("bad", ["1ABC_", "A-B_", "A B", "X.", None, 3])
def test_bad_prefix(bad):
    with pytest.raises(ValueError, match="prefix"):
        envs_mod.set_prefix(bad)
    assert envs_mod.get_prefix() == "NUMA_UTILS_"
    if bad is not None:  # prefix=None per call means "the module prefix"
        with pytest.raises(ValueError, match="prefix"):
            envs_mod.get("NUMA_STRICT", prefix=bad)


def test_effective_lists_every_variable_in_order():
    names = list(envs_mod.effective())
    assert names == ["NUMA_UTILS_" + s for s in envs_mod.REGISTRY]


def test_registry_is_read_only():
    with pytest.raises(TypeError):
        envs_mod.REGISTRY["X"] = None  # type: ignore[index]


def test_registry_entries_are_well_formed():
    for suffix, var in envs_mod.REGISTRY.items():
        assert suffix == var.suffix and re.fullmatch(r"[A-Z][A-Z0-9_]*", suffix)
        assert var.kind in ("bool", "int", "str", "nodes", "choice")
        assert var.doc and "\n" not in var.doc and "|" not in var.doc
        if var.kind == "choice":
            assert var.default in var.choices


# ---------------------------------------------------------------------------
# Importing reads nothing; the file works under another name
# ---------------------------------------------------------------------------


def _run(code, env_extra=None, cwd=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, check=False
    )


def test_import_reads_no_environment():
    # A malformed value must not break `import envs`, only the call that reads it.
    here = Path(envs_mod.__file__)
    code = (
        f"import {here.stem} as envs\n"
        "try:\n"
        "    envs.numa_strict()\n"
        "except ValueError as exc:\n"
        "    print('late:', exc)\n"
    )
    proc = _run(code, {"NUMA_UTILS_NUMA_STRICT": "garbage"}, cwd=str(here.parent))
    assert proc.returncode == 0, proc.stderr
    assert "late: NUMA_UTILS_NUMA_STRICT='garbage'" in proc.stdout


def test_works_inside_a_package(tmp_path):
    pkg = tmp_path / "lightllm" / "utils"
    pkg.mkdir(parents=True)
    (tmp_path / "lightllm" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "envs.py").write_text(Path(envs_mod.__file__).read_text())
    code = (
        "from lightllm.utils import envs\n"
        "import sys\n"
        "assert 'envs' not in sys.modules\n"
        "envs.set_prefix('LIGHTLLM_')\n"
        "print(envs.enable_numa_interleave(), envs.numa_nodes())\n"
    )
    proc = _run(
        code,
        {
            "LIGHTLLM_ENABLE_NUMA_INTERLEAVE": "yes",
            "LIGHTLLM_NUMA_NODES": "0-1",
            "PYTHONPATH": str(tmp_path),
        },
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True (0, 1)"


# ---------------------------------------------------------------------------
# CLI and the table in docs/environment.md
# ---------------------------------------------------------------------------


def test_cli_markdown(capsys):
    assert envs_mod.main(["--markdown"]) == 0
    assert capsys.readouterr().out == envs_mod.markdown_table()


def test_cli_effective_and_error(monkeypatch, capsys):
    monkeypatch.setenv("TEST_NUMA_NODES", "0,2")
    assert envs_mod.main(["--prefix", "TEST_"]) == 0
    out = capsys.readouterr().out
    assert "TEST_NUMA_NODES=0,2  (env)" in out
    assert "TEST_NUMA_STRICT=False  (default)" in out
    monkeypatch.setenv("TEST_NUMA_STRICT", "perhaps")
    assert envs_mod.main(["--prefix", "TEST_"]) == 2
    assert "TEST_NUMA_STRICT='perhaps'" in capsys.readouterr().err


def test_markdown_table_shape():
    table = envs_mod.markdown_table()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == len(envs_mod.REGISTRY)
    assert all(row.count("|") == 5 for row in rows)
    assert "`NUMA_UTILS_ENABLE_NUMA_INTERLEAVE`" in table
    assert "`LIGHTLLM_NUMA_STRICT`" in envs_mod.markdown_table(prefix="LIGHTLLM_")


def test_docs_table_is_current():
    text = TABLE_DOC.read_text(encoding="utf-8")
    assert START in text and END in text, f"{TABLE_DOC.name} lost its {START} ... {END} markers"
    current = text.split(START, 1)[1].split(END, 1)[0].strip()
    assert current == envs_mod.markdown_table().strip(), (
        "docs/environment.md's table of variables is stale: replace the text between the "
        "markers with the output of `python envs.py --markdown`"
    )


def test_registry_is_the_table_numa_utils_reads():
    """envs.py (what engines merge into their registry) and numa_utils' own reader
    name the same variables with the same defaults, kinds and choices."""
    import numa_utils as nu

    assert list(envs_mod.REGISTRY) == list(nu._ENV_VARS)
    for suffix, var in envs_mod.REGISTRY.items():
        default, kind = nu._ENV_VARS[suffix]
        assert default == var.default, suffix
        if var.kind == "choice":
            assert tuple(kind) == var.choices, suffix
        elif var.kind == "int":
            assert tuple(kind) == ("int", var.minimum), suffix
        else:
            assert kind == var.kind, suffix


@pytest.mark.parametrize(("suffix", "raw", "want"), GOOD, ids=[f"{s}={r}" for s, r, _ in GOOD])
def test_numa_utils_reads_what_envs_accepts(monkeypatch, suffix, raw, want):
    import numa_utils as nu

    monkeypatch.setenv("NUMA_UTILS_" + suffix, raw)
    got = nu._env(suffix)
    if suffix == "NUMA_NODES":  # resolved on the machine by parse_nodestring
        assert got == raw.strip()
    else:
        assert got == want


@pytest.mark.parametrize(("suffix", "raw"), BAD, ids=[f"{s}={r}" for s, r in BAD])
def test_numa_utils_refuses_what_envs_refuses(monkeypatch, suffix, raw):
    import numa_utils as nu

    if suffix == "NUMA_NODES":
        pytest.skip("node lists are checked against the machine by parse_nodestring")
    monkeypatch.setenv("NUMA_UTILS_" + suffix, raw)
    with pytest.raises(ValueError, match=f"NUMA_UTILS_{suffix}"):
        nu._env(suffix)


@pytest.mark.parametrize(
    "name,value,refusal",
    [
        ("NUMA_UTILS_NUMA_NODES", "garbage", "unparseable node description `garbage'"),
        ("NUMA_UTILS_NUMA_NODES", "netdev:eth0", "device form `netdev:' is refused"),
        ("NUMA_UTILS_NUMA_NODES", "!0x", "trailing characters"),
        ("NUMA_UTILS_NUMA_STRICT", "maybe", "expected a boolean"),
        ("NUMA_UTILS_NUMA_PREFAULT_THREADS", "0", "must be >= 1"),
    ],
)
def test_status_warns_about_each_invalid_variable(name, value, refusal, monkeypatch):
    """status showed NUMA_UTILS_NUMA_NODES=garbage with no warning while
    SharedRegion.create refused it; each invalid variable is a warning worded as
    the call that reads it refuses it, and the others are still listed."""
    from conftest import cli, nur, sim

    monkeypatch.setenv(name, value)
    monkeypatch.setenv("NUMA_UTILS_NUMA_HUGEPAGES", "sideways")  # a second one
    rep = cli.status_report(backend=sim("dual-socket-8gpu"))
    mine = [w for w in rep["warnings"] if w.startswith(f"configuration: {name}=")]
    assert len(mine) == 1 and refusal in mine[0], rep["warnings"]
    assert any(
        w.startswith("configuration: NUMA_UTILS_NUMA_HUGEPAGES=") for w in rep["warnings"]
    ), rep["warnings"]
    assert rep["config"][name] == {"value": value, "source": "env", "error": mine[0][15:]}
    assert rep["config"]["NUMA_UTILS_ENABLE_NUMA_INTERLEAVE"] == {
        "value": False,
        "source": "default",
    }
    if name.endswith("NUMA_NODES"):  # the same words as the call that refuses it
        with pytest.raises(ValueError, match=re.escape(refusal)):
            nur.SharedRegion.create(
                "kv", 1 << 20, policy="interleave", backend=sim("dual-socket-8gpu")
            )


# ---------------------------------------------------------------------------
# 26.19: envs.py and numa_utils accept and refuse the same values
# ---------------------------------------------------------------------------

TRICKY = [
    "1",
    "01",
    "-0",
    "-1",
    "+1",
    "1_000",
    " 5 ",
    "\t5\n",
    "1.5",
    "1e3",
    "0x10",
    "\u0661",  # ARABIC-INDIC DIGIT ONE: isdigit(), not ASCII
    "\u22121",  # MINUS SIGN
    "9" * 18,
    "1" * 19,
    "9" * 25,
    "-" + "9" * 19,
    "true",
    "ON",
    " Off ",
    "yes\u00a0",
    "\uff2f\uff2e",  # FULLWIDTH ON
    "nan",
    "2M",
    "2m",
    "1g",
    "THP",
    "auto",
    "none",
    "core-complex",
    "core_complex",
    "Interleave",
    "prefer",
    "Prefer (Many)",
    "PREFERRED_MANY",
    "preferred many",
    "socket",
    "weighted interleave",
    "-" + "9" * 18,
]


def _outcome(read):
    try:
        return ("value", read())
    except ValueError:
        return ("refused", None)


@pytest.mark.parametrize("suffix", [s for s in envs_mod.REGISTRY if s != "NUMA_NODES"])
def test_envs_and_numa_utils_agree_on_tricky_values(monkeypatch, suffix):
    """For every variable but NUMA_NODES (numa_utils resolves a node list against the
    machine), each tricky text is accepted by both, as the same value, or refused by
    both: envs.py took a 19-digit NUMA_PREFAULT_THREADS numa_utils refused."""
    import numa_utils as nu

    differ = []
    for raw in TRICKY:
        monkeypatch.setenv("NUMA_UTILS_" + suffix, raw)
        mine, theirs = _outcome(lambda: envs_mod.get(suffix)), _outcome(lambda: nu._env(suffix))
        if mine != theirs:
            differ.append((raw, mine, theirs))
    assert not differ


LONG_BAD = "\x1b]0;owned\x07\x1b[2J" + "z" * 120_000


@pytest.mark.parametrize("suffix", sorted(envs_mod.REGISTRY))
def test_env_errors_are_cut_and_escaped(monkeypatch, suffix):
    """A 120 KB malformed value with ESC/BEL was repeated whole, and raw, in the error
    (numa_utils' NUMA_NODES); every variable's error, in both, shows it escaped and
    cut."""
    import numa_utils as nu

    monkeypatch.setenv("NUMA_UTILS_" + suffix, LONG_BAD)
    reads = [lambda: envs_mod.get(suffix), lambda: nu._env(suffix)]
    if suffix == "NUMA_NODES":
        reads[1] = lambda: nu._env_nodes(None)
    for read in reads:
        with pytest.raises(ValueError) as info:
            read()
        message = str(info.value)
        assert f"NUMA_UTILS_{suffix}=" in message
        assert len(message) < 400 and "\x1b" not in message and "\x07" not in message


def test_status_text_shows_an_invalid_value_escaped_and_cut(monkeypatch):
    from conftest import cli, sim

    monkeypatch.setenv("NUMA_UTILS_NUMA_STRICT", LONG_BAD)
    text = cli._render_status(cli.status_report(backend=sim("dual-socket-8gpu")))
    line = next(x for x in text.splitlines() if "NUMA_UTILS_NUMA_STRICT" in x)
    assert "(invalid)" in line and len(line) < 300
    assert "\x1b" not in text and "\x07" not in text


def test_memory_policy_socket_is_taken_where_memory_socket_is(monkeypatch):
    """memory="socket" (prefer-many over the package's nodes) was refused as
    NUMA_MEMORY_POLICY=socket; the variable now gives what the argument gives."""
    from conftest import nu, sim

    def planned(**kw):
        plans = nu.gpu_plans("node", backend=sim("dual-socket-8gpu"), **kw)
        return [(p.memory, p.memory_nodes) for p in plans]

    def bound(**kw):
        res = nu.bind_to_node(0, cpus=False, backend=sim("dual-socket-8gpu"), **kw).memory
        return res.mode, res.nodes, res.applied

    by_argument = (planned(memory="socket"), bound(memory="socket"))
    assert by_argument[1][0] == "preferred_many"
    monkeypatch.setenv("NUMA_UTILS_NUMA_MEMORY_POLICY", "socket")
    assert envs_mod.numa_memory_policy() == "socket"
    assert (planned(), bound()) == by_argument


@pytest.mark.parametrize("prefix", ["", "LIGHTLLM_", "_x9_"])
def test_configure_accepts_a_variable_name_prefix(prefix):
    import numa_utils as nu

    old = nu.configure(env_prefix=prefix)
    try:
        assert nu.configure(env_prefix=prefix) == prefix
    finally:
        nu.configure(env_prefix=old)


@pytest.mark.parametrize(
    "prefix", ["9X_", "A-B_", "A B", "\u00c9T\u00c9_", "X\u0661_", "X_\n", None, 5]
)
def test_configure_refuses_what_is_no_ascii_variable_name(prefix):
    import numa_utils as nu

    old = nu.configure(env_prefix="NUMA_UTILS_")
    try:
        with pytest.raises(ValueError, match="invalid environment variable prefix"):
            nu.configure(env_prefix=prefix)
        assert nu.configure(env_prefix="NUMA_UTILS_") == "NUMA_UTILS_"  # kept
    finally:
        nu.configure(env_prefix=old)


# ---------------------------------------------------------------------------
# A variable set but not read is named once, with the known name closest to it
# ---------------------------------------------------------------------------

IGNORED = [
    # (prefix in effect, the name set, the name numa_utils reads that it resembles)
    ("NUMA_UTILS_", "NUMA_UTILS_INTERLAVE", "NUMA_UTILS_ENABLE_NUMA_INTERLEAVE"),
    ("NUMA_UTILS_", "NUMA_UTILS_NUMA_NODE", "NUMA_UTILS_NUMA_NODES"),
    ("NUMA_UTILS_", "NUMA_UTILS_STRICT", "NUMA_UTILS_NUMA_STRICT"),
    ("NUMA_UTILS_", "NUMA_NODES", "NUMA_UTILS_NUMA_NODES"),
    ("NUMA_UTILS_", "ENABLE_NUMA_INTERLEAVE", "NUMA_UTILS_ENABLE_NUMA_INTERLEAVE"),
    ("LIGHTLLM_", "LIGHTLLM_NUMA_STRCT", "LIGHTLLM_NUMA_STRICT"),
    ("LIGHTLLM_", "NUMA_UTILS_NUMA_NODES", "LIGHTLLM_NUMA_NODES"),
]
# Names that are someone else's: the engine's own under its prefix, the test and
# command-line variables under ours (the numactl front end reads NUMACTL_VERSION).
NOT_OURS = [
    ("NUMA_UTILS_", "NUMA_UTILS_VM_CACHE"),
    ("NUMA_UTILS_", "NUMA_UTILS_NUMACTL_VERSION"),
    ("NUMA_UTILS_", "NUMA_UTILS_TEST_IN_PRIVATE_SHM"),
    ("LIGHTLLM_", "LIGHTLLM_CPU_OMP_THREADS_BIND"),
    ("LIGHTLLM_", "LIGHTLLM_USE_V1"),
    ("", "NUMA_NODES_EXTRA"),
    ("", "NUMA_NODES"),  # ours, with an empty prefix
]


@pytest.fixture
def prefix_of():
    import numa_utils as nu

    old = nu.configure(env_prefix="NUMA_UTILS_")
    yield lambda prefix: nu.configure(env_prefix=prefix)
    nu.configure(env_prefix=old)


def _ignored_warnings(caplog, name):
    return [r.getMessage() for r in caplog.records if f" {name} " in r.getMessage()]


@pytest.mark.parametrize("prefix, name, closest", IGNORED)
def test_a_variable_set_but_not_read_is_named_once_with_the_closest(
    prefix, name, closest, monkeypatch, caplog, prefix_of
):
    import logging

    from conftest import cli, nu, sim

    prefix_of(prefix)
    monkeypatch.setenv(name, "1")
    b = sim("qemu-x86_64-two-node")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            nu.set_thread_policy("local", backend=b)
    said = _ignored_warnings(caplog, name)
    assert len(said) == 1 and said[0].endswith(f"did you mean {closest}?"), said
    rep = nu.status_report(backend=b)
    assert rep["config_ignored"] == {name: closest}
    text = cli._render_status(rep)
    assert f"  ignored: {name} (not read; did you mean {closest}?)" in text, text


@pytest.mark.parametrize("prefix, name", NOT_OURS)
def test_other_programs_variables_are_not_named(prefix, name, monkeypatch, caplog, prefix_of):
    import logging

    from conftest import nu, sim

    prefix_of(prefix)
    monkeypatch.setenv(name, "1")
    b = sim("qemu-x86_64-two-node")
    with caplog.at_level(logging.WARNING):
        nu.set_thread_policy("local", backend=b)
    assert not _ignored_warnings(caplog, name)
    assert name not in nu.status_report(backend=b)["config_ignored"]


def test_status_names_variables_as_they_are_read(prefix_of):
    """The status text's advice names NUMA_NODES with the prefix in effect: the bare
    name it printed is one numa_utils ignores."""
    from conftest import cli, sim

    rep = cli.status_report(backend=sim("qemu-x86_64-hmat-tiers"))
    text = cli._render_status(rep)
    assert "set NUMA_UTILS_NUMA_NODES (e.g. NUMA_UTILS_NUMA_NODES=0-2)" in text, text
    assert not re.search(r"(?<![A-Z_])NUMA_NODES", text), text
