"""Regression tests for defects found hunting the Chakra import/export (hunt 27)."""

from __future__ import annotations

import pytest

from workloads.chakra import ChakraError, read_chakra

pytest.importorskip("google.protobuf")

from test_chakra import RECV, SEND, node, one_line, p2p, write_trace  # noqa: E402


def _send(dst, tag):
    return node(0, SEND, "s", comm_src=("int32", 0), comm_dst=dst, comm_size=("int64", 10), comm_tag=tag)


@pytest.mark.parametrize("program0, program1, words", [
    # a send to rank 1.5 is no send to rank 1 (it was truncated to 1 and matched rank 1's receive)
    ([_send(("double", 1.5), ("int32", 0))], [p2p(0, False, 0, 1, 10)], ["comm_dst", "1.5"]),
    # a tag of 1.5 is not tag 1 (it was truncated and matched the receive of tag 1)
    ([_send(("int32", 1), ("double", 1.5))], [p2p(0, False, 0, 1, 10, tag=1)], ["comm_tag", "1.5"]),
    # a receive from rank 0.75 is no receive from rank 0
    ([p2p(0, True, 0, 1, 10)],
     [node(0, RECV, "r", comm_src=("double", 0.75), comm_dst=("int32", 1), comm_size=("int64", 10))],
     ["comm_src", "0.75"]),
], ids=["fractional-comm_dst", "fractional-comm_tag", "fractional-comm_src"])
def test_fractional_ranks_and_tags_are_refused_not_truncated(tmp_path, program0, program1, words):
    write_trace(tmp_path, [program0, program1])
    with pytest.raises(ChakraError) as exc:
        read_chakra(tmp_path)
    msg = one_line(exc)
    assert all(w in msg for w in words), msg


def test_whole_numbers_of_another_attribute_type_still_read(tmp_path):
    """ASTRA-sim writes int32; a tool that writes the rank as a double of a whole number still reads."""
    write_trace(tmp_path, [[_send(("double", 1.0), ("uint64", 3))], [p2p(0, False, 0, 1, 10, tag=3)]])
    g = read_chakra(tmp_path)
    send = g.ops[0] if g.ops[0].kind == "send" else g.ops[1]
    assert send.kind == "send" and (send.peer, send.tag) == (1, 3)
