"""Every behaviour code the repository cites is defined in docs/behaviours.md.

Comments, docstrings and documents name Ollama's behaviours by code (B and a number).  A
code is only useful to a reader who can look it up, so: every code cited in the package,
the documents, the scripts and the tests has an entry in docs/behaviours.md; every file
that cites one names that document; and every entry points at modules (and names in them)
that exist.  Codes of reference texts kept outside the repository (style idioms, I and a
number; "spec §" sections) have no entry, so citing one fails here too.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ollamatrio"
GLOSSARY = ROOT / "docs" / "behaviours.md"
THIS = pathlib.Path(__file__).resolve()
SCANNED = ("ollamatrio", "docs", "scripts", "tests", "README.md")

CODE = re.compile(r"\b[BI]\d{1,2}\b|\bspec §[\d.]+")
ENTRY = re.compile(r"^### (B\d{1,2})$", re.MULTILINE)
# A module an entry names, with the names in it that follow in parentheses.
MODULE = re.compile(r"`([\w/]+\.py)`(?:\s*\(([^)]*)\))?")


def scanned_files() -> Iterator[pathlib.Path]:
    for name in SCANNED:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            parts = path.relative_to(ROOT).parts
            if path.is_file() and not any(p.startswith(".") or p == "__pycache__" for p in parts):
                yield path


def citations() -> dict[pathlib.Path, set[str]]:
    """The codes each file cites (the glossary and this test, whose examples are not
    citations, aside)."""
    cited: dict[pathlib.Path, set[str]] = {}
    for path in scanned_files():
        if path in (GLOSSARY, THIS):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        codes = set(CODE.findall(text))
        if codes:
            cited[path] = codes
    return cited


def entries() -> dict[str, str]:
    """Each defined code with the text of its entry."""
    text = GLOSSARY.read_text(encoding="utf-8")
    heads = list(ENTRY.finditer(text))
    found: dict[str, str] = {}
    for head, following in zip(heads, [*heads[1:], None], strict=True):
        end = following.start() if following else len(text)
        body = text[head.end() : end].split("\n## ", 1)[0]
        assert head.group(1) not in found, f"{head.group(1)} is defined twice"
        found[head.group(1)] = body
    return found


def by_number(code: str) -> int:
    return int(code[1:])


def test_the_scan_finds_the_cited_codes() -> None:
    cited = citations()
    assert "B55" in cited[PACKAGE / "scheduler" / "vram_recovery.py"]
    assert "B55" in cited[ROOT / "docs" / "scheduling.md"]
    assert set(CODE.findall("(B7), I3; spec §2.1 B123 AB1 b2")) == {"B7", "I3", "spec §2.1"}


def test_every_cited_code_is_defined() -> None:
    defined = set(entries())
    missing = {
        f"{path.relative_to(ROOT)}: {', '.join(sorted(codes - defined))}"
        for path, codes in citations().items()
        if codes - defined
    }
    assert not missing, "codes cited but not defined in docs/behaviours.md:\n" + "\n".join(
        sorted(missing)
    )


def test_every_file_that_cites_a_code_names_the_glossary() -> None:
    silent = sorted(
        str(path.relative_to(ROOT))
        for path in citations()
        if "behaviours.md" not in path.read_text(encoding="utf-8")
    )
    assert not silent, f"cite codes without naming docs/behaviours.md: {silent}"


DEFINED: list[str] = sorted(entries(), key=by_number)


@pytest.mark.parametrize("code", DEFINED)
def test_an_entry_says_where_its_behaviour_lives(code: str) -> None:
    body = entries()[code]
    modules = MODULE.findall(body)
    assert modules, f"{code} names no module"
    for module, names in modules:
        path = PACKAGE / module
        assert path.is_file(), f"{code}: no module ollamatrio/{module}"
        source = path.read_text(encoding="utf-8")
        for name in re.findall(r"`([\w.]+)`", names):
            last = name.rsplit(".", 1)[-1]
            assert re.search(rf"\b{re.escape(last)}\b", source), f"{code}: {name} not in {module}"
