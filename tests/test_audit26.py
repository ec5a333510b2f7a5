"""Twenty-sixth session's fixes: each test fails on the session's starting code (3dd89b7)."""

from __future__ import annotations

import copy

import pytest

from simulator.experiment import experiment_from_dict, run_experiment


def _mixtral(recompute: str) -> dict:
    """A 4-layer Mixtral on 16 GPUs (TP2 PP2 DP4 EP4, skewed routing), communication SMs off so that the
    compute categories are the kernels' own time."""
    return {"cluster": {"preset": "dgx-h100", "nodes": 2},
            "model": {"preset": "mixtral-8x7b", "layers": 4},
            "parallel": {"tp": 2, "pp": 2, "dp": 4, "ep": 4, "micro_batch": 1, "global_batch": 16, "zero": 1,
                         "sequence_parallel": True, "recompute": recompute},
            "training": {"seq_len": 1024}, "moe": {"routing": "zipf", "seed": 0},
            "compute": {"comm_sms": 0, "p2p_sms": 0}}


def test_moe_recomputation_is_recompute_not_backward():
    """Recomputation re-runs forward kernels; it adds no backward work. A MoE layer's backward folded its
    recomputed forward into its first op (``B….pre``), so the breakdown filed it under backward: with
    ``full`` the backward read 46% longer than without recomputation, and no stage had a recompute time."""
    none, full, core = (run_experiment(experiment_from_dict(_mixtral(r)), force=True)
                        for r in ("none", "full", "selective"))
    for r in (full, core):
        assert r.summary["time_breakdown_s"]["backward"] == pytest.approx(
            none.summary["time_breakdown_s"]["backward"], rel=1e-12)
        assert (r.stages["recompute_s"] > 0).all()
    # full recomputation re-runs each stage's forward: all of stage 0's but the embedding lookup
    first = full.stages.iloc[0]
    assert first["recompute_s"] == pytest.approx(first["forward_s"], rel=0.02)
    assert full.step_time > core.step_time > none.step_time * (1 - 1e-12)


INTERLEAVED_DP = {
    "cluster": {"preset": "dgx-h100", "nodes": 8, "nodes_per_leaf": 2, "spines": 4, "oversubscription": 4},
    "model": {"preset": "gpt2-small", "layers": 16, "hidden": 2048, "heads": 16, "kv_heads": 16},
    "parallel": {"tp": 1, "pp": 2, "dp": 32, "micro_batch": 2, "global_batch": 256, "schedule": "interleaved",
                 "zero": 0, "placement": ["tp", "pp", "dp"]},
    "training": {"seq_len": 512}, "compute": {"comm_sms": 0, "p2p_sms": 0}}
"""A small model over DP 32 on 4:1 uplinks: its gradient all-reduces outlast the backwards they overlap."""


@pytest.mark.parametrize("chunks", [2, 4])
def test_screen_times_the_later_chunks_gradient_reductions(chunks):
    """Under the interleaved schedule Megatron reduces each chunk but the first as one collective after its last
    backward. The screen took those reductions to hide behind the later chunks' backwards; here they last longer
    than that, and `fast` pays for them: the screen read -25% (2 chunks) and -37% (4) of `fast` and made
    overlapping the reductions look 27% faster than not, where `fast` says 0.5%."""
    from simulator.screen import screen_experiment

    doc = copy.deepcopy(INTERLEAVED_DP)
    doc["parallel"]["virtual_stages"] = chunks
    exp = experiment_from_dict(doc)
    screened = screen_experiment(exp)["step_time_s"]
    assert screened == pytest.approx(run_experiment(exp).step_time, rel=0.05)
    doc["parallel"]["overlap_grad_reduce"] = False
    assert screened == pytest.approx(screen_experiment(experiment_from_dict(doc))["step_time_s"], rel=0.05)


