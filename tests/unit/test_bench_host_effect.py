"""``python -m bench.host_effect``: several runs' latency percentiles beside the machine's
CPU per unit of work, and how closely each follows it."""

from __future__ import annotations

import json

from bench import host_effect


def _run(tmp_path, name: str, cpu_ms: float, p50: float, p99: float,
         read_ns: float | None = None, **extra) -> str:
    """A run whose steady 50 jobs/s step and sync cost ``cpu_ms`` of machine CPU per unit
    (and whose host probe read its cache in ``read_ns``, when given)."""
    def step(units: int) -> dict:
        cpu = {"cpu_seconds": {"manager apiserver+etcd": cpu_ms * units / 2000,
                               "dispatcher": cpu_ms * units / 2000}}
        if read_ns is not None:
            cpu["host_cache_read_ns"] = read_ns
        return {"cpu": cpu, "runs": []}

    summary = {"count": 1500, "p50_ms": p50, "p90_ms": p50 * 1.5, "p99_ms": p99}
    steady = {**step(1500), "rate": 50, "dispatched": 1500, "latency": summary}
    sync = {**step(1500), "synced": 1500, "lag": summary}
    path = tmp_path / name
    path.mkdir()
    (path / "results.json").write_text(json.dumps({
        "mode": "quick", "settings": {"suite": "dispatcher"}, "steady": [steady],
        "sync": sync, **extra}))
    return str(path)


def test_runs_are_ordered_by_cpu_and_each_percentile_correlated(tmp_path, capsys):
    # p50 follows the CPU exactly; p99 falls as the CPU rises.
    # The probe's cache reads slower on the dearer hosts, though not in step.
    runs = [_run(tmp_path, "slow", 30.0, 15.0, 40.0, 90.0),
            _run(tmp_path, "fast", 20.0, 10.0, 60.0, 30.0),
            _run(tmp_path, "mid", 25.0, 12.5, 45.0, 40.0)]
    assert host_effect.main(runs) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith(f"| {tmp_path}")]
    assert [line.split(" | ")[0][2:] for line in table[:3]] == [
        str(tmp_path / n) for n in ("fast", "mid", "slow")], out
    assert f"| {tmp_path / 'fast'} | 20 | 10 | 15 | 60 | 30 |" in out, out
    assert ("The machine's CPU per unit of work: 20 to 30 ms (50% apart) over 3 runs. "
            "Correlation with it: p50 1.00, p90 1.00, p99 -0.96, the host's cache reads "
            "0.93.") in out, out
    assert out.count("### ") == 2, out  # the steady step and the status sync


def test_too_few_runs_or_a_run_that_cannot_be_read_is_refused(tmp_path, capsys):
    a = _run(tmp_path, "a", 20.0, 10.0, 30.0)
    b = _run(tmp_path, "b", 22.0, 11.0, 31.0)
    assert host_effect.main([a, b]) == 2
    assert "2 run(s) given; a correlation needs at least 3" in capsys.readouterr().err
    cut = _run(tmp_path, "cut", 24.0, 12.0, 32.0, incomplete="interrupted")
    assert host_effect.main([a, b, cut]) == 2
    assert "the run is incomplete (interrupted)" in capsys.readouterr().err


def test_equal_cpu_in_every_run_gives_no_correlation_rather_than_an_error(tmp_path, capsys):
    runs = [_run(tmp_path, n, 20.0, p50, 30.0) for n, p50 in (("a", 10.0), ("b", 11.0),
                                                              ("c", 12.0))]
    assert host_effect.main(runs) == 0
    out = capsys.readouterr().out
    # Runs from before the probe read its cache: that column says so.
    assert "| 20 | 10 | 15 | 30 | n/a |" in out, out
    assert ("Correlation with it: p50 n/a, p90 n/a, p99 n/a, the host's cache reads "
            "n/a.") in out, out
