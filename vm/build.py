#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fetch and cache what the real-kernel test tier boots: Debian kernels and a
small Python root filesystem per architecture, packed as a gzip'd cpio (newc)
initramfs.

Everything comes from Debian's apt repositories through ``apt-get download``;
nothing else is fetched. The result lives in ``vm/.cache/`` (or in
``$NUMA_UTILS_VM_CACHE``)::

    <cache>/<arch>/vmlinuz          kernel image (vmlinux on ppc64le)
    <cache>/<arch>/base.cpio.gz     root filesystem with busybox and python3.11
    <cache>/<arch>/manifest.json    package versions it was built from

A second run with a complete cache does nothing (no apt calls at all).

Usage: python3 vm/build.py [--arch x86_64,aarch64,ppc64le,s390x] [--force]
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

# The root filesystem: busybox for /init and the shell tools, python3.11 with the
# parts of the standard library the checks use (ctypes, mmap, json, subprocess,
# multiprocessing.shared_memory). _ctypes needs libffi; pyexpat needs libexpat.
ROOTFS_PACKAGES = (
    "busybox-static",
    "libc6",
    "libgcc-s1",
    "zlib1g",
    "libexpat1",
    "libffi8",
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
)

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
    "usr/lib/python3.11/test",
    "usr/lib/python3.11/idlelib",
    "usr/lib/python3.11/tkinter",
    "usr/lib/python3.11/turtledemo",
    "usr/lib/python3.11/ensurepip",
    "usr/lib/python3.11/lib2to3",
    "usr/lib/python3.11/pydoc_data",
    "usr/lib/python3.11/distutils",
    "usr/lib/python3.11/venv",
    "usr/lib/python3.11/sqlite3",
    "usr/lib/python3.11/curses",
    "usr/lib/python3.11/dbm",
)
PRUNE_GLOBS_IN = ("gconv",)  # glibc charset modules under usr/lib/<triplet>/

# Shell tools /init needs, as busybox applet links.
BUSYBOX_APPLETS = (
    "sh", "mount", "umount", "mkdir", "cat", "echo", "poweroff", "ls", "sleep",
    "grep", "head", "tail", "sed", "awk", "cp", "rm", "ln", "chmod", "dmesg",
    "uname", "true", "false", "env", "hexdump", "sync", "mknod", "free", "ps",
)


def cache_dir() -> str:
    return os.environ.get("NUMA_UTILS_VM_CACHE") or os.path.join(HERE, ".cache")


def log(msg: str) -> None:
    print(f"[vm/build] {msg}", flush=True)


def run(cmd, **kw) -> str:
    res = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, **kw)
    return res.stdout


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


def has_candidate(pkg: str) -> bool:
    out = subprocess.run(["apt-cache", "policy", pkg], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True).stdout
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Candidate:"):
            return line.split(":", 1)[1].strip() not in ("", "(none)")
    return False


def apt_update() -> None:
    """apt-get update, retried: a mirror caught mid-sync fails one index file
    ("File has unexpected size") and is fine a minute later. A partial failure
    that still leaves every package resolvable is not fatal."""
    for attempt in range(3):
        log("apt-get update" + (f" (retry {attempt})" if attempt else ""))
        if subprocess.run(["apt-get", "update", "-q"], stdout=subprocess.DEVNULL).returncode == 0:
            return
        time.sleep(10 * (attempt + 1))
    log("apt-get update kept failing; continuing with the indexes it did fetch")


def resolve_kernel_package(meta: str, deb_arch: str) -> str:
    """linux-image-amd64 -> linux-image-6.1.0-NN-amd64 (the meta's dependency)."""
    out = run(["apt-cache", "depends", f"{meta}:{deb_arch}"])
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends:"):
            name = line.split(":", 1)[1].strip().split(":")[0]
            if name.startswith("linux-image-"):
                return name
    raise SystemExit(f"cannot resolve the kernel package behind {meta}:{deb_arch}")


def download(pkgs, deb_arch: str, dest: str) -> dict:
    """apt-get download each package into dest; returns {package: .deb path}."""
    os.makedirs(dest, exist_ok=True)
    wanted = [f"{p}:{deb_arch}" for p in pkgs]
    log(f"apt-get download ({deb_arch}): {' '.join(pkgs)}")
    # As root, apt drops to the _apt user, which cannot write into the cache
    # folder: it warns and downloads anyway. Say so up front instead.
    opts = ["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else []
    subprocess.run(["apt-get", "download", "-q", *opts, *wanted], cwd=dest, check=True,
                   stdout=subprocess.DEVNULL)
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

    def _entry(self, name: str, mode: int, data: bytes = b"", mtime: int = 0,
               nlink: int = 1) -> None:
        self.ino += 1
        namebytes = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{v:08X}" for v in (
            self.ino, mode, 0, 0, nlink, mtime, len(data), 0, 0, 0, 0,
            len(namebytes), 0))
        self.f.write(hdr.encode() + namebytes)
        self.f.write(b"\0" * ((4 - (110 + len(namebytes)) % 4) % 4))
        self.f.write(data)
        self.f.write(b"\0" * ((4 - len(data) % 4) % 4))

    def add_dir(self, name: str, mode: int = 0o755) -> None:
        self._entry(name, stat.S_IFDIR | mode, nlink=2)

    def add_file(self, name: str, data: bytes, mode: int = 0o644,
                 mtime: int = 0) -> None:
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
            for name in sorted(filenames) + [d for d in dirnames
                                             if os.path.islink(os.path.join(dirpath, d))]:
                path = os.path.join(dirpath, name)
                arc = os.path.normpath(os.path.join(rel, name))
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    self.add_symlink(arc, os.readlink(path))
                elif stat.S_ISREG(st.st_mode):
                    with open(path, "rb") as fh:
                        self.add_file(arc, fh.read(), stat.S_IMODE(st.st_mode),
                                      int(st.st_mtime))

    def close(self) -> None:
        self._entry("TRAILER!!!", 0, nlink=1)


