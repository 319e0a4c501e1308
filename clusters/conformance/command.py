"""``python -m clusters conformance``: on clusters already up in ``--state-dir`` (two workers
or more), else on a harness of its own that it removes afterwards."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from clusters import crds
from clusters.conformance import cases as case_sources
from clusters.conformance import report, run
from clusters.local import LocalClusters
from clusters.nodes import NodeLayout


def main(state_dir: str, names: list[str], as_json: bool, verbose: bool,
         operator_crds: str = crds.PROJECT) -> int:
    cases = case_sources.all_cases()
    if names:
        unknown = sorted(set(names) - {case.name for case in cases})
        if unknown:
            print(f"error: --case {', '.join(unknown)}: no such case; cases: "
                  f"{', '.join(case.name for case in cases)}", file=sys.stderr)
            return 2
        cases = [case for case in cases if case.name in names]
    harness = LocalClusters(state_dir)
    running = [i for i in harness.status() if i.role == "worker" and i.state == "running"]
    with tempfile.TemporaryDirectory(prefix="conformance-") as scratch:
        own = len(running) < 2
        if own:
            print("starting a manager and two workers for the run (they are removed "
                  "afterwards)", file=sys.stderr)
            harness = LocalClusters(Path(scratch) / "clusters", tied_to_caller=True)
            harness.up(workers=2, timeout=180, node_layout=NodeLayout(default=[]))
            running = [i for i in harness.status() if i.role == "worker"]
        try:
            rows = run.run(harness, running[0].name, running[-1].name, cases, Path(scratch),
                           operator_crds)
        finally:
            if own:
                harness.down()
    print(report.as_json(rows) if as_json else report.table(rows, verbose))
    return 0 if not any(row.unexplained for row in rows) else 1
