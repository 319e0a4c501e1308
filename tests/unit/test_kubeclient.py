"""The per-cluster client rate limit."""

import time

from trainjob.kubeclient import TokenBucket


def test_token_bucket_spends_the_burst_then_paces():
    bucket = TokenBucket(qps=100, burst=5)
    waits = [bucket.acquire() for _ in range(5)]
    assert waits == [0.0] * 5  # the burst is free
    started = time.monotonic()
    for _ in range(5):
        bucket.acquire()
    elapsed = time.monotonic() - started
    assert 0.03 <= elapsed < 0.5, f"5 tokens past the burst at 100/s took {elapsed:.3f}s"


def test_an_api_error_is_one_line_with_code_reason_and_message():
    from kubernetes.client.exceptions import ApiException

    from trainjob.kubeclient import describe_error

    err = ApiException(status=422, reason="Unprocessable Entity")
    err.body = ('{"kind":"Status","status":"Failure","reason":"Invalid","code":422,'
                '"message":"TrainJob.trainer.kubeflow.org \\"x\\" is invalid:\\n spec.a: bad"}')
    err.headers = {"Audit-Id": "1234"}
    assert describe_error(err) == \
        'HTTP 422 Invalid: TrainJob.trainer.kubeflow.org "x" is invalid: spec.a: bad'
    assert describe_error(ApiException(status=503, reason="Service Unavailable")) == \
        "HTTP 503 Service Unavailable"
    assert describe_error(ValueError("two\nlines")) == "ValueError: two lines"


def test_apply_bodies_write_characters_beyond_the_bmp_as_themselves():
    import json

    from trainjob.kubeclient import apply_body

    body = {"data": {"init.sh": 'echo "\U0001f438 ready"'}}
    encoded = apply_body(body)
    # The apiserver's YAML decoder refuses the surrogate escapes json.dumps writes by default.
    assert b"\\ud83d" not in encoded and "\U0001f438".encode() in encoded
    assert json.loads(encoded) == body
