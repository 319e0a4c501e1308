"""Where a controller process serves its metrics and its health probes, the flags that say
so (the dispatcher's and the operator's alike) and the rules across them.

Run by hand, one plain loopback listener serves /metrics, /healthz and /readyz. In a Pod
(the shipped Deployments), as controller-runtime serves them: /metrics over HTTPS to
authenticated, authorized callers only (``--metrics-secure``, port 8443), the probes on a
plain listener of their own (``--health-probe-port``, 8081), both on every interface, IPv4
and IPv6 (``::``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainjob import metrics_auth

DEFAULT_HOST = "127.0.0.1"
# Every interface, IPv6 and IPv4 (one dual-stack socket); IPv4 alone without IPv6.
EVERY_INTERFACE = "::"
SECURE_METRICS_PORT = 8443
HEALTH_PROBE_PORT = 8081

# Setting -> the flag that sets it, for messages.
FLAGS = {
    "metrics_host": "--metrics-host",
    "metrics_port": "--metrics-port",
    "metrics_secure": "--metrics-secure",
    "metrics_cert_dir": "--metrics-cert-dir",
    "health_probe_host": "--health-probe-host",
    "health_probe_port": "--health-probe-port",
}


@dataclass(frozen=True)
class Listeners:
    """Resolved settings (``resolve``): ``health_probe_port`` None means the probes are
    served beside plain /metrics."""

    metrics_host: str = DEFAULT_HOST
    metrics_port: int = 8080
    metrics_secure: bool = False
    metrics_cert_dir: Path | None = None
    health_probe_host: str | None = None
    health_probe_port: int | None = None

    @property
    def probes_apart(self) -> bool:
        return self.health_probe_port is not None


def resolve(*, plain_metrics_port: int, metrics_host: str | None = None,
            metrics_port: int | None = None, metrics_secure: bool | None = False,
            metrics_cert_dir: Path | str | None = None, health_probe_host: str | None = None,
            health_probe_port: int | None = None,
            names: Mapping[str, str] = FLAGS) -> Listeners:
    """The listeners these settings give (None: not given), or ValueError naming the
    settings (as ``names`` calls them) that contradict each other."""
    secure = bool(metrics_secure)
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
        health_probe_port=health_probe_port)


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
                       f"{metrics_auth.ALLOWED_TTL_SECONDS:g} s ({metrics_auth.REFUSED_TTL_SECONDS:g} s "
                       "for a refusal). The process's own identity needs create on "
                       "tokenreviews and subjectaccessreviews. /healthz and /readyz move to "
                       "--health-probe-port (default: off, plain HTTP, for runs by hand)")
    group.add_argument("--metrics-cert-dir", metavar="DIR",
                       help="directory holding tls.crt and tls.key for --metrics-secure, "
                       "read again whenever they change (default: a self-signed certificate "
                       "made at start and kept in memory; scrapers then skip verification)")
    group.add_argument("--health-probe-host", metavar="HOST",
                       help="address the probe listener binds to (default: --metrics-host's)")
    group.add_argument("--health-probe-port", type=port, metavar="PORT",
                       help="port of a plain HTTP listener of their own for /healthz and "
                       "/readyz, never authenticated (default: none, they are served beside "
                       f"/metrics; {HEALTH_PROBE_PORT} with --metrics-secure; 0 = any free "
                       "port)")


def from_args(args: argparse.Namespace, plain_metrics_port: int) -> Listeners:
    """``resolve`` of the flags ``add_arguments`` added."""
    return resolve(plain_metrics_port=plain_metrics_port, metrics_host=args.metrics_host,
                   metrics_port=args.metrics_port, metrics_secure=args.metrics_secure,
                   metrics_cert_dir=args.metrics_cert_dir,
                   health_probe_host=args.health_probe_host,
                   health_probe_port=args.health_probe_port)
