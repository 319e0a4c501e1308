"""The remote view (docs/remote-view.md) deployed on kind, as a team adds it: `python -m
clusters deploy --remote-api` applies the manager's overlay with the component
manifests/remote-api/serving, then manifests/remote-api; the manager's kube-apiserver
(kubeadm's, with the aggregation layer's flags) proxies remote.trainjob-dispatcher.io to
the dispatcher's two replicas through the shipped Service, and the jobs' Pods are real
containers (the trainjob-workload image) whose logs the workers' kubelets serve.

* the APIService is Available with its caBundle, the Service routes to both replicas, and
  kubectl discovers the resources;
* a job's container prints known lines and exits 3: a user bound only to the namespace's
  `view` ClusterRole (a ServiceAccount token of the manager) reads those lines with
  `kubectl trainjob logs` and `kubectl get --raw .../log`, follows them with `kubectl
  trainjob logs -f` as they are printed until the container's last line, and reads the
  worker's BackoffLimitExceeded, naming the worker, among the manager TrainJob's Events;
* a user of another namespace is refused with 403 and the reason (headers naming another
  user sent along change nothing), and so is anonymous;
* the leading dispatcher's Pod deleted while logs are followed, at least one of them
  relayed by that Pod: each follow either ends or goes on with lines printed after the Pod
  is gone, within a bounded wait, and a new log request is served by the other replica;
* `kubectl delete -k manifests/remote-api` leaves no APIService (nor anything else of the
  base) and the manager still deletes a namespace (last but for the teardown, which
  removes the product as test_deployed_product.py does).

Modules run in name order: this one after test_deployed_product.py (which leaves the images
built and loaded, and removes its own deployment) and before test_kind_clusters.py (which
ends with `down`), on the session's kind clusters (conftest.py).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import queue
import re
import secrets
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_deployed_product import conditions, create, get, is_true, trainjob, workload_runtime

from clusters import fixtures, kustomize
from clusters.binaries import find_binaries
from clusters.kind import remote_api, waits
from clusters.kind.deploy import WORKER_BASE, Shipped, deploy, manager_kustomization
from clusters.testing import eventually
from controller_kit.kubeclient import api_client
from dispatcher.remote_view import APISERVICE, GROUP_VERSION, PODS, TRAINJOB_LABEL
from trainjob import constants as c

from kind_layout import NAMES

WORKERS = NAMES[1:]
KUBECTL_TIMEOUT = 60
JOB_VIEWER_ROLE = "trainjob-dispatcher-job-viewer"
# The job whose lines are read: long enough to be read and followed while it runs.
PRINTS_FOR = "40s"
EXIT_CODE = 3
# The job whose log is followed while the leader's Pod goes: it outlives the module's tests
# (deleted at the end).
FOLLOWED_FOR = "600s"
# Follows opened at most, until each replica relays one of them (the Service picks a ready
# Pod at random for each connection).
MAX_FOLLOWS = 8

# In make test with the other kind modules; make test-kind-remote-view runs it alone.
pytestmark = pytest.mark.kind_remote_view


# --- the deployment, its namespace and its users ---------------------------------------

class Product:
    def __init__(self, kind, shipped: Shipped, directory: Path):
        self.kind, self.shipped, self.directory = kind, shipped, directory

    def api(self, name: str = "manager"):
        return api_client(self.kind.kubeconfig(name))

    @property
    def admin(self) -> Path:
        return self.kind.kubeconfig("manager")

    def user(self, namespace: str, name: str, role: str | None = "view") -> Path:
        """A kubeconfig for manager user ``system:serviceaccount:<namespace>:<name>`` (a
        ServiceAccount's token from a TokenRequest), bound to ClusterRole ``role`` in its
        namespace and nothing else."""
        with self.api() as api:
            core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
            core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
                metadata=client.V1ObjectMeta(name=name)))
            if role:
                rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
                    metadata=client.V1ObjectMeta(name=f"{name}-{role}"),
                    role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io",
                                              kind="ClusterRole", name=role),
                    subjects=[client.RbacV1Subject(kind="ServiceAccount", name=name,
                                                   namespace=namespace)]))
            token = core.create_namespaced_service_account_token(
                name, namespace, client.AuthenticationV1TokenRequest(
                    spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
            ).status.token
        admin = yaml.safe_load(self.admin.read_text())
        cluster = admin["clusters"][0]
        path = self.directory / f"{namespace}-{name}.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": cluster["name"],
                                                    "user": name}}],
            "current-context": name}))
        path.chmod(0o600)
        return path


@pytest.fixture(scope="module")
def product(kind_clusters, tmp_path_factory):
    started = time.monotonic()
    report = deploy(kind_clusters, timeout=480, with_remote_api=True)
    print("deployed with the remote view:", report.steps, f"{report.seconds:.0f} s")
    for name in WORKERS:
        with api_client(kind_clusters.kubeconfig(name)) as api:
            fixtures.install_runtime(api, workload_runtime())
    yield Product(kind_clusters, Shipped.read(), tmp_path_factory.mktemp("remote-view-kind"))
    # The product goes as test_deployed_product.py's last test removes it (the remote view
    # first: an APIService without its dispatcher blocks the manager's namespace deletion),
    # so that the next module finds the clusters as kind made them.
    remote_api.remove(kind_clusters.kubeconfig("manager"))
    directory, _ = manager_kustomization(kind_clusters, with_remote_api=True)
    results: dict[str, subprocess.CompletedProcess] = {}

    def delete(cluster: str, path: Path) -> None:
        results[cluster] = kustomize.kubectl(
            kind_clusters.kubeconfig(cluster), "delete", "-k", str(path),
            "--ignore-not-found", "--wait=true", "--timeout=180s", timeout=240)

    threads = [threading.Thread(target=delete, args=(
        n, directory if n == "manager" else kustomize.base_path(WORKER_BASE))) for n in NAMES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"remote view module: {time.monotonic() - started:.0f} s with deploy and removal")
    assert {n: r.returncode for n, r in results.items()} == dict.fromkeys(NAMES, 0), {
        n: r.stderr for n, r in results.items()}


@pytest.fixture(scope="module")
def namespace(product):
    """The jobs' namespace on every cluster, opened on the workers to the dispatcher's
    copies (writer) and to the remote view's reads (job-viewer), as a worker's
    administrator does (docs/remote-view.md)."""
    name = f"kind-{secrets.token_hex(3)}"
    for cluster in NAMES:
        with product.api(cluster) as api:
            fixtures.ensure_namespace(api, name)
            if cluster == "manager":
                continue
            fixtures.open_namespace_to_dispatcher(api, name)
            client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
                name, client.V1RoleBinding(
                    metadata=client.V1ObjectMeta(name=JOB_VIEWER_ROLE),
                    role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io",
                                              kind="ClusterRole", name=JOB_VIEWER_ROLE),
                    subjects=[client.RbacV1Subject(
                        kind="ServiceAccount", name=fixtures.WORKER_ACCESS_ACCOUNT[1],
                        namespace=fixtures.WORKER_ACCESS_ACCOUNT[0])]))
    yield name
    with product.api() as manager:
        client.CustomObjectsApi(manager).delete_collection_namespaced_custom_object(
            c.TRAINER_GROUP, c.TRAINER_VERSION, name, c.TRAINJOBS)
        eventually(lambda: client.CustomObjectsApi(manager).list_namespaced_custom_object(
                       c.TRAINER_GROUP, c.TRAINER_VERSION, name, c.TRAINJOBS)["items"],
                   lambda left: not left, timeout=120,
                   expected=f"every TrainJob of {name} gone from the manager")
    for cluster in NAMES:
        with product.api(cluster) as api:
            client.CoreV1Api(api).delete_namespace(name)


@pytest.fixture(scope="module")
def jobs(product, namespace):
    """Both jobs at once, so their Pods start together: ``prints`` prints its lines and
    exits 3; ``followed`` prints a line a second for longer than the module runs."""
    with product.api() as manager:
        create(manager, trainjob("prints", namespace, "--run-for", PRINTS_FOR,
                                 "--exit-code", str(EXIT_CODE)))
        create(manager, trainjob("followed", namespace, "--run-for", FOLLOWED_FOR))
    return ("prints", "followed")


@pytest.fixture(scope="module")
def users(product, namespace):
    """``viewer``: bound to `view` in the jobs' namespace; ``outsider``: to `view` in a
    namespace of its own."""
    other = f"{namespace}-other"
    with product.api() as api:
        fixtures.ensure_namespace(api, other)
    yield {"viewer": product.user(namespace, "viewer"),
           "outsider": product.user(other, "outsider"),
           "outsider_name": f"system:serviceaccount:{other}:outsider"}
    with product.api() as api:
        client.CoreV1Api(api).delete_namespace(other)


# --- helpers ---------------------------------------------------------------------------

def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess:
    return kustomize.kubectl(kubeconfig, *args, timeout=KUBECTL_TIMEOUT)


def kubectl_argv(kubeconfig: Path, *args: str) -> list[str]:
    return [str(find_binaries(build=False, names=("kubectl",)).kubectl),
            f"--kubeconfig={kubeconfig}", *args]


def plugin_env() -> dict[str, str]:
    """kubectl finds the plugin as a user's does: the ``kubectl-trainjob`` executable the
    package installs, on the PATH (this virtualenv's bin)."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "kubectl-trainjob").is_file(), f"no kubectl-trainjob in {bin_dir}"
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def plugin_argv(kubeconfig: Path, *args: str) -> list[str]:
    """``kubectl trainjob ARGS``: kubectl takes no flag before a plugin's name."""
    return [str(find_binaries(build=False, names=("kubectl",)).kubectl), "trainjob", *args,
            f"--kubeconfig={kubeconfig}"]


def plugin(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(plugin_argv(kubeconfig, *args), capture_output=True, text=True,
                          timeout=KUBECTL_TIMEOUT, env=plugin_env())


class Follow:
    """A running command whose output lines are collected as they come, each with the
    time it arrived."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None):
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=env)
        self.lines: list[tuple[float, str]] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._queue.put((time.monotonic(), line.rstrip("\n")))

    def collect(self) -> list[tuple[float, str]]:
        while not self._queue.empty():
            self.lines.append(self._queue.get_nowait())
        return self.lines

    def ended(self) -> bool:
        return self.process.poll() is not None

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        return self.process.stderr.read()


def remote_pods(kubeconfig: Path, namespace: str, job: str) -> list[dict] | str:
    out = kubectl(kubeconfig, "get", PODS, "-n", namespace, "-l", f"{TRAINJOB_LABEL}={job}",
                  "-o", "json")
    return json.loads(out.stdout)["items"] if out.returncode == 0 else out.stderr


def running_pod(kubeconfig: Path, namespace: str, job: str) -> dict:
    """The job's (one) Pod, Running on its worker, as the remote view lists it."""
    [pod] = eventually(lambda: remote_pods(kubeconfig, namespace, job),
                       lambda found: isinstance(found, list) and len(found) == 1
                       and found[0]["status"]["phase"] == "Running", timeout=120,
                       expected=f"the one Pod of TrainJob {namespace}/{job} Running, listed "
                                "through the aggregated API")
    return pod


def log_path(namespace: str, pod: str) -> str:
    return f"/apis/{GROUP_VERSION}/namespaces/{namespace}/{PODS}/{pod}/log"


def https_get(kubeconfig: Path, path: str, headers: dict[str, str]) -> tuple[int, dict]:
    """GET ``path`` on the manager's apiserver with only ``headers`` (no credentials of
    the kubeconfig's: its server and CA)."""
    cluster = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
    context = ssl.create_default_context(
        cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    server = urlsplit(cluster["server"])
    conn = http.client.HTTPSConnection(server.hostname, server.port, context=context,
                                       timeout=30)
    try:
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        conn.close()


def token_of(kubeconfig: Path) -> str:
    return yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]


STEP = re.compile(r"^step (\d+)$")


# --- tests -----------------------------------------------------------------------------

def test_the_apiservice_is_available_on_both_replicas(product):
    out = kubectl(product.admin, "get", "apiservice", APISERVICE, "-o", "json")
    assert out.returncode == 0, out.stderr
    apiservice = json.loads(out.stdout)
    available = next(x for x in apiservice["status"]["conditions"] if x["type"] == "Available")
    assert available["status"] == "True", available
    assert apiservice["spec"]["caBundle"] and not apiservice["spec"].get(
        "insecureSkipTLSVerify"), apiservice["spec"]
    with product.api() as api:
        shipped = product.shipped
        assert remote_api.endpoints_problem(api, shipped.dispatcher_namespace,
                                            shipped.dispatcher_deployment) is None
        pods = client.CoreV1Api(api).list_namespaced_pod(shipped.dispatcher_namespace).items
        assert len(pods) == 2 and all(
            "--remote-api-port=6443" in p.spec.containers[0].args for p in pods), [
            p.spec.containers[0].args for p in pods]
    eventually(lambda: kubectl(product.admin, "api-resources",
                               f"--api-group={GROUP_VERSION.split('/')[0]}", "-o", "name"),
               lambda out: set(out.stdout.split()) == {
                   f"trainjobpods.{GROUP_VERSION.split('/')[0]}",
                   f"trainjobevents.{GROUP_VERSION.split('/')[0]}"}, timeout=30,
               expected="kubectl api-resources listing trainjobpods and trainjobevents")


def test_users_without_view_of_the_namespace_are_refused(product, namespace, users, jobs):
    pods = f"/apis/{GROUP_VERSION}/namespaces/{namespace}/{PODS}"
    outsider = users["outsider_name"]
    out = kubectl(users["outsider"], "get", PODS, "-n", namespace, "-l",
                  f"{TRAINJOB_LABEL}=prints")
    assert out.returncode != 0 and "Forbidden" in out.stderr, out
    assert f'User "{outsider}" cannot list resource "{PODS}"' in out.stderr and \
        f'in the namespace "{namespace}"' in out.stderr, out.stderr
    out = kubectl(users["outsider"], "get", "--raw", log_path(namespace, "prints-node-0-0-x"))
    assert out.returncode != 0 and f'cannot get resource "{PODS}/log"' in out.stderr, out
    # The plugin says which permission is missing.
    out = plugin(users["outsider"], "logs", "prints", "-n", namespace)
    assert out.returncode == 1 and "lacks the RBAC" in out.stderr and \
        f'User "{outsider}" cannot list resource "{PODS}"' in out.stderr, out.stderr
    # Headers naming another user, sent along, are not the aggregation layer's to believe:
    # the apiserver decides who the caller is.
    status, body = https_get(users["outsider"], pods, {
        "Authorization": f"Bearer {token_of(users['outsider'])}",
        "X-Remote-User": "system:admin", "X-Remote-Group": "system:masters"})
    assert status == 403 and f'User "{outsider}" cannot list resource' in body["message"], (
        status, body)
    # Anonymous: kubeadm's apiserver takes anonymous requests as system:anonymous, whom
    # RBAC grants nothing here.
    status, body = https_get(users["outsider"], pods, {})
    assert (status, body.get("reason")) == (403, "Forbidden") and \
        'User "system:anonymous" cannot list resource' in body["message"], (status, body)


def test_a_namespace_viewer_reads_and_follows_the_lines_of_a_job_that_exits_3(
        product, namespace, users, jobs):
    viewer = users["viewer"]
    pod = running_pod(viewer, namespace, "prints")
    name = pod["metadata"]["name"]
    first = re.compile(rf"^workload on \S+: running for {PRINTS_FOR}, then exiting "
                       rf"{EXIT_CODE}$")
    last = re.compile(rf"^done after [\d.]+s, exit code {EXIT_CODE}$")
    # kubectl trainjob logs -f: each line as it is printed, to the container's last one;
    # begun first, so that the reads below take nothing from the time it follows.
    follow = Follow(plugin_argv(viewer, "logs", "prints", "-n", namespace, "-f"),
                    env=plugin_env())
    try:
        # kubectl trainjob logs: the trainer's Pod, chosen by the plugin.
        read = eventually(lambda: plugin(viewer, "logs", "prints", "-n", namespace),
                          lambda out: out.returncode == 0
                          and "step 1" in out.stdout.splitlines(), timeout=30,
                          expected="kubectl trainjob logs prints: the container's first line "
                                   "and its step 1")
        lines = read.stdout.splitlines()
        assert first.match(lines[0]) and lines[1] == "step 1", lines
        # kubectl get --raw of the log subresource: the same lines, and tailLines reaching
        # the kubelet.
        out = kubectl(viewer, "get", "--raw", log_path(namespace, name))
        assert out.returncode == 0 and first.match(out.stdout.splitlines()[0]), out
        out = kubectl(viewer, "get", "--raw", f"{log_path(namespace, name)}?tailLines=1")
        # One line: a step, or the last one if the container is done already.
        assert out.returncode == 0 and len(out.stdout.splitlines()) == 1 and (
            STEP.match(out.stdout.strip()) or last.match(out.stdout.strip())), out
        eventually(lambda: (follow.collect(), follow.ended())[1], lambda ended: ended,
                   timeout=90, interval=0.2,
                   expected=f"kubectl trainjob logs -f ending with the container, which "
                            f"exits {EXIT_CODE} after {PRINTS_FOR}")
        got = follow.collect()
    finally:
        stderr = follow.stop()
    assert follow.process.returncode == 0, stderr
    text = [line for _, line in got]
    assert first.match(text[0]), text
    assert last.match(text[-1]), text
    steps = [(at, int(STEP.match(line)[1])) for at, line in got if STEP.match(line)]
    # In the order printed, none twice (a step is the whole seconds elapsed at a tick: on
    # a busy machine a late tick skips a number).
    numbers = [s for _, s in steps]
    assert numbers[0] == 1 and numbers == sorted(set(numbers)), text
    # Streamed: the steps printed while it was followed arrived one by one after the
    # lines already there, not all at the end.
    live = [step for at, step in steps if at > got[0][0] + 1.5]
    assert len(live) >= 3 and steps[-1][0] - steps[-len(live)][0] >= len(live) / 2, (
        f"expected lines arriving a second or so apart while followed; got {got}")

    # Why it failed, from the manager, as the viewer: the worker's Job Event on the
    # TrainJob, naming the worker.
    with product.api() as manager:
        failed = eventually(lambda: get(manager, namespace, "prints"),
                            lambda job: is_true(job, c.CONDITION_FAILED), timeout=60,
                            expected="TrainJob prints Failed=True on the manager")
    worker = (failed["metadata"].get("annotations") or {})[c.PLACEMENT_ANNOTATION]
    assert worker in WORKERS, failed["metadata"]
    assert conditions(failed)[c.CONDITION_FAILED]["reason"] == "FailedJobs", failed["status"]

    def events():
        out = kubectl(viewer, "get", "events", "-n", namespace, "--field-selector",
                      f"involvedObject.kind={c.TRAINJOB_KIND},involvedObject.name=prints",
                      "-o", "json")
        return json.loads(out.stdout)["items"] if out.returncode == 0 else out.stderr

    found = eventually(events, lambda seen: isinstance(seen, list) and any(
        e["reason"] == "BackoffLimitExceeded" for e in seen), timeout=60,
        expected="the worker's BackoffLimitExceeded on the manager's TrainJob prints")
    [event] = [e for e in found if e["reason"] == "BackoffLimitExceeded"]
    assert event["type"] == "Warning", event
    assert event["message"].startswith(f"{worker}: Job prints-node-0: "), event["message"]


def test_the_leaders_pod_deleted_while_logs_are_followed_never_hangs(
        product, namespace, users, jobs):
    viewer = users["viewer"]
    shipped = product.shipped
    pod = running_pod(viewer, namespace, "followed")["metadata"]["name"]
    path = f"{log_path(namespace, pod)}?follow=true&tailLines=1"
    manager = product.api()
    core = client.CoreV1Api(manager)
    follows: list[Follow] = []
    try:
        holder = client.CoordinationV1Api(manager).read_namespaced_lease(
            shipped.dispatcher_lease, shipped.dispatcher_namespace).spec.holder_identity
        replicas = [p.metadata.name for p in core.list_namespaced_pod(
            shipped.dispatcher_namespace).items]
        [leader] = [p for p in replicas if holder.startswith(p)]
        told = f"reads the log of {namespace}/{pod} "

        def relayed_by(replica: str) -> int:
            """How many of the follows ``replica`` relays (it logs each one it opens)."""
            return core.read_namespaced_pod_log(replica, shipped.dispatcher_namespace,
                                                since_seconds=600).count(told)

        # Follows until each replica relays one (each first sends the line already there).
        while True:
            follows.append(Follow(kubectl_argv(viewer, "get", "--raw", path)))
            eventually(lambda: len(follows[-1].collect()), lambda n: n >= 1, timeout=30,
                       expected=f"follow {len(follows)} streaming its first line")
            counts = eventually(lambda: {r: relayed_by(r) for r in replicas},
                                lambda seen: sum(seen.values()) == len(follows), timeout=30,
                                expected=f"the {len(follows)} follows in the replicas' logs")
            if min(counts.values()) >= 1 or len(follows) == MAX_FOLLOWS:
                break
        assert min(counts.values()) >= 1, (
            f"{len(follows)} follows did not reach both replicas: {counts}")
        standby = sum(n for replica, n in counts.items() if replica != leader)

        core.delete_namespaced_pod(leader, shipped.dispatcher_namespace)

        def gone() -> bool:
            try:
                core.read_namespaced_pod(leader, shipped.dispatcher_namespace)
            except ApiException as err:
                if err.status == 404:
                    return True
                raise
            return False

        eventually(gone, bool, timeout=90, expected=f"the leader's Pod {leader} gone")
        gone_at = time.monotonic()

        def states() -> list[str]:
            """Each follow: ended, going on (a line arrived after the Pod was gone), or
            neither yet."""
            return ["ended" if f.ended() else "goes on" if any(
                at > gone_at + 1 for at, _ in f.collect()) else "waiting" for f in follows]

        seen = eventually(states, lambda now: "waiting" not in now, timeout=60, interval=0.5,
                          expected="every follow ended or still streaming new lines once "
                                   f"the leader's Pod {leader} was gone")
        ended = [f"exit {f.process.returncode}: {f.stop().strip()[-300:]}"
                 for f, state in zip(follows, seen, strict=True) if state == "ended"]
        print(f"follows after the leader's Pod went ({counts[leader]} of {len(follows)} "
              f"relayed by it): {seen}; how the ended ones ended: {ended}")
        # Those of the deleted Pod end; those of the other replica go on.
        assert (seen.count("ended"), seen.count("goes on")) == (counts[leader], standby), (
            f"{counts[leader]} follows relayed by the deleted Pod, {standby} by the other "
            f"replica; states: {seen}")
        for follow, state in zip(follows, seen, strict=True):
            if state == "goes on":
                steps = [int(STEP.match(line)[1]) for _, line in follow.collect()
                         if STEP.match(line)]
                assert steps == sorted(set(steps)), steps
    finally:
        for follow in follows:
            follow.stop()
        manager.close()
    # A new request is served by the replica left (or the Deployment's new one).
    eventually(lambda: kubectl(viewer, "get", "--raw", f"{log_path(namespace, pod)}"
                                                         "?tailLines=1"),
               lambda out: out.returncode == 0 and STEP.match(out.stdout.strip()), timeout=30,
               expected="the followed Pod's last line, read again after the failover")


def test_removing_the_remote_api_leaves_no_apiservice_and_namespaces_delete(product):
    """Last (the teardown then removes the product)."""
    with product.api() as api:
        waits.wait_for("the dispatcher rolled out again after the leader's deletion",
                       lambda: waits.deployment_problem(api, product.shipped.dispatcher_namespace,
                                                        product.shipped.dispatcher_deployment),
                       time.monotonic() + 180)
    remote_api.remove(product.admin)
    installed = {f"{o['kind']}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
                 for o in kustomize.render(remote_api.BASE)}
    left = []
    for key in sorted(installed):
        kind, namespace, name = key.split("/")
        out = kubectl(product.admin, "get", kind, name, *(["-n", namespace] if namespace
                                                          else []), "--ignore-not-found",
                      "-o", "name")
        assert out.returncode == 0, out.stderr
        left += out.stdout.split()
    assert left == [], f"left behind by kubectl delete -k manifests/remote-api: {left}"
    out = kubectl(product.admin, "get", "apiservices", "-o", "name")
    assert f"apiservice.apiregistration.k8s.io/{APISERVICE}" not in out.stdout.split(), out
    # Discovery is whole again, and the namespace controller deletes a namespace.
    out = kubectl(product.admin, "api-resources", "-o", "name")
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    name = f"kind-{secrets.token_hex(3)}-deleted"
    with product.api() as api:
        core = client.CoreV1Api(api)
        fixtures.ensure_namespace(api, name)
        core.create_namespaced_config_map(name, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="content")))
        core.delete_namespace(name)

        def phase() -> str:
            try:
                namespace = core.read_namespace(name)
            except ApiException as err:
                if err.status == 404:
                    return "gone"
                raise
            return f"{namespace.status.phase}: {namespace.status.conditions}"

        eventually(phase, lambda now: now == "gone", timeout=60,
                   expected=f"namespace {name} deleted by the namespace controller")
        # The dispatcher still runs, serving its port to nobody.
        assert waits.deployment_problem(api, product.shipped.dispatcher_namespace,
                                        product.shipped.dispatcher_deployment) is None
