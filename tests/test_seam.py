"""The backend seam (issue 28 §5): five file methods, ``touch`` and one kernel entry,
``call(name, *args)``, whose operations the docstring of ``Backend.call`` lists."""

import ast
import ctypes
import errno
import inspect

import pytest
from conftest import REPO, fixture_root, fixture_tree, hook_call, nu, nur, nusim, saved_backend, sim

# What a backend is, written out here: not read from the library.
FILES = {"read_text", "listdir", "exists", "realpath", "write_text"}
KERNEL = {"call", "touch"}
DESCRIPTION = {"root", "abi", "page_size", "is_live", "has_process"}


def _class(tree, name):
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def test_backend_has_at_most_8_public_methods():
    cls = _class(ast.parse((REPO / "numa_utils.py").read_text(encoding="utf-8")), "Backend")
    methods = {
        n.name for n in cls.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
    }
    attributes = {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    assert len(methods) <= 8, sorted(methods)
    assert methods | attributes == FILES | KERNEL | DESCRIPTION


def _table(doc):
    """The names in the operation table of a docstring."""
    lines = inspect.getdoc(doc).splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("====")]
    assert len(rules) == 3, "the table: a rule, the header, a rule, the rows, a rule"
    rows = lines[rules[1] + 1 : rules[2]]
    return {row.split()[0] for row in rows if row and not row[0].isspace()}


def _documented_calls():
    """The core's operations (Backend.call's table) and the shared memory that
    numa_utils_regions adds (its _serve_shared_memory's table), which never overlap."""
    core, regions = _table(nu.Backend.call), _table(nur._serve_shared_memory)
    assert not core & regions, sorted(core & regions)
    return core | regions


def test_the_core_documents_only_its_own_operations_and_regions_serves_the_rest():
    regions = _table(nur._serve_shared_memory)
    assert {"shmget", "shm_open", "mmap", "whoami"} <= regions
    assert set(nu._LINUX_OPERATIONS) == regions
    core = ast.parse((REPO / "numa_utils.py").read_text(encoding="utf-8"))
    linux = _class(core, "LinuxBackend")
    own = {n.name[len("_call_") :] for n in linux.body if isinstance(n, ast.FunctionDef)}
    assert not own & regions, sorted(own & regions)


def _calls_made(path):
    """The operations a file asks of a backend: ``.call("name", ...)``."""
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    made = set()
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "call"
            and n.args
            and isinstance(n.args[0], ast.Constant)
            and isinstance(n.args[0].value, str)
        ):
            made.add(n.args[0].value)
    return made


def test_the_table_lists_25_operations():
    # 25 when the seam was cut: a new operation is added to the table and to both
    # backends, and to this count.
    assert len(_documented_calls()) == 25, sorted(_documented_calls())


@pytest.mark.parametrize("backend", ["LinuxBackend", "SimulatedBackend"])
def test_every_documented_operation_is_implemented(backend):
    cls = getattr(nu, backend, None) or getattr(nusim, backend)
    served = nu._LINUX_OPERATIONS if backend == "LinuxBackend" else {}
    missing = sorted(
        n
        for n in _documented_calls()
        if not callable(getattr(cls, f"_call_{n}", None)) and n not in served
    )
    assert not missing, f"{backend} lacks {missing}"


@pytest.mark.parametrize(
    "path", ["numa_utils.py", "numa_utils_regions.py", "numa_utils_threads.py", "numa_utils_cli.py"]
)
def test_the_library_makes_only_documented_calls(path):
    undocumented = _calls_made(path) - _documented_calls()
    assert not undocumented, f"{path} calls {sorted(undocumented)}, not in Backend.call's table"


def test_an_unknown_operation_is_an_error_not_a_silent_none():
    with pytest.raises(AttributeError, match="_call_shmgte"):
        sim("single-node").call("shmgte", 1, 2, 3)


def test_a_saved_tree_refuses_every_kernel_operation():
    saved = saved_backend(fixture_root("single-node"))
    for name, args in [("shmget", (0, 4096, 0)), ("madvise", (0, 4096, 0)), ("syscall", (39,))]:
        with pytest.raises(nu.NotLiveError):
            saved.call(name, *args)


def test_a_saved_tree_refuses_a_write_and_its_file_stays():
    saved = saved_backend(fixture_root("single-node"))
    before = saved.read_text("/sys/devices/system/node/online")
    with pytest.raises(nu.NotLiveError):
        saved.write_text("/sys/devices/system/node/online", "0-7\n")
    assert saved.read_text("/sys/devices/system/node/online") == before


def test_one_overridden_call_sees_every_shared_memory_operation():
    seen = []

    class Watching(nusim.SimulatedBackend):
        def call(self, name, *args):
            seen.append(name)
            return super().call(name, *args)

    region = nur.SharedRegion.create(
        "watched", 1 << 20, kind="posix", backend=Watching(fixture_root("single-node"))
    )
    region.destroy()
    assert {"shm_open", "ftruncate", "mmap", "munmap", "close", "shm_unlink"} <= set(seen), seen


def test_hook_call_makes_one_operation_fail_and_leaves_the_rest():
    s = sim("single-node")
    hook_call(s, "shmget", lambda *args: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(OSError) as err:
        nur.SharedRegion.create("full", 1 << 20, kind="sysv", backend=s)
    assert err.value.errno == errno.ENOSPC
    assert s.call("geteuid") == s.uid


# -- the public calls the CLI is built on -----------------------------------------------


def test_backend_for_root_reads_this_system_or_a_saved_tree(tmp_path):
    assert nusim.backend_for_root(None) is nu.default_backend()
    assert nusim.backend_for_root("/") is nu.default_backend()
    saved = nusim.backend_for_root(fixture_root("single-node"))
    assert not saved.is_live
    assert nu.read_topology(backend=saved).nodes_with_memory == frozenset({0})
    folder = nusim.backend_for_root(fixture_tree("single-node", tmp_path / "tree"))
    assert nu.read_topology(backend=folder).nodes_with_memory == frozenset({0})
    with pytest.raises(FileNotFoundError):
        nusim.backend_for_root(str(tmp_path / "absent"))
    (tmp_path / "root" / "sys").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"not a saved tree .*did you mean .*/root\?"):
        nusim.backend_for_root(str(tmp_path))


def test_identity_record_read_from_the_bytes_alone():
    s = sim("dual-socket-8gpu")
    region = nur.SharedRegion.create("kv-rec", 3 << 20, layout="parts:bind:0/1", backend=s)
    try:
        mapped = region._mapped  # the data and the record after it

        def read(offset, n):
            return ctypes.string_at(region.address + offset, n)

        record = nur.read_identity_record(read, mapped, "kv-rec")
        assert record["key"] == "kv-rec" and record["size"] == 3 << 20
        assert str(nur.record_layout(record)) == str(region.layout)
        # The same bytes cut short of their record: none, not an error.
        assert nur.read_identity_record(read, mapped - 4096, "kv-rec") is None
    finally:
        region.destroy()


def test_record_segment_key_keeps_the_name_bits_under_its_own_prefix():
    key = nur.SYSV_KEY_PREFIX | 0x123456
    room = nur.record_segment_key(key)
    assert room & 0xFFFFFF == 0x123456
    assert room & nur.SYSV_KEY_MASK != nur.SYSV_KEY_PREFIX  # never a data segment's key
