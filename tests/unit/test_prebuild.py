"""The background build of the images (``clusters.prebuild``): started only when the run
selected modules that need them, waited for by the fixtures through its lock, and its
failure reported with its log."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from clusters import prebuild


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERS_CACHE_DIR", str(tmp_path))
    return tmp_path


def _builder(state: str) -> subprocess.Popen:
    """A process that holds the build's lock until a line comes on its input, then leaves
    ``state``."""
    code = textwrap.dedent(f"""
        import json, sys
        from clusters import prebuild
        with prebuild._locked(blocking=True):
            prebuild._result_file().write_text(json.dumps({{"state": "building"}}))
            print("holding", flush=True)
            sys.stdin.readline()  # until the test lets the build end
            prebuild._result_file().write_text(json.dumps({{"state": "{state}",
                                                            "error": "no engine"}}))
    """)
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "holding"
    return process


def test_only_the_container_and_kind_modules_need_the_images():
    assert prebuild.selected(["tests/unit/test_x.py::t", "tests/kind/test_y.py::t"])
    assert prebuild.selected(["tests/containers/test_images.py::t"])
    assert not prebuild.selected(["tests/unit/test_x.py::t", "tests/dispatcher/test_d.py::t"])


def test_a_run_that_needs_no_image_starts_no_build(cache):
    assert prebuild.start_if_selected(["tests/unit/test_x.py::t"]) is False
    assert not (cache / "prebuild.json").exists()


def test_a_fixture_waits_while_the_build_holds_the_lock(cache):
    builder = _builder("built")
    waiter = threading.Thread(target=prebuild.wait, kwargs={"timeout": 60})
    waiter.start()
    waiter.join(1.5)
    assert waiter.is_alive(), "the fixture went on while the build held the lock"
    builder.stdin.write("done\n")
    builder.stdin.flush()
    waiter.join(30)
    assert not waiter.is_alive() and builder.wait(timeout=30) == 0


def test_a_failed_build_is_reported_with_its_log(cache):
    (cache / "prebuild.log").write_text("step 1\nimages: build failed: no engine\n")
    builder = _builder("failed")
    builder.stdin.write("done\n")
    builder.stdin.flush()
    with pytest.raises(prebuild.PrebuildError) as failed:
        prebuild.wait(timeout=60)
    builder.wait(timeout=30)
    assert "no engine" in str(failed.value) and "images: build failed" in str(failed.value)


def test_a_build_just_started_is_waited_for_and_not_started_twice(cache):
    (cache / "prebuild.json").write_text(json.dumps({"state": "starting", "at": time.time()}))
    # Another process asked first: this one starts nothing more.
    assert prebuild.start_if_selected(["tests/kind/test_y.py::t"]) is True
    assert json.loads((cache / "prebuild.json").read_text())["state"] == "starting"
    with pytest.raises(prebuild.PrebuildError, match="still runs"):
        prebuild.wait(timeout=1.5)
