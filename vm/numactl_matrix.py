# SPDX-License-Identifier: Apache-2.0
"""Runs inside a vm/ guest that has Debian's numactl: for every command line of
numactl_matrix.txt, run

    numactl ARGS numactl --show
    python3 -m numa_utils numactl ARGS numactl --show

and print one ``NUMACTL {json}`` line per command line: both exit statuses, both
outputs and whether they match (exit status and stdout, with the next-interleave
node masked; --hardware also with the free-memory figures masked and blanks
collapsed; for file= lines also the policy and per-node pages of the file's
numa_maps line). stderr is recorded,
not compared (messages may be worded differently). When numa_utils has no
``numactl`` subcommand one ``NUMACTL {"skip": reason}`` line is printed instead.
NUMACTL_MATRIX_SELFTEST=1 compares numactl with itself (every line must match: a
check of the harness).  "numactl" is the real binary (real_numactl): a wrapper
script on PATH, such as the docs' shim around numa_utils, is refused, since
comparing numa_utils with itself proves nothing.

    python3 /vmtest/numactl_matrix.py /vmtest/numactl_matrix.txt
"""

import json
import os
import py_compile
import re
import shlex
import subprocess
import sys
import time

CGROUP = "/sys/fs/cgroup"
CPUSET = f"{CGROUP}/numactl_matrix"


def real_numactl(path=None, fallback=("/usr/bin", "/bin")):
    """(absolute path, None) of the first numactl on PATH, then /usr/bin and /bin,
    that is an ELF executable; (None, why) when there is none.  Anything else named
    numactl (a ``#!`` script such as ``exec python3 -m numa_utils numactl``) is
    skipped, and named in ``why`` when nothing real is found."""
    dirs = (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep)
    refused = []
    for d in dirs + list(fallback):
        exe = os.path.join(d or ".", "numactl")
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            continue
        exe = os.path.abspath(exe)
        with open(exe, "rb") as fh:
            head = fh.read(4096)
        if head[:4] == b"\x7fELF":
            return exe, None
        if exe not in refused:
            refused.append(
                exe
                + (
                    " (a script around numa_utils)"
                    if b"numa_utils" in head
                    else " (not an ELF binary)"
                )
            )
    if refused:
        return None, "no real numactl binary, only " + ", ".join(refused)
    return None, "no numactl binary on PATH or in " + " ".join(fallback)


def parse(path):
    """[(args, tags)] from the data file."""
    out = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            args, _, tags = line.partition(" | ")
            if args.endswith(" |"):
                args, tags = args[:-2], ""
            out.append((shlex.split(args), tags.split()))
    return out


