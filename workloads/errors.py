"""Errors raised by the workload layer.

Every invalid workload configuration raises :class:`ConfigError` at load time,
with a one-line message that starts with the offending field (``model.heads``,
``parallel.tp`` ...) and says what would be valid, e.g.::

    parallel.tp: 3 does not divide model.heads=96; valid tp values: 1, 2, 4, 8, 16, 32

``ConfigError`` subclasses :class:`ValueError`, so callers that already catch
``ValueError`` keep working; the CLI turns it into a message and a non-zero exit.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence


class ConfigError(ValueError):
    """An invalid workload configuration (model, parallel or training section)."""


def with_prefix(exc: ValueError, prefix: str) -> ValueError:
    """``exc`` again, its message led by ``prefix`` (a file name, a job): a copy of it, its type and attributes
    kept, whose message is the new one; a :class:`ConfigError` where that cannot be (a ``UnicodeDecodeError``'s
    message is not its ``args``: rebuilt as its own type it raised a TypeError instead of the one-line error)."""
    message = f"{prefix}: {exc}"
    try:
        new = copy.copy(exc)  # (its type and attributes kept: a StepTooLargeError's ops and limit)
    except TypeError:
        return ConfigError(message)
    new.args = (message,)
    return new if str(new) == message else ConfigError(message)


# ----------------------------------------------------------------- checkers
def plain_values(value: object) -> object:
    """``value`` with every numpy scalar inside it (mapping keys and values, list and tuple items, at any depth)
    as the Python value a YAML file gives: ``np.int64(4)`` as ``4``, ``np.float64`` as ``float``, ``np.bool_`` as
    ``bool``, an array (or a pandas Series) as a list of such values. A document built in a notebook from
    ``np.arange`` or a DataFrame row then passes the same checks a file does (``isinstance(x, int)`` is false for
    numpy's integers). Makes new containers (mappings as dicts): the caller's document is not changed."""
    if isinstance(value, Mapping):
        return {plain_values(k): plain_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_values(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_values(v) for v in value)
    if getattr(value, "ndim", None) is not None and hasattr(value, "tolist"):  # numpy's scalars and arrays, Series
        return plain_values(value.tolist())  # (an object array's items stay numpy scalars in its list)
    return value


# Small helpers shared by ``models`` and ``parallel``; each raises ConfigError
# naming ``field`` (e.g. "model.layers") and the valid choices.


def is_int(value: object) -> bool:
    """An integer and not a bool (``True`` is an ``int`` to Python, never a count to a user)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(field: str, value: object, *, minimum: int = 1) -> None:
    """Raise :class:`ConfigError` unless ``value`` is an integer ``>= minimum``."""
    if not is_int(value) or value < minimum:  # type: ignore[operator]
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(f"{field}: must be {what}, got {value!r}")


def check_number(field: str, value: object, *, minimum: float = 0.0, maximum: float = float("inf"),
                 unit: str = "") -> None:
    """Raise :class:`ConfigError` unless ``value`` is a finite real number in ``[minimum, maximum]``."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not minimum <= value <= maximum:  # type: ignore[operator]
        unit = f" {unit}" if unit else ""
        raise ConfigError(f"{field}: must be a finite number in [{minimum:g}, {maximum:g}]{unit}, got {value!r}")


def check_bool(field: str, value: object) -> None:
    """Raise :class:`ConfigError` unless ``value`` is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise ConfigError(f"{field}: must be true or false, got {value!r}")


def check_choice(field: str, value: object, choices: Sequence[object]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``choices``."""
    if value not in choices:
        valid = ", ".join(str(c) for c in choices)
        raise ConfigError(f"{field}: {value!r} is not valid; valid: {valid}")


def check_keys(section: str, given: Mapping[str, object], valid: Iterable[str]) -> None:
    """Raise :class:`ConfigError` if ``given`` has a key outside ``valid``."""
    if not isinstance(given, Mapping):
        raise ConfigError(f"{section}: must be a mapping of field: value, got {type(given).__name__}")
    allowed = list(valid)
    for key in given:
        if key not in allowed:
            raise ConfigError(f"{section}.{key}: unknown field; valid fields: {', '.join(allowed)}")


def unknown_keys(given: Iterable[object], valid: Iterable[object]) -> list:
    """The keys of ``given`` outside ``valid``, sorted by their text: a YAML mapping may mix key types (``1``
    and ``foo``), which plain ``sorted`` cannot order."""
    return sorted(set(given) - set(valid), key=str)


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n`` in increasing order (for 'valid values' hints)."""
    return [d for d in range(1, n + 1) if n % d == 0]
