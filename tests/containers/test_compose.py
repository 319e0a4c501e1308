"""docker-compose.yml as a user runs it: `docker compose up --build` starts three control
planes, JobSet on each worker, the dispatcher and two operators from the project's images;
a sample TrainJob submitted to the manager is placed on a worker, gets a JobSet there and
its status comes back; `docker compose down -v` leaves nothing behind."""

from __future__ import annotations

import json
import secrets
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from clusters.controlplane import free_port
from clusters.testing import eventually
from controller_kit.kubeclient import api_client
from trainjob import constants as c

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "manifests" / "samples" / "trainjob-mnist.yaml"
LONG_RUNNING = ("dispatcher", "operator-worker-1", "operator-worker-2", "jobset-worker-1",
                "jobset-worker-2", "apiserver-manager", "apiserver-worker-1",
                "apiserver-worker-2", "scheduler-worker-1", "scheduler-worker-2",
                "kwok-worker-1", "kwok-worker-2")


class ComposeStack:
    def __init__(self, engine, project: str, ports: dict[str, int]):
        self.engine = engine
        self.project = project
        self.ports = ports
        self.env = {**engine.env(), **{k: str(v) for k, v in ports.items()}}

    def compose(self, *args: str, check: bool = True, timeout: float = 900
                ) -> subprocess.CompletedProcess:
        argv = ["docker", "compose", "-f", str(ROOT / "docker-compose.yml"), "-p",
                self.project, *args]
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                                timeout=timeout, cwd=ROOT)
        if check and result.returncode != 0:
            raise AssertionError(f"`{' '.join(argv)}` exited {result.returncode}:\n"
                                 f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result

    def down(self) -> subprocess.CompletedProcess:
        """`docker compose down -v` as a user runs it; the caller judges its outcome."""
        return self.compose("down", "--volumes", "--remove-orphans", "--timeout", "5",
                            check=False)

    def states(self) -> dict[str, tuple[str, int]]:
        """service -> (state, restart count) of every container of the project."""
        ids = self.engine.docker("ps", "-aq", "--filter",
                                 f"label=com.docker.compose.project={self.project}")
        found = {}
        for container in ids.stdout.decode().split():
            result = self.engine.docker(
                "inspect", "--format",
                '{{index .Config.Labels "com.docker.compose.service"}} {{.State.Status}} '
                "{{.RestartCount}}", container)
            service, state, restarts = result.stdout.decode().split()
            found[service] = (state, int(restarts))
        return found

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.project}"
        return {kind: self.engine.docker(*command, "--filter", label).stdout.decode().split()
                for kind, command in (("containers", ("ps", "-aq")),
                                      ("volumes", ("volume", "ls", "-q")),
                                      ("networks", ("network", "ls", "-q")))}


@pytest.fixture
def compose_stack(docker_engine, project_images, tmp_path):
    ports = {name: free_port() for name in (
        "MANAGER_PORT", "WORKER_1_PORT", "WORKER_2_PORT", "DISPATCHER_METRICS_PORT",
        "OPERATOR_1_METRICS_PORT", "OPERATOR_2_METRICS_PORT", "DISPATCHER_DASHBOARD_PORT")}
    stack = ComposeStack(docker_engine, f"trainjob-test-{secrets.token_hex(3)}", ports)
    try:
        stack.compose("up", "--build", "--detach")
        yield stack
    finally:
        logs = stack.compose("logs", "--no-color", "--tail", "60", check=False).stdout
        (tmp_path / "compose.log").write_text(logs)
        stack.down()


