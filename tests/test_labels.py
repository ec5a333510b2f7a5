"""Names in experiment and jobs files: text or a number, never a list, a mapping or a YAML boolean (a name
that reads back as ``['a', 'b']`` in every table is a slip in the file, not a label)."""

import pytest

from simulator.cli import main
from simulator.experiment import experiment_from_dict
from simulator.jobs import jobs_from_dict
from workloads.errors import ConfigError

BASE = {"cluster": {"preset": "dgx-h100", "nodes": 1}, "model": {"preset": "gpt2-small"},
        "parallel": {"tp": 4, "dp": 2}, "training": {"seq_len": 1024}}


@pytest.mark.parametrize("bad", [["a", "b"], {"a": 1}, True])
def test_experiment_name_must_be_text(bad):
    with pytest.raises(ConfigError, match=r"^name: must be text \(a label\), got a (list|dict|bool)"):
        experiment_from_dict({**BASE, "name": bad})


def test_experiment_names_given_as_numbers_read_as_text_and_absent_ones_are_made():
    assert experiment_from_dict({**BASE, "name": 7}).name == "7"
    assert experiment_from_dict({**BASE, "name": "mine"}).name == "mine"
    assert experiment_from_dict(BASE).name.startswith("gpt2-small on ")


def test_job_names_must_be_text():
    job = {"nodes": 1, **{k: BASE[k] for k in ("model", "parallel", "training")}}
    doc = {"cluster": {"preset": "dgx-h100", "nodes": 2}, "jobs": [{**job, "name": ["x"]}, job]}
    with pytest.raises(ConfigError, match=r"^jobs\[0\]\.name: must be text"):
        jobs_from_dict(doc)
    with pytest.raises(ConfigError, match=r"^name: must be text"):
        jobs_from_dict({**doc, "name": {"a": 1}, "jobs": [job, {**job, "name": "b"}]})


def test_cli_refuses_a_list_name_in_one_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [a, b]\ncluster: {preset: dgx-h100, nodes: 1}\nmodel: {preset: gpt2-small}\n"
                    "parallel: {tp: 4, dp: 2}\ntraining: {seq_len: 1024}\n")
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "name: must be text (a label), got a list: ['a', 'b']" in err
