"""Which worker kubeconfigs the dispatcher accepts, following MultiKueue's rules.

A worker kubeconfig usually arrives in a Secret that anyone able to create Secrets in the
dispatcher's namespace can write, so it must not make the dispatcher read local files,
run programs or talk to an unverified server. Refused, each with a reason,
in any cluster or user the file defines (not only the current context's, as Kueue checks):
insecure-skip-tls-verify, token/CA/certificate/key *files*, basic auth, exec and
auth-provider plugins, a missing or empty server, and a server whose host is neither an IP
address nor a DNS name.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import yaml

from controller_kit.yaml_errors import yaml_error_position

BAD_KUBECONFIG = "BadKubeConfig"
INSECURE_KUBECONFIG = "InsecureKubeConfig"

_FILE_FIELDS_CLUSTER = ("certificate-authority",)
_FILE_FIELDS_USER = ("tokenFile", "client-certificate", "client-key")


@dataclass(frozen=True)
class KubeconfigVerdict:
    ok: bool
    reason: str = ""  # BadKubeConfig or InsecureKubeConfig when not ok
    message: str = ""
    config: dict | None = None


def _bad(message: str) -> KubeconfigVerdict:
    return KubeconfigVerdict(False, BAD_KUBECONFIG, message)


def _insecure(message: str) -> KubeconfigVerdict:
    return KubeconfigVerdict(False, INSECURE_KUBECONFIG, message)


def _cluster_refusal(name: str, cluster: dict) -> KubeconfigVerdict | None:
    server = cluster.get("server") or ""
    if not server:
        return _bad(f"cluster {name!r} has an empty server")
    if not _trusted_host(server):
        return _insecure(f"cluster {name!r} server {server!r}: the host is neither an IP "
                         "address nor a DNS name")
    if cluster.get("insecure-skip-tls-verify"):
        return _insecure(f"cluster {name!r} sets insecure-skip-tls-verify")
    for field in _FILE_FIELDS_CLUSTER:
        if cluster.get(field):
            return _insecure(f"cluster {name!r} reads {field} from a file; "
                             f"embed it as {field}-data")
    return None


def _user_refusal(name: str, user: dict) -> KubeconfigVerdict | None:
    for field in _FILE_FIELDS_USER:
        if user.get(field):
            return _insecure(f"user {name!r} reads {field} from a file")
    if user.get("username") or user.get("password"):
        return _insecure(f"user {name!r} uses basic authentication")
    if user.get("exec"):
        return _insecure(f"user {name!r} runs an exec credential plugin")
    if user.get("auth-provider"):
        return _insecure(f"user {name!r} uses an auth-provider plugin")
    return None


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _trusted_host(server: str) -> bool:
    """The server URL's host is an IP address or a DNS subdomain (Kueue's rule)."""
    try:
        host = urlsplit(server).hostname or ""
    except ValueError:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return len(host) <= 253 and bool(_DNS_SUBDOMAIN.match(host.lower()))


def check_kubeconfig(text: str | bytes) -> KubeconfigVerdict:
    """Parse ``text``: its current context must resolve, and every cluster and user in it
    must pass the rules."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as err:
        return _bad(yaml_error_position(err))
    if not isinstance(config, dict):
        return _bad("not a kubeconfig: the document is not a mapping")
    contexts = {c.get("name"): c.get("context") or {} for c in config.get("contexts") or []
                if isinstance(c, dict)}
    clusters = {c.get("name"): c.get("cluster") or {} for c in config.get("clusters") or []
                if isinstance(c, dict)}
    users = {u.get("name"): u.get("user") or {} for u in config.get("users") or []
             if isinstance(u, dict)}
    current = config.get("current-context") or (next(iter(contexts)) if len(contexts) == 1
                                                 else None)
    if not current or current not in contexts:
        return _bad(f"current-context {current!r} is not one of the contexts "
                    f"{sorted(k for k in contexts if k)}")
    context = contexts[current]
    if context.get("cluster") not in clusters:
        return _bad(f"context {current!r} names cluster {context.get('cluster')!r}, "
                    "which is not defined")
    if context.get("user") and context.get("user") not in users:
        return _bad(f"context {current!r} names user {context.get('user')!r}, "
                    "which is not defined")
    # Every cluster and user in the file, not only the current context's (as Kueue does):
    # a kubeconfig is accepted or refused as a whole.
    for name, cluster in clusters.items():
        if refusal := _cluster_refusal(name, cluster):
            return refusal
    for name, user in users.items():
        if refusal := _user_refusal(name, user):
            return refusal
    return KubeconfigVerdict(True, config=config)
