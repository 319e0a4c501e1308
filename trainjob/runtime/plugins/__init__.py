"""Registry of policy plug-ins. A new framework is a new module here that calls
``register`` at import, plus its import line below; nothing in the core changes."""

from __future__ import annotations

from trainjob.runtime.framework import PolicyPlugin

_PLUGINS: list[PolicyPlugin] = []


def register(plugin: PolicyPlugin) -> PolicyPlugin:
    if all(p.name != plugin.name for p in _PLUGINS):
        _PLUGINS.append(plugin)
    return plugin


def registered() -> list[PolicyPlugin]:
    return list(_PLUGINS)


# Importing a plug-in module registers it.
from trainjob.runtime.plugins import mpi, plain, torch  # noqa: E402,F401
