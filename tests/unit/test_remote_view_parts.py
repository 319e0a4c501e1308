"""The remote view's pure parts: discovery documents, items and tables, the log options,
who a request is from (the front proxy's headers), the serving certificate's plan, and
the kubectl plugin's choices and messages."""

from __future__ import annotations

import datetime
from email.message import Message

import pytest
import yaml
from cryptography import x509
from kubernetes.client.exceptions import ApiException

from controller_kit.kubeclient import find_kubeconfig
from dispatcher import kubectl_plugin
from dispatcher.remote_view import (
    TRAINJOB_LABEL,
    WORKER_LABEL,
    certificate,
    discovery,
    items,
    worker_reads,
)
from dispatcher.remote_view.authn import RequestHeaderConfig, Unauthenticated, authenticate
from dispatcher.remote_view.logs import BadLogOption, as_query, log_options

CONFIGMAP = {"requestheader-client-ca-file": "-----BEGIN CERTIFICATE-----\n...",
             "requestheader-allowed-names": '["front-proxy-client"]',
             "requestheader-username-headers": '["X-Remote-User"]',
             "requestheader-group-headers": '["X-Remote-Group"]',
             "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]'}
PEER = {"subject": ((("commonName", "front-proxy-client"),),)}


def headers(*pairs: tuple[str, str]) -> Message:
    message = Message()
    for name, value in pairs:
        message[name] = value
    return message


def test_discovery_serves_the_group_the_version_and_the_log_subresource():
    assert discovery.document("/apis")["groups"][0]["name"] == "remote.trainjob-dispatcher.io"
    assert discovery.document("/apis/remote.trainjob-dispatcher.io/")["kind"] == "APIGroup"
    resources = discovery.document("/apis/remote.trainjob-dispatcher.io/v1alpha1")["resources"]
    assert [r["name"] for r in resources] == ["trainjobpods", "trainjobpods/log",
                                              "trainjobevents"]
    assert all(r["namespaced"] for r in resources)
    assert discovery.document("/apis/other") is None


def test_a_pod_is_shown_with_its_worker_node_restarts_and_last_termination():
    pod = {"metadata": {"name": "j-node-0-0-abc", "namespace": "ns"},
           "spec": {"nodeName": "n1", "containers": [{"name": "node"}]},
           "status": {"phase": "Running", "startTime": "2024-01-01T00:00:00Z",
                      "containerStatuses": [{
                          "name": "node", "ready": True, "restartCount": 2,
                          "state": {"running": {}},
                          "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137,
                                                       "finishedAt": "2024-01-01T00:01:00Z"}}}]}}
    item = items.pod_item(pod, "j", "worker-1")
    assert item["metadata"]["labels"] == {TRAINJOB_LABEL: "j", WORKER_LABEL: "worker-1"}
    assert item["status"] | {"lastTermination": None} == {
        "trainJob": "j", "worker": "worker-1", "node": "n1", "phase": "Running",
        "ready": "1/1", "restarts": 2, "lastTermination": None,
        "startTime": "2024-01-01T00:00:00Z", "containers": ["node"]}
    assert item["status"]["lastTermination"] == {
        "container": "node", "reason": "OOMKilled", "exitCode": 137,
        "finishedAt": "2024-01-01T00:01:00Z"}
    table = items.table("TrainJobPod", [item])
    assert table["rows"][0]["cells"][:8] == ["j-node-0-0-abc", "j", "worker-1", "n1", "1/1",
                                             "Running", 2, "OOMKilled (137)"]
    assert table["rows"][0]["object"]["metadata"]["name"] == "j-node-0-0-abc"


def test_only_the_jobs_own_events_are_its():
    def event(kind, name):
        return {"involvedObject": {"kind": kind, "name": name}}
    assert items.belongs_to(event("Pod", "j-node-0-0-x"), "j")
    assert items.belongs_to(event("TrainJob", "j"), "j")
    assert not items.belongs_to(event("Pod", "jj-node-0-0-x"), "j")
    assert not items.belongs_to(event("ConfigMap", "j-x"), "j")


def test_kubectl_asks_for_a_table_first():
    assert items.wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,"
                             "application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
                             "application/json")
    assert not items.wants_table("application/json")
    assert not items.wants_table(None)


