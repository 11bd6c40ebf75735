"""`numa_utils numactl`: libnuma's list grammar, numactl's options, --show/--hardware.

Expected values are derived from numactl's and libnuma's sources (numactl.c, libnuma.c
numa_parse_nodestring/numa_parse_cpustring), not from this implementation; the live
tests compare with the numactl binary when the host has one."""

import functools
import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import REPO, cli, fixture_root, fixture_tree, nu, nur, saved_backend, sim

FOUR = "four-node-asym"  # nodes 0-3, 16 CPUs each, all with memory


def _nodes(text, fixture=FOUR, **kw):
    b = saved_backend(fixture_root(fixture))
    return sorted(nu.parse_nodestring(text, backend=b, **kw))


# Specs from numactl's regression tests (test/regress, test/bind_range) and its man
# page, rewritten as (spec, fixture, options, expected ids or the libnuma error).
@pytest.mark.parametrize(
    "spec,fixture,kw,want",
    [
        ("0", FOUR, {}, [0]),
        ("1,3", FOUR, {}, [1, 3]),
        ("0-2", FOUR, {}, [0, 1, 2]),
        ("0-1,3", FOUR, {}, [0, 1, 3]),
        ("all", FOUR, {}, [0, 1, 2, 3]),
        ("0,all", FOUR, {}, [0, 1, 2, 3]),  # "all" as the last item takes the rest
        ("all,0", FOUR, {}, "unparseable"),  # ... but not before a comma
        ("!0", FOUR, {}, [1, 2, 3]),
        ("!0-1", FOUR, {}, [2, 3]),
        ("+0", FOUR, {}, [0]),
        ("!+1-2", FOUR, {}, [0, 3]),
        ("0x2", FOUR, {}, [2]),  # strtoul base 0: hex
        ("03", FOUR, {}, [3]),  # ... and octal
        ("010", FOUR, {}, "out of range"),  # octal 8, not node 10
        ("08", FOUR, {}, "trailing"),  # "0" then garbage
        ("2-1", FOUR, {}, [2]),  # a reversed range is its first id
        ("4", FOUR, {}, "out of range"),
        ("0-4", FOUR, {}, "out of range"),
        ("1-", FOUR, {}, "missing"),
        ("", FOUR, {}, []),  # empty: no nodes (numactl then resets)
        ("x", FOUR, {}, "unparseable"),
        # cpuset-relative and cpuset-limited: the container is allowed node 1 only
        ("+0", "container-cpuset", {}, [1]),
        ("0", "container-cpuset", {}, "out of range"),
        ("0", "container-cpuset", {"possible": True}, [0]),  # numactl --all
        ("all", "container-cpuset", {}, [1]),
        # sparse ids: "!" flips ids below the count of memory nodes (8), not the allowed set
        ("0,8", "sparse-ids", {}, [0, 8]),
        ("+1-2", "sparse-ids", {}, [8, 250]),
        ("!0", "sparse-ids", {}, [1, 2, 3, 4, 5, 6, 7]),
        # memoryless CPU nodes are outside Mems_allowed: -N 0 needs --all, as in numactl
        ("0", "memoryless-cpu-node", {}, "out of range"),
        ("0", "memoryless-cpu-node", {"possible": True}, [0]),
        # CPUs
        ("0-3", FOUR, {"cpus": True}, [0, 1, 2, 3]),
        ("!0-61", FOUR, {"cpus": True}, [62, 63]),
        ("+1", "container-cpuset", {"cpus": True}, [21]),
        ("64", FOUR, {"cpus": True}, "out of range"),
        ("all", "container-cpuset", {"cpus": True}, list(range(20, 28)) + list(range(52, 60))),
    ],
)
def test_list_grammar_matches_libnuma(spec, fixture, kw, want):
    if isinstance(want, list):
        assert _nodes(spec, fixture, **kw) == want
    else:
        with pytest.raises(ValueError, match=want):
            _nodes(spec, fixture, **kw)


