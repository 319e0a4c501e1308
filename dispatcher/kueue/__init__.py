"""Kueue mode (``--mode kueue``): the dispatcher as Kueue MultiKueue's external dispatcher.
The pure nomination decision (``decisions``), its executor (``nominator``) and the reading
of manager Workloads (``workloads``). Kueue makes the copies, syncs status and collects
garbage itself."""
