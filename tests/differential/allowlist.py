"""The deliberate differences: read from the one reviewed list, the allow-list table of
docs/compat.md (the page people read is the list the suite applies).

A row is ``| `case` `case` | `where` `where` | why |``: shell-style patterns (``fnmatch``),
one or more in backticks per cell; ``where`` as :func:`shapes.differences` names the part
that differs.  A row covers a difference when one of its cases and one of its wheres match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

COMPAT = Path(__file__).resolve().parents[2] / "docs" / "compat.md"
HEADING = "## Allow-list"
_TICKED = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Allowed:
    cases: tuple[str, ...]
    wheres: tuple[str, ...]
    why: str

    def covers(self, case: str, where: str) -> bool:
        return any(fnmatchcase(case, c) for c in self.cases) and any(
            fnmatchcase(where, w) for w in self.wheres
        )


def read_allow_list(text: str) -> list[Allowed]:
    """The rows of the table under HEADING (up to the next heading of that level)."""
    _, found, rest = text.partition(HEADING + "\n")
    if not found:
        raise ValueError(f"{COMPAT.name} has no '{HEADING}' section")
    section = rest.split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or set(line) <= set("|-: ") or cells[0] == "case":
            continue
        cases, wheres = (tuple(_TICKED.findall(cell)) for cell in cells[:2])
        if len(cells) != 3 or not cases or not wheres:
            raise ValueError(f"{COMPAT.name}: an allow-list row not in the form expected: {line}")
        rows.append(Allowed(cases, wheres, cells[2]))
    return rows
