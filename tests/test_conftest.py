# SPDX-License-Identifier: Apache-2.0
"""conftest's shortcuts give what the slow way gives: a saved machine parsed once per
process reads as a fresh parse, and a copy of a tree made of hard links to the
process's pristine copy holds the fixture's files even after a test wrote into an
earlier copy's files in place."""

import os

import pytest
from conftest import (
    FIXTURES_DIR,
    _open_tree,
    fixture_archive,
    fixture_root,
    fixture_tree,
    nu,
    nusim,
    sim,
)

NAME = "four-node-asym"


def _files(root):
    """{relative path: bytes} of every file under ``root``, links not followed."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, root)] = fh.read()
    return out


def test_a_fixture_parsed_once_reads_as_a_fresh_parse():
    fresh = nu.LinuxBackend(_open_tree(fixture_root(NAME)))
    once = nu.LinuxBackend(nusim.open_tree(fixture_root(NAME)))
    assert repr(nu.read_topology(backend=once)) == repr(nu.read_topology(backend=fresh))
    assert nusim.open_tree(fixture_root(NAME)) is not nusim.open_tree(fixture_root(NAME))
    assert sim(NAME).kernel is not sim(NAME).kernel
    whole = nusim.SavedArchive(fixture_root(NAME))
    assert dict(fixture_archive(NAME).files) == whole.files
    with pytest.raises(TypeError):  # shared by every test of the process: read-only
        fixture_archive(NAME).files["root/proc/meminfo"] = b""


def test_only_the_fixtures_folder_is_parsed_once(tmp_path):
    copy = tmp_path / f"{NAME}.txt"
    copy.write_bytes(open(fixture_root(NAME), "rb").read())
    assert str(FIXTURES_DIR) in fixture_root(NAME)
    tree = nusim.open_tree(str(copy))
    assert not isinstance(tree.source.files, type(fixture_archive(NAME).files))


def test_a_copy_after_writes_in_place_holds_the_fixtures_files(tmp_path):
    node = "sys/devices/system/node"
    want = {
        rel[len("root/") :]: data
        for rel, data in fixture_archive(NAME).files.items()
        if rel.startswith("root/")
    }
    first = tmp_path / "first"
    fixture_tree(NAME, first)
    assert _files(first) == want
    # In place, through the hard links: a write, a truncation, a mode.
    (first / node / "online").write_text("0-16777215\n")
    with open(first / node / "node0" / "meminfo", "r+b") as fh:
        fh.truncate(3)
    os.chmod(first / node / "node1" / "distance", 0)
    second = tmp_path / "second"
    fixture_tree(NAME, second)
    assert _files(second) == want
    assert os.stat(second / node / "node1" / "distance").st_mode & 0o777 == 0o644
    assert (first / node / "online").read_text() == "0-16777215\n"  # the first keeps its own
    sub = tmp_path / "sub"
    fixture_tree(NAME, sub, sub="root/" + node)
    assert _files(sub) == {
        rel[len(node) + 1 :]: data for rel, data in want.items() if rel.startswith(node + "/")
    }
