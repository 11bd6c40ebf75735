# SPDX-License-Identifier: Apache-2.0
"""Fleet exports (status --format nfd; plan --format oci, nri, gres, srun, ray) on every
saved machine: a golden output each (tests/fleet_golden.json), and each output checked
by a validator written here from its consumer's published rules, not by our formatter:

- Kubernetes labels (k8s.io/apimachinery validation: IsQualifiedName, IsValidLabelValue)
  and Node Feature Discovery's local source (docs/usage/customization-guide.md "Feature
  files"; source/local/local.go: `# +expiry-time=` read with Go's time.RFC3339, files
  over 64 KiB ignored, kubernetes.io namespaces refused);
- the OCI runtime spec, config-linux.md "Memory policy" and features-linux.md
  "MemoryPolicy" (the mode and flag names);
- nri-plugins' memory-policy plugin (cmd/plugins/memory-policy: the annotation keys,
  the YAML fields, the modes and flags it accepts, a node list starting with a digit);
- Slurm's gres.conf(5) (Name, File, Cores as logical core indices) and srun(1)
  (--cpu-bind=mask_cpu:<hex>,... one mask per task; --mem-bind=map_mem:<node>,...);
- Ray's `ray start --resources` (a JSON object of custom resource name -> quantity;
  CPU, GPU, memory and object_store_memory are Ray's own and refused there).

Set NUMA_UTILS_REGEN_GOLDEN=1 to rewrite the goldens after a deliberate change.
"""

import calendar
import datetime
import errno
import io
import json
import os
import pathlib
import re
import stat
import subprocess
import sys
import time
import types
from contextlib import redirect_stdout

import pytest
from conftest import FIXTURES, REPO, cli, fixture_root, fixture_tree, nu, saved_backend

GOLDEN = REPO / "tests" / "fleet_golden.json"
FIXED_EXPIRY = calendar.timegm((2030, 1, 2, 3, 4, 5, 0, 0, 0))
PLAN_CASES = (("node", "oci"), ("node", "nri"), ("node", "gres"), ("node", "srun"))
PLAN_CASES += (("node", "ray"), ("exclusive", "gres"), ("exclusive", "srun"))

# --- Kubernetes' label rules (apimachinery/pkg/util/validation/validation.go) ------
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = re.compile(rf"{DNS1123_LABEL}(\.{DNS1123_LABEL})*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})")


def label_problem(name, value):
    """Why Kubernetes (and NFD) would refuse the label, or None."""
    prefix, slash, part = name.rpartition("/")
    if not slash:
        return "NFD's local source wants a namespace: prefix/name"
    if len(prefix) > 253 or not DNS1123_SUBDOMAIN.fullmatch(prefix):
        return f"prefix {prefix!r} is not a DNS subdomain"
    for denied in ("kubernetes.io", "k8s.io"):
        if prefix == denied or prefix.endswith("." + denied):
            return f"NFD refuses the {denied} namespace"
    if len(part) > 63 or not QUALIFIED_NAME.fullmatch(part):
        return f"name {part!r} is not a qualified name"
    if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
        return f"value {value!r} is not a label value"
    return None


def parse_expiry(text):
    """NFD's reading: time.Parse(time.RFC3339, value) -> seconds since the epoch."""
    m = RFC3339.fullmatch(text.strip())
    assert m, f"expiry-time {text!r} is not RFC 3339"
    parsed = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return parsed.timestamp()


def parse_feature_file(text):
    """NFD's local source: (labels, expiry) from a feature file; fails the test on a
    line NFD would refuse."""
    assert len(text.encode()) <= 65536, "NFD ignores a feature file over 64 KiB"
    labels, expiry = {}, None
    for line in text.splitlines():
        if line.startswith("# +"):
            key, eq, value = line[3:].partition("=")
            assert key == "expiry-time" and eq, f"unknown directive {line!r}"
            expiry = parse_expiry(value)
            continue
        if line.startswith("#") or not line.strip():
            continue
        name, eq, value = line.partition("=")
        value = value if eq else "true"
        assert name not in labels, f"label {name} twice"
        problem = label_problem(name, value)
        assert problem is None, f"{line!r}: {problem}"
        labels[name] = value
    return labels, expiry


