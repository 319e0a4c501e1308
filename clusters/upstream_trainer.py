"""Upstream Kubeflow Trainer beside this project: its CRDs and shipped objects, read from
the Trainer Go module (the version ``clusters/binaries.py`` pins) whenever they are needed.
Nothing of upstream's is copied into this repository.
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from clusters import binaries as provisioning

COMPONENT = "trainer-controller-manager"
# Paths inside the Trainer module.
CRDS_DIR = "manifests/base/crds"
RUNTIMES_DIR = "manifests/base/runtimes"


def module_dir() -> Path:
    return provisioning.module_dir(COMPONENT)


def documents(relative: str) -> list[dict]:
    """Every YAML document of one file in the Trainer module."""
    path = module_dir() / relative
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def crds() -> list[dict]:
    """Upstream's TrainJob, TrainingRuntime and ClusterTrainingRuntime CRDs."""
    found = []
    for path in sorted((module_dir() / CRDS_DIR).glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        found += [d for d in yaml.safe_load_all(path.read_text())
                  if d and d.get("kind") == "CustomResourceDefinition"]
    if not found:
        raise FileNotFoundError(f"no CustomResourceDefinition under {module_dir() / CRDS_DIR}")
    return found


def runtime(file_name: str) -> dict:
    """One of upstream's shipped runtimes, e.g. ``torch_distributed.yaml``."""
    (found,) = [d for d in documents(f"{RUNTIMES_DIR}/{file_name}")
                if d.get("kind") in ("ClusterTrainingRuntime", "TrainingRuntime")]
    return found


# The coscheduling plugin's PodGroup CRD, from the scheduler-plugins module the Trainer
# controller is built against.
SCHEDULER_PLUGINS = "sigs.k8s.io/scheduler-plugins"
PODGROUP_CRD = "config/crd/bases/scheduling.x-k8s.io_podgroups.yaml"


def coscheduling_crds() -> list[dict]:
    """The scheduler-plugins PodGroup CRD (``scheduling.x-k8s.io``)."""
    path = provisioning.dependency_dir(COMPONENT, SCHEDULER_PLUGINS) / PODGROUP_CRD
    return [d for d in yaml.safe_load_all(path.read_text())
            if d and d.get("kind") == "CustomResourceDefinition"]


# Volcano's PodGroup API, at the version the Trainer controller is built against. Volcano
# publishes the CRD only in its own repository (not served by the module proxy), so it is
# generated from these types with controller-gen, as Volcano's own build does.
VOLCANO_APIS = "volcano.sh/apis"
VOLCANO_SCHEDULING = "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
VOLCANO_PODGROUPS = "podgroups.scheduling.volcano.sh"


@functools.cache
def volcano_crds() -> list[dict]:
    """Volcano's PodGroup CRD (``scheduling.volcano.sh/v1beta1``)."""
    directory = provisioning.generated_crds(COMPONENT, VOLCANO_APIS, VOLCANO_SCHEDULING)
    found = [d for path in sorted(directory.glob("*.yaml"))
             for d in yaml.safe_load_all(path.read_text())
             if d and d.get("kind") == "CustomResourceDefinition"
             and d["metadata"]["name"] == VOLCANO_PODGROUPS]
    if not found:
        raise FileNotFoundError(f"no {VOLCANO_PODGROUPS} CRD was generated in {directory}")
    return found
