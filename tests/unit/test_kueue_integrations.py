"""Which of Kueue's webhooks and integrations the harness configures (read from the Kueue
module in the Go module cache, as the harness does at start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusters import kueue


def webhooked(integrations: tuple[str, ...]) -> set[tuple[str, str]]:
    """(API group, resource) of every rule of the webhooks installed for ``integrations``."""
    return {(group, resource)
            for document in kueue.webhook_configurations("https://127.0.0.1:1", b"ca",
                                                         integrations)
            for webhook in document["webhooks"] for rule in webhook["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"]}


def test_by_default_only_kueues_own_kinds_and_trainjobs_have_webhooks():
    kinds = webhooked(kueue.INTEGRATIONS)
    assert {group for group, _ in kinds} == {"kueue.x-k8s.io", "trainer.kubeflow.org"}, kinds


def test_a_multikueue_teams_integrations_add_the_batch_job_and_jobset_webhooks_only():
    kinds = webhooked(kueue.MULTIKUEUE_TEAM_INTEGRATIONS)
    others = {k for k in kinds if k[0] != "kueue.x-k8s.io"}
    assert others == {("batch", "jobs"), ("jobset.x-k8s.io", "jobsets"),
                      ("trainer.kubeflow.org", "trainjobs")}, others
    # Kueue's pod webhook would see every pod of the cluster; Deployments and the like are
    # other integrations.
    assert not {k for k in kinds if k[0] in ("", "apps")}, kinds


def test_the_configuration_enables_the_integrations_asked_for(tmp_path: Path):
    ports = {"kueue-webhook": 1, "kueue-health": 2, "kueue-metrics": 3}
    config = kueue.configuration(tmp_path, ports, "127.0.0.1", "example.com/d",
                                 kueue.MULTIKUEUE_TEAM_INTEGRATIONS)
    assert config["integrations"]["frameworks"] == [
        "batch/job", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob"]
    default = kueue.configuration(tmp_path, ports, "127.0.0.1", "example.com/d")
    assert default["integrations"]["frameworks"] == ["trainer.kubeflow.org/trainjob"]


def test_an_integration_the_harness_cannot_serve_is_refused_by_name():
    with pytest.raises(ValueError) as refused:
        kueue.check_integrations(("batch/job", "kubeflow.org/mpijob"))
    assert str(refused.value) == (
        "Kueue integrations kubeflow.org/mpijob: not served by this harness; choose among "
        "batch/job, jobset.x-k8s.io/jobset, trainer.kubeflow.org/trainjob")
    with pytest.raises(ValueError, match="at least one is needed"):
        kueue.check_integrations(())
