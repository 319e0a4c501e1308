"""``--suite log-streams``: what users following their jobs' logs through the remote view
(docs/remote-view.md) cost dispatching.

On one set of clusters, the dispatcher serving the remote view (``--remote-api-port``)
behind the manager apiserver's aggregation layer, the steady scenario runs at one arrival
rate (50 jobs/s) ``repeats`` times plain and as often with ``log_streams`` (50) log
streams following (``follow=true``), alternately (plain first in even repeats, streams
first in odd ones, so that a drift of the shared machine weighs on both alike), each after
the machine settled with no stream open. The streams are what users do: a user bound to
the namespace's ``view`` ClusterRole (a client certificate of the manager's CA) reads
``/apis/remote.trainjob-dispatcher.io/v1alpha1/namespaces/NS/trainjobpods/POD/log?
follow=true`` from the manager's apiserver, which proxies it to the dispatcher, which
relays the worker's ``pods/log``. Each stream follows the Pod of a job of its own, placed by
the dispatcher; the Pod runs on a kwok Node of its worker whose address and kubelet port
are kwok's, so the worker's apiserver reads the log from kwok for real, and kwok serves
one file per worker as every container's log, to which a line is added
``log_lines_per_second`` times a second (each stream receives every line).

The streams are opened by a process of their own (``bench.log_followers``): reading them
must not take the benchmark's interpreter, whose watches time each dispatch.

Figures: dispatch latency p50/p90/p99 plain and with the streams (over every repeat's
samples, with each repeat's spread) and their ratios; the dispatcher's CPU per job both
ways, and its CPU with the streams open and no job arriving (what relaying costs by
itself); the streams' bytes and lines received while jobs arrived, and streams refused
(429 beyond ``--remote-api-max-streams``) or ended early.
"""

from __future__ import annotations

import json
import logging
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from bench import repeats as repeats_
from bench import scenarios
from bench.environment import DISPATCHER_NAMESPACE, BenchClusters, describe
from bench.footprint import FootprintWindow, cpu_seconds
from bench.load import LoadRunner, creates
from bench.settings import BenchSettings
from bench.timeline import Timelines
from clusters import kustomize, worker_stack
from clusters.controlplane import free_port
from clusters.nodes import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE
from clusters.testing import eventually
from dispatcher.remote_view import APISERVICE, GROUP, GROUP_VERSION, LOG, PODS, SERVICE
from dispatcher.remote_view.flags import MAX_STREAMS
from trainjob import constants as c

log = logging.getLogger(__name__)

LOG_NAMESPACE = "bench-log-streams"
USER = "bench-log-reader"
# The jobs whose Pods' logs are followed, one per stream.
LOG_JOB_PREFIX = "logs"
# A window with the streams open and no job arriving: the relay's own cost.
STREAMS_ONLY_SECONDS = 5.0
OPEN_TIMEOUT = 120.0


def _log_node(worker: str) -> str:
    return f"{worker}-logs"


def _log_node_body(name: str, kwok_port: int) -> dict:
    """A kwok Node whose kubelet the worker's apiserver reaches at kwok's own server: its
    Pods' logs are then served by kwok (from the worker's ``kwok_logs_file``). Room for
    the followed Pods only."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"type": "kwok"},
                         "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE}},
            "status": {"capacity": {"cpu": "100", "memory": "100Gi", "pods": "1000"},
                       "allocatable": {"cpu": "100", "memory": "100Gi", "pods": "1000"},
                       "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                     {"type": "Hostname", "address": "127.0.0.1"}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": kwok_port}}}}


def _pod_body(job: str, node: str) -> dict:
    """The followed Pod of ``job``'s copy, as its operator would make it: labelled with the
    job's JobSet name (how the remote view finds a copy's Pods), Running until deleted."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job}-node-0-0-log",
                         "labels": {c.JOBSET_NAME_LABEL: job},
                         "annotations": {worker_stack.OUTCOME_ANNOTATION:
                                         worker_stack.OUTCOME_NEVER}},
            "spec": {"nodeName": node,
                     "containers": [{"name": "node", "image": "bench/trainer:latest"}]}}


