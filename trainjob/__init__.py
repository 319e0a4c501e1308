"""Shared domain core of the dispatcher and the training operator: API constants and types,
conditions, and the runtime framework that turns a TrainJob and its runtime into PodSets.
The controller plumbing both use is in ``controller_kit``."""
