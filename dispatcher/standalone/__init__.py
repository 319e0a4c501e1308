"""Standalone mode: the dispatcher does the whole job. The next step per job
(``decisions``, jobs on a lost or leaving worker in ``worker_loss``, the steps in
``actions``) performed by the ``reconciler``; copies built (``mirror``) and written
(``remote_copies``), status copied back (``status_sync``), garbage collected
(``garbage_collection``), timings (``job_timing``), and stepping aside for Kueue on the
manager (``beside_kueue``)."""
