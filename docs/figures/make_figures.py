"""Regenerate the figures the README shows (committed PNGs next to this script).

Usage::

    python docs/figures/make_figures.py        # about a minute on 2 cores

Each figure is a ``Result.plot_*`` method applied to a shipped example, so the README shows exactly what a
user gets from ``clustersim run FILE --plots DIR`` or a notebook.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def save(ax, name: str) -> None:
    import matplotlib.pyplot as plt
    path = os.path.join(HERE, name)
    ax.figure.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(ax.figure)
    print("wrote", os.path.relpath(path, ROOT))


def main() -> int:
    sys.path.insert(0, ROOT)
    import matplotlib
    matplotlib.use("Agg")
    from simulator.experiment import load_experiment, run_experiment

    gpt3 = run_experiment(load_experiment(os.path.join(ROOT, "examples", "gpt3-175b-1024-h100.yaml")))
    save(gpt3.plot_timeline(), "timeline-gpt3-1024.png")
    save(gpt3.plot_tier_bandwidth(), "tier-bandwidth-gpt3-1024.png")

    moe = run_experiment(load_experiment(os.path.join(ROOT, "examples", "mixtral-8x7b-ep.yaml")))
    ax = moe.plot_timeline()
    ax.set_xlim(1.0, 1.3)
    ax.set_title("Mixtral 8x7B, EP 8, Zipf routing: 0.3 s of the steady state", fontsize=9)
    save(ax, "timeline-mixtral-zoom.png")
    save(moe.plot_stages(), "stages-mixtral.png")
    save(moe.plot_traffic_matrix("node"), "traffic-node-mixtral.png")
    save(moe.plot_link_heatmap(top=16, tier="leaf", bins=300), "leaf-heatmap-mixtral.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
