"""Installing the project's CustomResourceDefinitions and waiting until they serve."""

from __future__ import annotations

import os
import time
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

FIELD_MANAGER = "trainjob-clusters"


def manifests_dir() -> Path:
    """The project's ``manifests/`` folder (``CLUSTERS_MANIFESTS_DIR`` overrides)."""
    if explicit := os.environ.get("CLUSTERS_MANIFESTS_DIR"):
        return Path(explicit)
    return Path(__file__).resolve().parent.parent / "manifests"


def crd_dirs(role: str) -> list[Path]:
    """Every cluster gets the TrainJob and runtime CRDs (a worker also gets upstream JobSet's,
    read from its module); the manager also gets the MultiKueue registration CRDs (a manager
    running real Kueue brings its own instead)."""
    dirs = [manifests_dir() / "crds"]
    if role == "manager":
        dirs.append(manifests_dir() / "multikueue-crds")
    return dirs


def load_crds(dirs: list[Path]) -> list[dict]:
    docs = []
    for directory in dirs:
        for path in sorted(directory.glob("*.yaml")):
            if path.name == "kustomization.yaml":
                continue
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    docs.append(doc)
    if not docs:
        raise FileNotFoundError(f"no CustomResourceDefinition found under {dirs}")
    return docs


def install_crds(api_client: client.ApiClient, crds: list[dict], timeout: float = 60) -> None:
    """Server-side apply every CRD, then wait until each is Established and its resource
    answers a list (discovery can trail the Established condition by a moment)."""
    ext = client.ApiextensionsV1Api(api_client)
    for crd in crds:
        ext.patch_custom_resource_definition(
            crd["metadata"]["name"], crd, field_manager=FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml",
        )
    custom = client.CustomObjectsApi(api_client)
    deadline = time.monotonic() + timeout
    for crd in crds:
        name = crd["metadata"]["name"]
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        version = next(v["name"] for v in crd["spec"]["versions"] if v.get("served", True))
        last_seen = "not observed yet"
        while True:
            state = ext.read_custom_resource_definition(name)
            conditions = {c.type: c for c in (state.status.conditions or [])}
            established = conditions.get("Established")
            if established is not None and established.status == "True":
                try:
                    custom.list_cluster_custom_object(group, version, plural, limit=1)
                    break
                except ApiException as err:
                    last_seen = f"Established, but listing {plural} answered {err.status}"
            elif established is not None:
                last_seen = f"Established={established.status} ({established.message})"
            names = conditions.get("NamesAccepted")
            if names is not None and names.status == "False":
                raise RuntimeError(f"CRD {name}: names not accepted: {names.message}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"CRD {name} not serving after {timeout:.0f}s: {last_seen}")
            time.sleep(0.1)
