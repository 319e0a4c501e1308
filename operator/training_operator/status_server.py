"""The trainer status endpoint (upstream Trainer's "status server", feature gate
``TrainJobStatus``): training pods POST their progress and it is written to the TrainJob's
``status.trainerStatus``. Off unless ``training-operator run --enable-trainer-status``.

``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`` over
HTTPS (the webhook's serving certificate), body ``{"trainerStatus": {...}}``, header
``Authorization: Bearer <token>``. Accepted when, as upstream decides:

* the token is a valid service-account token for audience
  ``trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`` (the projected
  token the ``TrainJobStatus`` plug-in gives the job's trainer pods; another job's pods
  carry another audience), and
* its service account is in ``<ns>``.

Upstream checks the token's signature against the cluster's OIDC keys; here the apiserver
checks it (TokenReview with the audience), which also refuses a token whose pod is gone.
The operator refuses jobs it does not manage (``spec.managedBy``), as it writes no status
of theirs. ``status.trainerStatus`` is then server-side applied with field manager
``trainer-status`` through the status subresource, replacing what the previous report said.

Refusals are Kubernetes ``Status`` objects naming the TrainJob, the field and the reason:
403 (token), 422 (body), 404 (no such TrainJob or path), 413 (over 64 KiB), 500 (the
apiserver could not be asked). A refused request writes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller_kit.kubeclient import APPLY_PATCH, describe_error
from controller_kit.metrics_auth import bearer_token
from training_operator.webhook_server import WebhookServer, _Handler
from trainjob import constants as c
from trainjob import trainer_status as ts
from trainjob.managed_by import managed_by, operator_manages

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

JobLookup = Callable[[str, str], "dict | None"]
UpdateHook = Callable[[int], None]


def status_object(code: HTTPStatus, message: str, causes: list[tuple[str, str]] = (),
                  namespace: str = "", name: str = "") -> dict[str, Any]:
    """A ``metav1.Status`` failure, as upstream's server answers (plus the causes)."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "message": message, "reason": _REASONS.get(code, code.phrase),
                            "code": int(code)}
    if name or causes:
        body["details"] = {"name": name, "group": c.TRAINER_GROUP, "kind": c.TRAINJOBS}
        if causes:
            body["details"]["causes"] = [{"field": f, "message": m, "reason": "FieldValueInvalid"}
                                         for f, m in causes]
    return body


_REASONS = {HTTPStatus.FORBIDDEN: "Forbidden", HTTPStatus.NOT_FOUND: "NotFound",
            HTTPStatus.UNPROCESSABLE_ENTITY: "Invalid",
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "RequestEntityTooLarge",
            HTTPStatus.INTERNAL_SERVER_ERROR: "InternalError",
            HTTPStatus.METHOD_NOT_ALLOWED: "MethodNotAllowed",
            HTTPStatus.LENGTH_REQUIRED: "LengthRequired"}


class Refusal(Exception):
    def __init__(self, code: HTTPStatus, message: str, causes: list[tuple[str, str]] = ()):
        super().__init__(message)
        self.code = code
        self.message = message
        self.causes = list(causes)


