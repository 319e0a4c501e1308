"""Shared core of the dispatcher and the training operator: API constants and types, the
runtime framework that turns a TrainJob and its runtime into PodSets, and Kubernetes
plumbing (clients, informers, work queues)."""
