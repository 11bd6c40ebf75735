# SPDX-License-Identifier: Apache-2.0
"""Seeded fuzzing (issue 12): corrupted copies of every fixture tree, random and
mutated parser inputs, and random command lines.  Nothing may hang, raise anything
but ValueError from a parser, print a traceback, or read outside a saved tree.

The normal tier runs a small, fixed amount; NUMA_UTILS_TEST_FUZZ_ITERATIONS=N
multiplies it (`tox -e fuzz`).  Seeds are fixed: a failure names its seed.
"""

import contextlib
import io
import os
import random
import shutil
import signal
import string

import pytest
from conftest import (
    FIXTURES,
    cli,
    fixture_archive,
    fixture_root,
    fixture_text,
    fixture_tree,
    nu,
    nur,
    saved_backend,
)

SCALE = max(1, int(os.environ.get("NUMA_UTILS_TEST_FUZZ_ITERATIONS", "1")))
SECRET = "OUTSIDE-THE-TREE-7f3a"


@contextlib.contextmanager
def deadline(seconds, what):
    """Fail (instead of hanging the run) when the body takes longer than ``seconds``."""

    def expired(signum, frame):
        raise AssertionError(f"{what}: still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- corrupted copies of every fixture tree ----------------------------------------------

HOSTILE_TEXTS = [
    "",
    "\n",
    "\0",
    "0-16777215",
    "0-16777216\n",
    "9" * 400,
    "0-8191",
    "x" * 5000,
    "³",
    "0-3,\u00b3",
    "-1",
    "0x",
    "0-3:0/0",
    "Node 0 MemTotal: " + "9" * 400 + " kB\n",
    "MemTotal:\n",
    "10 " * 5000,
    "ffffffff," * 2000,
    "\u2028\x85\x1c",
    "[always]",
]


def _replace(path, rnd):
    """Swap ``path`` (a file of the copy, hard-linked to the fixture) for something
    hostile.  Always unlink first: writing in place would change the fixture."""
    kind = rnd.choice(["text", "bytes", "fifo", "devzero", "escape", "dir", "truncate", "loop"])
    old = open(path, "rb").read()
    os.unlink(path)
    if kind == "text":
        open(path, "w").write(rnd.choice(HOSTILE_TEXTS))
    elif kind == "bytes":
        open(path, "wb").write(bytes(rnd.randrange(256) for _ in range(rnd.randrange(64))))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        os.symlink("/dev/zero", path)
    elif kind == "escape":
        os.symlink("../" * 12 + "secret", path)
    elif kind == "dir":
        os.mkdir(path)
    elif kind == "truncate":
        open(path, "wb").write(old[: len(old) // 2])
    else:
        os.symlink(os.path.basename(path), path)  # a loop onto itself
    return kind


def _corrupt_tree(root, rnd, n):
    files = []
    dirs = []
    for dirpath, dnames, fnames in os.walk(root):
        files += [os.path.join(dirpath, f) for f in fnames]
        dirs += [os.path.join(dirpath, d) for d in dnames]
    done = []
    for path in rnd.sample(files, min(n, len(files))):
        if os.path.isfile(path) and not os.path.islink(path):
            done.append((os.path.relpath(path, root), _replace(path, rnd)))
    if dirs and rnd.random() < 0.5:  # a directory becomes a file
        d = rnd.choice(dirs)
        if os.path.isdir(d) and not os.path.islink(d):
            shutil.rmtree(d)
            open(d, "w").write("0-16777215\n")
            done.append((os.path.relpath(d, root), "dir->file"))
    node = os.path.join(root, "sys/devices/system/node")
    if os.path.isdir(node) and rnd.random() < 0.3:
        os.mkdir(os.path.join(node, "node\u00b3"))
    return done


@pytest.mark.parametrize("name", FIXTURES)
def test_corrupted_fixture_trees(tmp_path, name):
    (tmp_path / "secret").write_text(f"Cpus_allowed_list:\t{SECRET}\n{SECRET}\n")
    for round_ in range(SCALE):
        seed = f"{name}/{round_}"
        rnd = random.Random(seed)
        root = tmp_path / f"r{round_}" / "root"
        fixture_tree(name, root)
        os.symlink("../../secret", tmp_path / f"r{round_}" / "secret")
        done = _corrupt_tree(str(root), rnd, 12)
        b = saved_backend(str(root))
        with deadline(20, f"seed {seed} ({done})"):
            topo = nu.read_topology(backend=b)
            rep = cli.status_report(backend=b)
            text = cli._render_status(rep) + cli._render_prometheus(rep)
            nur.counters(backend=b)
        assert SECRET not in text + repr(topo), seed
        assert all(c < nu.MAX_CPUS for c in topo.cpus), seed
        assert all(n < nu.MAX_NODES for n in topo.nodes), seed
        shutil.rmtree(root.parent)


# -- parsers: random and mutated inputs --------------------------------------------------


def _samples(relname):
    """Real texts of one kind of file, from every fixture."""
    out = []
    for name in FIXTURES:
        for rel, data in sorted(fixture_archive(name).files.items()):
            if rel.rpartition("/")[2] == relname:
                out.append(data.decode("utf-8", "replace"))
                if len(out) > 40:
                    return out
    return out


ALPHABET = string.digits + "-,:/ abcdefABCDEFxX\n\t\0" + "\u00b3\u2028\x85" + "kBNode="


def _mutate(text, rnd):
    s = list(text)
    for _ in range(rnd.randrange(1, 6)):
        op = rnd.randrange(4)
        i = rnd.randrange(len(s) + 1)
        if op == 0:
            s.insert(i, rnd.choice(ALPHABET))
        elif op == 1 and s:
            del s[min(i, len(s) - 1)]
        elif op == 2:
            s.insert(i, rnd.choice(HOSTILE_TEXTS))
        elif s:
            s[min(i, len(s) - 1)] = rnd.choice(ALPHABET)
    return "".join(s)


def _inputs(seed, samples, n):
    rnd = random.Random(seed)
    for _ in range(n):
        r = rnd.random()
        if r < 0.4 and samples:
            yield _mutate(rnd.choice(samples), rnd)
        elif r < 0.8:
            yield "".join(rnd.choice(ALPHABET) for _ in range(rnd.randrange(80)))
        else:
            yield rnd.choice(HOSTILE_TEXTS) * rnd.randrange(1, 4)


def _cpulist(t):
    got = nu.parse_cpulist(t)
    assert all(0 <= c < nu.MAX_CPUS for c in got)


def _cpumap(t):
    got = nu.parse_cpumap(t)
    assert all(0 <= c < nu.MAX_CPUS for c in got)


def _meminfo(t):
    got = nu.parse_meminfo(t)
    assert all(0 <= v < 1 << 67 for v in got.values())
    nu.format_kib(max(got.values(), default=0))


def _distance(t):
    assert all(0 < d <= 255 for d in nu.parse_distance_row(t))


def _numa_maps(t):
    for e in nu.parse_numa_maps(t):
        assert all(0 <= n < nu.MAX_NODES for n in e.nodes)
        e.to_json()


def _size(t):
    assert 0 <= nu.parse_size(t) < 1 << 64


PARSERS = [
    ("cpulist", _cpulist, "cpulist"),
    ("cpumap", _cpumap, "cpumap"),
    ("meminfo", _meminfo, "meminfo"),
    ("distance", _distance, "distance"),
    ("numa_maps", _numa_maps, None),
    ("size", _size, None),
]


@pytest.mark.parametrize("name,check,sample", PARSERS, ids=[p[0] for p in PARSERS])
def test_parsers_raise_only_valueerror(name, check, sample):
    samples = _samples(sample) if sample else []
    if name == "numa_maps":
        samples = [
            "7f0000000000 bind:0-1 anon=4 dirty=4 N0=2 N1=2 kernelpagesize_kB=4\n"
            "7f0000200000 interleave=static|relative:0,2 file=/dev/shm/a\\040b mapped=1 "
            "N0=1 kernelpagesize_kB=2048\n",
            "55d0 default heap anon=9 dirty=9 active=0 N0=9 kernelpagesize_kB=4\n",
        ]
    if name == "size":
        samples = ["64M", "1.5G", "4096", "2T", "0.5k"]
    with deadline(60, name):
        for i, text in enumerate(_inputs(name, samples, 1500 * SCALE)):
            try:
                check(text)
            except ValueError:
                pass
            except Exception as e:  # anything else is a bug: say which input
                raise AssertionError(f"{name} input #{i} {text[:200]!r}: {e!r}") from e


def test_parsers_linear_on_long_inputs():
    """1 MB inputs: seconds at most (parse_cpumap was quadratic: > 60 s)."""
    rnd = random.Random(7)
    big = {
        "cpulist": ",".join(str(rnd.randrange(8192)) for _ in range(150000)),
        "cpumap": ",".join(f"{rnd.randrange(1 << 32):08x}" for _ in range(110000)),
        "meminfo": "".join(f"K{i}: {i} kB\n" for i in range(60000)),
    }
    with deadline(30, "long inputs"):
        for name, text in big.items():
            try:
                dict((p[0], p[1]) for p in PARSERS)[name](text)
            except ValueError:
                pass


# -- command lines -----------------------------------------------------------------------

VALUES = [
    "0",
    "1",
    "-5",
    "-5M",
    "64M",
    "9" * 400,
    "inf",
    "nan",
    "0-16777216",
    "self",
    "999999",
    "",
    "\u00b3",
    "1e300",
    "0x10",
    "../../etc",
    "1023",
]
OPTIONS = {
    "status": ["--json", ("--format", ["text", "json", "prometheus", "x"])],
    "maps": [
        "--json",
        "--all",
        ("--min-size", VALUES),
        ("--page-kb", VALUES),
        ("--file", ["/nonexistent", "/dev/null"]),
        ("", VALUES),
    ],
    "cleanup": ["--json", ("--key", VALUES)],
    "region": [
        "--json",
        "--keep",
        "--no-prefault",
        ("", VALUES),
        ("", VALUES),
        ("--nodes", VALUES),
        ("--policy", ["bind", "interleave", "x"]),
        ("--kind", ["sysv", "posix"]),
        ("--hugepages", VALUES),
        ("--threads", VALUES),
    ],
    "plan": [
        "--json",
        ("--gpu", VALUES),
        ("--reserve", VALUES),
        ("--format", ["text", "systemd", "numactl"]),
    ],
    "watch": ["--json", ("--pid", VALUES), ("--interval", VALUES)],
    "run": [("--gpu", VALUES), ("--node", VALUES), ("--", ["true"])],
}


def _argv(rnd, root):
    cmd = rnd.choice(sorted(OPTIONS))
    argv = [cmd]
    for _ in range(rnd.randrange(5)):
        opt = rnd.choice(OPTIONS[cmd])
        if isinstance(opt, str):
            argv.append(opt)
        else:
            flag, vals = opt
            argv += ([flag] if flag else []) + [rnd.choice(vals)]
    # Every command reads the saved tree (run and region refuse it: nothing is
    # created or executed here); watch is kept to one short sample.
    argv += ["--root", root]
    if cmd == "watch":
        argv += ["--count", "1", "--interval", "0.01"]
    return argv


def test_cli_argument_fuzz():
    root = fixture_root("dual-socket-8gpu")
    rnd = random.Random("cli")
    for i in range(60 * SCALE):
        argv = _argv(rnd, root)
        out, err = io.StringIO(), io.StringIO()
        with deadline(20, f"argv #{i} {argv}"), contextlib.redirect_stdout(
            out
        ), contextlib.redirect_stderr(err):
            try:
                rc = nu.main(argv)
            except SystemExit as e:  # argparse: usage errors and --help
                rc = e.code
        assert rc in (0, 1, 2), (argv, rc, err.getvalue())
        assert "Traceback" not in err.getvalue(), (argv, err.getvalue())
        if rc == 2:
            msgs = [
                ln
                for ln in err.getvalue().splitlines()
                if ln and not ln.startswith(("usage:", " ", "WARNING"))
            ]
            assert len(msgs) == 1, (argv, err.getvalue())


def test_repo_fixture_copies_untouched():
    """The corrupted trees were copies: the fixtures must be intact."""
    for name in FIXTURES:
        nu.read_topology(backend=saved_backend(fixture_root(name)))
    assert fixture_text("dual-socket-8gpu", "root/sys/devices/system/cpu/online").strip()