class RemoteView:
    """The remote view served by the benchmark's dispatcher behind the manager's
    aggregation layer, as ``manifests/remote-api`` ships it, routed as the local harness
    routes it (an ExternalName Service naming this machine: an endpoint may not be a
    loopback address)."""

    def __init__(self, env: BenchClusters):
        self.env = env
        self.port = free_port()
        objects = kustomize.render("remote-api")
        self.roles = [o for o in objects if o["kind"] == "ClusterRole"
                      and "rbac.authorization.k8s.io/aggregate-to-view"
                      in (o["metadata"].get("labels") or {})]
        [self.apiservice] = [o for o in objects if o["kind"] == "APIService"]
        self.apiservice["spec"]["service"] = {"namespace": DISPATCHER_NAMESPACE,
                                              "name": SERVICE, "port": self.port}
        self.service = {"apiVersion": "v1", "kind": "Service",
                        "metadata": {"name": SERVICE, "namespace": DISPATCHER_NAMESPACE},
                        "spec": {"type": "ExternalName", "externalName": "localhost",
                                 "ports": [{"name": "remote-api", "port": self.port}]}}

    @property
    def dispatcher_args(self) -> tuple[str, ...]:
        return ("--remote-api-port", str(self.port), "--remote-api-host", "127.0.0.1")

    def prepare(self) -> None:
        """The users' ClusterRole (aggregated into view) and the Service, before the
        dispatcher starts."""
        kustomize.apply(self.env.kubeconfig("manager"), [*self.roles, self.service])

    def register(self, timeout: float = 120) -> float:
        """The APIService, once the dispatcher serves: waits until it is Available (its
        caBundle injected by the dispatcher, its discovery answered); the seconds that
        took."""
        started = time.monotonic()
        kustomize.apply(self.env.kubeconfig("manager"), [self.apiservice])
        custom = client.CustomObjectsApi(self.env.apis["manager"])
        eventually(lambda: custom.get_cluster_custom_object(
                       "apiregistration.k8s.io", "v1", "apiservices", APISERVICE),
                   lambda obj: any(cond["type"] == "Available" and cond["status"] == "True"
                                   for cond in (obj.get("status") or {}).get("conditions")
                                   or []),
                   timeout=timeout, interval=0.5,
                   expected=f"APIService {APISERVICE} Available (its caBundle injected by "
                            "the dispatcher, its discovery answered)")
        return time.monotonic() - started

    def remove(self) -> None:
        """The APIService first: one left unavailable blocks namespace deletion on the
        manager (reused clusters delete the run's namespaces)."""
        manager = self.env.apis["manager"]
        for delete in (
                lambda: client.CustomObjectsApi(manager).delete_cluster_custom_object(
                    "apiregistration.k8s.io", "v1", "apiservices", APISERVICE),
                lambda: client.CoreV1Api(manager).delete_namespaced_service(
                    SERVICE, DISPATCHER_NAMESPACE),
                *[lambda name=role["metadata"]["name"]:
                  client.RbacAuthorizationV1Api(manager).delete_cluster_role(name)
                  for role in self.roles]):
            try:
                delete()
            except ApiException as err:
                if err.status != 404:
                    raise


def _viewer(env: BenchClusters, directory: Path) -> Path:
    """A kubeconfig of manager user ``USER`` (a client certificate of the manager's CA),
    bound to ``view`` in the log namespace; once RBAC lets it read the logs."""
    path = env.harness.issue_user_kubeconfig("manager", USER, (), directory / f"{USER}.kubeconfig")
    client.RbacAuthorizationV1Api(env.apis["manager"]).create_namespaced_role_binding(
        LOG_NAMESPACE, client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=f"{USER}-view"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io",
                                      kind="ClusterRole", name="view"),
            subjects=[client.RbacV1Subject(kind="User", name=USER,
                                           api_group="rbac.authorization.k8s.io")]))
    reviews = client.AuthorizationV1Api(env.apis["manager"])

    def allowed() -> bool:
        return reviews.create_subject_access_review(client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=USER, resource_attributes=client.V1ResourceAttributes(
                    namespace=LOG_NAMESPACE, verb="get", group=GROUP, resource=PODS,
                    subresource=LOG)))).status.allowed

    eventually(allowed, bool, timeout=60, interval=0.5,
               expected=f"user {USER} allowed to get {PODS}/{LOG} in {LOG_NAMESPACE} (the "
                        "remote view's ClusterRole aggregated into view)")
    return path


