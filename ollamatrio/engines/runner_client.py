"""llama.cpp's HTTP API on a runner's Unix socket, in Ollama's terms.

:class:`RunnerClient` is the part of an engine that talks to a runner that is up: it maps
llama.cpp's errors onto the project's, streams generations (:mod:`.chunk_stream`), fits
prompts and conversations into the context as Ollama does, and serves embeddings,
tokenize/detokenize, health, slots and metrics.  It knows nothing of the process behind
the socket: :class:`~ollamatrio.engines.process.ProcessEngine` adds that, overriding
:meth:`RunnerClient.runner_gone` and :meth:`RunnerClient.stalled` to say (and act on)
why a runner stopped answering.  :meth:`RunnerClient.server_error` is the one place where
the transport's errors (:class:`~ollamatrio.errors.TransportError`: a lost connection, an
error status, an error the runner reported) become the server's.  :func:`open_runner_http`
scopes the pooled connections.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from typing import Any

import trio

from ollamatrio.engines.chunk_stream import ChunkStream, GenerationContext, stall_guard
from ollamatrio.engines.llamacpp_wire import (
    EMBED_INPUT_TOO_LONG,
    RERANK_INPUT_TOO_LONG,
    ChatStream,
    CompletionStream,
    RunnerReportedError,
    chat_request,
    completion_request,
    embedding_vectors,
    is_embedding_input_limit,
    raise_for_error,
    rerank_scores,
    stop_sequences,
)
from ollamatrio.engines.runner_http import RunnerConnectionError, RunnerHttp
from ollamatrio.errors import (
    CapabilityError,
    InvalidRequestError,
    OutOfMemoryError,
    PeerReportedError,
    PeerStatusError,
    RunnerError,
    TransportError,
)
from ollamatrio.runner.options import is_oom
from ollamatrio.types import CompletionRequest, Embeddings, Ranking

log = logging.getLogger(__name__)

HEALTH_TIMEOUT = 5.0
# What llama.cpp's /apply-template needs of a chat request to render it as it would.
TEMPLATE_FIELDS = ("messages", "tools", "chat_template_kwargs")


class RunnerClient:
    """llama.cpp's HTTP API on a runner's Unix socket, in Ollama's terms."""

    def __init__(
        self,
        *,
        name: str,
        context_length: int,
        num_parallel: int = 1,
        http: RunnerHttp | None = None,
        stall_timeout: float = math.inf,
    ) -> None:
        self._name = name
        self._context_length = context_length
        self._http = http
        self.stall_timeout = stall_timeout  # seconds a generation may go without a byte
        self._slots = trio.Semaphore(max(1, num_parallel))  # Ollama's per-runner semaphore

    @property
    def http(self) -> RunnerHttp:
        if self._http is None:
            raise RunnerError("the runner is not ready")
        return self._http

    @property
    def context_length(self) -> int:
        return self._context_length

    async def runner_gone(self, exc: BaseException | None) -> RunnerError:
        """The error for a request whose connection to the runner failed."""
        return RunnerError(f"lost the connection to the model runner: {exc}")

    def _stall_message(self) -> str:
        return f"model runner stopped responding: no output for {self.stall_timeout:g}s"

    async def stalled(self) -> RunnerError:
        """The error for a generation that got no byte for ``stall_timeout`` seconds."""
        return RunnerError(self._stall_message())

    async def _before_send(
        self, request: CompletionRequest, path: str, body: dict[str, Any]
    ) -> None:
        """A last look at a generation's body before it goes to llama.cpp (the process
        engine restores a saved prompt state here and picks its slot)."""

    async def server_error(self, exc: TransportError) -> Exception:
        """The server's error for a failed exchange with the runner: an error status or an
        error the runner reported is llama.cpp's error in Ollama's terms; a lost connection
        is the runner gone (the process engine says why)."""
        if isinstance(exc, PeerStatusError):
            return self._error_from_body(exc.status, exc.body)
        if isinstance(exc, PeerReportedError):
            return self._reported(exc)
        return await self.runner_gone(exc)

    @asynccontextmanager
    async def _server_errors(self) -> AsyncIterator[None]:
        """A block whose transport errors leave it as the server's (:meth:`server_error`)."""
        try:
            yield
        except TransportError as exc:
            raise await self.server_error(exc) from exc

    def _reported(self, exc: PeerReportedError) -> Exception:
        message = str(exc)
        if is_oom(message):
            return OutOfMemoryError(message)
        if exc.code == 501:
            return CapabilityError(message)
        if 400 <= exc.code < 500:
            return InvalidRequestError(message)
        return RunnerError(message)

    def _error_from_body(self, status: int, raw: bytes) -> Exception:
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = {"error": {"message": raw.decode("utf-8", "replace"), "code": status}}
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            error.setdefault("code", status)
            body = {"error": error}
        else:
            body = {"error": {"message": str(error or body), "code": status}}
        try:
            raise_for_error(body)
        except RunnerReportedError as exc:
            return self._reported(exc)
        return RunnerError(f"runner answered HTTP {status}")

    async def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> bytes:
        """A plain request on a pooled connection; the body of a 200 answer."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        async with self._server_errors():
            status, raw = await self.http.request(method, path, data)
        if status != 200:
            raise self._error_from_body(status, raw)
        return raw

    async def post_json(self, path: str, body: Mapping[str, Any]) -> Any:
        return json.loads(await self._call("POST", path, body))

    @asynccontextmanager
    async def complete(self, request: CompletionRequest) -> AsyncIterator[ChunkStream]:
        """Stream a generation: prompt -> ``/completion``, messages -> chat completions."""
        if request.context and request.messages is not None:
            # Ollama: the earlier context, as text, in front of the rendered prompt.
            request = replace(request, prompt=await self.render(request), messages=None)
        if request.context and request.prompt is not None:
            # The prompt gets its own BOS when tokenized: drop the earlier one.
            prefix = await self.tokenize_prompt("")
            tokens = list(request.context)
            if prefix and tokens[: len(prefix)] == prefix:
                tokens = tokens[len(prefix) :]
            earlier = await self.detokenize(tokens)
            request = replace(request, prompt=earlier + request.prompt, context=())
        if request.messages is not None:
            request = await self._fitted(request)
            path, body = chat_request(request, self.context_length, self._name)
            parser: ChatStream | CompletionStream = ChatStream(
                top_logprobs=request.top_logprobs,
                stop=stop_sequences(request.options) if request.report_stop else (),
                forced_call="json_schema" in body,
            )
        else:
            path, body = completion_request(request, self.context_length)
            if path == "/completion":
                body["prompt"] = await self._fitted_prompt(request)
            parser = CompletionStream(request.top_logprobs)
        # Progress events during prompt processing keep bytes flowing while the runner
        # works, so the stall deadline only catches a runner that stopped.
        body["return_progress"] = True
        await self._before_send(request, path, body)
        data = json.dumps(body, separators=(",", ":")).encode()
        async with self._slots, AsyncExitStack() as stack:
            with trio.move_on_after(self.stall_timeout) as stall:
                async with self._server_errors():
                    _, events = await stack.enter_async_context(self.http.stream(path, data))
            if stall.cancelled_caught:
                raise await self.stalled()
            # Leaving closes the connection: that is what tells llama.cpp to stop and free
            # the slot (synchronously, so it happens in a cancelled scope too).
            context = GenerationContext(self, request) if request.return_context else None
            async with stall_guard(self) as stall:
                yield ChunkStream(self, events, parser, context, stall)

    def _context_limit(self, request: CompletionRequest) -> int:
        """Tokens a request may fill: its own ``num_ctx`` when a runner loaded with a larger
        context serves it, else the runner's context per slot."""
        asked = request.options.get("num_ctx")
        if isinstance(asked, int) and 0 < asked < self.context_length:
            return asked
        return self.context_length

    async def render(self, request: CompletionRequest) -> str:
        """The prompt llama.cpp's chat template makes of ``request``'s messages."""
        _, body = chat_request(request, self.context_length, self._name)
        template = {k: body[k] for k in TEMPLATE_FIELDS if k in body}
        return str(json.loads(await self._call("POST", "/apply-template", template))["prompt"])

    async def _fitted_prompt(self, request: CompletionRequest) -> str | list[int]:
        """The prompt, or when it does not fit the context its last tokens (after the BOS),
        cut from the front; 400 naming num_ctx when it does not fit and ``truncate`` is
        false."""
        prompt = request.prompt or ""
        limit = self._context_limit(request)
        if len(prompt.encode()) + 2 <= limit:  # a token covers at least one byte
            return prompt
        tokens = await self.tokenize_prompt(prompt)
        if len(tokens) <= limit:
            return prompt
        if not request.truncate:
            raise InvalidRequestError(
                f"the prompt ({len(tokens)} tokens) exceeds the context length "
                f"(num_ctx {limit}) and truncate is false"
            )
        head = await self.tokenize_prompt("")  # what the tokenizer puts first (BOS)
        if tokens[: len(head)] != head:
            head = []
        log.debug("truncating the prompt: %d tokens to %d", len(tokens), limit)
        return head + tokens[len(tokens) - (limit - len(head)) :]

    async def _fitted(self, request: CompletionRequest) -> CompletionRequest:
        """``request`` with the oldest messages dropped until the conversation, rendered with
        the model's template and tokenized by the runner, fits the context (Ollama's
        ``chatPrompt``): system messages and the latest message always stay.  400 when the
        latest message alone (with the system messages) cannot fit, or, with ``truncate``
        false, when the whole conversation cannot."""
        messages = list(request.messages or ())
        limit = self._context_limit(request)
        # Tokens never outnumber the bytes of the text they encode; a template adds far
        # fewer than 64 tokens a message.  Below that bound nothing needs measuring.
        size = sum(len(m.content.encode()) for m in messages)
        size += len(json.dumps(list(request.tools or ()))) + 64 * (len(messages) + 1)
        if size <= limit or not messages:
            return request

        async def tokens_from(start: int) -> int:
            kept = [m for m in messages[:start] if m.role == "system"] + messages[start:]
            prompt = await self.render(replace(request, messages=kept))
            return len(await self.tokenize_prompt(prompt))

        whole = await tokens_from(0)
        if whole <= limit:
            return request
        if not request.truncate:
            raise InvalidRequestError(
                f"the conversation ({whole} tokens) exceeds the context length "
                f"(num_ctx {limit}) and truncate is false"
            )
        last = len(messages) - 1
        latest = await tokens_from(last)
        if latest > limit:
            raise InvalidRequestError(
                f"the latest message ({latest} tokens with the system messages) exceeds the "
                f"context length (num_ctx {limit})"
            )
        # The first start that fits: fewer messages never need more tokens (binary search).
        low, high = 1, last
        while low < high:
            middle = (low + high) // 2
            if await tokens_from(middle) <= limit:
                high = middle
            else:
                low = middle + 1
        log.debug("truncating the conversation: dropped %d oldest messages", low)
        kept = [m for m in messages[:low] if m.role == "system"] + messages[low:]
        return replace(request, messages=kept)

    async def embed(
        self, inputs: Sequence[str], *, truncate: bool = True, dimensions: int | None = None
    ) -> Embeddings:
        texts: list[str | list[int]] = list(inputs)
        if truncate:
            texts = [await self._truncated(text) for text in inputs]
        async with self._slots:
            try:
                response = await self.post_json(
                    "/v1/embeddings",
                    {"input": texts, "encoding_format": "float", "model": self._name},
                )
            except (RunnerError, InvalidRequestError) as exc:
                # llama.cpp answers 500 for an input over its batch: the request's fault.
                if isinstance(exc, OutOfMemoryError) or not is_embedding_input_limit(str(exc)):
                    raise
                raise InvalidRequestError(EMBED_INPUT_TOO_LONG) from exc
        async with self._server_errors():
            vectors = embedding_vectors(response, len(texts), dimensions)
        usage = response.get("usage") or {}
        return Embeddings(vectors=vectors, prompt_eval_count=int(usage.get("prompt_tokens", 0)))

    async def rerank(self, query: str, documents: Sequence[str]) -> Ranking:
        # Every score comes back (top_n: all); the API sorts, cuts and adds the documents.
        body = {"query": query, "documents": list(documents), "top_n": len(documents)}
        async with self._slots:
            try:
                response = await self.post_json("/v1/rerank", {**body, "model": self._name})
            except (RunnerError, InvalidRequestError) as exc:
                # As for embeddings: a pair over the batch is a 500 from llama.cpp.
                if isinstance(exc, OutOfMemoryError) or not is_embedding_input_limit(str(exc)):
                    raise
                raise InvalidRequestError(RERANK_INPUT_TOO_LONG) from exc
        async with self._server_errors():
            scores = rerank_scores(response, len(documents))
        usage = response.get("usage") or {}
        return Ranking(scores=scores, prompt_eval_count=int(usage.get("prompt_tokens", 0)))

    async def _truncated(self, text: str) -> str | list[int]:
        """``text``, or its first tokens when it cannot fit the context (Ollama's truncate)."""
        limit = self.context_length
        if len(text.encode()) + 2 <= limit:  # a token covers at least one byte
            return text
        tokens = await self.tokenize(text)
        return tokens[:limit] if len(tokens) > limit else text

    async def tokenize(self, text: str) -> list[int]:
        body = {"content": text, "add_special": False, "parse_special": True}
        return [int(t) for t in (await self.post_json("/tokenize", body))["tokens"]]

    async def count_tokens(self, request: CompletionRequest) -> int:
        """``request``'s prompt in tokens: rendered and tokenized as truncation measures it."""
        prompt = request.prompt if request.prompt is not None else await self.render(request)
        return len(await self.tokenize_prompt(prompt))

    async def tokenize_prompt(self, text: str) -> list[int]:
        """``text`` as llama.cpp tokenizes a prompt: special tokens parsed, BOS added."""
        body = {"content": text, "add_special": True, "parse_special": True}
        return [int(t) for t in (await self.post_json("/tokenize", body))["tokens"]]

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return str((await self.post_json("/detokenize", {"tokens": list(tokens)}))["content"])

    async def healthy(self) -> bool:
        if self._http is None:
            return False
        with trio.move_on_after(HEALTH_TIMEOUT):
            try:
                status, raw = await self._http.request("GET", "/health")
                return status == 200 and json.loads(raw).get("status") == "ok"
            except (RunnerConnectionError, ValueError, AttributeError):
                return False
        return False

    async def slots(self) -> list[dict[str, Any]]:
        """llama.cpp's ``/slots`` (``is_processing`` per slot)."""
        return list(await self._get_json("/slots"))

    async def metrics(self) -> str:
        return (await self._call("GET", "/metrics")).decode("utf-8", "replace")

    async def _get_json(self, path: str) -> Any:
        return json.loads(await self._call("GET", path))


@asynccontextmanager
async def open_runner_http(socket: str, api_key: str) -> AsyncIterator[RunnerHttp]:
    """The HTTP client for one runner's socket, its pooled connections closed at the end.
    No read timeouts: Trio scopes own the deadlines."""
    http = RunnerHttp(socket, api_key)
    try:
        yield http
    finally:
        http.close()
