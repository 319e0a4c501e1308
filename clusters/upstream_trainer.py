"""Upstream Kubeflow Trainer beside this project: its CRDs and shipped objects, read from
the Trainer Go module (the version ``clusters/binaries.py`` pins) whenever they are needed.
Nothing of upstream's is copied into this repository.
"""

from __future__ import annotations

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
