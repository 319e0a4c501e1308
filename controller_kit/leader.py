"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Every candidate runs a ``LeaderElector`` with its own ``identity`` on the same Lease:

* A candidate takes the Lease when it does not exist (create; a 409 means another candidate
  won: re-read), when nobody holds it (``holderIdentity`` empty, e.g. released) or when its
  holder has not renewed it for ``leaseDurationSeconds``. That last judgement uses the local
  monotonic clock only: the time at which *this* process last saw the record change, never
  the remote ``renewTime`` against the local wall clock, so clock skew between machines does
  not matter (as in client-go).
* The leader renews every ``retry_period`` with an update (PUT) carrying the resourceVersion
  it last saw; a 409 means someone else wrote in between: it re-reads and, if the Lease is
  still its own, retries.
* A leader whose renewal has not succeeded for ``renew_deadline`` stops leading. Its term is
  measured from the moment it *sent* its last successful write, and other candidates measure
  ``leaseDurationSeconds`` from the moment they *received* that write or a later one, so with
  ``renew_deadline < lease_duration`` the old term ends before anyone else may take over:
  there are never two leaders at once (``is_leader`` checks the deadline itself, so it holds
  even while the elector thread is blocked in a request).
* A candidate that finds the Lease missing while the last holder it saw is still within its
  lease waits for that lease to run out before creating a new one; the holder itself
  re-creates it at its next renewal.
* ``stop()`` ends the term first (``on_stopped_leading``) and only then, by default, gives
  the Lease up (no holder, ``leaseDurationSeconds=1``), so a standby takes over at once
  without overlapping the old leader's work.

Callbacks run on the elector's thread and must return promptly (start or signal the real
work): while one runs, the elector does not renew. After losing a term the elector goes on
as a candidate; each term gets exactly one ``on_started_leading`` and one
``on_stopped_leading``.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from kubernetes import client
from kubernetes.client.exceptions import ApiException

if TYPE_CHECKING:
    from controller_kit.controller_metrics import LeaderMetric

log = logging.getLogger(__name__)

MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"
# client-go's wait.JitterUntil factor for the acquire loop: retries are spread over
# [retry_period, retry_period * (1 + JITTER)].
JITTER = 1.2
# The spec fields this elector writes; the rest of a Lease's spec is carried over as read.
_RECORD_FIELDS = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime",
                  "leaseTransitions")
_SPEC_FIELDS = _RECORD_FIELDS + ("preferredHolder", "strategy")
_TIME_FIELDS = ("acquireTime", "renewTime")


