#!/usr/bin/env python3
"""An OCI runtime in front of ``runc`` for machines whose capability bounding set is short.

A privileged container asks for every capability; where the host itself lacks one (some
sandboxes drop ``CAP_SYS_RESOURCE`` from the bounding set), runc cannot grant it and refuses
to start the container (``unable to apply caps: operation not permitted``). This program takes
the same arguments as runc, removes the capabilities the host cannot give from the container's
``config.json`` (``create``/``run``) or from the process file (``exec --process``), then runs
the real runc with the arguments unchanged. Nothing else is touched.

It is self-contained on purpose: the engine executes it by path, outside any virtualenv.
"""

from __future__ import annotations

import json
import os
import sys

CAPABILITY_NAMES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
    "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
)


def missing_capabilities(status_path: str = "/proc/self/status") -> set[str]:
    """The capabilities this host's bounding set lacks (a container cannot be given them)."""
    with open(status_path, encoding="ascii") as status:
        for line in status:
            if line.startswith("CapBnd:"):
                bounding = int(line.split()[1], 16)
                return {name for bit, name in enumerate(CAPABILITY_NAMES)
                        if not bounding & (1 << bit)}
    return set()


def strip_capabilities(process: dict, missing: set[str]) -> bool:
    """Removes ``missing`` from every capability set of an OCI process; True if it changed."""
    sets = process.get("capabilities") or {}
    changed = False
    for key, names in sets.items():
        kept = [name for name in names or () if name not in missing]
        if len(kept) != len(names or ()):
            sets[key] = kept
            changed = True
    return changed


def _rewrite(path: str, select, missing: set[str]) -> None:
    with open(path, encoding="utf-8") as source:
        document = json.load(source)
    if strip_capabilities(select(document), missing):
        with open(path, "w", encoding="utf-8") as target:
            json.dump(document, target)


def _option(args: list[str], *names: str) -> str | None:
    for index, arg in enumerate(args):
        for name in names:
            if arg == name and index + 1 < len(args):
                return args[index + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _subcommand(args: list[str]) -> tuple[str | None, list[str]]:
    # runc's global options that take a value come before the subcommand.
    valued = {"--root", "--log", "--log-format", "--criu", "--rootless"}
    index = 0
    while index < len(args):
        arg = args[index]
        if arg in valued:
            index += 2
            continue
        if arg.startswith("-"):
            index += 1
            continue
        return arg, args[index + 1:]
    return None, []


def main(argv: list[str]) -> None:
    runc = os.environ.get("TRAINJOB_RUNC", "runc")
    missing = missing_capabilities()
    command, rest = _subcommand(argv)
    if missing and command in ("create", "run"):
        bundle = _option(rest, "--bundle", "-b") or os.getcwd()
        _rewrite(os.path.join(bundle, "config.json"), lambda doc: doc.get("process") or {},
                 missing)
    elif missing and command == "exec":
        process_file = _option(rest, "--process", "-p")
        if process_file:
            _rewrite(process_file, lambda doc: doc, missing)
    os.execvp(runc, [runc, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