def decode_list(value):
    """A label list "0-3_8" back to ids (our documented encoding: '_' for ',')."""
    ids = set()
    for part in value.split("_"):
        lo, _, hi = part.partition("-")
        ids.update(range(int(lo), int(hi or lo) + 1))
    return ids


def test_label_validator_refuses_what_kubernetes_refuses():
    good = ("numa-utils.io/node.0.kind", "dram")
    assert label_problem(*good) is None
    assert label_problem("numa-utils.io/x", "") is None  # an empty value is allowed
    for bad in (
        ("numa-utils.io/memory-nodes", "0-3,8"),  # comma
        ("numa-utils.io/x", "a" * 64),  # value too long
        ("numa-utils.io/" + "n" * 64, "1"),  # name part too long
        ("numa-utils.io/-x", "1"),  # must start alphanumeric
        ("Numa-Utils.io/x", "1"),  # prefix: lowercase DNS subdomain
        ("nodes", "1"),  # NFD wants a namespace
        ("feature.kubernetes.io/x", "1"),  # refused namespace
        ("numa-utils.io/x", "0-"),  # must end alphanumeric
    ):
        assert label_problem(*bad) is not None, bad
    with pytest.raises(AssertionError):
        parse_expiry("2030-01-02 03:04:05")


# --- the OCI runtime spec and nri-plugins -----------------------------------------
OCI_MODES = {
    "MPOL_DEFAULT",
    "MPOL_BIND",
    "MPOL_INTERLEAVE",
    "MPOL_WEIGHTED_INTERLEAVE",
    "MPOL_PREFERRED",
    "MPOL_PREFERRED_MANY",
    "MPOL_LOCAL",
}
OCI_FLAGS = {"MPOL_F_NUMA_BALANCING", "MPOL_F_RELATIVE_NODES", "MPOL_F_STATIC_NODES"}
ID_LIST = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")


def ids_of(text):
    assert ID_LIST.fullmatch(text), f"{text!r} is not a list such as 0-3,7"
    return decode_list(text.replace(",", "_"))


def check_memory_policy(policy, memory_nodes):
    """config-linux.md: mode (REQUIRED) one of the MPOL_* names; nodes, a list, for
    every mode but MPOL_DEFAULT and MPOL_LOCAL, which take none; flags optional."""
    assert set(policy) <= {"mode", "nodes", "flags"}, policy
    assert policy["mode"] in OCI_MODES
    if policy["mode"] in ("MPOL_DEFAULT", "MPOL_LOCAL"):
        assert not policy.get("nodes"), policy
    else:
        assert ids_of(policy["nodes"]) <= memory_nodes, policy
    assert set(policy.get("flags", [])) <= OCI_FLAGS


def check_oci(out, rep, plans):
    memory_nodes = set(rep["kernel"]["nodes_with_memory"])
    cpus = set(rep["kernel"]["online_cpus"])
    items = json.loads(out)
    assert len(items) == len(plans)
    for item, plan in zip(items, plans):
        linux = item["linux"]
        assert set(linux) <= {"resources", "memoryPolicy"}
        cpu = linux["resources"]["cpu"]
        assert set(cpu) <= {"cpus", "mems"}
        assert ids_of(cpu["cpus"]) == set(plan.cpus) and ids_of(cpu["cpus"]) <= cpus
        if "mems" in cpu:
            assert ids_of(cpu["mems"]) <= memory_nodes
        if "memoryPolicy" in linux:
            check_memory_policy(linux["memoryPolicy"], memory_nodes)
            if "nodes" in linux["memoryPolicy"]:
                assert ids_of(linux["memoryPolicy"]["nodes"]) == set(plan.memory_nodes)


NRI_KEY = re.compile(r"policy\.memory-policy\.nri\.io(/container\.(?P<name>.+))?")
NRI_MODES = OCI_MODES  # the plugin's MpolMode_value table
NRI_FLAGS = OCI_FLAGS  # the plugin's MpolFlag_value table


