# SPDX-License-Identifier: Apache-2.0
"""The identity record a region ends in: its room is a VMA of its own, on a node the
data's policy allows, outside what placement reports; a reader checks every field it
acts on against the kernel's facts (the size mapped, the mapping's page size, node
ids), and damage of any shape (deep nesting, forged fields) is a ValueError, never a
crash; fit() weighs the room as create maps it."""

import errno
import struct
import zlib

import pytest
from conftest import nu, nur, run_private_shm, sim

MiB = 1 << 20
PAGE = 4096


def forge(region, raw):
    """Write ``raw`` as the record ending the region's mapping, with a valid trailer
    and checksum: what any writer of the region can do."""
    import ctypes

    blob = raw + struct.pack("<8sIII", b"numa_utl", 1, len(raw), zlib.crc32(raw))
    end = region.address + region._mapped
    ctypes.memmove(end - len(blob), blob, len(blob))


def region_lines(b, region):
    """The numa_maps entries of this process's mapping of ``region``: data first."""
    maps = nu.parse_numa_maps(b.read_text("/proc/self/numa_maps"))
    end = region.address + region._mapped
    return [e for e in maps if region.address <= e.start < end]


# -- 26.6: the room is its own VMA, on a node the policy allows -------------------------

CASES = [
    # policy, nodes, where the data's pages must be (bytes per node of 16 MiB)
    ("interleave", [0, 1], {0: 8 * MiB, 1: 8 * MiB}),
    ("bind", [1], {1: 16 * MiB}),
    ("prefer", [1], {1: 16 * MiB}),
    ("bind", [0, 1], None),  # either node; never another
]


@pytest.mark.parametrize("kind", ["sysv", "posix"])
@pytest.mark.parametrize("policy,nodes,want", CASES)
def test_record_room_is_its_own_vma_on_an_allowed_node(kind, policy, nodes, want):
    s = sim("qemu-x86_64-two-node", free_kb={0: 200 << 10, 1: 200 << 10})
    r = nur.SharedRegion.create("rr", 16 * MiB, policy=policy, nodes=nodes, kind=kind, backend=s)
    try:
        p = s.process()
        a = nur.SharedRegion.attach("rr", kind=kind, prefault=True, backend=p)
        for b, reg in ((s, r), (p, a)):
            data, room = region_lines(b, reg)
            assert data.start == reg.address and room.start == reg.address + reg.size
            got = data.bytes_per_node
            assert sum(got.values()) == 16 * MiB, (kind, policy, got)
            if want is not None:
                assert got == want, (kind, policy, got)
            assert set(got) <= set(nodes)
            assert set(room.pages) <= set(nodes)
            if reg is r:  # the creator placed all of the room
                assert room.pages_total * PAGE == reg._mapped - reg.size
            assert room.policy != data.policy
            assert reg.placement() == got
            (ext,) = reg.placement(by_extent=True)
            assert ext.ok and dict(ext) == got
        a.close()
    finally:
        r.destroy()


def test_record_room_of_hugetlb_region_is_no_huge_page():
    # Its room is a record segment of base pages (test_huge_record.py has the rest).
    s = sim("dual-socket-8gpu")
    with nur.SharedRegion.create(
        "hr", 8 * MiB, policy="interleave", nodes=[0, 1], hugepages="2M", backend=s
    ) as r:
        (data,) = region_lines(s, r)
        assert data.huge and data.bytes_per_node == {0: 4 * MiB, 1: 4 * MiB}
        maps = nu.parse_numa_maps(s.read_text("/proc/self/numa_maps"))
        (room,) = [e for e in maps if e.start == r._room()[0]]
        assert not room.huge and set(room.pages) <= {0, 1}


def test_record_written_after_the_room_policy():
    # A region whose room policy cannot be set (mbind denied) still works; the record
    # is written once the policies are set, so the room's page is placed by them.
    s = sim("qemu-x86_64-two-node", cap_sys_nice=False)
    s.fail("mbind", errno.EPERM)
    with nur.SharedRegion.create("np", 1 * MiB, policy="interleave", backend=s) as r:
        assert r.policy.placed_by == "thread" and r.policy.reason == "EPERM"
        with nur.SharedRegion.attach("np", backend=s.process()) as a:
            assert a.identity["key"] == "np"


