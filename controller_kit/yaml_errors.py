"""Describing a YAML error without quoting the document: a kubeconfig or a Path file may
hold tokens, and a parser's message echoes the offending line. Only the position is told."""

from __future__ import annotations

from pathlib import Path

import yaml


def yaml_error_position(err: yaml.YAMLError) -> str:
    """``"not valid YAML at line 6, column 30"`` (or without a position when the parser
    gave none); never any of the document's text."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    if mark is None:
        return "not valid YAML"
    return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}"


class YamlFileError(ValueError):
    """A YAML file that cannot be read or is not a mapping; the message says why without
    quoting it."""


def read_yaml_mapping(path: Path) -> dict:
    """The mapping at the top of the YAML file ``path`` (empty for an empty file)."""
    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as err:
        raise YamlFileError(f"cannot read it: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise YamlFileError(yaml_error_position(err)) from None
    if not isinstance(loaded, dict):
        raise YamlFileError("the top level must be a mapping")
    return loaded