def _pci_tree(tmp_path, numa_node):
    root = tmp_path / "root"
    fixture_tree(FOUR, root)
    dev = root / "sys/bus/pci/devices/0000:3b:00.0"
    dev.mkdir(parents=True, exist_ok=True)
    (dev / "numa_node").write_text(f"{numa_node}\n")
    net = root / "sys/class/net/eth9"
    net.mkdir(parents=True)
    (net / "device").symlink_to(os.path.relpath(dev, net))  # relative, as sysfs's
    return saved_backend(str(root))


def _parse_typed(spec, backend):
    """parse_nodestring as the numactl front end calls it (device forms allowed)."""
    return nu.parse_nodestring(spec, backend=backend, devices=cli._device_node)


def test_device_forms_read_sysfs_locality(tmp_path, monkeypatch):
    b = _pci_tree(tmp_path, 2)
    assert _parse_typed("pci:3b:00.0", backend=b) == {2}
    assert _parse_typed("pci:0:3b:0", backend=b) == {2}
    assert _parse_typed("netdev:eth9", backend=b) == {2}
    assert _parse_typed("0,netdev:eth9", backend=b) == {0, 2}
    with pytest.raises(ValueError, match="Cannot read node mask"):
        _parse_typed("netdev:nope", backend=b)
    with pytest.raises(ValueError, match="Illegal characters"):
        _parse_typed("netdev:../x", backend=b)
    route = tmp_path / "root/proc/net/route"
    route.parent.mkdir(parents=True, exist_ok=True)
    route.write_text(
        "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n"
        "lo\t00000000\t00000000\t0001\t0\t0\t0\t00000000\n"
        "eth9\t0000010A\t00000000\t0001\t0\t0\t0\t0000FFFF\n"
    )
    b = saved_backend(str(tmp_path / "root"))  # a saved tree is read as it was
    import socket

    looked_up = []
    monkeypatch.setattr(socket, "gethostbyname", lambda h: looked_up.append(h) or "10.1.0.9")
    assert _parse_typed("ip:10.1.2.3", backend=b) == {2}  # 10.1/16 via eth9
    assert looked_up == []  # an address: no lookup
    assert _parse_typed("ip:kv.example", backend=b) == {2}  # a name the user typed
    assert looked_up == ["kv.example"]
    with pytest.raises(ValueError, match="Cannot read node mask for net device `lo'"):
        _parse_typed("ip:192.168.0.1", backend=b)  # default via lo
    b = _pci_tree(tmp_path / "u", -1)
    with pytest.raises(ValueError, match="Kernel does not know"):
        _parse_typed("netdev:eth9", backend=b)


# -- the command under SimulatedBackend (multi-node) -------------------------------------


def _run(argv, fixture=FOUR, capsys=None):
    """Run the command in-process; the child is `numactl --show` printed in-process
    (the simulated policy is per thread, as the kernel's is)."""
    b = sim(fixture, weighted_interleave=True)  # a 6.9+ kernel: -w is in the matrix
    ran = []

    def execvp(prog, cmd):
        ran.append(cmd)
        if cmd[1:] == ["--show"]:
            text, _ = cli._numactl_show(b, nu.read_topology(backend=b))
            sys.stdout.write(text)
        raise SystemExit(0)  # stands in for the exec that does not return

    try:
        rc = cli._cmd_numactl(argv, backend=b, execvp=execvp)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err, ran


def test_interleave_and_cpunodebind_show(capsys):
    rc, out, err, ran = _run(["-i", "1,2", "--cpunodebind=2", "numactl", "--show"], capsys=capsys)
    assert rc == 0 and ran == [["numactl", "--show"]], err
    cpus = " ".join(str(c) for c in list(range(16, 24)) + list(range(48, 56)))
    assert out == (
        "policy: interleave\n"
        "preferred node: 1 (interleave next)\n"
        "interleavemask: 1 2 \n"
        "interleavenode: 1\n"
        f"physcpubind: {cpus} \n"
        "cpubind: 2 \nnodebind: 2 \nmembind: 0 1 2 3 \npreferred: 1 2 \n"
    )