# -- 26.11: nested JSON ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_nested_record_is_damage_not_a_crash(kind):
    s = sim("qemu-x86_64-two-node")
    r = nur.SharedRegion.create("nest", 1 * MiB, kind=kind, prefault=False, backend=s)
    try:
        forge(r, b"[" * 3000 + b"]" * 3000)
        with pytest.raises(ValueError, match="damaged identity record"):
            nur.SharedRegion.attach("nest", kind=kind, backend=s.process())
        # "nested too deeply" where json's decoder gives up (RecursionError); Python
        # 3.13's decodes 3,000 levels, and the record's fields are then the damage.
        with pytest.raises(ValueError, match=r"damaged identity record \((nested|fields)"):
            nur._record_read(r.address, r._mapped, "x")
        rows = nur._our_segments(s.process(), min_age=0)
        assert [x for x in rows if "unreadable" in str(x.get("why", ""))], rows
    finally:
        r.destroy()


def test_nested_record_in_a_file_read_in_place(tmp_path):
    raw = b"{" + b'"a":{' * 3000 + b"}" * 3001
    path = tmp_path / "f"
    data = bytearray(64 * 1024)
    blob = raw[: 16000 - 16] if len(raw) > 16000 else raw
    blob = blob + struct.pack("<8sIII", b"numa_utl", 1, len(blob), zlib.crc32(blob))
    data[-len(blob) :] = blob
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged identity record"):
        nur._file_record(str(path))


# -- 26.12: forged fields ----------------------------------------------------------------


def _good(r, **change):
    import json

    rec = dict(r.identity, **change)
    return json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize("kind", ["sysv", "posix"])
def test_forged_page_size_of_a_size_that_fits_is_refused(kind):
    # 4 MiB - 16 KiB of data: 4 MiB mapped, so a 2 MiB page_size with size 2 MiB adds
    # up (size + one 2 MiB room == mapped); only the kernel's page size refutes it.
    s = sim("qemu-x86_64-two-node")
    r = nur.SharedRegion.create("pg", 4 * MiB - 16 * 1024, kind=kind, prefault=False, backend=s)
    try:
        assert r._mapped == 4 * MiB
        forge(r, _good(r, page_size=2 * MiB, size=2 * MiB, layout=f"{2 * MiB}:interleave:0-1"))
        before = [c for c in s.kernel.calls if c[0] == "mbind"]
        with pytest.raises(ValueError, match="page_size"):
            nur.SharedRegion.attach("pg", kind=kind, backend=s.process())
        assert [c for c in s.kernel.calls if c[0] == "mbind"] == before  # none aimed
    finally:
        r.destroy()


@pytest.mark.parametrize(
    "change",
    [
        {"page_size": 1},
        {"page_size": 3 * PAGE},
        {"page_size": True},
        {"size": 0},
        {"size": PAGE},  # size + room != the mapped size
        {"layout": "1M:bind:5000"},
        {"layout": 7},
    ],
    ids=["page1", "page3x", "pagebool", "size0", "size-room", "node5000", "layout-int"],
)
def test_forged_fields_are_refused(change):
    s = sim("qemu-x86_64-two-node")
    r = nur.SharedRegion.create("ff", 1 * MiB, prefault=False, backend=s)
    try:
        forge(r, _good(r, **change))
        with pytest.raises(ValueError, match="damaged identity record"):
            nur.SharedRegion.attach("ff", backend=s.process())
    finally:
        r.destroy()


def test_forged_layout_of_many_node_ids_is_refused_before_it_is_parsed(monkeypatch):
    # Under 16 KiB of text naming 1,024 ids per extent, a thousand times over: the
    # attach refuses it by its text, before Layout.parse builds a set for each list.
    s = sim("qemu-x86_64-two-node")
    r = nur.SharedRegion.create("ids", 1 * MiB, prefault=False, backend=s)
    try:
        many = "/".join(["1k:interleave:0-1023"] * 700)
        forge(r, _good(r, layout=many))
        parsed = []
        real_parse = nur.Layout.parse
        monkeypatch.setattr(
            nur.Layout, "parse", lambda text: parsed.append(text) or real_parse(text)
        )
        with pytest.raises(ValueError, match="node ids"):
            nur.SharedRegion.attach("ids", backend=s.process())
        assert parsed == []
    finally:
        r.destroy()


