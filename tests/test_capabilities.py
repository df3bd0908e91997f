"""Capabilities derived from the model's templates and GGUF header (as Ollama derives them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ollamatrio.api.models import capabilities
from ollamatrio.gguf import read_gguf
from ollamatrio.store import Manifest, Model, ModelName

LLAMA32_TOOLS = (
    "{{- if .Tools }}Available tools: {{ json .Tools }}{{ end }}"
    "{{- range .Messages }}{{ .Content }}{{ end }}"
)


def model(path: Path, template: str | None = None) -> Model:
    return Model(
        name=ModelName.parse("m"),
        digest="0" * 64,
        manifest=Manifest.parse(b'{"schemaVersion":2,"layers":[]}'),
        config={},
        model_path=path,
        template=template,
    )


@pytest.mark.parametrize(
    ("go_template", "gguf_template", "expected"),
    [
        (None, None, ["completion"]),
        (LLAMA32_TOOLS, None, ["completion", "tools"]),  # Ollama matches .Tools without case
        ("{{ .Prompt }}", "{% if tools %}{{ tools }}{% endif %}", ["completion", "tools"]),
        ("{{ .Prompt }}{{ .Suffix }}", None, ["completion", "insert"]),
        (None, "{% if enable_thinking %}<think>{% endif %}", ["completion", "thinking"]),
    ],
    ids=["plain", "go-tools", "jinja-tools", "suffix", "thinking"],
)
def test_capabilities_from_templates(tiny_gguf, go_template, gguf_template, expected):
    path = tiny_gguf(chat_template=gguf_template)
    assert capabilities(model(path, go_template), read_gguf(path)) == expected


def test_embedding_models_do_not_complete(tiny_gguf):
    path = tiny_gguf(pooling="mean", chat_template=None)
    assert capabilities(model(path), read_gguf(path)) == ["embedding"]