def followed_pods(ctx: scenarios.BenchContext, workers: list[str], count: int) -> list[str]:
    """``count`` jobs placed by the dispatcher, each with one Pod Running on the log Node
    of its worker: the Pods' names."""
    env = ctx.env
    names = [f"{LOG_JOB_PREFIX}-{i:03d}" for i in range(count)]
    ctx.runner.run(creates(ctx.kubeconfig("manager"), LOG_NAMESPACE, names))
    keys = {(LOG_NAMESPACE, name) for name in names}
    missing = ctx.timelines.wait_remotes(keys, 60 + count)
    if missing:
        raise RuntimeError(f"{len(missing)} of the {count} followed jobs got no copy within "
                           f"{60 + count} s (e.g. {sorted(missing)[:3]})")
    pods: dict[str, list[str]] = {}
    for name in names:
        worker, _ = ctx.timelines.remote((LOG_NAMESPACE, name))
        body = _pod_body(name, _log_node(worker))
        client.CoreV1Api(env.apis[worker]).create_namespaced_pod(LOG_NAMESPACE, body)
        pods.setdefault(worker, []).append(body["metadata"]["name"])
    for worker, expected in pods.items():
        core = client.CoreV1Api(env.apis[worker])
        eventually(lambda core=core: {p.metadata.name for p in core.list_namespaced_pod(
                       LOG_NAMESPACE).items if p.status.phase == "Running"},
                   lambda running, want=set(expected): want <= running, timeout=120,
                   interval=0.5, expected=f"the {len(expected)} followed Pods Running on "
                                          f"{_log_node(worker)}")
    return [pod for names_ in pods.values() for pod in names_]


class Followers:
    """``bench.log_followers`` running: the streams open, the lines written."""

    def __init__(self, kubeconfig: Path, pods: list[str], log_files: list[Path],
                 lines_per_second: float, log_file: Path):
        base = f"/apis/{GROUP_VERSION}/namespaces/{LOG_NAMESPACE}/{PODS}"
        self.spec = {"kubeconfig": str(kubeconfig), "lines_per_second": lines_per_second,
                     "log_files": [str(f) for f in log_files],
                     "paths": [f"{base}/{pod}/{LOG}?follow=true&tailLines=1" for pod in pods]}
        self.statuses: dict[int, int] = {}
        self._ready = threading.Event()
        self._answers: queue.Queue = queue.Queue()
        self._stderr = log_file.open("a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.log_followers"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            cwd=Path(__file__).resolve().parent.parent)
        self.process.stdin.write(json.dumps(self.spec) + "\n")
        self.process.stdin.flush()
        threading.Thread(target=self._read, daemon=True, name="log-followers").start()

    def _read(self) -> None:
        for line in self.process.stdout:
            message = json.loads(line)
            if "ready" in message:
                self._ready.set()
            elif "stream" in message:
                self.statuses[message["stream"]] = message["status"]
            else:
                self._answers.put(message)
        self._answers.put(None)  # the process ended

    def wait_ready(self, timeout: float = OPEN_TIMEOUT) -> float:
        """Until every stream was refused or received its first line; the seconds that
        took."""
        started = time.monotonic()
        if not self._ready.wait(timeout):
            raise RuntimeError(
                f"of {len(self.spec['paths'])} log streams, {len(self.statuses)} were "
                f"answered within {timeout:.0f} s (statuses {self.statuses}); expected "
                "each to be refused or to receive its first line")
        return time.monotonic() - started

    def _ask(self, command: str, timeout: float = 30) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        try:
            answer = self._answers.get(timeout=timeout)
        except queue.Empty:
            answer = None
        if answer is None:
            raise RuntimeError(f"the log followers did not answer {command!r} (exit code "
                               f"{self.process.poll()})")
        return answer

    def state(self) -> dict:
        return self._ask("state")

    def cpu(self) -> float:
        return cpu_seconds(self.process.pid)

    def stop(self) -> dict | None:
        """Every stream cut; the last figures (None if the process had ended)."""
        try:
            final = self._ask("stop", timeout=60) if self.process.poll() is None else None
        except (RuntimeError, BrokenPipeError):
            final = None
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._stderr.close()
        return final


