#!/usr/bin/env python3
# ruff: noqa: UP031  (printf-style on purpose: it mirrors the kernel's formats)
"""Save the parts of /sys and /proc that numa_utils reads into a fixture folder.

Usage:
    python3 tools/gather.py --archive FILE.txt      # one file to send: a text archive
    python3 tools/gather.py --archive FILE.tar.gz   # the same as a gzip'd tar (either
                                                    # name as OUTDIR: same thing)
    python3 tools/gather.py OUTDIR              # a folder, from the running machine
    python3 tools/gather.py --root TREE OUTDIR  # from another filesystem root

Writes OUTDIR/root/ (a filesystem root holding sys/ and proc/, byte-for-byte
copies of the files read, including odd endings such as "\\n\\0") and
OUTDIR/SOURCE.md (kernel, machine, date, what was skipped and why).
OUTDIR/expected.json is not written: a person writes it after checking the files.
An archive holds the same root/ and SOURCE.md (and the tree's own relative links);
`numa_utils status --root FILE` reads it in place.  The text archive is the format
fake_sysfs/ keeps its machines in (fake_sysfs/README.md describes it); pack_text()
and folder_files() below write it.

Stdlib only and only modules that Debian's python3.X-minimal ships (os, sys, re,
argparse, time), so it runs inside a bare QEMU guest. Python 3.8+.

Symlinks are followed only when their target stays inside the root; anything
that resolves outside it is skipped with a note. Unreadable files (EACCES, EIO,
write-only attributes) are skipped with a note, never fatal.
"""

import argparse
import os
import re
import sys
import time

NODE_FILES = (
    "online",
    "possible",
    "has_cpu",
    "has_memory",
    "has_normal_memory",
    "has_generic_initiator",
    "has_high_memory",
)
NODE_DIR_FILES = ("cpulist", "cpumap", "meminfo", "distance", "numastat", "vmstat")
HUGEPAGE_NODE_FILES = ("nr_hugepages", "free_hugepages", "surplus_hugepages")
HUGEPAGE_GLOBAL_FILES = (
    "nr_hugepages",
    "free_hugepages",
    "surplus_hugepages",
    "resv_hugepages",
    "nr_overcommit_hugepages",
)
HMAT_FILES = ("read_bandwidth", "write_bandwidth", "read_latency", "write_latency")
CPU_FILES = ("possible", "present", "online", "offline", "kernel_max")
CPU_TOPOLOGY_FILES = (
    "core_id",
    "physical_package_id",
    "die_id",
    "cluster_id",
    "thread_siblings_list",
    "thread_siblings",
    "core_cpus_list",
    "core_cpus",
    "core_siblings_list",
    "package_cpus_list",
)
CPU_CACHE_FILES = ("level", "type", "shared_cpu_list", "shared_cpu_map", "size")
PCI_FILES = (
    "vendor",
    "device",
    "class",
    "subsystem_vendor",
    "subsystem_device",
    "numa_node",
    "local_cpulist",
    "local_cpus",
)
# osrelease and arch (Linux 6.1+) tell `status --root` which machine the tree is from;
# max_map_count is the limit fit() weighs a layout's memory mappings against.
PROC_FILES = (
    "proc/meminfo",
    "proc/version",
    "proc/sys/kernel/numa_balancing",
    "proc/sys/vm/max_map_count",
    "proc/sys/kernel/osrelease",
    "proc/sys/kernel/ostype",
    "proc/sys/kernel/arch",
)
SYS_FILES = (
    "sys/kernel/mm/transparent_hugepage/enabled",
    "sys/kernel/mm/transparent_hugepage/defrag",
)

NUMBERED = re.compile(r"^(node|cpu|index)(\d+)$")