def test_a_sweep_of_unlike_batches_says_so(tmp_path, capsys):
    """Without parallel.global_batch a point's step is micro_batch x dp sequences: swept over tp, the steps hold
    2,048 to 8,192 tokens, and ranking them by step time ranks unlike work; the sweep says so (on stderr),
    and not once the batch is set or the ranking is per token."""
    import yaml

    from simulator.cli import main
    from simulator.sweeps import batch_note, sweep

    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt2-small", "layers": 2},
           "parallel": {"tp": 1, "pp": 1, "dp": 16, "micro_batch": 1}, "training": {"seq_len": 512}}
    grid = {"parallel.tp": [1, 2, 4]}
    table = sweep(doc, grid, jobs=1, progress=False)
    assert "2,048 to 8,192 tokens" in batch_note(table)
    assert batch_note(table, "tokens_per_s") is None
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["sweep", str(path), "--grid", "parallel.tp=1,2,4", "--jobs", "1", "--no-progress"]) == 0
    assert "steps of unlike size" in capsys.readouterr().err
    doc["training"]["seq_len"] = 256  # the batch set, the sequence swept: still unlike work
    doc["parallel"]["global_batch"] = 16
    assert "training.seq_len" in batch_note(sweep(doc, {"training.seq_len": [256, 512]}, jobs=1, progress=False))
    doc["parallel"]["global_batch"] = 32
    assert batch_note(sweep(doc, grid, jobs=1, progress=False)) is None


@pytest.mark.parametrize("nodes_per_leaf, drawn", [(2, False), (1, True)])
def test_the_leaf_traffic_matrix_is_drawn_only_between_leaves(tmp_path, nodes_per_leaf, drawn):
    """On one leaf the leaf-level matrix is a single cell holding every byte, NVLink's included: not drawn."""
    import matplotlib
    matplotlib.use("Agg")
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2, "nodes_per_leaf": nodes_per_leaf},
           "model": {"preset": "gpt2-small", "layers": 2},
           "parallel": {"tp": 1, "pp": 1, "dp": 16, "micro_batch": 1, "global_batch": 16},
           "training": {"seq_len": 256}}
    paths = run_experiment(experiment_from_dict(doc)).save_plots(str(tmp_path))
    assert any(p.endswith("traffic_leaf.png") for p in paths) == drawn
    assert any(p.endswith("traffic_node.png") for p in paths)


def test_the_node_traffic_matrix_is_drawn_only_between_nodes(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small", "layers": 2},
           "parallel": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8}, "training": {"seq_len": 256}}
    paths = run_experiment(experiment_from_dict(doc)).save_plots(str(tmp_path))
    names = {p.rsplit("/", 1)[-1] for p in paths}
    assert not any(n.startswith("traffic_") for n in names) and "tier_bandwidth.png" in names


def test_resuming_a_sweep_whose_rows_are_all_invalid(tmp_path, capsys):
    """Every point invalid leaves the derived parallel.dp column empty in the file; the resumed rows dropped it
    and the table could not be built (KeyError, since before this session)."""
    import yaml

    from simulator.cli import main

    path, out = tmp_path / "e.yaml", tmp_path / "s.csv"
    path.write_text(yaml.safe_dump({"cluster": {"preset": "dgx-h100", "nodes": 2},
                                    "model": {"preset": "gpt2-small", "layers": 2},
                                    "parallel": {"tp": 1, "pp": 1, "dp": 16, "micro_batch": 1},
                                    "training": {"seq_len": 512}}))
    argv = ["sweep", str(path), "--grid", "parallel.tp=3", "--jobs", "1", "--no-progress", "-o", str(out)]
    for _ in range(2):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "cannot derive dp" in err and "Traceback" not in err and "internal error" not in err


def test_a_folder_given_as_the_experiment_file_points_to_chakra(tmp_path, capsys):
    from simulator.cli import main

    assert main(["run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a folder" in err and "--chakra" in err and len(err.strip().splitlines()) == 1


def test_a_result_edited_to_text_is_simulated_again_and_the_column_stays_numeric(tmp_path):
    """A resumed sweep reads its CSV back: one result cell edited to text made pandas read the whole column as
    strings, so every reused row's value came back as text and the edited one was trusted as ``"oops"``."""
    from simulator.sweeps import sweep

    doc = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small", "layers": 2},
           "parallel": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8}, "training": {"seq_len": 256}}
    grid = {"parallel.tp": [1, 2, 4]}
    out = tmp_path / "s.csv"
    first = sweep(doc, grid, jobs=1, progress=False, output=out)
    lines = out.read_text().splitlines()
    column = lines[0].split(",").index("mfu")
    cells = lines[2].split(",")
    cells[column] = "oops"
    lines[2] = ",".join(cells)
    out.write_text("\n".join(lines) + "\n")
    again = sweep(doc, grid, jobs=1, progress=False, output=out)
    assert again["mfu"].dtype == float
    assert list(again["mfu"]) == list(first["mfu"])
