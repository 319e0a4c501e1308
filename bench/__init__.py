"""Benchmarks of the dispatcher on the local multi-cluster harness (``python -m bench``)."""