@pytest.mark.parametrize(
    "argv,lines",
    [
        (["--membind=1-2"], ["policy: bind", "preferred node: 1", "membind: 1 2 "]),
        (["-p", "3"], ["policy: preferred", "preferred node: 3", "preferred: 3 "]),
        (
            ["-P", "0,3"],
            ["policy: preferred-many", "preferred node: 0 (preferred-many)", "preferred: 0 3 "],
        ),
        (
            ["-w", "all"],
            [
                "policy: weighted interleave",
                "preferred node: physcpubind: " + " ".join(map(str, range(64))) + " ",
            ],
        ),
        (["-l"], ["policy: local"]),
        (["-i", "!0-3"], ["policy: default", "preferred node: current"]),  # empty: reset
        (["-C", "+2-3"], ["physcpubind: 2 3 ", "cpubind: 0 "]),
        (["-a", "-N", "3"], ["nodebind: 3 "]),
    ],
)
def test_policies_as_numactl_sets_them(argv, lines, capsys):
    rc, out, err, _ = _run(argv + ["numactl", "--show"], capsys=capsys)
    assert rc == 0, err
    for line in lines:
        assert line in out.splitlines(), (line, out)


@pytest.mark.parametrize(
    "argv,rc,stdout,stderr",
    [
        (["-i", "7", "true"], 1, "<7> is invalid\n", "node argument 7 is out of range"),
        (["-p", "0,1", "true"], 1, "", "usage: numactl"),
        (["-m", "0", "-i", "1", "true"], 1, "\n", "numactl: Conflicting policies"),
        (["-N", "0", "-a", "true"], 1, "\n", "--all/-a option must be before"),
        (["-x"], 1, "", "numactl: invalid option -- 'x'"),
        (["--bogus"], 1, "", "numactl: unrecognized option '--bogus'"),
        (["--show=1"], 1, "", "option '--show' doesn't allow an argument"),
        (["-i"], 1, "", "option requires an argument -- 'i'"),
        (["-l"], 1, "", "usage: numactl"),  # no command
        (["-L", "1g", "true"], 1, "\n", "shm related option --length for process"),
        (["-t", "true"], 0, "", "Strict flag for process ignored"),
    ],
)
def test_errors_and_exit_statuses(argv, rc, stdout, stderr, capsys):
    got_rc, out, err, _ = _run(argv, capsys=capsys)
    assert got_rc == rc and out == stdout and stderr in err, (got_rc, out, err)


def test_exec_failure_is_numactls_message(capsys):
    b = sim(FOUR)

    def execvp(prog, cmd):
        raise FileNotFoundError(2, "No such file or directory")

    assert cli._cmd_numactl(["-i", "all", "no-such"], backend=b, execvp=execvp) == 1
    assert "numactl: execution of `no-such': No such file or directory" in capsys.readouterr().err


def test_eperm_fails_unless_fallback(capsys):
    b = sim(FOUR)
    b.fail("set_mempolicy", 1)  # EPERM, as a container's seccomp profile gives
    ran = []
    rc = cli._cmd_numactl(["-i", "all", "true"], backend=b, execvp=lambda p, c: ran.append(c))
    err = capsys.readouterr().err
    assert rc == 1 and not ran
    assert "setting interleave mask: Operation not permitted" in err
    rc = cli._cmd_numactl(
        ["--fallback", "-i", "all", "true"], backend=b, execvp=lambda p, c: ran.append(c)
    )
    assert ran == [["true"]] and "--fallback" in capsys.readouterr().err


@pytest.mark.parametrize("version", ["2.0.19", "2.0.16"])
def test_hardware_format(version, monkeypatch, capsys):
    # numactl.c print_distances(): printf("% 3d ") for ids and distances: Debian 12's
    # 2.0.16 prints `node   0 ` and `  0:  10 ` (test_own_show_and_hardware_equal_numactls
    # compares with the real binary).
    monkeypatch.setenv("NUMA_UTILS_NUMACTL_VERSION", version)
    rc, out, _, _ = _run(["--hardware"], capsys=capsys)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == "available: 4 nodes (0-3)"
    assert lines[1] == "node 0 cpus: " + " ".join(map(str, list(range(8)) + list(range(32, 40))))
    assert lines[2] == "node 0 size: 128913 MB"
    assert lines[3].startswith("node 0 free: ")
    i = lines.index("node distances:")
    assert lines[i + 1 :] == [
        "node   0   1   2   3 ",
        "  0:  10  12  20  30 ",
        "  1:  12  10  30  20 ",
        "  2:  20  30  10  12 ",
        "  3:  31  20  12  10 ",
    ]


