"""The protobuf wire bytes of the Chakra ``Node`` messages :func:`~workloads.chakra.write_chakra` writes, made
without building a message object per node.

A step of 1,024 ranks has some twelve million nodes; making a ``Node`` object, filling its attributes and
serializing it took ~10 µs a node (two minutes for the step). These functions put out the bytes the ``protobuf``
package serializes for the same fields (``SerializeToString``, the reference codec, still writes every file's
GlobalMetadata and METADATA_NODE): fields in field-number order; a proto3 scalar left out when it is zero or
empty (``id``, ``name``, ``type``, ``duration_micros``), a ``oneof`` member written whatever its value
(``bool_val`` false, ``int64_val`` 0); repeated numbers packed; a negative ``int32`` / ``int64`` as the
ten-byte two's-complement varint (protobuf's encoding guide, developers.google.com/protocol-buffers/docs/encoding).
``tests/test_chakra_wire.py`` checks them against ``SerializeToString``.

Field numbers are those of :mod:`workloads.chakra.schema` (mlcommons/chakra ``et_def.proto``).
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterable, Sequence

from .schema import _ATTR_TYPES

_MASK64 = 2**64 - 1
_INT64_MIN, _INT64_MAX, _INT32_MIN, _INT32_MAX = -(2**63), 2**63 - 1, -(2**31), 2**31 - 1
_VARINT, _FIXED64, _LEN = 0, 1, 2  # wire types


def _varint(value: int) -> bytes:
    if value < 1 << 21:  # (three bytes: most op ids of a large step)
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    out = bytearray()
    while value > 127:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


_TABLE = [bytes((i,)) if i < 128 else bytes((i & 0x7F | 0x80, i >> 7)) for i in range(1 << 14)]
"""Every one- and two-byte varint (node ids, lengths, small values: most of those written)."""


def varint(value: int) -> bytes:
    """``value`` (a non-negative int below 2**64) as a base-128 varint."""
    return _TABLE[value] if value < 16384 else _varint(value)


def signed(value: int) -> bytes:
    """An ``int32`` / ``int64`` field's varint: a negative value as its 64-bit two's complement (ten bytes).
    Anything but an int (or an integer type such as numpy's) is refused with protobuf's TypeError: a float,
    even a whole one, and a bool; a value outside int64 with its ValueError (its bytes would read back as
    another number, or, from 2**64, be no varint a reader takes)."""
    if type(value) is not int:
        value = whole(value)
    if 0 <= value < 16384:
        return _TABLE[value]
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"int64 field: value out of range: {value}")
    return _varint(value & _MASK64 if value < 0 else value)


def whole(value: object) -> int:
    """``value`` as protobuf takes it for an integer field (``operator.index``), a bool refused as it does."""
    if isinstance(value, bool):
        raise TypeError(f"expected an int, got a boolean ({value})")
    return operator.index(value)


def key(field: int, wire_type: int) -> bytes:
    """A field's key: its number and wire type."""
    return varint(field << 3 | wire_type)


def length_delimited(field: int, body: bytes) -> bytes:
    """A string, bytes or message field: key, byte length, bytes."""
    return key(field, _LEN) + varint(len(body)) + body


# AttributeProto: name = 1, then <type>_val = 3 + 2i and <type>_list = 4 + 2i (schema._ATTR_TYPES).
_VAL = {t: 3 + 2 * i for i, t in enumerate(_ATTR_TYPES)}
_LIST = {t: 4 + 2 * i for i, t in enumerate(_ATTR_TYPES)}
_INT64_VAL, _INT32_VAL, _UINT64_VAL = key(_VAL["int64"], _VARINT), key(_VAL["int32"], _VARINT), \
    key(_VAL["uint64"], _VARINT)
_BOOL_VAL, _DOUBLE_VAL, _STRING_VAL = key(_VAL["bool"], _VARINT), key(_VAL["double"], _FIXED64), \
    key(_VAL["string"], _LEN)
_ATTR_KEY = key(10, _LEN)  # Node.attr (repeated AttributeProto)
DOUBLE = struct.Struct("<d")
"""A double as protobuf writes it (little-endian IEEE 754), the bytes of a ``double`` field's value."""


def name(text: str) -> bytes:
    """An AttributeProto's ``name`` field (field 1), to make once and pass to :func:`attr` (nothing when empty:
    a proto3 scalar)."""
    return length_delimited(1, text.encode()) if text else b""


def attr(name_field: bytes, value: bytes) -> bytes:
    """A ``Node.attr`` entry: the AttributeProto of ``name_field`` (:func:`name`) holding ``value`` (one of the
    ``*_value`` / ``*_list`` functions' bytes)."""
    size = len(name_field) + len(value)
    return b"".join((_ATTR_KEY, _TABLE[size] if size < 16384 else _varint(size), name_field, value))


def int64_value(x: int) -> bytes:
    """``int64_val``."""
    return _INT64_VAL + signed(x)


def int32_value(x: int) -> bytes:
    """``int32_val``; a value outside int32 is refused (protobuf's ValueError)."""
    if type(x) is not int:
        x = whole(x)
    if not _INT32_MIN <= x <= _INT32_MAX:
        raise ValueError(f"int32 field: value out of range: {x}")
    return _INT32_VAL + signed(x)


def uint64_value(x: int) -> bytes:
    """``uint64_val``; a value outside uint64 (a negative one) is refused (protobuf's ValueError)."""
    if type(x) is not int:
        x = whole(x)
    if not 0 <= x <= _MASK64:
        raise ValueError(f"uint64 field: value out of range: {x}")
    return _UINT64_VAL + varint(x)


def bool_value(x: bool) -> bytes:
    """``bool_val``."""
    return _BOOL_VAL + (b"\x01" if x else b"\x00")


def double_value(x: float) -> bytes:
    """``double_val`` (eight little-endian bytes)."""
    return _DOUBLE_VAL + DOUBLE.pack(x)


def string_value(x: str) -> bytes:
    """``string_val`` (UTF-8)."""
    data = x.encode()
    return _STRING_VAL + varint(len(data)) + data


def int64_list(xs: Iterable[int]) -> bytes:
    """``int64_list``: an Int64List whose ``values`` (field 1) are packed; no ``values`` bytes when empty."""
    packed = b"".join([signed(x) for x in xs])
    return length_delimited(_LIST["int64"], length_delimited(1, packed) if packed else b"")


def double_list(xs: Sequence[float]) -> bytes:
    """``double_list``: a DoubleList whose ``values`` (field 1) are packed; no ``values`` bytes when empty."""
    packed = struct.pack(f"<{len(xs)}d", *xs)
    return length_delimited(_LIST["double"], length_delimited(1, packed) if packed else b"")


ID_KEY, _NAME_KEY, _TYPE_KEY, DEPS_KEY, _DURATION_KEY = (key(f, t) for f, t in ((1, _VARINT), (2, _LEN),
                                                                                 (3, _VARINT), (5, _LEN),
                                                                                 (7, _VARINT)))
"""The keys of ``Node.id``, ``name``, ``type``, ``data_deps`` and ``duration_micros``."""


def head(node_id: int, name: str, node_type: int) -> bytes:
    """A Node's fields 1-3: ``id``, ``name``, ``type`` (each left out when zero or empty)."""
    out = [ID_KEY, varint(node_id)] if node_id else []
    if name:
        data = name.encode()
        out += (_NAME_KEY, varint(len(data)), data)
    if node_type:
        out += (_TYPE_KEY, varint(node_type))
    return b"".join(out)


def deps(data_deps: Sequence[int]) -> bytes:
    """A Node's field 5, ``data_deps``, packed (nothing when empty)."""
    if not data_deps:
        return b""
    packed = b"".join([_TABLE[d] if d < 16384 else _varint(d) for d in data_deps])
    return DEPS_KEY + varint(len(packed)) + packed


def duration(micros: int) -> bytes:
    """A Node's field 7, ``duration_micros`` (nothing when 0); a value outside uint64 is refused (protobuf's
    ValueError)."""
    if not 0 <= micros <= _MASK64:
        raise ValueError(f"duration_micros: value out of range: {micros}")
    return _DURATION_KEY + varint(micros) if micros else b""


def chain(first_id: int, count: int, middle: bytes, rest: bytes, tails: Sequence[bytes]) -> list[bytes]:
    """Framed nodes ``first_id`` .. ``first_id + count - 1``, each depending on the one before (its only
    ``data_deps``): ``id``, then ``middle`` (the ``name`` and ``type`` fields), the dependency, then ``rest``
    and ``tails[k]`` (the attributes) for the k-th. A coarsened collective's parts after its first.

    Returns the pieces to join (eight a node), the bytes of each varint made once."""
    table, out = _TABLE, []
    middle += DEPS_KEY
    fixed = len(ID_KEY) + len(middle) + 1 + len(rest)  # (+ 1: a dependency's length, one byte)
    before = varint(first_id - 1)
    for k in range(count):
        node_id = first_id + k
        this = table[node_id] if node_id < 16384 else _varint(node_id)
        tail = tails[k]
        size = fixed + len(this) + len(before) + len(tail)
        out += (table[size] if size < 16384 else _varint(size), ID_KEY, this, middle, table[len(before)], before,
                rest, tail)
        before = this
    return out
