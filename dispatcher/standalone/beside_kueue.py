"""A standalone dispatcher beside Kueue on the manager cluster: whether Kueue runs there,
how it is configured, and which TrainJobs it manages, so the dispatcher never competes
with it (the reconciler leaves those jobs to Kueue). Kueue mode reads the same
configuration to tell whether Kueue waits for this dispatcher (``--mode kueue`` idles
otherwise):

* **Kueue runs on the manager** when the manager serves Kueue's Workload API
  (``kueue.x-k8s.io/v1beta2`` ``workloads``): only a Kueue installation brings that CRD (the
  project's bundled MultiKueue CRDs for managers without Kueue do not). An installed Kueue
  whose controller is down still owns its jobs; they wait for it, not for us.
* **A TrainJob is Kueue's** (when Kueue runs) if it carries the ``kueue.x-k8s.io/queue-name``
  label (what a user sets to queue it; Kueue's webhook also sets it from a namespace's
  default LocalQueue) or names ``kueue.x-k8s.io/prebuilt-workload-name`` (a copy Kueue
  made; an annotation since Kueue 0.19, a label before), or if Kueue's Configuration has
  ``manageJobsWithoutQueueName: true`` (then every TrainJob is; its namespace selector is
  not second-guessed). Kueue's ``kueue.x-k8s.io/manager`` runtime patch says nothing: its
  webhook adds it to every TrainJob, queued or not.
* **Kueue's configuration** is read from the ConfigMap its release installs
  (``kueue-manager-config`` in Kueue's namespace, key ``controller_manager_config.yaml``);
  without one, Kueue's defaults apply (origin ``multikueue``, the AllAtOnce dispatcher).
* **Origins.** A standalone dispatcher must label its copies with an origin other than
  Kueue's (``origin_conflict``); in kueue mode Kueue makes the copies and the dispatcher
  follows them by Kueue's origin, so there it must be Kueue's (``origin_mismatch``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dispatcher.config import KUEUE_RECHECK_SECONDS
from trainjob import constants as c

log = logging.getLogger(__name__)

WORKLOADS = "workloads"
CONFIG_MAP = "kueue-manager-config"
CONFIG_KEY = "controller_manager_config.yaml"
KUEUE_DEFAULT_ORIGIN = c.KUEUE_DEFAULT_ORIGIN
KUEUE_DEFAULT_DISPATCHER = "kueue.x-k8s.io/multikueue-dispatcher-all-at-once"


def kueue_claim(job: dict, manage_without_queue_name: bool = False) -> str | None:
    """Why Kueue manages ``job`` (a TrainJob), or None; meaningful only where Kueue runs."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(c.KUEUE_QUEUE_NAME_LABEL):
        return f"it has the label {c.KUEUE_QUEUE_NAME_LABEL}={labels[c.KUEUE_QUEUE_NAME_LABEL]}"
    if _prebuilt(meta):
        return f"it names {c.KUEUE_PREBUILT_WORKLOAD_LABEL} (a copy Kueue made)"
    if manage_without_queue_name:
        return "Kueue's Configuration has manageJobsWithoutQueueName: true"
    return None


def _prebuilt(meta: dict) -> bool:
    return any((meta.get(where) or {}).get(c.KUEUE_PREBUILT_WORKLOAD_LABEL)
               for where in ("labels", "annotations"))


@dataclass(frozen=True)
class KueueConfiguration:
    """What the dispatcher needs of Kueue's Configuration, and where it came from."""

    origin: str
    dispatcher_name: str
    source: str
    manage_without_queue_name: bool = False


