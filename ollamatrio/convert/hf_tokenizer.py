"""A Hugging Face ``tokenizer.json`` (byte-level BPE) as GGUF tokenizer metadata, the way
Ollama's ``convert/tokenizer.go`` reads it.

- tokens: the model's vocabulary and the added tokens, by id; an added token that is
  ``special`` is a control token, any other added token user-defined; an id no token has,
  and the embedding's rows past the last token, ``[PAD<id>]`` (unused);
- merges: ``"a b"`` strings (tokenizer.json has them as strings or pairs);
- the pre-tokenizer: known by the checksum of its ``Split`` regexes (Ollama's table), or by
  its shape (digits one by one then GPT-2's byte level: SmolLM's; byte level alone: GPT-2's,
  ``gpt-2`` as llama.cpp names it);
- special tokens (``bos``, ``eos``, ``unk``, ``sep``, ``pad``, ``cls``, ``mask``) from
  ``tokenizer_config.json``'s ``<kind>_token`` texts, their ``add_<kind>_token`` flags, and
  ``config.json``'s ``bos_token_id``/``eos_token_id`` where the texts name none;
- the chat template: ``tokenizer_config.json``'s ``chat_template`` (a string, or the entry
  named ``default`` of a list), else ``chat_template.jinja``.

A SentencePiece-style tokenizer (``byte_fallback``, or ``tokenizer.model``) is refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from gguf import GGUFValueType, TokenType

from ..errors import InvalidRequestError
from .gguf_out import MetadataValue

V = GGUFValueType

_PRE_BY_SPLIT_DIGEST = {  # Ollama's convert/tokenizer.go
    "d98f9631be1e9607a9848c26c1f9eac1aa9fc21ac6ba82a2fc0741af9780a48f": "llama-bpe",
    "03df5c5863ad70781dcfdef491ead25140f895fe8010964be0daefe27be32b02": "deepseek-llm",
    "21cde974d587f0d54dc8d56b183cc1e6239600172035c68fbd6d4b9f8da0576e": "deepseek-coder",
    "1ff7f41064896984db5d1bb6ff64fa4bc29007d08c1b439e505b7392777a319e": "qwen2",
    "00431aed57e696b747435f734d1e3b9b1bfd931a121fb5cac7129e97c181e9ba": "qwen35",
    "b92c0824a58e1d8dc3221cf3e12c433c3a86f57e46d57229993489f0798e7702": "laguna",
}
_SPECIAL_KINDS = {  # tokenizer_config kind -> GGUF key word (Ollama's SpecialVocabulary.Key)
    "bos": "bos",
    "eos": "eos",
    "unk": "unknown",
    "sep": "seperator",  # sic: llama.cpp's key
    "pad": "padding",
    "cls": "cls",
    "mask": "mask",
}


def tokenizer_metadata(
    tokenizer: Mapping[str, Any],
    tokenizer_config: Mapping[str, Any],
    config: Mapping[str, Any],
    chat_template_file: str | None,
    vocab_size: int,
) -> dict[str, MetadataValue]:
    """The ``tokenizer.*`` metadata of a GGUF for these files."""
    model = check_tokenizer(tokenizer)
    tokens, types, ids = _vocabulary(model, tokenizer.get("added_tokens") or [], vocab_size)
    md: dict[str, MetadataValue] = {
        "tokenizer.ggml.model": MetadataValue("gpt2", V.STRING),
        "tokenizer.ggml.pre": MetadataValue(_pre(tokenizer.get("pre_tokenizer")), V.STRING),
        "tokenizer.ggml.tokens": MetadataValue(tokens, V.ARRAY, V.STRING),
        "tokenizer.ggml.token_type": MetadataValue(types, V.ARRAY, V.INT32),
    }
    merges = _merges(model.get("merges"))
    if merges:
        md["tokenizer.ggml.merges"] = MetadataValue(merges, V.ARRAY, V.STRING)
    md.update(_special(tokenizer_config, config, ids))
    template = _chat_template(tokenizer_config.get("chat_template")) or chat_template_file
    if template:
        md["tokenizer.chat_template"] = MetadataValue(template, V.STRING)
    return md


def check_tokenizer(tokenizer: Mapping[str, Any]) -> Mapping[str, Any]:
    """``tokenizer.json``'s model, if it is one this module converts; a 400 otherwise."""
    model = tokenizer.get("model")
    if not isinstance(model, Mapping) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, Mapping) else None
        raise InvalidRequestError(f"unsupported tokenizer type {kind!r}: only BPE is converted")
    if model.get("byte_fallback"):
        raise InvalidRequestError(
            "unsupported tokenizer: a SentencePiece-style BPE (byte_fallback) is not converted"
        )
    return model


