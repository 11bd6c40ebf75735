#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fetch and cache what the real-kernel test tier boots: Debian kernels and a
small Python root filesystem per guest image, packed as a gzip'd cpio (newc)
initramfs.

Everything comes from Debian's apt repositories through ``apt-get download``;
nothing else is fetched. The result lives in ``vm/.cache/`` (or in
``$NUMA_UTILS_VM_CACHE``)::

    <cache>/<image>/vmlinuz          kernel image (vmlinux on ppc64le)
    <cache>/<image>/base.cpio.gz     root filesystem: busybox, python3, (numactl)
    <cache>/<image>/manifest.json    package versions it was built from

Images (IMAGES below): one Debian 12 ("bookworm", Linux 6.1, Python 3.11) per
architecture, named after it, and ``x86_64-6.12``: Debian 13 ("trixie", Linux
6.12, Python 3.13, numactl 2.0.19). Trixie's packages come from the mirror the
host's own apt sources name, through a private apt state folder
(``<cache>/apt-trixie/``: its own source file, lists and package cache), so the
system's apt state is never touched.

A second run with a complete cache does nothing (no apt calls at all).

Two more cached items serve the x86_64-6.12 guests that need QEMU 10 (q35 with
PCI expanders on a node, generic initiators, CXL; KERNEL_FACTS section 11):

    <cache>/qemu10/root/                Debian 13's qemu-system-x86 and every library
                                        it needs, unpacked with dpkg-deb -x
    <cache>/qemu10/qemu-system-x86_64   a launcher: trixie's own dynamic loader and
                                        library path, and QEMU 10's module folder
                                        bind-mounted over the host's (unshare --mount)
    <cache>/x86_64-6.12-modules/        the guest kernel modules those guests insmod
                                        (nvme, e1000e, CXL, DAX kmem), decompressed

Usage: python3 vm/build.py [--arch x86_64,x86_64-6.12,aarch64,ppc64le,s390x,qemu10,
                           x86_64-6.12-modules] [--force]
Needs: apt-get, apt-cache, dpkg, dpkg-deb (Debian or Ubuntu host), root for
``dpkg --add-architecture`` and ``apt-get update`` the first time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Guest architecture (uname -m) -> Debian architecture and kernel meta package.
ARCHES = {
    "x86_64": {"deb": "amd64", "kernel_meta": "linux-image-amd64"},
    "aarch64": {"deb": "arm64", "kernel_meta": "linux-image-arm64"},
    "ppc64le": {"deb": "ppc64el", "kernel_meta": "linux-image-powerpc64le"},
    "s390x": {"deb": "s390x", "kernel_meta": "linux-image-s390x"},
}

# Debian suites and the Python each one ships.
SUITES = {"bookworm": "3.11", "trixie": "3.13"}

# Guest images: the cache folder name -> guest architecture, Debian suite and the
# packages added to the common root filesystem. numactl/libnuma1 (2.0.16 in
# bookworm, 2.0.19 in trixie) are what the numactl matrix (vm/numactl_matrix.py)
# compares `numa_utils numactl` with.
IMAGES = {
    "x86_64": {"arch": "x86_64", "suite": "bookworm", "extra": ("numactl", "libnuma1")},
    "aarch64": {"arch": "aarch64", "suite": "bookworm", "extra": ()},
    "ppc64le": {"arch": "ppc64le", "suite": "bookworm", "extra": ()},
    "s390x": {"arch": "s390x", "suite": "bookworm", "extra": ()},
    "x86_64-6.12": {"arch": "x86_64", "suite": "trixie", "extra": ("numactl", "libnuma1")},
}


def rootfs_packages(image: str) -> tuple:
    """The root filesystem: busybox for /init and the shell tools, python3 with the
    parts of the standard library the checks use (ctypes, mmap, json, subprocess,
    multiprocessing.shared_memory). _ctypes needs libffi; pyexpat needs libexpat."""
    py = SUITES[IMAGES[image]["suite"]]
    return (
        "busybox-static",
        "libc6",
        "libgcc-s1",
        "zlib1g",
        "libexpat1",
        "libffi8",
        f"python{py}-minimal",
        f"libpython{py}-minimal",
        f"libpython{py}-stdlib",
    ) + tuple(IMAGES[image]["extra"])


