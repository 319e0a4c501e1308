"""The remote view (dispatcher/remote_view, docs/remote-view.md): a job's Pods, Events and
logs on its worker, read from the manager with the user's own credentials, through the
manager apiserver's aggregation layer to a dispatcher replica (a standby beside
dispatch_env's leader: reads need no leadership).

The aggregator reaches the dispatcher on this machine through an ExternalName Service
naming ``localhost`` (an endpoint may not be a loopback address: the apiserver refuses
one); the APIService is manifests/remote-api's, its caBundle injected by the dispatcher,
and users are authorized by manifests/remote-api's ClusterRole, taken into ``view`` by
the manager's ClusterRole aggregation controller. The job's Pods run on a kwok Node of the
test's own whose address and kubelet port are kwok's, so their logs are served for real
(from the file kwok follows, ``ControlPlane.kwok_logs_file``).
"""

from __future__ import annotations

import base64
import datetime
import http.client
import json
import os
import queue
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures, kustomize, worker_stack
from clusters.binaries import find_binaries
from clusters.controlplane import free_port
from clusters.pki import FRONT_PROXY_CLIENT, cert_pem, key_pem
from clusters.testing import (
    ServiceProcess,
    eventually,
    holds_for,
    machine_load,
    request_counts,
    stretched,
)
from controller_kit.api_time import parse_time
from dispatcher.remote_view import APISERVICE, GROUP_VERSION, SERVICE, TRAINJOB_LABEL
from dispatcher.remote_view.copies import Copy
from dispatcher.remote_view.server import EXTRA_CONNECTIONS, HEADERS_SECONDS
from dispatcher.remote_view.worker_reads import WorkerReads
from dispatcher.workers.cluster import WorkerCluster
from trainjob import constants as c

from dispatch_helpers import (
    CONFIG,
    TRAINER,
    condition,
    create,
    get,
    placement,
    trainjob,
    wait_placed,
)

DISPATCHER_NAMESPACE = "kueue-system"  # dispatch_env's dispatcher's (the default)
LEASE_ARGS = ("--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5")
MAX_STREAMS = 2
LOG_NODE = "remote-view-logs"
NODE_LABEL = "example.com/remote-view"
RUNTIME = "remote-view-torch"
WORKER = "worker-1"
KUBECTL_TIMEOUT = 60
FAILING_RUNTIME = "remote-view-failing"
# A failed job's copy kept this long here (the default: 900 s), so a test sees it end; a
# completed one's not at all. Both dispatchers (leader and standby) are given it.
FAILED_RETENTION = 30
DISPATCHER_ARGS = ("--retention", "0", "--failed-retention", str(FAILED_RETENTION))


def _kwok_port(multicluster) -> int:
    return multicluster[WORKER].control_plane.port("kwok")


