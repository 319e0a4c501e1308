"""Waiting on kind clusters: a probe says what is still wrong (``None`` once nothing is),
and the wait gives up at its deadline with the probe's last answer, so a slow or stuck
step says what it waited for and what it saw."""

from __future__ import annotations

import time
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

Probe = Callable[[], "str | None"]


def wait_for(what: str, probe: Probe, deadline: float, interval: float = 1.0) -> None:
    """Call ``probe`` until it answers ``None``; at ``deadline`` (a ``time.monotonic()``
    value) raise TimeoutError naming ``what`` and the last problem seen. A probe that
    raises counts as a problem (an apiserver restarting, an object not there yet); when the
    last call raised, the message also gives the last answer the probe did return, which
    says how far the cluster got."""
    answered = None
    while True:
        try:
            problem = probe()
            answered = problem
        except Exception as err:  # noqa: BLE001 - reported if it is the last answer
            problem = f"{type(err).__name__}: {err}"[:500]
        if problem is None:
            return
        if time.monotonic() >= deadline:
            earlier = (f"; the last answer before that: {answered}"
                       if answered is not None and answered != problem else "")
            raise TimeoutError(f"{what}: still not ready at the deadline: {problem}{earlier}")
        time.sleep(interval)


def deployment_problem(api: client.ApiClient, namespace: str, name: str) -> str | None:
    """Why Deployment ``namespace/name`` is not yet rolled out (None once every replica is
    updated and ready, and none of an older template is left), with its pods' states."""
    try:
        deployment = client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
    except ApiException as err:
        return f"deployment {namespace}/{name}: {err.status} {err.reason}"
    want = deployment.spec.replicas if deployment.spec.replicas is not None else 1
    status = deployment.status
    if (status and (status.observed_generation or 0) >= deployment.metadata.generation
            and (status.updated_replicas or 0) == want
            and (status.ready_replicas or 0) == want
            and (status.replicas or 0) == want):
        return None
    selector = ",".join(f"{k}={v}" for k, v in
                        (deployment.spec.selector.match_labels or {}).items())
    states = []
    for pod in client.CoreV1Api(api).list_namespaced_pod(namespace,
                                                         label_selector=selector).items:
        waiting = [s.state.waiting.reason for s in pod.status.container_statuses or []
                   if s.state and s.state.waiting]
        states.append(f"{pod.metadata.name} {pod.status.phase}"
                      + (f" ({', '.join(waiting)})" if waiting else ""))
    seen = (f"{status.ready_replicas or 0} ready, {status.updated_replicas or 0} updated "
            f"of {want}" if status else "no status yet")
    return (f"deployment {namespace}/{name} not rolled out ({seen}); pods: "
            f"{'; '.join(states) or 'none'}")
