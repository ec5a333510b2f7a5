"""Read a Chakra trace into a clustersim op graph (see :mod:`workloads.chakra` for the rules)."""

from __future__ import annotations

import heapq
import json
import math
import re
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ops import Kernel, OpGraph, OpGraphError
from .schema import (
    BARRIER_BYTES,
    COLLECTIVE_COMM_TYPES,
    FORMAT,
    FROM_COMM,
    NEWER_NODE_TYPES,
    NODE_TYPES,
    PER_RANK_INPUT,
    PREFIX,
    ChakraError,
    attr_value,
    classes,
    iter_frames,
    parse,
    read_file_bytes,
)

_SKIPPED = ("INVALID_NODE", "METADATA_NODE")
_MODELLED = ("COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE")
_FILE_RE = re.compile(r"(?P<prefix>.+)\.(?P<rank>0|[1-9]\d*)\.et")  # rank as ASTRA-sim's to_string(id) writes it


def trace_files(path: str | Path, prefix: str | None = None) -> tuple[str, list[Path]]:
    """The rank files of the trace in folder ``path``: ``(prefix, [file of rank 0, 1, ...])``.

    ``path`` may also be ``<folder>/<prefix>`` (ASTRA-sim's
    ``--workload-configuration`` form). Raises :class:`ChakraError` when there
    is no trace, several prefixes and none chosen, or a missing rank.
    """
    folder = Path(path)
    if not folder.is_dir():
        folder, prefix = _prefix_form(path, folder, prefix)
    found = scan(folder)
    prefixes = sorted({pre for _, pre, _ in found})
    if prefix is not None:
        if prefix not in prefixes:
            have = f"; it has {', '.join(prefixes)}" if prefixes else ""
            raise ChakraError(f"{folder}: no trace files {prefix}.<rank>.et{have}")
    elif len(prefixes) > 1:
        raise ChakraError(f"{folder}: holds traces of several prefixes ({', '.join(prefixes)}); choose one "
                          f"(prefix=..., or <folder>/<prefix> on the command line)")
    elif not prefixes:
        raise ChakraError(f"{folder}: no Chakra trace files (<prefix>.<rank>.et, one per rank) in this folder")
    else:
        prefix = prefixes[0]
    by_rank: dict[int, Path] = {}
    for p, pre, rank in found:
        if pre != prefix:
            continue
        if rank in by_rank:
            raise ChakraError(f"{folder}: {by_rank[rank].name} and {p.name} are both rank {rank}")
        by_rank[rank] = p
    missing = [r for r in range(max(by_rank) + 1) if r not in by_rank]
    if missing:
        names = ", ".join(f"{prefix}.{r}.et" for r in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise ChakraError(f"{folder}: missing rank file(s) {names}: a trace needs one file per rank 0..{max(by_rank)}")
    return prefix, [by_rank[r] for r in range(len(by_rank))]


def _prefix_form(path: str | Path, folder: Path, prefix: str | None) -> tuple[Path, str]:
    """``path``, which is not a folder, as ASTRA-sim's ``<folder>/<prefix>``: ``(folder, prefix)``, else a
    one-line error saying what is there (a rank file, another file, another trace's prefix, nothing)."""
    parent = folder.parent
    if folder.exists():
        m = _FILE_RE.fullmatch(folder.name)
        if m:
            raise ChakraError(f"{path} is a file; give its folder ({parent}) or {parent / m['prefix']} (the folder "
                              f"and prefix)")
        raise ChakraError(f"{path} is a file, not a folder of Chakra trace files (<prefix>.<rank>.et); give the "
                          f"folder, or <folder>/<prefix>")
    if prefix is None and parent.is_dir():
        have = sorted({pre for _, pre, _ in scan(parent)})
        if folder.name in have:
            return parent, folder.name
        if have:
            shown = ", ".join(have[:5]) + (" ..." if len(have) > 5 else "")
            hint = f"{parent} or {parent / have[0]}" if len(have) == 1 else f"{parent / have[0]} (or another prefix)"
            raise ChakraError(f"{path}: no Chakra trace ({folder.name}.<rank>.et files) in {parent}; it has the "
                              f"prefix(es) {shown}: give {hint}")
        raise ChakraError(f"{path}: no such folder, nor Chakra trace files {folder.name}.<rank>.et in {parent} (the "
                          f"<folder>/<prefix> form)")
    raise ChakraError(f"{path}: no such folder (give the folder of <prefix>.<rank>.et files, or <folder>/<prefix>)")


def _names(prefix: str, first: int, last: int) -> str:
    """The rank files ``first..last``: one name, two, or ``A ... B``."""
    if first == last:
        return f"{prefix}.{first}.et"
    sep = ", " if last == first + 1 else " ... "
    return f"{prefix}.{first}.et{sep}{prefix}.{last}.et"


def _are_missing(prefix: str, first: int, last: int) -> str:
    """``t.15.et is missing``, ``t.14.et, t.15.et are missing``, ``t.3.et ... t.15.et are missing``."""
    return f"{_names(prefix, first, last)} {'is' if first == last else 'are'} missing"


def scan(folder: Path) -> list[tuple[Path, str, int]]:
    """``(path, prefix, rank)`` of every ``<prefix>.<rank>.et`` file in ``folder``, sorted by name."""
    out = []
    for p in sorted(folder.iterdir()):
        m = _FILE_RE.fullmatch(p.name)
        if m and p.is_file():
            out.append((p, m["prefix"], int(m["rank"])))
    return out


@dataclass
class _Unit:
    """One op to be: its node(s) (a coarsened collective has several), its rank and its order key."""

    rank: int
    nodes: list[Any]
    attrs: dict[str, Any]
    key: int
    deps: list[int] = field(default_factory=list)  # units it waits for, explicitly (op.deps)
    after: list[int] = field(default_factory=list)  # every unit it must follow (deps + stream order)


@dataclass(slots=True)
class _Spec:
    """What is left of a unit once its rank file is read: how to build its op (no protobuf objects kept)."""

    key: int
    deps: list[int]  # positions in the rank's order
    node_id: int
    builder: str  # OpGraph method
    args: tuple
    kwargs: dict
    pg: str | None = None  # collectives: the process group, resolved once every file has been read
    per_rank_input: bool = False  # nbytes is each rank's input (Chakra's ALL_GATHER, GATHER): x group size


def read_chakra(path: str | Path, *, prefix: str | None = None, clustersim_attrs: bool = True) -> OpGraph:
    """Read the Chakra trace in folder ``path`` (one ``<prefix>.<rank>.et`` per rank) into an op graph.

    Parameters
    ----------
    path : str or Path
        The folder, or ``<folder>/<prefix>``.
    prefix : str, optional
        Which trace, when the folder holds several.
    clustersim_attrs : bool
        Read the ``clustersim.*`` attributes of a trace clustersim wrote
        (default): the graph is the one written. False reads only what
        ASTRA-sim reads, as for a foreign trace (see the module docstring).

    Returns
    -------
    OpGraph
        World size = number of rank files; ops in dependency order.

    Raises
    ------
    ChakraError
        A one-line message naming the file (and node) for a malformed file,
        a missing rank, an unknown dependency, a dependency cycle, an
        undefined process group or a node type clustersim does not model.
    """
    if not isinstance(clustersim_attrs, bool):
        raise ChakraError(f"clustersim_attrs: must be True or False, got {clustersim_attrs!r}")
    classes()  # a one-line ChakraError if protobuf is missing
    prefix, files = trace_files(path, prefix)
    try:
        return _read(files, prefix, clustersim_attrs)
    except _Edited as edited:
        warnings.warn(TraceEditedWarning(
            f"{edited.args[0]}: the file changed after clustersim wrote it (its clustersim.digest no longer matches "
            f"its nodes), so its clustersim.* attributes may not describe its Chakra fields (duration_micros, "
            f"comm_size, dependencies); reading the Chakra fields only, as ASTRA-sim does"), stacklevel=2)
        return _read(files, prefix, False)


class ChakraWarning(UserWarning):
    """Something about a trace the reader worked around (the CLI prints it as a note)."""


class TraceEditedWarning(ChakraWarning):
    """A trace clustersim wrote was changed since: read by its Chakra fields only (its compute settings no
    longer describe its durations)."""


class _Edited(Exception):
    """A file's nodes are not the bytes clustersim wrote (``clustersim.digest``); args: the file."""


def trace_settings(path: str | Path, prefix: str | None = None) -> dict[str, Any]:
    """What a trace clustersim wrote says about how its compute was timed: ``{"gpu": name, "compute":
    {setting: value, ...}}`` (the :class:`~simulator.compute.ComputeModel` it was written with, ``dtype``
    included), from its first file's GlobalMetadata; ``{}`` for a foreign trace or one written without a
    compute model. Parses only that message (the file is read, and gunzipped, whole)."""
    _, files = trace_files(path, prefix)
    data = read_file_bytes(files[0])
    first = next(iter_frames(data, files[0]), None)
    if first is None:
        return {}
    attrs = _meta_attrs(parse("GlobalMetadata", first[1], files[0], first[0]))
    gpu, compute = attrs.get(PREFIX + "gpu"), attrs.get(PREFIX + "compute")
    if not isinstance(gpu, str) or not isinstance(compute, str):
        return {}
    try:
        settings = json.loads(compute)
    except ValueError:
        settings = None
    if not isinstance(settings, dict):
        raise ChakraError(f"{files[0]}: GlobalMetadata: clustersim.compute is not a JSON object of compute "
                          f"settings: {compute[:80]!r}")
    return {"gpu": gpu, "compute": settings}


def _read(files: list[Path], prefix: str, clustersim_attrs: bool) -> OpGraph:
    """:func:`read_chakra` of the rank files ``files``; raises :class:`_Edited` for a file clustersim wrote
    whose nodes changed since (read with ``clustersim_attrs``)."""
    world = len(files)
    groups = _Groups(world, files[0].parent, prefix)
    groups.load_json(files[0].parent, prefix)
    per_rank: list[list[_Spec]] = []
    lossless = None
    parts_cache: dict[tuple, tuple[Kernel, ...]] = {}
    for rank, p in enumerate(files):  # one file at a time: only the specs of the ops are kept
        meta, nodes, digest = _parse_file(p)
        meta_attrs = _meta_attrs(meta)
        fmt = meta_attrs.get(PREFIX + "format") if clustersim_attrs else None
        recorded = meta_attrs.get(PREFIX + "digest")
        if fmt is not None and isinstance(recorded, int) and recorded != digest:
            _check_whole(p, nodes, meta_attrs.get(PREFIX + "nodes"))
            raise _Edited(p)
        if fmt is not None and fmt != FORMAT:
            raise ChakraError(f"{p}: clustersim.format {fmt} is not the supported {FORMAT}; read it with "
                              f"clustersim_attrs=False, or with the clustersim version that wrote it")
        if lossless is None:
            lossless = fmt is not None
        elif lossless != (fmt is not None):
            raise ChakraError(f"{p}: {'lacks' if lossless else 'has'} the clustersim.format that {files[0].name} "
                              f"{'has' if lossless else 'lacks'}; are these files of one trace?")
        if lossless:
            _check_rank_count(meta_attrs, p, rank, world, prefix)
        units = _rank_units(rank, nodes, p, groups, lossless)
        tables = _parts_tables(meta, p, parts_cache) if lossless else {}
        specs = []
        for u in units:
            try:
                specs.append(_spec(u, lossless, tables))
            except OpGraphError as exc:
                raise ChakraError(f"{p}: node {u.nodes[0].id} ({u.nodes[0].name!r}): {exc}") from None
        per_rank.append(specs)
        del meta, nodes, units
    if not lossless:
        _uneven_all_to_alls(per_rank, groups, files)
    graph = OpGraph(world)
    new_id: list[list[int]] = [[] for _ in range(world)]
    origin: dict[int, tuple[Path, int]] = {}  # op id -> (rank file, node id): what an error found later names
    for _key, rank, index in heapq.merge(*[[(sp.key, rank, i) for i, sp in enumerate(specs)]
                                           for rank, specs in enumerate(per_rank)]):
        sp = per_rank[rank][index]
        ids = new_id[rank]
        try:
            args = sp.args
            if sp.pg is not None:
                group = groups.group(sp.pg, f"{files[rank]}: node {sp.node_id}")
                if rank not in group:
                    raise OpGraphError(f"process group {sp.pg!r} = {list(group)} does not include this rank ({rank})")
                args = (rank, args[1], group, args[3] * len(group) if sp.per_rank_input else args[3])
            ids.append(getattr(graph, sp.builder)(*args, deps=[ids[d] for d in sp.deps], **sp.kwargs))
            origin[ids[-1]] = (files[rank], sp.node_id)
        except OpGraphError as exc:
            raise ChakraError(f"{files[rank]}: node {sp.node_id} ({sp.kwargs.get('name')!r}): {exc}") from None
        per_rank[rank][index] = None  # type: ignore[call-overload]  # built: let it go
    graph.chakra_origin = origin  # type: ignore[attr-defined]  # (name_trace_nodes)
    return graph


_OP_REF = re.compile(r"\brank (\d+) op (\d+)\b")


def name_trace_nodes(message: str, graph: OpGraph) -> str:
    """``message`` (an error the simulation of a graph :func:`read_chakra` built found: a collective whose
    ranks disagree, a deadlock) with each ``rank R op N`` — clustersim's own op ids, which no trace holds —
    named by the rank file and node it was read from (``clustersim.1.et node 2``)."""
    origin = getattr(graph, "chakra_origin", {})

    def name(match: re.Match) -> str:
        found = origin.get(int(match.group(2)))
        return match.group(0) if found is None else f"{found[0].name} node {found[1]}"

    return _OP_REF.sub(name, message)


def _uneven_all_to_alls(per_rank: list[list[_Spec]], groups: Any, files: list[Path]) -> None:
    """Give the all-to-alls whose ``comm_size`` differs between the ranks of one exchange a per-peer split.

    Chakra's ``comm_size`` is each rank's own input (the PyTorch converter sums that rank's tensors; ASTRA-sim's
    feeder reads it per node), so an exchange of uneven inputs (a MoE's ``all_to_all_single`` with its
    per-rank token counts) is a legitimate trace. clustersim matches a collective's members by their order in
    the process group and wants one size, unless each member says what it sends: such an exchange becomes an
    alltoallv in which every rank spreads its own input evenly over the group (``split``, ``comm_size / n`` to
    each member, itself included, as a uniform all-to-all does). Exchanges whose members agree stay uniform."""
    # members of one exchange as the engine matches them: the group's ranks and the collective's position
    # among all collectives on that group in each rank's order (two names may stand for one group)
    members: dict[tuple[tuple[int, ...], int], list[_Spec]] = {}
    for rank, specs in enumerate(per_rank):
        order: dict[tuple[int, ...], int] = {}
        for sp in specs:
            if sp.builder == "collective_op" and sp.pg is not None:
                group = groups.group(sp.pg, f"{files[rank]}: node {sp.node_id}")
                k = order[group] = order.get(group, -1) + 1
                members.setdefault((group, k), []).append(sp)
    for (group, _k), specs in members.items():
        if all(sp.args[1] == "all_to_all" for sp in specs) and len({sp.args[3] for sp in specs}) > 1:
            for sp in specs:
                sp.kwargs["split"] = (sp.args[3] / len(group),) * len(group)


def _check_rank_count(meta_attrs: dict[str, Any], path: Path, rank: int, world: int, prefix: str) -> None:
    """A trace clustersim wrote records its world size and each file's rank: refuse a set of files that is not
    the whole trace (a partial write, a file copied from another trace) rather than simulate fewer ranks."""
    recorded = meta_attrs.get(PREFIX + "world_size")
    if isinstance(recorded, int) and recorded != world:
        missing = f"; {_are_missing(prefix, world, recorded - 1)}" if recorded > world else ""
        raise ChakraError(f"{path}: clustersim.world_size says the trace has {recorded} ranks but the folder holds "
                          f"{world} rank file{'s' if world > 1 else ''}{missing}; write the trace again")
    own = meta_attrs.get(PREFIX + "rank")
    if isinstance(own, int) and own != rank:
        raise ChakraError(f"{path}: clustersim.rank says this is rank {own}'s program, not rank {rank}'s; are these "
                          f"files of one trace?")


def _check_whole(path: Path, nodes: list[Any], written: object) -> None:
    """Refuse a file clustersim wrote whose nodes changed because it was cut short at a node's end: fewer nodes
    than the ``written`` (``clustersim.nodes``), numbered 0, 1, ... as clustersim numbers them, with no gap (an
    edit that dropped nodes elsewhere is read as an edited trace)."""
    if isinstance(written, int) and len(nodes) < written and all(n.id == i for i, n in enumerate(nodes)):
        raise ChakraError(f"{path}: truncated: {len(nodes):,} of the {written:,} nodes clustersim wrote (the file "
                          f"ends at a node's end)")


def _parse_file(path: Path) -> tuple[Any, list[Any], int]:
    """``(GlobalMetadata, [Node, ...], CRC-32 of the bytes after the GlobalMetadata)`` of one ET file."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    data = read_file_bytes(path)
    if data.lstrip()[:1] in (b"{", b"[") and _is_json(data):
        raise ChakraError(f"{path}: is JSON (a PyTorch execution trace or Chakra's JSON form?), not a Chakra "
                          f"protobuf trace; convert it with chakra_converter first")
    frames = iter_frames(data, path)
    first = next(frames, None)
    if first is None:
        raise ChakraError(f"{path}: empty file (a Chakra trace starts with a GlobalMetadata message)")
    meta = parse("GlobalMetadata", first[1], path, first[0])
    if len(UnknownFieldSet(meta)):
        raise ChakraError(f"{path}: the first message is not a Chakra GlobalMetadata (fields outside the schema); "
                          f"is this a Chakra execution trace?")
    nodes, start = [], None
    for offset, body in frames:
        start = offset if start is None else start
        if not body:  # every field at its default: no id, no name, INVALID_NODE; a padded or damaged file
            raise ChakraError(f"{path}: the message at byte {offset} is empty (a zero-length record, not a Chakra "
                              f"Node: is the file padded or damaged?)")
        nodes.append(parse("Node", body, path, offset))
    return meta, nodes, zlib.crc32(memoryview(data)[start:]) if start is not None else 0


def _is_json(data: bytes) -> bool:
    """Whether ``data`` is a JSON document (a binary trace never is, even one whose first length byte is '{')."""
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def _attrs(msg: Any) -> dict[str, Any]:
    """``{name: value}`` of a message's attributes (:func:`~workloads.chakra.schema.attr_value`, inlined)."""
    out = {}
    for a in msg.attr:  # NOTE: inlined for performance (a trace of a 1,024-GPU step has millions of attributes)
        f = a.WhichOneof("value")
        if f is not None:
            v = getattr(a, f)
            out[a.name] = list(v.values) if f.endswith("_list") else v
    return out


def _meta_attrs(meta: Any) -> dict[str, Any]:
    return {a.name: attr_value(a) for a in meta.attr}


class _Groups:
    """Process groups by name, from ``comm_group.json`` and METADATA nodes; ``""``/``"0"`` = all ranks."""

    def __init__(self, world: int, folder: Path | None = None, prefix: str = "") -> None:
        self.world = world
        self.folder = folder  # and prefix: to name the rank files that ranks beyond the world would be in
        self.prefix = prefix
        self.by_name: dict[str, tuple[int, ...]] = {}
        self.source: dict[str, str] = {}

    def define(self, name: str, ranks: Sequence[int], where: str) -> None:
        if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise ChakraError(f"{where}: process group {name!r}: ranks must be a list of integers, got {ranks!r}")
        group = tuple(ranks) if ranks else tuple(range(self.world))  # ASTRA-sim: no ranks = every rank
        bad = [r for r in group if not 0 <= r < self.world]
        if bad and min(bad) >= self.world and len(set(group)) == len(group):
            raise self.beyond(max(bad), f"process group {name!r} ({where}) names")
        if bad or len(set(group)) != len(group):
            raise ChakraError(f"{where}: process group {name!r} = {list(group)}: ranks must be distinct and in "
                              f"0..{self.world - 1} (one file per rank)")
        old = self.by_name.get(name)
        if old is not None and old != group:
            raise ChakraError(f"{where}: process group {name!r} = {list(group)} contradicts {list(old)} in "
                              f"{self.source[name]}")
        self.by_name[name] = group
        self.source[name] = where

    def beyond(self, top: int, who: str) -> ChakraError:
        """Ranks up to ``top`` named (by ``who`` ... "name(s)") with files for fewer: the missing files, by name."""
        return ChakraError(f"{self.folder}: missing rank file(s) {_names(self.prefix, self.world, top)}: {who} ranks "
                           f"up to {top} but the folder has files for ranks 0..{self.world - 1}")

    def load_json(self, folder: Path, prefix: str) -> None:
        """``<prefix>.comm_group.json`` or ``comm_group.json`` (ASTRA-sim's ``{"1": [0, 1], ...}``), if present."""
        for name in (f"{prefix}.comm_group.json", "comm_group.json"):
            p = folder / name
            if not p.is_file():
                continue
            try:
                doc = json.loads(p.read_text())
            except (OSError, ValueError) as exc:
                raise ChakraError(f"{p}: not a readable JSON file of process groups ({exc})") from None
            if not isinstance(doc, dict):
                raise ChakraError(f"{p}: must map group names to rank lists, e.g. {{\"1\": [0, 1]}}")
            top = max((r for ranks in doc.values() if isinstance(ranks, list) for r in ranks
                       if isinstance(r, int) and not isinstance(r, bool)), default=-1)
            if top >= self.world:
                raise self.beyond(top, f"the comm groups in {p.name} name")
            for name, ranks in doc.items():
                self.define(str(name), ranks, str(p))
            return

    def load_metadata(self, node: Any, where: str) -> None:
        """PyTorch's ``process_group:init`` node as ASTRA-sim parses it; other metadata nodes are ignored."""
        text = node.inputs.values if node.HasField("inputs") else ""
        if len(text) < 4:
            return
        if text[:2] in ("['", '["') and text[-2:] in ("']", '"]'):
            text = text[2:-2]
        try:
            pgs = json.loads(text)
        except ValueError:
            return
        if not isinstance(pgs, list):
            return
        for pg in pgs:
            if isinstance(pg, dict) and "pg_name" in pg:
                self.define(str(pg["pg_name"]), pg.get("ranks", []), where)

    def group(self, name: str, where: str) -> tuple[int, ...]:
        found = self.by_name.get(name)
        if found is not None:
            return found
        if name in ("", "0"):
            return tuple(range(self.world))
        have = ", ".join(sorted(self.by_name, key=lambda s: (len(s), s))) or "none"
        raise ChakraError(f"{where}: pg_name {name!r} is not a defined process group (defined: {have}); define it "
                          f"in comm_group.json or a process_group:init METADATA_NODE")


def _rank_units(rank: int, nodes: list[Any], path: Path, groups: _Groups, lossless: bool) -> list[_Unit]:
    """The ops of one rank file, in a dependency order (ties: lowest order key first)."""
    by_id: dict[int, Any] = {}
    for node in nodes:
        if node.id in by_id:
            raise ChakraError(f"{path}: node id {node.id} appears twice")
        by_id[node.id] = node
        if node.type in NEWER_NODE_TYPES:
            raise ChakraError(f"{path}: node {node.id} ({node.name!r}) is a {NEWER_NODE_TYPES[node.type]} (node type "
                              f"{node.type}, from a newer Chakra schema), which clustersim does not model; modelled: "
                              f"{', '.join(_MODELLED)}")
        if not 0 <= node.type < len(NODE_TYPES):
            raise ChakraError(f"{path}: node {node.id} ({node.name!r}) has unknown node type {node.type}; valid: "
                              f"0..{len(NODE_TYPES) - 1} ({', '.join(NODE_TYPES)})")
        type_name = NODE_TYPES[node.type]
        if type_name == "METADATA_NODE":
            groups.load_metadata(node, f"{path}: node {node.id}")
        elif type_name not in _SKIPPED and type_name not in _MODELLED:
            raise ChakraError(f"{path}: node {node.id} ({node.name!r}) is a {type_name}, which clustersim does not "
                              f"model (remote memory); modelled: {', '.join(_MODELLED)}")

    # Group nodes into units: one per node, or per clustersim op (the chained parts of a coarsened collective).
    units: list[_Unit] = []
    unit_of: dict[int, int] = {}
    for node in nodes:
        if NODE_TYPES[node.type] in _SKIPPED:
            continue
        attrs = _attrs(node)
        if lossless:
            op_id = attrs.get(PREFIX + "op")
            if not isinstance(op_id, int):
                raise ChakraError(f"{path}: node {node.id} ({node.name!r}) has no clustersim.op attribute, though "
                                  f"the trace says clustersim wrote it; read it with clustersim_attrs=False")
            if units and units[-1].key == op_id and PREFIX + "part" in attrs:
                units[-1].nodes.append(node)
                unit_of[node.id] = len(units) - 1
                continue
            key = op_id
        else:
            key = node.id
        unit_of[node.id] = len(units)
        units.append(_Unit(rank, [node], attrs, key))

    # Dependencies: data_deps and ctrl_deps, passing through the skipped (metadata, invalid) nodes.
    resolved: dict[int, list[int]] = {}
    active: set[int] = set()

    def check(node_id: int, child: Any) -> None:
        if node_id not in by_id:
            raise ChakraError(f"{path}: node {child.id} ({child.name!r}) depends on node {node_id}, which is not in "
                              f"the file")

    def through(node_id: int, child: Any) -> list[int]:
        """Unit indices that a dependency on ``node_id`` stands for: itself, or for a skipped node (metadata,
        invalid) what it depends on, in order. A walk with its own stack: chains of skipped nodes may be
        longer than Python's recursion limit."""
        check(node_id, child)
        if node_id in unit_of:
            return [unit_of[node_id]]
        stack = [(node_id, None)]  # (skipped node, its dependencies left to walk; None: not entered yet)
        while stack:
            top, left = stack[-1]
            if left is None:
                if top in active:
                    raise ChakraError(f"{path}: dependency cycle through node {top}")
                active.add(top)
                skipped = by_id[top]
                left = list(dict.fromkeys([*skipped.data_deps, *skipped.ctrl_deps]))[::-1]
                stack[-1] = (top, left)
            while left:
                d = left[-1]
                check(d, by_id[top])
                if d in unit_of or d in resolved:
                    left.pop()
                    continue
                stack.append((d, None))
                break
            else:
                stack.pop()
                active.discard(top)
                skipped = by_id[top]
                out = [u for d in dict.fromkeys([*skipped.data_deps, *skipped.ctrl_deps])
                       for u in ([unit_of[d]] if d in unit_of else resolved[d])]
                resolved[top] = list(dict.fromkeys(out))
        return resolved[node_id]

    for index, unit in enumerate(units):
        first = unit.nodes[0]
        own = {n.id for n in unit.nodes}
        explicit: list[int] = []
        for node in unit.nodes:
            for d in dict.fromkeys([*node.data_deps, *node.ctrl_deps]):
                if d == node.id:
                    raise ChakraError(f"{path}: dependency cycle: node {node.id} ({node.name!r}) depends on itself")
                if d in own:  # the previous part of a coarsened collective
                    continue
                for u in through(d, node):
                    if u == index:
                        raise ChakraError(f"{path}: dependency cycle: node {node.id} ({node.name!r}) waits for "
                                          f"itself through node {d}")
                    unit.after.append(u)
                    if node is first:
                        explicit.append(u)
        if lossless and unit.attrs.get(PREFIX + "stream_dep") and first.data_deps:
            stream_prev = through(first.data_deps[-1], first)  # the stream order the writer made explicit
            explicit = explicit[:-len(stream_prev)] if explicit[-len(stream_prev):] == stream_prev else explicit
        unit.deps = list(dict.fromkeys(explicit))
        unit.after = list(dict.fromkeys(unit.after))

    # Kahn's algorithm, lowest key first among the ready units; what is left is on a cycle.
    waiting = [len(u.after) for u in units]
    children: list[list[int]] = [[] for _ in units]
    for i, u in enumerate(units):
        for d in u.after:
            children[d].append(i)
    ready = [(u.key, i) for i, u in enumerate(units) if not waiting[i]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for c in children[i]:
            waiting[c] -= 1
            if not waiting[c]:
                heapq.heappush(ready, (units[c].key, c))
    if len(order) < len(units):
        stuck = sorted(units[i].nodes[0].id for i in range(len(units)) if waiting[i])
        more = " ..." if len(stuck) > 5 else ""
        raise ChakraError(f"{path}: dependency cycle: nodes {', '.join(map(str, stuck[:5]))}{more} wait for each "
                          f"other")
    position = {i: k for k, i in enumerate(order)}
    out = []
    for k, i in enumerate(order):
        u = units[i]
        u.deps = [position[d] for d in u.deps]
        u.after = [position[d] for d in u.after]
        if not lossless:
            u.key = k  # ranks interleave by position
        out.append(u)
    return out


def _parts_tables(meta: Any, path: Path, cache: dict[tuple, tuple[Kernel, ...]]) -> dict[int, tuple[Kernel, ...]]:
    """The kernel tuples of fused compute ops that the writer put in the GlobalMetadata, by index."""
    fields: dict[int, dict[str, list]] = {}
    for a in meta.attr:
        m = re.fullmatch(re.escape(PREFIX) + r"parts\.(\d+)\.(\w+)", a.name)
        if m:
            fields.setdefault(int(m[1]), {})[m[2]] = attr_value(a)
    tables = {}
    for k, f in fields.items():
        try:
            cats, flops, nbytes, shapes, batch = (f[x] for x in ("category", "flops", "nbytes", "shape", "batch"))
        except KeyError as exc:
            raise ChakraError(f"{path}: GlobalMetadata: kernel table {k} lacks clustersim.parts.{k}.{exc.args[0]}") \
                from None
        if not len(cats) == len(flops) == len(nbytes) == len(batch) == len(shapes) // 3:
            raise ChakraError(f"{path}: GlobalMetadata: the lists of kernel table {k} differ in length")
        bad = [(name, x) for name, xs in (("flops", flops), ("nbytes", nbytes)) for x in xs
               if not math.isfinite(x) or x < 0]
        if bad:
            raise ChakraError(f"{path}: GlobalMetadata: clustersim.parts.{k}.{bad[0][0]} holds {bad[0][1]!r}; "
                              f"FLOPs and bytes must be finite non-negative numbers")
        reserved = f.get("sm_reserved", [0] * len(cats))
        if len(reserved) != len(cats):
            raise ChakraError(f"{path}: GlobalMetadata: the lists of kernel table {k} differ in length")
        parts = tuple(Kernel(c, f, b, None if shapes[3 * i] < 0 else tuple(shapes[3 * i:3 * i + 3]), n, int(r))
                      for i, (c, f, b, n, r) in enumerate(zip(cats, flops, nbytes, batch, reserved)))
        tables[k] = cache.setdefault(parts, parts)  # one tuple per distinct value across ranks, as generators do
    return tables


def _spec(unit: _Unit, lossless: bool, tables: dict[int, tuple[Kernel, ...]]) -> _Spec:
    """How to build the op of ``unit``: the OpGraph builder and its arguments (collective groups come later)."""
    node, a, rank = unit.nodes[0], unit.attrs, unit.rank
    type_name = NODE_TYPES[node.type]

    def spec(builder: str, args: tuple, pg: str | None = None, per_rank_input: bool = False, **kwargs: Any) -> _Spec:
        return _Spec(unit.key, unit.deps, node.id, builder, args, {"name": node.name, **kwargs}, pg, per_rank_input)

    def need(name: str) -> Any:
        value = a.get(name)
        if value is None:
            raise OpGraphError(f"a {type_name} needs the attribute {name!r}")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise OpGraphError(f"attribute {name!r} must be a finite non-negative number, got {value!r}")
        return value

    def numbers(name: str) -> list[float] | None:
        """An optional list attribute of finite non-negative numbers (``clustersim.split``)."""
        values = a.get(name)
        if values is None:
            return None
        bad = [values] if not isinstance(values, list) else [v for v in values if not math.isfinite(v) or v < 0]
        if bad:
            raise OpGraphError(f"attribute {name!r} must be a list of finite non-negative numbers, got {bad[0]!r}")
        return values

    def number(name: str, default: float | None = 0.0) -> float | None:
        return need(name) if a.get(name) is not None else default

    def integer(name: str, default: int | None = None) -> int:
        """A rank or tag attribute (``comm_src``, ``comm_dst``, ``comm_tag``): a whole number; a fractional one
        is refused, not truncated to another rank or tag."""
        value = need(name) if default is None or a.get(name) is not None else default
        if value != int(value):
            raise OpGraphError(f"attribute {name!r} must be a whole number (a rank or a tag), got {value!r}")
        return int(value)

    def text(name: str, default: str) -> str:
        """An optional string attribute (a ``clustersim.*`` tag: stream, class, category, algorithm)."""
        value = a.get(name, default)
        if not isinstance(value, str):
            raise OpGraphError(f"attribute {name!r} must be a string, got {value!r}")
        return value

    def whole(name: str) -> int:
        """An optional integer attribute, -1 when absent (``clustersim.layer``, ``micro_batch``, ``stage``)."""
        value = a.get(name, -1)
        if not isinstance(value, int) or isinstance(value, bool):
            raise OpGraphError(f"attribute {name!r} must be an integer, got {value!r}")
        return value

    tags: dict[str, Any] = {}
    if lossless:
        # (a class left out: OpGraph's own defaults, "compute" for a kernel and "dp" for a collective)
        tags = {"stream": text(PREFIX + "stream", "compute"),
                "traffic_class": text(PREFIX + "traffic_class", "compute" if type_name == "COMP_NODE" else "dp"),
                **{k: whole(PREFIX + k) for k in ("layer", "micro_batch", "stage")}}
    if type_name == "COMP_NODE":
        if lossless:
            parts = None
            if PREFIX + "parts" in a:
                parts = tables.get(a[PREFIX + "parts"])
                if parts is None:
                    raise OpGraphError(f"clustersim.parts {a[PREFIX + 'parts']} is not a kernel table of this file")
            shape = a.get(PREFIX + "shape")
            return spec("compute", (rank, number(PREFIX + "flops"), number(PREFIX + "nbytes")),
                        category=text(PREFIX + "category", "gemm"), shape=tuple(shape) if shape else None,
                        duration_s=number(PREFIX + "duration_s", None), parts=parts, **tags)
        stream = "cpu" if a.get("is_cpu_op") else "compute"
        if node.duration_micros > 0:
            return spec("compute", (rank,), stream=stream, category="fixed", duration_s=node.duration_micros * 1e-6)
        flops = number("num_ops")
        return spec("compute", (rank, flops, number("tensor_size")), stream=stream,
                    category="gemm" if flops else "fixed", duration_s=None if flops else 0.0)
    if type_name == "COMM_COLL_NODE":
        comm_type = need("comm_type")
        if not isinstance(comm_type, int) or not 0 <= comm_type < len(COLLECTIVE_COMM_TYPES):
            raise OpGraphError(f"comm_type {comm_type!r} is not a CollectiveCommType "
                               f"(0..{len(COLLECTIVE_COMM_TYPES) - 1})")
        kind = FROM_COMM.get(COLLECTIVE_COMM_TYPES[comm_type])
        if kind is None:
            raise OpGraphError(f"collective {COLLECTIVE_COMM_TYPES[comm_type]} is not modelled by clustersim; "
                               f"modelled: {', '.join(sorted(FROM_COMM))}")
        pg = str(a.get("pg_name", ""))
        if lossless:
            count = a.get(PREFIX + "count", 1)
            if count != len(unit.nodes):
                raise OpGraphError(f"clustersim.count {count} but {len(unit.nodes)} chained nodes")
            return spec("collective_op", (rank, kind, None, number(PREFIX + "nbytes")), pg,
                        algorithm=text(PREFIX + "algorithm", "auto"), count=count, split=numbers(PREFIX + "split"),
                        holds_sms=a.get(PREFIX + "holds_sms", 1) != 0, **tags)
        size = BARRIER_BYTES if COLLECTIVE_COMM_TYPES[comm_type] == "BARRIER" else need("comm_size")
        return spec("collective_op", (rank, kind, None, size), pg, kind in PER_RANK_INPUT, stream="comm",
                    traffic_class=kind)
    # COMM_SEND_NODE / COMM_RECV_NODE
    send = type_name == "COMM_SEND_NODE"
    src = integer("comm_src") if not send or "comm_src" in a else rank
    dst = integer("comm_dst") if send or "comm_dst" in a else rank
    if (src if send else dst) != rank:
        mine = "comm_src" if send else "comm_dst"
        raise OpGraphError(f"{mine} {src if send else dst} of a {type_name} must be this file's rank ({rank})")
    peer = int(dst if send else src)
    nbytes = a.get(PREFIX + "nbytes") if lossless else None
    if nbytes is None:
        nbytes = need("comm_size")
    if not lossless:
        tags = {"stream": "comm" if send else f"recv{peer}", "traffic_class": "p2p"}
    return spec("send" if send else "recv", (rank, peer, nbytes), tag=integer("comm_tag", 0), **tags)
