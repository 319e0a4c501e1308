"""Manager-side dispatcher: claims MultiKueue TrainJobs, places them on worker clusters,
mirrors them there and syncs their status back.

``controller`` wires the parts: ``workers/`` (the worker registry), ``placement/`` (where a
job goes and the room it holds), ``standalone/`` (the job path when the dispatcher does
the whole job) and ``kueue/`` (Kueue mode: nominating workers for Kueue's Workloads)."""
