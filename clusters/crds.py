"""Installing the project's CustomResourceDefinitions and waiting until they serve."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters.machine_load import Deadline

FIELD_MANAGER = "trainjob-clusters"

# Which TrainJob/runtime CRDs a cluster serves: the project's (manifests/crds) or upstream
# Trainer's, read from its Go module. The operator and the dispatcher work with either.
PROJECT = "project"
UPSTREAM = "upstream"
TRAINER_CRD_FLAVOURS = (PROJECT, UPSTREAM)


def manifests_dir() -> Path:
    """The project's ``manifests/`` folder (``CLUSTERS_MANIFESTS_DIR`` overrides)."""
    if explicit := os.environ.get("CLUSTERS_MANIFESTS_DIR"):
        return Path(explicit)
    return Path(__file__).resolve().parent.parent / "manifests"


def crd_dirs(role: str, with_kueue: bool = False) -> list[Path]:
    """Every cluster gets the TrainJob and runtime CRDs (a worker also gets upstream JobSet's,
    read from its module); the manager also gets the MultiKueue registration CRDs, unless
    it runs real Kueue (``with_kueue``), which brings its own."""
    dirs = [manifests_dir() / "crds"]
    if role == "manager" and not with_kueue:
        dirs.append(manifests_dir() / "multikueue-crds")
    return dirs


def cluster_crds(role: str, trainer_flavour: str = PROJECT,
                 with_kueue: bool = False) -> list[dict]:
    """The CRDs a cluster of ``role`` gets, with the TrainJob and runtime CRDs of
    ``trainer_flavour`` (Kueue's own CRDs are installed with Kueue: ``clusters.kueue``)."""
    if trainer_flavour not in TRAINER_CRD_FLAVOURS:
        raise ValueError(f"unknown Trainer CRD flavour {trainer_flavour!r}: "
                         f"use {' or '.join(TRAINER_CRD_FLAVOURS)}")
    dirs = crd_dirs(role, with_kueue)
    if trainer_flavour == PROJECT:
        return load_crds(dirs)
    from clusters import upstream_trainer

    others = [d for d in dirs if d != manifests_dir() / "crds"]
    return upstream_trainer.crds() + (load_crds(others) if others else [])


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
    # Some CRDs are megabytes (Kueue's Workload embeds pod templates): the answers are read
    # as raw JSON, never turned into client models, which takes seconds each.
    for crd in crds:
        ext.patch_custom_resource_definition(
            crd["metadata"]["name"], crd, field_manager=FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml", _preload_content=False,
        ).read()
    custom = client.CustomObjectsApi(api_client)
    # What an idle machine needs; a busy one stretches it by its load.
    deadline = Deadline(timeout)
    for crd in crds:
        name = crd["metadata"]["name"]
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        # The stored version: listing it needs no conversion webhook (whose server may not
        # run yet).
        versions = crd["spec"]["versions"]
        version = next((v["name"] for v in versions if v.get("storage")), versions[0]["name"])
        last_seen = "not observed yet"
        while True:
            state = json.loads(ext.read_custom_resource_definition(
                name, _preload_content=False).read())
            conditions = {c["type"]: c for c in (state.get("status") or {}).get("conditions") or []}
            established = conditions.get("Established")
            if established is not None and established["status"] == "True":
                try:
                    custom.list_cluster_custom_object(group, version, plural, limit=1)
                    break
                except ApiException as err:
                    last_seen = f"Established, but listing {plural} answered {err.status}"
            elif established is not None:
                last_seen = f"Established={established['status']} ({established.get('message')})"
            names = conditions.get("NamesAccepted")
            if names is not None and names["status"] == "False":
                raise RuntimeError(f"CRD {name}: names not accepted: {names.get('message')}")
            if deadline.passed():
                raise TimeoutError(f"CRD {name} not serving after {deadline.waited()}: "
                                   f"{last_seen}")
            time.sleep(0.1)


def wait_schema_served(api_client: client.ApiClient, crd: dict, timeout: float = 30) -> None:
    """Wait until the apiserver serves ``crd``'s current schema (after replacing a CRD of the
    same name: Established stays True throughout, so it says nothing about which schema is
    live). The OpenAPI v3 document the apiserver publishes for the group-version is compared
    with the CRD's: the same spec fields, and the same default for each."""
    group = crd["spec"]["group"]
    kind = crd["spec"]["names"]["kind"]
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    wanted = _spec_fingerprint(version["schema"]["openAPIV3Schema"])
    deadline = Deadline(timeout)
    seen: object = "not observed yet"
    while True:
        try:
            seen = _spec_fingerprint(_served_schema(api_client, group, version["name"], kind))
        except (ApiException, KeyError, StopIteration, ValueError) as err:
            seen = f"no schema yet ({type(err).__name__}: {err})"
        if seen == wanted:
            return
        if deadline.passed():
            raise TimeoutError(f"CRD {crd['metadata']['name']}: schema not served after "
                               f"{deadline.waited()}; expected spec fields and defaults {wanted}, "
                               f"saw {seen}")
        time.sleep(0.1)


def _spec_fingerprint(schema: dict) -> dict:
    properties = ((schema.get("properties") or {}).get("spec") or {}).get("properties") or {}
    return {name: (prop or {}).get("default") for name, prop in sorted(properties.items())}


def _served_schema(api_client: client.ApiClient, group: str, version: str, kind: str) -> dict:
    def get(path: str) -> dict:
        method, url, headers, _, _ = api_client.param_serialize(
            "GET", path, header_params={"Accept": "application/json"})
        response = api_client.call_api(method, url, header_params=headers)
        response.read()
        if response.status != 200:
            raise ValueError(f"GET {path} answered {response.status}")
        return json.loads(response.data)

    document = get(f"/openapi/v3/apis/{group}/{version}")
    schemas = document["components"]["schemas"]
    return next(s for s in schemas.values()
                if any(g.get("group") == group and g.get("kind") == kind
                       for g in s.get("x-kubernetes-group-version-kind") or []))