def parse_nri_value(value):
    """The plugin's YAML (mode, nodes, flags), read with a reader for the plain
    'key: scalar' lines it takes; nodes must be a YAML string (a bare 0 is an int)."""
    out = {}
    for line in value.splitlines():
        key, colon, scalar = line.partition(": ")
        assert colon and key in ("mode", "nodes", "flags"), line
        out[key] = scalar
    assert out["nodes"].startswith('"') and out["nodes"].endswith('"'), out
    out["nodes"] = out["nodes"][1:-1]
    return out


def check_nri(out, rep, plans, one_pod):
    annotations = json.loads(out)["metadata"]["annotations"]
    memory_nodes = set(rep["kernel"]["nodes_with_memory"])
    for key, value in annotations.items():
        m = NRI_KEY.fullmatch(key)
        assert m, key
        assert (m.group("name") is None) == one_pod
        if m.group("name") is not None:
            assert QUALIFIED_NAME.fullmatch("container." + m.group("name"))
            assert DNS1123_SUBDOMAIN.fullmatch(m.group("name"))  # a container's name
        policy = parse_nri_value(value)
        assert policy["mode"] in NRI_MODES
        assert policy["nodes"][:1].isdigit()  # the plugin's hard-coded node list
        assert ids_of(policy["nodes"]) <= memory_nodes
    with_nodes = [
        p for p in plans if p.memory not in (None, "local") and p.memory_nodes and p.gpu is not None
    ]
    assert len(annotations) == len(with_nodes)


# --- Slurm ------------------------------------------------------------------------
GRES_KEYS = {"name", "type", "file", "cores", "count", "links", "flags", "multiplefiles"}


def physical_cores(topo, cpus):
    """The distinct cores (package, core id) of ``cpus``; a CPU of unknown core is one."""
    out = set()
    for c in cpus:
        cpu = topo.cpus[c]
        out.add((cpu.package, cpu.core) if cpu.core is not None else (cpu.package, None, c))
    return out


def check_gres(out, topo, plans):
    total_cores = len(physical_cores(topo, topo.cpus))
    lines = [ln for ln in out.splitlines() if not ln.startswith("# GPU ")]
    gres = []
    for line in lines:
        if line.startswith("# no /dev/nvidiaN"):
            continue
        text = line[2:] if line.startswith("# Name=") else line
        params = dict(word.split("=", 1) for word in text.split())
        assert {k.lower() for k in params} <= GRES_KEYS, line
        assert params["Name"] == "gpu"
        if not line.startswith("#"):
            assert re.fullmatch(r"/dev/nvidia[0-9]+", params["File"]), line
        cores = ids_of(params["Cores"])
        assert cores and max(cores) < total_cores, line
        gres.append(cores)
    assert len(gres) == len(plans)
    for cores, plan in zip(gres, plans):
        assert len(cores) == len(physical_cores(topo, plan.cpus))
    for a, pa in zip(gres, plans):
        for b, pb in zip(gres, plans):
            if not (set(pa.cpus) & set(pb.cpus)):
                assert not (a & b), "GPUs on disjoint CPUs share a core index"


def check_srun(out, plans):
    if not plans:
        assert out == ""
        return
    option = [ln for ln in out.splitlines() if not ln.startswith("#")]
    assert len(option) == 1
    words = dict(w.split("=", 1) for w in option[0].split())
    assert int(words["--ntasks-per-node"]) == len(plans)
    kind, colon, masks = words["--cpu-bind"].partition(":")
    assert kind == "mask_cpu" and colon
    masks = masks.split(",")
    assert len(masks) == len(plans)
    for mask, plan in zip(masks, plans):
        assert re.fullmatch(r"(0x)?[0-9a-fA-F]+", mask), mask
        value = int(mask, 16)
        assert {i for i in range(value.bit_length()) if value >> i & 1} == set(plan.cpus)
    if "--mem-bind" in words:
        kind, _, nodes = words["--mem-bind"].partition(":")
        assert kind == "map_mem"
        assert [int(n) for n in nodes.split(",")] == [p.memory_nodes[0] for p in plans]


RAY_RESERVED = {"CPU", "GPU", "memory", "object_store_memory"}