# Dropped from the root filesystem to keep the initramfs small: the guest
# unpacks it under software emulation at every boot.
PRUNE_DIRS = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/lintian",
    "usr/share/locale",
    "usr/share/binfmts",
    "usr/share/applications",
    "usr/share/pixmaps",
)
PRUNE_PY_DIRS = (
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "distutils",
    "venv",
    "sqlite3",
    "curses",
    "dbm",
)
PRUNE_GLOBS_IN = ("gconv",)  # glibc charset modules under usr/lib/<triplet>/

# Shell tools /init needs, as busybox applet links.
BUSYBOX_APPLETS = (
    "sh",
    "mount",
    "umount",
    "mkdir",
    "cat",
    "echo",
    "poweroff",
    "ls",
    "sleep",
    "grep",
    "head",
    "tail",
    "sed",
    "awk",
    "cp",
    "rm",
    "ln",
    "chmod",
    "dmesg",
    "uname",
    "true",
    "false",
    "env",
    "hexdump",
    "sync",
    "mknod",
    "free",
    "ps",
)


def cache_dir() -> str:
    return os.environ.get("NUMA_UTILS_VM_CACHE") or os.path.join(HERE, ".cache")


def log(msg: str) -> None:
    print(f"[vm/build] {msg}", flush=True)


def run(cmd, **kw) -> str:
    res = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, **kw)
    return res.stdout


def host_mirror() -> str:
    """The Debian mirror the host's apt sources already use (deb822 first, then the
    one-line format); deb.debian.org when neither names one."""
    try:
        with open("/etc/apt/sources.list.d/debian.sources") as fh:
            for stanza in fh.read().split("\n\n"):
                fields = {}
                for line in stanza.splitlines():
                    if line[:1] not in ("#", " ", "\t") and ":" in line:
                        k, v = line.split(":", 1)
                        fields[k.strip().lower()] = v.split()
                if any("security" not in suite for suite in fields.get("suites", [])):
                    for uri in fields.get("uris", []):
                        return uri.rstrip("/")
    except OSError:
        pass
    try:
        with open("/etc/apt/sources.list") as fh:
            for line in fh:
                parts = line.split("#", 1)[0].split()
                if len(parts) >= 3 and parts[0] == "deb" and "security" not in parts[2]:
                    uri = next(p for p in parts[1:] if not p.startswith("["))
                    return uri.rstrip("/")
    except (OSError, StopIteration):
        pass
    return "http://deb.debian.org/debian"