def test_hardware_distance_columns_grow_past_three_digits(capsys):
    """printf("% 3d ") keeps its blank before a 3-digit id: columns widen, never merge."""
    rc, out, _, _ = _run(["-H"], fixture="sparse-ids", capsys=capsys)
    lines = out.splitlines()
    i = lines.index("node distances:")
    assert lines[i + 1] == "node   0   8  250  251  252  253  254  255 "
    assert lines[i + 2].startswith("  0:  10 ")
    assert lines[i + 3].startswith("  8: ")
    assert lines[i + 4].startswith(" 250: ")


def test_hardware_sparse_ids(capsys):
    rc, out, _, _ = _run(["-H"], fixture="sparse-ids", capsys=capsys)
    assert rc == 0 and out.startswith("available: 8 nodes (0,8,250-255)\n")
    assert "node 250 cpus:\n" in out


# -- against the real numactl on this host -------------------------------------------


def _matrix():
    spec = importlib.util.spec_from_file_location(
        "numactl_matrix", REPO / "vm" / "numactl_matrix.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The real binary: a wrapper on PATH (the docs' shim runs numa_utils) would make
# these tests compare numa_utils with itself.
NUMACTL, NO_NUMACTL = _matrix().real_numactl()
LIVE = [
    ["-i", "all"],
    ["--interleave=0"],
    ["-m", "0"],
    ["--membind", "all"],
    ["-p", "0"],
    ["--preferred-many=0"],
    ["-l"],
    ["-N", "0"],
    ["-C", "0"],
    ["--physcpubind=+0"],
    ["-a", "-N", "all"],
    ["-b", "-m", "0"],
    ["-i", "0x0"],
    ["-i", "!0"],
    ["-i", "5"],
    ["-C", "9999"],
    ["-i", "08"],
    ["-m", "0", "-p", "0"],
    ["-x"],
    ["--show=1"],
    ["-N", "0", "-a"],
    ["-s"],
]


def _numactl_unusable():
    """None when the real numactl runs here, else why not."""
    if not NUMACTL:
        return NO_NUMACTL
    if subprocess.run([NUMACTL, "-i", "all", "true"], capture_output=True).returncode:
        return f"{NUMACTL} -i all true fails here (no NUMA syscalls, or denied)"
    return None


NUMACTL_UNUSABLE = _numactl_unusable()


@functools.lru_cache(maxsize=None)
def _numactl_version():
    """The installed numactl's version as dpkg has it (asked once), else 2.0.19."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "numactl"], capture_output=True, text=True
    )
    return out.stdout.split("-")[0] or "2.0.19"


@pytest.mark.realkernel
@pytest.mark.skipif(NUMACTL_UNUSABLE is not None, reason=str(NUMACTL_UNUSABLE))
@pytest.mark.parametrize("args", LIVE, ids=" ".join)
def test_child_show_equals_numactls(args):
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMA_UTILS_NUMACTL_VERSION=_numactl_version())
    want = subprocess.run(
        ["numactl"] + args + [NUMACTL, "--show"],
        executable=NUMACTL,
        capture_output=True,
        text=True,
        env=env,
    )
    got = subprocess.run(
        [sys.executable, "-m", "numa_utils", "numactl"] + args + [NUMACTL, "--show"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert (got.returncode, got.stdout) == (want.returncode, want.stdout), got.stderr
    # and our --show as the child of the real numactl prints what numactl's does
    ours = subprocess.run(
        ["numactl"] + args + [sys.executable, "-m", "numa_utils", "numactl", "--show"],
        executable=NUMACTL,
        capture_output=True,
        text=True,
        env=env,
    )
    assert (ours.returncode, ours.stdout) == (want.returncode, want.stdout), ours.stderr
    # the first line of stderr (libnuma's or numactl's message) up to the usage text
    assert (
        got.stderr.split("usage:")[0].split("\n")[0]
        == want.stderr.split("usage:")[0].split("\n")[0]
    )


@pytest.mark.realkernel
@pytest.mark.skipif(NUMACTL_UNUSABLE is not None, reason=str(NUMACTL_UNUSABLE))
def test_own_show_and_hardware_equal_numactls():
    env = dict(os.environ, PYTHONPATH=str(REPO), NUMA_UTILS_NUMACTL_VERSION="2.0.16")
    for args in (["--show"], ["-i", "all", "--show"]):
        want = subprocess.run([NUMACTL] + args, capture_output=True, text=True)
        got = subprocess.run(
            [sys.executable, "-m", "numa_utils", "numactl"] + args,
            capture_output=True,
            text=True,
            env=env,
        )
        assert got.stdout == want.stdout
    want = subprocess.run([NUMACTL, "-H"], capture_output=True, text=True).stdout
    got = subprocess.run(
        [sys.executable, "-m", "numa_utils", "numactl", "-H"],
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    strip = [x for x in want.splitlines() if " free: " not in x]
    assert [x for x in got.splitlines() if " free: " not in x] == strip
    if (
        "2.0.16"
        not in subprocess.run(
            ["dpkg-query", "-W", "numactl"], capture_output=True, text=True
        ).stdout
    ):
        pytest.skip("the distance table was compared as numactl 2.0.16 prints it")


def _exe(path, body):
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(body)
    path.chmod(0o755)
    return str(path)


def test_real_numactl_refuses_wrapper_scripts(tmp_path):
    find = _matrix().real_numactl
    shim = _exe(
        tmp_path / "shim" / "numactl", b'#!/bin/sh\nexec python3 -m numa_utils numactl "$@"\n'
    )
    other = _exe(tmp_path / "other" / "numactl", b'#!/bin/sh\nexec /opt/numactl "$@"\n')
    elf = _exe(tmp_path / "elf" / "numactl", b"\x7fELF\x02\x01\x01" + bytes(64))
    _exe(tmp_path / "noexec" / "numactl", b"\x7fELF")
    (tmp_path / "noexec" / "numactl").chmod(0o644)
    dirs = [str(tmp_path / d) for d in ("shim", "noexec", "other", "elf")]
    assert find(os.pathsep.join(dirs), fallback=()) == (elf, None)
    assert find(os.pathsep.join(dirs[:2]), fallback=[dirs[3]]) == (elf, None)
    exe, why = find(os.pathsep.join(dirs[:3]), fallback=())
    assert exe is None
    assert why == (
        f"no real numactl binary, only {shim} (a script around numa_utils), "
        f"{other} (not an ELF binary)"
    )
    assert find("", fallback=()) == (None, "no numactl binary on PATH or in ")


@pytest.mark.parametrize(
    "value,want", [("!0", {1, 2, 3}), ("+1-2", {1, 2}), ("0x3", {3}), ("1,3", {1, 3})]
)
def test_numa_nodes_takes_numactls_grammar(value, want, monkeypatch):
    """NUMA_NODES goes through the same parser (resolved against the region's machine)."""
    monkeypatch.setenv("NUMA_UTILS_NUMA_NODES", value)
    b = sim(FOUR)
    assert nur._region_policy("interleave", None, None, b, nur._ReadOnce(b))[1] == want
    monkeypatch.setenv("NUMA_UTILS_NUMA_NODES", "+9")
    with pytest.raises(ValueError, match="NUMA_NODES='\\+9'.*out of range"):
        nur._region_policy("interleave", None, None, b, nur._ReadOnce(b))


@pytest.mark.parametrize(
    "value",
    [
        "ip:kvcache.example.com",
        "ip:10.0.0.1",
        "netdev:eth0",
        "0,pci:3b:00.0",
        "file:/etc/hostname",
        "block:sda",
    ],
)
def test_numa_nodes_device_forms_never_reach_the_network(value, monkeypatch):
    """NUMA_NODES=ip:HOST made SharedRegion.create resolve HOST (a connect to port 53
    under strace).  The variable takes node lists and all; a device form is refused,
    named, before any resolver or socket call."""
    import socket

    calls = []

    def spy(name):
        def call(*a, **k):
            calls.append(name)
            raise AssertionError(f"{name} called from a region create")

        return call

    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "create_connection"):
        monkeypatch.setattr(socket, name, spy(name))
    monkeypatch.setattr(socket, "socket", spy("socket"))
    monkeypatch.setenv("NUMA_UTILS_NUMA_NODES", value)
    b = sim(FOUR)
    form = value.split(",")[-1].split(":")[0]
    with pytest.raises(ValueError, match=f"NUMA_NODES=.*device form `{form}:' is refused"):
        nur.SharedRegion.create("kv", 1 << 20, policy="interleave", backend=b)
    assert calls == []
    with pytest.raises(ValueError, match="device form"):
        nu.parse_nodestring(value, backend=b)  # every library path
    rep = cli.status_report(backend=b)
    assert any(
        w.startswith("configuration: NUMA_UTILS_NUMA_NODES=") and "device form" in w
        for w in rep["warnings"]
    ), rep["warnings"]
    assert calls == []


# -- shared memory forms (SysV under SimulatedBackend: the host's IPC is not touched) ----


def test_shm_creates_then_applies_policy_to_the_segment(tmp_path, capsys):
    b = sim(FOUR)
    keyfile = str(tmp_path / "key")
    argv = ["--length", "8m", "--shm", keyfile, "--interleave", "1,3", "--touch"]
    assert cli._cmd_numactl(argv, backend=b) == 0
    err = capsys.readouterr().err
    assert "Creating shm key file" in err and "length 8MB" in err
    st = os.stat(keyfile)
    key = (st.st_ino & 0xFFFF) | ((st.st_dev & 0xFF) << 16)  # ftok(keyfile, 0)
    (line,) = [x for x in b.render_numa_maps().splitlines() if f"SYSV{key:08x}" in x]
    assert " interleave:1,3 " in line and " N1=1024 N3=1024 " in line  # touched
    # attached again (no --length needed): a command after it is a usage error
    assert cli._cmd_numactl(["--shm", keyfile, "-m", "0", "true"], backend=b) == 1
    assert cli._cmd_numactl(["--shm", str(tmp_path / "new"), "-m", "0"], backend=b) == 1
    assert "need a --length" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["-N", "0", "--shm", "k"], "cannot do --cpubind on shared memory"),
        (["-i", "0", "--shm", "k"], "specify policy after --shm/--file"),
        (["--touch"], "--touch must be after shared memory specification"),
        (["--dump"], "Cannot do --dump without shared memory"),
        (["--shmmode", "9", "true"], "usage:"),
        (["--file", "/tmp/x", "--length", "4k"], "/dev/shm only"),
    ],
)
def test_shm_ordering_rules(argv, msg, capsys):
    assert cli._cmd_numactl(argv, backend=sim(FOUR), execvp=lambda *a: None) == 1
    assert msg in capsys.readouterr().err


def test_run_node_takes_numactls_grammar():
    b = saved_backend(fixture_root("container-cpuset"))
    assert cli._single_node("+0", b) == 1  # the cpuset's first node
    with pytest.raises(ValueError, match="2 nodes, not one"):
        cli._single_node("0,1", saved_backend(fixture_root(FOUR)))
    with pytest.raises(ValueError, match="out of range"):
        cli._single_node("0", b)


def test_main_hands_numactl_its_raw_arguments(capsys):
    """argparse never sees numactl's options (it would mis-parse `-i 0 cmd -i 1`)."""
    rc = nu.main(["-v", "numactl", "--bogus"])
    assert rc == 1 and "unrecognized option '--bogus'" in capsys.readouterr().err
