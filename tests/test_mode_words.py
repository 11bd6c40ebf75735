# SPDX-License-Identifier: Apache-2.0
"""One mode vocabulary: every word a result reports for a memory policy mode is taken
back, as that mode, by every input that takes a mode.

The mode each input arrives at is judged by the simulated kernel (get_policy after
the call) or, for layouts, against the words written out below: never by asking the
library's own table.
"""

import json

import pytest
from conftest import cli, fixture_root, nu, nur, sim

import envs as envs_mod

MACHINE = "dual-socket-8gpu"

# include/uapi/linux/mempolicy.h, written out here.
MODES = {
    "DEFAULT": 0,
    "PREFERRED": 1,
    "BIND": 2,
    "INTERLEAVE": 3,
    "LOCAL": 4,
    "PREFERRED_MANY": 5,
    "WEIGHTED_INTERLEAVE": 6,
}

# The word a layout gives each mode (its text grammar, see the comment above Layout).
LAYOUT_WORD = {
    0: "default",
    1: "prefer",
    2: "bind",
    3: "interleave",
    4: "local",
    5: "prefer-many",
    6: "weighted-interleave",
}


def _nodes(mode):
    if mode in (0, 4):
        return None
    if mode == 1:
        return [0]
    return [0, 1]


def _backend():
    return sim(MACHINE, weighted_interleave=True)


def _kernel_mode(b):
    return int(nu.get_policy(backend=b).mode)


def _reported_words(mode):
    """Reporting path -> the word it gives for ``mode``."""
    b = _backend()
    res = nu.set_thread_policy(mode, _nodes(mode), backend=b)
    assert res.applied and _kernel_mode(b) == mode, res
    info = nu.get_policy(backend=b)
    text = str(info)  # numa_maps' form: "prefer (many):0-1", "bind=static:0"
    line = f"7f0000000000 {text} anon=1 dirty=1 N0=1 kernelpagesize_kB=4\n"
    layout = nur.Layout.extents([(4096, LAYOUT_WORD[mode], _nodes(mode))])
    words = {
        "PolicyResult.mode": res.mode,
        "PolicyResult.to_json": res.to_json()["mode"],
        "PolicyInfo.to_json": info.to_json()["mode"],
        "PolicyInfo text": text.partition(":")[0].partition("=")[0],
        "to_json(Mode)": nu.to_json(info.mode),
        "NumaMapsEntry.mode": nu.parse_numa_maps(line)[0].mode,
        "Extent.policy": layout[0].policy,
        "Layout text": str(layout).split(":")[1],
    }
    bound = nu.bind_to_node(0, cpus=False, memory=res.mode, backend=_backend())
    if bound.memory is not None:
        words["BindResult.memory.mode"] = bound.memory.mode
    plans = nu.gpu_plans("node", memory=res.mode, backend=_backend())
    if plans[0].memory is not None:
        words["GpuPlan.memory"] = plans[0].memory
    return words


def _reported_cases():
    cases = []
    for name, mode in MODES.items():
        for path, word in _reported_words(mode).items():
            cases.append(pytest.param(mode, word, id=f"{name}-{path}-{word}"))
    return cases


CASES = _reported_cases()


def test_the_reports_use_several_words():
    """The cases below cover the spellings results really give (not one word per
    mode, which would make the round trip trivial)."""
    words = {word for case in CASES for word in case.values[1:]}
    assert {"preferred", "prefer", "prefer (many)", "prefer-many", "preferred_many"} <= words
    assert {"weighted interleave", "weighted-interleave", "socket"} <= words


@pytest.mark.parametrize(("mode", "word"), CASES)
def test_apply_policy_takes_every_reported_word(mode, word):
    if word == "socket":
        pytest.skip("socket is a memory= plan (prefer-many over a package), not a mode")
    b = _backend()
    res = nu.set_thread_policy(word, _nodes(mode), backend=b)
    assert res.applied, res
    assert _kernel_mode(b) == mode
    again = nu.set_thread_policy(res.mode, _nodes(mode), backend=_backend())
    assert again.mode == res.mode  # reported back the same


@pytest.mark.parametrize(("mode", "word"), CASES)
def test_layouts_take_every_reported_word(mode, word):
    if word == "socket":
        pytest.skip("socket is a memory= plan (prefer-many over a package), not a mode")
    nodes = _nodes(mode)
    want = str(nur.Layout.extents([(4096, LAYOUT_WORD[mode], nodes)]))
    assert str(nur.Layout.extents([(4096, word, nodes)])) == want
    listed = ",".join(map(str, nodes or []))
    text = f"4K:{word}:{listed}" if listed else f"4K:{word}"
    assert str(nur.Layout.parse(text)) == want


def _memory_mode(mode, word):
    """The mode a memory= word must give: "socket" is prefer-many over a package."""
    if word == "socket":
        return MODES["PREFERRED_MANY"]
    return mode


@pytest.mark.parametrize(("mode", "word"), CASES)
def test_memory_argument_takes_every_reported_word(mode, word):
    b = _backend()
    res = nu.bind_to_node(0, cpus=False, memory=word, backend=b)
    assert _kernel_mode(b) == _memory_mode(mode, word), res
    if res.memory is not None:
        again = nu.bind_to_node(0, cpus=False, memory=res.memory.mode, backend=_backend())
        assert again.memory is not None and again.memory.mode == res.memory.mode


@pytest.mark.parametrize(("mode", "word"), CASES)
def test_memory_variable_takes_every_reported_word(monkeypatch, mode, word):
    monkeypatch.setenv("NUMA_UTILS_NUMA_MEMORY_POLICY", word)
    b = _backend()
    nu.bind_to_node(0, cpus=False, backend=b)
    assert _kernel_mode(b) == _memory_mode(mode, word)
    assert envs_mod.get("NUMA_MEMORY_POLICY").lower() == word.lower()


@pytest.mark.parametrize(("mode", "word"), CASES)
def test_the_cli_takes_every_reported_word(capsys, mode, word):
    root = fixture_root(MACHINE)
    assert cli.main(["plan", "--root", root, "--memory", word, "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)
    planned = {plan["memory_policy"] for plan in plans}
    b = _backend()
    nu.bind_to_node(0, cpus=False, memory=planned.pop(), backend=b)
    assert _kernel_mode(b) == _memory_mode(mode, word)
    if word == "socket":
        return
    nodes = ",".join(map(str, _nodes(mode) or [0]))
    got = cli.main(["fit", "1M", "--root", root, "--policy", word, "--nodes", nodes, "--json"])
    assert got in (0, 1)
    assert json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("mode", sorted(MODES.values()))
def test_numactl_show_words_are_taken_back(mode):
    """`numa-utils numactl --show` prints numactl's own words ("preferred-many",
    "weighted interleave"), indexed by mode; each is taken back as that mode."""
    b = _backend()
    nu.set_thread_policy(cli._NUMACTL_POLICY[mode], _nodes(mode), backend=b)
    assert _kernel_mode(b) == mode