@pytest.fixture(scope="module")
def remote_view(dispatch_env, multicluster, tmp_path_factory):
    """A standby dispatcher serving the remote view, routed to by the manager's
    aggregator; a Node of worker-1 whose pods' logs kwok serves, and a runtime whose pods
    go there."""
    manager, worker = multicluster.manager, multicluster[WORKER]
    directory = tmp_path_factory.mktemp("remote-view")
    port = free_port()
    worker.core.create_node({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": LOG_NODE, "labels": {NODE_LABEL: "logs", "type": "kwok"},
                     "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "20"},
                   "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "20"},
                   # The worker's apiserver asks this address and port for a pod's log:
                   # kwok's server. An address of this machine only.
                   "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                 {"type": "Hostname", "address": "127.0.0.1"}],
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": _kwok_port(multicluster)}}}})
    fixtures.install_runtime(worker.api, fixtures.torch_runtime(
        RUNTIME, cpu="100m", memory="64Mi", node_selector={NODE_LABEL: "logs"},
        pod_annotations={worker_stack.OUTCOME_ANNOTATION: worker_stack.OUTCOME_NEVER}))
    objects = kustomize.render("remote-api")
    viewer_roles = [o for o in objects if o["kind"] == "ClusterRole" and "rbac.authorization"
                    ".k8s.io/aggregate-to-view" in (o["metadata"].get("labels") or {})]
    [apiservice] = [o for o in objects if o["kind"] == "APIService"]
    # The harness's routing: the shipped Service selects Pods; here the dispatcher is a
    # process on this machine.
    apiservice["spec"]["service"] = {"namespace": DISPATCHER_NAMESPACE, "name": SERVICE,
                                     "port": port}
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": SERVICE, "namespace": DISPATCHER_NAMESPACE},
               "spec": {"type": "ExternalName", "externalName": "localhost",
                        "ports": [{"name": "remote-api", "port": port}]}}
    process = ServiceProcess(
        "dispatcher", manager.kubeconfig, directory / "dispatcher.log",
        ("--multikueue-config", CONFIG, *LEASE_ARGS, "--remote-api-port", str(port),
         "--remote-api-host", "127.0.0.1", "--remote-api-max-streams", str(MAX_STREAMS),
         "--remote-api-stream-idle-timeout", "30", *DISPATCHER_ARGS), supervised=True)
    try:
        kustomize.apply(manager.kubeconfig, [*viewer_roles, service])
        process.start()
        kustomize.apply(manager.kubeconfig, [apiservice])
        eventually(lambda: manager.custom.get_cluster_custom_object(
                       "apiregistration.k8s.io", "v1", "apiservices", APISERVICE),
                   lambda obj: any(cond["type"] == "Available" and cond["status"] == "True"
                                   for cond in (obj.get("status") or {}).get("conditions") or []),
                   timeout=60, expected=f"APIService {APISERVICE} Available (the caBundle "
                                        "injected by the dispatcher, its discovery answered)")
        yield RemoteViewEnv(multicluster, process, port, directory)
    finally:
        # First the APIService: one left unavailable blocks namespace deletion on the
        # manager for every later test.
        for delete in (
                lambda: manager.custom.delete_cluster_custom_object(
                    "apiregistration.k8s.io", "v1", "apiservices", APISERVICE),
                lambda: manager.core.delete_namespaced_service(SERVICE, DISPATCHER_NAMESPACE),
                lambda: worker.core.delete_node(LOG_NODE)):
            try:
                delete()
            except ApiException as err:
                if err.status != 404:
                    raise
        process.stop()


class RemoteViewEnv:
    def __init__(self, multicluster, process, port: int, directory: Path):
        self.multicluster, self.process, self.port = multicluster, process, port
        self.directory = directory

    @property
    def manager(self):
        return self.multicluster.manager

    def user(self, name: str, namespace: str | None, role: str = "view") -> Path:
        """A kubeconfig of manager user ``name``, bound to ClusterRole ``role`` in
        ``namespace`` (none: bound nowhere)."""
        path = self.multicluster.harness.issue_user_kubeconfig(
            "manager", name, (), self.directory / f"{name}.kubeconfig")
        if namespace is not None:
            client.RbacAuthorizationV1Api(self.manager.api).create_namespaced_role_binding(
                namespace, client.V1RoleBinding(
                    metadata=client.V1ObjectMeta(name=f"{name}-{role}"),
                    role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io",
                                              kind="ClusterRole", name=role),
                    subjects=[client.RbacV1Subject(kind="User", name=name,
                                                   api_group="rbac.authorization.k8s.io")]))
        return path

    def front_proxy_context(self, with_certificate: bool = True,
                            other_ca: bool = False) -> ssl.SSLContext:
        """A client context trusting the dispatcher's CA (from its Secret), presenting the
        front proxy's certificate (or the cluster CA's admin one, or none)."""
        secret = self.manager.core.read_namespaced_secret(f"{SERVICE}-cert",
                                                          DISPATCHER_NAMESPACE)
        context = ssl.create_default_context(
            cadata=base64.b64decode(secret.data["ca.crt"]).decode())
        context.check_hostname = False  # its name is the Service's, reached here on 127.0.0.1
        pki = self.manager.control_plane.pki
        if other_ca:
            context.load_cert_chain(pki.admin_cert, pki.admin_key)
        elif with_certificate:
            key, cert = pki.front_proxy_authority().issue(FRONT_PROXY_CLIENT, client=True)
            crt, keyfile = self.directory / "fp.crt", self.directory / "fp.key"
            crt.write_bytes(cert_pem(cert))
            keyfile.write_bytes(key_pem(key))
            context.load_cert_chain(crt, keyfile)
        return context

    def direct(self, path: str, context: ssl.SSLContext, headers: dict | None = None,
               timeout: float = 15) -> http.client.HTTPResponse:
        """GET ``path`` on the dispatcher itself (not through the aggregator)."""
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=context,
                                           timeout=timeout)
        conn.request("GET", path, headers=headers or {})
        return conn.getresponse()


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess:
    return kustomize.kubectl(kubeconfig, *args, timeout=KUBECTL_TIMEOUT)


def _cri_line(text: str) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{now} stdout F {text}\n"


def write_log(env: RemoteViewEnv, *lines: str) -> None:
    """Lines every container on the test's Node logs (kwok serves the one file)."""
    with open(env.multicluster[WORKER].control_plane.kwok_logs_file, "a") as out:
        out.writelines(_cri_line(line) for line in lines)


