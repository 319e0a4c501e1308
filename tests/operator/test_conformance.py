"""Differential conformance: upstream Kubeflow Trainer v2.3.0's controller (and its CRDs) on
one worker, this operator on another, every case of ``clusters.conformance.cases`` applied to
both. The table may not gain a difference: every differing (case, object, path) must be one
recorded in ``conformance_known_differences.json`` (each a gap still to close), and the torch
cases must be equal outright."""

from __future__ import annotations

import json
from pathlib import Path

from clusters.conformance import cases, report, run

KNOWN_FILE = Path(__file__).with_name("conformance_known_differences.json")
# Cases with no difference left at all; they must stay that way.
EQUAL_CASES = {"cf-bad-reserved-env", "cf-bad-managed-by", "cf-missing-runtime"}


def _differences(rows: list[run.Row]) -> set[tuple[str, str, str]]:
    return {(row.case, row.label, path) for row in rows for path in row.paths}


def test_table_gains_no_difference(multicluster, tmp_path):
    workers = multicluster.workers
    rows = run.run(multicluster.harness, workers[0].name, workers[-1].name, cases.all_cases(),
                   tmp_path)
    table = report.table(rows)
    known = {tuple(item) for item in json.loads(KNOWN_FILE.read_text())}
    found = _differences(rows)

    unexplained = sorted(found - known)
    assert not unexplained, (
        f"expected no difference beyond {KNOWN_FILE.name}; {len(unexplained)} new:\n"
        + "\n".join(f"  {case} | {label} | {path}" for case, label, path in unexplained)
        + f"\n\n{table}")
    not_equal = sorted({row.case for row in rows if not row.equal} & EQUAL_CASES)
    assert not not_equal, f"expected cases {sorted(EQUAL_CASES)} equal; these differ: " \
                          f"{not_equal}\n\n{table}"
    assert {row.case for row in rows} == {case.name for case in cases.all_cases()}, \
        f"expected a row for every case; saw\n{table}"
