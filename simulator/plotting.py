"""Plots that read a result's DataFrames (never the engine).

All functions take DataFrames (``result.ops``, ``result.links``,
``result.stages``) and an optional matplotlib ``Axes``; they return the Axes.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

CLASS_COLORS = {"compute": "#4C72B0", "tp": "#DD8452", "pp": "#55A868", "dp": "#C44E52", "zero": "#8172B3",
                "ep": "#937860", "edp": "#DA8BC3", "bench": "#8C8C8C"}


def plot_timeline(ops: pd.DataFrame, ranks: list[int] | None = None, ax=None, max_ranks: int = 16):
    """Gantt chart: one row per (rank, stream), one bar per op, coloured by traffic class."""
    ranks = ranks if ranks is not None else sorted(ops["rank"].unique())[:max_ranks]
    df = ops[ops["rank"].isin(ranks)]
    rows = sorted({(r, s) for r, s in zip(df["rank"], df["stream"])})
    y = {key: i for i, key in enumerate(rows)}
    ax = ax or plt.subplots(figsize=(12, 0.3 * len(rows) + 1))[1]
    for cls, part in df.groupby("traffic_class"):
        ax.barh([y[(r, s)] for r, s in zip(part["rank"], part["stream"])], part["end_s"] - part["start_s"],
                left=part["start_s"], height=0.8, color=CLASS_COLORS.get(cls, "#333333"), label=cls)
    ax.set_yticks(range(len(rows)), [f"r{r} {s}" for r, s in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.legend(loc="upper right", fontsize=7)
    return ax


def plot_link_utilization(links: pd.DataFrame, ax=None):
    """Distribution of link utilisation (bytes / (bandwidth × step)) per tier, as box plots."""
    used = links[links["bytes"] > 0]
    tiers = [t for t in ("nvlink", "pcie", "leaf", "spine", "core") if t in set(used["tier"])]
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    ax.boxplot([used.loc[used["tier"] == t, "utilization"] for t in tiers], tick_labels=tiers)
    ax.set_ylabel("utilisation over the step")
    return ax


def plot_bytes_by_class_and_tier(table: pd.DataFrame, ax=None):
    """Stacked bars: link bytes per tier, split by traffic class (``result.bytes_by_class_and_tier()``)."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    (table.T / 1e9).plot.bar(stacked=True, ax=ax,
                             color=[CLASS_COLORS.get(c, "#333333") for c in table.index])
    ax.set_ylabel("GB carried by links")
    return ax


def plot_stages(stages: pd.DataFrame, ax=None):
    """Busy vs bubble time per pipeline stage."""
    ax = ax or plt.subplots(figsize=(6, 3))[1]
    ax.bar(stages["stage"], stages["busy_s"], label="busy")
    ax.bar(stages["stage"], stages["bubble_s"], bottom=stages["busy_s"], label="bubble")
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("s")
    ax.legend()
    return ax