def running_job(env: RemoteViewEnv, namespace: str, name: str) -> list[dict]:
    """A job of the test's runtime, placed on worker-1, its Pod running on the test's
    Node; that Pod as the remote view lists it (as admin)."""
    create(env.manager, namespace, trainjob(name, runtime=RUNTIME))
    worker, _ = wait_placed(env, namespace, name)
    assert worker == WORKER

    def pods():
        out = kubectl(env.manager.kubeconfig, "get", "trainjobpods", "-n", namespace, "-l",
                      f"{TRAINJOB_LABEL}={name}", "-o", "json")
        return json.loads(out.stdout)["items"] if out.returncode == 0 else out.stderr

    return eventually(pods, lambda found: isinstance(found, list) and found and all(
        p["status"]["phase"] == "Running" for p in found), timeout=90,
        expected=f"the Pods of {namespace}/{name} Running on {LOG_NODE}, listed through "
                 "the aggregated API")


def trainer_pod(pods: list[dict], job: str) -> dict:
    """The trainer's Pod (replicated job node) among a job's (the runtime has two
    initializers too)."""
    [pod] = [p for p in pods if p["metadata"]["name"].startswith(f"{job}-node-0-0-")]
    return pod


def test_discovery_names_the_resources_and_the_log_subresource(remote_view):
    # The apiserver's discovery takes the group in a moment after the APIService is
    # Available.
    eventually(lambda: kubectl(remote_view.manager.kubeconfig, "api-resources",
                               "--api-group=remote.trainjob-dispatcher.io", "-o", "name"),
               lambda out: set(out.stdout.split()) == {
                   "trainjobpods.remote.trainjob-dispatcher.io",
                   "trainjobevents.remote.trainjob-dispatcher.io"}, timeout=30,
               expected="kubectl api-resources listing trainjobpods and trainjobevents")
    out = kubectl(remote_view.manager.kubeconfig, "get", "--raw", f"/apis/{GROUP_VERSION}")
    resources = {r["name"]: r for r in json.loads(out.stdout)["resources"]}
    assert set(resources) == {"trainjobpods", "trainjobpods/log", "trainjobevents"}
    assert resources["trainjobpods"]["namespaced"] and resources["trainjobpods"]["verbs"] == [
        "get", "list"]
    apiservice = remote_view.manager.custom.get_cluster_custom_object(
        "apiregistration.k8s.io", "v1", "apiservices", APISERVICE)
    assert apiservice["spec"].get("caBundle") and not apiservice["spec"].get(
        "insecureSkipTLSVerify")


def test_a_namespace_viewer_lists_the_jobs_pods_and_events(remote_view, namespace):
    env = remote_view
    pod = trainer_pod(running_job(env, namespace, "viewed"), "viewed")
    alice = env.user("alice", namespace)
    out = kubectl(alice, "get", "trainjobpods", "-n", namespace, "-l",
                  f"{TRAINJOB_LABEL}=viewed", "-o", "json")
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)["items"]
    assert len(listed) == 3, listed  # the trainer and the two initializers
    item = trainer_pod(listed, "viewed")
    assert item["metadata"]["labels"][TRAINJOB_LABEL] == "viewed"
    status = item["status"]
    assert (status["worker"], status["node"], status["phase"], status["ready"],
            status["restarts"]) == (WORKER, LOG_NODE, "Running", "1/1", 0), status
    assert status["startTime"] and status["lastTermination"] is None
    # The table kubectl prints, and one Pod by name.
    out = kubectl(alice, "get", "trainjobpods", "-n", namespace)
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "TRAINJOB", "WORKER", "NODE"], out.stdout
    [row] = [r for r in rows if r.startswith(pod["metadata"]["name"])]
    assert row.split()[:6] == [pod["metadata"]["name"], "viewed", WORKER, LOG_NODE, "1/1",
                               "Running"], out.stdout
    out = kubectl(alice, "get", "trainjobpods", pod["metadata"]["name"], "-n", namespace,
                  "-o", "json")
    assert out.returncode == 0 and json.loads(out.stdout)["status"]["node"] == LOG_NODE, out
    # The worker's Events about the copy and its children: at least its Pod's scheduling.
    events = eventually(
        lambda: json.loads(kubectl(alice, "get", "trainjobevents", "-n", namespace, "-l",
                                   f"{TRAINJOB_LABEL}=viewed", "-o", "json").stdout)["items"],
        lambda found: any(e["reason"] == "Scheduled" for e in found), timeout=30,
        expected="the Scheduled Event of the job's Pod among its worker Events")
    assert all(e["worker"] == WORKER and e["trainJob"] == "viewed" for e in events)
    assert {e["object"].split("/")[0] for e in events} <= {"TrainJob", "JobSet", "Job", "Pod"}