def test_a_refusal_is_a_status_naming_the_object_and_the_reason():
    body = items.status(404, "TrainJob ns/j: not found", name="j", kind="TrainJob")
    assert (body["kind"], body["code"], body["reason"]) == ("Status", 404, "NotFound")
    assert body["details"] == {"name": "j", "group": "remote.trainjob-dispatcher.io",
                               "kind": "TrainJob"}


def test_log_options_are_checked_and_passed_on():
    options = log_options({"container": ["node"], "follow": ["true"], "tailLines": ["10"],
                           "timestamps": ["false"], "previous": ["1"], "limitBytes": ["5"],
                           "insecureSkipTLSVerifyBackend": ["true"]})
    assert options == {"container": "node", "follow": True, "tailLines": 10,
                       "timestamps": False, "previous": True, "limitBytes": 5}
    assert ("follow", "true") in as_query(options)
    for query, says in (({"tailLines": ["-1"]}, "tailLines=-1: must be 0 or more"),
                        ({"limitBytes": ["0"]}, "limitBytes=0: must be 1 or more"),
                        ({"follow": ["maybe"]}, "follow='maybe': must be true or false"),
                        ({"sinceTime": ["yesterday"]}, "sinceTime='yesterday'"),
                        ({"sinceSeconds": ["5"], "sinceTime": ["2024-01-01T00:00:00Z"]},
                         "at most one of them"),
                        ({"exec": ["x"]}, "exec: not an option of the log subresource")):
        with pytest.raises(BadLogOption, match=says.replace("(", r"\(").replace(")", r"\)")):
            log_options(query)


def test_the_user_comes_from_the_front_proxys_headers_only():
    config = RequestHeaderConfig.from_configmap(CONFIGMAP)
    user = authenticate(config, PEER, headers(
        ("X-Remote-User", "alice"), ("X-Remote-Group", "team-a"),
        ("X-Remote-Group", "system:authenticated"),
        ("X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id", "X509SHA256=ab")))
    assert (user.name, user.groups) == ("alice", ("team-a", "system:authenticated"))
    assert user.extra == {"authentication.kubernetes.io/credential-id": ["X509SHA256=ab"]}
    with pytest.raises(Unauthenticated, match="no client certificate"):
        authenticate(config, None, headers(("X-Remote-User", "alice")))
    with pytest.raises(Unauthenticated, match="CN 'someone' is not among"):
        authenticate(config, {"subject": ((("commonName", "someone"),),)},
                     headers(("X-Remote-User", "alice")))
    with pytest.raises(Unauthenticated, match="no user in the X-Remote-User header"):
        authenticate(config, PEER, headers())
    with pytest.raises(Unauthenticated, match="has no requestheader-client-ca-file"):
        authenticate(RequestHeaderConfig.from_configmap({}), PEER,
                     headers(("X-Remote-User", "alice")))


def test_the_serving_certificate_is_made_once_and_renewed_at_two_thirds():
    hosts = certificate.hosts_of("svc", "ns")
    assert hosts == ("svc.ns.svc", "svc.ns.svc.cluster.local")
    now = datetime.datetime.now(datetime.UTC)
    first = certificate.next_step({}, hosts, now, trusted=None)
    assert first.data is not None and "no certificates yet" in first.reason
    assert certificate.next_step(first.data, hosts, now, trusted=None).data is None
    later = now + datetime.timedelta(days=250)  # past 2/3 of the serving year
    renewed = certificate.next_step(first.data, hosts, later, trusted=None)
    assert renewed.data[certificate.CA_CRT] == first.data[certificate.CA_CRT], "CA kept"
    assert renewed.data[certificate.TLS_CRT] != first.data[certificate.TLS_CRT]
    # Another Service name: a new certificate once its CA has settled (10 s after it was
    # made; no APIService here trusts anything else).
    soon = now + datetime.timedelta(minutes=1)
    moved = certificate.next_step(first.data, certificate.hosts_of("other", "ns"), soon,
                                  trusted=None)
    assert moved.data[certificate.TLS_CRT] != first.data[certificate.TLS_CRT]
    aged = certificate.next_step(first.data, hosts, now + datetime.timedelta(days=2500),
                                 trusted=None)
    assert "new CA" in aged.reason
    assert aged.data[certificate.CA_CRT].count(b"BEGIN CERTIFICATE") == 2, "old CA kept"


