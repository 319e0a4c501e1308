"""``python -m bench.host_effect RUN RUN RUN ...``: how much of the runs' differences is the host.

The same workload can cost the machine more CPU in one run than in the next, when the host
under it is slower for a while. For each step every run has (the steady rates and the status
sync), this sets the latency percentiles beside the machine's CPU per unit of work: every
process group's CPU seconds over the jobs dispatched or the statuses copied. Then, for each
percentile, its correlation with that CPU over the runs (Pearson). A correlation near 1
says the figure follows the host: where those runs differ, the host did first. Where the
runs recorded it, the host probe's median time per cache read (``bench.host_speed``) is
set beside them too, with its own correlation with the CPU: whether the probe sees what
makes the host slower.

Quick and full runs may be mixed: a step at a rate does the same work per job in both (a
full run's step only collects more samples).

Exit status 0, or 2 on bad input (fewer than three runs, or a run ``bench.agreement``
refuses).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from bench.agreement import PERCENTILES, RunError, cpu_per_unit_ms, load, steps

MIN_RUNS = 3


def _correlation(xs: list[float], ys: list[float]) -> float | None:
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:  # a constant series: no correlation to speak of
        return None


def _with_cpu(rows: list[tuple], values: list[float | None]) -> str:
    """The correlation of ``values`` (one per row) with the rows' CPU per unit, over the
    rows that have one; "n/a" with fewer than ``MIN_RUNS`` or a constant series."""
    pairs = [(row[0], v) for row, v in zip(rows, values, strict=True) if v is not None]
    r = _correlation([c for c, _ in pairs], [v for _, v in pairs]) \
        if len(pairs) >= MIN_RUNS else None
    return "n/a" if r is None else f"{r:.2f}"


def render(runs: list[tuple[str, dict]]) -> str:
    """Per step every run (lowest CPU per unit first) and each percentile's correlation."""
    named = [(name, steps(results)) for name, results in runs]
    common = [step for step in named[0][1] if all(step in s for _, s in named)]
    lines = []
    for step in common:
        rows = []
        for name, by_step in named:
            summary, data, units = by_step[step]
            cpu = cpu_per_unit_ms(data, units)
            if cpu is not None:
                rows.append((cpu, name, [summary.get(p) for p in PERCENTILES],
                             (data.get("cpu") or {}).get("host_cache_read_ns")))
        rows.sort()
        lines += [f"### {step}", "",
                  "| run | machine CPU per unit, ms | " + " | ".join(
                      f"{p[:-3]} ms" for p in PERCENTILES) + " | host cache read, ns |",
                  "|---|---|" + "---|" * (len(PERCENTILES) + 1)]
        lines += [f"| {name} | {cpu:g} | " + " | ".join(
                      "n/a" if v is None else f"{v:g}" for v in [*figures, read]) + " |"
                  for cpu, name, figures, read in rows]
        lines.append("")
        if len(rows) < MIN_RUNS:
            lines += [f"Too few runs with CPU readings in this step ({len(rows)}) for a "
                      "correlation.", ""]
            continue
        cpus = [cpu for cpu, _, _, _ in rows]
        said = [f"{p[:-3]} {_with_cpu(rows, [figures[i] for _, _, figures, _ in rows])}"
                for i, p in enumerate(PERCENTILES)]
        said.append(f"the host's cache reads {_with_cpu(rows, [r for *_, r in rows])}")
        lines += [f"The machine's CPU per unit of work: {min(cpus):g} to {max(cpus):g} ms "
                  f"({max(cpus) / min(cpus) - 1:.0%} apart) over {len(rows)} runs. "
                  f"Correlation with it: {', '.join(said)}.", ""]
    return "\n".join(lines).rstrip() + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.host_effect",
        description="Set several benchmark runs' latency percentiles (the steady steps' and "
        "the status sync's) beside the machine's CPU per job or status change in the same "
        "step, and give each percentile's correlation with it over the runs: how much of "
        "their differences follows the host's speed. Quick and full runs may be mixed. "
        "Exit status: 0, or 2 on bad input.")
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN",
                        help=f"a benchmark's --output directory, or its results.json "
                        f"(at least {MIN_RUNS})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if len(args.runs) < MIN_RUNS:
        print(f"error: {len(args.runs)} run(s) given; a correlation needs at least "
              f"{MIN_RUNS}", file=sys.stderr)
        return 2
    try:
        runs = [(str(path), load(path)) for path in args.runs]
    except RunError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(render(runs), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