def test_a_user_of_another_namespace_is_refused_with_the_reason(remote_view, namespace):
    env = remote_view
    running_job(env, namespace, "private")
    bob = env.user("bob", None)
    out = kubectl(bob, "get", "trainjobpods", "-n", namespace, "-l",
                  f"{TRAINJOB_LABEL}=private")
    assert out.returncode != 0
    assert "Forbidden" in out.stderr and 'User "bob" cannot list resource "trainjobpods"' \
        in out.stderr and f'in the namespace "{namespace}"' in out.stderr, out.stderr
    out = kubectl(bob, "get", "--raw", f"/apis/{GROUP_VERSION}/namespaces/{namespace}/"
                                       "trainjobpods/private-node-0-0-x/log")
    assert out.returncode != 0 and 'cannot get resource "trainjobpods/log"' in out.stderr, \
        out.stderr


def test_a_job_without_a_copy_is_not_found(remote_view, namespace):
    env = remote_view
    create(env.manager, namespace, trainjob("waiting", runtime=RUNTIME, suspend=True))
    out = kubectl(env.manager.kubeconfig, "get", "trainjobpods", "-n", namespace, "-l",
                  f"{TRAINJOB_LABEL}=waiting")
    assert out.returncode != 0 and "NotFound" in out.stderr and \
        f"TrainJob {namespace}/waiting: has no copy on any worker" in out.stderr, out.stderr
    out = kubectl(env.manager.kubeconfig, "get", "trainjobpods", "-n", namespace, "-l",
                  f"{TRAINJOB_LABEL}=nothing")
    assert out.returncode != 0 and f"TrainJob {namespace}/nothing: not found on the " \
        "manager" in out.stderr, out.stderr


AGGREGATOR = {"X-Remote-User": "system:kube-aggregator", "X-Remote-Group": "system:masters"}
REFUSED_IN_HANDSHAKE = (ssl.SSLError, ConnectionResetError, BrokenPipeError,
                        http.client.RemoteDisconnected)


def test_only_the_front_proxys_certificate_is_served(remote_view):
    env = remote_view
    # Without a client certificate, or with one of another CA (the cluster's own), the
    # handshake fails: nothing is served, the probes' paths neither (the kubelet probes the
    # health port).
    for context in (env.front_proxy_context(with_certificate=False),
                    env.front_proxy_context(other_ca=True)):
        for path in (f"/apis/{GROUP_VERSION}/namespaces/default/trainjobpods", "/healthz"):
            with pytest.raises(REFUSED_IN_HANDSHAKE):
                env.direct(path, context, AGGREGATOR).read()
    # The front proxy's certificate without a user: 401, and the connection is closed.
    answer = env.direct(f"/apis/{GROUP_VERSION}", env.front_proxy_context())
    body = json.loads(answer.read())
    assert answer.status == 401 and body["reason"] == "Unauthorized", body
    assert "no user in the X-Remote-User header" in body["message"], body
    assert answer.getheader("Connection") == "close"
    answer = env.direct("/readyz", env.front_proxy_context())
    assert (answer.status, answer.read()) == (200, b"ok")


def test_idle_connections_do_not_keep_the_aggregator_out(remote_view):
    """As many idle TCP connections as the remote view has connection threads: each is
    cut at the deadline of its handshake and headers, so the aggregator's request is
    served within that deadline, though the idle sockets are still held open."""
    env = remote_view
    threads = MAX_STREAMS + EXTRA_CONNECTIONS
    idle = [socket.create_connection(("127.0.0.1", env.port), timeout=5)
            for _ in range(threads)]
    context = env.front_proxy_context()
    started = time.monotonic()

    def discovery() -> int | str:
        try:
            answer = env.direct(f"/apis/{GROUP_VERSION}", context, AGGREGATOR, timeout=5)
            return answer.status
        except (OSError, http.client.HTTPException) as err:
            return repr(err)

    try:
        eventually(discovery, lambda got: got == 200, timeout=HEADERS_SECONDS + 15,
                   interval=0.5, expected=f"the aggregator's discovery request served once "
                                          f"{threads} idle connections reach their deadline")
        took = time.monotonic() - started
        assert took < HEADERS_SECONDS + 10, took
        # Each idle connection's deadline runs from when a thread took it up: on a busy
        # machine the last may be taken up (and cut) seconds after the first.
        for index, sock in enumerate(idle):
            sock.settimeout(stretched(HEADERS_SECONDS))
            try:
                assert sock.recv(1) == b"", "an idle connection was answered"
            except ConnectionResetError:
                pass  # cut: as good as closed
            except TimeoutError:
                pytest.fail(f"idle connection {index + 1} of {threads} still open "
                            f"{time.monotonic() - started:.1f} s after it was opened, past "
                            f"its {HEADERS_SECONDS:.0f} s deadline ({machine_load()})")
    finally:
        for sock in idle:
            sock.close()


