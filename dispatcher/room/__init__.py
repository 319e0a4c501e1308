"""What each worker can still hold: its Nodes' room counted from its Pods (``capacity``),
its Kueue queues' quota (``worker_quota``, ``kueue_quota``), the room held for jobs placed
there, and the arithmetic of amounts they share (``amounts``, ``arrival``).

The lowest of the dispatcher's packages: ``workers`` keeps one of each per worker,
``placement`` decides on them, and nothing here imports either.
"""
