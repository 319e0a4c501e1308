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
