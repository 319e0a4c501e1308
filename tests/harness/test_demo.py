"""`make demo` keeps working: a short run to the end, then nothing of it left running."""

import subprocess
import sys

import pytest

from clusters.processes import harness_processes


@pytest.mark.slow
def test_the_demo_runs_every_sample_to_complete(tmp_path):
    state_dir = tmp_path / "demo"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "clusters", "demo", "--state-dir", str(state_dir),
             "--run-seconds", "1", "--timeout", "240"],
            capture_output=True, text=True, timeout=400)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        final = result.stdout.split("all multicluster jobs are done")[0].strip().split("\n\n")[-1]
        for job in ("mnist", "llm-finetune", "resnet", "bert"):
            line = next(x for x in final.splitlines() if f"default/{job} " in x)
            assert "Complete" in line and ("worker-1" in line or "worker-2" in line), line
        # The GPU job can only run where the GPUs are.
        assert "worker-2" in next(x for x in final.splitlines() if "llm-finetune" in x)
        assert "not dispatched" in next(x for x in final.splitlines() if "local-only" in x)
    finally:
        subprocess.run([sys.executable, "-m", "clusters", "down", "--state-dir", str(state_dir)],
                       capture_output=True, timeout=120)
    assert harness_processes(state_dir) == []
