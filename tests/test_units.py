"""Unit strings: hand-checkable conversions and the error messages."""

import math

import pytest

from perfmodel.core.errors import InvalidInputError
from perfmodel.core.units import (
    format_bytes,
    format_rate,
    format_seconds,
    parse_bandwidth,
    parse_bytes,
    parse_duration,
    parse_flops,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * 2**30),
        ("141GB", 141e9),
        ("40 GB", 40e9),
        ("1.5TiB", 1.5 * 2**40),
        ("512MiB", 512 * 2**20),
        ("1024", 1024.0),
        ("1kB", 1000.0),
        ("1KiB", 1024.0),
        ("64B", 64.0),
        ("2.5e3 MB", 2.5e9),
        (" 16GiB ", 16 * 2**30),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


def test_plain_numbers_come_back_as_float():
    assert parse_bytes(1024) == 1024.0
    assert isinstance(parse_bytes(1024), float)
    assert parse_bandwidth(50e9) == 50e9
    assert parse_flops(312e12) == 312e12
    assert parse_duration(0) == 0.0


def test_decimal_and_binary_prefixes_differ():
    # 80 GiB is 85.9 GB: the 7% that catalogs often get wrong
    assert parse_bytes("80GiB") / parse_bytes("80GB") == pytest.approx(1.073741824)


@pytest.mark.parametrize(
    ("parse", "text", "expected"),
    [
        (parse_bandwidth, "400Gb/s", 50e9),  # bits: 400e9 / 8
        (parse_bandwidth, "900GB/s", 900e9),
        (parse_bandwidth, "4.8TB/s", 4.8e12),
        (parse_bandwidth, "25 GB/s", 25e9),
        (parse_bandwidth, "200Gbps", 25e9),
        (parse_bandwidth, "100 Gbit/s", 12.5e9),
        (parse_bandwidth, "1GiB/s", 2.0**30),
        (parse_bandwidth, "10GBps", 10e9),
        (parse_bandwidth, "1e9", 1e9),
        (parse_flops, "989TFLOPS", 989e12),
        (parse_flops, "989.4 TFLOP/s", 989.4e12),
        (parse_flops, "1.98PFLOPS", 1.98e15),
        (parse_flops, "19.5e12", 19.5e12),
        (parse_flops, "312 tflops", 312e12),
        (parse_flops, "8.1 TFlops", 8.1e12),
        (parse_flops, "500GFLOPS", 500e9),
        (parse_duration, "5us", 5e-6),
        (parse_duration, "2.5 \u00b5s", 2.5e-6),  # micro sign
        (parse_duration, "2.5 \u03bcs", 2.5e-6),  # greek mu
        (parse_duration, "250ns", 250e-9),
        (parse_duration, "1ms", 1e-3),
        (parse_duration, "3s", 3.0),
        (parse_duration, "1h", 3600.0),
        (parse_duration, "30min", 1800.0),
        (parse_duration, "0.5", 0.5),
    ],
)
def test_parse_rates_and_durations(parse, text, expected):
    assert parse(text) == pytest.approx(expected, rel=1e-15)


def test_microseconds_are_exact():
    assert parse_duration("5us") == 5e-6


def test_size_error_names_field_and_value():
    with pytest.raises(InvalidInputError) as err:
        parse_bytes("eighty", field="memory")
    assert str(err.value) == "'memory' must be a size like '80GiB' or '141GB': got 'eighty'"


def test_size_in_bits_is_refused_with_a_hint():
    with pytest.raises(InvalidInputError, match=r"got '16Gb' \(b is a bit; write B for bytes\)"):
        parse_bytes("16Gb", field="memory")


def test_bandwidth_error():
    with pytest.raises(InvalidInputError) as err:
        parse_bandwidth("5GB", field="nic")
    assert str(err.value) == "'nic' must be a bandwidth like '400Gb/s' or '900GB/s': got '5GB'"


def test_flops_error():
    with pytest.raises(InvalidInputError) as err:
        parse_flops("1TB")
    assert str(err.value) == "'flops' must be a rate like '989TFLOPS' or '19.5e12': got '1TB'"


def test_duration_error_lists_units():
    with pytest.raises(InvalidInputError) as err:
        parse_duration("7 fortnights", field="latency")
    assert str(err.value).startswith(
        "'latency' must be a duration like '5us' or '1.5ms': got '7 fortnights' (units: ns, us,"
    )


@pytest.mark.parametrize(
    "bad", [-1, "-5GB", "1e400GB", math.nan, math.inf, True, None, [80], "GB", "", "1G"]
)
def test_garbage_sizes_raise(bad):
    with pytest.raises(InvalidInputError, match="'size' must be a size"):
        parse_bytes(bad)


def test_format_bytes():
    assert format_bytes(150109880320) == "139.8 GiB"
    assert format_bytes(150109880320, binary=False) == "150.1 GB"
    assert format_bytes(80 * 2**30) == "80 GiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(0) == "0 B"


def test_format_seconds():
    assert format_seconds(0.01234) == "12.34 ms"
    assert format_seconds(5e-6) == "5 us"
    assert format_seconds(250e-9) == "250 ns"
    assert format_seconds(2.0) == "2 s"
    assert format_seconds(90) == "1.5 min"
    assert format_seconds(5400) == "1.5 h"
    assert format_seconds(0) == "0 s"


def test_format_rate():
    assert format_rate(989.4e12, "FLOP/s") == "989.4 TFLOP/s"
    assert format_rate(50e9, "B/s") == "50 GB/s"
    assert format_rate(1.9789e15, "FLOP/s") == "1.979 PFLOP/s"
    assert format_rate(12, "tokens/s") == "12 tokens/s"


def test_format_round_trips_through_parse():
    assert parse_bytes(format_bytes(80 * 2**30).replace(" ", "")) == 80 * 2**30
    assert parse_bandwidth(format_rate(50e9, "B/s")) == 50e9
    assert parse_flops(format_rate(989.4e12, "FLOP/s")) == pytest.approx(989.4e12)
    assert parse_duration(format_seconds(5e-6)) == 5e-6


def test_parsed_values_are_the_nearest_floats():
    # exact decimal scaling: no 66.90000000000001e12 from 66.9 * 1e12
    assert parse_flops("66.9TFLOPS") == 66.9e12
    assert parse_flops("989.4 TFLOP/s") == 989.4e12
    assert parse_bandwidth("15.754GB/s") == 15.754e9
