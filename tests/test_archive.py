# SPDX-License-Identifier: Apache-2.0
"""A saved machine as one file: tools/gather.py --archive writes it, --root reads it
(issue 15); hostile archives are refused with a clear error and write nothing
outside their private folder."""

import importlib.util
import io
import json
import os
import tarfile

import pytest
from conftest import REPO, fixture_root, nu


def _gather():
    spec = importlib.util.spec_from_file_location("gather_tool", REPO / "tools" / "gather.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _status_json(capsys, root):
    assert nu.main(["status", "--json", "--root", str(root)]) == 0
    rep = json.loads(capsys.readouterr().out)
    rep.pop("root")
    return rep


@pytest.mark.parametrize("how", ["--archive", "positional"])
def test_gather_archive_reads_like_the_folder(tmp_path, capsys, how):
    src = fixture_root("qemu-x86_64-two-node")
    arc = tmp_path / "machine.tar.gz"
    argv = ["--root", src, "--no-self-status"]
    argv += ["--archive", str(arc)] if how == "--archive" else [str(arc)]
    assert _gather().main(argv) == 0
    capsys.readouterr()
    with tarfile.open(arc) as tar:
        members = tar.getmembers()
    assert all(m.isfile() for m in members)           # one file, plain members only
    assert "SOURCE.md" in {m.name for m in members}
    assert {m.name.split("/")[0] for m in members} == {"SOURCE.md", "root"}
    got, want = _status_json(capsys, arc), _status_json(capsys, src)
    for key in ("nodes", "gpus", "cpus", "kernel", "last_level_caches", "warnings"):
        assert got[key] == want[key], key          # (counters carry a timestamp)
    assert len(got["nodes"]) == 2
    assert nu.main(["status", "--root", str(arc)]) == 0
    assert capsys.readouterr().out.startswith(f"numa_utils {nu.__version__} status: "
                                              f"saved tree {arc}\n")


def test_gather_archive_refuses_to_overwrite(tmp_path, capsys):
    arc = tmp_path / "m.tgz"
    arc.write_bytes(b"mine")
    assert _gather().main(["--root", fixture_root("single-node"), "--archive",
                           str(arc)]) == 2
    assert arc.read_bytes() == b"mine"


def _tar(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _file(name, data=b"0\n"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name, kind, target=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


@pytest.mark.parametrize("member", [
    _file("/etc/evil"), _file("root/../../evil"), _file("../evil"),
    _special("root/sys/link", tarfile.SYMTYPE, "/etc/passwd"),
    _special("root/sys/in", tarfile.SYMTYPE, "online"),
    _special("root/sys/hard", tarfile.LNKTYPE, "root/sys/devices/system/node/online"),
    _special("root/dev/null", tarfile.CHRTYPE), _special("root/dev/sda", tarfile.BLKTYPE),
    _special("root/fifo", tarfile.FIFOTYPE),
], ids=["absolute", "dotdot-inside", "dotdot", "symlink-out", "symlink-in", "hardlink",
        "chardev", "blockdev", "fifo"])
def test_hostile_members_refused(tmp_path, capsys, member):
    arc = tmp_path / "a" / "bad.tar.gz"
    arc.parent.mkdir()
    _tar(arc, [_file("root/sys/devices/system/node/online", b"0\n"), member])
    assert nu.main(["status", "--root", str(arc)]) == 2
    err = capsys.readouterr().err
    assert "refused member" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["a"] and os.listdir(tmp_path / "a") == \
        ["bad.tar.gz"]
    assert not os.path.exists("/etc/evil") or os.path.getsize("/etc/evil") != 2


def test_size_bound_and_garbage(tmp_path, capsys):
    arc = tmp_path / "big.tar.gz"
    _tar(arc, [_file("root/sys/a", b"x" * 5000), _file("root/sys/b", b"x" * 5000)])
    with pytest.raises(ValueError, match="MiB unpacked"):
        nu._unpack_tree(str(arc), limit=8000)
    assert nu._unpack_tree(str(arc), limit=10000).endswith("root")
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive")
    assert nu.main(["status", "--root", str(junk)]) == 2
    assert "not a saved tree archive" in capsys.readouterr().err


def test_archive_without_a_tree_is_an_error(tmp_path, capsys):
    arc = tmp_path / "empty.tar.gz"
    _tar(arc, [_file("notes.txt", b"hello")])
    assert nu.main(["status", "--root", str(arc)]) == 2
    assert "no sys/ or proc/" in capsys.readouterr().err
