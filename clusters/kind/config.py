"""The ``kind create cluster --config`` document of each cluster, from the YAML beside this
file and the worker Node layout (``clusters.nodes``).

What a kind Node can honour of a layout: the number of Nodes (one ``role: worker`` kind node
each), their labels (kind's node ``labels``) and taints (a kubeadm ``JoinConfiguration``
patch per node). What it cannot: resources. A kind Node is a real kubelet and reports the
machine's own cpu and memory (and no GPUs), so a layout asking for any other resources is
refused (``refuse_resources``) rather than quietly ignored.

Every node also gets the harness's Go runtime setting (``processes.go_runtime_env``): its
systemd services (kubelet, containerd) through a systemd drop-in, and the control plane's
static pods (etcd, apiserver, controller-manager, scheduler) through kubeadm patches; both
are files in the state directory mounted into the nodes (``write_go_runtime_files``).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from clusters import nodes, processes

CONFIG_DIR = Path(__file__).resolve().parent
# The static pods of a kind control plane, as kubeadm's patch targets name them, which are
# also their containers' names.
STATIC_PODS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
SYSTEMD_DROP_IN = "/etc/systemd/system.conf.d/go-runtime.conf"
KUBEADM_PATCHES = "/kind/go-runtime-patches"


class KindLayoutError(ValueError):
    """A Node layout the kind provider cannot honour; the message says which part and why."""


def base_config(role: str) -> dict:
    return yaml.safe_load((CONFIG_DIR / f"{role}.yaml").read_text())


def _machine() -> str:
    cores = os.cpu_count() or 1
    try:
        meminfo = Path("/proc/meminfo").read_text()
        kib = int(next(line.split()[1] for line in meminfo.splitlines()
                       if line.startswith("MemTotal:")))
        memory = f"{kib / 1024**2:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        memory = "its memory"
    return f"{cores} cpu, {memory}"


def refuse_resources(layout: nodes.NodeLayout) -> None:
    """Refuse a layout whose pools ask for resources other than the defaults (which stand
    for "not asked": the flags' and the file format's own defaults)."""
    default = nodes.NodePool().resources
    pools = [("default", i, p) for i, p in enumerate(layout.default)]
    pools += [(w, i, p) for w, ps in layout.workers.items() for i, p in enumerate(ps)]
    for where, index, pool in pools:
        if pool.resources != default:
            asked = ", ".join(f"{k}={v}" for k, v in pool.resources.items())
            raise KindLayoutError(
                f"Node resources ({where} pool {index}: {asked}): the kind provider cannot "
                f"set them; kind Nodes are real kubelets and report this machine's capacity "
                f"({_machine()}, no GPUs). Drop --node-cpu/--node-memory/--node-gpus (or "
                "`resources` in --nodes-file), or use the local provider, whose kwok Nodes "
                "take any capacity")


def _join_taints(taints: list[nodes.Taint]) -> str:
    document = {"kind": "JoinConfiguration",
                "nodeRegistration": {"taints": [t.model_dump() for t in taints]}}
    return yaml.safe_dump(document, sort_keys=False)


def write_go_runtime_files(directory: Path) -> Path:
    """Write the systemd drop-in and the kubeadm patches that give a node's Go programs
    ``processes.go_runtime_env()`` into ``directory``; return it."""
    env = processes.go_runtime_env()
    (directory / "patches").mkdir(parents=True, exist_ok=True)
    (directory / "system.conf").write_text(
        "[Manager]\nDefaultEnvironment=" + " ".join(f"{k}={v}" for k, v in env.items()) + "\n")
    for pod in STATIC_PODS:
        patch = {"spec": {"containers": [{"name": pod, "env": [
            {"name": k, "value": v} for k, v in env.items()]}]}}
        (directory / "patches" / f"{pod}+strategic.yaml").write_text(
            yaml.safe_dump(patch, sort_keys=False))
    return directory


def _with_go_runtime(config: dict, files: Path) -> dict:
    for node in config["nodes"]:
        mounts = node.setdefault("extraMounts", [])
        mounts.append({"hostPath": str(files / "system.conf"), "containerPath": SYSTEMD_DROP_IN,
                       "readOnly": True})
        if node["role"] == "control-plane":
            mounts.append({"hostPath": str(files / "patches"), "containerPath": KUBEADM_PATCHES,
                           "readOnly": True})
    config.setdefault("kubeadmConfigPatches", []).append(yaml.safe_dump(
        {"kind": "InitConfiguration", "patches": {"directory": KUBEADM_PATCHES}}))
    return config


def nodes_asked(config: dict) -> list[dict]:
    """A kind config's nodes as the Node flags ask for them (without the mounts)."""
    return [{k: v for k, v in node.items() if k != "extraMounts"} for node in config["nodes"]]


def cluster_config(role: str, pools: list[nodes.NodePool], go_runtime_files: Path) -> dict:
    """The kind config of a cluster: the manager's as it is in manager.yaml; a worker's
    control plane from worker.yaml plus one kind worker node per Node of ``pools``; every
    node with the Go runtime files of ``write_go_runtime_files`` mounted."""
    config = base_config(role)
    if role == "worker":
        for index, pool in enumerate(pools):
            for _ in range(pool.count):
                node: dict = {"role": "worker",
                              "labels": {nodes.NODE_POOL_LABEL: f"pool-{index}", **pool.labels}}
                if pool.taints:
                    node["kubeadmConfigPatches"] = [_join_taints(pool.taints)]
                config["nodes"].append(node)
    return _with_go_runtime(config, go_runtime_files)


def node_count(pools: list[nodes.NodePool]) -> int:
    return sum(p.count for p in pools)
