"""The kind provider end to end, in the Docker engine of this machine: a manager and two
worker kind clusters from the locally built node image (no registry), with JobSet's
controller on each worker running from the image built here.

* every cluster's Nodes are Ready and its kube-system pods Running; the Node layout's
  labels and taints are on the kind worker Nodes; each node's kubelet and the control
  plane's static pods run with the harness's Go runtime settings (GOGC, GOMAXPROCS);
* a JobSet on a worker runs a real container (trainjob-workload, `kind load`-ed) to
  Completed, and one whose container exits 1 shows Failed;
* `stop`/`start` of a worker keeps its objects, and the worker runs JobSets again;
* `down` leaves no container, volume or network of those clusters (last: it ends the
  module's clusters; the fixture's own `down` then finds nothing to do).

The clusters carry a prefix of their own (``trainjob-t<hex>-``), so clusters a developer
runs with `python -m clusters up --provider kind` are never touched.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys

import pytest
from kubernetes import client

from clusters import images, nodes
from clusters.kind import CLUSTER_LABEL
from clusters.kind import jobset as kind_jobset
from clusters.processes import go_runtime_env
from clusters.testing import eventually
from controller_kit.kubeclient import api_client

from kind_layout import NAMES, POOL_LABEL, TAINT


@pytest.fixture
def worker_1(kind_clusters):
    with api_client(kind_clusters.kubeconfig("worker-1")) as api:
        yield api


@pytest.fixture
def namespace(worker_1):
    name = f"kind-{secrets.token_hex(3)}"
    core = client.CoreV1Api(worker_1)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


def workload_jobset(name: str, namespace: str, *args: str) -> dict:
    """A JobSet of one Job of one pod running the workload image with ``args``; the Job does
    not retry (backoffLimit 0), so a failing container fails the JobSet at once."""
    return {
        "apiVersion": f"{kind_jobset.GROUP}/{kind_jobset.API_VERSION}", "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicatedJobs": [{"name": "train", "replicas": 1, "template": {"spec": {
            "backoffLimit": 0, "completions": 1, "parallelism": 1,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "workload", "image": images.WORKLOAD_IMAGE,
                "imagePullPolicy": "IfNotPresent", "args": list(args)}]}}}}}]},
    }


def create_jobset(api, body: dict) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        kind_jobset.GROUP, kind_jobset.API_VERSION, body["metadata"]["namespace"],
        kind_jobset.PLURAL, body)


def jobset_conditions(api, namespace: str, name: str) -> dict[str, str]:
    found = client.CustomObjectsApi(api).get_namespaced_custom_object(
        kind_jobset.GROUP, kind_jobset.API_VERSION, namespace, kind_jobset.PLURAL, name)
    return {c["type"]: c["status"] for c in (found.get("status") or {}).get("conditions") or []}


def workload_pods(api, namespace: str, name: str) -> list[client.V1Pod]:
    return client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items


def terminated(pod: client.V1Pod):
    statuses = pod.status.container_statuses or []
    return statuses[0].state.terminated if statuses and statuses[0].state else None


def test_nodes_ready_and_kube_system_running(kind_clusters):
    assert [(i.name, i.state) for i in kind_clusters.status()] == [
        (n, "running") for n in NAMES]
    for name in NAMES:
        with api_client(kind_clusters.kubeconfig(name)) as api:
            core = client.CoreV1Api(api)
            listed = core.list_node().items
            assert len(listed) == (1 if name == "manager" else 2), (
                f"{name}: Nodes {[n.metadata.name for n in listed]}")
            assert [nodes.schedulable_problem(n) for n in listed] == [None] * len(listed)

            def phases():
                return {p.metadata.name: p.status.phase
                        for p in core.list_namespaced_pod("kube-system").items}

            eventually(phases, lambda seen: seen and set(seen.values()) == {"Running"},
                       expected=f"every kube-system pod of {name} Running", timeout=60)

            # The control plane's static pods run with the harness's Go runtime setting.
            go_env = {(k, v) for k, v in go_runtime_env().items()}
            static = {p.metadata.name: {(e.name, e.value) for e in p.spec.containers[0].env or []}
                      for p in core.list_namespaced_pod("kube-system").items
                      if p.metadata.labels.get("tier") == "control-plane"}
            assert len(static) == 4 and all(go_env <= env for env in static.values()), (
                f"{name}: env of the static pods {static}, expected {go_env} in each")


def test_each_nodes_kubelet_runs_with_the_go_runtime_setting(kind_clusters, docker_engine):
    expected = {f"{k}={v}" for k, v in go_runtime_env().items()}
    for name in NAMES:
        for container in kind_clusters.containers(name):
            environ = docker_engine.docker(
                "exec", container, "sh", "-c", "tr '\\0' '\\n' < /proc/$(pidof kubelet)/environ"
            ).stdout.decode().splitlines()
            assert expected <= set(environ), f"{container}: kubelet's environment {environ}"


def test_node_layout_labels_and_taints(kind_clusters):
    for name, pool, taints in (("worker-1", "plain", []),
                               ("worker-2", "tainted", [TAINT.model_dump()])):
        with api_client(kind_clusters.kubeconfig(name)) as api:
            workers = [n for n in client.CoreV1Api(api).list_node().items
                       if kind_jobset.CONTROL_PLANE_LABEL not in n.metadata.labels]
            assert [(n.metadata.labels.get(POOL_LABEL),
                     [{"key": t.key, "value": t.value or "", "effect": t.effect}
                      for t in n.spec.taints or []]) for n in workers] == [(pool, taints)]


def test_layouts_kind_cannot_honour_are_refused_and_change_nothing(kind_clusters):
    before = {n: kind_clusters.containers(n) for n in NAMES}
    with pytest.raises(ValueError, match="cannot set them; kind Nodes are real kubelets"):
        kind_clusters.up(workers=2, node_layout=nodes.NodeLayout(default=[nodes.NodePool(
            count=1, resources={"cpu": "8", "memory": "32Gi", nodes.GPU: "1"})]))
    with pytest.raises(ValueError, match="kind cannot add, remove or relabel"):
        kind_clusters.up(workers=2, node_layout=nodes.NodeLayout(
            default=[nodes.NodePool(count=2)]))
    assert {n: kind_clusters.containers(n) for n in NAMES} == before
    assert [i.state for i in kind_clusters.status()] == ["running"] * len(NAMES)


def test_cli_refuses_node_flags_kind_cannot_honour(tmp_path):
    for flags, named in ((["--node-gpus", "1"], "--node-gpus"),
                         (["--node-cpu", "8"], "--node-cpu"),
                         (["--kueue", "worker-9"], "--kueue worker-9: no such cluster")):
        result = subprocess.run(
            [sys.executable, "-m", "clusters", "up", "--provider", "kind", "--state-dir",
             str(tmp_path / "state"), *flags], capture_output=True, text=True, timeout=60)
        assert result.returncode == 1, result
        assert result.stderr.startswith(f"error: {named}"), result.stderr
    assert not (tmp_path / "state").exists()


def test_jobset_runs_a_real_container_to_completion(worker_1, namespace):
    create_jobset(worker_1, workload_jobset("completes", namespace, "--run-for", "2s"))
    eventually(lambda: jobset_conditions(worker_1, namespace, "completes"),
               lambda c: c.get("Completed") == "True",
               expected="JobSet completes to have condition Completed=True", timeout=120)
    [pod] = workload_pods(worker_1, namespace, "completes")
    assert pod.status.phase == "Succeeded"
    assert terminated(pod).exit_code == 0
    # The container really ran for its two seconds and said so.
    assert (terminated(pod).finished_at - terminated(pod).started_at).total_seconds() >= 2
    log = client.CoreV1Api(worker_1).read_namespaced_pod_log(pod.metadata.name, namespace)
    assert "running for 2s, then exiting 0" in log and "done after" in log, log


def test_jobset_whose_container_exits_1_fails(worker_1, namespace):
    create_jobset(worker_1, workload_jobset("fails", namespace, "--run-for", "1s",
                                            "--exit-code", "1"))
    eventually(lambda: jobset_conditions(worker_1, namespace, "fails"),
               lambda c: c.get("Failed") == "True",
               expected="JobSet fails to have condition Failed=True", timeout=120)
    [pod] = workload_pods(worker_1, namespace, "fails")
    assert pod.status.phase == "Failed"
    assert terminated(pod).exit_code == 1


def test_stop_start_keeps_a_workers_objects(kind_clusters, namespace):
    with api_client(kind_clusters.kubeconfig("worker-1")) as api:
        client.CoreV1Api(api).create_namespaced_config_map(namespace, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="kept"), data={"answer": "42"}))
        create_jobset(api, workload_jobset("before-stop", namespace, "--run-for", "1s"))
        eventually(lambda: jobset_conditions(api, namespace, "before-stop"),
                   lambda c: c.get("Completed") == "True",
                   expected="JobSet before-stop Completed=True", timeout=120)

    stopped = kind_clusters.stop("worker-1")
    assert stopped.state == "stopped"
    assert set(kind_clusters.containers("worker-1").values()) == {"exited"}
    assert {i.name: i.state for i in kind_clusters.status()} == {
        "manager": "running", "worker-1": "stopped", "worker-2": "running"}

    started = kind_clusters.start("worker-1", timeout=180)
    assert started.state == "running"
    with api_client(kind_clusters.kubeconfig("worker-1")) as api:
        kept = client.CoreV1Api(api).read_namespaced_config_map("kept", namespace)
        assert kept.data == {"answer": "42"}
        assert jobset_conditions(api, namespace, "before-stop").get("Completed") == "True"
        # The restarted worker still runs JobSets: its controller, kubelets and the image
        # loaded before the stop are all back.
        create_jobset(api, workload_jobset("after-start", namespace, "--run-for", "1s"))
        eventually(lambda: jobset_conditions(api, namespace, "after-start"),
                   lambda c: c.get("Completed") == "True",
                   expected="JobSet after-start Completed=True", timeout=120)


def test_down_leaves_nothing_behind(kind_clusters, docker_engine):
    """Last of the kind tests: it ends the session's kind clusters."""
    engine = docker_engine
    prefix = kind_clusters.prefix
    network = f"{prefix}kind"
    containers = [c for name in NAMES for c in kind_clusters.containers(name)]
    assert len(containers) == 5
    volumes = []
    for container in containers:
        mounts = json.loads(engine.docker("inspect", "--format", "{{json .Mounts}}",
                                          container).stdout)
        volumes += [m["Name"] for m in mounts if m["Type"] == "volume"]
    assert volumes, "kind nodes keep /var in a volume"
    assert engine.docker("network", "inspect", network, check=False).returncode == 0

    kind_clusters.down()

    for name in NAMES:
        left = engine.docker("ps", "-aq", "--filter",
                             f"label={CLUSTER_LABEL}={prefix}{name}").stdout.split()
        assert left == [], f"{prefix}{name}: containers left: {left}"
    left_volumes = [v for v in volumes
                    if engine.docker("volume", "inspect", v, check=False).returncode == 0]
    assert left_volumes == []
    assert engine.docker("network", "inspect", network, check=False).returncode != 0
    assert not kind_clusters.state_dir.exists()
    assert kind_clusters.status() == []
