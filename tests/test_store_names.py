"""Model name parsing, validation and display, against Ollama's rules."""

from __future__ import annotations

import pytest

from ollamatrio.errors import InvalidRequestError
from ollamatrio.store import InvalidModelNameError, ModelName, parse_name

LONG80 = "m" * 80


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("llama3.2", ("registry.ollama.ai", "library", "llama3.2", "latest")),
        ("llama3.2:1b", ("registry.ollama.ai", "library", "llama3.2", "1b")),
        ("ns/model", ("registry.ollama.ai", "ns", "model", "latest")),
        ("ns/model:q4_K_M", ("registry.ollama.ai", "ns", "model", "q4_K_M")),
        ("example.com/ns/model:v1", ("example.com", "ns", "model", "v1")),
        ("localhost:5000/ns/model", ("localhost:5000", "ns", "model", "latest")),
        ("localhost:5000/ns/model:t", ("localhost:5000", "ns", "model", "t")),
        ("https://example.com/ns/model:v1", ("example.com", "ns", "model", "v1")),
        ("http://example.com/ns/model", ("example.com", "ns", "model", "latest")),
        (
            "hf.co/bartowski/SmolLM2-135M-GGUF:Q4_K_M",
            ("hf.co", "bartowski", "SmolLM2-135M-GGUF", "Q4_K_M"),
        ),
        ("_under/_score:_t", ("registry.ollama.ai", "_under", "_score", "_t")),
        ("Llama3:Latest", ("registry.ollama.ai", "library", "Llama3", "Latest")),
        ("a.b-c_d", ("registry.ollama.ai", "library", "a.b-c_d", "latest")),
        (LONG80, ("registry.ollama.ai", "library", LONG80, "latest")),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None,
)
def test_parse_valid(text: str, parts: tuple[str, str, str, str]) -> None:
    assert ModelName.parse(text).parts == parts


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param(":tag", id="no-model"),
        pytest.param("model:", id="empty-tag"),
        pytest.param("/model", id="empty-namespace"),
        pytest.param("ns/", id="empty-model"),
        pytest.param("//model", id="empty-host-and-ns"),
        pytest.param("a/b/c/d", id="too-many-parts"),
        pytest.param("../../etc/passwd", id="dotdot-traversal"),
        pytest.param("a/../b", id="dotdot-namespace"),
        pytest.param("..", id="dotdot"),
        pytest.param("model..x", id="double-dot-in-model"),
        pytest.param("model:..", id="dotdot-tag"),
        pytest.param("/etc/passwd", id="absolute"),
        pytest.param("/etc/pass/wd", id="absolute-three"),
        pytest.param("%2e%2e/model", id="percent-encoded"),
        pytest.param("ns\\model", id="backslash"),
        pytest.param("..\\..\\windows", id="backslash-traversal"),
        pytest.param("model\x00x", id="nul"),
        pytest.param("model\n", id="trailing-newline"),
        pytest.param(" model", id="leading-space"),
        pytest.param("mo del", id="space"),
        pytest.param(".hidden", id="leading-dot"),
        pytest.param("-dash", id="leading-dash"),
        pytest.param("ns.dot/model", id="dot-in-namespace"),
        pytest.param("model:ta:g", id="colon-in-tag"),
        pytest.param("modèle", id="non-ascii"),
        pytest.param("m" * 81, id="model-too-long"),
        pytest.param("model:" + "t" * 81, id="tag-too-long"),
        pytest.param("n" * 81 + "/model", id="namespace-too-long"),
        pytest.param("h" * 351 + "/ns/model", id="host-too-long"),
        pytest.param("ho st/ns/model", id="space-in-host"),
        pytest.param("model@sha256:abc", id="at-sign"),
        pytest.param("model+Q4_0", id="plus-build"),
        pytest.param("http://model", id="scheme-without-host"),
    ],
)
def test_parse_invalid(text: str) -> None:
    with pytest.raises(InvalidModelNameError) as info:
        ModelName.parse(text)
    assert str(info.value) == "invalid model name"  # Ollama's exact text
    assert isinstance(info.value, InvalidRequestError)


@pytest.mark.parametrize(
    ("text", "shortest"),
    [
        ("llama3.2", "llama3.2:latest"),
        ("registry.ollama.ai/library/llama3.2:1b", "llama3.2:1b"),
        ("REGISTRY.ollama.ai/Library/x", "x:latest"),
        ("ns/model", "ns/model:latest"),
        ("registry.ollama.ai/ns/model:t", "ns/model:t"),
        ("example.com/library/model:t", "example.com/library/model:t"),
        ("hf.co/org/m:Q4_K_M", "hf.co/org/m:Q4_K_M"),
    ],
)
def test_display_shortest(text: str, shortest: str) -> None:
    assert ModelName.parse(text).display_shortest == shortest


def test_str_is_fully_qualified() -> None:
    assert str(ModelName.parse("smollm2")) == "registry.ollama.ai/library/smollm2:latest"


def test_names_compare_case_insensitively_but_keep_case() -> None:
    a, b = ModelName.parse("Llama3:Latest"), ModelName.parse("llama3")
    assert a == b
    assert hash(a) == hash(b)
    assert {a: 1}[b] == 1
    assert a.model == "Llama3"
    assert a.display_shortest == "Llama3:Latest"
    assert a != ModelName.parse("llama3:other")


@pytest.mark.parametrize(
    ("parts", "valid"),
    [
        (("registry.ollama.ai", "library", "m", "latest"), True),
        (("h", "ns", "m"), False),
        (("registry.ollama.ai", "..", "m", "latest"), False),
        (("registry.ollama.ai", "library", ".tmp-x", "latest"), False),
        (("registry.ollama.ai", "library", "m", ".tmp-latest"), False),
    ],
)
def test_from_parts(parts: tuple[str, ...], valid: bool) -> None:
    assert (ModelName.from_parts(parts) is not None) is valid


def test_direct_construction_is_validated() -> None:
    with pytest.raises(InvalidModelNameError):
        ModelName("registry.ollama.ai", "library", "../x", "latest")


def test_parse_name_passes_model_names_through() -> None:
    name = ModelName.parse("x")
    assert parse_name(name) is name
    assert parse_name("x") == name
