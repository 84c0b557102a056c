"""A two-node Ray cluster on this machine, for the tests of ``flowrt.ray``.

The cluster's nodes are two raylets of one machine, on loopback: Ray is told it is not a real
cluster (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set before Ray is imported), so that every
address it hands out is 127.0.0.1. The nodes are
started by ``ray.cluster_utils.Cluster``, Ray's own tool for tests of several nodes.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
try:
    import ray
    from ray.cluster_utils import Cluster
except ImportError:  # the tests skip: see test_pipeline.py
    ray = None


@pytest.fixture(scope="module")
def cluster():
    """Two nodes of 2 CPUs each: the head (resource ``head``) and a worker (``worker``); yields
    ``{"head": node id, "worker": node id}``."""
    if ray is None:
        pytest.skip("flowrt.ray needs Ray: pip install 'flowrt[ray]'")
    # What ray.init changes in this process and keeps after shutdown, put back for the tests
    # that come after these.
    environ, sigterm, excepthook = dict(os.environ), signal.getsignal(signal.SIGTERM), sys.excepthook
    two = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"head": 1}, "include_dashboard": False},
    )
    try:
        two.add_node(num_cpus=2, resources={"worker": 1})
        ray.init(address=two.address, include_dashboard=False, log_to_driver=False)
        two.wait_for_nodes()
        nodes = {}
        for node in ray.nodes():
            for role in ("head", "worker"):
                if role in node["Resources"]:
                    nodes[role] = node["NodeID"]
        yield nodes
    finally:
        ray.shutdown()
        two.shutdown()
        os.environ.clear()
        os.environ.update(environ)
        signal.signal(signal.SIGTERM, sigterm)
        sys.excepthook = excepthook
