# SPDX-License-Identifier: Apache-2.0
"""numa_maps: the parser over every line format the kernel prints, placement()
reading only the lines of one range, the simulator's rendering, and `maps`."""

import json
import subprocess
import sys
import time

import pytest
from conftest import REPO, cli, nu, nur, sim

# (line, expected fields) -- formats from fs/proc/task_mmu.c show_numa_map and
# mm/mempolicy.c mpol_to_str, across kernel versions.
LINES = [
    ("7f0000000000 default", dict(mode="default", nodes=frozenset(), pages={})),
    (
        "00400000 default file=/usr/bin/python3.11 mapped=1175 mapmax=3 N0=1175 "
        "kernelpagesize_kB=4",
        dict(file="/usr/bin/python3.11", mapped=1175, mapmax=3, pages={0: 1175}),
    ),
    (
        "01a9e000 default heap anon=3366 dirty=3366 N0=1690 N1=1676 kernelpagesize_kB=4",
        dict(heap=True, anon=3366, dirty=3366, pages={0: 1690, 1: 1676}),
    ),
    (
        "7ffd3a5e2000 default stack anon=9 dirty=9 active=0 N1=9 kernelpagesize_kB=4",
        dict(stack=True, active=0, pages={1: 9}),
    ),
    (
        "7f1000000000 interleave:0-3 file=/SYSV4e551234\\040(deleted) dirty=4096 "
        "mapmax=2 N0=1024 N1=1024 N2=1024 N3=1024 kernelpagesize_kB=4",
        dict(
            mode="interleave",
            nodes=frozenset({0, 1, 2, 3}),
            file="/SYSV4e551234",
            deleted=True,
            dirty=4096,
            mapmax=2,
            pages={0: 1024, 1: 1024, 2: 1024, 3: 1024},
        ),
    ),
    (
        "7f2000000000 bind:1 anon=10 dirty=10 N1=10 kernelpagesize_kB=4",
        dict(mode="bind", nodes=frozenset({1})),
    ),
    (
        "7f2000000000 prefer:1 anon=1 dirty=1 N1=1 kernelpagesize_kB=4",
        dict(mode="prefer", nodes=frozenset({1})),
    ),
    (
        "7f2000000000 prefer (many):0,2 anon=2 dirty=2 N0=1 N2=1 kernelpagesize_kB=4",
        dict(mode="prefer (many)", policy="prefer (many):0,2", nodes=frozenset({0, 2})),
    ),
    (
        "7f2000000000 weighted interleave:0-1 anon=3 dirty=3 N0=2 N1=1 kernelpagesize_kB=4",
        dict(mode="weighted interleave", nodes=frozenset({0, 1}), pages={0: 2, 1: 1}),
    ),
    (
        "7f2000000000 local anon=1 dirty=1 N0=1 kernelpagesize_kB=4",
        dict(mode="local", nodes=frozenset()),
    ),
    (
        "7f2000000000 bind=static:0 anon=1 dirty=1 N0=1 kernelpagesize_kB=4",
        dict(mode="bind", flags=("static",), nodes=frozenset({0})),
    ),
    (
        "7f2000000000 bind=relative|balancing:0 anon=1 dirty=1 N0=1 kernelpagesize_kB=4",
        dict(mode="bind", flags=("relative", "balancing"), nodes=frozenset({0})),
    ),
    ("7f2000000000 bind=balancing:0-1 N0=1 kernelpagesize_kB=4", dict(flags=("balancing",))),
    (
        "7f2000000000 interleave=static:0-3 N0=1 kernelpagesize_kB=4",
        dict(mode="interleave", flags=("static",), nodes=frozenset({0, 1, 2, 3})),
    ),
    (
        "7f3000000000 default file=/dev/shm/numa_utils-a\\040b\\075c\\040(deleted) "
        "dirty=1 active=0 N0=1 kernelpagesize_kB=4",
        dict(file="/dev/shm/numa_utils-a b=c", deleted=True),
    ),
    (
        "7f3000000000 default file=/memfd:kv\\040(deleted) dirty=2 N0=2 kernelpagesize_kB=4",
        dict(file="/memfd:kv", deleted=True),
    ),
    (
        "7f4000000000 interleave:0-1 file=/SYSV00000000\\040(deleted) huge dirty=8 N0=4 "
        "N1=4 kernelpagesize_kB=2048",
        dict(huge=True, page_size_kb=2048, pages={0: 4, 1: 4}),
    ),
    (
        "7f5000000000 default file=/anon_hugepage\\040(deleted) huge anon=1 dirty=1 N0=1 "
        "kernelpagesize_kB=1048576",
        dict(huge=True, page_size_kb=1048576, anon=1),
    ),
    # Sparse node ids (only N_MEMORY nodes with pages are printed).
    (
        "7f6000000000 interleave:0,8,250-251 anon=4 dirty=4 N0=1 N8=1 N250=1 N251=1 "
        "kernelpagesize_kB=64",
        dict(
            nodes=frozenset({0, 8, 250, 251}), pages={0: 1, 8: 1, 250: 1, 251: 1}, page_size_kb=64
        ),
    ),
    # Kernels before 3.19: no kernelpagesize_kB (-> the page size given); 2.6: stack:<tid>.
    ("00601000 default file=/bin/bash anon=2 dirty=2 N0=2", dict(page_size_kb=4)),
    ("7fff1000 default stack:1234 anon=3 dirty=3 N0=3", dict(stack=True, page_size_kb=4)),
    (
        "7f7000000000 default anon=1 dirty=1 swapcache=1 writeback=1 N0=1 kernelpagesize_kB=4",
        dict(swapcache=1, writeback=1),
    ),
    # A counter from a newer kernel is kept, not an error.
    (
        "7f7000000000 default anon=1 dirty=1 futurecount=7 N0=1 kernelpagesize_kB=4",
        dict(other={"futurecount": "7"}),
    ),
]


