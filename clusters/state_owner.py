"""Which provider made a state directory, so that a command of one provider never stops,
changes or removes the clusters of the other.

The record is the provider's state file: the local provider's ``state.json`` or kind's
``kind-state.json`` (each also names its provider inside). A command refuses a directory
another provider made, naming that provider and the command to use instead; ``down``
removes only its own provider's files.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from clusters.controlplane import ControlPlaneError
from clusters.state_dir import LOCK_FILE

LOCAL = "local"
KIND = "kind"
STATE_FILES = {LOCAL: "state.json", KIND: "kind-state.json"}
# Files only kind writes into a state directory: its node configs, the kubeconfigs for
# inside the Docker network, Kueue's certificates, and the kubeconfigs `deploy` stores.
# A directory of files mounted into kind nodes.
KIND_MOUNTS_SUFFIX = ".kind-mounts"
KIND_SUFFIXES = (".kind.yaml", ".internal.kubeconfig", ".kueue-pki", ".dispatcher.kubeconfig",
                 ".kueue.kubeconfig", KIND_MOUNTS_SUFFIX)
# Commands on clusters that exist: the maker's own command of the same name does the job.
ON_EXISTING_CLUSTERS = ("down", "stop", "start", "status")


class OtherProviderError(ControlPlaneError):
    """A command of one provider refused on a state directory the other provider made."""


def command(provider: str, verb: str, directory: Path, *args: str) -> str:
    """The ``python -m clusters`` command line running ``verb`` of ``provider`` on
    ``directory`` (the local provider is the default, so it needs no flag)."""
    flags = [] if provider == LOCAL else ["--provider", provider]
    return shlex.join(["python", "-m", "clusters", verb, *args, *flags,
                       "--state-dir", str(directory)])


def file_maker(path: Path) -> str | None:
    """The provider that writes ``path`` and no other (None: a name both use, such as
    ``<name>.kubeconfig``, or one neither does)."""
    for provider, name in STATE_FILES.items():
        if path.name == name:
            return provider
    if path.name.endswith(KIND_SUFFIXES):
        return KIND
    # A local cluster's own directory: its certificates and its etcd data.
    if path.is_dir() and ((path / "pki").is_dir() or (path / "etcd").is_dir()):
        return LOCAL
    return None


def makers(directory: Path) -> set[str]:
    """The providers whose clusters ``directory`` holds (empty: none, or no directory)."""
    if not directory.is_dir():
        return set()
    recorded = {p for p, name in STATE_FILES.items() if (directory / name).is_file()}
    if recorded:
        return recorded
    # No state file (removed by hand, or a directory a command left half made): the files
    # only one provider writes still say whose clusters these were.
    return {p for p in map(file_maker, directory.iterdir()) if p is not None}


def refuse_others(directory: Path, provider: str, verb: str, *args: str) -> None:
    """Raise ``OtherProviderError`` when ``directory`` holds another provider's clusters.

    ``down`` is refused only when none of them are ``provider``'s: in a directory that holds
    both (made before this check), each provider's ``down`` removes its own."""
    found = makers(directory)
    others = sorted(found - {provider})
    if not others or (verb == "down" and provider in found):
        return
    if provider in found:
        downs = " and ".join(f"`{command(p, 'down', directory)}`" for p in sorted(found))
        raise OtherProviderError(
            f"{directory} holds clusters of both the {' and the '.join(sorted(found))} "
            f"providers (made before a state directory was kept to one); `{verb}` would mix "
            f"them up: bring each down with {downs}")
    owner = others[0]
    refusal = (f"{directory} was made by the {owner} provider, and a {provider} command never "
               f"touches another provider's clusters")
    if verb in ON_EXISTING_CLUSTERS:
        raise OtherProviderError(f"{refusal}: use `{command(owner, verb, directory, *args)}`")
    raise OtherProviderError(
        f"{refusal}: for {provider} clusters use another --state-dir, or first bring the "
        f"{owner} provider's down with `{command(owner, 'down', directory)}`")


def remove_own_files(directory: Path, provider: str) -> None:
    """Remove what ``provider`` made in ``directory`` (its lock stays; call under it).

    In a directory only ``provider`` made, that is everything: logs, kubeconfigs and what
    the demo and the tests wrote beside them. Beside another provider's clusters, only
    the files ``provider`` alone writes; in a directory no provider made, nothing."""
    found = makers(directory)
    if provider not in found:
        return
    for child in list(directory.iterdir()):
        if child.name == LOCK_FILE or (found != {provider} and file_maker(child) != provider):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def remove_if_emptied(directory: Path) -> bool:
    """Remove ``directory`` when it holds nothing but its lock; whether it is gone."""
    if not directory.exists():
        return True
    if {child.name for child in directory.iterdir()} <= {LOCK_FILE}:
        shutil.rmtree(directory, ignore_errors=True)
    return not directory.exists()