def apt_opts(suite: str, deb_arch: str) -> list:
    """apt options for a suite. bookworm: the host's own apt state. Any other suite:
    a private folder with its own source file, lists and package cache
    (KERNEL_FACTS section 10), so the system's apt state is never changed."""
    if suite == "bookworm":
        return []
    state = os.path.join(cache_dir(), f"apt-{suite}")
    os.makedirs(os.path.join(state, "lists", "partial"), exist_ok=True)
    os.makedirs(os.path.join(state, "cache", "archives", "partial"), exist_ok=True)
    os.makedirs(os.path.join(state, "sources"), exist_ok=True)
    src = (
        f"Types: deb\nURIs: {host_mirror()}\nSuites: {suite}\nComponents: main\n"
        f"Architectures: {deb_arch}\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    path = os.path.join(state, "sources", f"{suite}.sources")
    if not os.path.exists(path) or open(path).read() != src:
        with open(path, "w") as fh:
            fh.write(src)
    return [
        "-o",
        "Dir::Etc::sourcelist=-",
        "-o",
        f"Dir::Etc::sourceparts={state}/sources",
        "-o",
        f"Dir::State::Lists={state}/lists",
        "-o",
        f"Dir::Cache={state}/cache",
        "-o",
        "Acquire::Languages=none",
    ]


# --------------------------------------------------------------------------- apt


def ensure_foreign_arch(deb_arch: str) -> bool:
    """Add a dpkg foreign architecture; True when apt-get update is needed."""
    native = run(["dpkg", "--print-architecture"]).strip()
    if deb_arch == native:
        return False
    foreign = run(["dpkg", "--print-foreign-architectures"]).split()
    if deb_arch in foreign:
        return False
    log(f"dpkg --add-architecture {deb_arch}")
    subprocess.run(["dpkg", "--add-architecture", deb_arch], check=True)
    return True


def has_candidate(pkg: str, opts=()) -> bool:
    out = subprocess.run(
        ["apt-cache", *opts, "policy", pkg],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ).stdout
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Candidate:"):
            return line.split(":", 1)[1].strip() not in ("", "(none)")
    return False


def apt_update(opts=()) -> None:
    """apt-get update, retried: a mirror caught mid-sync fails one index file
    ("File has unexpected size") and is fine a minute later. A partial failure
    that still leaves every package resolvable is not fatal."""
    for attempt in range(3):
        log(
            "apt-get update"
            + (" (private state: " + opts[3].split("=", 1)[1] + ")" if opts else "")
            + (f" (retry {attempt})" if attempt else "")
        )
        sandbox = ["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else []
        if (
            subprocess.run(
                ["apt-get", *opts, *sandbox, "update", "-q"], stdout=subprocess.DEVNULL
            ).returncode
            == 0
        ):
            return
        time.sleep(10 * (attempt + 1))
    log("apt-get update kept failing; continuing with the indexes it did fetch")


def resolve_kernel_package(meta: str, deb_arch: str, opts=()) -> str:
    """linux-image-amd64 -> linux-image-6.1.0-NN-amd64 (the meta's dependency)."""
    out = run(["apt-cache", *opts, "depends", f"{meta}:{deb_arch}"])
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends:"):
            name = line.split(":", 1)[1].strip().split(":")[0]
            if name.startswith("linux-image-"):
                return name
    raise SystemExit(f"cannot resolve the kernel package behind {meta}:{deb_arch}")


def download(pkgs, deb_arch: str, dest: str, apt=()) -> dict:
    """apt-get download each package into dest; returns {package: .deb path}."""
    os.makedirs(dest, exist_ok=True)
    wanted = [f"{p}:{deb_arch}" for p in pkgs]
    log(f"apt-get download ({deb_arch}): {' '.join(pkgs)}")
    # As root, apt drops to the _apt user, which cannot write into the cache
    # folder: it warns and downloads anyway. Say so up front instead.
    opts = ["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else []
    subprocess.run(
        ["apt-get", "download", "-q", *apt, *opts, *wanted],
        cwd=dest,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    debs = {}
    for fn in os.listdir(dest):
        if fn.endswith(".deb"):
            debs[fn.split("_", 1)[0]] = os.path.join(dest, fn)
    missing = [p for p in pkgs if p not in debs]
    if missing:
        raise SystemExit(f"apt-get download did not produce: {missing}")
    return {p: debs[p] for p in pkgs}


def deb_version(deb: str) -> str:
    return run(["dpkg-deb", "-f", deb, "Version"]).strip()


# ----------------------------------------------------------------------- cpio


class CpioWriter:
    """Minimal cpio 'newc' writer (the format the kernel's initramfs unpacker reads)."""

    def __init__(self, fileobj):
        self.f = fileobj
        self.ino = 1000

    def _entry(
        self, name: str, mode: int, data: bytes = b"", mtime: int = 0, nlink: int = 1
    ) -> None:
        self.ino += 1
        namebytes = name.encode() + b"\0"
        hdr = "070701" + "".join(
            f"{v:08X}"
            for v in (self.ino, mode, 0, 0, nlink, mtime, len(data), 0, 0, 0, 0, len(namebytes), 0)
        )
        self.f.write(hdr.encode() + namebytes)
        self.f.write(b"\0" * ((4 - (110 + len(namebytes)) % 4) % 4))
        self.f.write(data)
        self.f.write(b"\0" * ((4 - len(data) % 4) % 4))

    def add_dir(self, name: str, mode: int = 0o755) -> None:
        self._entry(name, stat.S_IFDIR | mode, nlink=2)

    def add_file(self, name: str, data: bytes, mode: int = 0o644, mtime: int = 0) -> None:
        self._entry(name, stat.S_IFREG | mode, data, mtime=mtime)

    def add_symlink(self, name: str, target: str) -> None:
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def add_tree(self, root: str) -> None:
        """Add everything under root (paths in the archive are relative to it)."""
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel = os.path.relpath(dirpath, root)
            if rel != ".":
                st = os.lstat(dirpath)
                self.add_dir(rel, stat.S_IMODE(st.st_mode))
            for name in sorted(filenames) + [
                d for d in dirnames if os.path.islink(os.path.join(dirpath, d))
            ]:
                path = os.path.join(dirpath, name)
                arc = os.path.normpath(os.path.join(rel, name))
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    self.add_symlink(arc, os.readlink(path))
                elif stat.S_ISREG(st.st_mode):
                    with open(path, "rb") as fh:
                        self.add_file(arc, fh.read(), stat.S_IMODE(st.st_mode), int(st.st_mtime))

    def close(self) -> None:
        self._entry("TRAILER!!!", 0, nlink=1)


def pack_cpio_gz(writer_fn, dest: str, level: int = 6) -> None:
    tmp = dest + ".tmp"
    with open(tmp, "wb") as raw, gzip.GzipFile(
        fileobj=raw, mode="wb", compresslevel=level, mtime=0
    ) as gz:
        w = CpioWriter(gz)
        writer_fn(w)
        w.close()
    os.replace(tmp, dest)


# ------------------------------------------------------------------- rootfs


def prune_rootfs(root: str, py: str) -> None:
    for rel in PRUNE_DIRS + tuple(f"usr/lib/python{py}/{d}" for d in PRUNE_PY_DIRS):
        shutil.rmtree(os.path.join(root, rel), ignore_errors=True)
    for base in ("usr/lib", "lib"):
        top = os.path.join(root, base)
        if not os.path.isdir(top):
            continue
        for triplet in os.listdir(top):
            for name in PRUNE_GLOBS_IN:
                shutil.rmtree(os.path.join(top, triplet, name), ignore_errors=True)


def precompile(root: str, py: str) -> None:
    """Byte-compile the guest's stdlib with a host interpreter of the same minor
    version (.pyc files are architecture independent; this one, else pythonX.Y on
    PATH); saves seconds of compiling under emulation at every boot. Unchecked
    hashes: no mtime games."""
    lib = os.path.join(root, f"usr/lib/python{py}")
    import glob

    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = [sys.executable] if f"{sys.version_info[0]}.{sys.version_info[1]}" == py else []
    # pyenv's shims answer only for `pyenv global` versions: look at its versions too.
    found += [
        p
        for p in (
            shutil.which(f"python{py}"),
            *sorted(glob.glob(os.path.join(pyenv, "versions", f"{py}*", "bin", f"python{py}"))),
        )
        if p
    ]
    exe = next(
        (
            p
            for p in found
            if subprocess.run(
                [p, "-c", ""], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            ).returncode
            == 0
        ),
        None,
    )
    if (
        not exe
        or subprocess.run(
            [
                exe,
                "-m",
                "compileall",
                "-q",
                "-q",
                "-j",
                "0",
                "-d",
                f"/usr/lib/python{py}",
                "--invalidation-mode",
                "unchecked-hash",
                lib,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ).returncode
    ):
        log(f"no working host python{py}: guest stdlib left uncompiled (slower boots)")


def merge_usr(root: str) -> None:
    """Debian 13 packages ship /usr only and rely on base-files' /bin -> usr/bin
    (and lib, lib64, sbin) links; make them, moving anything a package put in the
    old place."""
    for d in ("bin", "sbin", "lib", "lib64"):
        top, usr = os.path.join(root, d), os.path.join(root, "usr", d)
        os.makedirs(usr, exist_ok=True)
        if os.path.isdir(top) and not os.path.islink(top):
            for name in os.listdir(top):
                if not os.path.lexists(os.path.join(usr, name)):
                    os.rename(os.path.join(top, name), os.path.join(usr, name))
            shutil.rmtree(top)
        if not os.path.lexists(top):
            os.symlink(f"usr/{d}", top)


def build_rootfs(debs: dict, root: str, image: str) -> None:
    py = SUITES[IMAGES[image]["suite"]]
    for deb in debs.values():
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
    if IMAGES[image]["suite"] != "bookworm":
        merge_usr(root)
    prune_rootfs(root, py)
    bindir = os.path.join(root, "bin")
    os.makedirs(bindir, exist_ok=True)
    for applet in BUSYBOX_APPLETS:
        link = os.path.join(bindir, applet)
        if not os.path.lexists(link):
            os.symlink("busybox", link)
    usrbin = os.path.join(root, "usr/bin")
    if not os.path.lexists(os.path.join(usrbin, "python3")):
        os.symlink(f"python{py}", os.path.join(usrbin, "python3"))
    for d in ("proc", "sys", "dev", "tmp", "run", "etc", "root"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    precompile(root, py)


def extract_kernel(deb: str, dest: str) -> str:
    """Take only boot/vmlinu[xz]-* from the kernel package (skip the modules)."""
    with tempfile.TemporaryDirectory() as tmp:
        tar = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", deb], stdout=subprocess.PIPE)
        subprocess.run(
            ["tar", "-x", "-C", tmp, "--wildcards", "./boot/vmlinu*"], stdin=tar.stdout, check=True
        )
        tar.wait()
        boot = os.path.join(tmp, "boot")
        images = sorted(os.listdir(boot))
        if not images:
            raise SystemExit(f"no kernel image in {deb}")
        shutil.copyfile(os.path.join(boot, images[0]), dest)
        return images[0]


# --------------------------------------------------------------------- main


def arch_complete(image: str) -> bool:
    """The image is cached, built from this suite with every package it needs now
    (an image cached before a package was added is rebuilt)."""
    d = os.path.join(cache_dir(), image)
    if not all(
        os.path.isfile(os.path.join(d, f)) for f in ("vmlinuz", "base.cpio.gz", "manifest.json")
    ):
        return False
    try:
        with open(os.path.join(d, "manifest.json")) as fh:
            manifest = json.load(fh)
    except (OSError, ValueError):
        return False
    return manifest.get("suite", "bookworm") == IMAGES[image]["suite"] and set(
        rootfs_packages(image)
    ) <= set(manifest.get("packages", ()))


def build_arch(image: str, keep_debs: bool) -> None:
    arch = IMAGES[image]["arch"]
    suite = IMAGES[image]["suite"]
    info = ARCHES[arch]
    deb_arch = info["deb"]
    apt = apt_opts(suite, deb_arch)
    out = os.path.join(cache_dir(), image)
    os.makedirs(out, exist_ok=True)
    t0 = time.monotonic()
    kernel_pkg = resolve_kernel_package(info["kernel_meta"], deb_arch, apt)
    debdir = os.path.join(out, "debs")
    shutil.rmtree(debdir, ignore_errors=True)
    debs = download((kernel_pkg,) + rootfs_packages(image), deb_arch, debdir, apt)
    kimage = extract_kernel(debs[kernel_pkg], os.path.join(out, "vmlinuz"))
    with tempfile.TemporaryDirectory(dir=out) as root:
        build_rootfs({p: d for p, d in debs.items() if p != kernel_pkg}, root, image)
        pack_cpio_gz(lambda w: w.add_tree(root), os.path.join(out, "base.cpio.gz"))
    manifest = {
        "arch": arch,
        "suite": suite,
        "debian_arch": deb_arch,
        "kernel_package": kernel_pkg,
        "kernel_image": kimage,
        "packages": {p: deb_version(d) for p, d in debs.items()},
    }
    if not keep_debs:
        shutil.rmtree(debdir, ignore_errors=True)
    with open(os.path.join(out, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
    size = os.path.getsize(os.path.join(out, "base.cpio.gz")) >> 20
    log(f"{image}: {kimage} + base.cpio.gz ({size} MiB) in {time.monotonic() - t0:.0f}s")


# ------------------------------------------------------------ QEMU 10 (trixie)

# Debian 12's QEMU 7.2 lacks acpi-generic-initiator (QEMU 9+) and cannot commit a
# CXL region the 6.12 kernel accepts; Debian 13's QEMU 10 runs here from a folder
# (KERNEL_FACTS section 11). Both items below are built only from trixie's apt
# repositories, through the private apt state of apt_opts().
QEMU10 = {"suite": "trixie", "deb_arch": "amd64", "package": "qemu-system-x86"}

# Guest kernel modules the QEMU 10 guests load, in insmod order, as paths under the
# kernel package's usr/lib/modules/<version>/kernel/ (without .ko.xz). Debian's
# 6.12 builds these as modules; their dependencies (modinfo 'depends') come first.
# cxl_core, cxl_port and the DAX core are built in.
GUEST_MODULES = {
    "x86_64-6.12": (
        "drivers/nvme/common/nvme-auth",
        "drivers/nvme/host/nvme-core",
        "drivers/nvme/host/nvme",
        "drivers/net/ethernet/intel/e1000e/e1000e",
        "drivers/cxl/cxl_acpi",
        "drivers/cxl/cxl_pci",
        "drivers/cxl/cxl_mem",
        "drivers/dax/dax_cxl",
        "drivers/dax/kmem",
    ),
}

LAUNCHER = r"""#!/bin/sh
# Written by vm/build.py: Debian 13's QEMU 10 run from this folder with its own
# dynamic loader and libraries (KERNEL_FACTS section 11).
R="$(cd "$(dirname "$0")" && pwd)/root"
L="$R/usr/lib/x86_64-linux-gnu"
set -- "$L/ld-linux-x86-64.so.2" --library-path "$L:$R/lib/x86_64-linux-gnu" \
    "$R/usr/bin/qemu-system-x86_64" -L "$R/usr/share/qemu" -L "$R/usr/share/seabios" \
    -L "$R/usr/lib/ipxe/qemu" "$@"
H=/usr/lib/x86_64-linux-gnu/qemu
[ -d "$H" ] || exec "$@"
# QEMU loads its modules from the folder compiled in, which is the host's QEMU's:
# those abort QEMU 10 (module_load_dso assertion; QEMU_MODULE_DIR does not help).
# In a private mount namespace, put QEMU 10's own modules over that folder.
if [ "$(id -u)" = 0 ]; then U="unshare --mount"; else U="unshare --mount --map-root-user"; fi
exec $U sh -c 'mount --bind "$0" "$1" && shift && exec "$@"' "$L/qemu" "$H" "$@"
"""


def qemu10_dir() -> str:
    return os.path.join(cache_dir(), "qemu10")


def qemu10_binary() -> str:
    """The launcher of the cached QEMU 10 (exists once `build.py --arch qemu10` ran)."""
    return os.path.join(qemu10_dir(), "qemu-system-x86_64")


def qemu10_complete() -> bool:
    d = qemu10_dir()
    return all(
        os.path.isfile(os.path.join(d, f))
        for f in ("manifest.json", "qemu-system-x86_64", "root/usr/bin/qemu-system-x86_64")
    )


def qemu10_packages(apt: list) -> list:
    """qemu-system-x86 and everything it depends on, recursively (virtual names,
    shown as <name>, are left out: a real package provides each)."""
    out = run(
        [
            "apt-cache",
            *apt,
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            f"{QEMU10['package']}:{QEMU10['deb_arch']}",
        ]
    )
    names = {
        line.strip().split(":")[0]
        for line in out.splitlines()
        if line.strip() and not line.startswith(" ") and not line.startswith("<")
    }
    return sorted(names)


def build_qemu10() -> None:
    t0 = time.monotonic()
    apt = apt_opts(QEMU10["suite"], QEMU10["deb_arch"])
    if not has_candidate(f"{QEMU10['package']}:{QEMU10['deb_arch']}", apt):
        apt_update(apt)
    pkgs = qemu10_packages(apt)
    out = qemu10_dir()
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        debs = download(pkgs, QEMU10["deb_arch"], tmp, apt)
        root = os.path.join(out, "root")
        for deb in debs.values():
            subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
        versions = {p: deb_version(d) for p, d in debs.items()}
    for rel in PRUNE_DIRS:
        shutil.rmtree(os.path.join(root, rel), ignore_errors=True)
    with open(qemu10_binary(), "w") as fh:
        fh.write(LAUNCHER)
    os.chmod(qemu10_binary(), 0o755)
    version = run([qemu10_binary(), "--version"]).splitlines()[0]
    with open(os.path.join(out, "manifest.json"), "w") as fh:
        json.dump(
            {"suite": QEMU10["suite"], "version": version, "packages": versions},
            fh,
            indent=2,
            sort_keys=True,
        )
    log(f"qemu10: {version} ({len(pkgs)} packages) in {time.monotonic() - t0:.0f}s")


def modules_dir(image: str) -> str:
    return os.path.join(cache_dir(), f"{image}-modules")


def _image_kernel(image: str) -> tuple:
    with open(os.path.join(cache_dir(), image, "manifest.json")) as fh:
        manifest = json.load(fh)
    pkg = manifest["kernel_package"]
    return pkg, manifest["packages"][pkg]


def modules_complete(image: str) -> bool:
    """The modules are cached, all of them, from the kernel the image boots."""
    try:
        with open(os.path.join(modules_dir(image), "manifest.json")) as fh:
            manifest = json.load(fh)
        kernel = _image_kernel(image)
    except (OSError, ValueError, KeyError):
        return False
    return (
        tuple(manifest.get("kernel", ())) == kernel
        and list(manifest.get("modules", ())) == list(GUEST_MODULES[image])
        and os.path.isfile(os.path.join(modules_dir(image), "modules.cpio.gz"))
    )


def build_modules(image: str) -> None:
    """Take GUEST_MODULES[image] out of the very kernel package the image boots,
    decompressed (busybox insmod reads plain .ko), packed as a cpio archive the run
    appends to its initramfs: /vmtest/modules/<name>.ko."""
    import lzma

    t0 = time.monotonic()
    if not arch_complete(image):
        raise SystemExit(f"{image}-modules: build the {image} image first (--arch {image})")
    pkg, version = _image_kernel(image)
    suite, deb_arch = IMAGES[image]["suite"], ARCHES[IMAGES[image]["arch"]]["deb"]
    apt = apt_opts(suite, deb_arch)
    out = modules_dir(image)
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        sandbox = ["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else []
        log(f"apt-get download {pkg}={version} (for its modules)")
        subprocess.run(
            ["apt-get", "download", "-q", *apt, *sandbox, f"{pkg}:{deb_arch}={version}"],
            cwd=tmp,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        deb = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".deb"))
        kver = pkg[len("linux-image-") :]
        members = [f"./usr/lib/modules/{kver}/kernel/{m}.ko.xz" for m in GUEST_MODULES[image]]
        tar = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", deb], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", tmp, *members], stdin=tar.stdout, check=True)
        tar.wait()
        mods = {}
        for m, member in zip(GUEST_MODULES[image], members):
            with lzma.open(os.path.join(tmp, member)) as fh:
                mods[os.path.basename(m)] = fh.read()

    def write(w: CpioWriter) -> None:
        w.add_dir("vmtest")
        w.add_dir("vmtest/modules")
        for name, data in mods.items():
            w.add_file(f"vmtest/modules/{name}.ko", data)

    pack_cpio_gz(write, os.path.join(out, "modules.cpio.gz"))
    with open(os.path.join(out, "manifest.json"), "w") as fh:
        json.dump({"kernel": [pkg, version], "modules": list(GUEST_MODULES[image])}, fh, indent=2)
    log(f"{image}-modules: {len(mods)} modules of {pkg} in {time.monotonic() - t0:.0f}s")


EXTRAS = {
    "qemu10": (qemu10_complete, build_qemu10),
    "x86_64-6.12-modules": (
        lambda: modules_complete("x86_64-6.12"),
        lambda: build_modules("x86_64-6.12"),
    ),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--arch",
        default=",".join([*IMAGES, *EXTRAS]),
        help="comma separated guest images and extras (default: all)",
    )
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument(
        "--keep-debs", action="store_true", help="keep the downloaded .deb files in the cache"
    )
    args = ap.parse_args(argv)
    names = [a.strip() for a in args.arch.split(",") if a.strip()]
    unknown = [a for a in names if a not in IMAGES and a not in EXTRAS]
    if unknown:
        ap.error(f"unknown image(s) {unknown}; known: {[*IMAGES, *EXTRAS]}")
    arches = [a for a in names if a in IMAGES]
    extras = [a for a in names if a in EXTRAS]
    todo = [a for a in arches if args.force or not arch_complete(a)]
    # The modules come from the image's own kernel package: build that image first.
    todo_extras = [e for e in extras if args.force or not EXTRAS[e][0]()]
    if not todo and not todo_extras:
        log(f"cache complete for {', '.join(names)} in {cache_dir()}: nothing to do")
        return 0
    # One apt-get update per apt state (the host's for bookworm, a private one
    # for each other suite), only when a package to fetch has no candidate.
    need_update = {}
    for a in todo:
        deb = ARCHES[IMAGES[a]["arch"]]["deb"]
        suite = IMAGES[a]["suite"]
        added = suite == "bookworm" and ensure_foreign_arch(deb)
        stale = added or not all(
            has_candidate(f"{p}:{deb}", apt_opts(suite, deb))
            for p in (ARCHES[IMAGES[a]["arch"]]["kernel_meta"], *IMAGES[a]["extra"])
        )
        if stale:
            need_update[suite] = apt_opts(suite, deb)
    for opts in need_update.values():
        apt_update(opts)
    for a in todo:
        build_arch(a, args.keep_debs)
    for e in todo_extras:
        EXTRAS[e][1]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
