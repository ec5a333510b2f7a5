"""Dotted paths (``parallel.tp``) into an experiment document: read, write, override."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ..experiment import preset_fields

__all__ = ["get_path", "set_path", "apply_overrides"]


def get_path(doc: Mapping, path: str, default: Any = None) -> Any:
    """The value at dotted ``path`` of ``doc``.

    Parameters
    ----------
    doc : Mapping
        An experiment document; a section given as a string is read as ``{preset: <string>}`` (a
        cluster's ``PRESET:NODES`` as ``{preset: PRESET, nodes: NODES}``).
    path : str
        Dotted path, e.g. ``"parallel.tp"``.
    default : Any, optional
        Returned when the path is absent.

    Returns
    -------
    Any
        The value, or ``default``.

    Examples
    --------
    >>> get_path({"cluster": "dgx-h100"}, "cluster.preset")
    'dgx-h100'
    """
    node: Any = doc
    section = ""
    for part in path.split("."):
        if isinstance(node, str):
            node = preset_fields(section, node)
        if not isinstance(node, Mapping) or part not in node:
            return default
        node, section = node[part], part
    return node


def set_path(doc: dict, path: str, value: Any) -> None:
    """Set dotted ``path`` of ``doc`` in place, creating sections.

    Parameters
    ----------
    doc : dict
        An experiment document, modified in place; a section given as a
        string becomes ``{preset: <string>}`` first (a cluster's
        ``PRESET:NODES``: ``{preset: PRESET, nodes: NODES}``).
    path : str
        Dotted path, e.g. ``"cluster.nodes"``.
    value : Any
        The new value.

    Raises
    ------
    ValueError
        When a parent of ``path`` holds a plain value rather than a section.
    """
    parts = path.split(".")
    node = doc
    for i, part in enumerate(parts[:-1]):
        if not isinstance(node, dict):  # (a list or plain value above the path's end: faults.0.factor)
            raise ValueError(f"{path}: {'.'.join(parts[:i])} is not a section of fields")
        child = node.get(part)
        if isinstance(child, str):
            child = preset_fields(part, child)
        elif not isinstance(child, dict):
            child = {} if child is None else child
        node[part] = child
        node = child
    if not isinstance(node, dict):
        raise ValueError(f"{path}: {'.'.join(parts[:-1])} is not a section of fields")
    node[parts[-1]] = value


def apply_overrides(base: Mapping, overrides: Mapping[str, Any]) -> dict:
    """A deep copy of ``base`` with every dotted override set.

    Parameters
    ----------
    base : Mapping
        The experiment document; not modified.
    overrides : Mapping
        Dotted path -> value, applied with :func:`set_path` a section before the fields inside it (``cluster``
        before ``cluster.oversubscription``, whatever the grid's order: a whole section set last replaced the
        fields set before it), each value a copy (a later override of a field inside it must not change the
        caller's value, which other points share).

    Returns
    -------
    dict
        The new document.

    Examples
    --------
    >>> apply_overrides({"parallel": {"tp": 1}}, {"parallel.tp": 4, "cluster.nodes": 2})
    {'parallel': {'tp': 4}, 'cluster': {'nodes': 2}}
    """
    doc = copy.deepcopy(dict(base))
    for path, value in sorted(overrides.items(), key=lambda item: item[0].count(".")):  # (stable: in order)
        set_path(doc, path, copy.deepcopy(value))
    return doc
