"""Human-readable sizes, counts, times and tables, worded exactly like Ollama's CLI.

These mirror Ollama's ``format`` package (``HumanBytes``, ``HumanNumber``, ``HumanTime``),
Go's ``time.Duration.String`` and the ``tablewriter`` layout ``ollama list`` uses.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime

_KB, _MB, _GB, _TB = 1000, 1000**2, 1000**3, 1000**4


def human_bytes(n: int) -> str:
    """Ollama's ``HumanBytes``: decimal units, whole numbers from 10 up (``98 MB``)."""
    for name, size in (("TB", _TB), ("GB", _GB), ("MB", _MB), ("KB", _KB)):
        if n >= size:
            value, unit = n / size, name
            break
    else:
        return f"{n} B"
    if value >= 10 or value == math.trunc(value):
        return f"{int(value)} {unit}"
    return f"{value:.1f} {unit}"


def human_number(n: int) -> str:
    """Ollama's ``HumanNumber``: parameter counts such as ``135M``, ``1.24B``."""
    if n >= 1_000_000_000:
        value = n / 1_000_000_000
        return f"{value:.0f}B" if value == math.floor(value) else f"{value:.1f}B"
    if n >= 1_000_000:
        value = n / 1_000_000
        return f"{value:.0f}M" if value == math.floor(value) else f"{value:.2f}M"
    if n >= 1000:
        return f"{n / 1000:.0f}K"
    return str(n)


def _go_round(x: float) -> int:
    """Go's ``math.Round`` for non-negative values (half away from zero)."""
    return math.floor(x + 0.5)


def human_duration(seconds: float) -> str:
    """Ollama's ``humanDuration``: ``About a minute``, ``4 minutes``, ``3 days``..."""
    whole = int(seconds)
    if whole < 1:
        return "Less than a second"
    if whole == 1:
        return "1 second"
    if whole < 60:
        return f"{whole} seconds"
    minutes = int(seconds / 60)
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = _go_round(seconds / 3600)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{hours // 24 // 365} years"


_FRACTION_RE = re.compile(r"(\.\d{1,6})\d*")


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 timestamp from the API (nanoseconds allowed); None when absent or Go's
    zero time (``0001-01-01T00:00:00Z``)."""
    if not text:
        return None
    cleaned = _FRACTION_RE.sub(r"\1", text.strip()).replace("Z", "+00:00")
    try:
        when = datetime.fromisoformat(cleaned)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    if when.year == 1 and when.month == 1 and when.day == 1 and when.hour == 0:
        return None
    return when


def human_time(when: datetime | None, zero: str, now: datetime | None = None) -> str:
    """Ollama's ``HumanTime``: ``2 minutes ago``, ``4 minutes from now``, ``Forever``."""
    if when is None:
        return zero
    now = now or datetime.now(UTC)
    delta = (now - when).total_seconds()
    if int(int(delta / 3600) / 24 / 365) < -20:  # Go: int(delta.Hours())/24/365 < -20
        return "Forever"
    if delta < 0:
        return human_duration(-delta) + " from now"
    return human_duration(delta) + " ago"


def go_duration(ns: int) -> str:
    """Go's ``time.Duration.String`` for integer nanoseconds: ``1.5s``, ``312.5ms``, ``1m0s``."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return f"{sign}{_decimal(u, 3)}µs"
    if u < 1_000_000_000:
        return f"{sign}{_decimal(u, 6)}ms"
    secs, frac = divmod(u, 1_000_000_000)
    hours, rest = divmod(secs, 3600)
    minutes, secs = divmod(rest, 60)
    text = _decimal(secs * 1_000_000_000 + frac, 9) + "s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    if hours:
        text = f"{hours}h{text}"
    return sign + text


def _decimal(value: int, places: int) -> str:
    whole, frac = divmod(value, 10**places)
    digits = f"{frac:0{places}d}".rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


def processor(size: int, size_vram: int) -> str:
    """The PROCESSOR column of ``ollama ps``."""
    if size_vram == 0:
        return "100% CPU"
    if size_vram == size:
        return "100% GPU"
    if size_vram > size or size == 0:
        return "Unknown"
    cpu = _go_round((size - size_vram) / size * 100)
    return f"{cpu}%/{100 - cpu}% CPU/GPU"


def until(expires: datetime | None, now: datetime | None = None) -> str:
    """The UNTIL column of ``ollama ps``: past deadlines read ``Stopping...``."""
    now = now or datetime.now(UTC)
    if expires is not None and now > expires:
        return "Stopping..."
    return human_time(expires, "Never", now)


# --- tables ---------------------------------------------------------------------------

PADDING = "    "


def _wrap(cell: str, width: int) -> list[str]:
    """tablewriter's word wrap: break at spaces once a line would pass ``width``."""
    if len(cell) <= width:
        return [cell]
    lines: list[str] = []
    current = ""
    for word in cell.split(" "):
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    lines.append(current)
    return lines


def render_table(
    rows: Sequence[Sequence[str]],
    header: Sequence[str] | None = None,
    *,
    wrap: int = 30,
) -> str:
    """Left-aligned columns separated by four spaces, no borders (``ollama list`` style);
    cells longer than ``wrap`` are wrapped at spaces; trailing blanks are dropped."""
    table = [list(header)] if header else []
    table += [list(row) for row in rows]
    if not table:
        return ""
    ncols = max(len(row) for row in table)
    wrapped = [[_wrap(row[i] if i < len(row) else "", wrap) for i in range(ncols)] for row in table]
    widths = [
        max((len(line) for row in wrapped for line in row[i]), default=0) for i in range(ncols)
    ]
    out: list[str] = []
    for row in wrapped:
        height = max(len(cell) for cell in row)
        for k in range(height):
            parts = [
                (cell[k] if k < len(cell) else "").ljust(widths[i]) for i, cell in enumerate(row)
            ]
            out.append(PADDING.join(parts).rstrip())
    return "\n".join(out) + "\n"