def test_a_list_reads_each_worker_once_whatever_the_number_of_jobs(remote_view, namespace):
    """Three jobs on worker-1: listing the namespace's TrainJobPods costs worker-1's
    apiserver one Pods LIST, and its TrainJobEvents one Events LIST."""
    env = remote_view
    worker = env.multicluster[WORKER]
    names = ("grouped-a", "grouped-b", "grouped-c")
    for name in names:
        create(env.manager, namespace, trainjob(name, runtime=RUNTIME))
    for name in names:
        assert wait_placed(env, namespace, name)[0] == WORKER
    # Each job's copy makes three Pods (the trainer and two initializers).
    eventually(lambda: len(worker.core.list_namespaced_pod(namespace).items),
               lambda count: count == 3 * len(names), timeout=60,
               expected=f"the {3 * len(names)} Pods of {names} on {WORKER}")
    context = env.front_proxy_context()
    base = f"/apis/{GROUP_VERSION}/namespaces/{namespace}"
    listed = {}
    for resource, plural in (("trainjobpods", "pods"), ("trainjobevents", "events")):
        before = request_counts(worker.control_plane)
        answer = env.direct(f"{base}/{resource}", context, AGGREGATOR)
        listed[resource] = json.loads(answer.read())
        assert answer.status == 200, listed[resource]
        lists = request_counts(worker.control_plane)[("", plural, "", "LIST")] - before[
            ("", plural, "", "LIST")]
        assert lists == 1, f"{resource} of {len(names)} jobs: {lists} {plural} LISTs on " \
                           f"{WORKER}, expected one"
    assert sorted({p["status"]["trainJob"] for p in listed["trainjobpods"]["items"]}) == \
        sorted(names) and len(listed["trainjobpods"]["items"]) == 3 * len(names), listed


def test_events_beyond_the_bound_are_read_a_page_at_a_time_and_the_cut_is_said(
        multicluster, namespace):
    worker = multicluster[WORKER]
    for index in range(5):
        worker.core.create_namespaced_event(namespace, client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"paged-{index}"),
            involved_object=client.V1ObjectReference(
                kind="Pod", name=f"paged-node-0-0-{index}", namespace=namespace),
            reason="Tested", message=f"event {index}", type="Normal"))
    copy = Copy(namespace, "paged", WorkerCluster(WORKER, 0, "", api=worker.api))
    bounded = WorkerReads(5, events_page=2, events_limit=4)
    try:
        before = request_counts(worker.control_plane)[("", "events", "", "LIST")]
        found, cut = bounded.events_of([copy])
        pages = request_counts(worker.control_plane)[("", "events", "", "LIST")] - before
        assert pages == 2 and len(found["paged"]) == 4, (pages, found)
        assert f"namespace {namespace} holds more than 4 Events; only the first 4 were " \
               "read" in cut, cut
    finally:
        bounded.close()
    whole = WorkerReads(5, events_page=2)
    try:
        found, cut = whole.events_of([copy])
        assert cut == "" and sorted(e["metadata"]["name"] for e in found["paged"]) == [
            f"paged-{index}" for index in range(5)], (cut, found)
    finally:
        whole.close()