class StatusServer(WebhookServer):
    """Serves the trainer status endpoint on ``host:port`` with ``cert_dir``'s tls.crt/key.
    ``find_job(namespace, name)`` reads the operator's TrainJob cache."""

    thread_name = "trainer-status"
    description = "trainer status endpoint"

    def __init__(self, port: int, cert_dir: str | Path, api: client.ApiClient,
                 find_job: JobLookup = lambda namespace, name: None, host: str = "127.0.0.1",
                 on_update: UpdateHook | None = None):
        super().__init__(port, cert_dir, lookups=None, host=host,
                         max_body_bytes=ts.MAX_BODY_BYTES)
        self.api = api
        self.find_job = find_job
        self.on_update = on_update

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        return _StatusHandler

    # --- one request ------------------------------------------------------------------

    def update(self, namespace: str, name: str, authorization: str | None,
               body: bytes) -> tuple[HTTPStatus, dict[str, Any]]:
        """Answer one POST: (HTTP status, JSON body)."""
        try:
            answer = self._update(namespace, name, authorization, body)
            code = HTTPStatus.OK
        except Refusal as refusal:
            log.info("TrainJob %s/%s: trainerStatus update refused (%d): %s", namespace, name,
                     refusal.code, refusal.message)
            code = refusal.code
            answer = status_object(refusal.code, refusal.message, refusal.causes, namespace,
                                   name)
        if self.on_update is not None:
            try:
                self.on_update(int(code))
            except Exception:  # metrics must not break the endpoint
                log.exception("on_update hook failed")
        return code, answer

    def _update(self, namespace: str, name: str, authorization: str | None,
                body: bytes) -> dict[str, Any]:
        job = f"TrainJob {namespace}/{name}"
        self._authenticate(job, namespace, name, authorization)
        try:
            decoded = json.loads(body)
        except (ValueError, UnicodeDecodeError) as err:
            raise Refusal(HTTPStatus.UNPROCESSABLE_ENTITY,
                          f"{job}: trainerStatus update refused: the body is not JSON ({err})",
                          [("(body)", "not JSON")]) from None
        try:
            trainer_status = ts.trainer_status_from_request(decoded)
        except ts.InvalidUpdate as err:
            raise Refusal(HTTPStatus.UNPROCESSABLE_ENTITY,
                          f"{job}: trainerStatus update refused: {err}", err.problems) from None
        if trainer_status is None:
            return {}  # nothing to report: nothing written (upstream answers the same)
        found = self._find(job, namespace, name)
        if not operator_manages(managed_by(found.get("spec"))):
            raise Refusal(HTTPStatus.FORBIDDEN,
                          f"{job}: trainerStatus update refused: spec.managedBy is "
                          f"{managed_by(found.get('spec'))!r}; this operator writes no status "
                          "of a job it does not manage")
        written = self._apply(job, namespace, name, trainer_status)
        return {"trainerStatus": written}

    def _authenticate(self, job: str, namespace: str, name: str,
                      authorization: str | None) -> None:
        refused = f"{job}: trainerStatus update refused: Authorization header:"
        token = bearer_token(authorization)
        if not token:
            raise Refusal(HTTPStatus.FORBIDDEN, f"{refused} no bearer token (send "
                          "'Authorization: Bearer <projected service-account token>')")
        audience = ts.token_audience(namespace, name)
        review = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token,
                                                                     audiences=[audience]))
        try:
            result = client.AuthenticationV1Api(self.api).create_token_review(review).status
        except ApiException as err:
            log.warning("%s: TokenReview failed: %s", job, describe_error(err))
            raise Refusal(HTTPStatus.INTERNAL_SERVER_ERROR,
                          f"{job}: the token could not be verified (TokenReview: "
                          f"{describe_error(err)}); retry later") from None
        if result is None or not result.authenticated:
            why = (result.error if result is not None and result.error else "not authenticated")
            raise Refusal(HTTPStatus.FORBIDDEN,
                          f"{refused} the token is not valid for audience {audience} (expired, "
                          f"revoked, its pod gone, or issued for another TrainJob): {why}")
        if audience not in (result.audiences or []):
            raise Refusal(HTTPStatus.FORBIDDEN,
                          f"{refused} the token is not valid for audience {audience}")
        username = result.user.username if result.user is not None else ""
        parts = (username or "").split(":")
        if not username.startswith(SERVICE_ACCOUNT_PREFIX) or len(parts) != 4:
            raise Refusal(HTTPStatus.FORBIDDEN,
                          f"{refused} {username!r} is not a service account")
        if parts[2] != namespace:
            raise Refusal(HTTPStatus.FORBIDDEN,
                          f"{refused} service account {parts[3]} is in namespace {parts[2]}, "
                          f"not in the TrainJob's namespace {namespace}")

    def _find(self, job: str, namespace: str, name: str) -> dict[str, Any]:
        """The TrainJob from the operator's cache, else (just created) from the apiserver."""
        cached = self.find_job(namespace, name)
        if cached is not None:
            return cached
        try:
            return client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS, name)
        except ApiException as err:
            if err.status == 404:
                raise Refusal(HTTPStatus.NOT_FOUND, f"{job} not found") from None
            raise Refusal(HTTPStatus.INTERNAL_SERVER_ERROR,
                          f"{job}: could not be read ({describe_error(err)}); retry later") \
                from None

    def _apply(self, job: str, namespace: str, name: str,
               trainer_status: dict[str, Any]) -> dict[str, Any]:
        try:
            response = client.CustomObjectsApi(self.api).patch_namespaced_custom_object_status(
                c.TRAINER_GROUP, c.TRAINER_VERSION, namespace, c.TRAINJOBS, name,
                ts.apply_body(namespace, name, trainer_status), field_manager=ts.FIELD_MANAGER,
                force=True, _content_type=APPLY_PATCH, _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                raise Refusal(HTTPStatus.NOT_FOUND, f"{job} not found") from None
            if err.status in (400, 422):
                raise Refusal(HTTPStatus.UNPROCESSABLE_ENTITY,
                              f"{job}: trainerStatus update refused by the apiserver: "
                              f"{_message(err)}") from None
            log.warning("%s: trainerStatus write failed: %s", job, describe_error(err))
            raise Refusal(HTTPStatus.INTERNAL_SERVER_ERROR,
                          f"{job}: trainerStatus could not be written ({describe_error(err)}); "
                          "retry later") from None
        stored = json.loads(response.data)
        log.debug("%s: trainerStatus written", job)
        return (stored.get("status") or {}).get("trainerStatus") or trainer_status


def _message(err: ApiException) -> str:
    try:
        return json.loads(err.body).get("message") or describe_error(err)
    except (TypeError, ValueError):
        return describe_error(err)


class _StatusHandler(_Handler):
    server_version = "training-operator-trainer-status"

    def do_GET(self) -> None:
        self._answer_path(urlsplit(self.path).path, allowed=False)

    do_PUT = do_PATCH = do_DELETE = do_GET

    def do_POST(self) -> None:
        key = ts.parse_status_path(urlsplit(self.path).path)
        if key is None:
            self._answer_path(urlsplit(self.path).path, allowed=True)
            return
        body = self._read_body()
        if body is None:
            return
        server: StatusServer = self.server.webhook
        code, answer = server.update(*key, self.headers.get("Authorization"), body)
        self._send(code, json.dumps(answer).encode(), "application/json")

    def _answer_path(self, path: str, allowed: bool) -> None:
        self._drain_or_close()
        if not allowed and ts.parse_status_path(path) is not None:
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} {path}: only POST"
        else:
            code, message = HTTPStatus.NOT_FOUND, f"{path}: not found"
        answer = status_object(code, message)
        self._send(code, json.dumps(answer).encode(), "application/json")

    def _refuse(self, code: HTTPStatus, message: str) -> None:
        key = ts.parse_status_path(urlsplit(self.path).path) or ("", "")
        answer = status_object(code, f"TrainJob {key[0]}/{key[1]}: {message}",
                               [("(body)", message)], *key)
        self._send(code, json.dumps(answer).encode(), "application/json")

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        log.debug("trainer status %s: " + format, self.address_string(), *args)
