"""``training-operator`` / ``python -m training_operator``: the worker-side operator."""

from __future__ import annotations

import argparse
import atexit
import datetime
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
from pathlib import Path

from controller_kit import command_line, listeners, logs
from controller_kit.gc_pauses import SWEEP_SECONDS
from controller_kit.kubeclient import KubeconfigError, api_client, find_kubeconfig
from controller_kit.service import ListenError, serve
from trainjob import constants as c
from trainjob import trainer_status as ts

log = logging.getLogger("training_operator")

DEFAULT_SERVICE = "training-operator-webhook.training-operator-system.svc"
DEFAULT_LEASE_NAMESPACE = "training-operator-system"
INTERNAL, EXTERNAL = "internal", "external"
PLAIN_METRICS_PORT = 8080
# How long the webhook's start waits for the certificates' Secret to be read before it
# waits on in a thread of its own (the Secret may have yet to be written by the leader).
SECRET_READ_SECONDS = 2.0

DESCRIPTION = """\
Reconcile TrainJobs owned by the built-in training operator (spec.managedBy unset, empty,
kubeflow.org/training-operator or trainer.kubeflow.org/trainjob-controller) into JobSets,
report their status, and validate TrainJobs in an admission webhook. TrainJobs managed by
anyone else (for example kueue.x-k8s.io/multikueue) are never touched.
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
                     help="address the webhook binds to; inside a Pod :: (every interface, "
                     "IPv6 and IPv4 alike; IPv4 alone where the Pod has no IPv6), as the "
                     "shipped Deployment gives; 0.0.0.0 is IPv4 only, and refuses every "
                     "review on an IPv6-only cluster (default: %(default)s)")
    run.add_argument("--webhook-cert-dir", default=None,
                     help="directory holding tls.crt and tls.key; with external certificates "
                     "the webhook server starts only when this is given (without it the "
                     "operator still reconciles and the CRD's CEL rules still apply); with "
                     "--webhook-cert-management internal the operator writes them there (it "
                     "must be writable; default: a private temporary directory)")
    run.add_argument("--webhook-drain-seconds", type=command_line.seconds, default=5.0,
                     help="on SIGTERM, go on answering reviews for up to this long, each answer "
                     "closing its connection, so that the apiserver moves to another replica "
                     "without a review cut short (default: %(default)s; keep it below the "
                     "Pod's terminationGracePeriodSeconds minus its preStop delay)")
    listeners.add_arguments(run, PLAIN_METRICS_PORT)
    _add_certificate_arguments(run)
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
                        "cert-manager and the internal certificate management write it)")
    run.add_argument("--workers", type=command_line.at_least(1), default=4,
                     help="concurrent reconciles (default: %(default)s)")
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


def _add_certificate_arguments(run: argparse.ArgumentParser) -> None:
    from training_operator import webhook_certificates as wc

    group = run.add_argument_group(
        "webhook certificates",
        "With internal management the operator makes the webhook's certificates itself, "
        "with no cert-manager: the leader keeps the Secret --webhook-cert-secret (ca.crt, "
        "ca.key, tls.crt, tls.key) with a CA and a serving certificate for "
        "<--webhook-service>.<namespace>.svc (and .svc.cluster.local), renews the "
        "serving certificate at 2/3 of its life under a long-lived CA, and writes the CA "
        "bundle into the caBundle of every webhook of --webhook-config-name; every replica "
        "serves what the Secret holds (written into --webhook-cert-dir and reloaded, no "
        "restart). It needs RBAC on that Secret and that configuration "
        "(manifests/operator/webhook-cert-rbac.yaml).")
    group.add_argument("--webhook-cert-management", choices=(INTERNAL, EXTERNAL),
                       default=EXTERNAL,
                       help="internal: the operator makes, injects and rotates its webhook "
                       "certificates and serves the webhook (its files in --webhook-cert-dir, "
                       "else in a private temporary directory); external: someone else "
                       "(cert-manager, "
                       "a person) puts tls.crt and tls.key into --webhook-cert-dir and the "
                       "CA into the caBundle (default: %(default)s; manifests/operator runs "
                       "internal, manifests/operator-cert-manager external)")
    group.add_argument("--webhook-cert-secret", default="training-operator-webhook-cert",
                       metavar="NAME",
                       help="the Secret holding the certificates (default: %(default)s)")
    group.add_argument("--webhook-cert-namespace",
                       default=os.environ.get("POD_NAMESPACE") or DEFAULT_LEASE_NAMESPACE,
                       metavar="NAMESPACE",
                       help="namespace of that Secret, the operator's own (default: "
                       "$POD_NAMESPACE, else training-operator-system; now %(default)s)")
    group.add_argument("--webhook-service", default="training-operator-webhook",
                       metavar="NAME",
                       help="the Service the apiserver calls the webhook through; the "
                       "certificate is for its in-cluster names (default: %(default)s)")
    group.add_argument("--webhook-config-name", default="training-operator-trainjob-validator",
                       metavar="NAME",
                       help="the ValidatingWebhookConfiguration whose webhooks get the CA "
                       "bundle (default: %(default)s)")
    group.add_argument("--webhook-cert-extra-hosts", type=_hosts, default=(),
                       metavar="HOST[,HOST...]",
                       help="more DNS names or IP addresses for the serving certificate, "
                       "comma-separated (e.g. 127.0.0.1 for a webhook called by URL)")
    group.add_argument("--webhook-cert-validity", type=command_line.seconds,
                       default=wc.DEFAULT_VALIDITY.total_seconds(), metavar="SECONDS",
                       help="life of a serving certificate; the CA lives "
                       f"{wc.CA_LIFETIMES} times as long; each is renewed at 2/3 of its "
                       "life (default: %(default).0f, a year; a short one shows rotations "
                       "in tests; at least 10)")


def _hosts(value: str) -> tuple[str, ...]:
    hosts = tuple(h.strip() for h in value.split(",") if h.strip())
    if not hosts:
        raise argparse.ArgumentTypeError("give one or more hosts, comma-separated")
    return hosts


def _certificate_settings(args: argparse.Namespace):
    """What the internal certificate management keeps, from the flags; None when the
    certificates are made by someone else."""
    if args.webhook_cert_management != INTERNAL:
        return None
    from training_operator.webhook_certificates import CertificateSettings

    if args.webhook_cert_validity < 10:
        raise ValueError(f"--webhook-cert-validity {args.webhook_cert_validity:g}: at least "
                         "10 seconds (a certificate is renewed at 2/3 of its life, and every "
                         "replica must load it before the old one ends)")
    return CertificateSettings(
        namespace=args.webhook_cert_namespace, secret=args.webhook_cert_secret,
        service=args.webhook_service, webhook_configuration=args.webhook_config_name,
        extra_hosts=args.webhook_cert_extra_hosts,
        validity=datetime.timedelta(seconds=args.webhook_cert_validity))


def _trainer_status_plugins(args: argparse.Namespace, internal: bool = False) -> list:
    """The trainer status plug-in, configured from the flags, when the endpoint is on.
    ``internal``: the certificates (ca.crt among them) are written into the directory
    once the operator runs."""
    if not args.enable_trainer_status:
        return []
    if not args.webhook_cert_dir:
        raise ValueError("--enable-trainer-status needs --webhook-cert-dir: the endpoint "
                         "serves HTTPS with the webhook's certificate")
    from trainjob.runtime.plugins.trainer_status import TrainerStatusPlugin

    ca_file = Path(args.trainer_status_ca_file or Path(args.webhook_cert_dir) / "ca.crt")
    if not (internal and not args.trainer_status_ca_file) and not ca_file.is_file():
        raise ValueError(f"--trainer-status-ca-file {ca_file}: no such file; pods need the CA "
                         "certificate of the endpoint's serving certificate to verify it")
    base_url = args.trainer_status_url or f"https://{DEFAULT_SERVICE}:{args.trainer_status_port}"
    # Read at each build: a CA rotated in place reaches the jobs built afterwards.
    return [TrainerStatusPlugin(base_url, lambda: ca_file.read_text())]


def _lease(args: argparse.Namespace):
    """The leader election settings from the flags; None without --leader-elect."""
    from controller_kit.manager import Lease
    from training_operator.controller import lease_name

    if not args.leader_elect:
        return None
    if not args.lease_duration > args.renew_deadline > 1.2 * args.retry_period:
        raise ValueError("--renew-deadline must be less than --lease-duration and more than "
                         "1.2 x --retry-period (a leader must stop before a standby may start)")
    return Lease(args.leader_elect_namespace, lease_name(args.namespace),
                         args.lease_duration, args.renew_deadline, args.retry_period)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    logs.set_process_fields(cluster=args.cluster_name)
    from training_operator.controller import OperatorController

    try:
        certificates = _certificate_settings(args)
        if certificates is not None and not args.webhook_cert_dir:
            # The operator's own files, written from the Secret: a private directory.
            args.webhook_cert_dir = tempfile.mkdtemp(prefix="training-operator-webhook-certs-")
            atexit.register(shutil.rmtree, args.webhook_cert_dir, ignore_errors=True)
        status_plugins = _trainer_status_plugins(args, internal=certificates is not None)
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
    controller = OperatorController(api, namespace=args.namespace, workers=args.workers,
                                    instance=socket.gethostname(), extra_plugins=status_plugins,
                                    lease=lease)
    if args.webhook_cert_dir:
        controller.webhook_serving = False
        for runnable in _webhook_runnables(args, api, certificates, controller):
            controller.lifecycle.add(runnable)

    log.info("operator starting (namespace: %s%s)", args.namespace or "all",
             f"; leader election on Lease {lease.namespace}/{lease.name}" if lease else "")
    return serve("operator", controller.lifecycle, controller.metrics.registry, where, api,
                 gc_sweep_seconds=args.python_gc_sweep_seconds)


def _webhook_runnables(args: argparse.Namespace, api, certificates, controller) -> list:
    """The admission webhook's runnables, registered after the caches its reviews read:
    with internal certificates, their keeper, then the listeners (the webhook, and the
    trainer status endpoint when on). /readyz says no until every listener is up.

    The listeners start at once when the certificate is there (a port taken fails the
    start, naming the flag). A certificate the leader has yet to write into the Secret
    (a first start) is waited for in a thread of its own, not in the start: the leader
    writes it only once its term begins, after every replica's runnable has started."""
    from controller_kit.manager import Runnable
    from training_operator.webhook_server import WebhookServer

    runnables = []
    keeper = None
    if certificates is not None:
        from training_operator.webhook_certificates import WebhookCertificates

        keeper = WebhookCertificates(api, certificates, Path(args.webhook_cert_dir),
                                     registry=controller.metrics.registry,
                                     is_leader=lambda: controller.lifecycle.leading)
        runnables.append(Runnable("webhook certificates", start=lambda _: keeper.start(),
                                  stop=keeper.stop, threads=lambda: [keeper.thread]))
    serving: list = []  # the listeners, once all are up
    waiting: list[threading.Thread] = []
    stopping = threading.Event()

    def listen() -> None:
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
        log.info("webhook serving on %s", server.url)
        servers = [server]
        if args.enable_trainer_status:
            servers.append(_trainer_status(args, api, controller, server))
        serving.extend(servers)
        # Ready only once every listener is up: trainer pods report through the same Service.
        controller.webhook_serving = True

    def wait_then_listen() -> None:
        while not keeper.serving.wait(0.5):
            if stopping.is_set():
                return
        if not stopping.is_set():
            listen()

    def start(seconds_left: float) -> None:
        # A Secret already there is read within moments: then the listeners start here.
        if keeper is None or keeper.serving.wait(min(seconds_left, SECRET_READ_SECONDS)):
            listen()
            return
        thread = threading.Thread(target=wait_then_listen, name="webhook-certificate-wait",
                                  daemon=True)
        waiting.append(thread)
        thread.start()

    def stop() -> None:
        stopping.set()
        for thread in waiting:
            thread.join(5)
        for server in reversed(serving):
            server.stop()

    def threads() -> list:
        # The waiting thread hands over to the listeners' own: once they are up it has
        # ended, and is no longer asked about.
        return [server.thread for server in serving] if serving else waiting

    runnables.append(Runnable("webhook listeners", start=start, stop=stop, threads=threads))
    return runnables


def _trainer_status(args: argparse.Namespace, api, controller, server):
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