def test_a_due_serving_certificate_waits_until_the_aggregator_trusts_the_newest_ca():
    hosts = certificate.hosts_of("svc", "ns")
    now = datetime.datetime.now(datetime.UTC)
    first = certificate.next_step({}, hosts, now, trusted=None).data
    [ca] = x509.load_pem_x509_certificates(first[certificate.CA_CRT])
    later = now + datetime.timedelta(days=250)  # the serving certificate is due
    waiting = certificate.next_step(first, hosts, later, trusted=set())
    assert waiting.data is None and "trust the newest CA" in waiting.reason, \
        "nothing replaced before the caBundle trusts its CA"
    renewed = certificate.next_step(first, hosts, later,
                                    trusted={certificate.fingerprint(ca)})
    assert renewed.data[certificate.TLS_CRT] != first[certificate.TLS_CRT]
    # Nothing usable (here: none at all) is replaced at once, trusted or not.
    remade = certificate.next_step({k: v for k, v in first.items()
                                    if k != certificate.TLS_CRT}, hosts, now, trusted=set())
    assert remade.data[certificate.TLS_CRT] and remade.data[certificate.CA_CRT] == first[
        certificate.CA_CRT]


def test_a_workers_events_are_given_to_the_copies_they_are_about():
    def event(kind, name):
        return {"metadata": {"name": f"{name}.1"}, "involvedObject": {"kind": kind,
                                                                      "name": name}}
    found = worker_reads._by_copy(
        [event("JobSet", "a"), event("Pod", "a-node-0-0-x"), event("Pod", "a-b-node-0-0-y"),
         event("Pod", "ab-node-0-0-z"), event("ConfigMap", "a-config")], {"a", "a-b", "c"})
    assert [e["involvedObject"]["name"] for e in found["a"]] == [
        "a", "a-node-0-0-x", "a-b-node-0-0-y"]
    assert [e["involvedObject"]["name"] for e in found["a-b"]] == ["a-b-node-0-0-y"]
    assert found["c"] == []


def test_the_plugin_takes_the_namespace_of_the_kubeconfigs_context(tmp_path, monkeypatch):
    first, second = tmp_path / "one", tmp_path / "two"
    first.write_text(yaml.safe_dump({
        "current-context": "mine", "clusters": [{"name": "c", "cluster": {"server": "x"}}],
        "contexts": [{"name": "mine", "context": {"cluster": "c", "namespace": "team"}}]}))
    second.write_text(yaml.safe_dump({
        "current-context": "other", "clusters": [{"name": "c", "cluster": {"server": "y"}}],
        "contexts": [{"name": "mine", "context": {"cluster": "c", "namespace": "later"}},
                     {"name": "other", "context": {"cluster": "c"}}]}))
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    source = find_kubeconfig(None)
    assert kubectl_plugin._namespace(source, None) == "team", "the first file wins"
    assert kubectl_plugin._namespace(source, "other") == "default"


def test_the_plugin_reads_the_trainers_log_unless_told():
    pods = [{"metadata": {"name": n}} for n in
            ("j-dataset-initializer-0-0-a", "j-node-0-1-b", "j-node-0-0-c")]
    assert kubectl_plugin.choose_pod(pods, "j", None) == "j-node-0-0-c"
    assert kubectl_plugin.choose_pod(pods, "j", "j-node-0-1-b") == "j-node-0-1-b"
    with pytest.raises(kubectl_plugin.PluginError, match="has no Pod x"):
        kubectl_plugin.choose_pod(pods, "j", "x")
    with pytest.raises(kubectl_plugin.PluginError, match="no Pods on its worker yet"):
        kubectl_plugin.choose_pod([], "j", None)


def test_the_plugin_says_what_to_do_about_a_refusal():
    def err(status, message):
        error = ApiException(status=status, reason="x")
        error.body = f'{{"message": "{message}"}}'.encode()
        return error
    forbidden = kubectl_plugin.explain(err(403, "User bob cannot list"), "list trainjobpods",
                                       "ns")
    assert "lacks the RBAC" in forbidden and "kubectl auth can-i list" in forbidden
    unavailable = kubectl_plugin.explain(err(503, "service unavailable"), "list x", "ns")
    assert "kubectl get apiservice v1alpha1.remote.trainjob-dispatcher.io" in unavailable
    missing = kubectl_plugin.explain(
        err(404, "the server could not find the requested resource"), "list x", "ns")
    assert "not installed" in missing