@pytest.mark.parametrize("line,want", LINES, ids=[f"line{i}" for i in range(len(LINES))])
def test_parse_real_format(line, want):
    (e,) = nu.parse_numa_maps(line + "\n", page_size_kb=4)
    assert e.start == int(line.split()[0], 16)
    for k, v in want.items():
        got = getattr(e, k)
        if k in ("pages", "other"):
            got = dict(got)
        assert got == v, (k, got, v)


BAD = [
    "zzzz default",
    "7f00",
    "7f00 mystery:0",
    "7f00 bind=loose:0",
    "7f00 bind:0-x",
    "7f00 default N0=abc",
    "7f00 default anon=-1",
    "7f00 default garbage",
    "7f00 default =5",
    "7f00 default N0=1 =",
]


@pytest.mark.parametrize("line", BAD)
def test_parse_malformed_names_line(line):
    with pytest.raises(ValueError) as ei:
        nu.parse_numa_maps("7f0000 default\n" + line + "\n")
    assert repr(line) in str(ei.value)


def test_truncated_policy_keeps_complete_chunks():
    # mpol_to_str cuts the policy at 63 characters, maybe inside a number.
    nodes = ",".join(str(n) for n in range(0, 80, 2))
    pol = ("interleave:" + nodes)[:63]
    (e,) = nu.parse_numa_maps(f"7f00 {pol} N0=1 kernelpagesize_kB=4")
    assert e.nodes and max(e.nodes) < 80 and 0 in e.nodes


def test_entry_helpers_and_json():
    (e,) = nu.parse_numa_maps("7f00 interleave:0-1 anon=4 dirty=4 N0=2 N1=2 kernelpagesize_kB=2048")
    assert e.pages_total == 4 and e.bytes_per_node == {0: 4 << 20, 1: 4 << 20}
    j = e.to_json()
    assert j["kb"] == {"0": 4096, "1": 4096} and j["start"] == "0x7f00"
    json.dumps(j)