def _vocabulary(
    model: Mapping[str, Any], added: list[Any], vocab_size: int
) -> tuple[list[str], list[int], dict[str, int]]:
    by_id: dict[int, tuple[str, int]] = {}
    vocab = model.get("vocab")
    if not isinstance(vocab, Mapping):
        raise InvalidRequestError("tokenizer.json has no vocabulary")
    for text, i in vocab.items():
        by_id[int(i)] = (str(text), TokenType.NORMAL)
    for token in added:
        if isinstance(token, Mapping) and isinstance(token.get("id"), int):
            kind = TokenType.CONTROL if token.get("special") else TokenType.USER_DEFINED
            by_id[token["id"]] = (str(token.get("content", "")), kind)
    tokens, types = [], []
    # A token's place in the list is its id: ids nobody uses, and the rows the embeddings
    # have beyond the tokenizer's, are filled as convert_hf_to_gguf.py fills them.
    for i in range(max(vocab_size, max(by_id, default=-1) + 1)):
        text, token_type = by_id.get(i, (f"[PAD{i}]", TokenType.UNUSED))
        tokens.append(text)
        types.append(int(token_type))
    ids = {text: i for i, text in enumerate(tokens)}
    return tokens, types, ids


def _merges(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [m if isinstance(m, str) else " ".join(map(str, m)) for m in value]


def _pre(pre_tokenizer: Any) -> str:
    found: list[Any] = []
    if isinstance(pre_tokenizer, Mapping):
        found = pre_tokenizer.get("pretokenizers") or [pre_tokenizer]
    parts = [p for p in found if isinstance(p, Mapping)]
    digest = hashlib.sha256()
    for part in parts:
        pattern = part.get("pattern")
        if part.get("type") == "Split" and isinstance(pattern, Mapping) and pattern.get("Regex"):
            digest.update(str(pattern["Regex"]).encode())
    if (known := _PRE_BY_SPLIT_DIGEST.get(digest.hexdigest())) is not None:
        return known
    shape = [(p.get("type"), p.get("individual_digits"), p.get("use_regex")) for p in parts]
    if shape == [("Digits", True, None), ("ByteLevel", None, True)]:
        return "smollm"
    if shape == [("ByteLevel", None, True)]:
        return "gpt-2"  # llama.cpp's name for GPT-2's regex
    return "default"


def _special(
    tokenizer_config: Mapping[str, Any], config: Mapping[str, Any], ids: Mapping[str, int]
) -> dict[str, MetadataValue]:
    md: dict[str, MetadataValue] = {}
    for kind, key in _SPECIAL_KINDS.items():
        value = tokenizer_config.get(f"{kind}_token")
        text = value.get("content") if isinstance(value, Mapping) else value
        token_id = ids.get(text) if isinstance(text, str) else None
        from_config = config.get(f"{kind}_token_id")
        if token_id is None and isinstance(from_config, int) and not isinstance(from_config, bool):
            token_id = from_config
        if token_id is not None:
            md[f"tokenizer.ggml.{key}_token_id"] = MetadataValue(token_id, V.UINT32)
        add = tokenizer_config.get(f"add_{kind}_token")
        if isinstance(add, bool):
            md[f"tokenizer.ggml.add_{key}_token"] = MetadataValue(add, V.BOOL)
    return md


def _chat_template(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, Mapping) and entry.get("name") == "default":
                template = entry.get("template")
                return template if isinstance(template, str) else None
    return None
