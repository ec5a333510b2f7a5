"""Plots that read a result's DataFrames (never the engine).

Every function takes DataFrames (``result.timeline()``, ``result.stages``,
``result.tier_timeseries``, ``result.link_timeseries()``,
``result.traffic_matrix()``, ``result.links``) and an optional matplotlib
``Axes``; it returns the Axes. ``Result.plot_*`` are these functions applied to
the result's frames, and ``Result.save_plots(folder)`` (``clustersim run
--plots DIR``) writes every one as a PNG.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from topologies.cluster import TIERS

from .traffic import check_count, window_means

CLASS_COLORS = {"compute": "#4C72B0", "tp": "#DD8452", "pp": "#55A868", "dp": "#C44E52", "zero": "#8172B3",
                "ep": "#937860", "edp": "#DA8BC3", "sync": "#CCB974", "cp": "#64B5CD", "bench": "#8C8C8C"}
CATEGORY_COLORS = {"forward": "#6BAED6", "backward": "#2171B5", "recompute": "#9E9AC8", "optimizer": "#525252",
                   "other_compute": "#969696", "moe_wait": "#FF9DA7", "sync_wait": "#BDBDBD",
                   "bubble": "#FFFFFF", "idle": "#F0F0F0",
                   **{f"exposed_{c}": v for c, v in CLASS_COLORS.items()}}
TIER_COLORS = {"nvlink": "#76B900", "pcie": "#8C8C8C", "leaf": "#4C72B0", "spine": "#DD8452", "core": "#C44E52"}
_HATCH = {"bubble": "////", "idle": "", "moe_wait": "xx"}


MAX_BINS = 100_000
"""The most time windows :func:`plot_link_heatmap` draws per link (a grid of links x bins floats)."""


def _frame(value: object, name: str, source: str, columns: tuple[str, ...] = ()) -> None:
    """Refuse anything but the frame ``source`` returns (a Result passed for its frame, or another frame, failed
    inside with a KeyError or an AttributeError)."""
    if not isinstance(value, pd.DataFrame):
        raise TypeError(f"{name}: must be {source}, a DataFrame, got {type(value).__name__}")
    missing = [c for c in columns if c not in value.columns]
    if missing:
        raise ValueError(f"{name}: has no column {', '.join(map(repr, missing))}; pass {source}")


def _color(category: str) -> str:
    return CATEGORY_COLORS.get(category, "#333333")


def _label(category: str) -> str:
    return category.replace("exposed_", "") + (" comm" if category.startswith("exposed_") else "")


def plot_timeline(bars: pd.DataFrame, ranks: list[int] | None = None, ax=None, max_ranks: int = 16,
                  title: str | None = None, label_micro_batches: bool = True):
    """Gantt chart of ``result.timeline()``: one row per rank (by default one per pipeline stage).

    The main bar of a row is what the rank does at each instant (forward / backward / recompute coloured
    apart, micro-batch numbers on them, exposed communication by class, waits, hatched bubbles); the thin
    bar under it is the communication in flight off the compute stream (hidden or not). A frame of ops
    (``result.ops``) is accepted too and turned into bars for ``ranks``.
    """
    _frame(bars, "bars", "result.timeline() (or result.ops)")
    if "lane" not in bars.columns:  # a frame of ops
        _frame(bars, "bars", "result.timeline() (or result.ops)", ("rank", "kind", "start_s", "end_s"))
        from .timeline import timeline_bars
        bars = timeline_bars(bars, None, ranks, max_ranks)
    if bars.empty:
        raise ValueError("bars: no timeline bars to draw (an empty frame)")
    rows = list(dict.fromkeys(bars["rank"].tolist()))
    y = {r: i for i, r in enumerate(rows)}
    ax = ax or plt.subplots(figsize=(13, 0.55 * len(rows) + 1.6))[1]
    main = bars[bars["lane"] == "main"]
    spans = main["label"] != ""  # compute bars span a whole pass; the partition's other bars go over them
    layers = [main[~spans & main["category"].isin(["bubble", "idle"])], main[spans],
              main[~spans & ~main["category"].isin(["bubble", "idle"])]]
    for layer in layers:
        for (cat, r), rows_r in layer.groupby(["category", "rank"], sort=False):
            ax.broken_barh(list(zip(rows_r["start_s"], rows_r["end_s"] - rows_r["start_s"])), (y[r] - 0.36, 0.62),
                           facecolors=_color(cat), edgecolor="#9E9E9E" if cat == "bubble" else "none",
                           linewidth=0.3, hatch=_HATCH.get(cat, ""))
    comm = bars[bars["lane"] == "comm"]
    for cat, part in comm.groupby("category", sort=True):
        for r, rows_r in part.groupby("rank", sort=False):
            ax.broken_barh(list(zip(rows_r["start_s"], rows_r["end_s"] - rows_r["start_s"])), (y[r] + 0.3, 0.14),
                           facecolors=_color(cat), edgecolor="none")
    span = float(bars["end_s"].max()) if len(bars) else 1.0
    if label_micro_batches:
        labelled = main[(main["label"] != "") & ((main["end_s"] - main["start_s"]) > 0.012 * span)]
        if len(labelled) <= 600:
            for row in labelled.itertuples(index=False):
                ax.text((row.start_s + row.end_s) / 2, y[row.rank] - 0.05, row.label, ha="center", va="center",
                        fontsize=6, color="white" if row.category == "backward" else "black", clip_on=True)
    stage = dict(zip(bars["rank"], bars["stage"]))
    ax.set_yticks(range(len(rows)), [f"stage {stage[r]} (rank {r})" if stage.get(r, -1) >= 0 else f"rank {r}"
                                     for r in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_xlim(0, span)
    ax.set_xlabel("time (s)")
    cats = [c for c in dict.fromkeys([*main["category"], *comm["category"]])]
    handles = [Patch(facecolor=_color(c), edgecolor="#9E9E9E" if c == "bubble" else "none",
                     hatch=_HATCH.get(c, ""), label=_label(c)) for c in cats]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    ax.set_title(title or ("one representative rank per pipeline stage; thin bars: communication in flight"
                           if any(v >= 0 for v in stage.values()) else "timeline"), fontsize=9)
    return ax


def plot_stages(stages: pd.DataFrame, ax=None):
    """Where the step went on each pipeline stage (``result.stages``): stacked seconds per category."""
    _frame(stages, "stages", "result.stages", ("stage", "busy_s", "bubble_s"))
    cols = [c for c in stages.columns if c.endswith("_s") and c not in ("busy_s",) and stages[c].abs().max() > 0]
    cols = [c for c in cols if c not in ("bubble_s", "idle_s")] + [c for c in ("bubble_s", "idle_s") if c in cols]
    ax = ax or plt.subplots(figsize=(7, 3.2))[1]
    bottom = np.zeros(len(stages))
    for c in cols:
        cat = c[:-2]
        ax.bar(stages["stage"], stages[c], bottom=bottom, color=_color(cat), label=_label(cat),
               edgecolor="#9E9E9E" if cat == "bubble" else "none", hatch=_HATCH.get(cat, ""), linewidth=0.3)
        bottom += stages[c].to_numpy()
    ax.set_xticks(stages["stage"].tolist())
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("seconds of the step")
    ax.set_title("Where the step went, per pipeline stage (mean over its ranks)", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return ax


def plot_tier_bandwidth(tiers: pd.DataFrame, phases: list[tuple[str, float, float]] | None = None, ax=None,
                        capacity: dict[str, float] | None = None):
    """Bandwidth of each fabric tier over the step (``result.tier_timeseries``; exact steps), with the
    step's phases shaded (``(name, start_s, end_s)``). With ``capacity`` (bytes/s of all the tier's links,
    ``{tier: total}``) the tiers are drawn as the fraction of that capacity in use, so they compare."""
    _frame(tiers, "tiers", "result.tier_timeseries", ("time_s",))
    ax = ax or plt.subplots(figsize=(10, 3.2))[1]
    t = tiers["time_s"].to_numpy()
    for col in [c for c in tiers.columns if c != "time_s" and tiers[c].abs().max() > 0]:
        y = tiers[col].to_numpy() / (capacity[col] if capacity else 1e9)
        ax.step(t, y, where="post", label=col, color=TIER_COLORS.get(col), linewidth=0.8)
    shades = ["#F2F2F2", "#FFF4E0", "#E8F4E8"]
    for i, (name, start, end) in enumerate(phases or []):
        ax.axvspan(start, end, color=shades[i % len(shades)], zorder=0)
        ax.text((start + end) / 2, 1.0, name, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                fontsize=7)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("fraction of the tier's capacity" if capacity else "GB/s, all links of the tier")
    ax.set_title("Bandwidth per fabric tier over the step", fontsize=9, loc="left")
    if ax.get_legend_handles_labels()[0]:  # (a step that moved no bytes draws no tier)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return ax


def plot_link_heatmap(series: pd.DataFrame, bins: int = 200, ax=None, end_s: float | None = None):
    """Utilisation of links over time (``result.link_timeseries()``): one row per link, busiest first;
    each cell is the exact mean over its time window; ``bins`` (>= 1) windows."""
    bins = check_count(bins, "bins", 1)
    if bins > MAX_BINS:
        raise ValueError(f"bins: at most {MAX_BINS:,} time windows, got {bins:,}")
    _frame(series, "series", "result.link_timeseries()", ("link", "time_s", "utilization", "src", "dst", "tier"))
    if end_s is not None and (isinstance(end_s, bool) or not isinstance(end_s, (int, float)) or not end_s > 0):
        raise ValueError(f"end_s: must be a time in seconds > 0, got {end_s!r}")
    if series.empty:
        raise ValueError("series: no links to draw (an empty link_timeseries; did any link of the selection carry "
                         "bytes?)")
    ax = ax or plt.subplots(figsize=(10, 0.22 * max(1, series["link"].nunique()) + 1.5))[1]
    end = end_s or float(series["time_s"].max()) or 1.0
    edges = np.linspace(0.0, end, bins + 1)
    links = list(dict.fromkeys(series["link"].tolist()))
    grid = np.zeros((len(links), bins))
    names = []
    for i, lid in enumerate(links):
        s = series[series["link"] == lid]
        times, util = s["time_s"].to_numpy(), s["utilization"].to_numpy()
        if times[-1] < end:
            times, util = np.r_[times, end], np.r_[util, 0.0]
        grid[i] = window_means(times, util, edges)
        names.append(f"{s['src'].iloc[0]}→{s['dst'].iloc[0]} ({s['tier'].iloc[0]})")
    image = ax.imshow(grid, aspect="auto", interpolation="nearest", extent=(0, end, len(links) - 0.5, -0.5),
                      cmap="magma", vmin=0, vmax=max(1.0, float(grid.max())))
    ax.set_yticks(range(len(links)), names, fontsize=6)
    ax.set_xlabel("time (s)")
    ax.set_title("Busiest links over time (mean utilisation per time window)", fontsize=9)
    plt.colorbar(image, ax=ax, label="utilisation (of the link's rate)")
    return ax


def plot_traffic_matrix(matrix: pd.DataFrame, ax=None, title: str | None = None, log: bool = True):
    """Heatmap of a traffic matrix (``result.traffic_matrix(level)``), GB from row to column; ``log``
    colours (default) keep the small off-diagonal flows visible next to the NVLink diagonal; pairs that
    exchanged nothing stay blank."""
    _frame(matrix, "matrix", "result.traffic_matrix(level)")
    if matrix.shape[0] != matrix.shape[1] or not all(pd.api.types.is_numeric_dtype(t) for t in matrix.dtypes):
        raise ValueError(f"matrix: must be a square frame of bytes (result.traffic_matrix(level)), got a "
                         f"{matrix.shape[0]} x {matrix.shape[1]} frame")
    from matplotlib.colors import LogNorm

    n = len(matrix)
    ax = ax or plt.subplots(figsize=(6.5, 5.5))[1]
    data = matrix.to_numpy() / 1e9
    top = float(data.max()) if data.size else 0.0
    norm = LogNorm(vmin=max(top * 1e-5, 1e-9), vmax=max(top, 2e-9)) if log and top > 0 else None
    image = ax.imshow(np.ma.masked_less_equal(data, 0.0), cmap="viridis", interpolation="nearest", norm=norm)
    step = max(1, n // 16)
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks, [matrix.columns[i] for i in ticks], rotation=90, fontsize=6)
    ax.set_yticks(ticks, [matrix.index[i] for i in ticks], fontsize=6)
    ax.set_xlabel("destination")
    ax.set_ylabel("source")
    plt.colorbar(image, ax=ax, label="GB sent per step")
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def plot_link_utilization(links: pd.DataFrame, ax=None):
    """Distribution of link utilisation (bytes / (bandwidth × step)) per tier, as box plots."""
    _frame(links, "links", "result.links", ("bytes", "tier", "utilization"))
    used = links[links["bytes"] > 0]
    tiers = [t for t in TIERS if t in set(used["tier"])]
    if not tiers:
        raise ValueError("links: no link carried bytes, nothing to draw")
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    ax.boxplot([used.loc[used["tier"] == t, "utilization"] for t in tiers], tick_labels=tiers)
    ax.set_ylabel("utilisation over the step (bytes / rate / step)")
    ax.set_title("Link utilisation per tier (links that carried bytes)", fontsize=9)
    return ax


def plot_bytes_by_class_and_tier(table: pd.DataFrame, ax=None):
    """Stacked bars: link bytes per tier, split by traffic class (``result.bytes_by_class_and_tier()``)."""
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"table: must be result.bytes_by_class_and_tier(), a DataFrame, got {type(table).__name__}")
    if table.empty or not (table.to_numpy(dtype=float) > 0).any():
        raise ValueError("table: no link carried bytes, nothing to draw")
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    (table.T / 1e9).plot.bar(stacked=True, ax=ax,
                             color=[CLASS_COLORS.get(c, "#333333") for c in table.index])
    ax.set_ylabel("GB carried by links")
    ax.set_title("Bytes carried per tier, by traffic class", fontsize=9)
    return ax
