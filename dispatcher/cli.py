"""``python -m dispatcher``: the manager-side MultiKueue TrainJob dispatcher."""

from __future__ import annotations

import argparse
import logging
import socket
import sys

from kubernetes.client.exceptions import ApiException

from controller_kit import command_line, listeners, logs
from controller_kit.kubeclient import (
    ClusterUnusable,
    KubeconfigError,
    api_client,
    describe_error,
    find_kubeconfig,
)
from controller_kit.service import RoutesListener, serve
from dispatcher.config import (
    DEFAULT_DASHBOARD_HOST,
    DEFAULT_DASHBOARD_PORT,
    PLAIN_METRICS_PORT,
    ConfigError,
    DispatcherConfig,
    is_loopback,
    load_config,
)
from dispatcher.remote_view import flags as remote_view_flags
from dispatcher.room.capacity import SCORING_STRATEGIES
from trainjob.constants import (
    DEFAULT_ORIGIN,
    DISPATCHER_USER_AGENT,
    KUEUE_DEFAULT_ORIGIN,
    KUEUE_NAMESPACE,
)

log = logging.getLogger("dispatcher")

DESCRIPTION = """\
Claim every TrainJob on the manager cluster whose spec.managedBy is
kueue.x-k8s.io/multikueue, place it on a worker cluster with room for it, create a copy
there (labelled kueue.x-k8s.io/multikueue-origin=<origin>, managedBy removed so the
worker's training operator runs it) and keep the manager's status in sync with the copy.
Workers come from MultiKueueCluster objects (grouped by a MultiKueueConfig) and from the
configuration file.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dispatcher", description=DESCRIPTION)
    command_line.add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run the dispatcher until interrupted",
                         description=DESCRIPTION)
    command_line.add_cluster_arguments(run, "manager")
    run.add_argument("--config", help="YAML configuration file (keys as in the "
                     "DispatcherConfig model; flags override it)")
    run.add_argument("--mode", choices=("standalone", "kueue"),
                     help="standalone (default): claim TrainJobs with managedBy "
                     "kueue.x-k8s.io/multikueue and mirror them to workers itself; kueue: run "
                     "as Kueue MultiKueue's external dispatcher, nominating a worker with room "
                     "for each Workload Kueue has reserved quota for (Kueue's "
                     "multiKueue.dispatcherName must be --dispatcher-name; Kueue does the "
                     "copying, status sync and garbage collection)")
    run.add_argument("--dispatcher-name", help="kueue mode: the name Kueue's "
                     "multiKueue.dispatcherName gives (default: "
                     "trainjob-dispatcher.io/capacity)")
    run.add_argument("--admission-timeout", type=command_line.seconds,
                     dest="admission_timeout_seconds",
                     help="kueue mode: seconds a nominated worker may take to admit the "
                     "Workload before the next worker is nominated (default: 300)")
    run.add_argument("--namespace", help="the dispatcher's own namespace: its Lease and the "
                     "worker kubeconfig Secrets, read by the names MultiKueueClusters give "
                     "(default: kueue-system; the shipped Deployment gives its own, "
                     "trainjob-system). In kueue mode it must not be --kueue-namespace: "
                     "Secrets of those names there are Kueue's, with Kueue's write access to "
                     "the workers; the dispatcher's own hold a read-only identity")
    run.add_argument("--kueue-namespace", help="Kueue's namespace: where its Configuration "
                     f"ConfigMap is read (default: {KUEUE_NAMESPACE})")
    run.add_argument("--multikueue-config", help="MultiKueueConfig naming the candidate "
                     "clusters, in tie-break order (default: every MultiKueueCluster)")
    run.add_argument("--origin", help="value of the kueue.x-k8s.io/multikueue-origin label "
                     "on remote copies; only objects with it are ever changed. Standalone, it "
                     "must differ from Kueue's where Kueue runs (default: "
                     f"{DEFAULT_ORIGIN}); in kueue mode it must be Kueue's multiKueue.origin "
                     f"(default: {KUEUE_DEFAULT_ORIGIN}, Kueue's default). The Lease is "
                     "trainjob-dispatcher-<origin>")
    run.add_argument("--kubeconfig-dir", action="append", dest="kubeconfig_dirs",
                     metavar="DIR", help="a directory MultiKueueCluster kubeconfigs with "
                     "locationType Path may be read from (repeatable; default: none, so Path "
                     "locations are refused: anyone who may write MultiKueueClusters could "
                     "otherwise make the dispatcher read any file it can)")
    run.add_argument("--placement-policy", choices=("best-fit", "worst-fit", "first-fit"),
                     help="how to choose among workers that fit (default: best-fit)")
    run.add_argument("--node-scoring", choices=SCORING_STRATEGIES,
                     help="the scoring strategy of the workers' kube-scheduler "
                     "(NodeResourcesFit): where the dispatcher expects each pod of a job when "
                     "it checks that every pod fits on a Node (default: LeastAllocated, the "
                     "scheduler's default; MostAllocated for bin-packing schedulers)")
    run.add_argument("--worker-lost-timeout", type=command_line.seconds,
                     dest="worker_lost_timeout_seconds",
                     help="seconds a worker may be unreachable before its jobs are placed "
                     "again elsewhere (default: 900)")
    run.add_argument("--retention", type=command_line.seconds, dest="retention_seconds",
                     help="standalone mode: seconds every finished job's copy, with its Pods, "
                     "their Events and logs, stays on its worker after the job finished, "
                     "readable from the manager with kubectl trainjob and the remote view; "
                     "0 deletes it as soon as the manager shows the finished status "
                     "(default: 0). Deleting the manager TrainJob deletes its copy at once "
                     "whatever this says. Kueue mode: Kueue deletes the copies as soon as "
                     "a job finishes; this does not apply")
    run.add_argument("--failed-retention", type=command_line.seconds,
                     dest="failed_retention_seconds",
                     help="standalone mode: seconds a Failed job's copy stays on its worker "
                     "(at least --retention), so why it failed can still be read from the "
                     "manager; finished Pods hold no room on their Nodes, only their API "
                     "objects and logs (default: 900)")
    run.add_argument("--gc-interval", type=command_line.seconds, dest="gc_interval_seconds",
                     help="seconds between garbage-collection sweeps of the workers; 0 "
                     "disables them (default: 60)")
    run.add_argument("--mirror-worker-events", action=argparse.BooleanOptionalAction,
                     default=None, help="record the workers' Warning Events about a job "
                     "running there (its copy's, the dispatcher's or Kueue's, its Pods': "
                     "FailedScheduling, BackoffLimitExceeded, ...) as Events of the manager's "
                     "TrainJob, naming the worker and the object; needs list and watch of "
                     "events on each worker (default: on)")
    run.add_argument("--worker-event-watches", type=command_line.at_least(0),
                     dest="worker_event_watches", metavar="N",
                     help="with --mirror-worker-events: at most this many namespaces of each "
                     "worker have their Warning Events watched (a connection and a thread "
                     "each), the first to hold copies; those of any more namespaces with "
                     "copies are listed every --worker-event-list-interval instead (their "
                     "Events reach the manager that much later, none is lost) until a watched "
                     "namespace has no copies left. Logged when it happens; "
                     "dispatcher_worker_event_namespaces_over_limit counts them (default: 20)")
    run.add_argument("--worker-event-list-interval", type=command_line.seconds,
                     dest="worker_event_list_seconds", metavar="SECONDS",
                     help="seconds between the lists of the Warning Events of a worker "
                     "namespace that is not watched: over --worker-event-watches, or whose "
                     "last copy went less than 2 minutes ago (default: 30)")
    run.add_argument("--worker-event-qps", type=float, dest="worker_event_qps", metavar="QPS",
                     help="requests a second, per worker, that read its Warning Events: a "
                     "client of their own, so they never take the rate the worker's caches "
                     "and the copies' status need (default: 10, burst twice that; "
                     "worker_event_burst in the config file)")
    command_line.add_python_gc_sweep_argument(run, None)  # the config's default
    run.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=None,
                     help="elect a leader with a Lease in --namespace so that only one "
                     "replica writes (default: on)")
    run.add_argument("--lease-duration", type=command_line.seconds, dest="lease_duration_seconds",
                     help="seconds a standby waits after the leader's last renewal before "
                     "taking over (default: 15)")
    run.add_argument("--renew-deadline", type=command_line.seconds, dest="renew_deadline_seconds",
                     help="seconds the leader keeps trying to renew before it stops "
                     "(default: 10; must be less than the lease duration)")
    run.add_argument("--retry-period", type=command_line.seconds, dest="retry_period_seconds",
                     help="seconds between lease renewals and acquisition attempts (default: 2)")
    listeners.add_arguments(
        run, PLAIN_METRICS_PORT, metrics_port_note="; also the read-only dashboard's while "
        "metrics are plain HTTP on a loopback --metrics-host and no --dashboard-host or "
        "--dashboard-port is given (else the dashboard gets a listener of its own)")
    run.add_argument("--dashboard-port", type=int,
                     help="port of the dashboard's own listener: / and /api/state, which show "
                     f"every job and cluster without authentication (default: "
                     f"{DEFAULT_DASHBOARD_PORT}; 0 = any)")
    run.add_argument("--dashboard-host", help="address the dashboard's own listener binds to "
                     f"(default: {DEFAULT_DASHBOARD_HOST}, reached in a Pod with kubectl "
                     "port-forward; anything else serves every job to whoever reaches it)")
    run.add_argument("--workers", type=command_line.at_least(1), default=8,
                     help="concurrent reconciles (default: %(default)s); more shorten the "
                     "queue when the workers' apiservers answer slowly (docs/benchmarks.md)")
    remote_view_flags.add_arguments(run)
    logs.add_arguments(run)
    # Config key -> the flag that sets it, so a refused value is named as it was typed
    # (argparse keeps its actions in a private list; there is no public way).
    parser.run_flags = {action.dest: action.option_strings[0] for action in run._actions
                        if action.option_strings and action.dest != "help"}
    status = sub.add_parser(
        "status", help="show clusters and multicluster TrainJobs (no dispatcher needed)",
        description="Clusters (MultiKueueCluster and their Active condition) and TrainJobs "
        "with managedBy kueue.x-k8s.io/multikueue: where each runs and its state, read from "
        "the manager's objects.")
    command_line.add_cluster_arguments(status, "manager")
    status.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="(default: %(default)s)")
    status.add_argument("--dispatcher-url",
                        help="a running dispatcher's dashboard (e.g. http://127.0.0.1:8082, "
                        "through kubectl port-forward): the workers' room per resource is "
                        "read from its /api/state (without it, that table says it was not asked)")
    return parser


def config_from_args(args: argparse.Namespace) -> DispatcherConfig:
    """The configuration ``run`` was given: ``--config``'s file with the flags over it."""
    overrides = {
        "mode": args.mode, "dispatcher_name": args.dispatcher_name,
        "kubeconfig_dirs": args.kubeconfig_dirs,
        "admission_timeout_seconds": args.admission_timeout_seconds,
        "namespace": args.namespace, "kueue_namespace": args.kueue_namespace,
        "multikueue_config": args.multikueue_config,
        "origin": args.origin, "placement_policy": args.placement_policy,
        "node_scoring": args.node_scoring,
        "metrics_port": args.metrics_port, "metrics_host": args.metrics_host,
        "metrics_secure": args.metrics_secure, "metrics_cert_dir": args.metrics_cert_dir,
        "health_probe_host": args.health_probe_host,
        "health_probe_port": args.health_probe_port,
        "metrics_cert_validity_seconds": args.metrics_cert_validity_seconds,
        "metrics_auth_qps": args.metrics_auth_qps,
        "liveness_stall_timeout_seconds": args.liveness_stall_timeout_seconds,
        "dashboard_port": args.dashboard_port, "dashboard_host": args.dashboard_host,
        "worker_lost_timeout_seconds": args.worker_lost_timeout_seconds,
        "gc_interval_seconds": args.gc_interval_seconds,
        "retention_seconds": args.retention_seconds,
        "failed_retention_seconds": args.failed_retention_seconds,
        "mirror_worker_events": args.mirror_worker_events,
        "worker_event_watches": args.worker_event_watches,
        "worker_event_list_seconds": args.worker_event_list_seconds,
        "worker_event_qps": args.worker_event_qps,
        "python_gc_sweep_seconds": args.python_gc_sweep_seconds,
        "leader_elect": args.leader_elect,
        "lease_duration_seconds": args.lease_duration_seconds,
        "renew_deadline_seconds": args.renew_deadline_seconds,
        "retry_period_seconds": args.retry_period_seconds,
        **remote_view_flags.overrides(args),
    }
    return load_config(args.config, overrides, build_parser().run_flags)


