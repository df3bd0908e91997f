"""Minimal tokenizer vocabularies that llama.cpp accepts, for generated test models."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from gguf import TokenType

TokenizerKind = Literal["llama", "gpt2"]

# SentencePiece word-start marker.
_SPM_SPACE = "\u2581"


@dataclass(frozen=True)
class Vocabulary:
    """Token list plus the ids and extras the ``tokenizer.ggml.*`` keys need."""

    model: TokenizerKind
    tokens: list[str]
    token_types: list[int]
    bos: int
    eos: int
    unk: int | None = None
    scores: list[float] | None = None  # SPM only
    merges: list[str] | None = None  # BPE only
    pre: str | None = None  # BPE pre-tokenizer name

    def with_duplicate_token(self) -> Vocabulary:
        """The same vocabulary with its last token string repeated (llama.cpp aborts on it)."""
        return replace(self, tokens=[*self.tokens[:-1], self.tokens[-2]])


def min_vocab_size(kind: TokenizerKind) -> int:
    """Smallest vocabulary that still covers every byte (so any text tokenises)."""
    return 3 + 256 if kind == "llama" else 256 + len(_BPE_MERGES) + 2


def build_vocabulary(kind: TokenizerKind, size: int) -> Vocabulary:
    if kind not in ("llama", "gpt2"):
        raise ValueError(f"unknown tokenizer {kind!r}; choose 'llama' (SPM) or 'gpt2' (BPE)")
    if size < min_vocab_size(kind):
        raise ValueError(f"a {kind} vocabulary needs at least {min_vocab_size(kind)} tokens")
    return _spm_vocabulary(size) if kind == "llama" else _bpe_vocabulary(size)


def _spm_vocabulary(size: int) -> Vocabulary:
    """SentencePiece: <unk>, <s>, </s>, 256 byte-fallback tokens, then word pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = [_SPM_SPACE, *(_SPM_SPACE + c for c in letters), *letters, "\u2581the", "\u2581is"]
    for i in range(size - len(tokens)):
        tokens.append(pieces[i] if i < len(pieces) else f"{_SPM_SPACE}w{i}")
        types.append(TokenType.NORMAL)
    # Byte and control tokens score 0; pieces rank by position, like a trained model's.
    scores = [0.0] * 259 + [-float(k) for k in range(size - 259)]
    return Vocabulary(
        model="llama",
        tokens=tokens,
        token_types=[int(t) for t in types],
        bos=1,
        eos=2,
        unk=0,
        scores=scores,
    )


_BPE_MERGES = (("\u0120", "t"), ("h", "e"), ("\u0120", "a"), ("i", "n"), ("\u0120t", "he"))


def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = 256 + extra
            extra += 1
    return [chr(mapping[b]) for b in range(256)]


def _bpe_vocabulary(size: int) -> Vocabulary:
    """GPT-2 byte-level BPE: 256 byte symbols, a few merges, fillers, two specials at the end."""
    tokens = _bytes_to_unicode()
    merges = [f"{a} {b}" for a, b in _BPE_MERGES]
    tokens += [a + b for a, b in _BPE_MERGES]
    tokens += [f"x{i}" for i in range(len(tokens), size - 2)]
    tokens += ["<|endoftext|>", "<|pad|>"]
    types = [int(TokenType.NORMAL)] * (size - 2) + [int(TokenType.CONTROL)] * 2
    eos = size - 2
    return Vocabulary(
        model="gpt2",
        tokens=tokens,
        token_types=types,
        bos=eos,
        eos=eos,
        merges=merges,
        pre="default",
    )
