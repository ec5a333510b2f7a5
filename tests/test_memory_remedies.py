"""Out of memory, ``clustersim run`` names each single layout change that fits (``memory_remedies``): each
offered change, applied to the file as worded, loads, fits and leaves the memory the advice said. Cases from
the review of the first version (each failed or was missing there)."""

import copy

import pytest

from simulator.experiment import experiment_from_dict, memory_remedies

NO_GLOBAL_BATCH = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "llama3-70b", "layers": 10},
                   "parallel": {"tp": 8, "pp": 2, "dp": 1, "micro_batch": 4}, "training": {"seq_len": 32768}}
DUALPIPE_DP1 = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "gpt3-175b", "layers": 20},
                "parallel": {"tp": 8, "pp": 2, "dp": 1, "micro_batch": 1, "global_batch": 8,
                             "schedule": "dualpipe"}, "training": {"seq_len": 2048}}
UNFUSED = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "llama3-70b", "layers": 8},
           "parallel": {"tp": 8, "pp": 1, "dp": 2, "micro_batch": 2, "global_batch": 16},
           "training": {"seq_len": 16384}, "options": {"flash_attention": False}}
GIVEN_MODULES = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "model": {"preset": "llama3-70b", "layers": 8},
                 "parallel": {"tp": 8, "pp": 2, "dp": 1, "micro_batch": 4, "global_batch": 16,
                              "recompute": "selective", "recompute_modules": ["core_attn"]},
                 "training": {"seq_len": 32768}}


def _apply(doc: dict, change: dict, drop: tuple = ()) -> dict:
    out = copy.deepcopy(doc)
    out["parallel"].update(change)
    for key in drop:
        out["parallel"].pop(key, None)
    return out


@pytest.mark.parametrize("doc, offered, change, drop", [
    # the global batch the file left to be derived is kept, and said
    (NO_GLOBAL_BATCH, "parallel.micro_batch: 2 with parallel.global_batch: 4", {"micro_batch": 2, "global_batch": 4},
     ()),
    # DualPipe shards the optimizer over the mirror stage's copy: ZeRO-1 with dp 1
    (DUALPIPE_DP1, "parallel.zero: 1", {"zero": 1}, ()),
    # scores through HBM: recomputing the attention core is the cheap remedy
    (UNFUSED, "parallel.recompute: selective, parallel.recompute_modules: [core_attn, layernorm]",
     {"recompute": "selective", "recompute_modules": ["core_attn", "layernorm"]}, ()),
    # a file's own module list must go with full recomputation
    (GIVEN_MODULES, "parallel.recompute: full without parallel.recompute_modules", {"recompute": "full"},
     ("recompute_modules",)),
])
def test_each_offered_change_applied_as_worded_fits_with_the_memory_said(doc, offered, change, drop):
    exp = experiment_from_dict(doc)
    hbm = exp.cluster.gpu.hbm_bytes
    assert not exp.memory().fits(hbm)
    remedies = dict(memory_remedies(exp))
    assert offered in remedies, list(remedies)
    fixed = experiment_from_dict(_apply(doc, change, drop))
    assert fixed.memory().fits(hbm)
    assert fixed.memory().total == remedies[offered].total