def _received(before: dict, after: dict, seconds: float) -> dict:
    """What the streams received between two states."""
    pairs = list(zip(before["streams"], after["streams"], strict=True))
    lines = [b["lines"] - a["lines"] for a, b in pairs]
    flowing = [n for (a, b), n in zip(pairs, lines, strict=True) if b["status"] == 200]
    return {
        "seconds": round(seconds, 2),
        "bytes": sum(b["bytes"] - a["bytes"] for a, b in pairs),
        "lines": sum(lines),
        "lines_written_per_log": after["lines_written"] - before["lines_written"],
        "lines_per_stream": ({"min": min(flowing), "median": statistics.median(flowing),
                              "max": max(flowing)} if flowing else None),
        "streams_receiving": sum(1 for n in flowing if n > 0),
    }


def _stream_outcomes(states: list[dict]) -> dict:
    """Over a run's streams: how many opened, were refused (by status), ended early."""
    refused: dict[str, int] = {}
    ended, messages = [], set()
    for stream in states:
        if stream["status"] != 200:
            refused[str(stream["status"])] = refused.get(str(stream["status"]), 0) + 1
            if stream.get("message"):
                messages.add(stream["message"])
        elif stream["ended"] not in (None, "stopped"):
            ended.append(stream["ended"])
    return {"opened": sum(1 for s in states if s["status"] == 200),
            "refused": refused, "refused_429": refused.get("429", 0),
            "refusal_messages": sorted(messages)[:5],
            "ended_early": len(ended), "ended_early_why": sorted(set(ended))[:5]}


def _run_figures(figures: dict, settle: dict) -> dict:
    """One steady run's figures as this suite keeps them."""
    (run,) = figures["runs"]
    cpu = run["cpu"]["cpu_seconds"].get("dispatcher")
    return {"namespace": run["namespace"], "jobs": figures["jobs"],
            "dispatched": figures["dispatched"], "missing": figures["missing"],
            "achieved_arrival_rate": figures["achieved_arrival_rate"],
            "latency": run["latency"], "samples": [x / 1000 for x in
                                                   figures["latency_samples_ms"]],
            "dispatcher_cpu_seconds": cpu,
            "dispatcher_cpu_ms_per_job": round(1000 * cpu / figures["dispatched"], 2)
            if cpu is not None and figures["dispatched"] else None,
            "dispatcher": figures["dispatcher"], "cpu": run["cpu"], "settle": settle,
            "slowest": figures.get("slowest"),
            # The dispatcher's own timing of each dispatch's steps, from its histograms:
            # "queue" is how long a job waited for a reconcile worker.
            "steps": (figures.get("steps") or {}).get("Place") or {}}


def _pooled_steps(runs: list[dict]) -> dict:
    """Each dispatch step's mean wall and CPU ms over the runs (weighted by count)."""
    pooled: dict[str, dict] = {}
    for run in runs:
        for step, figures in run["steps"].items():
            into = pooled.setdefault(step, {"count": 0, "wall": 0.0, "cpu": 0.0, "cpu_n": 0})
            count = figures.get("count", 0)
            into["count"] += count
            into["wall"] += figures.get("wall_mean_ms", 0.0) * count
            if "cpu_mean_ms" in figures:
                into["cpu"] += figures["cpu_mean_ms"] * count
                into["cpu_n"] += count
    return {step: {"count": f["count"],
                   "wall_mean_ms": round(f["wall"] / f["count"], 3) if f["count"] else None,
                   "cpu_mean_ms": round(f["cpu"] / f["cpu_n"], 3) if f["cpu_n"] else None}
            for step, f in pooled.items()}


def _pooled(runs: list[dict]) -> dict:
    dispatched = sum(r["dispatched"] for r in runs)
    cpu = sum(r["dispatcher_cpu_seconds"] or 0.0 for r in runs)
    return {"jobs": sum(r["jobs"] for r in runs), "dispatched": dispatched,
            "missing": sum(r["missing"] for r in runs),
            "latency": repeats_.percentiles(runs, "samples"),
            "dispatcher_cpu_seconds": round(cpu, 2),
            "dispatcher_cpu_ms_per_job": round(1000 * cpu / dispatched, 2)
            if dispatched else None,
            "steps": _pooled_steps(runs),
            "runs": [{k: v for k, v in r.items() if k != "samples"} for r in runs]}


