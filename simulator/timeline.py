"""The data behind the timeline figure: bars per rank, one row per pipeline stage by default.

A row is one rank's partition of the step (:mod:`simulator.breakdown`): what
it does at every instant, one category at a time — micro-batch compute by
phase, exposed communication by class, MoE and sync waits, bubble, idle.
Compute bars are one per (phase, micro-batch, chunk) run of ops, labelled with
the micro-batch number; the others are the partition's merged intervals, so
the bubble bars of a row add up to that rank's bubble time exactly.
Communication that is hidden (overlapped with compute or inside a bubble)
comes as ``lane="comm"`` bars: every non-compute-stream op in flight,
coloured by class.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from .breakdown import COMPUTE_CATEGORIES, breakdown_window, op_category, rank_segments
from .traffic import check_ids

COLUMNS = ["rank", "stage", "lane", "category", "start_s", "end_s", "micro_batch", "chunk", "label"]


def stage_ranks(ops: pd.DataFrame, groups: Sequence[tuple[int, int]] | None = None) -> dict[int, int]:
    """``{rank: its stage}`` for the lowest rank of each pipeline stage, in stage order; with ``groups``
    (rank ranges ``[lo, hi)`` that each run a pipeline of their own, the jobs of a joint run) one per stage of
    each group, group after group, so that no group's stages are shown as another's."""
    tagged = ops[ops["stage"] >= 0]
    if tagged.empty:
        return {}
    out: dict[int, int] = {}
    for lo, hi in groups or [(0, int(tagged["rank"].max()) + 1)]:
        mine = tagged[(tagged["rank"] >= lo) & (tagged["rank"] < hi)]
        out.update({int(r): int(s) for s, r in mine.groupby("stage")["rank"].min().items()})
    return out


def stage_of_each_rank(ops: pd.DataFrame) -> dict[int, int]:
    """``{rank: its pipeline stage}`` for every rank of ``ops`` with stage-tagged ops (the lowest stage of a rank
    that holds two: DualPipe's)."""
    tagged = ops[ops["stage"] >= 0]
    return {int(r): int(s) for r, s in tagged.groupby("rank")["stage"].min().items()}


def timeline_bars(ops: pd.DataFrame, step_time: float | None, ranks: list[int] | None = None,
                  max_ranks: int = 16, groups: Sequence[tuple[int, int]] | None = None,
                  steps: Sequence[int] | None = None) -> pd.DataFrame:
    """Bars of the timeline of ``ranks`` (default: one representative per pipeline stage, else the first
    ``max_ranks`` ranks), from a frame like ``result.rep_ops``; ``step_time`` (s) ends the last row (None:
    the last op's end). ``ranks`` is a non-empty list of ranks that have ops in ``ops``.

    Columns: ``rank, stage, lane`` (``"main"``: the partition; ``"comm"``: communication in flight off
    the compute stream), ``category, start_s, end_s, micro_batch, chunk`` and ``label`` (the micro-batch
    number on compute bars, ``"3.1"`` for chunk 1 of an interleaved schedule). ``groups``: rank ranges that
    each run a step of their own (:func:`stage_ranks`, :func:`~simulator.breakdown.group_windows`), ``steps``
    how many each runs.
    """
    first_of_stages = stage_ranks(ops, groups)
    if ranks is None:
        ranks = list(first_of_stages) if first_of_stages else sorted(ops["rank"].unique().tolist())[:max_ranks]
    else:
        ranks = check_ids(ranks, "ranks", "rank")
    missing = sorted(set(ranks) - set(ops["rank"].unique().tolist()))
    if missing:
        raise ValueError(f"ranks: {missing[0]} has no ops in this result (with fidelity fast/lockstep only "
                         f"representative ranks do; e.g. {sorted(first_of_stages)[:8]})")
    sel = ops[ops["rank"].isin(ranks)]
    stage_of = stage_of_each_rank(sel)
    parts = []
    window = breakdown_window(ops, groups, steps)
    seg = rank_segments(sel, window, ops["end_s"].max() if step_time is None else step_time)
    other = seg[~seg["category"].isin(COMPUTE_CATEGORIES[:3])]
    parts.append(other.assign(lane="main", micro_batch=-1, chunk=-1, label=""))
    parts.append(_compute_bars(sel))
    parts.append(_comm_bars(sel))
    bars = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else \
        pd.DataFrame(columns=COLUMNS)
    bars["stage"] = [stage_of.get(r, -1) for r in bars["rank"]]
    order = {r: i for i, r in enumerate(ranks)}
    bars = bars.assign(_row=bars["rank"].map(order)).sort_values(["_row", "lane", "start_s"], kind="stable")
    return bars[COLUMNS].reset_index(drop=True)


def _compute_bars(ops: pd.DataFrame) -> pd.DataFrame:
    """One bar per run of back-to-back forward/backward/recompute ops of one micro-batch and chunk."""
    comp = ops[(ops["kind"] == "compute") & (ops["micro_batch"] >= 0)].sort_values(["rank", "start_s"],
                                                                                    kind="stable")
    if comp.empty:
        return pd.DataFrame(columns=COLUMNS)
    cat = op_category(comp["kind"].to_numpy(), comp["name"].to_numpy(), comp["micro_batch"].to_numpy(),
                      comp["traffic_class"].to_numpy())
    phase = np.isin(cat, COMPUTE_CATEGORIES[:3])  # (other compute is drawn from the partition's segments)
    comp, cat = comp[phase], cat[phase]
    if comp.empty:
        return pd.DataFrame(columns=COLUMNS)
    chunk = np.array([_chunk(n) for n in comp["name"].tolist()], dtype=np.int64)
    rank, mb = comp["rank"].to_numpy(), comp["micro_batch"].to_numpy()
    s, e = comp["start_s"].to_numpy(), comp["end_s"].to_numpy()
    if "member_wait_s" in comp:  # a representative's op ends, for its bar, where its members start to wait
        e = e - comp["member_wait_s"].to_numpy()
    # a run also breaks where its rank's compute pauses (a blocking TP collective or a wait between two ops):
    # the pause is another category of the partition, and a bar across it would be drawn over it
    reached = comp.groupby("rank", sort=False)["end_s"].cummax().to_numpy()  # (ops sorted by rank, then start)
    key_change = np.r_[True, (rank[1:] != rank[:-1]) | (mb[1:] != mb[:-1]) | (cat[1:] != cat[:-1])
                       | (chunk[1:] != chunk[:-1]) | (s[1:] > reached[:-1])]
    first = np.flatnonzero(key_change)
    out = pd.DataFrame({"rank": rank[first], "lane": "main", "category": cat[first],
                        "start_s": s[first], "end_s": np.maximum.reduceat(e, first) if len(first) else e,
                        "micro_batch": mb[first], "chunk": chunk[first]})
    many_chunks = out["chunk"].max() > 0
    out["label"] = [f"{m}.{c}" if many_chunks else f"{m}" for m, c in zip(out["micro_batch"], out["chunk"])]
    return out


def _comm_bars(ops: pd.DataFrame) -> pd.DataFrame:
    """Communication off the compute stream (PP sends/receives, DP reductions, ZeRO gathers) as it flies."""
    comm = ops[(ops["kind"] != "compute") & (ops["stream"] != "compute") & (ops["end_s"] > ops["start_s"])]
    return pd.DataFrame({"rank": comm["rank"].to_numpy(), "lane": "comm",
                         "category": [f"exposed_{c}" for c in comm["traffic_class"]],
                         "start_s": comm["start_s"].to_numpy(), "end_s": comm["end_s"].to_numpy(),
                         "micro_batch": comm["micro_batch"].to_numpy(), "chunk": -1, "label": ""})


def _chunk(name: str) -> int:
    """The chunk of an op named ``F3.c1.L12`` (1), or 0."""
    parts = name.split(".")
    if len(parts) > 1 and parts[1][:1] == "c" and parts[1][1:].isdigit():
        return int(parts[1][1:])
    return 0
