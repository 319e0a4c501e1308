"""Client certificates for arbitrary users (``LocalClusters.issue_user_kubeconfig``): the
apiserver authenticates them as named, and RBAC binds them like any user or
ServiceAccount."""

from __future__ import annotations

import secrets

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters.pki import service_account_user
from clusters.testing import eventually
from controller_kit.kubeclient import api_client


def bind_reader(api: client.ApiClient, namespace: str, resource: str, subject: dict) -> None:
    """A Role that may list ``resource`` in ``namespace``, bound to ``subject``. (The
    built-in ``view`` role is aggregated by a controller the harness does not run.)"""
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": f"{resource}-reader"},
        "rules": [{"apiGroups": [""], "resources": [resource], "verbs": ["list"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": f"{resource}-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": f"{resource}-reader"},
        "subjects": [subject]})


def whoami(api: client.ApiClient) -> tuple[str, set[str]]:
    review = client.AuthenticationV1Api(api).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return review.status.user_info.username, set(review.status.user_info.groups or [])


def test_a_user_certificate_authenticates_as_named_and_has_no_rights_until_bound(
        multicluster, namespace, tmp_path):
    team = f"team-{secrets.token_hex(3)}"
    path = multicluster.harness.issue_user_kubeconfig("worker-1", "jane", (team,),
                                                      tmp_path / "jane.kubeconfig")
    assert "client-certificate-data" in path.read_text()  # embedded: fit for a Secret
    with api_client(path) as api:
        assert whoami(api) == ("jane", {team, "system:authenticated"})
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(api).list_namespaced_config_map(namespace)
        assert err.value.status == 403
        bind_reader(multicluster["worker-1"].api, namespace, "configmaps",
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": team})
        # RBAC reads bindings from its informer: the grant lands within moments.
        eventually(lambda: client.CoreV1Api(api).list_namespaced_config_map(namespace),
                   lambda answer: answer is not None,
                   expected=f"group {team} able to list ConfigMaps in {namespace} once bound")


def test_a_service_account_identity_matches_service_account_subjects(
        multicluster, namespace, tmp_path):
    # The account needs no object: RBAC matches its subject by user name alone. (A short
    # namespace: the user name is the certificate's CN, at most 64 bytes.)
    user, groups = service_account_user("robots", "r2")
    assert user == "system:serviceaccount:robots:r2"
    assert set(groups) == {"system:serviceaccounts", "system:serviceaccounts:robots",
                           "system:authenticated"}
    path = multicluster.harness.issue_user_kubeconfig("manager", user, groups,
                                                      tmp_path / "r2.kubeconfig")
    bind_reader(multicluster.manager.api, namespace, "pods",
                {"kind": "ServiceAccount", "name": "r2", "namespace": "robots"})
    with api_client(path) as api:
        name, seen_groups = whoami(api)
        assert (name, seen_groups) == (user, set(groups))
        eventually(lambda: client.CoreV1Api(api).list_namespaced_pod(namespace),
                   lambda answer: answer is not None,
                   expected="the certificate user bound as ServiceAccount robots/r2 to list Pods")
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(api).list_namespaced_pod("kube-system")
        assert err.value.status == 403
