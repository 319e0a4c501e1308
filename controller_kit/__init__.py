"""Generic Kubernetes controller plumbing shared by the dispatcher and the operator:
clients, informers, work queues, leader election, Events, the process and its listeners.
It imports nothing of the project (tests/unit/test_import_graph.py holds it to that)."""