def check_ray(out, plans):
    resources = json.loads(out)
    assert isinstance(resources, dict)
    for name, quantity in resources.items():
        assert isinstance(name, str) and name and name not in RAY_RESERVED
        assert isinstance(quantity, (int, float)) and quantity > 0
    assert sum(resources.values()) == sum(1 for p in plans if p.cpu_node is not None)


# --- rendering every saved machine -------------------------------------------------


def render_all(name):
    """{case: output} for one saved machine, rendered in-process."""
    b = saved_backend(fixture_root(name))
    rep = cli.status_report(backend=b)
    out = {"nfd": cli._render_nfd(rep, FIXED_EXPIRY)}
    plans = {pol: nu.gpu_plans(pol, backend=b) for pol in ("node", "exclusive")}
    for pol, fmt in PLAN_CASES:
        args = ["plan", "--root", fixture_root(name), "--policy", pol, "--format", fmt]
        out[f"{pol}/{fmt}"] = captured(args)
    return out, rep, plans, b


def captured(argv):
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert cli.main(argv) == 0
    return buf.getvalue()


def golden():
    if not GOLDEN.exists():
        return {}
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def goldens():
    have = golden()
    yield have
    if os.environ.get("NUMA_UTILS_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(have, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("name", FIXTURES)
def test_fleet_exports_every_fixture(name, goldens, monkeypatch):
    for var in [v for v in os.environ if v.startswith(("NUMA_UTILS_", "NUMA_"))]:
        if var != "NUMA_UTILS_REGEN_GOLDEN":
            monkeypatch.delenv(var)
    out, rep, plans, b = render_all(name)
    labels, expiry = parse_feature_file(out["nfd"])
    assert expiry == FIXED_EXPIRY
    check_labels_say_what_status_says(labels, rep)
    topo = nu.read_topology(backend=b)
    check_oci(out["node/oci"], rep, plans["node"])
    check_nri(out["node/nri"], rep, plans["node"], one_pod=False)
    check_ray(out["node/ray"], plans["node"])
    for pol in ("node", "exclusive"):
        check_gres(out[f"{pol}/gres"], topo, plans[pol])
        check_srun(out[f"{pol}/srun"], plans[pol])
    if os.environ.get("NUMA_UTILS_REGEN_GOLDEN") == "1":
        goldens[name] = out
    assert name in goldens, "no golden output: run with NUMA_UTILS_REGEN_GOLDEN=1"
    assert out == goldens[name]


def k8s_quantity(size):
    """A byte count as Kubernetes writes a huge page size (hugepages-2Mi): the
    largest binary suffix that divides it."""
    for suffix, unit in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def check_labels_say_what_status_says(labels, rep):
    """The labels against the status report's own fields (the facts, not the text)."""
    p = "numa-utils.io/"
    assert int(labels[p + "nodes"]) == len(rep["nodes"])
    assert int(labels[p + "gpus"]) == len(rep["gpus"])
    for i, gpu in enumerate(rep["gpus"]):
        assert labels[f"{p}gpu.{i}.node"] == (
            "unknown" if gpu["node"] is None else str(gpu["node"])
        )
    nics = [d for d in rep["devices"] if d["kind"] in ("net", "rdma")]  # Ethernet, IB
    assert int(labels[p + "nics"]) == len(nics)
    for i, nic in enumerate(nics):
        assert labels[f"{p}nic.{i}.node"] == str(nic["node"]) or nic["node"] is None
    wi = "false" if rep["interleave_weights"] is None else "true"
    assert labels[p + "weighted-interleave"] == wi
    dram = {n["id"] for n in rep["nodes"] if n["kind"] == "dram"}
    if dram:
        assert decode_list(labels[p + "memory-nodes.dram"]) == dram
    for n in rep["nodes"]:
        assert labels[f"{p}node.{n['id']}.kind"] == n["kind"]
        if n["kind"] == "no-memory":
            assert not [k for k in labels if k.startswith(f"{p}node.{n['id']}.hugepages-")]
            continue
        for size, pages in n["hugepages"].items():
            name = f"{p}node.{n['id']}.hugepages-{k8s_quantity(int(size) * 1024)}"
            assert labels[name] == str(pages["total"])
    if rep["packages"]["nodes_per_package"]:
        assert int(labels[p + "nodes-per-package"]) == rep["packages"]["nodes_per_package"]
    balancing = rep["kernel"]["numa_balancing"]
    assert labels[p + "numa-balancing"] == ("unknown" if balancing is None else str(balancing))


def test_snc_machine_labels_its_clusters():
    """SNC2 over two packages: nodes-per-package 2, and the clusters' hugepages apart."""
    rep = cli.status_report(backend=saved_backend(fixture_root("qemu-x86_64-snc-2x2")))
    labels, _ = parse_feature_file(cli._render_nfd(rep, FIXED_EXPIRY))
    assert labels["numa-utils.io/nodes-per-package"] == "2"
    assert labels["numa-utils.io/packages"] == "2"
    assert decode_list(labels["numa-utils.io/memory-nodes.dram"]) == {0, 1, 2, 3}


def test_cxl_and_gpu_memory_nodes_by_kind():
    cxl = cli.status_report(backend=saved_backend(fixture_root("cxl-qemu-6.12")))
    labels, _ = parse_feature_file(cli._render_nfd(cxl, FIXED_EXPIRY))
    assert labels["numa-utils.io/memory-nodes.cpu-less"] == "2"
    assert labels["numa-utils.io/memory-nodes.lower-tier"] == "2"  # the CXL expander
    assert labels["numa-utils.io/weighted-interleave"] == "true"
    gh = cli.status_report(backend=saved_backend(fixture_root("gh200")))
    labels, _ = parse_feature_file(cli._render_nfd(gh, FIXED_EXPIRY))
    assert labels["numa-utils.io/memory-nodes.gpu"] == "1"
    assert labels["numa-utils.io/node.0.hugepages-512Mi"] == "64"


def test_a_long_list_is_left_out_not_cut():
    rep = cli.status_report(backend=saved_backend(fixture_root("dual-socket-8gpu")))
    many = [dict(rep["nodes"][0], id=i * 2) for i in range(40)]  # 0_2_4_..._78
    rep = dict(rep, nodes=many)
    text = cli._render_nfd(rep, FIXED_EXPIRY)
    labels, _ = parse_feature_file(text)
    assert "numa-utils.io/memory-nodes.dram" not in labels
    assert "# left out: numa-utils.io/memory-nodes.dram: value over 63 characters" in text
    assert labels["numa-utils.io/node.78.kind"] == "dram"


# --- the command line: subprocesses, as a DaemonSet or a launcher runs it --------


def run(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "numa_utils", *args],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_status_nfd_write_expiry_and_read_back(tmp_path):
    before = time.time()
    p = run("status", "--root", fixture_root("dual-socket-8gpu"), "--format", "nfd")
    assert p.returncode == 0, p.stderr
    w = run(
        "status", "--root", fixture_root("dual-socket-8gpu"), "--format", "nfd",
        "--write", str(tmp_path), "--expiry", "30m",
    )  # fmt: skip
    after = time.time()
    assert w.returncode == 0, w.stderr
    assert w.stdout == ""
    path = tmp_path / "numa-utils"
    assert os.listdir(tmp_path) == ["numa-utils"]  # no temp file left
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    labels, expiry = parse_feature_file(path.read_text())
    printed, printed_expiry = parse_feature_file(p.stdout)
    assert labels == printed
    assert before + 3600 - 1 <= printed_expiry <= after + 3600 + 1  # the default, 1h
    assert before + 1800 - 1 <= expiry <= after + 1800 + 1
    assert re.search(r"^# \+expiry-time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", p.stdout, re.M)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--format", "nfd", "--expiry", "0"], "--expiry '0': give a positive time"),
        (["--format", "nfd", "--expiry", "1w"], "--expiry '1w': give a positive time"),
        (["--format", "nfd", "--expiry=-1h"], "--expiry '-1h': give a positive time"),
        (
            ["--format", "nfd", "--expiry", "999999999d"],
            "--expiry '999999999d': the labels would expire after the year 9999",
        ),
        (
            ["--format", "nfd", "--expiry", "2940000d", "--write", "/nonexistent-numa-utils"],
            "--expiry '2940000d': the labels would expire after the year 9999",
        ),
        (["--format", "json", "--write", "/nonexistent"], "--write goes with --format nfd"),
        (["--write", "/nonexistent"], "--write goes with --format nfd"),
        (["--json", "--write", "/nonexistent"], "--write goes with --format nfd"),
        (
            ["--format", "nfd", "--write", "/nonexistent-numa-utils"],
            "--write /nonexistent-numa-utils: no such directory",
        ),
    ],
)
def test_status_nfd_refuses_bad_options(args, message):
    p = run("status", "--root", fixture_root("single-node"), *args)
    assert p.returncode == 2
    assert message in p.stderr
    assert p.stdout == ""


