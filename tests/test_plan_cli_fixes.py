"""``clustersim plan`` fixes: a port speed no switch has is refused (not rounded), ``PRESET:NODES`` is accepted as
``run --cluster`` takes it, a custom fabric cabled ToR to ToR reports its oversubscription, and the NVSwitch row
counts a whole NVLink domain (GB200 NVL36x2: two racks, 9 switch trays of 2 chips each)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from simulator.cli import main
from topologies import build_cluster
from topologies.capacity import bill_of_materials, plan_summary
from topologies.cluster import TopologyError
from topologies.components import plan_options

TWO_RACKS = Path(__file__).resolve().parents[1] / "examples" / "fabrics" / "two-racks.yaml"


def one_line(err: str) -> str:
    assert "Traceback" not in err and "internal error" not in err, err
    assert err.startswith("clustersim: error: ") and err.count("\n") == 1, err
    return err


def plan_file(tmp_path: Path, plan: str) -> str:
    f = tmp_path / "p.yaml"
    f.write_text(f"cluster: {{preset: dgx-h100, nodes: 4, nodes_per_leaf: 2}}\nplan: {plan}\n")
    return str(f)


# ------------------------------------------------------------------------------------------------ port speed
@pytest.mark.parametrize("speed", ["300Gbps", "1Gbps", "7Gbps", "401Gbps", "0.5Tbps", "1600Gbps", "1Mbps"])
def test_a_port_speed_no_switch_has_is_refused_not_rounded(tmp_path, capsys, speed):
    assert main(["plan", plan_file(tmp_path, f"{{port_speed: {speed}}}")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no bill of 400G (or 200G) parts first
    err = one_line(captured.err)
    assert "plan.port_speed" in err and repr(speed) in err, err
    assert "200Gbps, 400Gbps, 800Gbps" in err and "auto" in err, err


@pytest.mark.parametrize("family", ["infiniband", "ethernet"])
def test_a_port_speed_is_checked_against_the_named_family(family):
    with pytest.raises(TopologyError, match=rf"^plan\.port_speed: '300Gbps' .*{family}.*valid: 200Gbps"):
        plan_options({"port_speed": "300Gbps", "family": family})


@pytest.mark.parametrize("speed, priced", [("200Gbps", 200), ("400Gbps", 400), ("800Gbps", 800),
                                           ("50GB/s", 400), ("0.8Tbps", 800), ("auto", 400), ("Auto", 400)])
def test_catalogued_port_speeds_and_auto_are_priced_as_given(tmp_path, capsys, speed, priced):
    assert main(["plan", plan_file(tmp_path, f"{{port_speed: {speed}}}"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["port_speed_Gbps"] == priced
    switch = next(r for r in doc["bom"] if r["item"] == "leaf switch")
    assert switch["spec"].endswith(f"x{priced}G")


def test_a_catalogued_speed_in_other_units_is_the_same_plan():
    assert plan_options({"port_speed": "50GB/s"}).key() == plan_options({"port_speed": "400Gbps"}).key()


# ------------------------------------------------------------------------------------------------ PRESET:NODES
@pytest.mark.parametrize("flag", [[], ["--json"]])
def test_preset_colon_nodes_is_the_same_plan_as_nodes_option(capsys, flag):
    assert main(["plan", "dgx-h100:4", *flag]) == 0
    colon = capsys.readouterr().out
    assert main(["plan", "dgx-h100", "--nodes", "4", *flag]) == 0
    assert colon == capsys.readouterr().out
    assert "32 H100-SXM" in colon


def test_preset_colon_nodes_matches_the_topology_command(capsys):
    assert main(["topology", "gb200-nvl36x2:2"]) == 0
    name = capsys.readouterr().out.splitlines()[0]
    assert main(["plan", "gb200-nvl36x2:2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"] == name


@pytest.mark.parametrize("argv, words", [
    (["dgx-h100:x"], ["'dgx-h100:x'", "NODES must be an integer"]),
    (["dgx-h10:4"], ["cluster.preset", "dgx-h10"]),
    (["dgx-h100:4", "--nodes", "8"], ["--nodes", "dgx-h100:4", "once"]),
])
def test_preset_colon_nodes_errors_are_one_line(capsys, argv, words):
    assert main(["plan", *argv]) == 2
    err = one_line(capsys.readouterr().err)
    assert "--cluster" not in err, err  # plan takes the cluster as its argument, not as run's --cluster option
    for w in words:
        assert w in err, err


# ------------------------------------------------------------------------------------------------ oversubscription
def test_two_racks_cabled_tor_to_tor_report_the_files_2_to_1(capsys):
    # the file's header: 4 x 400 Gb/s NICs per rack over one 800 Gb/s cable between the racks, 2:1
    c = build_cluster({"topology": str(TWO_RACKS)})
    s = plan_summary(c)
    assert s["oversubscription"] == {"leaf": pytest.approx(2.0)}
    # the same figure from the bisection: non-blocking would be half the NIC rate per GPU
    nic = 400e9 / 8
    assert s["bisection_per_gpu_bytes_s"] == pytest.approx(nic / 2 / s["oversubscription"]["leaf"])
    assert main(["plan", str(TWO_RACKS)]) == 0
    out = capsys.readouterr().out
    assert "oversubscription leaf 2:1" in out and "none (one switch tier)" not in out


@pytest.mark.parametrize("cable, ratio", [("1600Gbps", "1:1"), ("400Gbps", "4:1")])
def test_tor_to_tor_oversubscription_follows_the_cable(tmp_path, capsys, cable, ratio):
    text = TWO_RACKS.read_text()
    text, n = re.subn(r"(a: rack-a, b: rack-b, bandwidth: )800Gbps", rf"\g<1>{cable}", text)
    assert n == 1
    f = tmp_path / "racks.yaml"
    f.write_text(text)
    assert main(["plan", str(f)]) == 0
    assert f"oversubscription leaf {ratio}" in capsys.readouterr().out


def test_one_switch_and_builder_fabrics_are_unchanged(capsys):
    assert main(["plan", "dgx-h100", "--nodes", "2"]) == 0  # one leaf
    assert "oversubscription none (one switch tier)" in capsys.readouterr().out
    c = build_cluster({"preset": "dgx-h100", "nodes": 8, "nodes_per_leaf": 2, "oversubscription": 3})
    assert plan_summary(c)["oversubscription"] == {"leaf": pytest.approx(3.0)}


# ------------------------------------------------------------------------------------------------ NVSwitch chips
def _nvswitch_row(cluster):
    bom = bill_of_materials(cluster)
    rows = bom[bom["item"] == "NVSwitch chip"]
    assert len(rows) == 1
    return rows.iloc[0]


@pytest.mark.parametrize("preset, nodes, per, trays", [("gb200-nvl36x2", 1, 36, 18), ("gb200-nvl36x2", 3, 36, 18),
                                                        ("gb200-nvl72", 2, 18, 9), ("dgx-h100", 4, 4, None)])
def test_nvswitch_row_counts_a_whole_nvlink_domain(preset, nodes, per, trays):
    # NVL36x2: NVIDIA's reference has 9 NVL36 NVLink switch trays in each of its two racks (half of every switch's
    # ports go to the other rack); NVL72: 9 trays of 2 chips in one rack; DGX H100: 4 chips per server.
    row = _nvswitch_row(build_cluster({"preset": preset, "nodes": nodes}))
    label = f"{per} per NVLink domain" + (f" ({trays} trays)" if trays else "")
    assert row["spec"] == label
    assert row["count"] == per * nodes


def test_printed_nvswitch_line_agrees_with_its_count_and_the_gpu_row(capsys):
    assert main(["plan", "gb200-nvl36x2", "--nodes", "1"]) == 0
    out = capsys.readouterr().out
    nv = next(line for line in out.splitlines() if line.startswith("NVSwitch chip"))
    gpu = next(line for line in out.splitlines() if line.startswith("GPU "))
    assert "36 per NVLink domain (18 trays)" in nv and "..." not in nv, nv
    assert nv.split()[-5] == "36", nv  # the count column: one domain
    assert "72 per NVLink domain" in gpu and gpu.split()[-5] == "72", gpu


@pytest.mark.parametrize("rate, spec, cards", [
    ("1000Gbps", "800G, 2 per 1000G NIC", 2),  # no model reaches 1 Tb/s: two ConnectX-8 (800 Gb/s) carry it
    ("1600Gbps", "800G, 2 per 1600G NIC", 2),
    ("800Gbps", "800G", 1),
    ("400Gbps", "400G", 1),
])
def test_a_nic_no_model_reaches_says_how_many_cards_stand_for_it(rate, spec, cards):
    # The row read "800G" beside twice as many NICs as GPUs, with nothing saying why (found by a new user)
    cluster = build_cluster({"preset": "dgx-h100", "nodes": 2, "nic_bandwidth": rate})
    nics = [r for r in bill_of_materials(cluster).to_dict("records") if r["item"] == "NIC"]
    assert [(r["spec"], r["count"]) for r in nics] == [(spec, 16 * cards)]
