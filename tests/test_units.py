"""Unit parsing and formatting: the spellings people write, and the errors they get."""

import math

import pytest

from topologies import (
    TopologyError,
    format_bandwidth,
    format_bytes,
    format_time,
    parse_bandwidth,
    parse_bytes,
    parse_time,
)


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("1GiB", 2**30),
        ("512MiB", 512 * 2**20),
        ("1MB", 1e6),
        ("4KB", 4e3),
        ("4kB", 4e3),
        ("1.5 GB", 1.5e9),
        ("2TiB", 2 * 2**40),
        ("100B", 100),
        (1024, 1024),
        (0.5, 0.5),
        ("1e6", 1e6),
        (0, 0),
    ],
)
def test_parse_bytes(text, nbytes):
    assert parse_bytes(text) == pytest.approx(nbytes)


@pytest.mark.parametrize(
    ("text", "bandwidth_Bps"),
    [
        ("400Gbps", 400e9 / 8),
        ("200Gb/s", 200e9 / 8),
        ("1.6Tbps", 1.6e12 / 8),
        ("50GB/s", 50e9),
        ("450 GB/s", 450e9),
        ("900GBps", 900e9),
        ("1GiB/s", 2**30),
        ("100Mbps", 100e6 / 8),
        (5e10, 5e10),
        ("5e10", 5e10),
    ],
)
def test_parse_bandwidth(text, bandwidth_Bps):
    assert parse_bandwidth(text, "x") == pytest.approx(bandwidth_Bps)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2us", 2e-6), ("2µs", 2e-6), ("1.5ms", 1.5e-3), ("500ns", 500e-9), ("1s", 1.0), ("1 s", 1.0),
     (0.00025, 0.00025), (0, 0.0), ("0", 0.0)],
)
def test_parse_time(text, seconds):
    assert parse_time(text, "x") == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("parse", "bad"),
    [
        (parse_bandwidth, "-400Gbps"),
        (parse_bandwidth, 0),
        (parse_bandwidth, "0GB/s"),
        (parse_bandwidth, "1GB"),  # a size, not a bandwidth
        (parse_bandwidth, "fast"),
        (parse_bandwidth, None),
        (parse_bandwidth, True),
        (parse_bandwidth, float("inf")),
        (parse_bandwidth, float("nan")),
        (parse_bandwidth, "400 Gbit"),
        (parse_bytes, "-1GiB"),
        (parse_bytes, "1Gb"),  # bits are not a size
        (parse_bytes, "1GB/s"),
        (parse_bytes, "lots"),
        (parse_bytes, [1]),
        (parse_time, "-2us"),
        (parse_time, "2 fortnights"),
        (parse_time, "1GB"),
        (parse_time, float("nan")),
    ],
)
def test_invalid_values_name_field_and_value(parse, bad):
    with pytest.raises(TopologyError) as err:
        parse(bad, "cluster.some_field")
    msg = str(err.value)
    assert msg.startswith("cluster.some_field: ")
    assert repr(bad) in msg
    assert "e.g." in msg
    assert "\n" not in msg


def test_error_message_example():
    with pytest.raises(TopologyError, match=r"^cluster\.nic_bandwidth: '-400Gbps' is not a positive bandwidth "
                                            r"\(e\.g\. 400Gbps, 50GB/s\)$"):
        parse_bandwidth("-400Gbps", "cluster.nic_bandwidth")


def test_zero_can_be_refused():
    with pytest.raises(TopologyError, match="positive"):
        parse_bytes(0, "n", allow_zero=False)
    with pytest.raises(TopologyError, match="positive"):
        parse_time("0us", "t", allow_zero=False)


@pytest.mark.parametrize(
    ("fmt", "value", "text"),
    [
        (format_bytes, 0, "0 B"),
        (format_bytes, 512, "512 B"),
        (format_bytes, 3 * 2**29, "1.5 GiB"),
        (format_bytes, 80e9, "74.5 GiB"),
        (format_bandwidth, 50e9, "50 GB/s"),
        (format_bandwidth, 999.7e9, "1 TB/s"),  # rounding carries into the next unit
        (format_bandwidth, 1.6e12, "1.6 TB/s"),
        (format_time, 0, "0 s"),
        (format_time, 2.5e-6, "2.5 us"),
        (format_time, 1.5e-3, "1.5 ms"),
        (format_time, 500e-9, "500 ns"),
        (format_time, 12.3, "12.3 s"),
    ],
)
def test_format(fmt, value, text):
    assert fmt(value) == text


@pytest.mark.parametrize("x", [1.0, 3.14159e3, 7.77e7, 2.5e9, 1.23e12, 999.9e6])
def test_format_parse_round_trip(x):
    assert parse_bytes(format_bytes(x)) == pytest.approx(x, rel=5e-3)
    assert parse_bandwidth(format_bandwidth(x)) == pytest.approx(x, rel=5e-3)
    t = x * 1e-12
    assert math.isclose(parse_time(format_time(t)), t, rel_tol=5e-3)
