"""``python -m bench.commits A B``: the same benchmark on two commits, back to back.

A figure that moved between two runs a day apart may be the code or the machine: the host
here changes speed by a third for minutes at a time. This tells the two apart by running
both commits on the same machine, in the same minutes, alternately (A, B, A, B, ...), each
from a clean tree of its own:

* each commit is checked out in a git worktree under ``--trees`` with a virtualenv of its
  own (its own ``pyproject.toml``'s packages), so the run measures that commit's code; a
  later comparison of the same commit reuses them;
* every run uses the binaries the harness cached (``python -m clusters provision``): the
  clusters are the same for both;
* each run is ``python -m bench`` with the same arguments (``--quick --suite dispatcher``
  unless others are given after ``--``), into ``--output``/``<label>-<round>``;
* the table sets each figure of every run side by side, the median of each commit's runs
  and their ratio B/A, with the host's reference work (a fixed piece of CPU work, timed at
  each run's start and end) in the same table: a ratio far from 1 in the figures while the
  reference work agrees is the code; one that follows the reference work is the host.

It exits 0 once every run finished (whatever the figures say), 1 when a run failed, 2 on
bad input (a commit git does not know).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from bench import agreement

DEFAULT_BENCH_ARGS = ("--quick", "--suite", "dispatcher")
REPO = Path(__file__).resolve().parent.parent


class CommitError(ValueError):
    """A commit that cannot be checked out; the message names it."""


def resolve(commit: str) -> str:
    """The full hash of ``commit`` in this repository."""
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet",
                            f"{commit}^{{commit}}"], capture_output=True, text=True)
    if found.returncode != 0:
        raise CommitError(f"{commit}: not a commit of {REPO} (git rev-parse found none)")
    return found.stdout.strip()


def prepare(commit: str, tree: Path) -> Path:
    """A worktree of ``commit`` at ``tree`` with its own virtualenv; its python."""
    python = tree / ".venv" / "bin" / "python"
    if (tree / ".git").exists() and python.exists():
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        if head == commit:
            return python  # prepared by an earlier comparison: reused
    if tree.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                       capture_output=True)
        shutil.rmtree(tree, ignore_errors=True)
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), commit],
                   check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "venv", str(tree / ".venv")], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-e", f"{tree}[test]"],
                   check=True)
    return python


def run_once(python: Path, tree: Path, output: Path, bench_args: list[str]) -> bool:
    """One benchmark run of the tree; whether it finished."""
    with open(output.with_suffix(".log"), "w") as log:
        done = subprocess.run([str(python), "-m", "bench", *bench_args, "--output",
                               str(output)], cwd=tree, stdout=log, stderr=subprocess.STDOUT)
    return done.returncode == 0


def figures(results: dict) -> dict[str, float | None]:
    """The figures compared, by name: each step's latency percentiles, the machine's CPU
    per unit of work, the burst's throughput and the host's reference work."""
    named: dict[str, float | None] = {}
    reference = results.get("environment", {}).get("reference_work_ms") or {}
    for when in ("start", "end"):
        named[f"host reference work at {when}, CPU ms"] = reference.get(when)
    burst = results.get("burst") or {}
    named["burst throughput, jobs/s"] = burst.get("throughput_jobs_per_second")
    for name, (latency, step, units) in agreement.steps(results).items():
        for percentile in agreement.PERCENTILES:
            named[f"{name} {percentile[:-3]} ms"] = latency.get(percentile)
        named[f"{name}: machine CPU per unit, ms"] = agreement.cpu_per_unit_ms(step, units)
    slowest = (results.get("sync") or {}).get("slowest") or {}
    for segment, value in (slowest.get("mean_ms") or {}).items():
        named[f"status sync slowest 1 %: {segment} ms"] = value
    return named


def table(labels: tuple[str, str], runs: dict[str, list[dict]]) -> str:
    """Markdown: each figure of every run, the median per commit and the ratio B/A."""
    a, b = labels
    per_run = {label: [figures(results) for results in runs[label]] for label in labels}
    names = list(dict.fromkeys(name for label in labels for run in per_run[label]
                               for name in run))
    header = ([f"{a} run {i + 1}" for i in range(len(runs[a]))]
              + [f"{b} run {i + 1}" for i in range(len(runs[b]))])
    lines = [f"| figure | {' | '.join(header)} | median {a} | median {b} | {b}/{a} |",
             "|---" * (len(header) + 4) + "|"]
    for name in names:
        cells, medians = [], {}
        for label in labels:
            values = [run.get(name) for run in per_run[label]]
            cells.extend("-" if value is None else f"{value:g}" for value in values)
            known = [value for value in values if value is not None]
            medians[label] = statistics.median(known) if known else None
        ratio = (f"{medians[b] / medians[a]:.2f}" if medians[a] and medians[b] is not None
                 else "-")
        lines.append(f"| {name} | {' | '.join(cells)} | "
                     + " | ".join("-" if medians[label] is None else f"{medians[label]:g}"
                                  for label in labels) + f" | {ratio} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.commits", description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="the first commit (the baseline: ratios are B/A)")
    parser.add_argument("b", help="the second commit")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each commit, alternately A, B, A, B... (default 2)")
    parser.add_argument("--output", type=Path, default=Path("bench-results/commits"),
                        help="the runs and table.md (default bench-results/commits)")
    parser.add_argument("--trees", type=Path, default=Path("bench-results/trees"),
                        help="one worktree and virtualenv per commit, kept and reused by "
                        "later comparisons (default bench-results/trees)")
    parser.epilog = ("After --: the arguments of every python -m bench run (default "
                     f"{' '.join(DEFAULT_BENCH_ARGS)}).")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    # What follows -- is the benchmark's own: kept away from this parser.
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least one run of each commit is needed")
    bench_args = argv[split + 1:] or list(DEFAULT_BENCH_ARGS)
    if "--output" in bench_args:
        parser.error("--output after --: each run's output is chosen here (use --output "
                     "before --, the directory for every run)")
    try:
        commits = {"A": resolve(args.a), "B": resolve(args.b)}
    except CommitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    output = args.output.resolve()
    output.mkdir(parents=True, exist_ok=True)
    pythons, trees = {}, {}
    for label, commit in commits.items():
        trees[label] = args.trees.resolve() / commit
        print(f"{label} = {commit[:12]}: worktree and virtualenv in {trees[label]}",
              flush=True)
        pythons[label] = prepare(commit, trees[label])
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    for round_ in range(1, args.rounds + 1):
        for label in ("A", "B"):
            where = output / f"{label}-{round_}"
            print(f"round {round_}: {label} ({commits[label][:12]}) into {where}", flush=True)
            if not run_once(pythons[label], trees[label], where, bench_args):
                print(f"error: the run of {label} ({commits[label][:12]}) failed; its "
                      f"output: {where.with_suffix('.log')}", file=sys.stderr)
                return 1
            runs[label].append(json.loads((where / "results.json").read_text()))
    rendered = (f"A = {commits['A'][:12]} ({args.a}), B = {commits['B'][:12]} ({args.b}); "
                f"python -m bench {' '.join(bench_args)}, {args.rounds} rounds, A then B\n\n"
                + table(("A", "B"), runs))
    (output / "table.md").write_text(rendered + "\n")
    print(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
