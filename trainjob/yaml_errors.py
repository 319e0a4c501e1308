"""Describing a YAML error without quoting the document: a kubeconfig or a Path file may
hold tokens, and a parser's message echoes the offending line. Only the position is told."""

from __future__ import annotations

import yaml


def yaml_error_position(err: yaml.YAMLError) -> str:
    """``"not valid YAML at line 6, column 30"`` (or without a position when the parser
    gave none); never any of the document's text."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    if mark is None:
        return "not valid YAML"
    return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}"