def pack_cpio_gz(writer_fn, dest: str, level: int = 6) -> None:
    tmp = dest + ".tmp"
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb",
                                               compresslevel=level, mtime=0) as gz:
        w = CpioWriter(gz)
        writer_fn(w)
        w.close()
    os.replace(tmp, dest)


# ------------------------------------------------------------------- rootfs


def prune_rootfs(root: str) -> None:
    for rel in PRUNE_DIRS:
        shutil.rmtree(os.path.join(root, rel), ignore_errors=True)
    for base in ("usr/lib", "lib"):
        top = os.path.join(root, base)
        if not os.path.isdir(top):
            continue
        for triplet in os.listdir(top):
            for name in PRUNE_GLOBS_IN:
                shutil.rmtree(os.path.join(top, triplet, name), ignore_errors=True)


def precompile(root: str) -> None:
    """Byte-compile the guest's stdlib with the host's interpreter when it is the
    same minor version (.pyc files are architecture independent); saves seconds
    of compiling under emulation at every boot. Unchecked hashes: no mtime games."""
    if sys.version_info[:2] != (3, 11):
        log("host python is not 3.11: guest stdlib left uncompiled (slower boots)")
        return
    import compileall
    import py_compile
    lib = os.path.join(root, "usr/lib/python3.11")
    compileall.compile_dir(
        lib, quiet=2, ddir="/usr/lib/python3.11", workers=0,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)


def build_rootfs(debs: dict, root: str) -> None:
    for deb in debs.values():
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
    prune_rootfs(root)
    bindir = os.path.join(root, "bin")
    os.makedirs(bindir, exist_ok=True)
    for applet in BUSYBOX_APPLETS:
        link = os.path.join(bindir, applet)
        if not os.path.lexists(link):
            os.symlink("busybox", link)
    usrbin = os.path.join(root, "usr/bin")
    if not os.path.lexists(os.path.join(usrbin, "python3")):
        os.symlink("python3.11", os.path.join(usrbin, "python3"))
    for d in ("proc", "sys", "dev", "tmp", "run", "etc", "root"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    precompile(root)


def extract_kernel(deb: str, dest: str) -> str:
    """Take only boot/vmlinu[xz]-* from the kernel package (skip the modules)."""
    with tempfile.TemporaryDirectory() as tmp:
        tar = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", deb], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", tmp, "--wildcards", "./boot/vmlinu*"],
                       stdin=tar.stdout, check=True)
        tar.wait()
        boot = os.path.join(tmp, "boot")
        images = sorted(os.listdir(boot))
        if not images:
            raise SystemExit(f"no kernel image in {deb}")
        shutil.copyfile(os.path.join(boot, images[0]), dest)
        return images[0]


# --------------------------------------------------------------------- main


def arch_complete(arch: str) -> bool:
    d = os.path.join(cache_dir(), arch)
    return all(os.path.isfile(os.path.join(d, f))
               for f in ("vmlinuz", "base.cpio.gz", "manifest.json"))


def build_arch(arch: str, keep_debs: bool) -> None:
    info = ARCHES[arch]
    deb_arch = info["deb"]
    out = os.path.join(cache_dir(), arch)
    os.makedirs(out, exist_ok=True)
    t0 = time.monotonic()
    kernel_pkg = resolve_kernel_package(info["kernel_meta"], deb_arch)
    debdir = os.path.join(out, "debs")
    shutil.rmtree(debdir, ignore_errors=True)
    debs = download((kernel_pkg,) + ROOTFS_PACKAGES, deb_arch, debdir)
    image = extract_kernel(debs[kernel_pkg], os.path.join(out, "vmlinuz"))
    with tempfile.TemporaryDirectory(dir=out) as root:
        build_rootfs({p: d for p, d in debs.items() if p != kernel_pkg}, root)
        pack_cpio_gz(lambda w: w.add_tree(root), os.path.join(out, "base.cpio.gz"))
    manifest = {
        "arch": arch,
        "debian_arch": deb_arch,
        "kernel_package": kernel_pkg,
        "kernel_image": image,
        "packages": {p: deb_version(d) for p, d in debs.items()},
    }
    if not keep_debs:
        shutil.rmtree(debdir, ignore_errors=True)
    with open(os.path.join(out, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
    size = os.path.getsize(os.path.join(out, "base.cpio.gz")) >> 20
    log(f"{arch}: {image} + base.cpio.gz ({size} MiB) in {time.monotonic() - t0:.0f}s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default=",".join(ARCHES),
                    help="comma separated guest architectures (default: all)")
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("--keep-debs", action="store_true",
                    help="keep the downloaded .deb files in the cache")
    args = ap.parse_args(argv)
    arches = [a.strip() for a in args.arch.split(",") if a.strip()]
    unknown = [a for a in arches if a not in ARCHES]
    if unknown:
        ap.error(f"unknown architecture(s) {unknown}; known: {list(ARCHES)}")
    todo = [a for a in arches if args.force or not arch_complete(a)]
    if not todo:
        log(f"cache complete for {', '.join(arches)} in {cache_dir()}: nothing to do")
        return 0
    need_update = False
    for a in todo:
        need_update |= ensure_foreign_arch(ARCHES[a]["deb"])
    if not need_update:
        need_update = not all(has_candidate(f"{ARCHES[a]['kernel_meta']}:{ARCHES[a]['deb']}")
                              for a in todo)
    if need_update:
        apt_update()
    for a in todo:
        build_arch(a, args.keep_debs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
