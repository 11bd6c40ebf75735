# SPDX-License-Identifier: Apache-2.0
"""SharedRegion.create reads the machine's topology once and NUMA_NODES once.

fit(), the policy, the layout and the prefault plan each read them again (the
topology two to four times, NUMA_NODES twice), which costs tens of milliseconds on a
big machine and could see two different answers.  Counted at the backend (listings
of the node directory, reads of each node's distance row) and at os.environ.
"""

import collections
import os

import pytest
from conftest import nur, sim

NODE_DIR = "/sys/devices/system/node"
NODES_VAR = "NUMA_UTILS_NUMA_NODES"


class _CountingEnviron(dict):
    """os.environ that counts the lookups of each name."""

    def __init__(self, base):
        super().__init__(base)
        self.asked = collections.Counter()

    def get(self, key, default=None):
        self.asked[key] += 1
        return super().get(key, default)

    def __getitem__(self, key):
        self.asked[key] += 1
        return super().__getitem__(key)


def _counting_backend():
    backend = sim("dual-socket-8gpu")
    seen = collections.Counter()
    listdir, read_text = backend.listdir, backend.read_text

    def counted_listdir(path):
        if path.rstrip("/") == NODE_DIR:
            seen["node directory"] += 1
        return listdir(path)

    def counted_read_text(path, *args, **kw):
        if path == f"{NODE_DIR}/node0/distance":
            seen["distance row"] += 1
        return read_text(path, *args, **kw)

    backend.listdir = counted_listdir
    backend.read_text = counted_read_text
    return backend, seen


CREATES = {
    "interleave": dict(policy="interleave"),
    "interleave-prefault": dict(policy="interleave", prefault=True),
    "bind-nodes": dict(policy="bind", nodes=[1]),
    "layout": dict(layout="parts:bind:0/1", prefault=True),
    "posix-interleave": dict(policy="interleave", kind="posix", prefault=True),
    "default": dict(),
}


@pytest.mark.parametrize("numa_nodes", ["0-1", None], ids=["NUMA_NODES=0-1", "unset"])
@pytest.mark.parametrize("name", sorted(CREATES))
def test_create_reads_the_topology_once_and_numa_nodes_once(monkeypatch, name, numa_nodes):
    if numa_nodes is None:
        monkeypatch.delenv(NODES_VAR, raising=False)
    else:
        monkeypatch.setenv(NODES_VAR, numa_nodes)
    environ = _CountingEnviron(os.environ)
    monkeypatch.setattr(os, "environ", environ)
    backend, seen = _counting_backend()
    kw = dict(prefault=False, backend=backend)
    kw.update(CREATES[name])
    region = nur.SharedRegion.create("kv", 4 << 20, **kw)
    region.close()
    assert seen["node directory"] == 1, seen
    assert seen["distance row"] == 1, seen
    assert environ.asked[NODES_VAR] <= 1, environ.asked
    if name.startswith("interleave"):
        assert environ.asked[NODES_VAR] == 1  # the policy needs nodes: read, once


def test_attach_reads_numa_nodes_once(monkeypatch):
    """attach(policy=...) without nodes reads NUMA_NODES for the policy; the extent it
    makes (nodes: the default ones) is applied without a second read."""
    monkeypatch.delenv(NODES_VAR, raising=False)
    backend, _ = _counting_backend()
    with nur.SharedRegion.create("kv", 4 << 20, prefault=False, backend=backend):
        environ = _CountingEnviron(os.environ)
        monkeypatch.setattr(os, "environ", environ)
        other = nur.SharedRegion.attach("kv", policy="interleave", backend=backend.process())
        other.close()
    assert other.policy.applied and other.policy.mode == "interleave", other.policy
    assert environ.asked[NODES_VAR] == 1, environ.asked