class KueueOnManager:
    """Whether the manager runs Kueue (re-checked every ``recheck`` seconds) and its
    configuration."""

    def __init__(self, api: client.ApiClient, namespace: str,
                 recheck: float = KUEUE_RECHECK_SECONDS):
        self.api = api
        self.namespace = namespace
        self.recheck = recheck
        self._lock = threading.Lock()
        self._installed: bool | None = None
        self._checked = 0.0
        self._configuration: tuple[float, KueueConfiguration] | None = None

    def claim(self, job: dict) -> str | None:
        """Why Kueue, running on the manager, manages ``job``; None when it does not (or
        Kueue does not run)."""
        if not self.installed():
            return None
        meta = job.get("metadata") or {}
        if (meta.get("labels") or {}).get(c.KUEUE_QUEUE_NAME_LABEL) or _prebuilt(meta):
            return kueue_claim(job)
        return kueue_claim(job, self.cached_configuration().manage_without_queue_name)

    def cached_configuration(self) -> KueueConfiguration:
        """``configuration()``, read again at most every ``recheck`` seconds; an unreadable
        ConfigMap keeps the last answer (Kueue's defaults when there is none)."""
        with self._lock:
            if self._configuration and time.monotonic() - self._configuration[0] < self.recheck:
                return self._configuration[1]
        try:
            config = self.configuration()
        except Exception as err:  # noqa: BLE001 - keep deciding on the last known answer
            log.warning("cannot read Kueue's configuration: %s", err)
            config = (self._configuration[1] if self._configuration else KueueConfiguration(
                KUEUE_DEFAULT_ORIGIN, KUEUE_DEFAULT_DISPATCHER, "Kueue's defaults"))
        with self._lock:
            self._configuration = (time.monotonic(), config)
        return config

    def installed(self) -> bool:
        """The manager serves Kueue's Workload API. A failed check keeps the last answer
        (and assumes Kueue when there is none: claiming a job Kueue runs is the worse
        mistake)."""
        with self._lock:
            if self._installed is not None and time.monotonic() - self._checked < self.recheck:
                return self._installed
            try:
                resources = client.CustomObjectsApi(self.api).get_api_resources(
                    c.KUEUE_GROUP, c.KUEUE_VERSION)
                found = any(r.name == WORKLOADS for r in resources.resources or [])
            except ApiException as err:
                found = False if err.status == 404 else (
                    self._installed if self._installed is not None else True)
            except Exception:  # noqa: BLE001 - unreachable manager: keep the last answer
                found = self._installed if self._installed is not None else True
            if found != self._installed:
                log.info("Kueue %s on the manager (Workload API %s)",
                         "runs" if found else "does not run", "served" if found else "absent")
            self._installed, self._checked = found, time.monotonic()
            return found

    def configuration(self) -> KueueConfiguration:
        """Kueue's Configuration from its ConfigMap, or Kueue's defaults."""
        source = f"ConfigMap {self.namespace}/{CONFIG_MAP}"
        try:
            config_map = client.CoreV1Api(self.api).read_namespaced_config_map(
                CONFIG_MAP, self.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            return KueueConfiguration(KUEUE_DEFAULT_ORIGIN, KUEUE_DEFAULT_DISPATCHER,
                                      f"Kueue's defaults ({source} not found)")
        try:
            document = yaml.safe_load((config_map.data or {}).get(CONFIG_KEY) or "") or {}
        except yaml.YAMLError:
            document = {}
        document = document if isinstance(document, dict) else {}
        multikueue = document.get("multiKueue") or {}
        return KueueConfiguration(multikueue.get("origin") or KUEUE_DEFAULT_ORIGIN,
                                  multikueue.get("dispatcherName") or KUEUE_DEFAULT_DISPATCHER,
                                  f"{source} key {CONFIG_KEY}",
                                  bool(document.get("manageJobsWithoutQueueName")))


def origin_conflict(kueue: KueueOnManager, origin: str) -> str | None:
    """Why the dispatcher must not create remote copies labelled with ``origin``: Kueue runs
    on the manager with the same origin, so each would take the other's copies for its
    own. None when there is no conflict."""
    if not kueue.installed():
        return None
    config = kueue.configuration()
    if config.origin != origin:
        return None
    return (f"--origin {origin}: Kueue runs on this manager (its Workload API is served) and "
            f"labels its remote copies {c.MULTIKUEUE_ORIGIN_LABEL}={config.origin} "
            f"(multiKueue.origin from {config.source}); choose another --origin for this "
            "dispatcher, or run it as Kueue's external dispatcher (--mode kueue)")


def origin_mismatch(kueue: KueueOnManager, origin: str) -> str | None:
    """Kueue mode: why ``origin`` will not do. Kueue makes the remote copies there, labelled
    with its own origin, and the dispatcher follows those copies (a finished or deleted copy
    frees the room its job held) by that label. None when the origins agree, or when Kueue
    does not run (kueue mode then idles)."""
    if not kueue.installed():
        return None
    config = kueue.configuration()
    if config.origin == origin:
        return None
    return (f"--origin {origin}: in kueue mode the origin must be Kueue's, and Kueue labels "
            f"its remote copies {c.MULTIKUEUE_ORIGIN_LABEL}={config.origin} (multiKueue.origin "
            f"from {config.source}); start with --origin {config.origin} (the Lease is then "
            f"trainjob-dispatcher-{config.origin}: name it in the dispatcher's Role)")
