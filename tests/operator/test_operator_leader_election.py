"""Two training operators with leader election (as manifests/operator runs them): both keep
warm caches and answer /readyz, only the Lease holder reconciles, and the standby takes over
when the leader dies. The operators are real processes on a real worker (worker-2), each
limited to the test's namespace."""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters import fixtures
from clusters.testing import ServiceProcess, eventually
from training_operator.controller import lease_name
from trainjob import constants as c

WORKER = "worker-2"
TRAINER = (c.TRAINER_GROUP, c.TRAINER_VERSION)
JOBSET = (c.JOBSET_GROUP, c.JOBSET_VERSION)
JOBSETS_CREATED = "training_operator_jobsets_created_total"
RECONCILES = "training_operator_reconcile_duration_seconds_count"
MASTER_STATUS = "leader_election_master_status"


def create_trainjob(worker, namespace: str, name: str, runtime: str) -> None:
    worker.custom.create_namespaced_custom_object(*TRAINER, namespace, c.TRAINJOBS, {
        "apiVersion": c.TRAINER_API_VERSION, "kind": c.TRAINJOB_KIND,
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime, "kind": c.TRAININGRUNTIME_KIND}}})


def jobset(worker, namespace: str, name: str) -> dict | None:
    try:
        return worker.custom.get_namespaced_custom_object(*JOBSET, namespace, c.JOBSETS, name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def role(process: ServiceProcess) -> str:
    return process.readyz()[1].split()[0]


def test_one_operator_reconciles_and_the_standby_takes_over(multicluster, namespace,
                                                            run_operator):
    worker = multicluster[WORKER]
    runtime = "torch-ha"
    fixtures.install_runtime(worker.api, fixtures.torch_runtime(
        runtime, cpu="100m", memory="128Mi", namespace=namespace))
    flags = ("--namespace", namespace, "--leader-elect", "--leader-elect-namespace", namespace,
             "--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5")
    first, second = run_operator(worker, *flags), run_operator(worker, *flags)
    eventually(lambda: {role(first), role(second)}, lambda seen: seen == {"leader", "standby"},
               expected="one operator reporting leader, the other standby (both ready)")
    leader, standby = (first, second) if role(first) == "leader" else (second, first)
    held = client.CoordinationV1Api(worker.api).read_namespaced_lease(lease_name(namespace),
                                                                      namespace)
    assert held.spec.holder_identity, "expected the Lease held"
    # controller-runtime's gauge, by Lease name: 1 on the leader, 0 on the standby (set
    # a moment after /readyz says leader).
    eventually(lambda: [process.metric(MASTER_STATUS, name=lease_name(namespace))
                        for process in (leader, standby)], lambda seen: seen == [1, 0],
               expected=f"{MASTER_STATUS} 1 on the leader, 0 on the standby")

    create_trainjob(worker, namespace, "ha-0", runtime)
    eventually(lambda: jobset(worker, namespace, "ha-0"), lambda found: found is not None,
               expected=f"JobSet {namespace}/ha-0 built by the leader")
    # The counter moves once the create has returned, a moment after the JobSet is readable.
    eventually(lambda: leader.metric(JOBSETS_CREATED), lambda count: count == 1,
               expected="the leader's one JobSet counted")
    # A reconcile is timed once it returns, a moment after its JobSet is written.
    eventually(lambda: leader.metric(RECONCILES), lambda count: count > 0,
               expected="the leader's reconciles counted")
    assert (standby.metric(JOBSETS_CREATED), standby.metric(RECONCILES)) == (0, 0), (
        "the standby reconciled")

    leader.stop(kill=True)  # as a crash: the Lease is not given up, it runs out
    eventually(lambda: standby.readyz(), lambda answer: answer == (200, "leader"),
               timeout=20, expected="the standby leading once the Lease ran out")
    eventually(lambda: standby.metric(MASTER_STATUS, name=lease_name(namespace)),
               lambda status: status == 1, expected=f"{MASTER_STATUS} 1 on the new leader")
    create_trainjob(worker, namespace, "ha-1", runtime)
    eventually(lambda: jobset(worker, namespace, "ha-1"), lambda found: found is not None,
               expected=f"JobSet {namespace}/ha-1 built by the new leader")
    eventually(lambda: standby.metric(JOBSETS_CREATED), lambda count: count == 1,
               expected="the new leader to count only the new job's JobSet (ha-0's exists)")
