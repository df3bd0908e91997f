"""A runner's slots saved to the on-disk prompt cache when it unloads, and restored when
the next runner of the same model and options sees a prompt they begin.

Saving (:meth:`SlotPersistence.save_all`) runs in the engine's orderly close, before the
runner is told to stop, under a shielded deadline (``SAVE_SECONDS``): idle slots holding
at least ``MIN_SAVE_TOKENS`` tokens, the most recently used first, each written by
llama.cpp (``POST /slots/{id}?action=save``) under a temporary name that the cache then
indexes.  A crashed runner saves nothing (there is nobody to ask).

Restoring: as the runner becomes ready (:meth:`SlotPersistence.load`, once, off every
request's path) the states of this runner's key are read from the index, and the text each
one begins with is asked of the runner.  A request (:meth:`SlotPersistence.before_send`)
then costs nothing while no state is left to try, and a prompt (a chat's as its template
renders it) that begins with none of those texts goes on untokenized: it cannot share
``MIN_RESTORE_TOKENS`` leading tokens with any of them.  Otherwise it is tokenized as
llama.cpp will evaluate it, the state sharing the longest prefix (at least
``MIN_RESTORE_TOKENS``) is put into an empty slot (``action=restore``), and the request is
sent to that slot (``id_slot``) so llama.cpp evaluates only what follows the shared prefix.
A state llama.cpp refuses (corrupt, truncated, from another build) is dropped and the
request evaluates its prompt as usual; nothing here fails a request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from ..errors import InvalidRequestError, OllamatrioError
from ..slot_cache import MIN_RESTORE_TOKENS, MIN_SAVE_TOKENS, SlotCache
from ..slot_cache.index import shared_prefix
from ..types import CompletionRequest
from .runner_client import TEMPLATE_FIELDS, RunnerClient

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"


# Characters cut from the end of a state's leading text before prompts are compared with
# it: its last token may end inside a character, or join the next one differently.
HEAD_SLACK = 16


def _has_images(request: CompletionRequest) -> bool:
    return bool(request.images) or any(m.images for m in request.messages or ())


@dataclass
class _Saved:
    """A state of this runner's key not yet tried: its name, its tokens, and the text a
    prompt must begin with to share ``MIN_RESTORE_TOKENS`` tokens with it (None: unknown,
    every prompt is tokenized to find out)."""

    name: str
    tokens: list[int]
    head: str | None


class SlotPersistence:
    """Saves and restores one runner's slots under ``key``."""

    def __init__(
        self, client: RunnerClient, cache: SlotCache, *, key: str, model_path: str
    ) -> None:
        self._client = client
        self._cache = cache
        self._key = key
        self._model_path = model_path
        self._saved: list[_Saved] = []  # states of this key not yet tried (load() reads them)
        self._restored: set[str] = set()  # states put into a slot by this runner
        self._restored_slots: set[int] = set()  # slots holding them (/slots shows them empty)

    # -- restore ------------------------------------------------------------------------

    async def load(self) -> None:
        """Read this key's states and the text each begins with; once, as the runner
        becomes ready, so that no request waits on the index for them."""
        try:
            states = await trio.to_thread.run_sync(self._cache.states, self._key)
            if not states:
                return
            bos = await self._client.tokenize_prompt("")  # what a prompt's tokens begin with
            heads: dict[tuple[int, ...], str | None] = {}  # states often share their head
            for name, tokens in states:
                first = tuple(tokens[:MIN_RESTORE_TOKENS])
                if first not in heads:
                    heads[first] = await self._head(tokens, bos)
                self._saved.append(_Saved(name, tokens, heads[first]))
        except (OllamatrioError, OSError, ValueError, KeyError) as exc:  # nothing fails
            log.warning("prompt cache: saved states not read: %s", exc)
            self._saved = []

    async def _head(self, tokens: list[int], bos: list[int]) -> str | None:
        """The text of ``tokens``' first ``MIN_RESTORE_TOKENS`` (after the BOS), less
        ``HEAD_SLACK`` characters; None when it cannot serve as a test."""
        if bos and tokens[: len(bos)] != bos:
            return None
        text = await self._client.detokenize(tokens[len(bos) : MIN_RESTORE_TOKENS])
        # Leading whitespace is the tokenizer's (SentencePiece adds a space it does not
        # take back here): prompts are compared without theirs.
        text = text.split("\ufffd", 1)[0][:-HEAD_SLACK].lstrip()
        return text or None

    async def before_send(
        self, request: CompletionRequest, path: str, body: dict[str, Any]
    ) -> None:
        """Restore the saved state this request's prompt begins with, if one is worth it,
        and direct the request to the slot holding it."""
        if not self._saved or "id_slot" in body or _has_images(request):
            return
        if path == CHAT_PATH:
            template = {k: body[k] for k in TEMPLATE_FIELDS if k in body}
            rough = len(json.dumps(template))
        elif path == "/completion":
            prompt = body.get("prompt")
            if not isinstance(prompt, str | list):
                return
            rough = len(prompt) if isinstance(prompt, list) else len(prompt.encode())
        else:
            return
        if rough < MIN_RESTORE_TOKENS:  # a token covers at least one byte
            return
        try:
            await self._restore(path, body)
        except (OllamatrioError, OSError) as exc:  # the request goes on as if nothing was saved
            log.warning("prompt cache: restore skipped: %s", exc)

    async def _prompt(self, path: str, body: Mapping[str, Any]) -> str | list[int]:
        """The prompt as llama.cpp will see it: text, or the tokens the request gave."""
        if path == CHAT_PATH:
            template = {k: body[k] for k in TEMPLATE_FIELDS if k in body}
            return str((await self._client.post_json("/apply-template", template))["prompt"])
        prompt = body["prompt"]
        return [int(t) for t in prompt] if isinstance(prompt, list) else str(prompt)

    def _best(self, tokens: list[int]) -> _Saved | None:
        """The state not yet tried that shares the longest prefix (at least
        ``MIN_RESTORE_TOKENS``) with ``tokens``."""
        best, longest = None, MIN_RESTORE_TOKENS - 1
        for saved in self._saved:
            shared = shared_prefix(saved.tokens, tokens)
            if shared > longest:
                best, longest = saved, shared
        return best

    def _forget(self, name: str) -> None:
        self._saved = [s for s in self._saved if s.name != name]

    async def _restore(self, path: str, body: dict[str, Any]) -> None:
        prompt = await self._prompt(path, body)
        if isinstance(prompt, str):
            text = prompt.lstrip()
            if not any(s.head is None or text.startswith(s.head) for s in self._saved):
                return  # no state's leading text: no state's leading tokens either
            tokens = await self._client.tokenize_prompt(prompt)
        else:
            tokens = prompt
        best = self._best(tokens) if len(tokens) >= MIN_RESTORE_TOKENS else None
        if best is None:
            return
        # The index has the last word: the file may be gone, another state may be longer.
        match = await trio.to_thread.run_sync(
            lambda: self._cache.find(
                self._key, tokens, minimum=MIN_RESTORE_TOKENS, skip=frozenset(self._restored)
            )
        )
        if match is None:
            self._forget(best.name)  # dropped from the index (its file was gone)
            return
        slot = await self._empty_slot()
        if slot is None:  # every slot holds a conversation of its own by now
            self._saved = []
            return
        started = trio.current_time()
        try:
            answer = await self._client.post_json(
                f"/slots/{slot}?action=restore", {"filename": match.name}
            )
        except InvalidRequestError as exc:  # llama.cpp could not read it: never offer it again
            log.warning("prompt cache: state %s refused (%s); dropped", match.name, exc)
            self._forget(match.name)
            await trio.to_thread.run_sync(self._cache.discard, match.name)
            return
        self._restored.add(match.name)
        self._restored_slots.add(slot)
        self._forget(match.name)
        body["id_slot"] = slot
        log.info(
            "prompt cache: restored %d tokens (%d shared with the prompt of %d) into slot %d "
            "in %.3fs",
            int(answer.get("n_restored", match.n_tokens)),
            match.shared,
            len(tokens),
            slot,
            trio.current_time() - started,
        )

    async def _empty_slot(self) -> int | None:
        for slot in await self._client.slots():
            number = int(slot["id"])
            if (
                not slot.get("is_processing")
                and not slot.get("n_prompt_tokens")
                and number not in self._restored_slots
            ):
                return number
        return None

    # -- save ---------------------------------------------------------------------------

    async def save_all(self) -> int:
        """Save the slots worth keeping, most recently used first; returns how many were
        kept.  Callers bound the time (a cancelled save leaves nothing behind)."""
        if not await trio.to_thread.run_sync(os.path.exists, self._model_path):
            return 0  # the model was deleted: its states would be dropped at once
        slots = [
            s
            for s in await self._client.slots()
            if not s.get("is_processing") and int(s.get("n_prompt_tokens") or 0) >= MIN_SAVE_TOKENS
        ]
        slots.sort(key=lambda s: int(s.get("id_task") or 0), reverse=True)
        kept = 0
        # A slot restored and never used reports no tokens, so it is not saved again.
        for slot in slots:
            if await self._save(int(slot["id"])):
                kept += 1
        return kept

    async def _save(self, slot: int) -> bool:
        temp = self._cache.temp_name()
        try:
            answer = await self._client.post_json(f"/slots/{slot}?action=save", {"filename": temp})
        except BaseException:
            # Cut short (the deadline, a runner gone): drop the half-written file now; the
            # runner may still be writing it, which an unlinked file allows.
            with contextlib.suppress(OSError):
                os.unlink(self._cache.folder / temp)
            raise
        name = await trio.to_thread.run_sync(
            lambda: self._cache.commit(
                temp,
                key=self._key,
                model_path=self._model_path,
                n_saved=int(answer.get("n_saved", -1)),
            )
        )
        if name is not None:
            log.info(
                "prompt cache: saved slot %d (%d tokens, %d bytes) as %s",
                slot,
                int(answer.get("n_saved", 0)),
                int(answer.get("n_written", 0)),
                name,
            )
        return name is not None