def test_compose_dispatches_a_sample_job_and_leaves_nothing_behind(compose_stack, tmp_path):
    stack = compose_stack
    kubeconfigs = {}
    for cluster in ("manager", "worker-1", "worker-2"):
        target = tmp_path / f"{cluster}.kubeconfig"
        stack.compose("cp", f"certs:/pki/{cluster}/admin-host.kubeconfig", str(target))
        kubeconfigs[cluster] = api_client(target)
    manager = client.CustomObjectsApi(kubeconfigs["manager"])

    def long_running_up() -> dict:
        states = stack.states()
        if any(states.get(s, ("missing", 0))[0] == "exited" for s in LONG_RUNNING):
            raise AssertionError(f"a long-running service exited: {states}")
        return states

    eventually(long_running_up,
               lambda states: all(states.get(s, ("",))[0] == "running" for s in LONG_RUNNING),
               timeout=180, interval=1,
               expected=f"every long-running service running ({', '.join(LONG_RUNNING)})")
    eventually(lambda: [w["metadata"]["name"] for w in manager.list_cluster_custom_object(
                   c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS)["items"]],
               lambda names: sorted(names) == ["worker-1", "worker-2"], timeout=120,
               expected="setup to register worker-1 and worker-2 on the manager")

    job = yaml.safe_load(SAMPLE.read_text())
    name = job["metadata"]["name"]

    def create_once() -> bool:
        # The dispatcher's namespace and the runtime may trail the registration by a moment.
        manager.create_namespaced_custom_object(c.TRAINER_GROUP, c.TRAINER_VERSION, "default",
                                                c.TRAINJOBS, job)
        return True

    eventually(create_once, bool, timeout=30, expected=f"the manager to accept {SAMPLE.name}")

    def placed() -> str | None:
        obj = manager.get_namespaced_custom_object(c.TRAINER_GROUP, c.TRAINER_VERSION,
                                                   "default", c.TRAINJOBS, name)
        return (obj["metadata"].get("annotations") or {}).get(c.PLACEMENT_ANNOTATION)

    worker = eventually(placed, bool, timeout=120,
                        expected=f"the dispatcher to place {name} on a worker")
    worker_api = kubeconfigs[worker]
    jobset = eventually(
        lambda: client.CustomObjectsApi(worker_api).get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", name),
        bool, timeout=120, expected=f"the operator on {worker} to create JobSet {name}")
    assert jobset["metadata"]["ownerReferences"][0]["kind"] == "TrainJob", jobset["metadata"]

    def statuses() -> tuple[dict, dict]:
        remote = client.CustomObjectsApi(worker_api).get_namespaced_custom_object(
            c.TRAINER_GROUP, c.TRAINER_VERSION, "default", c.TRAINJOBS, name)
        local = manager.get_namespaced_custom_object(c.TRAINER_GROUP, c.TRAINER_VERSION,
                                                     "default", c.TRAINJOBS, name)
        return remote.get("status") or {}, local.get("status") or {}

    remote, local = eventually(
        statuses, lambda pair: bool(pair[0].get("jobsStatus")) and
        pair[1].get("jobsStatus") == pair[0].get("jobsStatus"), timeout=120,
        expected=f"{worker}'s TrainJob status (its JobSet's jobs) mirrored to the manager")
    assert {j["name"] for j in local["jobsStatus"]} >= {"node"}, local

    # kwok plays the pods (no container runs): the job finishes and the manager says so.
    def complete() -> dict:
        obj = manager.get_namespaced_custom_object(c.TRAINER_GROUP, c.TRAINER_VERSION,
                                                   "default", c.TRAINJOBS, name)
        return {cond["type"]: cond["status"]
                for cond in (obj.get("status") or {}).get("conditions") or []}

    eventually(complete, lambda conditions: conditions.get("Complete") == "True", timeout=120,
               expected=f"{name} Complete=True on the manager once kwok has run its pods")

    # The dashboard's state, published on the host's loopback only. Polled: one request's
    # own timeout would be a ceiling that a loaded machine's slower answer does not stretch.
    dashboard = f"http://127.0.0.1:{stack.ports['DISPATCHER_DASHBOARD_PORT']}/api/state"
    eventually(lambda: json.loads(urllib.request.urlopen(dashboard, timeout=10).read()),
               lambda state: name in {job["name"] for job in state["trainJobs"]}, timeout=60,
               expected=f"the dashboard's state ({dashboard}) to list {name}")

    states = stack.states()
    for service in LONG_RUNNING:
        assert states[service] == ("running", 0), (
            f"{service} should run without a restart; state {states[service]}")

    first = stack.down()
    said = f"exit {first.returncode}:\n{first.stdout[-2000:]}\n{first.stderr[-2000:]}"
    (tmp_path / "compose-down.log").write_text(said)
    left = stack.leftovers()
    assert not left["containers"] and not left["volumes"], (
        f"`docker compose down -v` left {left}; compose said {said}")

    # The engine can hold a removed container's endpoint on the network for a moment (a
    # known engine race, reported under load): compose then leaves the network ("Resource is
    # still in use") or fails to remove it ("has active endpoints"). Nothing of the
    # project holds it any more, so another `down` removes it; only the network may need it.
    def networks_left() -> list[str]:
        networks = stack.leftovers()["networks"]
        if networks:
            stack.down()
        return networks

    eventually(networks_left, lambda networks: not networks, timeout=60, interval=1,
               expected=f"the project's network gone after `docker compose down -v` "
                        f"(its first run: {said})")