def _synthetic(n):
    lines = [
        f"{0x10000 + i * 0x2000:x} default anon=1 dirty=1 N{i % 2}=1 kernelpagesize_kB=4"
        for i in range(n)
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101])
def test_placement_binary_search(n):
    text = _synthetic(n)
    starts = [0x10000 + i * 0x2000 for i in range(n)]
    for i in range(n):
        # exactly one VMA; one starting inside; the whole file
        assert nu._placement_in(text, starts[i], starts[i] + 0x2000, 4) == {i % 2: 4096}
        assert nu._placement_in(text, starts[i] + 0x1000, starts[i] + 0x1800, 4) == {i % 2: 4096}
    whole = nu._placement_in(text, 0, 1 << 48, 4)
    assert sum(whole.values()) == n * 4096
    assert nu._placement_in(text, 1 << 47, 1 << 48, 4) == {i % 2: 4096 for i in [n - 1]}


def test_placement_via_simulator_and_fast_render():
    s = sim("four-node-asym")
    r = nur.SharedRegion.create("big", 1 << 30, policy="interleave", backend=s)
    try:
        t = time.perf_counter()
        text = s.read_text("/proc/self/numa_maps")
        assert time.perf_counter() - t < 0.5, "render of a 1 GiB region too slow"
        want = {n: (1 << 30) // len(r.policy.nodes) for n in r.policy.nodes}
        assert nu.placement(r.address, r.size, backend=s) == want
        assert r.placement() == want
        (e,) = [e for e in nu.parse_numa_maps(text) if e.file and e.start == r.address]
        assert e.file.startswith("/SYSV4e") and e.deleted and e.dirty == 262144
    finally:
        r.destroy()


def test_placement_bad_pid():
    with pytest.raises(ValueError):
        nu.placement(0x1000, 4096, pid="../1", backend=sim("single-node"))


def test_placement_address_arguments_as_buffer_range():
    s = sim("single-node")
    with pytest.raises(TypeError):
        nu.placement(0x1000, backend=s)
    with pytest.raises(TypeError):  # a bool is not an address (was address 1)
        nu.placement(True, 4096, backend=s)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "numa_utils", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_maps_cli_file(tmp_path):
    f = tmp_path / "numa_maps"
    f.write_text("\n".join(line for line, _ in LINES) + "\n")
    r = _cli("maps", "--file", str(f), "--all")
    assert r.returncode == 0, r.stderr
    assert "interleaved 25.0/25.0/25.0/25.0 over nodes 0-3" in r.stdout
    assert "Per-node memory usage" in r.stdout and "Huge" in r.stdout
    j = _cli("maps", "--file", str(f), "--json")
    data = json.loads(j.stdout)
    assert set(data) == {"vmas", "totals_kb"}
    assert len(data["vmas"]) == len(LINES)
    assert data["totals_kb"]["1"] > 0 and "251" in data["totals_kb"]


def test_maps_cli_bad_file(tmp_path):
    f = tmp_path / "numa_maps"
    f.write_text("7f00 default\nnot a line\n")
    r = _cli("maps", "--file", str(f))
    assert r.returncode == 2 and "not a line" in r.stderr


@pytest.mark.realkernel
def test_maps_cli_self_pid():
    import os

    if not os.path.exists("/proc/self/numa_maps"):
        pytest.skip("kernel without NUMA: no numa_maps")
    r = _cli("maps", str(os.getpid()), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["vmas"] and data["totals_kb"]


def test_verdicts():
    assert (
        nur.placement_verdict({0: 50, 1: 50}, "interleave")
        == "interleaved 50.0/50.0 over nodes 0-1"
    )
    assert nur.placement_verdict({0: 10}) == "all on node 0"
    assert nur.placement_verdict({}) == "nothing faulted in"
    assert nur.placement_verdict({0: 75, 2: 25}, "bind") == "split 75.0/25.0 over nodes 0,2"


def test_maps_text_fast_path_agrees_with_full_parse(tmp_path, capsys):
    """The default text report sums counters without full entries; --all parses
    every line: both must print the same per-node table."""
    lines = []
    a = 0x7F0000000000
    kinds = ["", " heap", " stack", " file=/lib/x\\040y.so", " huge anon=1"]
    for i in range(500):
        k = kinds[i % len(kinds)]
        if i % 3:
            kb = 2048 if "huge" in k else 4
            lines.append(
                f"{a:x} default{k} dirty={i} N0={i} N{1 + i % 2 * 2}=2 kernelpagesize_kB={kb}"
            )
        else:
            lines.append(f"{a:x} bind:0{k}")
        a += 1 << 21
    lines.append(f"{a:x} interleave:0,3 anon=4096 dirty=4096 N0=2048 N3=2048 kernelpagesize_kB=4")
    f = tmp_path / "numa_maps"
    f.write_text("\n".join(lines) + "\n")

    def table(*extra):
        assert nu.main(["maps", "--file", str(f), *extra]) == 0
        out = capsys.readouterr().out
        return out[out.index("Per-node memory usage") :]

    fast, full = table(), table("--all")
    assert fast.replace(str(f), "F") == full.replace(str(f), "F")
    assert nu.main(["maps", "--file", str(f), "--min-size", "8M"]) == 0
    out = capsys.readouterr().out
    assert "interleaved 50.0/50.0 over nodes 0,3" in out
    assert "501 VMAs" in out


@pytest.mark.parametrize("repeats", [3, 400])  # few lines found by their rest; many
def test_maps_rows_are_the_lines_shown_in_file_order(tmp_path, capsys, repeats):
    """The table's rows are exactly the lines with enough resident, in file order, with
    their own addresses (leading zeros dropped), however often a shown rest repeats and
    whatever rests end the same way."""
    big = "default anon=512 dirty=512 N0=512 kernelpagesize_kB=4"
    lines, want = [], []
    for i in range(repeats * 3):
        addr = f"{0x400000 + i * 0x200000:012x}"
        rest = [
            big,
            "default anon=1 dirty=1 N0=1 kernelpagesize_kB=4",
            "interleave:0-1 anon=300 dirty=300 N0=150 N1=150 kernelpagesize_kB=4",
        ][i % 3]
        lines.append(f"{addr} {rest}")
        if "=1 " not in rest:
            want.append(addr.lstrip("0"))
    f = tmp_path / "numa_maps"
    f.write_text("\n".join(lines) + "\n")
    assert nu.main(["maps", "--file", str(f), "--min-size", "1M"]) == 0
    out = capsys.readouterr().out
    rows = [
        ln.split()[0]
        for ln in out.splitlines()
        if ln.startswith("  ") and ("KiB" in ln or "MiB" in ln)
    ]
    assert rows == want
    assert f"{repeats * 3} VMAs; {len(want)} with" in out


def test_placement_methods_agree_and_fall_back():
    """move_pages (exact range, cost per page) and numa_maps (whole VMAs, cost per
    VMA) give the same answer for a region; where move_pages is denied (Docker's
    default seccomp profile) "auto" reads numa_maps instead."""
    import errno

    from conftest import sim

    b = sim("four-node-asym")
    r = nur.SharedRegion.create("placement-methods", 64 * 4096 * 4, policy="interleave", backend=b)
    try:
        want = {n: 64 * 4096 for n in range(4)}
        assert nu.placement(r.address, r.size, backend=b, method="move_pages") == want
        assert nu.placement(r.address, r.size, backend=b, method="numa_maps") == want
        b.fail("move_pages", errno.EPERM)
        assert nu.placement(r.address, r.size, backend=b) == want  # auto
        with pytest.raises(PermissionError):
            nu.placement(r.address, r.size, backend=b, method="move_pages")
        with pytest.raises(ValueError):
            nu.placement(r.address, r.size, backend=b, method="guess")
    finally:
        b.clear_failures()
        r.destroy()


def test_placement_auto_counts_every_page_the_range_touches(monkeypatch):
    """ "auto" asks move_pages up to 64 Ki pages, counting the pages the range
    touches (an unaligned start adds one), and reads numa_maps beyond."""
    b = sim("four-node-asym")
    asked = []

    def move_pages(backend, pid, addr, size):
        asked.append(size)
        return {}

    monkeypatch.setattr(nu, "_placement_move_pages", move_pages)
    base, limit = 1 << 32, (1 << 16) * 4096
    nu.placement(base, limit, backend=b)
    nu.placement(base + 1, limit - 4096, backend=b)
    assert asked == [limit, limit - 4096]
    nu.placement(base + 1, limit, backend=b)  # 64 Ki + 1 pages: numa_maps
    nu.placement(base, limit + 1, backend=b)
    assert asked == [limit, limit - 4096]


def test_placement_methods_agree_on_this_kernel():
    import mmap

    m = mmap.mmap(-1, 1 << 20)
    try:
        m.write(b"x" * (1 << 19))  # half of it faulted in
        a = nu.placement(m, method="move_pages")
        b = nu.placement(m, method="numa_maps")
        assert a == b and sum(a.values()) == 1 << 19
    except PermissionError:
        pytest.skip("move_pages denied here")
    finally:
        m.close()


# -- issue 12/14: maps streams, refuses what is not a regular file, splits at "\n" only --


@pytest.mark.parametrize(
    "sep",
    ["\r", "\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"],
    ids=lambda s: f"U+{ord(s):04X}",
)
def test_parse_numa_maps_splits_lines_at_newline_only(sep, tmp_path, capsys):
    """Issue 12: str.splitlines() cut valid kernel output where a file name holds one
    of these (seq_path escapes only "\\n", "\\t", "=" and space)."""
    name = f"/tmp/odd{sep}name.so"
    text = (
        f"7f0000000000 default file={name} anon=1 dirty=1 N0=1 kernelpagesize_kB=4\n"
        "7f0000200000 default heap anon=2 dirty=2 N0=2 kernelpagesize_kB=4\n"
    )
    a, b = nu.parse_numa_maps(text)
    assert a.file == name and a.pages == {0: 1} and b.heap
    f = tmp_path / "numa_maps"
    f.write_bytes(text.encode())
    assert nu.main(["maps", "--file", str(f), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [v["file"] for v in data["vmas"]] == [name, None]
    assert nu.main(["maps", "--file", str(f), "--min-size", "4k"]) == 0
    assert "2 VMAs; 2 with" in capsys.readouterr().out


def test_iter_numa_maps_chunks_cut_anywhere():
    """The iterator form gives the list form's entries whatever the chunk borders."""
    text = "\n".join(line for line, _ in LINES) + "\n"
    want = nu.parse_numa_maps(text, page_size_kb=4)
    for size in (1, 7, 64, 1000, len(text)):
        chunks = (text[i : i + size] for i in range(0, len(text), size))
        assert list(nu.iter_numa_maps(chunks, page_size_kb=4)) == want, size
    assert list(nu.iter_numa_maps(text.rstrip("\n"), page_size_kb=4)) == want  # no final \n
    with pytest.raises(ValueError, match="over"):
        list(nu.iter_numa_maps(iter(["7f00 default file=/" + "x" * (1 << 20)] * 2)))


def _mixed_maps(n):
    out, a = [], 0x7F0000000000
    kinds = ["", " heap", " stack", " file=/lib/x\\040y%s.so", " huge anon=1"]
    for i in range(n):
        k = kinds[i % len(kinds)]
        pol = ("interleave:0-3", "default", "bind=static:1", "prefer (many):0,2")[i % 4]
        if i % 3:
            out.append(
                f"{a:x} {pol}{k} dirty={i % 7} N0={i % 50} N{1 + i % 2 * 2}=2 "
                f"kernelpagesize_kB={2048 if 'huge' in k else 4}"
            )
        else:
            out.append(f"{a:08x} {pol}{k}")
        a += 1 << 21
    return out


@pytest.mark.parametrize("upper", [False, True], ids=["fast", "fallback"])
def test_maps_json_streamed_matches_entries(upper, tmp_path, capsys):
    """The streamed JSON (each distinct line rest encoded once) is what the entries
    themselves give, on the fast path and on the line-by-line fallback (an upper-case
    address the regular expression does not take)."""
    lines = _mixed_maps(3000)
    if upper:
        addr, rest = lines[1500].split(" ", 1)
        lines[1500] = addr.upper() + " " + rest
    text = "\n".join(lines) + "\n"
    f = tmp_path / "numa_maps"
    f.write_text(text)
    assert nu.main(["maps", "--file", str(f), "--json", "--page-kb", "4"]) == 0
    got = json.loads(capsys.readouterr().out)
    entries = nu.parse_numa_maps(text, page_size_kb=4)
    want = []
    totals = {}
    for e in entries:
        d = e.to_json()
        d["verdict"] = nur.placement_verdict(e.bytes_per_node, e.mode) if e.pages else None
        want.append(d)
        for n, kb in d["kb"].items():
            totals[n] = totals.get(n, 0) + kb
    assert got["vmas"] == want
    assert got["totals_kb"] == dict(sorted(totals.items(), key=lambda kv: int(kv[0])))


def test_maps_bad_rest_names_whole_line(tmp_path):
    f = tmp_path / "numa_maps"
    f.write_text("7f00 default N0=1\n7f01 bogus N0=1\n")
    r = _cli("maps", "--file", str(f))
    assert r.returncode == 2 and "'7f01 bogus N0=1'" in r.stderr, r.stderr


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory"])
def test_maps_file_refuses_non_regular(kind, tmp_path):
    """Issue 12: `maps --file /dev/zero` read forever (9 GB after 10 s) and a FIFO
    blocked; both are a one-line error and exit 2 now, before any output."""
    import os

    path = {"dev_zero": "/dev/zero", "directory": str(tmp_path)}.get(kind)
    if kind == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    elif not os.path.exists(path):
        pytest.skip(f"{path} does not exist here")
    for extra in ((), ("--json",)):
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "numa_utils", "maps", "--file", path, *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert time.monotonic() - t0 < 20
        assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1


def test_maps_file_memory_bounded(tmp_path):
    """Issue 12/14: a big numa_maps file (here 24 MB, 330k VMAs) is read in pieces:
    peak RSS stays within 64 MiB of a bare interpreter's, text and --json alike (the
    whole-file parse needed ~12x the file size for text, ~36x for --json)."""
    lines = _mixed_maps(1000)
    block = ("\n".join(lines) + "\n").encode()
    f = tmp_path / "numa_maps"
    with open(f, "wb") as out:
        for _ in range((24 << 20) // len(block) + 1):
            out.write(block)
    # VmHWM, not ru_maxrss: the latter carries the forking parent's RSS across exec.
    hwm = "[int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM:')][0]"
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); import numa_utils as nu; "
        "rc = nu.main(sys.argv[1:]); sys.stdout.flush(); "
        f"print({hwm}, file=sys.stderr); sys.exit(rc)"
    )
    bare = subprocess.run(
        [sys.executable, "-c", f"print({hwm})"], capture_output=True, text=True, timeout=60
    )
    if bare.returncode != 0:
        pytest.skip("no VmHWM in /proc/self/status here")
    base_kb = int(bare.stdout)
    for extra in ((), ("--json",)):
        r = subprocess.run(
            [sys.executable, "-c", code, "maps", "--file", str(f), *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        peak_kb = int(r.stderr.strip().splitlines()[-1])
        assert peak_kb - base_kb < 64 * 1024, (extra, peak_kb, base_kb)


@pytest.mark.parametrize(
    "text",
    [
        "7f00 default N0=1\n7f01 default N0=1\n",
        "7f00 \n7f01 default\r N0=1\n",
        "bogus first line\n7f01 default N0=1\n",
        "7f00 default N0=1\n7F01 default N0=1\n",
        "7f00 default N0=1\n\n7f01 default N0=1\n",
        "7f00 default N0=1\n7f01default\n",
        "7f00 default file=/a\\0127f01 b N0=1\n",
    ],
    ids=["plain", "empty-rest", "first-bad", "upper", "empty-line", "no-space", "escaped-nl"],
)
def test_rests_split_agrees_with_the_line_expression(text):
    """The table's rests (numa_utils_cli._rests) are what the per-line expression
    takes, and a line it cannot take leaves fewer rests than lines (the full parser
    then names it)."""
    import re

    want = re.findall(r"(?am)^[0-9a-f]+ (.*)$", text)
    got = cli._rests(text)
    if len(want) == text.count("\n"):
        assert got == want
    else:
        assert len(got) != text.count("\n")
