# SPDX-License-Identifier: Apache-2.0
"""Registry of the environment variables that configure numa_utils.

Upstream: the numa_utils project (envs.py, next to numa_utils.py).  numa_utils.py
reads the same variables itself (numa_utils._ENV_VARS, tests/test_envs.py keeps the
two equal) and never imports this module: it is for an engine's own registry.

Nothing is read at import: every accessor reads ``os.environ`` when called, so a
value set after import (or by a test's monkeypatch) is seen.  Engines rename the
variables by changing the prefix once at start-up::

    from lightllm.utils import envs
    envs.set_prefix("LIGHTLLM_")          # LIGHTLLM_ENABLE_NUMA_INTERLEAVE=1
    if envs.enable_numa_interleave():
        ...
    envs.get("NUMA_NODES", prefix="VLLM_")  # one-off lookup under another prefix
    envs.effective()                        # {"LIGHTLLM_NUMA_STRICT": (False, "default"), ...}

``python envs.py --markdown`` prints the table of docs/environment.md; ``python envs.py`` prints
the effective configuration of this shell.

The prefix is state of this module object.  Several vendored copies loaded in one
process each have their own prefix; numa_utils.py has its own, set with
``numa_utils.configure(env_prefix="LIGHTLLM_")``.
"""

from __future__ import annotations

import os
import re
import sys
from types import MappingProxyType
from typing import NamedTuple

__version__ = "0.1.0"

__all__ = [
    # registry
    "EnvVar",
    "REGISTRY",
    "DEFAULT_PREFIX",
    "NUMA_UTILS_ENVS_API",
    # prefix
    "get_prefix",
    "set_prefix",
    # generic access
    "get",
    "effective",
    "markdown_table",
    # pure parsers
    "parse_bool",
    "parse_nodelist",
    # typed accessors
    "enable_numa_interleave",
    "numa_strict",
    "numa_nodes",
    "numa_prefault_threads",
    "numa_hugepages",
    "numa_bind_policy",
    "numa_reserved_cores",
    "numa_memory_policy",
    # CLI
    "main",
]

# Tells a caller that a module it found under the name "envs" is this registry and
# not some unrelated envs.py that happens to be on sys.path.  Bump on breaking
# changes to the functions above.
NUMA_UTILS_ENVS_API = 1

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing-only imports cost nothing at run time
    from collections.abc import Mapping
    from typing import Any

DEFAULT_PREFIX = "NUMA_UTILS_"

# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------


class EnvVar(NamedTuple):
    """One variable: the name after the prefix, its kind, default and a one-line doc."""

    suffix: str
    kind: str  # "bool" | "int" | "str" | "nodes" | "choice"
    default: object
    doc: str
    choices: tuple[str, ...] = ()  # canonical spellings, for kind "choice"
    minimum: int | None = None  # smallest accepted value, for kind "int"


# Order here is the order of the table in docs/environment.md and of `status`.
_VARS = (
    EnvVar(
        "ENABLE_NUMA_INTERLEAVE",
        "bool",
        False,
        "Interleave shared regions (KV cache, shared weights) page by page across "
        "the nodes in NUMA_NODES.",
    ),
    EnvVar(
        "NUMA_STRICT",
        "bool",
        False,
        "Raise instead of falling back when a NUMA policy or binding cannot be applied.",
    ),
    EnvVar(
        "NUMA_NODES",
        "nodes",
        None,
        "Memory nodes to use, in numactl's node-list grammar (`0-1,4`, `all`, `!0`, "
        "`+0-1`; not its device forms such as `netdev:eth0` or `ip:HOST`, which "
        "are refused); unset means default_memory_nodes(): the allowed "
        "nodes of the CPUs' DRAM tier, without GPU memory, CXL or other slower "
        "memory (`all` takes every allowed memory node).",
    ),
    EnvVar(
        "NUMA_PREFAULT_THREADS",
        "int",
        None,
        "Threads that prefault interleaved regions; unset means one per allowed CPU.",
        minimum=1,
    ),
    EnvVar(
        "NUMA_HUGEPAGES",
        "choice",
        "off",
        "Page size for shared regions: `off` (base pages), `thp` (madvise "
        "MADV_HUGEPAGE), `2M`/`1G` (hugetlb pages of that size), `auto` (hugetlb "
        "if reserved on every target node, else THP).",
        choices=("off", "thp", "2M", "1G", "auto"),
    ),
    EnvVar(
        "NUMA_BIND_POLICY",
        "choice",
        "none",
        "How a GPU worker picks its CPUs: `none` (leave affinity alone), `node`, "
        "`socket`, `exclusive` (disjoint physical cores per GPU), `core-complex` "
        "(CPUs sharing the last-level cache).",
        choices=("none", "node", "socket", "exclusive", "core-complex"),
    ),
    EnvVar(
        "NUMA_RESERVED_CORES",
        "int",
        0,
        "Physical cores per node left out of CPU plans for the OS and interrupts.",
        minimum=0,
    ),
    EnvVar(
        "NUMA_MEMORY_POLICY",
        "choice",
        "prefer",
        "Memory policy applied with CPU binding: `prefer`, `bind`, `interleave`, "
        "`weighted-interleave`, `local`, `socket` (prefer-many over the package's "
        "nodes) or `none` (leave the policy alone); any mode word a result reports "
        "is taken too (`preferred`, `prefer (many)`, ...).",
        # numa_utils.MEMORY_WORDS, in its order (tests/test_envs.py keeps them equal).
        choices=(
            "socket",
            "default",
            "none",
            "first-touch",
            "prefer",
            "preferred",
            "bind",
            "membind",
            "interleave",
            "local",
            "prefer-many",
            "prefer (many)",
            "preferred_many",
            "preferred-many",
            "weighted-interleave",
            "weighted interleave",
            "weighted_interleave",
        ),
    ),
)

