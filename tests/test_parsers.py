"""Pure parsers: good input, and garbage that must raise ValueError naming the source."""

import pytest
from conftest import nu, nur

CPULISTS = [
    ("0", {0}),
    ("0-3", {0, 1, 2, 3}),
    ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}),
    ("0,8,250-255", {0, 8, 250, 251, 252, 253, 254, 255}),
    ("", set()),
    ("\n", set()),
    ("5\n\0", {5}),  # files ending in "\n\0"
    (" 1-2 , 4 ", {1, 2, 4}),
    ("0-15:2/4", {0, 1, 4, 5, 8, 9, 12, 13}),  # stride syntax
    ("3-3", {3}),
]


@pytest.mark.parametrize("text,want", CPULISTS, ids=[repr(t) for t, _ in CPULISTS])
def test_parse_cpulist(text, want):
    assert nu.parse_cpulist(text) == frozenset(want)


BAD_CPULISTS = [
    "a",
    "1-",
    "-1",
    "3-1",
    "1,,2",
    "0x3",
    "1-2-3",
    "0-3:0/2",
    "0-3:3/2",
    "1.5",
    "0-99999999999",
    "１",
]


@pytest.mark.parametrize("text", BAD_CPULISTS)
def test_parse_cpulist_rejects_garbage(text):
    with pytest.raises(ValueError) as ei:
        nu.parse_cpulist(text, source="/sys/x/cpulist")
    assert "/sys/x/cpulist" in str(ei.value)
    assert repr(text) in str(ei.value) or text.strip() in str(ei.value)


@pytest.mark.parametrize(
    "ids,text",
    [
        ([], ""),
        ([0], "0"),
        ([0, 1, 2, 3, 8], "0-3,8"),
        ([5, 3, 4], "3-5"),
        ([0, 2, 4], "0,2,4"),
        ([0, 8, 250, 251, 252, 253, 254, 255], "0,8,250-255"),
    ],
)
def test_format_cpulist(ids, text):
    assert nu.format_cpulist(ids) == text
    assert nu.parse_cpulist(text) == frozenset(ids)


CPUMAPS = [
    ("00000001", {0}),
    ("0000000f", {0, 1, 2, 3}),
    ("00000001,00000000", {32}),
    ("80000000,00000000,00000001", {0, 95}),
    ("ff\n\0", set(range(8))),
    ("", set()),
]


@pytest.mark.parametrize("text,want", CPUMAPS, ids=[repr(t) for t, _ in CPUMAPS])
def test_parse_cpumap(text, want):
    assert nu.parse_cpumap(text) == frozenset(want)


@pytest.mark.parametrize("text", ["zz", "000000001", "1,,2", "0x1", "12 34"])
def test_parse_cpumap_rejects_garbage(text):
    with pytest.raises(ValueError, match="node0/cpumap"):
        nu.parse_cpumap(text, source="node0/cpumap")


@pytest.mark.parametrize("text", ["1234567,123456789", "0000000,000000001"])
def test_parse_cpumap_rejects_a_word_longer_than_8_digits(text):
    # As long as the kernel's "xxxxxxxx,xxxxxxxx" (two words of 8), yet one word has 9
    # digits: its bits would land in the wrong places.
    with pytest.raises(ValueError, match="word '123456789'|word '000000001'"):
        nu.parse_cpumap(text, source="node0/cpumap")


NODE_MEMINFO = """Node 1 MemTotal:       263782656 kB
Node 1 MemFree:        250000000 kB
Node 1 Active(file):       12345 kB
Node 1 HugePages_Total:     4
"""


def test_parse_meminfo_node_file():
    mi = nu.parse_meminfo(NODE_MEMINFO)
    assert mi == {
        "MemTotal": 263782656,
        "MemFree": 250000000,
        "Active(file)": 12345,
        "HugePages_Total": 4,
    }


def test_parse_meminfo_proc_file():
    mi = nu.parse_meminfo("MemTotal:  100 kB\nMemFree: 50 kB\nHugePages_Free: 0\n")
    assert mi["MemTotal"] == 100 and mi["MemFree"] == 50 and mi["HugePages_Free"] == 0


@pytest.mark.parametrize(
    "text",
    [
        "MemTotal 100 kB",
        "MemTotal: lots kB",
        "MemTotal: 100 MB",
        "Node x MemTotal: 1 kB",
        "Node 0",
        ": 5 kB",
        "MemTotal:",
        "MemTotal: 1 kB extra",
    ],
)
def test_parse_meminfo_rejects_garbage(text):
    with pytest.raises(ValueError, match="meminfo-source"):
        nu.parse_meminfo(text, source="meminfo-source")


def test_parse_distance_row():
    assert nu.parse_distance_row("10 21 21 31\n") == (10, 21, 21, 31)
    assert nu.parse_distance_row("10\n\0") == (10,)


@pytest.mark.parametrize("text", ["", "10 x", "10 -1", "10 21.5", "10 0", "10 999"])
def test_parse_distance_row_rejects_garbage(text):
    with pytest.raises(ValueError, match="node3/distance"):
        nu.parse_distance_row(text, source="node3/distance")


# /proc/sysvipc/shm as ipc/shm.c prints it (a 64-bit kernel; the header, then one row
# per segment: key shmid perms size cpid lpid nattch uid gid cuid cgid atime dtime
# ctime rss swap).  A negative key is the kernel's signed print of a key >= 2**31.
SYSVIPC_SHM = (
    "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  "
    "cuid  cgid      atime      dtime      ctime                   rss                  "
    "swap\n"
    "1308622848      32768   600               2097152  4242  4243      1  1000  1000  "
    "1000  1000 1764650000 1764650100 1764649000               2097152                     0\n"
    "-1          32769  1666                  4096   100   100      0     0     0     "
    "0     0          0          0 1764640000                     0                     0\n"
)


def test_parse_sysvipc_shm_reads_every_segment():
    first, second = nur.parse_sysvipc_shm(SYSVIPC_SHM)
    assert (first.key, first.id, first.mode, first.size) == (0x4E000000, 32768, 0o600, 2097152)
    assert (first.cpid, first.lpid, first.nattch) == (4242, 4243, 1)
    assert (first.uid, first.gid, first.cuid, first.cgid) == (1000, 1000, 1000, 1000)
    assert first.used == 1764650100  # the latest of atime, dtime, ctime
    assert (second.key, second.mode, second.used) == (0xFFFFFFFF, 0o1666, 1764640000)


def test_parse_sysvipc_shm_names_a_malformed_row():
    bad = SYSVIPC_SHM.replace("32769", "3276x")
    with pytest.raises(ValueError, match="invalid /proc/sysvipc/shm line"):
        list(nur.parse_sysvipc_shm(bad))