def test_forged_huge_length_is_refused():
    # A 48 MiB record (valid JSON, checksum and fields) ending a 64 MiB region.
    s = sim("qemu-x86_64-two-node", free_kb={0: 200 << 10, 1: 200 << 10})
    r = nur.SharedRegion.create("big", 64 * MiB, prefault=False, backend=s)
    try:
        raw = _good(r, size=8 * MiB)
        forge(r, raw[:-1] + b" " * (48 * MiB - len(raw)) + b"}")
        with pytest.raises(ValueError, match="length"):
            nur.SharedRegion.attach("big", backend=s.process())
    finally:
        r.destroy()


def test_record_never_written_over_the_last_use_slot():
    import ctypes
    import struct
    import zlib

    s = sim("qemu-x86_64-two-node")
    with nur.SharedRegion.create("ok", 1 * MiB, backend=s) as r:
        slot = ctypes.string_at(r.address + r.size, nur._RECORD_SLOT)
        # The slot holds the last use (its own magic and checksum), no record bytes.
        assert nur._slot_read(slot)["pid"] == s.call("whoami")["pid"]
        # Every byte of it is the slot's: its last four are the CRC-32 of the other 60,
        # so a record byte written over any of them would show. (A byte-pattern check
        # such as b"{" not in slot fails when the time or a checksum holds that byte.)
        assert slot[:8] == b"numa_use"
        assert struct.unpack("<I", slot[-4:])[0] == zlib.crc32(slot[:-4])
        rest = len(_good(r)) - len("ok")  # the record's bytes besides its key
    # A record that would reach into the slot (it fits the room less the trailer).
    key = "k" * (nur._RECORD_ROOM - 16 - rest - 8)
    with pytest.raises(ValueError, match="does not fit"):
        nur.SharedRegion.create(key, 1 * MiB, backend=s)
    assert not s.kernel.objects


# -- 26.15: fit weighs what create maps --------------------------------------------------


def test_fit_weighs_the_record_room_on_a_small_dev_shm():
    s = sim("qemu-x86_64-two-node", shm_size=1 * MiB)
    verdict = nur.fit(1 * MiB, kind="posix", backend=s)
    assert not verdict and "/dev/shm" in verdict.reason
    with pytest.raises(OSError) as e:
        nur.SharedRegion.create("small", 1 * MiB, kind="posix", prefault=False, backend=s)
    assert e.value.errno == errno.ENOSPC and "/dev/shm" in str(e.value)
    assert nur._region_mapped(1 * MiB, PAGE, 0) == 1 * MiB + nur._RECORD_ROOM
    assert nur.fit(1 * MiB - nur._RECORD_ROOM, kind="posix", backend=s)


def test_fit_counts_the_room_on_its_node():
    s = sim("qemu-x86_64-two-node")
    got = {f.node: f.needed for f in nur.fit(8 * MiB, nodes=[0, 1], backend=s).nodes}
    assert got == {0: 4 * MiB + nur._RECORD_ROOM, 1: 4 * MiB}


def test_huge_pages_missing_names_the_node_that_is_short():
    b = sim("sparse-ids")  # 2 MiB pages reserved on node 0 only
    r = nur.fit(64 * MiB, nodes=[0, 250], hugepages="2M", backend=b)
    assert not r and "reserved on node 250" in r.reason and "0,250" not in r.reason
    with pytest.raises(OSError, match="reserved on node 250"):
        nur._huge_size(True, b, frozenset({0, 250}))


_SMALL_SHM = r"""
import errno, subprocess, sys
import numa_utils as nu, numa_utils_regions as nur, numa_utils_threads as nut
subprocess.run(["mount", "-o", "remount,size=1m", "/dev/shm"], check=True)
try:
    nur.SharedRegion.create("tiny", 1 << 20, kind="posix", prefault=False)
except OSError as e:
    print("errno", e.errno, "/dev/shm" in str(e))
else:
    print("created")
"""


@pytest.mark.realkernel
def test_create_on_a_full_dev_shm_is_enospc_naming_it():
    out = run_private_shm(_SMALL_SHM)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == ["errno", str(errno.ENOSPC), "True"], out.stdout