def _ratio(a, b) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def measure(ctx: scenarios.BenchContext, workers: list[str], pods: list[str],
            viewer: Path) -> dict:
    """The steady runs, plain and with the streams, alternately (``_run_*``)."""
    settings = ctx.settings
    rate = settings.log_streams_rate
    seconds = max(settings.rate_seconds, settings.step_samples / rate)
    log_files = [ctx.env.control_plane(w).kwok_logs_file for w in workers]
    dispatcher = ctx.env.dispatcher
    plain, streamed = [], []

    def run_plain(index: int) -> None:
        settle = repeats_.settle(dispatcher)
        figures = scenarios.steady(ctx, rate, workers, seconds=seconds,
                                   namespace=f"bench-logs-plain-{index + 1}", repeats=1,
                                   settle=False)
        plain.append(_run_figures(figures, settle))
        log.info("log streams: plain run %d: p99 %s ms", index + 1,
                 plain[-1]["latency"]["p99_ms"])

    def run_streamed(index: int) -> None:
        settle = repeats_.settle(dispatcher)
        followers = Followers(viewer, pods, log_files, settings.log_lines_per_second,
                              ctx.output / "logs" / "log-followers.log")
        try:
            open_seconds = followers.wait_ready()
            # The relay alone: the streams open, no job arriving.
            quiet_before = followers.state()
            readers_cpu = followers.cpu()
            with FootprintWindow(dispatcher.proc.pid) as window:
                threading.Event().wait(STREAMS_ONLY_SECONDS)  # a measurement window
            quiet_after = followers.state()
            before = followers.state()
            readers_cpu_before = followers.cpu()
            figures = scenarios.steady(ctx, rate, workers, seconds=seconds,
                                       namespace=f"bench-logs-streams-{index + 1}",
                                       repeats=1, settle=False)
            after = followers.state()
            readers_cpu_after = followers.cpu()
        finally:
            final = followers.stop()
        run = _run_figures(figures, settle)
        run["streams"] = {
            **_stream_outcomes((final or after)["streams"]),
            "open_seconds": round(open_seconds, 2),
            "while_jobs_arrived": _received(before, after, after["at"] - before["at"]),
            "alone": {**_received(quiet_before, quiet_after,
                                  quiet_after["at"] - quiet_before["at"]),
                      "dispatcher": window.figures()},
            "readers_cpu_seconds": round(readers_cpu_after - readers_cpu_before, 2),
            "readers_cpu_seconds_alone": round(readers_cpu_before - readers_cpu, 2),
        }
        # Less what relaying alone cost for as long (its share with no job arriving):
        # what the dispatches themselves cost with the streams open.
        relay = window.figures()["cpu_share"] or 0.0
        spent = figures["dispatcher"]
        run["dispatcher_cpu_ms_per_job_less_relay"] = round(
            1000 * max(0.0, spent["cpu_seconds"] - relay * spent["wall_seconds"])
            / figures["dispatched"], 2) if figures["dispatched"] else None
        streamed.append(run)
        log.info("log streams: run %d with %d streams: p99 %s ms, %d lines received",
                 index + 1, run["streams"]["opened"], run["latency"]["p99_ms"],
                 run["streams"]["while_jobs_arrived"]["lines"])

    for index in range(settings.repeats):
        order = (run_plain, run_streamed) if index % 2 == 0 else (run_streamed, run_plain)
        for step in order:
            step(index)

    without, with_ = _pooled(plain), _pooled(streamed)
    less_relay = [r["dispatcher_cpu_ms_per_job_less_relay"] for r in streamed
                  if r.get("dispatcher_cpu_ms_per_job_less_relay") is not None]
    with_["dispatcher_cpu_ms_per_job_less_relay"] = (
        round(statistics.median(less_relay), 2) if less_relay else None)
    streams = [r["streams"] for r in streamed]
    arrived = [s["while_jobs_arrived"] for s in streams]
    alone = [s["alone"] for s in streams]
    with_["streams"] = {
        "requested": len(pods),
        "opened": min(s["opened"] for s in streams),
        "refused_429": sum(s["refused_429"] for s in streams),
        "refused": {code: sum(s["refused"].get(code, 0) for s in streams)
                    for code in sorted({k for s in streams for k in s["refused"]})},
        "ended_early": sum(s["ended_early"] for s in streams),
        "bytes": sum(a["bytes"] for a in arrived),
        "lines": sum(a["lines"] for a in arrived),
        "seconds": round(sum(a["seconds"] for a in arrived), 2),
        "lines_per_second": round(sum(a["lines"] for a in arrived)
                                  / sum(a["seconds"] for a in arrived), 1)
        if sum(a["seconds"] for a in arrived) else None,
        "bytes_per_second": round(sum(a["bytes"] for a in arrived)
                                  / sum(a["seconds"] for a in arrived))
        if sum(a["seconds"] for a in arrived) else None,
        "alone_dispatcher_cpu_share": round(statistics.median(
            a["dispatcher"]["cpu_share"] for a in alone), 3),
        "alone_lines_per_second": round(sum(a["lines"] for a in alone)
                                        / sum(a["seconds"] for a in alone), 1),
        "readers_cpu_seconds": round(sum(s["readers_cpu_seconds"] for s in streams), 2),
    }
    return {
        "rate": rate, "seconds": seconds, "repeats": settings.repeats,
        "workers": len(workers), "streams": len(pods),
        "lines_per_second_per_log": settings.log_lines_per_second,
        "plain": without, "with_streams": with_,
        "ratio": {
            "p50": _ratio(with_["latency"]["p50_ms"], without["latency"]["p50_ms"]),
            "p99": _ratio(with_["latency"]["p99_ms"], without["latency"]["p99_ms"]),
            "cpu_per_job": _ratio(with_["dispatcher_cpu_ms_per_job"],
                                  without["dispatcher_cpu_ms_per_job"]),
        },
    }


