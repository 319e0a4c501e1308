"""Registry of plug-ins. A new framework or scheduler integration is a new module here that
calls ``register`` at import, plus its import line below; nothing in the core changes.
Plug-in modules import the extension points and pod-template helpers, never the framework
core, so the core can import this registry at its top."""

from __future__ import annotations

from trainjob.runtime.extension_points import Plugin

_PLUGINS: list[Plugin] = []


def register(plugin: Plugin) -> Plugin:
    if all(p.name != plugin.name for p in _PLUGINS):
        _PLUGINS.append(plugin)
    return plugin


def registered() -> list[Plugin]:
    return list(_PLUGINS)


# Importing a plug-in module registers it.
from trainjob.runtime.plugins import (  # noqa: E402,F401
    coscheduling,
    flux,
    jax,
    mpi,
    torch,
    volcano,
    xgboost,
)
