"""``training-operator`` / ``python -m training_operator``: the worker-side operator."""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import threading

from trainjob import command_line, listeners, logs
from trainjob import constants as c, trainer_status as ts
from trainjob.gc_pauses import SWEEP_SECONDS
from trainjob.kubeclient import KubeconfigError, api_client, find_kubeconfig
from trainjob.service import ListenError, serve

log = logging.getLogger("training_operator")

DEFAULT_SERVICE = "training-operator-webhook.training-operator-system.svc"
DEFAULT_LEASE_NAMESPACE = "training-operator-system"
PLAIN_METRICS_PORT = 8080

DESCRIPTION = """\
Reconcile TrainJobs owned by the built-in training operator (spec.managedBy unset, empty,
kubeflow.org/training-operator or trainer.kubeflow.org/trainjob-controller) into JobSets, report their status, and validate
TrainJobs in an admission webhook. TrainJobs managed by anyone else (for example
kueue.x-k8s.io/multikueue) are never touched.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="training-operator", description=DESCRIPTION)
    command_line.add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run the operator until interrupted",
                         description=DESCRIPTION)
    command_line.add_cluster_arguments(run, "worker")
    run.add_argument("--namespace", default=None,
                     help="only reconcile TrainJobs in this namespace (default: all namespaces)")
    run.add_argument("--webhook-port", type=int, default=9443,
                     help="HTTPS port of the validating admission webhook (default: %(default)s)")
    run.add_argument("--webhook-host", default="127.0.0.1",
                     help="address the webhook binds to; 0.0.0.0 inside a Pod (default: %(default)s)")
    run.add_argument("--webhook-cert-dir", default=None,
                     help="directory holding tls.crt and tls.key; the webhook server starts "
                     "only when this is given (without it the operator still reconciles and "
                     "the CRD's CEL rules still apply)")
    run.add_argument("--webhook-drain-seconds", type=command_line.seconds, default=5.0,
                     help="on SIGTERM, go on answering reviews for up to this long, each answer "
                     "closing its connection, so that the apiserver moves to another replica "
                     "without a review cut short (default: %(default)s; keep it below the "
                     "Pod's terminationGracePeriodSeconds minus its preStop delay)")
    listeners.add_arguments(run, PLAIN_METRICS_PORT)
    status = run.add_argument_group(
        "trainer status (upstream Trainer's TrainJobStatus feature gate; alpha, off by default)",
        "Training pods report progress (percentage, remaining time, metrics) to an HTTPS "
        "endpoint that writes it to their TrainJob's status.trainerStatus. When on, the first "
        "trainer replicated job's containers get KUBEFLOW_TRAINER_SERVER_URL, "
        "KUBEFLOW_TRAINER_SERVER_CA_CERT and KUBEFLOW_TRAINER_SERVER_TOKEN, a projected "
        "service-account token for the job's audience and ConfigMap <job>-tls-config with "
        "the CA, as upstream's plug-in adds them. A pod is believed when the apiserver "
        "accepts its token for audience "
        "trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status and its "
        "service account is in the job's namespace.")
    status.add_argument("--enable-trainer-status", action="store_true",
                        help="serve the endpoint and wire trainer pods to it; needs "
                        "--webhook-cert-dir (its certificate serves the endpoint too)")
    status.add_argument("--trainer-status-port", type=int, default=ts.DEFAULT_PORT,
                        help="HTTPS port of the endpoint, on --webhook-host (default: %(default)s)")
    status.add_argument("--trainer-status-url", default=None,
                        help="base URL pods reach the endpoint at; the job's path is appended "
                        f"(default: https://{DEFAULT_SERVICE}:<--trainer-status-port>, the "
                        "Service in manifests/operator)")
    status.add_argument("--trainer-status-ca-file", default=None,
                        help="CA certificate pods verify the endpoint with, copied into each "
                        "job's ConfigMap (default: ca.crt in --webhook-cert-dir, as "
                        "cert-manager writes it)")
    run.add_argument("--workers", type=command_line.at_least(1), default=4, help="concurrent reconciles (default: %(default)s)")
    election = run.add_argument_group(
        "leader election",
        "With several replicas (so that a rollout never leaves the fail-closed webhook "
        "without a Pod), every replica keeps its caches warm and serves the webhook, and "
        "only the holder of the Lease training-operator (training-operator-<namespace> with "
        "--namespace) reconciles. A leader that cannot renew exits; its restart is a "
        "standby.")
    election.add_argument("--leader-elect", action=argparse.BooleanOptionalAction,
                          default=False, help="elect a leader (default: off, one operator "
                          "reconciles alone)")
    election.add_argument("--leader-elect-namespace", default=DEFAULT_LEASE_NAMESPACE,
                          help="namespace of the Lease (default: %(default)s)")
    election.add_argument("--lease-duration", type=command_line.seconds, default=15.0,
                          help="seconds a standby waits after the leader's last renewal "
                          "before taking over (default: %(default)s)")
    election.add_argument("--renew-deadline", type=command_line.seconds, default=10.0,
                          help="seconds the leader keeps trying to renew before it stops "
                          "(default: %(default)s; less than --lease-duration)")
    election.add_argument("--retry-period", type=command_line.seconds, default=2.0,
                          help="seconds between renewals and acquisition attempts "
                          "(default: %(default)s)")
    command_line.add_python_gc_sweep_argument(run, SWEEP_SECONDS)
    run.add_argument("--cluster-name", default=None,
                     help="name of this cluster, added to every log line as cluster=NAME "
                     "(e.g. the MultiKueueCluster name the manager knows it by)")
    logs.add_arguments(run)
    return parser


def _trainer_status_plugins(args: argparse.Namespace) -> list:
    """The trainer status plug-in, configured from the flags, when the endpoint is on."""
    if not args.enable_trainer_status:
        return []
    if not args.webhook_cert_dir:
        raise ValueError("--enable-trainer-status needs --webhook-cert-dir: the endpoint "
                         "serves HTTPS with the webhook's certificate")
    from pathlib import Path

    from trainjob.runtime.plugins.trainer_status import TrainerStatusPlugin

    ca_file = Path(args.trainer_status_ca_file or Path(args.webhook_cert_dir) / "ca.crt")
    if not ca_file.is_file():
        raise ValueError(f"--trainer-status-ca-file {ca_file}: no such file; pods need the CA "
                         "certificate of the endpoint's serving certificate to verify it")
    base_url = args.trainer_status_url or f"https://{DEFAULT_SERVICE}:{args.trainer_status_port}"
    # Read at each build: a CA rotated in place reaches the jobs built afterwards.
    return [TrainerStatusPlugin(base_url, lambda: ca_file.read_text())]


def _lease(args: argparse.Namespace):
    """The leader election settings from the flags; None without --leader-elect."""
    from training_operator.controller import LeaseSettings, lease_name

    if not args.leader_elect:
        return None
    if not args.lease_duration > args.renew_deadline > 1.2 * args.retry_period:
        raise ValueError("--renew-deadline must be less than --lease-duration and more than "
                         "1.2 x --retry-period (a leader must stop before a standby may start)")
    return LeaseSettings(args.leader_elect_namespace, lease_name(args.namespace),
                         args.lease_duration, args.renew_deadline, args.retry_period)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    logs.set_process_fields(cluster=args.cluster_name)
    from training_operator.controller import OperatorController

    try:
        status_plugins = _trainer_status_plugins(args)
        lease = _lease(args)
        where = listeners.from_args(args, PLAIN_METRICS_PORT)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        api = api_client(find_kubeconfig(args.kubeconfig), args.context,
                         user_agent=c.OPERATOR_USER_AGENT)
    except KubeconfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - configuration errors end the process clearly
        print(f"error: cannot load Kubernetes configuration: {err}", file=sys.stderr)
        return 2
    stop = threading.Event()
    controller = OperatorController(api, namespace=args.namespace, workers=args.workers,
                                    instance=socket.gethostname(), extra_plugins=status_plugins,
                                    lease=lease, stop_requested=stop)
    if args.webhook_cert_dir:
        controller.webhook_serving = False

    def webhook() -> list:
        if not args.webhook_cert_dir:
            return []
        from training_operator.webhook_server import WebhookServer

        server = WebhookServer(args.webhook_port, args.webhook_cert_dir, controller.lookups(),
                               host=args.webhook_host, on_review=controller.observe_review,
                               drain_seconds=args.webhook_drain_seconds)
        try:
            server.start()
        except OSError as err:
            if isinstance(err, (FileNotFoundError, PermissionError)):
                raise  # the certificate files, not the address
            raise ListenError("the admission webhook", args.webhook_host, args.webhook_port,
                              "--webhook-port", err) from err
        log.info("webhook serving on https://%s:%d", args.webhook_host, server.port)
        servers = [server]
        if args.enable_trainer_status:
            servers.append(trainer_status(server))
        # Ready only once every listener is up: trainer pods report through the same Service.
        controller.webhook_serving = True
        return servers

    def trainer_status(server):
        from training_operator.status_server import StatusServer

        status_server = StatusServer(args.trainer_status_port, args.webhook_cert_dir, api,
                                     find_job=controller.trainjobs.get, host=args.webhook_host,
                                     on_update=controller.observe_trainer_status)
        try:
            status_server.start()
        except OSError as err:
            server.stop()
            raise ListenError("the trainer status endpoint", args.webhook_host,
                              args.trainer_status_port, "--trainer-status-port", err) from err
        log.info("trainer status endpoint serving on %s", status_server.url)
        return status_server

    log.info("operator starting (namespace: %s%s)", args.namespace or "all",
             f"; leader election on Lease {lease.namespace}/{lease.name}" if lease else "")
    return serve("operator", controller, controller.metrics.registry, where, api, webhook,
                 stop=stop, failed=controller.lost_leadership.is_set,
                 gc_sweep_seconds=args.python_gc_sweep_seconds)
