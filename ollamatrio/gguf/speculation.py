"""What speculative decoding needs to know from GGUF headers: whether a draft model speaks
the target's vocabulary, and whether a model carries its own multi-token-prediction heads.

A draft model proposes token ids that the target verifies, so both must mean the same text
by the same id.  llama.cpp's own check (``common_speculative_are_compatible``) wants the
same tokenizer type, the same BOS/EOS ids, vocabulary sizes within 128 of each other and the
same text at every id both have; :func:`vocabulary_mismatch` applies that rule at create
time and says which part differs.  It reads the token lists from the files (tens of
milliseconds each): call it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .header import GGUFInfo

#: llama.cpp's ``SPEC_VOCAB_MAX_SIZE_DIFFERENCE``: padding tokens a family may add.
MAX_VOCAB_SIZE_DIFFERENCE = 128
#: llama.cpp's ``<arch>.nextn_predict_layers``: the count of MTP (next-n) layers.
NEXTN_KEY = "{arch}.nextn_predict_layers"

_TOKENIZER_MODEL = "tokenizer.ggml.model"
_TOKENS = "tokenizer.ggml.tokens"
_SPECIAL_IDS = ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")


def vocabulary_mismatch(target: GGUFInfo, draft: GGUFInfo) -> str | None:
    """Why ``draft`` cannot draft for ``target`` (one phrase naming the difference), or
    None when their vocabularies agree."""
    target_model = target.metadata.get(_TOKENIZER_MODEL)
    draft_model = draft.metadata.get(_TOKENIZER_MODEL)
    if target_model != draft_model:
        return f"tokenizer model {_shown(draft_model)} differs from {_shown(target_model)}"
    for key in _SPECIAL_IDS:
        if target.metadata.get(key) != draft.metadata.get(key):
            return (
                f"{key} {_shown(draft.metadata.get(key))} differs from "
                f"{_shown(target.metadata.get(key))}"
            )
    target_tokens = _tokens(target)
    draft_tokens = _tokens(draft)
    if abs(len(target_tokens) - len(draft_tokens)) > MAX_VOCAB_SIZE_DIFFERENCE:
        return f"vocabulary size {len(draft_tokens)} differs from {len(target_tokens)}"
    for index, (ours, theirs) in enumerate(zip(target_tokens, draft_tokens, strict=False)):
        if ours != theirs:
            return f"token {index} is {theirs!r}, not {ours!r}"
    return None


def _tokens(info: GGUFInfo) -> Sequence[Any]:
    if _TOKENS not in info.metadata:
        return ()
    return info.full_array(_TOKENS)


def _shown(value: object) -> str:
    return "(none)" if value is None else repr(value)


def nextn_layers(info: GGUFInfo) -> int:
    """How many multi-token-prediction layers the file declares (0: none)."""
    value = info.metadata.get(NEXTN_KEY.format(arch=info.architecture))
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def has_mtp_heads(info: GGUFInfo) -> bool:
    """Whether the model carries multi-token-prediction heads llama.cpp can draft with:
    the ``nextn_predict_layers`` key, or tensors named as its next-n layers
    (``blk.N.nextn.*``) or as Ollama's older Qwen MTP drafts (``mtp.*``)."""
    if nextn_layers(info) > 0:
        return True
    return any(".nextn." in t.name or t.name.startswith("mtp.") for t in info.tensors)