def _max_streams(settings: BenchSettings) -> int:
    """The dispatcher's bound on relayed logs: --remote-api-max-streams among the extra
    flags (the last one given), else its default."""
    args = list(settings.dispatcher_args)
    found = MAX_STREAMS
    for i, arg in enumerate(args):
        if arg == "--remote-api-max-streams" and i + 1 < len(args):
            found = int(args[i + 1])
        elif arg.startswith("--remote-api-max-streams="):
            found = int(arg.split("=", 1)[1])
    return found


def run_log_streams(settings: BenchSettings, output: Path, state_dir: Path | None,
                    results: dict) -> None:
    """The log-streams suite into ``results`` (filled as figures come)."""
    log_dir = output / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    reuse = state_dir is not None
    state = state_dir or Path(tempfile.mkdtemp(prefix="bench-log-streams-"))
    env = BenchClusters(state, settings.burst_workers, log_dir, reuse=reuse,
                        dispatcher_args=settings.dispatcher_args)
    timelines: Timelines | None = None
    runner: LoadRunner | None = None
    view: RemoteView | None = None
    results.update({"suite": "log-streams",
                    "note": "no training operator runs: a job is dispatched when its copy "
                            "exists on a worker; only the followed jobs get a Pod (made by "
                            "the benchmark, as an operator would)"})
    try:
        started = time.monotonic()
        env.up()
        workers = env.worker_names[:settings.burst_workers]
        results["environment"].update({**describe(env, settings),
                                       "harness_up_seconds": round(time.monotonic() - started,
                                                                   1)})
        for worker in workers:
            client.CoreV1Api(env.apis[worker]).create_node(
                _log_node_body(_log_node(worker), env.control_plane(worker).port("kwok")))
        view = RemoteView(env)
        view.prepare()
        env.start_dispatcher(workers, settings.placement_policy, view.dispatcher_args)
        available = view.register()
        timelines = Timelines({name: env.kubeconfig(name) for name in env.names}).start()
        runner = LoadRunner(settings.concurrency)
        ctx = scenarios.BenchContext(env, timelines, runner, settings, output)
        env.create_namespace(LOG_NAMESPACE, ["manager", *workers])
        pods = followed_pods(ctx, workers, settings.log_streams)
        viewer = _viewer(env, log_dir)
        results["remote_view"] = {"apiservice_available_seconds": round(available, 1),
                                  "max_streams": _max_streams(settings),
                                  "dispatcher_flags": list(view.dispatcher_args)}
        started = time.monotonic()
        results["log_streams"] = measure(ctx, workers, pods, viewer)
        results["scenario_seconds"]["log-streams"] = round(time.monotonic() - started, 1)
    finally:
        if runner is not None:
            runner.close()
        if timelines is not None:
            timelines.stop()
        try:
            if view is not None and env.apis:
                view.remove()
            if env.apis:
                for worker in env.worker_names[:settings.burst_workers]:
                    try:
                        client.CoreV1Api(env.apis[worker]).delete_node(_log_node(worker))
                    except ApiException as err:
                        if err.status != 404:
                            raise
        finally:
            env.close()