def main(argv: list[str] | None = None) -> int:
    return command_line.exit_quietly_on_broken_pipe(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "status":
        return _status(args)
    logs.configure(args.log_level, args.log_format)
    try:
        config = config_from_args(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        manager = api_client(find_kubeconfig(args.kubeconfig), args.context,
                             qps=config.manager_client.qps, burst=config.manager_client.burst,
                             user_agent=DISPATCHER_USER_AGENT)
    except KubeconfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - configuration errors end the process clearly
        print(f"error: cannot load Kubernetes configuration: {err}", file=sys.stderr)
        return 2
    from dispatcher import dashboard
    from dispatcher.controller import DispatcherController
    from dispatcher.standalone.beside_kueue import KueueOnManager, origin_conflict, origin_mismatch

    # Standalone mode makes remote copies, which must not look like Kueue's; in kueue mode
    # Kueue makes them all and the dispatcher follows them by Kueue's origin.
    check = origin_conflict if config.mode == "standalone" else origin_mismatch
    try:
        refusal = check(KueueOnManager(manager, config.kueue_namespace), config.origin)
    except ApiException as err:
        print(f"error: cannot read Kueue's configuration on the manager: "
              f"{describe_error(err)}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - unreachable: start fails there anyway
        refusal = None
        log.warning("cannot reach the manager to check the origin against Kueue's: %s",
                    str(err).splitlines()[0][:200])
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2

    controller = DispatcherController(manager, config, workers=args.workers,
                                      instance=socket.gethostname())
    manager.observer = controller.metrics.observer("manager")
    try:
        routes = dashboard.routes(controller)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if config.mode == "kueue":
        log.info("dispatcher starting as Kueue's external dispatcher %s (origin %s, "
                 "namespace %s)", config.dispatcher_name, config.origin, config.namespace)
        idle, why = controller.kueue_mode_idle()
        if idle:
            log.warning("kueue mode idle: %s", why)
    else:
        log.info("dispatcher starting (origin %s, namespace %s)", config.origin,
                 config.namespace)
    return serve("dispatcher", controller.lifecycle, controller.metrics.registry,
                 config.metrics_listeners(), manager,
                 routes=routes, routes_listener=_dashboard_listener(config),
                 gc_sweep_seconds=config.python_gc_sweep_seconds)


def _dashboard_listener(config: DispatcherConfig) -> RoutesListener | None:
    """The dashboard's own listener, or None when it shares the metrics one."""
    address = config.dashboard_address()
    if address is None:
        return None
    host, port = address
    if not is_loopback(host):
        log.warning("the dashboard (/ and /api/state: every job and cluster, no "
                    "authentication) listens on %s:%d, beyond this machine", host, port)
    return RoutesListener("the dashboard", host, port, "--dashboard-port")


def _status(args) -> int:
    from dispatcher.status_report import collect, render

    try:
        manager = api_client(find_kubeconfig(args.kubeconfig), args.context)
        print(render(collect(manager, args.dispatcher_url), args.output))
    except KubeconfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ClusterUnusable as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - a status command reports, it does not crash
        print(f"error: cannot read the manager cluster: {err}", file=sys.stderr)
        return 1
    return 0
