"""Log lines carry the object they are about, in both formats."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from controller_kit import logs


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_namespace_name_and_cluster(capsys, restore_logging):
    logs.configure("info", "json")
    log = logging.getLogger("dispatcher.test")
    with logs.context(namespace="team-a", name="bert"):
        log.info("before placement")
        logs.bind(cluster="worker-2")
        log.info("placed")
    log.info("outside")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(e["msg"], e.get("namespace"), e.get("name"), e.get("cluster")) for e in lines] == [
        ("before placement", "team-a", "bert", None),
        ("placed", "team-a", "bert", "worker-2"),
        ("outside", None, None, None),
    ]


def test_text_lines_end_with_key_values_and_tracebacks_stay_below(capsys, restore_logging):
    logs.configure("info", "text")
    log = logging.getLogger("dispatcher.test")
    with logs.context(namespace="team-a", name="bert", cluster="worker-1"):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("create failed")
    first, *rest = capsys.readouterr().err.splitlines()
    assert first.endswith("create failed namespace=team-a name=bert cluster=worker-1"), first
    assert rest[0].startswith("Traceback") and rest[-1] == "RuntimeError: boom", rest


def test_contexts_do_not_leak_between_threads(capsys, restore_logging):
    logs.configure("info", "json")
    log = logging.getLogger("dispatcher.test")
    inside, done = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait(5)
        log.info("other thread")
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with logs.context(namespace="team-a", name="bert"):
        inside.set()
        assert done.wait(5), "the other thread did not log"
    thread.join(5)
    (entry,) = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert entry["msg"] == "other thread" and "namespace" not in entry, entry


def test_process_fields_are_on_every_line_and_a_context_overrides_them(capsys,
                                                                      restore_logging):
    logs.configure("info", "json")
    logs.set_process_fields(cluster="worker-1")
    try:
        log = logging.getLogger("training_operator.test")
        log.info("starting")
        with logs.context(namespace="team-a", name="bert"):
            log.info("jobset created")
        with logs.context(cluster="elsewhere"):
            log.info("overridden")
    finally:
        logs.set_process_fields()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(e["msg"], e.get("namespace"), e.get("cluster")) for e in lines] == [
        ("starting", None, "worker-1"), ("jobset created", "team-a", "worker-1"),
        ("overridden", None, "elsewhere")]
