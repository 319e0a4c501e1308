"""Kubernetes API clients built from a kubeconfig file or the in-cluster service account."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client, config


def api_client(kubeconfig: str | Path | None = None, context: str | None = None) -> client.ApiClient:
    """An ``ApiClient`` for ``kubeconfig`` (in-cluster configuration when it is None)."""
    if kubeconfig is None:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    return config.new_client_from_config(config_file=str(kubeconfig), context=context)


APPLY_PATCH = "application/apply-patch+yaml"


def apply_custom_object(api: client.ApiClient, group: str, version: str, plural: str,
                        body: dict, field_manager: str, *, force: bool = True) -> dict:
    """Server-side apply of a custom object (namespaced when ``body`` names a namespace);
    returns the object as the server stored it."""
    import json

    custom = client.CustomObjectsApi(api)
    meta = body["metadata"]
    common = dict(field_manager=field_manager, force=force, _content_type=APPLY_PATCH,
                  _preload_content=False)
    # The generated client does not decode responses to apply patches; read them raw.
    if meta.get("namespace"):
        response = custom.patch_namespaced_custom_object(
            group, version, meta["namespace"], plural, meta["name"], body, **common)
    else:
        response = custom.patch_cluster_custom_object(
            group, version, plural, meta["name"], body, **common)
    return json.loads(response.data)