REGISTRY = MappingProxyType({v.suffix: v for v in _VARS})

# ---------------------------------------------------------------------------
# Prefix
# ---------------------------------------------------------------------------

_PREFIX_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_prefix = DEFAULT_PREFIX


def get_prefix() -> str:
    """The prefix in use, e.g. ``NUMA_UTILS_``."""
    return _prefix


def set_prefix(prefix: str) -> str:
    """Use ``prefix`` for every later lookup; returns the previous prefix.

    The empty string is allowed (plain ``NUMA_STRICT``).  A missing trailing
    underscore is not added: ``set_prefix("LIGHTLLM_")`` is what you want.
    """
    global _prefix
    _check_prefix(prefix)
    old, _prefix = _prefix, prefix
    return old


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or (prefix and not _PREFIX_RE.match(prefix)):
        raise ValueError(f"invalid environment variable prefix {prefix!r}")
    return prefix


# ---------------------------------------------------------------------------
# Pure parsers (no I/O)
# ---------------------------------------------------------------------------

_TRUE = frozenset(("1", "true", "yes", "on"))
_FALSE = frozenset(("0", "false", "no", "off"))

# Linux allows at most 1 << NODES_SHIFT nodes and NODES_SHIFT is at most 10
# (arch/x86/Kconfig, arch/arm64/Kconfig); a larger id is a typo, and refusing it
# keeps "0-4000000000" from building a huge set.
_MAX_NODE = 1023


def _shown(text: str) -> str:
    """``text`` as an error message shows it: repr() (control characters escaped), cut
    to 80 characters (a 120 KB value is not repeated whole); numa_utils' _short."""
    if len(text) <= 80:
        return repr(text)
    return repr(text[:80]) + f"... ({len(text)} chars)"


# The most digits an integer variable takes, as in numa_utils._env: a longer number is
# a typo, never a thread or core count.
_MAX_DIGITS = 18


def parse_bool(text: str, name: str = "value") -> bool:
    """The one boolean parser: 1/0, true/false, yes/no, on/off, any case.

    ``name`` is the variable name used in the error message.
    """
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"{name}={_shown(text)}: expected a boolean (1/0, true/false, yes/no, on/off)")


# What only the machine can resolve in numactl's node-list grammar: all, !, +, hex and
# octal numbers, reversed ranges, device forms (netdev:eth0, pci:3b:00.0, ...).
_NUMACTL_SPEC = re.compile(r"[!+]?[0-9A-Za-z_:.,+\-/ ]*[0-9A-Za-z]")


