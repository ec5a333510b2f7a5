"""Units at the edges: parse what people write, format what people read.

Internally clustersim speaks seconds, bytes and bytes/s as floats. Experiment
files and the CLI accept the spellings people use::

    >>> parse_bytes("1GiB")
    1073741824.0
    >>> parse_bandwidth("400Gbps")      # bits per second -> bytes per second
    50000000000.0
    >>> parse_bandwidth("450 GB/s")
    450000000000.0
    >>> parse_time("2us")
    2e-06

Conventions
-----------
* ``KB, MB, GB, TB, PB`` are decimal (1e3 ... 1e15); ``KiB, MiB, GiB, TiB,
  PiB`` are binary (2**10 ... 2**50). Prefix letters are case-insensitive.
* The final ``b`` is case-sensitive in bandwidths: ``Gbps`` / ``Gb/s`` are
  bits per second, ``GB/s`` / ``GBps`` are bytes per second.
* A plain number (int, float, a numpy scalar such as ``np.int64``, or a numeric
  string) is already in SI units: bytes, bytes/s or seconds. A bool is no number.

Every invalid value raises :class:`~topologies.cluster.TopologyError` with a
one-line message naming the field, the value and what would be valid.
"""

from __future__ import annotations

import math
import numbers
import re

from topologies.cluster import TopologyError

__all__ = [
    "parse_bytes",
    "parse_bandwidth",
    "parse_link_bandwidth",
    "parse_link_latency",
    "parse_time",
    "format_bytes",
    "format_bandwidth",
    "format_time",
]

_NUMBER = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*$")

_DECIMAL = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_BINARY = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50}

# "<prefix>B" (bytes) with an optional "i" for binary prefixes.
_BYTES_UNIT = re.compile(r"^([kKmMgGtTpP][iI]?)?B$")
# "<prefix>bps", "<prefix>b/s" (bits) or "<prefix>Bps", "<prefix>B/s" (bytes).
_BW_UNIT = re.compile(r"^([kKmMgGtTpP][iI]?)?([bB])(?:ps|/s)$")
# Divisors (number / divisor is seconds): dividing by 1e9 is exact where multiplying by 1e-9 is not.
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "μs": 1e6, "ns": 1e9, "ps": 1e12}

_BYTES_EXAMPLES = "e.g. 1GiB, 512MiB, 4KB, 1024"
_BW_EXAMPLES = "e.g. 400Gbps, 50GB/s"
_TIME_EXAMPLES = "e.g. 2us, 1.5ms, 500ns, 1s"


BARE_BANDWIDTH_MIN = 1e6
"""A bandwidth given as a bare number is bytes/s; below 1 MB/s it is surely a forgotten unit
(``nic_bandwidth: 400`` meant 400 Gb/s), so it is refused with the unit spelled out."""
LINK_BANDWIDTH_MAX = 1e21
"""The most bytes/s a link may be given (1 ZB/s): a thousand times the ``1000000TB/s`` that makes a tier's
communication free in a what-if; beyond it the simulator's arithmetic overflows (``1e308`` crashed)."""
LINK_LATENCY_MAX = 1.0
"""The most seconds a link's latency (or a fault's extra latency) may be, as ``network.step_latency``: a GPU
fabric's hops take microseconds; ``1e300s`` read back as a step of ~10^300 s."""
BARE_TIME_MAX = 1e-3
"""A time given as a bare number is seconds; a link or step latency above 1 ms is surely a forgotten
unit (``step_latency: 2`` meant 2 µs), so it is refused with the unit spelled out."""


def _prefix_factor(prefix: str | None) -> float:
    p = (prefix or "").lower()
    return _BINARY[p] if p.endswith("i") else _DECIMAL[p]