class LeaderElector:
    """Campaign for the Lease ``namespace/name`` as ``identity`` on a background thread;
    ``metric`` (leader_election_master_status) shows whether a term is running."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
        metric: LeaderMetric | None = None,
    ):
        if not identity:
            raise ValueError("identity must not be empty")
        if min(lease_duration, renew_deadline, retry_period) <= 0:
            raise ValueError("lease_duration, renew_deadline and retry_period must be > 0")
        if lease_duration <= renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if renew_deadline <= JITTER * retry_period:
            raise ValueError(f"renew_deadline must be greater than retry_period * {JITTER}")
        self._leases = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._on_started_leading = on_started_leading
        self._on_stopped_leading = on_stopped_leading
        # leader_election_master_status: 1 through a term, else 0 (a standby shows 0).
        self._metric = metric

        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._release_on_stop = True
        self._thread: threading.Thread | None = None
        # The Lease as last read or written (for its resourceVersion and metadata), the
        # record last seen in it and when (monotonic) that record was first seen.
        self._lease: dict | None = None
        self._observed: dict | None = None
        self._observed_at = 0.0
        # The current term: whether one is running and when it ends unless renewed.
        self._leading = False
        self._valid_until = 0.0

    # --- public -------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """Whether this elector leads right now: in a term, not stopping, and its last
        successful renewal is less than ``renew_deadline`` old."""
        with self._lock:
            return (self._leading and not self._stop.is_set()
                    and time.monotonic() < self._valid_until)

    @property
    def leader(self) -> str | None:
        """The holder in the last record observed (None when nobody holds the Lease or
        nothing was read yet)."""
        with self._lock:
            return (self._observed or {}).get("holderIdentity") or None

    @property
    def thread(self) -> threading.Thread | None:
        """The thread that campaigns and renews, once started (a manager watches it)."""
        return self._thread

    def start(self) -> LeaderElector:
        """Start campaigning on a daemon thread. An elector can be started again after
        ``stop()``."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"leader elector {self.identity} is already running")
        self._stop = threading.Event()
        self._release_on_stop = True
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"leader-elector-{self.identity}")
        self._thread.start()
        return self

    def stop(self, release: bool = True, timeout: float | None = None) -> None:
        """Stop campaigning and renewing. A running term ends (``on_stopped_leading``);
        then, with ``release``, a Lease this elector holds is given up so that a standby
        takes over at once. ``release=False`` leaves the Lease to expire, as a crashed
        process would. Waits for the elector thread (at most ``timeout``, by default long
        enough for the requests in flight), unless called from a callback."""
        self._release_on_stop = release
        self._stop.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        thread.join(self.renew_deadline * 2 + 5 if timeout is None else timeout)

    # --- the elector thread ---------------------------------------------------------------

    def _run(self) -> None:
        log.info("%s: campaigning for lease %s/%s", self.identity, self.namespace, self.name)
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                deadline = started + self.renew_deadline
                if self._try_acquire_or_renew(deadline):
                    if self._stop.is_set():
                        break  # acquired just as we were told to stop: no term
                    if time.monotonic() >= deadline:
                        continue  # too slow to lead on: renew at once, then lead
                    self._begin_term(started)
                    self._renew_loop()
                    self._end_term()
                    continue
                self._stop.wait(self.retry_period * (1 + random.uniform(0, JITTER)))
        except Exception:  # a bug here must not leave a stale leader behind
            log.exception("%s: leader elector failed", self.identity)
        finally:
            self._end_term()
            if self._release_on_stop and self._stop.is_set():
                self._release()
            log.info("%s: stopped campaigning for lease %s/%s", self.identity,
                     self.namespace, self.name)

    def _renew_loop(self) -> None:
        """Renew every retry_period until stopped, until the renew deadline passes or until
        the Lease is seen held by someone else."""
        while True:
            remaining = self._valid_until - time.monotonic()
            if self._stop.wait(max(0.0, min(self.retry_period, remaining))):
                return
            if time.monotonic() >= self._valid_until:
                log.info("%s: failed to renew lease %s/%s within %.1fs", self.identity,
                         self.namespace, self.name, self.renew_deadline)
                return
            started = time.monotonic()
            if self._try_acquire_or_renew(self._valid_until):
                with self._lock:
                    in_time = time.monotonic() < self._valid_until
                    if in_time:
                        self._valid_until = started + self.renew_deadline
                if not in_time:  # renewed, but too late: this term is over
                    log.info("%s: renewed lease %s/%s only after the %.1fs deadline",
                             self.identity, self.namespace, self.name, self.renew_deadline)
                    return
            elif self._held_by_other():
                log.info("%s: lease %s/%s is now held by %s", self.identity, self.namespace,
                         self.name, self.leader)
                return

    def _begin_term(self, started: float) -> None:
        with self._lock:
            self._leading = True
            self._valid_until = started + self.renew_deadline
        if self._metric is not None:
            self._metric.leading(True)
        log.info("%s: became leader (lease %s/%s)", self.identity, self.namespace, self.name)
        self._call(self._on_started_leading, "on_started_leading")

    def _end_term(self) -> None:
        with self._lock:
            was_leading, self._leading = self._leading, False
        if was_leading:
            if self._metric is not None:
                self._metric.leading(False)
            log.info("%s: stopped leading (lease %s/%s)", self.identity, self.namespace,
                     self.name)
            self._call(self._on_stopped_leading, "on_stopped_leading")

    def _call(self, callback: Callable[[], None], what: str) -> None:
        try:
            callback()
        except Exception:  # a callback's failure must not stop the elector
            log.exception("%s: %s failed", self.identity, what)

    # --- one attempt ----------------------------------------------------------------------

    def _try_acquire_or_renew(self, deadline: float) -> bool:
        """One attempt to take or keep the Lease (client-go's tryAcquireOrRenew); True when
        this elector holds it now. ``deadline`` (monotonic) bounds the requests."""
        try:
            return self._attempt(deadline)
        except ApiException as err:
            log.warning("%s: lease %s/%s: HTTP %s %s", self.identity, self.namespace,
                        self.name, err.status, err.reason)
        except Exception as err:  # noqa: BLE001 - an unreachable apiserver is a failed attempt
            log.warning("%s: lease %s/%s: %s: %s", self.identity, self.namespace, self.name,
                        type(err).__name__, err)
        return False

    def _attempt(self, deadline: float) -> bool:
        now = _micro_time()
        record = {"holderIdentity": self.identity,
                  "leaseDurationSeconds": math.ceil(self.lease_duration),
                  "acquireTime": now, "renewTime": now}
        # Fast path: the leader writes over the Lease it last wrote.
        if self._holds_lease() and self._lease is not None:
            observed = self._observed or {}
            record["acquireTime"] = observed.get("acquireTime") or now
            record["leaseTransitions"] = observed.get("leaseTransitions") or 0
            try:
                self._update(record, deadline)
                return True
            except ApiException as err:
                if err.status not in (404, 409):
                    raise
                log.info("%s: renewing lease %s/%s: HTTP %s; re-reading", self.identity,
                         self.namespace, self.name, err.status)

        # Slow path: read the Lease (or create it), then judge.
        try:
            lease = self._request(self._leases.read_namespaced_lease, deadline, self.name,
                                  self.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            return self._create(record, deadline)
        self._observe(lease)
        observed = self._observed or {}
        holder = observed.get("holderIdentity")
        if holder and holder != self.identity and self._observed_valid():
            return False  # held by someone else, not expired as seen from here
        if holder == self.identity:
            record["acquireTime"] = observed.get("acquireTime") or now
            record["leaseTransitions"] = observed.get("leaseTransitions") or 0
        else:
            record["leaseTransitions"] = (observed.get("leaseTransitions") or 0) + 1
        try:
            self._update(record, deadline)
        except ApiException as err:
            if err.status not in (404, 409):
                raise
            log.info("%s: lease %s/%s changed while acquiring (HTTP %s)", self.identity,
                     self.namespace, self.name, err.status)
            self._reread(deadline)
            return False
        if holder != self.identity:
            log.info("%s: acquired lease %s/%s (previous holder: %s)", self.identity,
                     self.namespace, self.name, holder or "none")
        return True

    def _create(self, record: dict, deadline: float) -> bool:
        with self._lock:
            last_holder = (self._observed or {}).get("holderIdentity")
        if last_holder and last_holder != self.identity and self._observed_valid():
            # Deleted under a holder whose lease has not run out yet: it may still be
            # working. Wait for its lease to end as if the record were still there.
            return False
        record["leaseTransitions"] = 0
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": _wire_spec(record)}
        try:
            lease = self._request(self._leases.create_namespaced_lease, deadline,
                                  self.namespace, body)
        except ApiException as err:
            if err.status != 409:
                raise
            log.info("%s: lease %s/%s created by someone else first", self.identity,
                     self.namespace, self.name)
            self._reread(deadline)
            return False
        self._observe(lease, written=True)
        log.info("%s: created lease %s/%s", self.identity, self.namespace, self.name)
        return True

    def _update(self, record: dict, deadline: float) -> dict:
        """Replace the Lease last seen (its resourceVersion: 409 when it changed since) with
        ``record``, keeping its metadata and the spec fields this elector does not own."""
        lease = self._lease or {}
        metadata = {k: v for k, v in (lease.get("metadata") or {}).items()
                    if k != "managedFields"}
        spec = {k: v for k, v in (lease.get("spec") or {}).items()
                if k in _SPEC_FIELDS and k not in _RECORD_FIELDS}
        spec.update(record)
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": metadata, "spec": _wire_spec(spec)}
        updated = self._request(self._leases.replace_namespaced_lease, deadline, self.name,
                                self.namespace, body)
        self._observe(updated, written=True)
        return updated

    def _reread(self, deadline: float) -> None:
        """After losing a race: learn what the winner wrote."""
        try:
            self._observe(self._request(self._leases.read_namespaced_lease, deadline,
                                        self.name, self.namespace))
        except ApiException as err:
            if err.status != 404:
                raise

    def _release(self) -> None:
        """Give up a Lease this elector holds: no holder and a 1 s duration, so the next
        candidate takes it at once."""
        if not self._holds_lease():
            return
        for _ in range(2):  # once more after a 409 from a write we did not see
            observed = self._observed or {}
            now = _micro_time()
            record = {"leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now,
                      "leaseTransitions": observed.get("leaseTransitions") or 0}
            try:
                self._update(record, time.monotonic() + self.renew_deadline)
                log.info("%s: released lease %s/%s", self.identity, self.namespace,
                         self.name)
                return
            except ApiException as err:
                if err.status != 409:
                    log.warning("%s: releasing lease %s/%s: HTTP %s %s", self.identity,
                                self.namespace, self.name, err.status, err.reason)
                    return
                try:
                    self._reread(time.monotonic() + self.renew_deadline)
                except Exception:  # noqa: BLE001 - best effort on the way out
                    return
                if not self._holds_lease():
                    return
            except Exception as err:  # noqa: BLE001 - best effort on the way out
                log.warning("%s: releasing lease %s/%s: %s: %s", self.identity,
                            self.namespace, self.name, type(err).__name__, err)
                return

    # --- observed state -------------------------------------------------------------------

    def _observe(self, lease: dict, written: bool = False) -> None:
        """Remember the Lease; restart the expiry clock when its record changed (or when
        this elector just wrote it)."""
        record = {k: (lease.get("spec") or {}).get(k) for k in _RECORD_FIELDS}
        with self._lock:
            self._lease = lease
            if written or record != self._observed:
                previous = (self._observed or {}).get("holderIdentity")
                self._observed = record
                self._observed_at = time.monotonic()
                holder = record.get("holderIdentity")
                if not written and holder != previous and holder != self.identity:
                    log.info("%s: lease %s/%s is held by %s", self.identity, self.namespace,
                             self.name, holder or "nobody")

    def _observed_valid(self) -> bool:
        """Whether the observed record's lease still runs, as measured here: from when it
        was first seen, for its own leaseDurationSeconds."""
        with self._lock:
            duration = (self._observed or {}).get("leaseDurationSeconds")
            if not duration:
                duration = self.lease_duration
            return time.monotonic() < self._observed_at + duration

    def _holds_lease(self) -> bool:
        with self._lock:
            return (self._observed or {}).get("holderIdentity") == self.identity

    def _held_by_other(self) -> bool:
        with self._lock:
            holder = (self._observed or {}).get("holderIdentity")
        return bool(holder) and holder != self.identity

    def _request(self, call, deadline: float, *args) -> dict:
        """One API call, its timeout bounded by ``deadline`` (monotonic); the Lease as a
        dict."""
        timeout = min(self.renew_deadline, deadline - time.monotonic())
        if timeout <= 0.01:
            raise TimeoutError(f"no time left within the {self.renew_deadline}s deadline")
        response = call(*args, _preload_content=False, _request_timeout=timeout)
        try:
            return json.loads(response.data)
        finally:
            response.release_conn()


def _micro_time() -> str:
    return _wire_time(datetime.now(UTC))


def _wire_time(value: datetime | str) -> str:
    """A MicroTime as the generated client will send it. The client turns the body into a
    model and times into ``datetime.isoformat()``, which leaves out a zero fraction, and the
    apiserver rejects a MicroTime without its six digits: a zero fraction becomes 1 µs."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.microsecond == 0:
        value = value.replace(microsecond=1)
    return value.astimezone(UTC).strftime(MICRO_TIME)


def _wire_spec(spec: dict) -> dict:
    """The spec without empty fields (a released Lease has no holder) and with its times
    in a form the apiserver accepts."""
    out = {k: v for k, v in spec.items() if v is not None and v != ""}
    for key in _TIME_FIELDS:
        if key in out:
            out[key] = _wire_time(out[key])
    return out
