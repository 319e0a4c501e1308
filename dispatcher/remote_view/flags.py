"""The ``--remote-api-*`` flags of ``dispatcher run`` and the configuration keys they set
(``DispatcherConfig.remote_api_*``)."""

from __future__ import annotations

import argparse

from controller_kit import command_line, listeners
from dispatcher.remote_view import APISERVICE, GROUP_VERSION, SERVICE

MAX_STREAMS = 50
STREAM_IDLE_TIMEOUT_SECONDS = 300.0
DEFAULT_HOST = "127.0.0.1"
KEYS = ("remote_api_port", "remote_api_host", "remote_api_cert_dir",
        "remote_api_max_streams", "remote_api_stream_idle_timeout_seconds",
        "remote_api_service")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "remote view (docs/remote-view.md)",
        f"A read-only aggregated API, {GROUP_VERSION}, through which manager users see the "
        "Pods, Events and logs of their jobs' copies on the workers, as the manager's RBAC "
        "allows each of them (kubectl get trainjobpods, kubectl trainjob logs). Off unless "
        "--remote-api-port is given; served by every replica, leader or standby. Requests "
        "are accepted only from the aggregation layer (its front-proxy client certificate, "
        "from ConfigMap kube-system/extension-apiserver-authentication) and authorized per "
        "user with a SubjectAccessReview.")
    group.add_argument("--remote-api-port", type=listeners.port, metavar="PORT",
                       help="HTTPS port of the remote view (default: off; 0 = any free port)")
    group.add_argument("--remote-api-host", metavar="HOST",
                       help=f"address it listens on (default: {DEFAULT_HOST}; :: in a Pod: "
                       "every interface)")
    group.add_argument("--remote-api-cert-dir", metavar="DIR",
                       help="tls.crt and tls.key to serve (e.g. cert-manager's), read again "
                       "when they change; the APIService's caBundle is then the issuer's to "
                       "inject (default: the dispatcher makes a CA and a certificate in "
                       f"Secret <--remote-api-service>-cert of its namespace and injects the "
                       f"CA into APIService {APISERVICE})")
    group.add_argument("--remote-api-service", metavar="NAME",
                       help="the Service in front of the dispatcher in its namespace, whose "
                       f"name the serving certificate is for (default: {SERVICE})")
    group.add_argument("--remote-api-max-streams", type=command_line.at_least(1),
                       metavar="N", help="logs relayed at once; beyond them a log request "
                       f"gets 429 (default: {MAX_STREAMS})")
    group.add_argument("--remote-api-stream-idle-timeout", type=command_line.seconds,
                       metavar="SECONDS", dest="remote_api_stream_idle_timeout_seconds",
                       help="a followed log ends when its worker sends nothing for this "
                       f"long (default: {STREAM_IDLE_TIMEOUT_SECONDS:.0f})")


def overrides(args: argparse.Namespace) -> dict[str, object]:
    """The configuration keys the flags gave (None: not given)."""
    return {key: getattr(args, key, None) for key in KEYS}
