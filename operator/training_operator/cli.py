"""``training-operator`` / ``python -m training_operator``: the worker-side operator."""

from __future__ import annotations

import argparse
import logging
import socket
import sys

from trainjob import command_line, logs
from trainjob import constants as c
from trainjob.kubeclient import KubeconfigError, api_client
from trainjob.service import ListenError, serve

log = logging.getLogger("training_operator")

DESCRIPTION = """\
Reconcile TrainJobs owned by the built-in training operator (spec.managedBy unset, empty,
kubeflow.org/training-operator or trainer.kubeflow.org/trainjob-controller) into JobSets, report their status, and validate
TrainJobs in an admission webhook. TrainJobs managed by anyone else (for example
kueue.x-k8s.io/multikueue) are never touched.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="training-operator", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run the operator until interrupted",
                         description=DESCRIPTION)
    run.add_argument("--kubeconfig", help="kubeconfig of the cluster to operate on; "
                     "in-cluster service-account configuration when omitted")
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
    run.add_argument("--metrics-port", type=int, default=8080,
                     help="port for /metrics, /healthz and /readyz; 0 picks a free port (default: %(default)s)")
    run.add_argument("--metrics-host", default="127.0.0.1",
                     help="address the metrics server binds to; 0.0.0.0 inside a Pod (default: %(default)s)")
    run.add_argument("--workers", type=command_line.at_least(1), default=4, help="concurrent reconciles (default: %(default)s)")
    run.add_argument("--cluster-name", default=None,
                     help="name of this cluster, added to every log line as cluster=NAME "
                     "(e.g. the MultiKueueCluster name the manager knows it by)")
    logs.add_arguments(run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    logs.set_process_fields(cluster=args.cluster_name)
    from training_operator.controller import OperatorController

    try:
        api = api_client(args.kubeconfig, user_agent=c.OPERATOR_USER_AGENT)
    except KubeconfigError as err:
        print(f"error: --kubeconfig {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - configuration errors end the process clearly
        print(f"error: cannot load Kubernetes configuration: {err}", file=sys.stderr)
        return 2
    controller = OperatorController(api, namespace=args.namespace, workers=args.workers,
                                    instance=socket.gethostname())

    def webhook() -> list:
        if not args.webhook_cert_dir:
            return []
        from training_operator.webhook_server import WebhookServer

        server = WebhookServer(args.webhook_port, args.webhook_cert_dir, controller.lookups(),
                               host=args.webhook_host, on_review=controller.observe_review)
        try:
            server.start()
        except OSError as err:
            if isinstance(err, (FileNotFoundError, PermissionError)):
                raise  # the certificate files, not the address
            raise ListenError("the admission webhook", args.webhook_host, args.webhook_port,
                              "--webhook-port", err) from err
        log.info("webhook serving on https://%s:%d", args.webhook_host, server.port)
        return [server]

    log.info("operator starting (namespace: %s)", args.namespace or "all")
    return serve("operator", controller, controller.metrics.registry, args.metrics_host,
                 args.metrics_port, webhook)
