"""Go's ``fmt`` printing of values, for the text Ollama writes with it.

:func:`format_value` is ``fmt.Sprint`` (the ``%v`` verb) of the values that reach Go's
printer from JSON and templates: nil, booleans, integers, floats, strings, slices and maps.
:func:`quote` is ``strconv.Quote``, which ``%q`` and ``%#v`` use for strings.

A float prints as ``strconv.FormatFloat(f, 'g', -1, bits)``: the shortest digits that read
back as the same float, in exponent form when the decimal exponent is below -4 or at least
6.  That is strconv's ``%g`` rule with the precision taken as 6 when it is "shortest"
(``strconv/ftoa.go``), so ``1e6`` prints as ``1e+06`` and ``123456.0`` as ``123456``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

# strconv/ftoa.go: "if precision was the shortest possible, use precision 6 for this decision"
_SHORTEST_EXPONENT_LIMIT = 6
_FLOAT32_DIGITS = 9  # enough for any float32 to read back

_ESCAPES = {
    "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
    "\v": "\\v", "\\": "\\\\", '"': '\\"',
}  # fmt: skip


def format_value(value: Any) -> str:
    """``fmt.Sprint(value)``: nil as ``<nil>``, slices as ``[a b]``, maps as ``map[k:v]``
    with the keys sorted, as Go's printer sorts them."""
    if value is None:
        return "<nil>"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_float(value)
    if isinstance(value, Mapping):
        pairs = (f"{format_value(k)}:{format_value(value[k])}" for k in sorted(value))
        return "map[" + " ".join(pairs) + "]"
    if isinstance(value, bytes | bytearray):  # a []byte prints its numbers
        return "[" + " ".join(map(str, value)) + "]"
    if isinstance(value, list | tuple):
        return "[" + " ".join(format_value(v) for v in value) + "]"
    return str(value)


def format_float(value: float, bits: int = 64) -> str:
    """``%v`` of a float64, or with ``bits=32`` of the float32 nearest ``value``."""
    if bits == 32:
        value = _to_float32(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    digits, point = _shortest32(abs(value)) if bits == 32 else _shortest64(abs(value))
    sign = "-" if value < 0 else ""
    exp = point - 1
    if exp < -4 or exp >= _SHORTEST_EXPONENT_LIMIT:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def quote(text: str) -> str:
    """``strconv.Quote``: printable Unicode kept, the rest escaped."""
    out = ['"']
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif (code := ord(ch)) < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _to_float32(value: float) -> float:
    """Go's ``float32(value)``: round to nearest even, infinite beyond the range."""
    try:
        single: float = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)
    return single


def _shortest64(value: float) -> tuple[str, int]:
    """The shortest digits that read back as the positive float64 ``value``, and where the
    decimal point goes (``value == 0.digits * 10**point``); Python's ``repr`` finds them."""
    _, digit_tuple, exponent = Decimal(repr(value)).as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    return digits.rstrip("0"), len(digits) + exponent


def _shortest32(value: float) -> tuple[str, int]:
    """:func:`_shortest64` for the positive float32 ``value``, as strconv's
    ``roundShortest`` picks them: the fewest digits inside the interval that rounds to the
    float32, the closest such number when two fit (the even one on a tie)."""
    word: int = struct.unpack("<I", struct.pack("<f", value))[0]
    biased, fraction = word >> 23, word & 0x7FFFFF
    mantissa, exp2 = (fraction | 1 << 23, biased - 150) if biased else (fraction, -149)
    ulp = Fraction(2) ** exp2
    exact = mantissa * ulp
    upper = exact + ulp / 2
    # Below a power of two the next float32 down is half as far away.
    lower = exact - (ulp / 4 if fraction == 0 and biased > 1 else ulp / 2)
    inclusive = mantissa % 2 == 0  # round-half-even reads a boundary back as this float

    def reads_back(candidate: Fraction) -> bool:
        if inclusive:
            return lower <= candidate <= upper
        return lower < candidate < upper

    top = Decimal(value).adjusted()  # 10**top <= value < 10**(top + 1)
    for count in range(1, _FLOAT32_DIGITS + 1):
        scale = Fraction(10) ** (top - count + 1)
        down = math.floor(exact / scale)
        for n in sorted((down, down + 1), key=lambda n: (abs(n * scale - exact), n % 2)):
            if reads_back(n * scale):
                text = str(n)
                return text.rstrip("0"), len(text) + top - count + 1
    raise AssertionError(f"no {_FLOAT32_DIGITS}-digit decimal reads back as {value!r}")
