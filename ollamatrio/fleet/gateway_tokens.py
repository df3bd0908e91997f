"""The tokens of an answer the gateway relays, read from the answer itself: the key that
asked is charged for them (its tokens-per-minute quota, its usage), as a server charges
its own requests (``api/routes.py``).  The fleet's keys live at the gateway, so the hosts
cannot.

Each dialect says its counts in its last object (or, for Anthropic's stream, the input in
its first event and the output in its last): native ``prompt_eval_count`` /
``eval_count`` / ``prompt_cached_count``; OpenAI ``usage.prompt_tokens`` /
``completion_tokens`` / ``prompt_tokens_details.cached_tokens``; Anthropic
``usage.input_tokens`` / ``output_tokens`` / ``cache_read_input_tokens``; the Responses
API ``response.usage.input_tokens`` / ``output_tokens`` / ``input_tokens_details``.  Only
lines that name a count are parsed, so the tokens in between cost a substring search.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

_MARKERS: Final = (b'"eval_count"', b'"usage"')
_MAX_LINE: Final = 1 << 20  # a longer line without an end is not an answer's counts


class TokenTally:
    """Fed an answer's body as it passes; :meth:`counts` when it has ended."""

    def __init__(self) -> None:
        self._partial = b""
        self.prompt = 0  # the prompt's tokens, the reused ones included
        self.reused = 0
        self.generated = 0

    def feed(self, piece: bytes) -> None:
        if b"\n" not in piece:
            self._partial = (self._partial + piece)[-_MAX_LINE:]
            return
        *lines, rest = (self._partial + piece).split(b"\n")
        self._partial = rest[-_MAX_LINE:]
        for line in lines:
            self._read(line)

    def counts(self) -> tuple[int, int, int]:
        """(prompt tokens evaluated, reused, generated), the body's end read too."""
        if self._partial:
            self._read(self._partial)  # a JSON answer in one piece, or a last line
            self._partial = b""
        return max(0, self.prompt - self.reused), self.reused, self.generated

    def _read(self, line: bytes) -> None:
        if not any(marker in line for marker in _MARKERS):
            return
        text = line.strip()
        if text.startswith(b"data:"):
            text = text[5:].strip()
        try:
            document = orjson.loads(text)
        except orjson.JSONDecodeError:
            return
        if isinstance(document, dict):
            self._take(document)

    def _take(self, document: dict[str, Any]) -> None:
        if "eval_count" in document or "prompt_eval_count" in document:  # native
            self._set(
                document.get("prompt_eval_count"),
                document.get("prompt_cached_count"),
                document.get("eval_count"),
            )
            return
        usage = _usage_of(document)
        if usage is None:
            return
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        if "prompt_tokens" in usage or "completion_tokens" in usage:  # OpenAI
            self._set(
                usage.get("prompt_tokens"), details.get("cached_tokens"),
                usage.get("completion_tokens"),
            )  # fmt: skip
        else:  # Anthropic (input: the uncached part) and the Responses API
            cached = usage.get("cache_read_input_tokens")
            prompt = usage.get("input_tokens")
            if isinstance(prompt, int) and isinstance(cached, int):
                prompt += cached
            self._set(prompt, cached if cached is not None else details.get("cached_tokens"),
                      usage.get("output_tokens"))  # fmt: skip

    def _set(self, prompt: object, reused: object, generated: object) -> None:
        # Streams repeat counts as they grow (Anthropic's output tokens): the last is whole.
        if isinstance(prompt, int) and prompt > 0:
            self.prompt = prompt
        if isinstance(reused, int) and reused >= 0 and isinstance(prompt, int) and prompt > 0:
            self.reused = reused
        if isinstance(generated, int) and generated >= 0:
            self.generated = max(self.generated, generated)


def _usage_of(document: dict[str, Any]) -> dict[str, Any] | None:
    for holder in (document, document.get("message"), document.get("response")):
        if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
            usage: dict[str, Any] = holder["usage"]
            return usage
    return None
