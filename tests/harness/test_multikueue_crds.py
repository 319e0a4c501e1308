"""The optional MultiKueue CRDs bundled for managers without Kueue have the schema Kueue
serves for ``kueue.x-k8s.io/v1beta2`` (read from the Kueue module the harness provisions):
the same fields, validation, list semantics and printer columns; only descriptions are the
project's own. A real apiserver then enforces the rules that matter to a user."""

from __future__ import annotations

import json

import pytest
import yaml

from clusters import kueue
from clusters.crds import manifests_dir

NAMES = ("multikueueclusters.kueue.x-k8s.io", "multikueueconfigs.kueue.x-k8s.io")
KUEUE = ("kueue.x-k8s.io", "v1beta2")


def _without_descriptions(value):
    if isinstance(value, dict):
        return {k: _without_descriptions(v) for k, v in value.items() if k != "description"}
    if isinstance(value, list):
        return [_without_descriptions(v) for v in value]
    return value


def _v1beta2(crd: dict) -> dict:
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta2")
    return _without_descriptions({k: version.get(k) for k in (
        "schema", "additionalPrinterColumns", "subresources", "served")})


def _kueue_crd(name: str) -> dict:
    # Kueue's files are named <group>_<plural>.yaml (only this one is parsed: others are
    # megabytes).
    plural, group = name.split(".", 1)
    path = kueue.module_dir() / kueue.CRDS_DIR / f"{group}_{plural}.yaml"
    found = [d for d in yaml.safe_load_all(path.read_text()) if d
             and d["metadata"]["name"] == name]
    assert found, f"expected {name} in {path}"
    return found[0]


def _bundled_crd(name: str) -> dict:
    for path in (manifests_dir() / "multikueue-crds").glob("*.yaml"):
        document = yaml.safe_load(path.read_text())
        if document and document.get("metadata", {}).get("name") == name:
            return document
    raise AssertionError(f"expected {name} in manifests/multikueue-crds")


@pytest.mark.parametrize("name", NAMES)
def test_bundled_crd_has_kueues_v1beta2_schema(name):
    ours, theirs = _v1beta2(_bundled_crd(name)), _v1beta2(_kueue_crd(name))
    assert ours == theirs, (f"{name}: expected Kueue's v1beta2 schema; ours:\n"
                            f"{json.dumps(ours, indent=1, sort_keys=True)}\nKueue's:\n"
                            f"{json.dumps(theirs, indent=1, sort_keys=True)}")
    assert _bundled_crd(name)["spec"]["names"] == _kueue_crd(name)["spec"]["names"]
    assert _bundled_crd(name)["spec"]["scope"] == _kueue_crd(name)["spec"]["scope"]
