"""The built-in plug-ins: importing this package imports each of them, and each registers
itself (``trainjob.runtime.plugin_registry``). A new framework or scheduler integration is a
new module here and its line below; nothing in the core changes. Plug-in modules import the
extension points and pod-template helpers, never the framework core."""

from __future__ import annotations

from trainjob.runtime.plugin_registry import registered
from trainjob.runtime.plugins import coscheduling, flux, jax, mpi, torch, volcano, xgboost

BUILT_IN = (coscheduling, flux, jax, mpi, torch, volcano, xgboost)

__all__ = ["BUILT_IN", "registered"]