def numactl_version(numactl="numactl"):
    """(2, 0, 19) from `numactl --version` (2.0.19+); (2, 0, 0) when it has none."""
    res = subprocess.run(
        [numactl, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", res.stdout) if res.returncode == 0 else None
    return tuple(int(x) for x in m.groups()) if m else (2, 0, 0)


def make_cpuset():
    """A cgroup v2 child with cpuset.cpus=1, cpuset.mems=1 (commands tagged cpuset)."""
    if not os.path.exists(f"{CGROUP}/cgroup.controllers"):
        subprocess.run(["mount", "-t", "cgroup2", "none", CGROUP], check=True)
    with open(f"{CGROUP}/cgroup.subtree_control", "w") as fh:
        fh.write("+cpuset")
    os.makedirs(CPUSET, exist_ok=True)
    for name, value in (("cpuset.cpus", "1"), ("cpuset.mems", "1")):
        with open(f"{CPUSET}/{name}", "w") as fh:
            fh.write(value)


def enter_cpuset():
    """Move this process (and so every later child) into the cpuset: once, since a
    move migrates the mover's memory (cgroup v2), which takes seconds under TCG."""
    with open(f"{CPUSET}/cgroup.procs", "w") as fh:
        fh.write("0")


def file_probe(path):
    """Map the tmpfs file, read every page in, and return its numa_maps line's policy
    and per-node pages (what the policy the command set did to the file)."""
    if not os.path.exists(path):
        return "no file"
    code = (
        "import mmap, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "size = os.fstat(fd).st_size\n"
        "if not size: print('empty'); sys.exit()\n"
        "mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)\n"
        "off = 0\n"
        "while off < size:\n"  # fault in only the pages that exist (a hole would be
        "    try:\n"  # allocated by this read, under this process's policy)
        "        off = os.lseek(fd, off, os.SEEK_DATA)\n"
        "    except OSError:\n"
        "        break\n"
        "    end = os.lseek(fd, off, os.SEEK_HOLE)\n"
        "    sum(mm[i] for i in range(off, end, mmap.PAGESIZE))\n"
        "    off = end\n"
        "for line in open('/proc/self/numa_maps'):\n"
        "    if 'file=' + sys.argv[1] in line:\n"
        "        t = line.split()\n"
        "        print(' '.join([t[1]] + [x for x in t if x[:1] == 'N' and '=' in x]))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, path],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    return res.stdout.strip()


def mask(text, hardware):
    """The figures that are not the policy's: free memory (--hardware), and the next
    interleave node, a per-task counter advanced by every page the parent allocated
    between set_mempolicy and exec (numactl against itself differs there too)."""
    if hardware:
        # Free memory moves; the distance table's column widths differ between
        # numactl 2.0.16 and 2.0.19 (numa_utils prints 2.0.19's): compare its fields.
        text = re.sub(r"^(node \d+ free:) \d+ MB$", r"\1 * MB", text, flags=re.M)
        text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r"^(preferred node:) \d+ (\(interleave next\))$", r"\1 * \2", text, flags=re.M)
    return re.sub(r"^(interleavenode:) \d+$", r"\1 *", text, flags=re.M)


def run_one(argv, tags, timeout=60):
    for tag in tags:
        if tag.startswith("file="):
            try:
                os.unlink(tag[5:])
            except FileNotFoundError:
                pass
    t0 = time.monotonic()
    try:
        res = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        out = {"rc": res.returncode, "out": res.stdout, "err": res.stderr[-600:]}
    except subprocess.TimeoutExpired:
        out = {"rc": "timeout", "out": "", "err": ""}
    out["seconds"] = round(time.monotonic() - t0, 2)
    for tag in tags:
        if tag.startswith("file="):
            out["file"] = file_probe(tag[5:])
    return out


def compare(a, b, hardware):
    why = []
    if a["rc"] != b["rc"]:
        why.append(f"exit status {a['rc']} != {b['rc']}")
    if mask(a["out"], hardware) != mask(b["out"], hardware):
        why.append("stdout differs")
    if a.get("file") != b.get("file"):
        why.append(f"file placement {a.get('file')!r} != {b.get('file')!r}")
    return why


def main(argv):
    data = argv[1] if len(argv) > 1 else "/vmtest/numactl_matrix.txt"
    numactl, why = real_numactl()
    if numactl is None:
        print("NUMACTL " + json.dumps({"skip": why}), flush=True)
        return 0
    nu_cmd = [sys.executable, "-m", "numa_utils", "numactl"]
    if os.environ.get("NUMACTL_MATRIX_SELFTEST"):
        # numactl against itself: proves the harness (every line must match).
        nu_cmd = [numactl]
    # The guest writes no bytecode (PYTHONDONTWRITEBYTECODE): compile numa_utils
    # once so each of the ~60 runs does not compile 7,000 lines under emulation.
    try:
        py_compile.compile("/vmtest/numa_utils.py", doraise=True)
    except (OSError, py_compile.PyCompileError) as exc:
        print(f"NUMACTL_NOTE cannot precompile numa_utils: {exc}")
    # numa_utils without the subcommand: argparse's "invalid choice", exit 2. (Its
    # --help exits 1 as numactl's does: an unrecognized option.)
    probe = subprocess.run(
        nu_cmd + ["--show"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if nu_cmd == [numactl]:
        probe.returncode = 0
    version = numactl_version(numactl)
    print(
        f"NUMACTL_NOTE numactl {numactl} " + ".".join(map(str, version)) + " (2.0.0: no --version, "
        "older than 2.0.19); numa_utils numactl --show exit " + str(probe.returncode),
        flush=True,
    )
    if probe.returncode != 0:
        reason = (
            "numa_utils has no `numactl` subcommand yet (python3 -m numa_utils "
            f"numactl --show exits {probe.returncode}: {probe.stdout.strip()[-200:]})"
        )
        print("NUMACTL " + json.dumps({"skip": reason}), flush=True)
        return 0
    lines = parse(data)
    # The cpuset lines last: the harness enters the cgroup once, before the first.
    lines = [x for x in lines if "cpuset" not in x[1]] + [x for x in lines if "cpuset" in x[1]]
    in_cpuset = False
    bad = 0
    for args, tags in lines:
        if "2.0.19" in tags and version < (2, 0, 19):
            continue
        if "known-2.0.19" in tags:  # a known difference against 2.0.19 only
            tags = [
                "known" if t == "known-2.0.19" else t
                for t in tags
                if t != "known-2.0.19" or version >= (2, 0, 19)
            ]
        if "cpuset" in tags and not in_cpuset:
            make_cpuset()
            enter_cpuset()
            in_cpuset = True
        tail = [] if "nocmd" in tags else [numactl, "--show"]
        a = run_one([numactl, *args, *tail], tags)
        b = run_one([*nu_cmd, *args, *tail], tags)
        hardware = any(x in ("-H", "--hardware") for x in args)
        why = compare(a, b, hardware)
        bad += bool(why) and "known" not in tags
        print(
            "NUMACTL "
            + json.dumps(
                {
                    "args": args,
                    "tags": tags,
                    "match": not why,
                    "why": why,
                    "numactl": a,
                    "numa_utils": b,
                }
            ),
            flush=True,
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
