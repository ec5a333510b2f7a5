"""The README's examples work: its experiment-file YAML loads and its Python blocks run."""

import pathlib
import re

import numpy as np
import pytest
import yaml

from simulator.experiment import experiment_from_dict

README = (pathlib.Path(__file__).parent.parent / "README.md").read_text()


def blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_experiment_file_example_loads():
    doc = yaml.safe_load(blocks("yaml")[0])
    exp = experiment_from_dict(doc)
    assert exp.cluster.num_gpus == 1024 and exp.parallel.world_size == 1024


def test_python_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write files (a Chrome trace); keep them out of the tree
    python = blocks("python")
    assert python
    for code in python:
        namespace = {}
        exec(compile(code, "README.md", "exec"), namespace)


def test_faults_example_applies_to_the_example_cluster():
    doc = yaml.safe_load(blocks("yaml")[0])
    doc["faults"] = yaml.safe_load(blocks("yaml")[1])["faults"]
    exp = experiment_from_dict(doc)
    # the straggler's 1.3 times its own draw of the variability entry (exp(spread z), z one normal per GPU)
    z = np.random.default_rng(0).standard_normal(exp.cluster.num_gpus)
    slowdown = exp.slowdown()
    assert len(exp.faults) == 7 and len(slowdown) == exp.cluster.num_gpus
    assert slowdown[5] == pytest.approx(1.3 * np.exp(0.015 * z[5]), rel=1e-12)
    assert slowdown[6] == pytest.approx(np.exp(0.015 * z[6]), rel=1e-12)
    assert exp.cluster.graph.number_of_nodes() == exp.healthy_cluster.graph.number_of_nodes() - 2  # switch, NIC
