"""The benchmark's host probe: a process of its own timing a slice of fixed work twice a
second, whose readings tell each CPU window how much of it the host was slow."""

from __future__ import annotations

import time

from bench import host_speed
from bench.footprint import CpuAccount, cpu_sum
from clusters.processes import is_alive
from clusters.testing import eventually


def test_the_probe_runs_as_a_process_of_its_own_until_the_block_ends(tmp_path):
    probe = host_speed.Probe(tmp_path / "probe.txt")
    started = time.time()
    with probe.running():
        assert host_speed.Probe.current is probe and is_alive(probe.pid)
        readings = eventually(lambda: probe.readings(started, time.time()),
                              lambda seen: len(seen) >= 2, timeout=30,
                              expected="two readings from the probe within 30 s")
    assert host_speed.Probe.current is None
    assert not is_alive(probe.pid), f"the probe (pid {probe.pid}) outlived its block"
    assert all(ms > 0 for ms, _ in readings), readings


def test_a_window_reports_the_share_of_its_readings_when_the_host_was_slow(tmp_path):
    probe = host_speed.Probe(tmp_path / "probe.txt")
    # Readings an hour from now, so that the CPU window below, which ends long before,
    # has none however slow the machine is.
    later = time.time() + 3600
    # Four readings in the window asked about, one of them slow; one before it, which
    # does not count.
    lines = [(later - 100, 1.2, 0), (later + 0.1, 1.3, 0), (later + 0.2, 2.1, 1),
             (later + 0.3, 1.2, 0), (later + 0.4, 1.3, 0)]
    probe.path.write_text("".join(f"{t:.3f} {ms} {slow}\n" for t, ms, slow in lines))
    host_speed.Probe.current = probe
    try:
        assert host_speed.slow_share(later, later + 1) == (0.25, 4)
        assert host_speed.slow_share(later + 10, later + 11) is None
        with CpuAccount({}) as account:
            pass
        # A window without a reading: no share rather than a zero.
        assert "host_slow_share" not in account.figures()
    finally:
        host_speed.Probe.current = None
    assert host_speed.slow_share(later, later + 1) is None


def test_windows_merge_their_slow_shares_by_readings():
    base = {"cpu_seconds": {}, "host_cpu_seconds_available": 10.0, "host_busy_share": 0.5}
    merged = cpu_sum([{**base, "host_slow_share": 0.5, "host_probe_readings": 20},
                      {**base, "host_slow_share": 0.0, "host_probe_readings": 60},
                      base])
    assert (merged["host_slow_share"], merged["host_probe_readings"]) == (0.125, 80)
    assert "host_slow_share" not in cpu_sum([base])