def parse_nodelist(text: str, name: str = "value") -> tuple[int, ...] | str:
    """Parse a node list (``0-1,4``) into sorted unique ids.

    A list in numactl's grammar that needs the machine (``all``, ``!0``, ``+1``,
    ``0x2``, ``010``, ``netdev:eth0``) is returned as the stripped text: numa_utils
    resolves it with ``parse_nodestring`` (this file stays standalone).  Rejects
    empty items, signs, strides and ids above 1023 with a ValueError naming ``name``.
    """
    nodes: set[int] = set()
    stripped = text.strip()
    if not stripped:
        raise ValueError(f"{name}={_shown(text)}: empty node list")
    if _NUMACTL_SPEC.fullmatch(stripped) and (
        re.search(r"[^0-9,\- ]|(^|[^0-9])0[0-9]", stripped)
        or any(int(lo) > int(hi) for lo, hi in re.findall(r"(\d+)\s*-\s*(\d+)", stripped))
    ):
        return stripped
    for chunk in stripped.split(","):
        item = chunk.strip()
        lo_s, dash, hi_s = item.partition("-")
        if (
            not lo_s.isdigit()
            or (dash and not hi_s.isdigit())
            or not lo_s.isascii()
            or not hi_s.isascii()
        ):
            bad = _shown(item)
            raise ValueError(
                f"{name}={_shown(text)}: invalid node range {bad} (expected a list like 0-1,4)"
            )
        lo = int(lo_s)
        hi = int(hi_s) if dash else lo
        if hi > _MAX_NODE:
            raise ValueError(
                f"{name}={_shown(text)}: node {hi} is above the kernel limit {_MAX_NODE}"
            )
        nodes.update(range(lo, hi + 1))
    return tuple(sorted(nodes))


def _parse_int(text: str, name: str, minimum: int | None) -> int:
    word = text.strip()
    # int() would also take "+3", "1_000" and non-ASCII digits; keep it plain.
    digits = word[1:] if word.startswith("-") else word
    if not (digits.isdigit() and digits.isascii()) or len(digits) > _MAX_DIGITS:
        raise ValueError(f"{name}={_shown(text)}: expected an integer")
    value = int(word)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={_shown(text)}: must be >= {minimum}")
    return value


def _parse_choice(text: str, name: str, choices: tuple[str, ...]) -> str:
    word = text.strip().lower()
    for choice in choices:
        if choice.lower() == word:
            return choice
    raise ValueError(f"{name}={_shown(text)}: expected one of {', '.join(choices)}")


def _parse(var: EnvVar, text: str, name: str) -> object:
    """Parse ``text`` (non-empty after stripping) for ``var``; ``name`` is the full name."""
    if var.kind == "bool":
        return parse_bool(text, name)
    if var.kind == "int":
        return _parse_int(text, name, var.minimum)
    if var.kind == "nodes":
        return parse_nodelist(text, name)
    if var.kind == "choice":
        return _parse_choice(text, name, var.choices)
    if var.kind == "str":
        return text.strip()
    raise AssertionError(f"unknown kind {var.kind!r} for {name}")  # registry bug


# ---------------------------------------------------------------------------
# Reading the environment (at call time only)
# ---------------------------------------------------------------------------


def _lookup(suffix: str) -> EnvVar:
    try:
        return REGISTRY[suffix.upper()]
    except KeyError:
        raise KeyError(
            f"unknown numa_utils setting {suffix!r}; known: {', '.join(REGISTRY)}"
        ) from None


def _read(var: EnvVar, prefix: str | None, environ: Mapping[str, str] | None) -> tuple[object, str]:
    name = _check_prefix(_prefix if prefix is None else prefix) + var.suffix
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():  # unset or empty: the default
        return var.default, "default"
    return _parse(var, raw, name), "env"


def get(suffix: str, *, prefix: str | None = None, environ: Mapping[str, str] | None = None) -> Any:
    """Typed value of the setting ``suffix`` (e.g. ``"NUMA_STRICT"``), read now.

    ``prefix`` overrides the module prefix for this call; ``environ`` replaces
    ``os.environ`` (for tests and for reporting on a child's environment).
    Raises ValueError naming the full variable for a malformed value.
    """
    return _read(_lookup(suffix), prefix, environ)[0]


def effective(
    *, prefix: str | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, tuple[Any, str]]:
    """Full variable name -> (value, "env" | "default") for every setting.

    Raises ValueError on the first malformed value; callers that report
    (``status``) should catch it and show the message as a warning.
    """
    result = {}
    for var in _VARS:
        value, source = _read(var, prefix, environ)
        result[_check_prefix(_prefix if prefix is None else prefix) + var.suffix] = (value, source)
    return result


# Typed accessors, written out so readers and type checkers see them.


def enable_numa_interleave(
    *, prefix: str | None = None, environ: Mapping[str, str] | None = None
) -> bool:
    """ENABLE_NUMA_INTERLEAVE: interleave shared regions across nodes (default off)."""
    return bool(get("ENABLE_NUMA_INTERLEAVE", prefix=prefix, environ=environ))


