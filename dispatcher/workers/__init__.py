"""The worker clusters: the registry (``registry``) and its parts, registration from
MultiKueueClusters and their Secrets, connections, probing, duplicate registrations,
draining and the ``Active`` condition."""