def test_status_nfd_expiry_up_to_the_year_9999():
    """The latest expiry RFC 3339 can write is accepted and read back as NFD reads it."""
    p = run(
        "status", "--root", fixture_root("single-node"), "--format", "nfd", "--expiry", "2900000d"
    )
    assert p.returncode == 0, p.stderr
    _, expiry = parse_feature_file(p.stdout)
    assert datetime.datetime.fromtimestamp(expiry, datetime.timezone.utc).year >= 9900


def test_write_is_whole_or_nothing(tmp_path, monkeypatch):
    """At the rename the new file is complete in a dot file (NFD skips those) and the
    old one still whole; a failure before it leaves the old file and no temp file."""
    target = tmp_path / "numa-utils"
    target.write_text("old=1\n")
    real_replace = os.replace
    seen = []

    def replace(src, dst):
        seen.append((os.path.basename(src), open(src).read(), open(dst).read()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    cli._write_atomically(str(tmp_path), "numa-utils", "new=2\n")
    ((tmp_name, tmp_text, old_text),) = seen
    assert tmp_name.startswith(".numa-utils.") and tmp_text == "new=2\n"
    assert old_text == "old=1\n"
    assert target.read_text() == "new=2\n"

    def fail(fd):
        raise OSError(errno.EIO, "fsync: I/O error")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError):
        cli._write_atomically(str(tmp_path), "numa-utils", "newer=3\n")
    assert target.read_text() == "new=2\n"
    assert os.listdir(tmp_path) == ["numa-utils"]


def test_oversized_feature_file_is_refused(tmp_path, monkeypatch):
    big = cli._Labels()
    for i in range(3000):
        big.put(f"node.{i}.kind", "dram")
    monkeypatch.setattr(cli, "_nfd_labels", lambda rep: big)
    args = types.SimpleNamespace(expiry="1h", write=str(tmp_path))
    with pytest.raises(ValueError, match="NFD ignores a feature file over 64 KiB"):
        cli._status_nfd({"version": "x"}, args)
    assert os.listdir(tmp_path) == []


def test_plan_formats_from_the_command_line():
    root = fixture_root("dual-socket-8gpu")
    for fmt in ("oci", "nri", "gres", "srun", "ray"):
        p = run("plan", "--root", root, "--format", fmt)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip()
    b = saved_backend(root)
    rep = cli.status_report(backend=b)
    one = [p for p in nu.gpu_plans("node", memory="bind", backend=b) if p.gpu == 5]
    oci = run("plan", "--root", root, "--format", "oci", "--memory", "bind", "--gpu", "5")
    check_oci(oci.stdout, rep, one)
    item = json.loads(oci.stdout)[0]["linux"]
    assert item["memoryPolicy"] == {"mode": "MPOL_BIND", "nodes": "1"}
    assert item["resources"]["cpu"]["mems"] == "1"  # a bind, so the cpuset too
    nri = run("plan", "--root", root, "--format", "nri", "--gpu", "5")
    check_nri(nri.stdout, rep, one, one_pod=True)
    inter = run("plan", "--root", root, "--format", "oci", "--memory", "interleave")
    for item in json.loads(inter.stdout):
        assert item["linux"]["memoryPolicy"] == {"mode": "MPOL_INTERLEAVE", "nodes": "0-1"}
        assert "mems" not in item["linux"]["resources"]["cpu"]
    bind = run("plan", "--root", root, "--format", "srun", "--memory", "bind")
    check_srun(bind.stdout, nu.gpu_plans("node", memory="bind", backend=b))
    assert "--mem-bind=map_mem:0,0,0,0,1,1,1,1" in bind.stdout


def test_gres_takes_only_a_minor_the_driver_can_give(tmp_path):
    """The NVIDIA driver numbers GPUs /dev/nvidia0-254 (255 is nvidiactl): any other
    Device Minor is unknown, and its gres line is left out with a comment."""
    tree = fixture_tree("dual-socket-8gpu", tmp_path / "t")
    gpus = pathlib.Path(tree, "proc/driver/nvidia/gpus")
    minors = {"0000:19:00.0": "99999999999999999999", "0000:3b:00.0": "255"}
    minors.update({"0000:4c:00.0": "254", "0000:5d:00.0": "9" * 5000})
    for pci, minor in minors.items():
        info = gpus / pci / "information"
        info.write_text(re.sub(r"Device Minor:.*", f"Device Minor: \t {minor}", info.read_text()))
    out = captured(["plan", "--root", tree, "--format", "gres", "--policy", "node"])
    blocks = {}  # PCI address -> the lines under its "# GPU" header
    for line in out.splitlines():
        head = re.fullmatch(r"# GPU \d+ \((\S+)\), .*", line)
        if head:
            pci = head.group(1)
            blocks[pci] = []
        else:
            blocks[pci].append(line)
    assert blocks["0000:4c:00.0"][0].startswith("Name=gpu File=/dev/nvidia254 Cores=")
    for pci in ("0000:19:00.0", "0000:3b:00.0", "0000:5d:00.0"):
        comment, line = blocks[pci]
        assert comment.startswith("# no /dev/nvidiaN minor known for this GPU (Device Minor ")
        assert comment.endswith(" is not 0-254):"), comment
        assert len(comment) < 120
        assert line.startswith("# Name=gpu File=DEVICE Cores=")
    assert "/dev/nvidia255" not in out and "/dev/nvidia9999" not in out
    b = saved_backend(tree)
    check_gres(out, nu.read_topology(backend=b), nu.gpu_plans("node", backend=b))


# --- a real kernel: the file written in a QEMU guest and read back ----------------


def _load_vm_run():
    import importlib.util

    spec = importlib.util.spec_from_file_location("numa_utils_vm_run", REPO / "vm" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.vm
def test_guest_writes_feature_file_and_reads_it_back():
    """Linux 6.12 with a CXL Type-3 expander onlined as node 2 (vm/run.py topology
    "cxl"): status --format nfd --write in the guest, the file read back there."""
    vmrun = _load_vm_run()
    reason = vmrun.missing_reason("x86_64-6.12", "cxl")
    if reason:
        pytest.skip(reason)
    command = (
        "mkdir -p /tmp/fd && python3 -m numa_utils status --format nfd --write /tmp/fd"
        " --expiry 10m && echo FEATURES-START && cat /tmp/fd/numa-utils"
        " && echo FEATURES-END && echo LISTING $(ls -a /tmp/fd)"
    )
    ok, console = vmrun.run_guest("x86_64-6.12", "cxl", command=command, timeout=600)
    out = vmrun.guest_output(console).replace("\r", "")
    assert ok and "FEATURES-END" in out, console[-3000:]
    text = out.split("FEATURES-START\n", 1)[1].split("FEATURES-END", 1)[0]
    labels, expiry = parse_feature_file(text)
    assert expiry is not None
    assert labels["numa-utils.io/nodes"] == "3"
    assert labels["numa-utils.io/memory-nodes.dram"] == "0-1"
    assert labels["numa-utils.io/memory-nodes.cpu-less"] == "2"  # the CXL expander
    assert labels["numa-utils.io/memory-nodes.lower-tier"] == "2"
    assert labels["numa-utils.io/weighted-interleave"] == "true"
    listing = [ln for ln in out.splitlines() if ln.startswith("LISTING ")]
    assert listing == ["LISTING . .. numa-utils"], listing  # no temp file left
