"""The registry of runtime plug-ins: each plug-in module calls ``register`` when imported,
and the framework asks ``registered`` for the list. A module of its own so that a plug-in
depends on it and not on the package that imports every plug-in."""

from __future__ import annotations

from trainjob.runtime.extension_points import Plugin

_PLUGINS: list[Plugin] = []


def register(plugin: Plugin) -> Plugin:
    """Add ``plugin`` once (by name); returns it so a module can keep a reference."""
    if all(p.name != plugin.name for p in _PLUGINS):
        _PLUGINS.append(plugin)
    return plugin


def registered() -> list[Plugin]:
    """The registered plug-ins in the order they registered."""
    return list(_PLUGINS)
