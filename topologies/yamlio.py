"""Reading experiment and cluster YAML safely: no alias bombs, no duplicate keys, no sexagesimal numbers.

PyYAML's ``safe_load`` is safe against code execution but not against three
traps of hand-written configuration files:

* **aliases** (``&a`` / ``*a``) expand without limit, so a few lines can
  allocate gigabytes ("billion laughs"); configuration files here never need
  them, so any alias is refused;
* **duplicate keys** silently keep the last value; they are refused, naming
  the key and its line;
* **YAML 1.1 sexagesimal numbers**: ``oversubscription: 2:1`` reads as the
  integer 121 (``2·60 + 1``). Here ``2:1`` stays the string ``"2:1"`` (which
  the ratio fields accept), as YAML 1.2 reads it; likewise ``5e7`` is the float
  50,000,000 (YAML 1.1 needs ``5.0e+7``) and ``010`` is ten (not octal eight).

:func:`load_yaml` raises :class:`yaml.YAMLError` subclasses with a problem
mark, so callers report them as malformed YAML with the line and column.
"""

from __future__ import annotations

import re
from typing import IO

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError, SafeConstructor

__all__ = ["StrictLoader", "load_yaml", "load_large_yaml", "malformed", "not_utf8"]

_INT = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0o[0-7_]+|[-+]?[0-9][0-9_]*|[-+]?0x[0-9a-fA-F_]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
                    r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


class StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses aliases and duplicate keys and reads numbers as YAML 1.2 does."""

    def compose_node(self, parent, index):  # noqa: D102 (PyYAML hook)
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ComposerError(None, None, f"aliases (*{event.anchor}) are not allowed in configuration files",
                                event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # noqa: D102 (PyYAML hook)
        seen: dict[object, object] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                duplicate = False
            if duplicate:
                raise ConstructorError(None, None, f"duplicate key {key!r} (first at line {seen[key]})",
                                       key_node.start_mark)
            try:
                seen[key] = key_node.start_mark.line + 1
            except TypeError:
                pass
        return SafeConstructor.construct_mapping(self, node, deep)  # not super(): shared with the libyaml loader


StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def _construct_int(loader: StrictLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node).replace("_", "")
    sign = -1 if text.startswith("-") else 1
    text = text.lstrip("+-")
    if text.startswith("0b"):
        return sign * int(text[2:], 2)
    if text.startswith("0x"):
        return sign * int(text[2:], 16)
    if text.startswith("0o"):
        return sign * int(text[2:], 8)
    return sign * int(text)  # YAML 1.2: 010 is ten, not octal eight


StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def load_yaml(stream: str | IO[str]) -> object:
    """Parse one YAML document with :class:`StrictLoader`.

    Nesting deep enough to exhaust Python's recursion is reported as malformed YAML, not a crash; so is a
    file opened as text that is not UTF-8 (its ``problem`` says so: callers name the file and print it).
    """
    try:
        return yaml.load(stream, Loader=StrictLoader)  # noqa: S506 (StrictLoader is a SafeLoader)
    except RecursionError:
        raise ComposerError(None, None, "nesting is too deep (hundreds of levels)", None) from None
    except UnicodeDecodeError as exc:  # raised while the text stream reads: position is within its chunk
        raise yaml.MarkedYAMLError(problem=not_utf8(exc)) from None


def malformed(exc: yaml.YAMLError) -> str:
    """What to say of a YAML error in one phrase: ``malformed YAML at line L, column C: <problem>``. A
    :class:`yaml.reader.ReaderError` (a control character: a binary file, or text in another encoding) has no
    problem mark; it is told by its character and byte offset instead of PyYAML's class name."""
    if isinstance(exc, yaml.reader.ReaderError):
        return (f"malformed YAML at byte {exc.position}: character #x{exc.character:04x} is not allowed in a YAML "
                f"text file (a binary file?)" if isinstance(exc.character, int) else
                f"malformed YAML at byte {exc.position}: {exc.reason}")
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"malformed YAML{where}: {getattr(exc, 'problem', None) or type(exc).__name__}"


def not_utf8(exc: UnicodeDecodeError) -> str:
    """What to say of a configuration file that does not decode: it is not UTF-8 text, and the first bad byte."""
    return f"the file is not UTF-8 text (byte 0x{exc.object[exc.start]:02x}: {exc.reason}); save it as UTF-8"


if getattr(yaml, "__with_libyaml__", False):

    class _StrictCLoader(yaml.CSafeLoader):  # type: ignore[misc,name-defined]
        """libyaml's parser with :class:`StrictLoader`'s resolvers and duplicate-key check (aliases are
        refused beforehand, by :func:`load_large_yaml`)."""

        construct_mapping = StrictLoader.construct_mapping

    _StrictCLoader.yaml_implicit_resolvers = StrictLoader.yaml_implicit_resolvers
    _StrictCLoader.yaml_constructors = StrictLoader.yaml_constructors
else:  # pragma: no cover - PyYAML built without libyaml
    _StrictCLoader = None  # type: ignore[assignment,misc]


def load_large_yaml(text: str) -> object:
    """:func:`load_yaml`, about four times faster on large documents (a topology file of thousands of links).

    Parses with libyaml when PyYAML has it and the document is valid and alias-free, giving exactly what
    :func:`load_yaml` gives; anything else (an alias, malformed YAML, no libyaml) is left to
    :func:`load_yaml`, so errors read the same.
    """
    if _StrictCLoader is not None:
        try:
            if not any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(text, Loader=yaml.CSafeLoader)):
                return yaml.load(text, Loader=_StrictCLoader)  # noqa: S506 (a SafeLoader)
        except (yaml.YAMLError, RecursionError):
            pass
    return load_yaml(text)