class Gatherer:
    def __init__(self, root, out_root):
        self.root = os.path.realpath(root)
        self.out_root = out_root
        self.copied = 0
        self.notes = []  # (relative path, reason)

    # -- paths -------------------------------------------------------------
    def src(self, rel):
        return os.path.join(self.root, rel)

    def inside(self, rel):
        """True when rel, with every symlink resolved, stays inside the root."""
        real = os.path.realpath(self.src(rel))
        return real == self.root or real.startswith(self.root.rstrip("/") + "/")

    def listdir(self, rel, pattern=None):
        """Names in a directory of the root (sorted numerically), [] if absent."""
        path = self.src(rel)
        if not os.path.isdir(path):
            return []
        if not self.inside(rel):
            self.notes.append((rel + "/", "skipped: resolves outside the root"))
            return []
        try:
            names = os.listdir(path)
        except OSError as exc:
            self.notes.append((rel + "/", f"not listable: {_why(exc)}"))
            return []
        if pattern is not None:
            names = [n for n in names if re.match(pattern, n)]
        return sorted(names, key=_natural)

    # -- copying -------------------------------------------------------------
    def copy(self, rel, dest_rel=None, quiet_missing=True):
        """Copy one file of the root into out_root (at dest_rel, default rel)."""
        path = self.src(rel)
        if not os.path.lexists(path):
            if not quiet_missing:
                self.notes.append((rel, "absent"))
            return False
        if not self.inside(rel):
            self.notes.append((rel, "skipped: resolves outside the root"))
            return False
        if not os.path.isfile(path):
            self.notes.append((rel, "skipped: not a regular file"))
            return False
        try:
            data = _read_bytes(path)
        except OSError as exc:
            self.notes.append((rel, f"unreadable: {_why(exc)}"))
            return False
        dest = os.path.join(self.out_root, dest_rel or rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as fh:
            fh.write(data)
        self.copied += 1
        return True

    def link(self, rel, target):
        """Save a symlink of the root (an HMAT initiator) as a relative link."""
        if not os.path.islink(self.src(rel)):
            return
        dest = os.path.join(self.out_root, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if not os.path.lexists(dest):
            os.symlink(target, dest)
        self.copied += 1

    def copy_numa_maps(self):
        """This process's proc/self/numa_maps without its file lines (they name the
        host's paths): its kernelpagesize_kB gives the tree's base page size."""
        rel = "proc/self/numa_maps"
        path = self.src(rel)
        if not os.path.isfile(path) or not self.inside(rel):
            return
        try:
            text = _read_bytes(path).decode("utf-8", "replace")
        except OSError as exc:
            self.notes.append((rel, f"unreadable: {_why(exc)}"))
            return
        keep = [ln for ln in text.splitlines() if " file=" not in ln]
        dest = os.path.join(self.out_root, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "w") as fh:
            fh.write("\n".join(keep) + "\n")
        self.copied += 1

    # -- the parts numa_utils reads ----------------------------------------
    def gather(self, self_status=True):
        node = "sys/devices/system/node"
        for name in NODE_FILES:
            self.copy(f"{node}/{name}")
        for name in self.listdir(node, r"^node\d+$"):
            base = f"{node}/{name}"
            for f in NODE_DIR_FILES:
                self.copy(f"{base}/{f}")
            hp = base + "/hugepages"
            for size in self.listdir(hp, r"^hugepages-\d+kB$"):
                for f in HUGEPAGE_NODE_FILES:
                    self.copy(f"{hp}/{size}/{f}")
            # HMAT (Documentation/admin-guide/mm/numaperf.rst): figures, and the
            # initiator links, saved as the same relative links.
            for acc in self.listdir(base, r"^access\d+$"):
                ini = f"{base}/{acc}/initiators"
                for f in HMAT_FILES:
                    self.copy(f"{ini}/{f}")
                for link in self.listdir(ini, r"^node\d+$"):
                    self.link(f"{ini}/{link}", f"../../../{link}")
        tiers = "sys/devices/virtual/memory_tiering"
        for name in self.listdir(tiers, r"^memory_tier\d+$"):
            self.copy(f"{tiers}/{name}/nodelist")

        cpu = "sys/devices/system/cpu"
        for name in CPU_FILES:
            self.copy(f"{cpu}/{name}")
        for name in self.listdir(cpu, r"^cpu\d+$"):
            base = f"{cpu}/{name}"
            self.copy(base + "/online")
            for f in CPU_TOPOLOGY_FILES:
                self.copy(f"{base}/topology/{f}")
            for idx in self.listdir(base + "/cache", r"^index\d+$"):
                for f in CPU_CACHE_FILES:
                    self.copy(f"{base}/cache/{idx}/{f}")

        pci = "sys/bus/pci/devices"
        for addr in self.listdir(pci, r"^[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$"):
            # The entries are symlinks into sys/devices/pci*/; saved as plain
            # directories under the same sys/bus/pci/devices/<address>/ name.
            if not self.inside(f"{pci}/{addr}"):
                self.notes.append((f"{pci}/{addr}", "skipped: resolves outside the root"))
                continue
            for f in PCI_FILES:
                self.copy(f"{pci}/{addr}/{f}")

        for rel in SYS_FILES:
            self.copy(rel)
        hp = "sys/kernel/mm/hugepages"
        for size in self.listdir(hp, r"^hugepages-\d+kB$"):
            for f in HUGEPAGE_GLOBAL_FILES:
                self.copy(f"{hp}/{size}/{f}")
        wi = "sys/kernel/mm/mempolicy/weighted_interleave"
        for name in self.listdir(wi, r"^(node\d+|auto)$"):
            self.copy(f"{wi}/{name}")

        for rel in PROC_FILES:
            self.copy(rel)
        if self_status:
            # On the running system this is the status of this very process
            # (its cpuset: Cpus_allowed_list, Mems_allowed_list).
            self.copy("proc/self/status", quiet_missing=False)
            self.copy_numa_maps()
        nv = "proc/driver/nvidia/gpus"
        for bus in self.listdir(nv):
            self.copy(f"{nv}/{bus}/information")


def _natural(name):
    m = NUMBERED.match(name)
    if m:
        return (m.group(1), int(m.group(2)), "")
    return ("~", 0, name)


def _why(exc):
    return os.strerror(exc.errno) if getattr(exc, "errno", None) else str(exc)


def _read_bytes(path):
    # sysfs reports st_size 4096 for every attribute; read to EOF instead.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _first_line(path, prefixes):
    try:
        with open(path, errors="replace") as fh:
            for line in fh:
                for p in prefixes:
                    if line.lower().startswith(p.lower()):
                        return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _text(path):
    try:
        with open(path, errors="replace") as fh:
            return fh.read().strip().replace("\0", "")
    except OSError:
        return None


def write_source(outdir, g, running, argv):
    lines = ["# Source", ""]
    lines.append(
        "Gathered with `python3 tools/gather.py{}` on {}.".format(
            "" if running else " --root <tree>",
            time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        )
    )
    lines.append("")
    if running:
        u = os.uname()
        lines.append("From the running system:")
        lines.append("")
        lines.append(f"- uname: `{u.sysname} <host> {u.release} {u.version} {u.machine}`")
    else:
        lines.append(
            "From a filesystem root given with --root (its path is not recorded); "
            "kernel facts below come from that tree."
        )
        lines.append("")
        rel = _text(g.src("proc/sys/kernel/osrelease"))
        if rel:
            lines.append(f"- kernel release: `{rel}`")
    ver = _text(g.src("proc/version"))
    if ver:
        lines.append(f"- /proc/version: `{ver}`")
    if running:
        model = _first_line("/proc/cpuinfo", ("model name", "cpu\t", "Hardware", "machine"))
        if model:
            lines.append(f"- CPU: `{model}`")
        for f in ("sys_vendor", "product_name"):
            v = _text("/sys/class/dmi/id/" + f)
            if v:
                lines.append(f"- DMI {f}: `{v}`")
    lines.append(f"- python: `{sys.version.split()[0]}`")
    lines.append("- files copied: %d" % g.copied)
    lines.append("")
    if g.notes:
        lines.append("## Skipped")
        lines.append("")
        for rel, why in g.notes:
            lines.append(f"- `{rel}`: {why}")
        lines.append("")
    with open(os.path.join(outdir, "SOURCE.md"), "w") as fh:
        fh.write("\n".join(lines))


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="gather.py",
        description="Save the sysfs/procfs files numa_utils reads into OUTDIR/root/.",
    )
    ap.add_argument(
        "outdir",
        nargs="?",
        default=None,
        help="fixture folder to create (root/ and SOURCE.md go in it); a name "
        "ending in .txt, .tar.gz or .tgz writes an archive instead",
    )
    ap.add_argument(
        "--archive",
        metavar="FILE",
        default=None,
        help="write one file (root/ and SOURCE.md) instead of a folder: a text "
        "archive (FILE.txt, as fake_sysfs/ keeps them) or, for a name "
        "ending in .tar.gz or .tgz, a gzip'd tar",
    )
    ap.add_argument(
        "--root", default="/", help="filesystem root to read (default: the running system, /)"
    )
    ap.add_argument(
        "--no-self-status",
        action="store_true",
        help="do not record proc/self/status (the gatherer's cpuset)",
    )
    ap.add_argument(
        "--force", action="store_true", help="write into OUTDIR even if OUTDIR/root already exists"
    )
    args = ap.parse_args(argv)
    if args.archive is None and args.outdir and args.outdir.endswith((".tar.gz", ".tgz", ".txt")):
        args.archive, args.outdir = args.outdir, None
    if args.archive is not None:
        if args.outdir is not None:
            ap.error("give OUTDIR or --archive FILE, not both")
        return _write_archive(args, argv)
    if args.outdir is None:
        ap.error("give OUTDIR (a folder) or --archive FILE.tar.gz")

    out_root = os.path.join(args.outdir, "root")
    if os.path.exists(out_root) and not args.force:
        sys.stderr.write(f"gather.py: {out_root} exists; use --force to add to it\n")
        return 2
    if not os.path.isdir(args.root):
        sys.stderr.write(f"gather.py: root {args.root} is not a directory\n")
        return 2
    os.makedirs(out_root, exist_ok=True)
    running = os.path.realpath(args.root) == "/"
    g = Gatherer(args.root, out_root)
    g.gather(self_status=not args.no_self_status)
    write_source(args.outdir, g, running, argv)
    sys.stdout.write(
        "gather.py: %d files into %s, %d skipped (see SOURCE.md)\n"
        % (g.copied, out_root, len(g.notes))
    )
    for rel, why in g.notes:
        sys.stdout.write(f"  {rel}: {why}\n")
    return 0


# -- the text archive (one file per saved machine; format in fake_sysfs/README.md) ----
TEXT_HEADER = b"# numa_utils saved tree: text archive v1 (format: fake_sysfs/README.md)\n"


def _quote(name):
    """A path or link target on one header line: %XX for '%', spaces, controls and
    bytes outside ASCII."""
    raw = os.fsencode(name)
    return "".join(chr(c) if 0x20 < c < 0x7F and c != 0x25 else "%%%02X" % c for c in raw)


def pack_text(files):
    """{relative path: bytes, or ("symlink", target), or ("dir",)} as a text archive."""
    import base64

    out = [TEXT_HEADER]
    for rel in sorted(files):
        v = files[rel]
        head = ">>> " + _quote(rel)
        if isinstance(v, tuple) and v[0] == "symlink":
            out.append((head + " -> " + _quote(v[1]) + "\n").encode())
            continue
        if isinstance(v, tuple):
            out.append((head + "/\n").encode())
            continue
        try:
            v.decode("utf-8")
            text = b"\0" not in v and b"\r" not in v
        except UnicodeDecodeError:
            text = False
        if not text:
            b64 = base64.b64encode(v)
            out.append((head + " base64\n").encode())
            out.extend(b64[i : i + 76] + b"\n" for i in range(0, len(b64), 76))
            continue
        lines = v.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        else:
            head += " noeol"
        out.append((head + "\n").encode())
        out.extend((b"\\" + ln if ln.startswith((b">>> ", b"\\")) else ln) + b"\n" for ln in lines)
    return b"".join(out)


def folder_files(base):
    """A folder's files, links and empty folders, keyed by path relative to it."""
    out = {}
    for dirpath, dirs, names in os.walk(base):
        for nm in names + dirs:
            p = os.path.join(dirpath, nm)
            rel = os.path.relpath(p, base)
            if os.path.islink(p):
                out[rel] = ("symlink", os.readlink(p))
            elif nm in names:
                with open(p, "rb") as fh:
                    out[rel] = fh.read()
            elif not os.listdir(p):
                out[rel] = ("dir",)
    return out


def _write_archive(args, argv):
    """Gather into a private temporary folder, then pack it as one file: a text
    archive (FILE.txt, as fake_sysfs/ keeps its machines) or a .tar.gz."""
    import tempfile

    if os.path.exists(args.archive) and not args.force:
        sys.stderr.write(f"gather.py: {args.archive} exists; use --force to replace it\n")
        return 2
    with tempfile.TemporaryDirectory(prefix="gather-") as tmp:
        rc = main(
            ["--root", args.root, tmp + "/m", "--force"]
            + (["--no-self-status"] if args.no_self_status else [])
        )
        if rc:
            return rc
        part = args.archive + ".part"
        base = os.path.join(tmp, "m")
        if not args.archive.endswith((".tar.gz", ".tgz")):
            with open(part, "wb") as fh:
                fh.write(pack_text(folder_files(base)))
        else:
            _write_tar(part, base)
        os.replace(part, args.archive)
    sys.stdout.write(
        f"gather.py: wrote {args.archive} "
        f"({os.path.getsize(args.archive)} bytes); "
        f"check it with: python3 -m numa_utils status --root {args.archive}\n"
    )
    return 0


def _write_tar(part, base):
    """One .tar.gz: plain files and the tree's own relative links (HMAT
    initiators), owner 0, sorted."""
    import tarfile

    with tarfile.open(part, "w:gz") as tar:
        for dirpath, dirs, files in os.walk(base):
            dirs.sort()
            # os.walk lists a link to a folder among dirs (and does not follow it)
            links = [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]
            for name in sorted(files + links):
                path = os.path.join(dirpath, name)
                info = tar.gettarinfo(path, os.path.relpath(path, base))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if info.issym():
                    tar.addfile(info)
                    continue
                info.mode = 0o644
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)


if __name__ == "__main__":
    sys.exit(main())
