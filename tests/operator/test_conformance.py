"""Differential conformance: upstream Kubeflow Trainer v2.3.0's controller (and its CRDs) on
one worker, this operator on another, every case of ``clusters.conformance.cases`` applied to
both. The table may not gain a difference: every difference no documented reason explains
must be a (case, object, path) recorded in ``conformance_known_differences.json`` (a gap
still open), and only the cases in ``OPEN_GAPS`` may have any."""

from __future__ import annotations

import json
from pathlib import Path

from clusters import crds
from clusters.conformance import cases, report, run

KNOWN_FILE = Path(__file__).with_name("conformance_known_differences.json")
# Cases allowed to differ while a gap is open (their differences listed in KNOWN_FILE); none
# today.
OPEN_GAPS: set[str] = set()


def _differences(rows: list[run.Row]) -> set[tuple[str, str, str]]:
    return {(row.case, row.label, path) for row in rows for path in row.unexplained}


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
    not_equal = sorted({row.case for row in rows if row.unexplained} - OPEN_GAPS)
    assert not not_equal, (f"expected every case but {sorted(OPEN_GAPS)} equal or differing "
                           f"only as documented; these differ: {not_equal}\n\n{table}")
    assert {row.case for row in rows} == {case.name for case in cases.all_cases()}, \
        f"expected a row for every case; saw\n{table}"


def test_upstreams_runtimes_and_examples_equal_with_upstreams_crds_on_both(multicluster,
                                                                           tmp_path):
    """The same comparison for upstream's shipped runtimes and examples, this operator's
    worker serving upstream's CRDs (as a cluster that runs Trainer today has them): what
    the operator builds does not depend on which CRDs the worker has."""
    workers = multicluster.workers
    shipped = cases.upstream_runtime_cases() + cases.upstream_example_cases()
    rows = run.run(multicluster.harness, workers[0].name, workers[-1].name, shipped, tmp_path,
                   operator_crds=crds.UPSTREAM)
    table = report.table(rows)
    differing = sorted({row.case for row in rows if row.unexplained})
    assert not differing, (f"expected upstream's runtimes and examples equal with upstream's "
                           f"CRDs on both workers; these differ: {differing}\n\n{table}")
    assert {row.case for row in rows} == {case.name for case in shipped}, table
