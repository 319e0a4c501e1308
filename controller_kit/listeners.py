"""Where a controller process serves its metrics and its health probes, the flags that say
so (the dispatcher's and the operator's alike) and the rules across them.

Run by hand, one plain loopback listener serves /metrics, /healthz and /readyz. In a Pod
(the shipped Deployments), as controller-runtime serves them: /metrics over HTTPS to
authenticated, authorized callers only (``--metrics-secure``, port 8443), the probes on a
plain listener of their own (``--health-probe-port``, 8081), both on every interface, IPv4
and IPv6 (``::``). /healthz fails when the reconcile loop is stuck
(``--liveness-stall-timeout``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from controller_kit import command_line, metrics_auth, serving_certificate
from controller_kit.connection_limits import ConnectionLimits

DEFAULT_HOST = "127.0.0.1"
# Every interface, IPv6 and IPv4 (one dual-stack socket); IPv4 alone without IPv6.
EVERY_INTERFACE = "::"
SECURE_METRICS_PORT = 8443
HEALTH_PROBE_PORT = 8081
# What one caller can hold of the secure metrics listener.
LIMITS = ConnectionLimits()
# Life of the self-signed metrics certificate, renewed at 2/3 of it.
METRICS_CERT_VALIDITY_SECONDS = serving_certificate.SELF_SIGNED_VALIDITY.total_seconds()
# The shortest allowed: a renewal (at 2/3) must come well after the previous one.
MIN_CERT_VALIDITY_SECONDS = 3.0
# /healthz fails when keys have waited in a work queue this long with no reconcile worker
# taking any: longer than any reconcile takes, even on a slow apiserver (its requests time
# out after 30 s), far shorter than a controller stuck for good would be left alone.
LIVENESS_STALL_TIMEOUT_SECONDS = 120.0

# Setting -> the flag that sets it, for messages.
FLAGS = {
    "metrics_host": "--metrics-host",
    "metrics_port": "--metrics-port",
    "metrics_secure": "--metrics-secure",
    "metrics_cert_dir": "--metrics-cert-dir",
    "health_probe_host": "--health-probe-host",
    "health_probe_port": "--health-probe-port",
    "metrics_cert_validity_seconds": "--metrics-cert-validity",
    "metrics_auth_qps": "--metrics-auth-qps",
    "liveness_stall_timeout_seconds": "--liveness-stall-timeout",
}


@dataclass(frozen=True)
class Listeners:
    """Resolved settings (``resolve``): ``health_probe_port`` None means the probes are
    served beside plain /metrics; a ``liveness_stall_timeout_seconds`` of 0 never fails
    /healthz."""

    metrics_host: str = DEFAULT_HOST
    metrics_port: int = 8080
    metrics_secure: bool = False
    metrics_cert_dir: Path | None = None
    health_probe_host: str | None = None
    health_probe_port: int | None = None
    metrics_cert_validity_seconds: float = METRICS_CERT_VALIDITY_SECONDS
    metrics_auth_qps: float = metrics_auth.REVIEW_QPS
    liveness_stall_timeout_seconds: float = LIVENESS_STALL_TIMEOUT_SECONDS

    @property
    def probes_apart(self) -> bool:
        return self.health_probe_port is not None


def resolve(*, plain_metrics_port: int, metrics_host: str | None = None,
            metrics_port: int | None = None, metrics_secure: bool | None = False,
            metrics_cert_dir: Path | str | None = None, health_probe_host: str | None = None,
            health_probe_port: int | None = None,
            metrics_cert_validity_seconds: float | None = None,
            metrics_auth_qps: float | None = None,
            liveness_stall_timeout_seconds: float | None = None,
            names: Mapping[str, str] = FLAGS) -> Listeners:
    """The listeners these settings give (None: not given), or ValueError naming the
    settings (as ``names`` calls them) that contradict each other."""
    secure = bool(metrics_secure)
    for key, value in (("metrics_cert_validity_seconds", metrics_cert_validity_seconds),
                       ("metrics_auth_qps", metrics_auth_qps)):
        if value is not None and not secure:
            raise ValueError(f"{names[key]} is given but {names['metrics_secure']} is not: "
                             "plain HTTP metrics have no certificate and check no token (add "
                             f"{names['metrics_secure']}, or drop {names[key]})")
    if metrics_cert_validity_seconds is not None:
        if metrics_cert_dir is not None:
            raise ValueError(f"{names['metrics_cert_validity_seconds']} is for the self-signed "
                             f"certificate, and {names['metrics_cert_dir']} gives one (its "
                             "life is its issuer's to choose): drop one of them")
        if not metrics_cert_validity_seconds >= MIN_CERT_VALIDITY_SECONDS:
            raise ValueError(f"{names['metrics_cert_validity_seconds']}: at least "
                             f"{MIN_CERT_VALIDITY_SECONDS:g} seconds (it is renewed at 2/3 of "
                             f"its life), got {metrics_cert_validity_seconds:g}")
    if metrics_auth_qps is not None and not metrics_auth_qps > 0:
        raise ValueError(f"{names['metrics_auth_qps']}: must be more than 0, got "
                         f"{metrics_auth_qps:g}")
    if liveness_stall_timeout_seconds is not None and not liveness_stall_timeout_seconds >= 0:
        raise ValueError(f"{names['liveness_stall_timeout_seconds']}: must be 0 (never) or "
                         f"more, got {liveness_stall_timeout_seconds:g}")
    for key, port in (("metrics_port", metrics_port), ("health_probe_port", health_probe_port)):
        if port is not None and not 0 <= port <= 65535:
            raise ValueError(f"{names[key]}: must be a port number from 0 to 65535 (0: any "
                             f"free port), got {port}")
    if metrics_cert_dir is not None and not secure:
        raise ValueError(f"{names['metrics_cert_dir']} is given but {names['metrics_secure']} "
                         "is not: plain HTTP metrics serve no certificate (add "
                         f"{names['metrics_secure']}, or drop {names['metrics_cert_dir']})")
    if health_probe_host is not None and health_probe_port is None and not secure:
        raise ValueError(f"{names['health_probe_host']} needs {names['health_probe_port']}: "
                         "without a probe listener of their own, /healthz and /readyz are "
                         f"served beside /metrics on {names['metrics_host']}")
    if metrics_port is None:
        metrics_port = SECURE_METRICS_PORT if secure else plain_metrics_port
    if health_probe_port is None and secure:
        health_probe_port = HEALTH_PROBE_PORT  # never behind the metrics' authentication
    if health_probe_port is not None and health_probe_port != 0 \
            and health_probe_port == metrics_port:
        raise ValueError(f"{names['health_probe_port']} and {names['metrics_port']} are both "
                         f"{metrics_port}: the health probes are served on a listener of "
                         "their own (choose another port for one of them)")
    host = metrics_host or DEFAULT_HOST
    return Listeners(
        metrics_host=host, metrics_port=metrics_port, metrics_secure=secure,
        metrics_cert_dir=Path(metrics_cert_dir) if metrics_cert_dir is not None else None,
        health_probe_host=(health_probe_host or host) if health_probe_port is not None else None,
        health_probe_port=health_probe_port,
        metrics_cert_validity_seconds=(METRICS_CERT_VALIDITY_SECONDS
                                       if metrics_cert_validity_seconds is None
                                       else metrics_cert_validity_seconds),
        metrics_auth_qps=(metrics_auth.REVIEW_QPS if metrics_auth_qps is None
                          else metrics_auth_qps),
        liveness_stall_timeout_seconds=(LIVENESS_STALL_TIMEOUT_SECONDS
                                        if liveness_stall_timeout_seconds is None
                                        else liveness_stall_timeout_seconds))


def port(text: str) -> int:
    """A TCP port number, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser, plain_metrics_port: int,
                  metrics_port_note: str = "") -> None:
    """The metrics and probe flags, each defaulting to None (not given): ``resolve`` (or the
    dispatcher's configuration) fills in the defaults their help states."""
    group = parser.add_argument_group(
        "metrics and health probes",
        "Run by hand, one plain HTTP listener on loopback serves /metrics, /healthz and "
        "/readyz. In a Pod (the shipped Deployments), as controller-runtime's controllers do: "
        f"--metrics-secure --metrics-host={EVERY_INTERFACE} --metrics-port="
        f"{SECURE_METRICS_PORT} --health-probe-host={EVERY_INTERFACE} --health-probe-port="
        f"{HEALTH_PROBE_PORT}. A host of {EVERY_INTERFACE} listens on every interface, IPv6 "
        "and IPv4 alike, or IPv4 alone where the Pod has no IPv6; 0.0.0.0 is IPv4 only.")
    group.add_argument("--metrics-host", metavar="HOST",
                       help=f"address /metrics listens on (default: {DEFAULT_HOST}; "
                       f"{EVERY_INTERFACE} in a Pod, with --metrics-secure)")
    group.add_argument("--metrics-port", type=port, metavar="PORT",
                       help=f"port for /metrics, and for /healthz and /readyz unless they "
                       f"have a listener of their own (default: {plain_metrics_port}, or "
                       f"{SECURE_METRICS_PORT} with --metrics-secure; 0 = any free "
                       f"port){metrics_port_note}")
    group.add_argument("--metrics-secure", action=argparse.BooleanOptionalAction, default=None,
                       help="serve /metrics over HTTPS, to authenticated and authorized "
                       "callers only: each request carries 'Authorization: Bearer <token>', "
                       "which the Kubernetes apiserver must accept (TokenReview; else 401) "
                       "for a user it allows get on the non-resource URL /metrics "
                       "(SubjectAccessReview; else 403: bind the user to the "
                       "...-metrics-reader ClusterRole). Each decision is kept "
                       f"{metrics_auth.ALLOWED_TTL_SECONDS:g} s "
                       f"({metrics_auth.REFUSED_TTL_SECONDS:g} s "
                       "for a refusal). The process's own identity needs create on "
                       "tokenreviews and subjectaccessreviews, asked through a client of "
                       "their own (--metrics-auth-qps), never the controller's. At most "
                       f"{LIMITS.threads} connections are served at once, each for at most "
                       f"{LIMITS.deadline_seconds:g} s; beyond them a connection waits "
                       f"{LIMITS.wait_seconds:g} s at most, then is closed. /healthz and /readyz "
                       "move to --health-probe-port (default: off, plain HTTP, for runs by "
                       "hand)")
    group.add_argument("--metrics-auth-qps", type=float, metavar="QPS",
                       dest="metrics_auth_qps",
                       help="tokens not in the decision cache checked with the apiserver "
                       "per second (twice as many saved up); a request beyond that is "
                       f"answered 429 (default: {metrics_auth.REVIEW_QPS:g})")
    group.add_argument("--metrics-cert-dir", metavar="DIR",
                       help="directory holding tls.crt and tls.key for --metrics-secure, "
                       "read again whenever they change (default: a self-signed certificate "
                       "made at start and kept in memory, renewed at 2/3 of its life; "
                       "scrapers then skip verification)")
    group.add_argument("--metrics-cert-validity", type=command_line.seconds, metavar="SECONDS",
                       dest="metrics_cert_validity_seconds",
                       help="life of the self-signed certificate (without --metrics-cert-dir); "
                       "a new one is served to new connections from 2/3 of it on, with no "
                       f"restart (default: {METRICS_CERT_VALIDITY_SECONDS:.0f}, a day; at "
                       f"least {MIN_CERT_VALIDITY_SECONDS:g})")
    group.add_argument("--health-probe-host", metavar="HOST",
                       help="address the probe listener binds to (default: --metrics-host's)")
    group.add_argument("--health-probe-port", type=port, metavar="PORT",
                       help="port of a plain HTTP listener of their own for /healthz and "
                       "/readyz, never authenticated (default: none, they are served beside "
                       f"/metrics; {HEALTH_PROBE_PORT} with --metrics-secure; 0 = any free "
                       "port)")
    group.add_argument("--liveness-stall-timeout", type=command_line.seconds,
                       metavar="SECONDS", dest="liveness_stall_timeout_seconds",
                       help="/healthz answers 500 once keys have waited in a work queue this "
                       "long with no reconcile worker taking any (a stuck loop: the kubelet "
                       "restarts the container); a busy loop that takes keys, or an idle "
                       "one, stays live (default: "
                       f"{LIVENESS_STALL_TIMEOUT_SECONDS:.0f}; 0 = never)")


def from_args(args: argparse.Namespace, plain_metrics_port: int) -> Listeners:
    """``resolve`` of the flags ``add_arguments`` added."""
    return resolve(plain_metrics_port=plain_metrics_port, metrics_host=args.metrics_host,
                   metrics_port=args.metrics_port, metrics_secure=args.metrics_secure,
                   metrics_cert_dir=args.metrics_cert_dir,
                   health_probe_host=args.health_probe_host,
                   health_probe_port=args.health_probe_port,
                   metrics_cert_validity_seconds=args.metrics_cert_validity_seconds,
                   metrics_auth_qps=args.metrics_auth_qps,
                   liveness_stall_timeout_seconds=args.liveness_stall_timeout_seconds)
