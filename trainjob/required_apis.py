"""The custom resources a component needs on its cluster, checked at start, so that a
missing CRD is named with the command that installs it instead of ending in a cache that
never syncs."""

from __future__ import annotations

from dataclasses import dataclass

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit.kubeclient import ClusterUnusable, describe_error
from trainjob import constants as c


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    install: str  # how a user installs it

    @property
    def name(self) -> str:
        return f"{self.plural}.{self.group}/{self.version}"


INSTALL_TRAINER_CRDS = "kubectl apply -k manifests/crds (or Kubeflow Trainer's CRDs)"
INSTALL_MULTIKUEUE_CRDS = "kubectl apply -k manifests/multikueue-crds (or install Kueue)"
INSTALL_JOBSET = ("kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/"
                  "releases/download/v0.12.0/manifests.yaml")

TRAINJOBS = Resource(c.TRAINER_GROUP, c.TRAINER_VERSION, c.TRAINJOBS, INSTALL_TRAINER_CRDS)
TRAININGRUNTIMES = Resource(c.TRAINER_GROUP, c.TRAINER_VERSION, c.TRAININGRUNTIMES,
                            INSTALL_TRAINER_CRDS)
CLUSTERTRAININGRUNTIMES = Resource(c.TRAINER_GROUP, c.TRAINER_VERSION,
                                   c.CLUSTERTRAININGRUNTIMES, INSTALL_TRAINER_CRDS)
MULTIKUEUECLUSTERS = Resource(c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECLUSTERS,
                              INSTALL_MULTIKUEUE_CRDS)
MULTIKUEUECONFIGS = Resource(c.KUEUE_GROUP, c.KUEUE_VERSION, c.MULTIKUEUECONFIGS,
                             INSTALL_MULTIKUEUE_CRDS)
JOBSETS = Resource(c.JOBSET_GROUP, c.JOBSET_VERSION, c.JOBSETS, INSTALL_JOBSET)


class Unreachable(ClusterUnusable):
    def __init__(self, cluster: str, host: str, err: BaseException):
        # urllib3 wraps the socket's error (connection refused, name unknown, timeout) in
        # its retry error: that error is the one to name.
        cause = getattr(err, "reason", None) or err
        super().__init__(f"cannot reach the {cluster} cluster's API server at {host}: "
                         f"{describe_error(cause)}")


class MissingResources(ClusterUnusable):
    def __init__(self, cluster: str, missing: list[Resource]):
        self.missing = missing
        commands = list(dict.fromkeys(resource.install for resource in missing))
        super().__init__(
            f"the {cluster} cluster does not serve "
            + ", ".join(resource.name for resource in missing)
            + "; install the CRDs with: " + "; ".join(commands))


def missing(api: client.ApiClient, wanted: list[Resource]) -> list[Resource]:
    """Those of ``wanted`` the apiserver does not serve (one discovery request per
    group/version)."""
    served: dict[tuple[str, str], set[str]] = {}
    for group, version in dict.fromkeys((r.group, r.version) for r in wanted):
        try:
            found = client.CustomObjectsApi(api).get_api_resources(group, version)
            served[(group, version)] = {r.name for r in found.resources or []}
        except ApiException as err:
            if err.status != 404:
                raise
            served[(group, version)] = set()
    return [r for r in wanted if r.plural not in served[(r.group, r.version)]]


def require(api: client.ApiClient, cluster: str, wanted: list[Resource]) -> None:
    """Raise ``MissingResources`` naming what is missing and how to install it, or
    ``Unreachable`` when the API server does not answer."""
    try:
        absent = missing(api, wanted)
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise Unreachable(cluster, api.configuration.host, err) from err
    if absent:
        raise MissingResources(cluster, absent)
