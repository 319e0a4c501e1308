"""Each failure written down the moment its report arrives (a pytest plugin).

pytest-xdist prints which tests failed only in the run's summary; a run stopped before its
end (a CI job's time limit, a machine going away) leaves a bare ``F`` in the progress line
and no name. The controlling process appends every failed report (its time, process, test,
phase and the report's text) to ``test-artifacts/failures.txt`` as it comes in, so a run
cut short still says what failed and why. The file is emptied when a run starts; an empty
file after a run means nothing failed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from clusters.test_timeline import report_process

OUTPUT = Path("test-artifacts") / "failures.txt"


class FailureLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.failed:
            return
        process = report_process(report)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self.path.open("a") as out:
            out.write(f"{stamp} {process} FAILED in {report.when}: {report.nodeid}\n"
                      f"{report.longreprtext}\n\n")


def pytest_configure(config) -> None:
    # Only the controlling process: it receives every worker's reports.
    if "PYTEST_XDIST_WORKER" not in os.environ:
        config.pluginmanager.register(FailureLog(OUTPUT), "failure-log")