def numa_strict(*, prefix: str | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """NUMA_STRICT: raise instead of falling back (default off)."""
    return bool(get("NUMA_STRICT", prefix=prefix, environ=environ))


def numa_nodes(
    *, prefix: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[int, ...] | str | None:
    """NUMA_NODES: sorted node ids, None for every allowed memory node, or a numactl
    node list only the machine can resolve (``all``, ``!0``, ``+1``: a str for
    numa_utils.parse_nodestring, which refuses device forms such as ``netdev:eth0``)."""
    value = get("NUMA_NODES", prefix=prefix, environ=environ)
    return None if value is None else value if isinstance(value, str) else tuple(value)


def numa_prefault_threads(
    *, prefix: str | None = None, environ: Mapping[str, str] | None = None
) -> int | None:
    """NUMA_PREFAULT_THREADS: thread count >= 1, or None for one per allowed CPU."""
    value = get("NUMA_PREFAULT_THREADS", prefix=prefix, environ=environ)
    return None if value is None else int(value)


def numa_hugepages(*, prefix: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """NUMA_HUGEPAGES: "off", "thp", "2M", "1G" or "auto"."""
    return str(get("NUMA_HUGEPAGES", prefix=prefix, environ=environ))


def numa_bind_policy(*, prefix: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """NUMA_BIND_POLICY: "none", "node", "socket", "exclusive" or "core-complex"."""
    return str(get("NUMA_BIND_POLICY", prefix=prefix, environ=environ))


def numa_reserved_cores(
    *, prefix: str | None = None, environ: Mapping[str, str] | None = None
) -> int:
    """NUMA_RESERVED_CORES: cores per node kept out of CPU plans (>= 0)."""
    return int(get("NUMA_RESERVED_CORES", prefix=prefix, environ=environ))


def numa_memory_policy(
    *, prefix: str | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """NUMA_MEMORY_POLICY: "prefer", "bind", "interleave", "weighted-interleave",
    "local", "socket", "none", or another word for one of these modes."""
    return str(get("NUMA_MEMORY_POLICY", prefix=prefix, environ=environ))


# ---------------------------------------------------------------------------
# The table of docs/environment.md, and the CLI
# ---------------------------------------------------------------------------


def _format_default(var: EnvVar) -> str:
    if var.default is None:
        return "unset"
    if var.kind == "bool":
        return "`0`" if not var.default else "`1`"
    return f"`{var.default}`"


def _format_kind(var: EnvVar) -> str:
    if var.kind == "choice":
        return "one of " + ", ".join(f"`{c}`" for c in var.choices)
    if var.kind == "int" and var.minimum is not None:
        return f"integer >= {var.minimum}"
    if var.kind == "bool":
        return "boolean"
    if var.kind == "nodes":
        return "node list"
    return "string"


def markdown_table(prefix: str | None = None) -> str:
    """The table of variables in docs/environment.md (default prefix unless ``prefix`` is given).

    Regenerate with ``python envs.py --markdown``.
    """
    pre = _check_prefix(DEFAULT_PREFIX if prefix is None else prefix)
    lines = [
        "| Variable | Type | Default | Description |",
        "|---|---|---|---|",
    ]
    for var in _VARS:
        lines.append(
            f"| `{pre}{var.suffix}` | {_format_kind(var)} | {_format_default(var)} | {var.doc} |"
        )
    lines.append("")
    lines.append(
        "Booleans accept `1/0`, `true/false`, `yes/no`, `on/off` (any case); "
        "an empty value means the default; anything else is an error that "
        "names the variable."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python envs.py [--prefix P] [--markdown]``."""
    import argparse  # only the CLI needs it

    parser = argparse.ArgumentParser(
        description="numa_utils environment variables: effective values or the docs' table"
    )
    parser.add_argument(
        "--prefix", default=None, help=f"variable prefix (default {DEFAULT_PREFIX})"
    )
    parser.add_argument(
        "--markdown", action="store_true", help="print the table of variables (docs/environment.md)"
    )
    args = parser.parse_args(argv)
    try:
        if args.markdown:
            sys.stdout.write(markdown_table(args.prefix))
            return 0
        for name, (value, source) in effective(prefix=args.prefix).items():
            shown = "unset" if value is None else value
            if isinstance(value, tuple):
                shown = ",".join(map(str, value))
            print(f"{name}={shown}  ({source})")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