def test_logs_are_passed_the_options_and_follow_streams(remote_view, namespace):
    env = remote_view
    pod = trainer_pod(running_job(env, namespace, "logged"), "logged")
    alice = env.user("alice", namespace)
    base = f"/apis/{GROUP_VERSION}/namespaces/{namespace}/trainjobpods/" \
           f"{pod['metadata']['name']}/log"
    write_log(env, "older line", "last line")
    out = kubectl(alice, "get", "--raw", f"{base}?tailLines=1")
    assert (out.returncode, out.stdout) == (0, "last line\n"), out
    # The worker's refusal, with its status: the option reached it.
    out = kubectl(alice, "get", "--raw", f"{base}?container=nope")
    assert out.returncode != 0 and "container nope is not valid for pod" in out.stderr, out
    out = kubectl(alice, "get", "--raw", f"{base}?tailLines=-1")
    assert out.returncode != 0 and "tailLines=-1: must be 0 or more" in out.stderr, out
    # follow: lines arrive as they are written, through the aggregator, while kubectl
    # still runs. (The worker answers once it has a line to send: the last one, here.)
    follow = subprocess.Popen(
        [str(find_binaries(build=False, names=("kubectl",)).kubectl),
         f"--kubeconfig={alice}", "get", "--raw", f"{base}?follow=true&tailLines=1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in follow.stdout],
                     daemon=True).start()
    try:
        seen: list[str] = []
        written = iter(range(1_000_000))

        def tick() -> list[str]:
            # A new line at each look: whichever was written before kwok began to follow
            # the file is not sent, the next ones are.
            write_log(env, f"tick {next(written)}")
            while not lines.empty():
                seen.append(lines.get_nowait())
            return seen

        eventually(tick, lambda got: sum(line.startswith("tick ") for line in got) >= 3,
                   timeout=30, interval=0.3,
                   expected="three lines written after kubectl began to follow streamed to it")
        ticks = [int(line.split()[1]) for line in seen if line.startswith("tick ")]
        assert ticks == sorted(ticks) and len(set(ticks)) == len(ticks), seen
        assert follow.poll() is None, follow.stderr.read()
    finally:
        follow.kill()
        follow.wait()


def test_more_log_streams_than_the_bound_get_429(remote_view, namespace):
    env = remote_view
    pod = trainer_pod(running_job(env, namespace, "busy"), "busy")
    env.user("carol", namespace)
    path = (f"/apis/{GROUP_VERSION}/namespaces/{namespace}/trainjobpods/"
            f"{pod['metadata']['name']}/log?follow=true&tailLines=1")
    write_log(env, "a line to begin each stream with")
    headers = {"X-Remote-User": "carol"}
    context = env.front_proxy_context()
    held = []
    try:
        for _ in range(MAX_STREAMS):
            answer = env.direct(path, context, headers)
            assert answer.status == 200, answer.read()
            held.append(answer)
        refused = env.direct(path, context, headers)
        body = json.loads(refused.read())
        assert refused.status == 429 and body["reason"] == "TooManyRequests", body
        assert f"{MAX_STREAMS} logs are being relayed already" in body["message"] and \
            "--remote-api-max-streams" in body["message"], body
    finally:
        for answer in held:
            answer.close()
    # A caller that goes away frees its stream at once, not after the idle timeout.
    def accepted() -> int:
        answer = env.direct(path, context, headers)
        answer.close()
        return answer.status

    eventually(accepted, lambda code: code == 200, timeout=15,
               expected="a log stream accepted again once the held ones closed")


def plugin(env: RemoteViewEnv, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess:
    """``kubectl trainjob ...`` as kubectl runs a plugin: an executable kubectl-trainjob on
    the PATH (here one that runs this tree's dispatcher.kubectl_plugin)."""
    bin_dir = env.directory / "bin"
    executable = bin_dir / "kubectl-trainjob"
    if not executable.exists():
        bin_dir.mkdir(exist_ok=True)
        executable.write_text(f"#!/bin/sh\nexec {sys.executable} -m dispatcher.kubectl_plugin "
                              '"$@"\n')
        executable.chmod(0o755)
    kubectl_path = find_binaries(build=False, names=("kubectl",)).kubectl
    return subprocess.run([str(kubectl_path), "trainjob", *args, "--kubeconfig", str(kubeconfig)],
                          capture_output=True, text=True, timeout=KUBECTL_TIMEOUT,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                               "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def test_the_kubectl_plugin_shows_pods_logs_and_the_description(remote_view, namespace):
    env = remote_view
    pod = trainer_pod(running_job(env, namespace, "plugged"), "plugged")
    alice = env.user("alice", namespace)
    # describe reads the manager's TrainJob too, which view does not cover (no role of the
    # project's or of Trainer's CRDs aggregates into it): a Role of the test's own.
    rbac = client.RbacAuthorizationV1Api(env.manager.api)
    rbac.create_namespaced_role(namespace, client.V1Role(
        metadata=client.V1ObjectMeta(name="trainjob-reader"), rules=[client.V1PolicyRule(
            api_groups=[c.TRAINER_GROUP], resources=[c.TRAINJOBS], verbs=["get"])]))
    rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="alice-trainjob-reader"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role",
                                  name="trainjob-reader"),
        subjects=[client.RbacV1Subject(kind="User", name="alice",
                                       api_group="rbac.authorization.k8s.io")]))
    out = plugin(env, alice, "pods", "plugged", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0].split()[:3] == ["NAME", "WORKER", "NODE"], out.stdout
    assert any(line.split()[:3] == [pod["metadata"]["name"], WORKER, LOG_NODE]
               for line in out.stdout.splitlines()), out.stdout
    write_log(env, "the plugin's line")
    out = plugin(env, alice, "logs", "plugged", "-n", namespace, "--tail", "1")
    assert (out.returncode, out.stdout) == (0, "the plugin's line\n"), out
    out = plugin(env, alice, "describe", "plugged", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert f"Worker:     {WORKER}" in out.stdout and "Placed" in out.stdout, out.stdout
    assert pod["metadata"]["name"] in out.stdout, out.stdout
    events = out.stdout.split("Events:\n")[1].splitlines()
    assert any(line.split()[0] == "manager" for line in events[1:]) and any(
        line.split()[0] == WORKER for line in events[1:]), out.stdout
    # Another namespace's user is told what RBAC it lacks.
    out = plugin(env, env.user("dave", None), "pods", "plugged", "-n", namespace)
    assert out.returncode == 1 and "lacks the RBAC" in out.stderr and \
        'User "dave" cannot list resource "trainjobpods"' in out.stderr, out.stderr
    out = plugin(env, alice, "logs", "plugged", "-n", namespace, "--pod", "nope")
    assert out.returncode == 1 and "has no Pod nope" in out.stderr, out.stderr


def _failing_runtime(env: RemoteViewEnv) -> None:
    """Pods on the test's Node (kwok serves their logs) that fail a second after they
    start, their Jobs not retried: the job Fails within seconds."""
    runtime = fixtures.torch_runtime(
        FAILING_RUNTIME, cpu="100m", memory="64Mi", node_selector={NODE_LABEL: "logs"},
        pod_annotations={worker_stack.OUTCOME_ANNOTATION: worker_stack.OUTCOME_FAIL,
                         worker_stack.RUN_FOR_ANNOTATION: "1s"})
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        job["template"]["spec"]["backoffLimit"] = 0
    try:
        fixtures.install_runtime(env.multicluster[WORKER].api, runtime)
    except ApiException as err:
        if err.status != 409:  # installed by an earlier run of this test in the module
            raise


def _failed(env: RemoteViewEnv, namespace: str, name: str) -> tuple[dict, float]:
    """The copy of a failed job on the worker, and when the job failed (the manager's
    Failed condition, copied from the copy's)."""
    job = eventually(lambda: get(env.manager, namespace, name),
                     lambda obj: (condition(obj, c.CONDITION_FAILED) or {}).get("status")
                     == "True", timeout=90, expected=f"manager TrainJob {name} Failed")
    copy = get(env.multicluster[WORKER], namespace, name)
    assert copy is not None, f"the failed copy of {name} is gone at once: not retained"
    return copy, parse_time(condition(job, c.CONDITION_FAILED)["lastTransitionTime"])


def test_a_failed_jobs_pods_and_log_stay_readable_for_the_retention(
        remote_view, dispatch_env, namespace):
    """A failed job's copy stays on its worker for the failed retention: its Pods and logs
    are read from the manager after it failed; deleting the manager TrainJob still deletes
    its copy at once; a dispatcher restarted meanwhile deletes the other copy when its time
    comes (never before: the time is the copy's Failed condition's), the manager job stays
    Failed and placed where it ran, never placed again, and the remote view then says
    where it ran, that its Pods went after FAILED_RETENTION s, and which flag keeps them."""
    env = remote_view
    worker = env.multicluster[WORKER]
    _failing_runtime(env)
    write_log(env, "why it failed")
    for name in ("kept", "dropped"):
        create(env.manager, namespace, trainjob(name, runtime=FAILING_RUNTIME))
    kept, kept_failed_at = _failed(env, namespace, "kept")
    _, dropped_failed_at = _failed(env, namespace, "dropped")
    assert placement(get(env.manager, namespace, "kept")) == WORKER

    # Deleting the manager job during the retention: its copy goes at once, not when the
    # retention ends.
    env.manager.custom.delete_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS,
                                                       "dropped")
    eventually(lambda: (get(env.manager, namespace, "dropped"),
                        get(worker, namespace, "dropped")),
               lambda seen: seen == (None, None), timeout=30,
               expected="the deleted manager TrainJob and its retained copy both gone")
    assert time.time() < dropped_failed_at + FAILED_RETENTION, (
        "the copy of a deleted manager TrainJob outlived its retention: deleted at once "
        "was expected")

    # The failed job's Pods and log, through the aggregator, as a namespace viewer.
    alice = env.user("alice", namespace)
    out = kubectl(alice, "get", "trainjobpods", "-n", namespace, "-l",
                  f"{TRAINJOB_LABEL}=kept", "-o", "json")
    assert out.returncode == 0, out.stderr
    pods = json.loads(out.stdout)["items"]
    assert pods and any(p["status"]["phase"] == "Failed" for p in pods), pods
    failed_pod = next(p for p in pods if p["status"]["phase"] == "Failed")
    out = kubectl(alice, "get", "--raw", f"/apis/{GROUP_VERSION}/namespaces/{namespace}/"
                  f"trainjobpods/{failed_pod['metadata']['name']}/log?tailLines=1")
    assert (out.returncode, out.stdout) == (0, "why it failed\n"), out
    out = plugin(env, alice, "logs", "kept", "-n", namespace, "--pod",
                 failed_pod["metadata"]["name"], "--tail", "1")
    assert (out.returncode, out.stdout) == (0, "why it failed\n"), out

    # A restart during the retention: the copy is still deleted when its time comes.
    # Until then it is the same copy: a finished job is never placed again.
    copy = get(worker, namespace, "kept")
    assert copy is not None and copy["metadata"]["uid"] == kept["metadata"]["uid"], copy
    dispatch_env.restart_dispatcher(kill=True)
    eventually(lambda: get(worker, namespace, "kept"), lambda copy: copy is None,
               timeout=FAILED_RETENTION + 60, interval=0.5,
               expected=f"the failed copy of kept deleted {FAILED_RETENTION} s after it failed")
    assert time.time() >= kept_failed_at + FAILED_RETENTION - 1, (
        f"the copy was deleted {kept_failed_at + FAILED_RETENTION - time.time():.1f} s "
        "before its retention ended")
    job = get(env.manager, namespace, "kept")
    assert (condition(job, c.CONDITION_FAILED) or {}).get("status") == "True", job
    assert placement(job) == WORKER, job
    eventually(lambda: get(env.manager, namespace, "kept"),
               lambda obj: c.DISPATCH_FINALIZER not in (obj["metadata"].get("finalizers") or []),
               timeout=30, expected="the finalizer released once the copy is gone")
    holds_for(lambda: (get(worker, namespace, "kept"), get(env.manager, namespace, "kept")),
              lambda seen: seen[0] is None and (condition(seen[1], c.CONDITION_FAILED) or {}
                                                ).get("status") == "True",
              seconds=3, expected="no new copy of the finished job, and it stays Failed")

    # Now the remote view says where it ran, why its Pods are gone and what keeps them.
    said = (f"TrainJob {namespace}/kept: Failed at ", f"its copy on worker {WORKER}, with "
            f"its Pods, their Events and logs, was deleted {FAILED_RETENTION}s after it "
            "finished", "--failed-retention")
    out = eventually(lambda: kubectl(alice, "get", "trainjobpods", "-n", namespace, "-l",
                                     f"{TRAINJOB_LABEL}=kept"),
                     lambda out: out.returncode != 0 and all(s in out.stderr for s in said),
                     timeout=30, expected=f"a NotFound saying {said}")
    assert "NotFound" in out.stderr, out.stderr
    out = plugin(env, alice, "logs", "kept", "-n", namespace)
    assert out.returncode == 1 and all(s in out.stderr for s in said), out.stderr


