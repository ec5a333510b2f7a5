"""The op builders' and the rank layout's fast paths: every field lands where its name says, bad input is still
refused naming the field, and groups agree with their definition from coordinates."""

import itertools

import pytest

from workloads.errors import ConfigError
from workloads.ops import Collective, Compute, Kernel, OpGraph, OpGraphError, Recv, Send
from workloads.parallel import ParallelConfig, RankLayout


def test_every_builder_puts_each_argument_in_its_field():
    g = OpGraph(4)
    a = g.compute(1, 3.0, 5.0, name="c", stream="s", category="attention", shape=(1, 2, 3), duration_s=None,
                  traffic_class="tc", layer=7, micro_batch=8, stage=9)
    b = g.collective_op(2, "all_to_all", (0, 2), 0, name="x", deps=[a], stream="ep", algorithm="ring", count=3,
                        split=(1, 2.5), traffic_class="ep", layer=4, micro_batch=5, stage=6)
    s = g.send(0, 3, 11, name="snd", deps=[a, b], stream="pp", traffic_class="pp", layer=1, micro_batch=2,
               stage=3, tag=1)
    r = g.recv(3, 0, 11, name="rcv", stream="pp_r", micro_batch=2, tag=1)
    ops = g.ops
    assert [op.id for op in ops] == [a, b, s, r] == [0, 1, 2, 3]
    assert isinstance(ops[0], Compute) and isinstance(ops[1], Collective)
    assert isinstance(ops[2], Send) and isinstance(ops[3], Recv)
    c = ops[0]
    assert (c.rank, c.stream, c.deps, c.name, c.traffic_class, c.layer, c.micro_batch, c.stage) == \
        (1, "s", (), "c", "tc", 7, 8, 9)
    assert (c.flops, c.nbytes, c.category, c.shape, c.duration_s, c.parts) == (3.0, 5.0, "attention", (1, 2, 3),
                                                                             None, None)
    x = ops[1]
    assert (x.rank, x.stream, x.deps, x.name, x.traffic_class, x.layer, x.micro_batch, x.stage) == \
        (2, "ep", (0,), "x", "ep", 4, 5, 6)
    assert (x.collective, x.group, x.algorithm, x.count) == ("all_to_all", (0, 2), "ring", 3)
    assert x.split == (1.0, 2.5) and x.nbytes == 3.5  # an alltoallv's size is the sum of its row
    snd, rcv = ops[2], ops[3]
    assert (snd.rank, snd.peer, snd.nbytes, snd.tag, snd.deps, snd.name, snd.stream) == \
        (0, 3, 11.0, 1, (0, 1), "snd", "pp")
    assert (snd.traffic_class, snd.layer, snd.micro_batch, snd.stage) == ("pp", 1, 2, 3)
    assert (rcv.rank, rcv.peer, rcv.tag, rcv.micro_batch, rcv.layer, rcv.stage) == (3, 0, 1, 2, -1, -1)
    # kernels' totals are the op's FLOPs and bytes
    k = (Kernel("gemm", 1.0, 2.0), Kernel("elementwise", 0.0, 4.0))
    assert (g.ops[g.compute(0, parts=k)].flops, g.ops[g.compute(0, parts=k)].nbytes) == (1.0, 6.0)


def test_bad_ranks_and_rows_are_refused_naming_the_field():
    g = OpGraph(4)
    with pytest.raises(OpGraphError, match="rank: 4 is outside 0..3"):
        g.compute(4)
    with pytest.raises(OpGraphError, match="rank: -1 is outside"):
        g.collective_op(-1, "all_reduce", (0, 1), 1)
    row = (1.0, -2.0)
    with pytest.raises(OpGraphError, match="split"):
        g.collective_op(0, "all_to_all", (0, 1), 0, split=row)
    good = (1.0, 2.0)
    g.collective_op(0, "all_to_all", (0, 1), 0, split=good)
    with pytest.raises(OpGraphError, match="split: need 3"):  # a row checked before, on a group of another size
        g.collective_op(0, "all_to_all", (0, 1, 2), 0, split=good)
    with pytest.raises(OpGraphError, match="group: rank 3"):
        g.collective_op(3, "all_reduce", (0, 1), 1)


@pytest.mark.parametrize("placement", [("tp", "cp", "dp", "pp"), ("dp", "tp", "pp"), ("pp", "cp", "dp", "tp")])
def test_layout_groups_follow_the_coordinates(placement):
    lay = RankLayout(ParallelConfig(tp=2, cp=2, dp=3, pp=2, placement=placement))
    sizes = {"tp": 2, "cp": 2, "dp": 3, "pp": 2}
    coords = {r: lay.coords(r) for r in range(24)}
    assert len(set(coords.values())) == 24  # a bijection
    for r, c in coords.items():
        assert lay.rank(tp=c.tp, dp=c.dp, pp=c.pp, cp=c.cp) == r
        for dim in sizes:
            group = getattr(lay, f"{dim}_group")(r)
            # by index along dim, every other coordinate the rank's
            want = [x for i in range(sizes[dim]) for x, cx in coords.items()
                    if getattr(cx, dim) == i and all(getattr(cx, d) == getattr(c, d) for d in sizes if d != dim)]
            assert list(group) == want


def test_out_of_range_coordinates_name_the_dimension():
    lay = RankLayout(ParallelConfig(tp=2, dp=2, pp=2))
    for dim, value in itertools.product(("tp", "dp", "pp", "cp"), (-1, 2)):
        if dim == "cp" and value == 2:
            value = 1  # cp = 1: index 1 is already outside
        with pytest.raises(ConfigError, match=f"{dim}: {value} is outside"):
            lay.rank(**{dim: value})
    with pytest.raises(ConfigError, match="rank: 8"):
        lay.coords(8)


@pytest.mark.parametrize("build, field", [
    (lambda g: g.collective_op(0, "all_to_all", (0, 1), 0, split=("a", 1.0)), "split"),
    (lambda g: g.collective_op(0, "all_to_all", (0, 1), 0, split=5), "split"),
    (lambda g: g.collective_op(0, "all_to_all", (0, 1), 0, split=(float("nan"), 1.0)), "split"),
    (lambda g: g.collective_op(0, "all_to_all", (0, 1), 0, split=(float("inf"), 1.0)), "split"),
    (lambda g: g.collective_op(0, "all_reduce", (0, "x"), 8), "group"),
    (lambda g: g.collective_op(0, "all_reduce", 3, 8), "group"),
    (lambda g: g.compute(0, parts=(Kernel("gemm", -1.0, 0.0),)), "parts"),
    (lambda g: g.compute(0, parts=(Kernel("gemm", float("nan"), 0.0),)), "parts"),
])
def test_malformed_splits_groups_and_kernels_get_one_line_errors(build, field):
    # Found in review: these raised a TypeError or ValueError traceback, or were taken silently (a NaN size
    # made the collective's bytes NaN; a kernel of -1 FLOPs was recorded as such).
    with pytest.raises(OpGraphError, match=field) as info:
        build(OpGraph(4))
    assert "\n" not in str(info.value)
