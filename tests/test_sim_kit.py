# SPDX-License-Identifier: Apache-2.0
"""The simulator as an engine's test kit (issue 27, section 7): regions of an
engine's real size on a smaller host (sparse objects), and the huge page sizes
the saved machine has, 1 GiB included."""

import os

import pytest
from conftest import nu, nusim, sim

MiB = 1 << 20
GiB = 1 << 30


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


def _host_ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# -- sparse regions -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_sim_region_larger_than_host_ram_places_touched_pages_and_stays_small(kind):
    # Larger than this host's memory: dense backing could not even be mapped.
    size = max(32 * GiB, (_host_ram() // GiB + 1) * GiB)
    half = size // 2
    s = sim("qemu-x86_64-two-node", free_kb={0: size >> 10, 1: size >> 10})
    layout = f"{half >> 20}M:bind:1;{half >> 20}M:interleave:0-1"
    before = _rss_kib()
    with nu.SharedRegion.create(
        "big", size, kind=kind, layout=layout, prefault=False, backend=s
    ) as r:
        assert r.size == size
        bound, spread = r.address + GiB, r.address + half + 2 * GiB
        nu.prefault(bound, 64 * MiB, backend=s)
        nu.prefault(spread, 64 * MiB, backend=s)
        # Page by page, as move_pages asks: exactly the touched pages, where the
        # extent's policy put them (interleave by page offset: half on each).
        assert nu.placement(bound, 64 * MiB, method="move_pages", backend=s) == {1: 64 * MiB}
        assert nu.placement(spread, 64 * MiB, method="move_pages", backend=s) == {
            0: 32 * MiB,
            1: 32 * MiB,
        }
        assert nu.placement(bound - 4096, 4096, method="move_pages", backend=s) == {}
        # numa_maps: the bound extent's VMA holds just the touched pages.
        assert nu.placement(r.address, half, method="numa_maps", backend=s) == {1: 64 * MiB}
        maps = s.render_numa_maps()
        line = next(x for x in maps.splitlines() if x.startswith(f"{r.address:08x} "))
        assert " bind:1 " in line and " dirty=16384 " in line and " N1=16384 " in line, line
        assert s.mincore(r.address, size) == 32768  # the record's room is past size
        assert s.mincore(r.address, r._mapped) == 32768 + (r._mapped - size) // 4096
        grown = _rss_kib() - before
        assert grown < 64 * 1024, f"RSS grew {grown} KiB for a {size >> 30} GiB region"
        # The pages go back to the nodes they came from when the region goes.
        r.remove()
    assert s.kernel.free_pages == {0: size // 4096, 1: size // 4096}
    assert not s.kernel.objects


def test_sim_sparse_objects_model_pages_as_dense_ones_do():
    # The same steps on a dense and on a sparse object give the same numa_maps,
    # mincore, move_pages answers and free counts: two processes, mbind with
    # MPOL_MF_MOVE, a VMA split, partial unmapping.
    def run(sparse_above):
        s = sim("qemu-x86_64-two-node", sparse_above=sparse_above)
        a, b = s, s.process()
        addr = a.map_object("obj", 8 * MiB)
        assert b.map_object("obj", 8 * MiB) == addr
        nu.mbind(addr, 4 * MiB, nu.Mode.INTERLEAVE, [0, 1], backend=a)
        a.touch(addr, 3 * MiB)
        b.touch(addr + 2 * MiB, 4 * MiB)
        nu.mbind(addr + 4 * MiB, 4 * MiB, nu.Mode.BIND, [0], nu.MbindFlag.MOVE, backend=a)
        nu.mbind(addr, 2 * MiB, nu.Mode.BIND, [1], nu.MbindFlag.MOVE, backend=b)
        where = nu.move_pages(0, [addr + i * 4096 for i in range(0, 2048, 7)], backend=b)
        out = [a.render_numa_maps(), b.render_numa_maps(), where, a.mincore(addr, 8 * MiB)]
        out += [dict(s.kernel.free_pages), s.read_text("/proc/sysvipc/shm")]
        b.munmap(addr, 8 * MiB)
        out += [a.render_numa_maps(), b.render_numa_maps()]
        a.remove_object("obj")
        return out + [dict(s.kernel.free_pages)]

    dense, sparse = run(1 << 40), run(0)
    assert sparse == dense
    assert "N0=" in dense[0] and "N1=" in dense[0] and "mapmax=2" in dense[0]


def test_sim_sparse_above_is_the_limit():
    s = sim("qemu-x86_64-two-node", sparse_above=4 * MiB)
    small, big = s.map_object("small", 4 * MiB), s.map_object("big", 4 * MiB + 4096)
    assert small and big
    assert not s.kernel.objects["small"].sparse
    assert s.kernel.objects["big"].sparse
    assert nusim.SPARSE_ABOVE == 256 * MiB
    assert sim("single-node").kernel.sparse_above == nusim.SPARSE_ABOVE
