"""The worker stack the harness runs (kube-scheduler, JobSet controller, kwok) as a user of
``python -m clusters`` meets it: Nodes from flags or a file, refused specifications, and a
dead component named by ``status`` and brought back by ``start``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from kubernetes import client

from clusters.local import LocalClusters
from clusters.nodes import GPU, NodeSpecError, layout_from_file
from clusters.processes import harness_processes
from clusters.testing import machine_load, stretched
from controller_kit.kubeclient import api_client


def _clusters(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clusters", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("content, named", [
    ("default:\n  - count: 1\n    resources: {cpus: '4'}\n", "unknown resource name 'cpus'"),
    ("default:\n  - count: 1\n    resources: {cpu: four}\n",
     "resources.cpu: 'four' is not a quantity"),
    ("default:\n  - count: 1\n    resources: {memory: -1Gi}\n",
     "resources.memory: '-1Gi' is negative"),
    ("workers:\n  worker-9:\n    - count: 1\n", "workers.worker-9: no such worker"),
    ("default:\n  - count: 1\n    colour: blue\n", "default.0.colour"),
    ("default: [\n", "not valid YAML at line"),
])
def test_a_bad_node_file_is_refused_before_anything_starts(tmp_path, content, named):
    spec = tmp_path / "nodes.yaml"
    spec.write_text(content)
    state = tmp_path / "state"
    result = _clusters("up", "--workers", "1", "--state-dir", str(state),
                       "--nodes-file", str(spec))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"--nodes-file {spec}" in result.stderr and named in result.stderr, result.stderr
    assert harness_processes(state) == []
    assert not (state / "state.json").exists()


def test_bad_node_flags_are_refused_naming_the_flag(tmp_path):
    result = _clusters("up", "--state-dir", str(tmp_path), "--node-cpu", "lots")
    assert result.returncode == 1
    assert "--node-cpu" in result.stderr and "'lots' is not a quantity" in result.stderr


def test_a_node_file_gives_each_worker_its_pools(tmp_path):
    spec = tmp_path / "nodes.yaml"
    spec.write_text(
        "default:\n  - count: 2\n    resources: {cpu: 4, memory: 8Gi}\n"
        "workers:\n  worker-2:\n"
        "    - count: 1\n      resources: {cpu: '16', memory: 64Gi, nvidia.com/gpu: '8'}\n"
        "      labels: {pool: gpu}\n"
        "      taints: [{key: gpu, value: 'true', effect: NoSchedule}]\n")
    layout = layout_from_file(spec)
    assert [p.count for p in layout.pools_for("worker-1")] == [2]
    gpu_pool = layout.pools_for("worker-2")[0]
    assert gpu_pool.resources[GPU] == "8" and gpu_pool.labels == {"pool": "gpu"}
    assert gpu_pool.taints[0].effect == "NoSchedule"
    with pytest.raises(NodeSpecError, match="no such worker"):
        layout.check_workers(["worker-1"])


@pytest.mark.slow
def test_up_gives_ready_kwok_nodes_and_status_names_a_dead_component(tmp_path):
    state = tmp_path / "state"
    try:
        result = _clusters("up", "--workers", "1", "--state-dir", str(state), "--nodes", "3",
                           "--node-cpu", "2", "--node-gpus", "1", "--json")
        assert result.returncode == 0, result.stderr
        # 45 s on an idle machine; a busy one starts every component that much slower.
        took = json.loads(result.stdout)["seconds"]
        assert took < stretched(45), f"up took {took:.1f}s ({machine_load()})"
        with api_client(state / "worker-1.kubeconfig") as api:
            nodes = client.CoreV1Api(api).list_node().items
        assert sorted(n.metadata.name for n in nodes) == [
            f"worker-1-pool-0-{i}" for i in range(3)]
        for node in nodes:
            assert node.status.allocatable["cpu"] == "2" and node.status.allocatable[GPU] == "1"
            assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
            assert not node.spec.taints, node.spec.taints

        # kwok dies: status names it and its log; start brings it back.
        record = next(r for r in LocalClusters(state).load().clusters if r.name == "worker-1")
        os.kill(record.pids["kwok"], signal.SIGKILL)
        status = _clusters("status", "--state-dir", str(state))
        assert "worker-1  worker   degraded" in status.stdout, status.stdout
        assert "worker-1: kwok not running (log: " in status.stdout, status.stdout
        assert _clusters("start", "worker-1", "--state-dir", str(state)).returncode == 0
        status = _clusters("status", "--state-dir", str(state), "--json")
        states = {c["name"]: (c["state"], c["problems"])
                  for c in json.loads(status.stdout)["clusters"]}
        assert states["worker-1"] == ("running", []), states
    finally:
        _clusters("down", "--state-dir", str(state), timeout=120)
    assert harness_processes(state) == []