def test_an_unavailable_remote_view_is_said_so(remote_view, namespace):
    """The aggregator answers 503 while the dispatcher cannot be reached (here: its Service
    gone); the plugin says so and how to check. Last in the module: meanwhile the manager
    cannot delete namespaces (docs/remote-view.md)."""
    env = remote_view
    manager = env.manager
    service = manager.core.read_namespaced_service(SERVICE, DISPATCHER_NAMESPACE)
    manager.core.delete_namespaced_service(SERVICE, DISPATCHER_NAMESPACE)
    try:
        eventually(lambda: plugin(env, manager.kubeconfig, "pods", "any", "-n", namespace),
                   lambda out: out.returncode == 1 and "aggregated API is unavailable" in
                   out.stderr, timeout=30,
                   expected="kubectl trainjob pods refused as unavailable once the "
                            "dispatcher's Service is gone")
        out = plugin(env, manager.kubeconfig, "pods", "any", "-n", namespace)
        assert f"kubectl get apiservice {APISERVICE}" in out.stderr, out.stderr
    finally:
        manager.core.create_namespaced_service(DISPATCHER_NAMESPACE, client.V1Service(
            metadata=client.V1ObjectMeta(name=SERVICE), spec=client.V1ServiceSpec(
                type="ExternalName", external_name=service.spec.external_name,
                ports=service.spec.ports)))
        eventually(lambda: manager.custom.get_cluster_custom_object(
                       "apiregistration.k8s.io", "v1", "apiservices", APISERVICE),
                   lambda obj: any(cond["type"] == "Available" and cond["status"] == "True"
                                   for cond in (obj.get("status") or {}).get("conditions") or []),
                   timeout=60, expected=f"APIService {APISERVICE} Available again")
