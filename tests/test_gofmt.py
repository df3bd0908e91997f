"""Go's ``fmt`` printing of values; every expected text is what Go 1.19 prints for the same
value (``fmt.Sprint``, ``strconv.Quote``)."""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest

from ollamatrio.gofmt import format_float, format_value, quote

FLOAT64 = [
    (3.0, "3"), (1.0, "1"), (0.1, "0.1"), (0.95, "0.95"), (-2.5, "-2.5"),
    (0.1 + 0.2, "0.30000000000000004"),
    # the exponent form starts at 1e+06 (strconv's %g with the shortest precision: 6) ...
    (100000.0, "100000"), (123456.0, "123456"), (999999.0, "999999"), (999999.5, "999999.5"),
    (1e6, "1e+06"), (-1e6, "-1e+06"), (1234567.0, "1.234567e+06"),
    (123456789.0, "1.23456789e+08"), (1e20, "1e+20"), (1e21, "1e+21"), (1e100, "1e+100"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    # ... and below 1e-04
    (0.0001, "0.0001"), (0.00012, "0.00012"), (0.00001, "1e-05"), (-0.00001, "-1e-05"),
    (1e-7, "1e-07"), (1.5e-7, "1.5e-07"), (5e-324, "5e-324"),
    (0.0, "0"), (-0.0, "-0"), (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "text"), FLOAT64, ids=[t for _, t in FLOAT64])
def test_float64_prints_as_go_v(value: float, text: str) -> None:
    assert format_float(value) == text
    assert format_value(value) == text


def _float32(word: int) -> float:
    value: float = struct.unpack("<f", struct.pack("<I", word))[0]
    return value


FLOAT32 = [
    (0.1, "0.1"), (1.1, "1.1"), (0.7, "0.7"), (1.100000023841858, "1.1"), (1e6, "1e+06"),
    (16777216.0, "1.6777216e+07"), (3.4028234663852886e38, "3.4028235e+38"),
    (1e-45, "1e-45"), (1e40, "+Inf"),
    # powers of two, where the float32 below is nearer than the one above
    (2.0**-126, "1.1754944e-38"), (2.0**100, "1.2676506e+30"), (2.0**-100, "7.888609e-31"),
    (_float32(0x4C000000), "3.3554432e+07"), (_float32(0x3F800001), "1.0000001"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "text"), FLOAT32, ids=[t for _, t in FLOAT32])
def test_float32_prints_its_own_shortest_digits(value: float, text: str) -> None:
    assert format_float(value, bits=32) == text


VALUES: list[tuple[Any, str]] = [
    (None, "<nil>"), (True, "true"), (False, "false"), (-(2**63), "-9223372036854775808"),
    ("text", "text"), (b"hi", "[104 105]"), ([], "[]"), ({}, "map[]"),
    (["a", 1, 2.5, None, True, 1e6], "[a 1 2.5 <nil> true 1e+06]"),
    ({"b": 1.0, "a": ["x", "y"], "é": None}, "map[a:[x y] b:1 é:<nil>]"),
    ({10: "x", 2: "y"}, "map[2:y 10:x]"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "text"), VALUES, ids=[t for _, t in VALUES])
def test_values_print_as_go_sprint(value: Any, text: str) -> None:
    assert format_value(value) == text


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ('say "hi"\n', '"say \\"hi\\"\\n"'),
        ("tab\there\\", '"tab\\there\\\\"'),
        ("a\x01\x7f", '"a\\x01\\x7f"'),
        ("é\u2028😀", '"é\\u2028😀"'),
        ("\U000e0001", '"\\U000e0001"'),
    ],
)
def test_quote_is_strconv_quote(text: str, quoted: str) -> None:
    assert quote(text) == quoted
