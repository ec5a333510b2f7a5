"""The MLCommons Chakra execution-trace schema and its file framing, for :mod:`workloads.chakra`.

Schema
------
The message classes mirror ``schema/protobuf/et_def.proto`` of
github.com/mlcommons/chakra (package ``ChakraProtoMsg``; the schema ASTRA-sim's
feeder compiles) field for field: the same message and field names, field
numbers, types, enum values and ``oneof``. ``tests/test_chakra.py`` checks them
against the published ``.proto`` text (kept in ``tests/data``) and checks the
bytes against a trace file ASTRA-sim ships.

Why the ``protobuf`` package, built at run time
    The wire format is protobuf, so the reference codec is the right tool: it
    handles every field type of :class:`AttributeProto` (packed lists, zig-zag
    and fixed-width integers, unknown fields) the way ASTRA-sim's C++ reader
    does. The classes are made at import time from a ``FileDescriptorProto``
    built below, in a private descriptor pool: no ``protoc`` step, no generated
    ``_pb2`` module that must match the installed runtime, and no clash with a
    ``chakra`` package that registers ``et_def.proto`` in the default pool.
    Needs ``protobuf >= 4.22`` (``message_factory.GetMessageClass``), the
    ``chakra`` extra. The registry package named ``chakra`` is unrelated to
    MLCommons, and MLCommons' own is not on the package index.

Framing
-------
An ET file (one per rank, named ``<prefix>.<rank>.et``) is a sequence of
length-delimited messages: a varint byte length, then the message. The
first is a :data:`GlobalMetadata`, every later one a :data:`Node`
(``protolib.encodeMessage`` / ``decodeMessage`` in the chakra repository). A
file may be gzip-compressed (detected by its magic bytes, as the feeder does).
"""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class ChakraError(ValueError):
    """A Chakra trace that cannot be read or written; the one-line message names the file and node."""


SCHEMA_VERSION = "0.0.4"
"""``GlobalMetadata.version`` written (what ASTRA-sim's microbenchmark generators write)."""

NODE_TYPES = ("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "COMP_NODE", "COMM_SEND_NODE",
              "COMM_RECV_NODE", "COMM_COLL_NODE")
"""``NodeType`` names by enum value."""
NEWER_NODE_TYPES = {8: "STORAGE_NODE", 9: "BATCH_NODE", 10: "CHECKPOINT_NODE"}
"""Node types a newer Chakra schema added after the one this module follows (mlcommons/chakra
``schema/protobuf/et_def.proto`` at 6dc63e1), none of them modelled: named when a trace holds one."""

COLLECTIVE_COMM_TYPES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST", "ALL_TO_ALL",
                         "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "BARRIER")
"""``CollectiveCommType`` names by enum value."""

# AttributeProto's oneof ``value``: (field stem, scalar type); stem_val = 3 + 2i, stem_list = 4 + 2i.
_ATTR_TYPES = ("double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64",
               "sfixed32", "sfixed64", "bool", "string", "bytes")


def require_protobuf() -> None:
    """Raise the one-line :class:`ChakraError` that says what to install when ``protobuf`` is absent.

    ``find_spec("google.protobuf")`` raises ModuleNotFoundError (not returns None) when the parent
    package ``google`` is absent too, the usual case on a bare install: both mean "not installed"."""
    try:
        found = importlib.util.find_spec("google.protobuf") is not None
    except (ImportError, ValueError):  # no ``google`` package at all, or a broken ``google.__spec__``
        found = False
    if not found:
        raise ChakraError("Chakra traces need the protobuf package (>= 4.22): pip install '.[chakra]' in the "
                          "checkout, or protobuf")


