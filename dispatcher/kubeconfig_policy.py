"""Which worker kubeconfigs the dispatcher accepts, following MultiKueue's rules.

A worker kubeconfig usually arrives in a Secret that anyone able to create Secrets in the
dispatcher's namespace can write, so it must not make the dispatcher read local files,
run programs or talk to an unverified server. Refused, each with a reason:
insecure-skip-tls-verify, token/CA/certificate/key *files*, basic auth, exec and
auth-provider plugins, and a missing or empty server.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from trainjob.yaml_errors import yaml_error_position

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


def check_kubeconfig(text: str | bytes) -> KubeconfigVerdict:
    """Parse ``text`` and apply the rules to the context it would use."""
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
    cluster = clusters.get(context.get("cluster"))
    if cluster is None:
        return _bad(f"context {current!r} names cluster {context.get('cluster')!r}, "
                    "which is not defined")
    if not cluster.get("server"):
        return _bad(f"cluster {context.get('cluster')!r} has an empty server")
    if cluster.get("insecure-skip-tls-verify"):
        return _insecure(f"cluster {context.get('cluster')!r} sets insecure-skip-tls-verify")
    for field in _FILE_FIELDS_CLUSTER:
        if cluster.get(field):
            return _insecure(f"cluster {context.get('cluster')!r} reads {field} from a file; "
                             f"embed it as {field}-data")
    user = users.get(context.get("user"), {}) if context.get("user") else {}
    if context.get("user") and context.get("user") not in users:
        return _bad(f"context {current!r} names user {context.get('user')!r}, "
                    "which is not defined")
    for field in _FILE_FIELDS_USER:
        if user.get(field):
            return _insecure(f"user {context.get('user')!r} reads {field} from a file")
    if user.get("username") or user.get("password"):
        return _insecure(f"user {context.get('user')!r} uses basic authentication")
    if user.get("exec"):
        return _insecure(f"user {context.get('user')!r} runs an exec credential plugin")
    if user.get("auth-provider"):
        return _insecure(f"user {context.get('user')!r} uses an auth-provider plugin")
    return KubeconfigVerdict(True, config=config)
