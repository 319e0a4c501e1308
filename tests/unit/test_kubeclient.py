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
