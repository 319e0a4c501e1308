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
    assert all(r.ms > 0 and r.read_ns > 0 for r in readings), readings


def test_a_window_reports_the_share_of_its_readings_when_the_host_was_slow(tmp_path):
    probe = host_speed.Probe(tmp_path / "probe.txt")
    # Readings an hour from now, so that the CPU window below, which ends long before,
    # has none however slow the machine is.
    later = time.time() + 3600
    # Four readings in the window asked about, one of them slow; one before it, which
    # does not count.
    # The cache reads' median is that of the window's readings too.
    lines = [(later - 100, 1.2, 0, 90.0), (later + 0.1, 1.3, 0, 30.0),
             (later + 0.2, 2.1, 1, 80.0), (later + 0.3, 1.2, 0, 31.0),
             (later + 0.4, 1.3, 0, 33.0)]
    probe.path.write_text("".join(f"{t:.3f} {ms} {slow} {ns}\n"
                                  for t, ms, slow, ns in lines))
    host_speed.Probe.current = probe
    try:
        assert host_speed.seen_between(later, later + 1) == host_speed.HostReadings(
            0.25, 4, 32.0)
        assert host_speed.seen_between(later + 10, later + 11) is None
        with CpuAccount({}) as account:
            pass
        # A window without a reading: no share rather than a zero.
        assert "host_slow_share" not in account.figures()
    finally:
        host_speed.Probe.current = None
    assert host_speed.seen_between(later, later + 1) is None


def test_windows_merge_their_slow_shares_by_readings():
    base = {"cpu_seconds": {}, "host_cpu_seconds_available": 10.0, "host_busy_share": 0.5}
    merged = cpu_sum([{**base, "host_slow_share": 0.5, "host_probe_readings": 20,
                       "host_cache_read_ns": 60.0},
                      {**base, "host_slow_share": 0.0, "host_probe_readings": 60,
                       "host_cache_read_ns": 20.0},
                      base])
    assert (merged["host_slow_share"], merged["host_probe_readings"],
            merged["host_cache_read_ns"]) == (0.125, 80, 30.0)
    assert "host_slow_share" not in cpu_sum([base])


def test_a_probe_line_from_before_the_cache_reads_still_reads(tmp_path):
    probe = host_speed.Probe(tmp_path / "probe.txt")
    probe.path.write_text("100.000 1.2 0\n100.500 1.9 1 45.5\n")
    assert probe.readings(0, 200) == [host_speed.Reading(1.2, False, None),
                                      host_speed.Reading(1.9, True, 45.5)]