# --- the report ------------------------------------------------------------------------

def _ms(value) -> str:
    return "-" if value is None else f"{value:,.1f}"


def render(results: dict) -> str:
    """table.md of the suite."""
    figures = results.get("log_streams")
    if not figures:
        return "## Log streams\n\nNo figures: " + results.get("incomplete", "not run")
    plain, streamed = figures["plain"], figures["with_streams"]
    streams = streamed["streams"]
    lines = [
        f"## Dispatch at {figures['rate']} jobs/s with {figures['streams']} log streams "
        f"following, against without",
        "",
        f"{figures['workers']} workers; {figures['repeats']} runs each way of "
        f"{figures['seconds']:g} s, alternately, each after the machine settled; the "
        f"streams through the manager's aggregation layer to the dispatcher "
        f"(--remote-api-max-streams {results.get('remote_view', {}).get('max_streams')}), "
        f"{figures['lines_per_second_per_log']:g} lines a second written to each followed log.",
        "",
        "| | p50 ms | p90 ms | p99 ms | max ms | p99 over runs (min-max) | dispatched | "
        "missing | dispatcher CPU ms/job |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, part in (("plain", plain), (f"{figures['streams']} log streams following",
                                           streamed)):
        latency = part["latency"]
        spread = (latency.get("spread") or {}).get("p99_ms") or {}
        lines.append(
            f"| {label} | {_ms(latency['p50_ms'])} | {_ms(latency['p90_ms'])} | "
            f"{_ms(latency['p99_ms'])} | {_ms(latency['max_ms'])} | "
            f"{_ms(spread.get('min'))}-{_ms(spread.get('max'))} | {part['dispatched']} | "
            f"{part['missing']} | {_ms(part['dispatcher_cpu_ms_per_job'])} |")
    ratio = figures["ratio"]
    lines.append(f"| with / without | {ratio['p50']} | | {ratio['p99']} | | | | | "
                 f"{ratio['cpu_per_job']} |")
    steps = [step for step in plain.get("steps", {}) if step in streamed.get("steps", {})]
    if steps:
        lines += ["", "The dispatcher's own timing of a dispatch (mean ms, wall / CPU; "
                      "queue: waiting for a reconcile worker):", "",
                  "| | " + " | ".join(steps) + " |", "|---|" + "---|" * len(steps)]
        for label, part in (("plain", plain), ("log streams following", streamed)):
            lines.append(f"| {label} | " + " | ".join(
                f"{_ms(part['steps'][s]['wall_mean_ms'])} / "
                f"{_ms(part['steps'][s]['cpu_mean_ms'])}" for s in steps) + " |")
    lines += [
        "",
        "| Log streams | |",
        "|---|---|",
        f"| opened (each run) | {streams['opened']} of {streams['requested']} |",
        f"| refused 429 (all runs) | {streams['refused_429']} |",
        f"| refused otherwise | {streams['refused'] or 'none'} |",
        f"| ended early | {streams['ended_early']} |",
        f"| received while jobs arrived | {streams['lines']:,} lines, {streams['bytes']:,} "
        f"bytes in {streams['seconds']:g} s ({streams['lines_per_second']} lines/s, "
        f"{streams['bytes_per_second']} bytes/s) |",
        f"| dispatcher CPU with the streams open, no job arriving | "
        f"{streams['alone_dispatcher_cpu_share'] * 100:.1f}% of a core "
        f"({streams['alone_lines_per_second']} lines/s relayed) |",
        f"| the followers' own CPU (their process) | {streams['readers_cpu_seconds']} s |",
    ]
    net = streamed.get("dispatcher_cpu_ms_per_job_less_relay")
    if net is not None:
        lines.append("| dispatcher CPU ms/job with the streams, less relaying's share "
                     f"(median of runs) | {_ms(net)} |")
    return "\n".join(lines)
