"""Differential conformance against upstream Kubeflow Trainer: the same objects applied to
upstream's controller and to this operator, the results compared field by field
(``python -m clusters conformance``)."""
