"""Two dispatcher replicas: one leader writes, the standby takes over when it dies."""

from __future__ import annotations

from clusters.testing import ServiceProcess, eventually

from dispatch_helpers import create, trainjob, wait_placed


def writes(process: ServiceProcess) -> float:
    return (process.metric("dispatcher_manager_writes_total")
            + process.metric("dispatcher_worker_writes_total"))


def test_one_writer_and_a_standby_that_takes_over(dispatch_env, namespace):
    env = dispatch_env
    first = env.dispatcher
    second = ServiceProcess("dispatcher", env.manager.kubeconfig,
                            env.log_dir / "dispatcher-standby.log", first.extra_args,
                            supervised=True).start()
    try:
        roles = eventually(lambda: {first.readyz()[1].split()[0], second.readyz()[1].split()[0]},
                           lambda seen: seen == {"leader", "standby"},
                           expected="one replica reporting leader, the other standby")
        assert roles == {"leader", "standby"}
        leader, standby = ((first, second) if first.readyz()[1] == "leader"
                           else (second, first))
        before = writes(standby)
        for i in range(5):
            create(env.manager, namespace, trainjob(f"ha{i}"))
        for i in range(5):
            wait_placed(env, namespace, f"ha{i}")
        assert writes(leader) > 0
        assert writes(standby) == before == 0, "the standby wrote to a cluster"

        leader.stop(kill=True)
        eventually(lambda: standby.readyz(), lambda answer: answer == (200, "leader"),
                   timeout=20, expected="the standby leading after the leader was killed")
        for i in range(5, 8):
            create(env.manager, namespace, trainjob(f"ha{i}"))
        for i in range(8):
            wait_placed(env, namespace, f"ha{i}")  # exactly one copy each, old and new
    finally:
        # Whichever replica survives carries on for the rest of the module.
        survivor = second if second.proc.poll() is None else first
        other = first if survivor is second else second
        other.stop()
        env.dispatcher = survivor


def test_sigterm_is_an_orderly_stop_that_hands_the_lease_over(dispatch_env, namespace):
    """A requested shutdown is not a failure: INFO lines, exit code 0, and the Lease given
    up, so the standby leads without waiting for it to expire."""
    env = dispatch_env
    leader = env.dispatcher
    eventually(lambda: leader.readyz(), lambda answer: answer == (200, "leader"),
               expected="the module's dispatcher leading")
    standby = ServiceProcess("dispatcher", env.manager.kubeconfig,
                             env.log_dir / "dispatcher-sigterm-standby.log",
                             leader.extra_args, supervised=True).start()
    try:
        eventually(lambda: standby.readyz()[1].split()[0], lambda role: role == "standby",
                   expected="the second replica a standby")
        logged_before = len(leader.log_file.read_text().splitlines())
        leader.stop()  # SIGTERM
        assert leader.proc.returncode == 0, leader.log_tail()
        after = leader.log_file.read_text().splitlines()[logged_before:]
        assert not [line for line in after if " ERROR " in line], after
        assert any("leadership given up: stopping as asked" in line for line in after), after
        eventually(lambda: standby.readyz(), lambda answer: answer == (200, "leader"),
                   timeout=10, expected="the standby leading once the Lease was released")
        create(env.manager, namespace, trainjob("after-sigterm"))
        wait_placed(env, namespace, "after-sigterm")
    finally:
        env.dispatcher = standby if standby.proc.poll() is None else env.restart_dispatcher()