def _split(value: object) -> tuple[float, str] | None:
    """``(number, unit)`` of a real number (numpy's too: ``np.int64``, ``np.float32``), or of a string; ``None``
    if unparseable (a bool among them: ``True`` is no size)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        try:
            return float(value), ""
        except OverflowError:  # an int beyond any float (YAML reads 1 followed by 400 zeros exactly)
            return math.inf, ""
    if not isinstance(value, str):
        return None
    m = _NUMBER.match(value)
    if m is None:
        return None
    return float(m.group(1)), m.group(2)


def _check(x: float, value: object, field: str, what: str, examples: str, allow_zero: bool) -> float:
    if not math.isfinite(x) or x < 0 or (x == 0 and not allow_zero):
        raise TopologyError(f"{field}: {value!r} is not {what} ({examples})")
    return x


def parse_bytes(value: object, field: str = "size", *, allow_zero: bool = True) -> float:
    """Parse a size such as ``"1GiB"``, ``"512MiB"``, ``"1MB"``, ``"4KB"`` or ``1024``.

    Parameters
    ----------
    value : int, float (numpy's too) or str
        A plain number is bytes; a string may carry a unit ``B``, ``KB``,
        ``MB``, ``GB``, ``TB``, ``PB`` (decimal) or ``KiB`` ... ``PiB``
        (binary).
    field : str
        Name used in error messages, e.g. ``"model.hbm"``.
    allow_zero : bool
        Whether ``0`` is acceptable.

    Returns
    -------
    float
        Bytes.

    Raises
    ------
    TopologyError
        If ``value`` is not a finite, non-negative (positive if
        ``allow_zero`` is false) size.

    Examples
    --------
    >>> parse_bytes("512MiB")
    536870912.0
    >>> parse_bytes("1MB")
    1000000.0
    """
    what = "a byte size" if allow_zero else "a positive byte size"
    parts = _split(value)
    if parts is not None:
        number, unit = parts
        if unit == "":
            return _check(number, value, field, what, _BYTES_EXAMPLES, allow_zero)
        m = _BYTES_UNIT.match(unit)
        if m is not None:
            return _check(number * _prefix_factor(m.group(1)), value, field, what, _BYTES_EXAMPLES, allow_zero)
    raise TopologyError(f"{field}: {value!r} is not {what} ({_BYTES_EXAMPLES})")


def parse_bandwidth(value: object, field: str = "bandwidth") -> float:
    """Parse a bandwidth such as ``"400Gbps"``, ``"50GB/s"``, ``"1.6Tbps"`` or ``5e10``.

    Parameters
    ----------
    value : int, float (numpy's too) or str
        A plain number is bytes/s. Units ending in ``bps`` or ``b/s`` are bits
        per second; units ending in ``Bps`` or ``B/s`` are bytes per second.
    field : str
        Name used in error messages, e.g. ``"cluster.nic_bandwidth"``.

    Returns
    -------
    float
        Bytes per second (always positive).

    Raises
    ------
    TopologyError
        If ``value`` is not a finite, positive bandwidth.

    Examples
    --------
    >>> parse_bandwidth("400Gbps")
    50000000000.0
    >>> parse_bandwidth("1.6Tbps")
    200000000000.0
    """
    what = "a positive bandwidth"
    parts = _split(value)
    if parts is not None:
        number, unit = parts
        if unit == "":
            if 0 < number < BARE_BANDWIDTH_MIN:
                raise TopologyError(f"{field}: {value!r} has no unit, so it would be {number:g} bytes/s; write the "
                                    f"unit ({_BW_EXAMPLES})")
            return _check(number, value, field, what, _BW_EXAMPLES, False)
        m = _BW_UNIT.match(unit)
        if m is not None:
            per_unit = _prefix_factor(m.group(1)) / (8.0 if m.group(2) == "b" else 1.0)
            return _check(number * per_unit, value, field, what, _BW_EXAMPLES, False)
    raise TopologyError(f"{field}: {value!r} is not {what} ({_BW_EXAMPLES})")


def parse_link_bandwidth(value: object, field: str = "bandwidth") -> float:
    """:func:`parse_bandwidth` of a link's rate, refused below :data:`BARE_BANDWIDTH_MIN` (1 MB/s) even with a
    unit: no GPU fabric link is that slow, and a ``1bps`` slip would otherwise read back as a step of ~10^15 s.
    The one floor for every place a link's rate is given (``cluster:`` sections, topology files, GraphML).

    Examples
    --------
    >>> parse_link_bandwidth("400Gbps")
    50000000000.0
    """
    rate = parse_bandwidth(value, field)
    if rate < BARE_BANDWIDTH_MIN:
        raise TopologyError(f"{field}: {value!r} is {rate:g} bytes/s; a link needs at least {BARE_BANDWIDTH_MIN:g} "
                            f"bytes/s ({_BW_EXAMPLES})")
    if rate > LINK_BANDWIDTH_MAX:
        raise TopologyError(f"{field}: {value!r:.40} is {rate:.8g} bytes/s; a link takes at most "
                            f"{LINK_BANDWIDTH_MAX:g} bytes/s (1000000TB/s already makes its transfers free)")
    return rate


def parse_link_latency(value: object, field: str = "latency") -> float:
    """:func:`parse_time` of a link's latency (or a fault's extra latency), refused at or above
    :data:`LINK_LATENCY_MAX` (1 s). The one ceiling for every place a link's latency is given.

    Examples
    --------
    >>> parse_link_latency("2us")
    2e-06
    """
    seconds = parse_time(value, field)
    if seconds >= LINK_LATENCY_MAX:
        raise TopologyError(f"{field}: {value!r:.40} is {seconds:g} s; a link's latency must be below "
                            f"{LINK_LATENCY_MAX:g} s (fabric hops take microseconds: '2us')")
    return seconds


def parse_time(value: object, field: str = "time", *, allow_zero: bool = True) -> float:
    """Parse a duration such as ``"2us"``, ``"1.5ms"``, ``"500ns"``, ``"1s"`` or ``0.001``.

    Parameters
    ----------
    value : int, float (numpy's too) or str
        A plain number is seconds; units ``s``, ``ms``, ``us`` (or ``µs``),
        ``ns``, ``ps``.
    field : str
        Name used in error messages, e.g. ``"cluster.switch_latency"``.
    allow_zero : bool
        Whether ``0`` is acceptable.

    Returns
    -------
    float
        Seconds.

    Raises
    ------
    TopologyError
        If ``value`` is not a finite, non-negative (positive if
        ``allow_zero`` is false) duration.

    Examples
    --------
    >>> parse_time("1.5ms")
    0.0015
    """
    what = "a non-negative time" if allow_zero else "a positive time"
    parts = _split(value)
    if parts is not None:
        number, unit = parts
        divisor = _TIME_UNITS.get(unit)
        if unit == "" and number > BARE_TIME_MAX:
            raise TopologyError(f"{field}: {value!r} has no unit, so it would be {number:g} seconds; write the "
                                f"unit ({_TIME_EXAMPLES})")
        if divisor is not None:
            return _check(number / divisor, value, field, what, _TIME_EXAMPLES, allow_zero)
    raise TopologyError(f"{field}: {value!r} is not {what} ({_TIME_EXAMPLES})")


def _scaled(x: float, steps: list[tuple[float, str]], zero_unit: str, sep: str = " ") -> str:
    """``x`` in the largest unit of ``steps`` (ascending) that keeps it >= 1, 3 significant digits."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}{sep}{zero_unit}"
    factor, unit = steps[0]
    for f, u in steps:
        # Compare after rounding so 999.7e9 B/s reads "1 TB/s", not "1e+03 GB/s".
        if abs(float(f"{x / f:.3g}")) >= 1:
            factor, unit = f, u
    text = f"{x / factor:.3g}"
    if "e" in text:  # beyond the largest unit
        text = f"{x / factor:.0f}"
    return f"{text}{sep}{unit}"


def format_bytes(nbytes: float) -> str:
    """Human-readable size with binary units, e.g. ``"1.5 GiB"``; parseable by :func:`parse_bytes`.

    Examples
    --------
    >>> format_bytes(3 * 2**29)
    '1.5 GiB'
    """
    return _scaled(float(nbytes), [(1.0, "B"), (2.0**10, "KiB"), (2.0**20, "MiB"), (2.0**30, "GiB"),
                                   (2.0**40, "TiB"), (2.0**50, "PiB")], "B")


def format_bandwidth(bandwidth_Bps: float) -> str:
    """Human-readable bandwidth in decimal bytes/s, e.g. ``"50 GB/s"``; parseable by :func:`parse_bandwidth`.

    Examples
    --------
    >>> format_bandwidth(50e9)
    '50 GB/s'
    """
    return _scaled(float(bandwidth_Bps), [(1.0, "B/s"), (1e3, "KB/s"), (1e6, "MB/s"), (1e9, "GB/s"),
                                          (1e12, "TB/s"), (1e15, "PB/s")], "B/s")


def format_time(seconds: float) -> str:
    """Human-readable duration, e.g. ``"1.5 ms"``; parseable by :func:`parse_time`.

    Examples
    --------
    >>> format_time(2.5e-6)
    '2.5 us'
    """
    return _scaled(float(seconds), [(1e-12, "ps"), (1e-9, "ns"), (1e-6, "us"), (1e-3, "ms"), (1.0, "s")], "s")