def _build_classes() -> dict[str, type]:
    """Message classes of et_def.proto, made from a FileDescriptorProto in a private pool."""
    require_protobuf()
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="et_def.proto", package="ChakraProtoMsg", syntax="proto3")

    def message(name: str, *fields: tuple) -> descriptor_pb2.DescriptorProto:
        msg = fdp.message_type.add(name=name)
        for fname, number, ftype, label, *type_name in fields:
            f = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = f".ChakraProtoMsg.{type_name[0]}"
        return msg

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    scalar = {t: getattr(F, f"TYPE_{t.upper()}") for t in _ATTR_TYPES}
    attr = message("AttributeProto", ("name", 1, F.TYPE_STRING, opt), ("doc_string", 2, F.TYPE_STRING, opt))
    attr.oneof_decl.add(name="value")
    for i, t in enumerate(_ATTR_TYPES):
        list_name = t.capitalize() + "List"  # DoubleList, Sint32List, Sfixed64List ...
        for fname, number, ftype, type_name in ((f"{t}_val", 3 + 2 * i, scalar[t], None),
                                                (f"{t}_list", 4 + 2 * i, F.TYPE_MESSAGE, list_name)):
            f = attr.field.add(name=fname, number=number, type=ftype, label=opt, oneof_index=0)
            if type_name:
                f.type_name = f".ChakraProtoMsg.{type_name}"
        message(list_name, ("values", 1, scalar[t], rep))
    message("GlobalMetadata", ("version", 1, F.TYPE_STRING, opt), ("attr", 2, F.TYPE_MESSAGE, rep, "AttributeProto"))
    for name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLLECTIVE_COMM_TYPES)):
        enum = fdp.enum_type.add(name=name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    message("Node", ("id", 1, F.TYPE_UINT64, opt), ("name", 2, F.TYPE_STRING, opt),
            ("type", 3, F.TYPE_ENUM, opt, "NodeType"), ("ctrl_deps", 4, F.TYPE_UINT64, rep),
            ("data_deps", 5, F.TYPE_UINT64, rep), ("start_time_micros", 6, F.TYPE_UINT64, opt),
            ("duration_micros", 7, F.TYPE_UINT64, opt), ("inputs", 8, F.TYPE_MESSAGE, opt, "IOInfo"),
            ("outputs", 9, F.TYPE_MESSAGE, opt, "IOInfo"), ("attr", 10, F.TYPE_MESSAGE, rep, "AttributeProto"))
    message("IOInfo", ("values", 1, F.TYPE_STRING, opt), ("shapes", 2, F.TYPE_STRING, opt),
            ("types", 3, F.TYPE_STRING, opt))
    message("Tensor", ("tensor_id", 1, F.TYPE_UINT64, opt), ("storage_id", 2, F.TYPE_UINT64, opt),
            ("offset", 3, F.TYPE_UINT64, opt), ("num_elem", 4, F.TYPE_UINT64, opt),
            ("elem_bytes", 5, F.TYPE_UINT64, opt), ("device", 6, F.TYPE_STRING, opt))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    file_desc = pool.FindFileByName(fdp.name)  # Add returns None in the pure-Python implementation
    return {name: message_factory.GetMessageClass(file_desc.message_types_by_name[name])
            for name in file_desc.message_types_by_name}


_CLASSES: dict[str, type] | None = None


def classes() -> dict[str, type]:
    """``{message name: class}`` for every message of et_def.proto (built once, on first use)."""
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _build_classes()
    return _CLASSES


def attr_value(a: Any) -> Any:
    """The Python value of an ``AttributeProto`` (a list for the ``*_list`` fields), or None if unset."""
    field = a.WhichOneof("value")
    if field is None:
        return None
    value = getattr(a, field)
    return list(value.values) if field.endswith("_list") else value


# ------------------------------------------------------------------ framing
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(0x80 | bits)
        else:
            out.append(bits)
            return bytes(out)


def frame(message: Any) -> bytes:
    """``message`` serialized and prefixed with its varint byte length (``protolib.encodeMessage``)."""
    body = message.SerializeToString()
    return _varint(len(body)) + body


def encode_messages(messages: list[Any]) -> bytes:
    """The messages, each framed (:func:`frame`): the bytes of an ET file."""
    return b"".join(frame(m) for m in messages)


def read_file_bytes(path: Path) -> bytes:
    """The bytes of an ET file, gunzipped if it starts with the gzip magic (as the feeder does)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ChakraError(f"{path}: cannot read: {exc.strerror}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise ChakraError(f"{path}: a gzip file that does not decompress: {exc}") from None
    return data


def iter_frames(data: bytes, path: Path) -> Iterator[tuple[int, bytes]]:
    """Yield ``(byte offset, message bytes)`` of each length-delimited message; raise :class:`ChakraError`
    on a truncated varint or a message that runs past the end of the file."""
    pos, n = 0, len(data)
    while pos < n:
        start, size, shift = pos, 0, 0
        while True:
            if pos >= n:
                raise ChakraError(f"{path}: truncated length prefix at byte {start} (the file ends inside a varint)")
            b = data[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 28:  # a length prefix is a varint32 (protoio's ReadVarint32)
                raise ChakraError(f"{path}: malformed length prefix at byte {start} (more than 5 varint bytes)")
        if pos + size > n:
            raise ChakraError(f"{path}: truncated message at byte {start}: {size} bytes announced, "
                              f"{n - pos} left in the file")
        yield start, data[pos:pos + size]
        pos += size


def parse(cls_name: str, body: bytes, path: Path, offset: int) -> Any:
    """Parse ``body`` as message ``cls_name``; a :class:`ChakraError` naming the file and offset if it is not one."""
    from google.protobuf.message import DecodeError

    msg = classes()[cls_name]()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        raise ChakraError(f"{path}: the message at byte {offset} is not a valid Chakra {cls_name} ({exc})") from None
    return msg


# ------------------------------------------------------- clustersim's names
PREFIX = "clustersim."
"""Name prefix of the attributes only clustersim reads."""
FORMAT = 1
"""``clustersim.format`` in the GlobalMetadata of a trace clustersim wrote (version of the ``clustersim.*``
attributes)."""

TO_COMM = {"all_reduce": "ALL_REDUCE", "reduce": "REDUCE", "all_gather": "ALL_GATHER", "gather": "GATHER",
           "broadcast": "BROADCAST", "all_to_all": "ALL_TO_ALL", "reduce_scatter": "REDUCE_SCATTER"}
"""clustersim collective kind -> CollectiveCommType name."""
FROM_COMM = {v: k for k, v in TO_COMM.items()} | {"REDUCE_SCATTER_BLOCK": "reduce_scatter", "BARRIER": "all_reduce"}
"""CollectiveCommType name -> clustersim kind (SCATTER has none)."""
BARRIER_BYTES = 4.0
"""Bytes a BARRIER all-reduces: ``torch.distributed.barrier`` on NCCL is an all-reduce of a one-element float32
tensor (``ProcessGroupNCCL::barrier``), so it pays that collective's latency; a zero-byte all-reduce would cost
nothing, since NCCL discards a collective of count 0 before launching anything (``taskAppend``)."""
PER_RANK_INPUT = ("all_gather", "gather")
"""Kinds whose ``comm_size`` is each rank's input, ``S/n`` of clustersim's gathered ``S``."""
