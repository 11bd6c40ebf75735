# SPDX-License-Identifier: Apache-2.0
"""The simulator as an engine's test kit (issue 27, section 7): regions of an
engine's real size on a smaller host (sparse objects), and the huge page sizes
the saved machine has, 1 GiB included."""

import os

import pytest
from conftest import nu, nur, nusim, sim

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
    with nur.SharedRegion.create(
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
        assert s.call("mincore", r.address, size) == 32768  # the record's room is past size
        assert s.call("mincore", r.address, r._mapped) == 32768 + (r._mapped - size) // 4096
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
        out = [a.render_numa_maps(), b.render_numa_maps(), where, a.call("mincore", addr, 8 * MiB)]
        out += [dict(s.kernel.free_pages), s.read_text("/proc/sysvipc/shm")]
        b.call("munmap", addr, 8 * MiB)
        out += [a.render_numa_maps(), b.render_numa_maps()]
        a.remove_object("obj")  # still mapped by a: its pages are gone
        return out + [dict(s.kernel.free_pages), a.render_numa_maps()]

    dense, sparse = run(1 << 40), run(0)
    assert sparse == dense
    assert "N0=" in dense[0] and "N1=" in dense[0] and "mapmax=2" in dense[0]


def test_sim_sparse_above_is_the_limit():
    s = sim("qemu-x86_64-two-node", sparse_above=4 * MiB)
    small, big = s.map_object("small", 4 * MiB), s.map_object("big", 4 * MiB + 4096)
    assert small and big
    assert not s.kernel.objects["small"].sparse
    assert s.kernel.objects["big"].sparse
    assert nusim.SPARSE_ABOVE == 2 * GiB
    assert sim("single-node").kernel.sparse_above == nusim.SPARSE_ABOVE
    for bad in (-1, "1G", 1.5, True):
        with pytest.raises(ValueError, match="sparse_above"):
            sim("single-node", sparse_above=bad)


# -- huge page sizes ------------------------------------------------------------------

HUGE_1G = "/sys/devices/system/node/node{}/hugepages/hugepages-1048576kB/free_hugepages"
ALL_1G = "/sys/kernel/mm/hugepages/hugepages-1048576kB/{}_hugepages"


def _free_1g(s):
    return [int(s.read_text(HUGE_1G.format(n))) for n in (0, 1)]


def _huge_flags(shift):
    return nusim.IPC_CREAT | 0o600 | nusim.SHM_HUGETLB | (shift << nusim.SHM_HUGE_SHIFT)


def test_sim_1g_region_takes_1g_pages_from_its_node():
    s = sim("dual-socket-8gpu")  # 1 GiB pages: 30 free of 32 on each node
    free_2m = s.read_text(HUGE_1G.format(1).replace("1048576", "2048"))
    assert _free_1g(s) == [30, 30]
    r = nur.SharedRegion.create("g", 3 * GiB, hugepages="1G", policy="bind", nodes=[1], backend=s)
    used = r._mapped // GiB  # the data's pages and the identity record's
    assert r.page_size == GiB and used >= 3
    assert _free_1g(s) == [30, 30 - used]
    assert s.read_text(ALL_1G.format("free")) == f"{60 - used}\n"
    assert s.read_text(ALL_1G.format("resv")) == "0\n"  # all faulted: none left reserved
    assert s.read_text(HUGE_1G.format(1).replace("1048576", "2048")) == free_2m
    line = next(x for x in s.render_numa_maps().splitlines() if x.startswith(f"{r.address:08x} "))
    assert " huge " in line and " N1=3 " in line and "kernelpagesize_kB=1048576" in line, line
    # A huge VMA splits at huge page boundaries only.
    with pytest.raises(OSError) as e:
        nu.mbind(r.address + 512 * MiB, GiB, nu.Mode.BIND, [0], backend=s)
    assert e.value.errno == 22
    # move_pages moves a 1 GiB page between the 1 GiB pools, not the base pages.
    base = dict(s.kernel.free_pages)
    assert nu.move_pages(0, [r.address], [0], backend=s) == [0]
    assert _free_1g(s) == [29, 31 - used]
    assert s.kernel.free_pages == base
    r.remove()
    r.close()
    assert _free_1g(s) == [30, 30]


def test_sim_shm_hugetlb_size_flag_rounds_up_and_reserves():
    s = sim("dual-socket-8gpu")
    shmid = s.call("shmget", 0, GiB + 1, _huge_flags(30))  # rounded up to two 1 GiB pages
    assert s.call("shm_stat", shmid).size == GiB + 1  # shm_segsz keeps the size asked
    assert s.read_text(ALL_1G.format("resv")) == "2\n"
    assert s.read_text(ALL_1G.format("free")) == "60\n"  # reserved is still free
    addr = s.call("shmat", shmid)
    assert addr % GiB == 0
    s.touch(addr, 1)
    assert s.read_text(ALL_1G.format("resv")) == "1\n"  # a fault uses a reserved page
    s.touch(addr + GiB, 1)
    assert s.read_text(ALL_1G.format("resv")) == "0\n"
    assert sum(_free_1g(s)) == 58
    s.call("shmdt", addr)
    s.call("shm_rmid", shmid)
    assert _free_1g(s) == [30, 30]
    # Reservations count across segments: 40 of 60 free pages, then 40 more fails.
    first = s.call("shmget", 0, 40 * GiB, _huge_flags(30))
    with pytest.raises(OSError) as e:
        s.call("shmget", 0, 40 * GiB, _huge_flags(30))
    assert e.value.errno == 12 and "20 free and unreserved" in str(e.value)
    s.call("shm_rmid", first)  # never attached: its reservation goes back
    assert s.read_text(ALL_1G.format("resv")) == "0\n"
    s.call("shm_rmid", s.call("shmget", 0, 40 * GiB, _huge_flags(30)))
    # A process allowed only node 0 (30 free) cannot reserve 40.
    with pytest.raises(OSError) as e:
        s.process(mems_allowed=[0]).call("shmget", 0, 40 * GiB, _huge_flags(30))
    assert e.value.errno == 12


def test_sim_shm_hugetlb_default_and_unknown_sizes():
    # No size in the flags: the machine's default (Hugepagesize), 512 MiB on GH200.
    g = sim("gh200", arch="aarch64")
    assert "Hugepagesize:     524288 kB" in g.read_text("/proc/meminfo")
    addr = g.call("shmat", g.call("shmget", 0, 600 * MiB, _huge_flags(0)))
    g.touch(addr, 600 * MiB)
    line = next(x for x in g.render_numa_maps().splitlines() if x.startswith(f"{addr:08x} "))
    assert "kernelpagesize_kB=524288" in line and " N0=2 " in line, line
    assert "HugePages_Rsvd:        0" in g.read_text("/proc/meminfo")
    s = sim("dual-socket-8gpu")
    with pytest.raises(OSError) as e:  # no 32 MiB hstate on x86: EINVAL
        s.call("shmget", 0, 64 * MiB, _huge_flags(25))
    assert e.value.errno == 22
    one = sim("single-node")  # a 1 GiB hstate with no pages: the reservation fails
    with pytest.raises(OSError) as e:
        one.call("shmget", 0, GiB, _huge_flags(30))
    assert e.value.errno == 12
