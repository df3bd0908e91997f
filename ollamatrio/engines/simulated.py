"""A simulated engine: models that load, stream, fail and take memory without llama.cpp.

It lets the scheduler be tested, demonstrated and benchmarked at scale without GPUs or
real weights.  Memory use comes from the same prediction the scheduler makes, placed on
:class:`~ollamatrio.devices.SimulatedDevices` when those are in use, so ``/api/ps`` and
eviction behave as they would with real runners.  Time is Trio time, so tests on the
``autojump_clock`` run minutes of simulated loading and decoding in milliseconds.

Behaviour is set per model (matched by name or file path) with
:class:`SimulatedBehaviour`; from the environment, ``OLLAMATRIO_SIMULATED_ENGINE`` may
hold a JSON object ``{"default": {...}, "models": {"name": {...}}}`` with the same fields.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..devices import SimulatedDevices
from ..errors import InvalidRequestError, OutOfMemoryError, RunnerCrashedError, RunnerStartError
from ..gguf import GGUFInfo
from ..memory import (
    MemoryOptions,
    draft_bytes,
    estimate,
    gpu_context_reserve,
    plan_layout,
    projector_bytes,
)
from ..model_info import read_model_info
from ..types import Chunk, CompletionRequest, Embeddings, LoadSpec, MemoryUsage, Ranking
from .llamacpp_wire import EMBED_INPUT_TOO_LONG
from .protocol import LoadProgress

LOAD_STEPS = 10  # progress reports over a simulated load (like 10 % steps of a real one)

_WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "the",
    "scheduler",
    "keeps",
    "every",
    "model",
    "warm",
)


@dataclass(frozen=True)
class SimulatedBehaviour:
    load_seconds: float = 0.5
    tokens_per_second: float = 100.0
    prompt_tokens_per_second: float = 2000.0
    default_num_predict: int = 16  # tokens when the request sets no limit; then "stop"
    fail_load: str | None = None  # "error" | "oom"
    crash_after_tokens: int | None = None  # the runner "dies" mid-stream
    oom_at_runtime: bool = False  # generation fails with an out-of-memory error
    # How the model's real VRAM compares with the prediction (the GPU context reserve is
    # always held in full, as a real runner's CUDA context is).
    vram_factor: float = 1.0
    # Reuse the words a prompt shares with the previous one (prompt, then answer) instead of
    # "evaluating" them, as llama.cpp's slot and prompt cache do: at least one is evaluated.
    reuse_prompt: bool = False
    # Host prompt cache bytes a slot state takes per token (0: none kept).  As llama.cpp's
    # with one slot: a request saves the previous one's state (prompt and answer) in the
    # cache, up to the load's limit and the scheduler's grant (see SimulatedPromptCache).
    state_bytes_per_token: int = 0

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SimulatedBehaviour:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown simulated engine settings: {sorted(unknown)}")
        return cls(**data)


def behaviours_from_json(text: str) -> tuple[SimulatedBehaviour, dict[str, SimulatedBehaviour]]:
    if not text.strip():
        return SimulatedBehaviour(), {}
    try:
        data = json.loads(text)
        default = SimulatedBehaviour.from_mapping(data.get("default", {}))
        models = {k: SimulatedBehaviour.from_mapping(v) for k, v in data.get("models", {}).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"OLLAMATRIO_SIMULATED_ENGINE is not valid: {exc}") from exc
    return default, models


class ChunkByChunk:
    """A stream of chunks as :class:`~ollamatrio.engines.protocol.ChunkBatches`, every
    chunk a wake-up of its own (the simulated engine's, and test doubles')."""

    def __init__(self, chunks: AsyncGenerator[Chunk, None]) -> None:
        self._chunks = chunks

    def __aiter__(self) -> ChunkByChunk:
        return self

    async def __anext__(self) -> Chunk:
        return await self._chunks.__anext__()

    async def next_batch(self) -> list[Chunk]:
        try:
            return [await self._chunks.__anext__()]
        except StopAsyncIteration:
            return []

    async def aclose(self) -> None:
        """Close the generator, which a relay done early leaves unfinished."""
        await self._chunks.aclose()


def ngram_drafts(prompt: Sequence[str], answer: Sequence[str]) -> tuple[int, int]:
    """A simulated n-gram drafter's counts: before each word of the answer, the word that
    followed the previous one at its latest earlier place in the context is drafted, and
    accepted where it is the word the answer goes on with."""
    context = list(prompt)
    drafted = accepted = 0
    for word in answer:
        if context:
            last = context[-1]
            for i in range(len(context) - 2, -1, -1):
                if context[i] == last:
                    drafted += 1
                    accepted += context[i + 1] == word
                    break
        context.append(word)
    return drafted, accepted


class SimulatedPromptCache:
    """llama.cpp's host prompt cache as far as memory goes: saved states, oldest evicted first
    to stay within the limit; a save that would pass the grant fails as an allocation would
    under the runner's cap (engines/cache_allowance.py), and then, as llama.cpp does, the
    limit drops to 40 % of what the cache held, for good."""

    def __init__(self, limit: int, on_change: Callable[[int], None]) -> None:
        self.limit = limit
        self.granted = limit
        self.states: list[int] = []
        self._on_change = on_change

    @property
    def held(self) -> int:
        return sum(self.states)

    def grant(self, nbytes: int) -> None:
        self.granted = max(0, min(nbytes, self.limit))

    def save(self, nbytes: int) -> None:
        if 0 < nbytes <= self.limit:
            while self.held + nbytes > self.limit:
                self.states.pop(0)
            if self.held + nbytes > self.granted:
                self.limit = max(1, int(0.4 * self.held))
                while self.held > self.limit:
                    self.states.pop(0)
            else:
                self.states.append(nbytes)
        self._on_change(self.held)


class SimulatedEngine:
    """One simulated loaded model."""

    _pids = itertools.count(1_000_000)

    def __init__(
        self,
        spec: LoadSpec,
        info: GGUFInfo,
        memory: MemoryUsage,
        behaviour: SimulatedBehaviour,
        on_cache_change: Callable[[int], None] = lambda held: None,
    ) -> None:
        self._spec = spec
        self._info = info
        self._memory = memory
        self._behaviour = behaviour
        self._pid = next(self._pids)
        self._crashed = trio.Event()
        self.active_streams = 0
        self.completed_streams = 0
        self.prompt_tokens = 0
        self.predicted_tokens = 0
        self.last_request: CompletionRequest | None = None  # the latest generation, as sent
        self._cached: list[str] = []  # the last prompt and answer, in words (reuse_prompt)
        self.prompt_cache = SimulatedPromptCache(spec.prompt_cache_mib << 20, on_cache_change)
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)
        # As a runner: a pool of the cores it was given, unless num_thread fixed its count.
        self._pool = 0 if spec.num_thread else spec.cores
        self._threads = spec.num_thread or spec.cores
        self.thread_changes: list[int] = []  # every count it was told to use, in order

    @property
    def spec(self) -> LoadSpec:
        return self._spec

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def context_length(self) -> int:
        return self._spec.num_ctx

    @property
    def memory(self) -> MemoryUsage:
        return self._memory

    def prompt_cache_held(self) -> int:
        return self.prompt_cache.held

    def grant_prompt_cache(self, nbytes: int) -> None:
        self.prompt_cache.grant(nbytes)

    @property
    def load_phases(self) -> Mapping[str, float]:
        return {}  # a simulated load has no phases worth measuring

    @property
    def thread_pool(self) -> int:
        return self._pool

    @property
    def threads(self) -> int:
        return self._threads

    async def use_threads(self, threads: int) -> None:
        if self._pool:
            self._threads = max(1, min(threads, self._pool))
            self.thread_changes.append(self._threads)
        await trio.lowlevel.checkpoint()

    def crash(self) -> None:
        """Make the runner die now, as an abort() in llama.cpp would."""
        self._crashed.set()

    def _check_alive(self) -> None:
        if self._crashed.is_set():
            raise RunnerCrashedError("model runner has unexpectedly stopped (SIGABRT)", -6)

    @asynccontextmanager
    async def complete(self, request: CompletionRequest) -> AsyncIterator[ChunkByChunk]:
        self._check_alive()
        self.last_request = request
        self.active_streams += 1
        try:
            async with aclosing(self._stream(request)) as chunks:
                yield ChunkByChunk(chunks)
        finally:
            self.active_streams -= 1

    async def _stream(self, request: CompletionRequest) -> AsyncGenerator[Chunk, None]:
        b = self._behaviour
        prompt = _prompt(request)
        n_prompt = _prompt_tokens(prompt)
        words = prompt.split()
        reused = min(_common_prefix(self._cached, words), n_prompt - 1) if b.reuse_prompt else 0
        evaluated = n_prompt - reused
        if b.state_bytes_per_token and self._cached:  # the slot's previous state is saved
            self.prompt_cache.save(len(self._cached) * b.state_bytes_per_token)
        await trio.sleep(evaluated / b.prompt_tokens_per_second)
        self.prompt_tokens += evaluated
        limit = int(request.options.get("num_predict", -1) or -1)
        n_tokens = b.default_num_predict if limit < 0 else min(limit, 10 * self._spec.num_ctx)
        seed = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=4).digest(), "little")
        self._cached = words  # grows by the answer's words below
        n_words = len(words)
        for i in range(n_tokens):
            self._check_alive()
            if b.crash_after_tokens is not None and i >= b.crash_after_tokens:
                self.crash()
                self._check_alive()
            if b.oom_at_runtime:
                raise OutOfMemoryError("CUDA error: out of memory")
            await trio.sleep(1.0 / b.tokens_per_second)
            self.predicted_tokens += 1
            word = _WORDS[(seed + i) % len(_WORDS)]
            self._cached.append(word)
            yield Chunk(content=" " + word)
        self.completed_streams += 1
        drafted, accepted = (
            ngram_drafts(self._cached[:n_words], self._cached[n_words:])
            if self._spec.speculative == "ngram"
            else (None, None)
        )
        yield Chunk(
            done=True,
            done_reason="length" if limit >= 0 and n_tokens == limit else "stop",
            prompt_eval_count=n_prompt,
            prompt_eval_duration=int(evaluated / b.prompt_tokens_per_second * 1e9),
            prompt_cached_count=reused,
            eval_count=n_tokens,
            eval_duration=int(n_tokens / b.tokens_per_second * 1e9),
            draft_count=drafted,
            draft_accepted_count=accepted,
        )

    async def embed(
        self, inputs: Sequence[str], *, truncate: bool = True, dimensions: int | None = None
    ) -> Embeddings:
        self._check_alive()
        if not truncate and any(len(text.split()) > self._spec.num_ctx for text in inputs):
            raise InvalidRequestError(EMBED_INPUT_TOO_LONG)  # as a runner's is mapped
        dim = self._info.embedding_length or 8
        if dimensions and dimensions < dim:  # as Ollama: only ever shortened
            dim = dimensions
        vectors = []
        for text in inputs:
            digest = hashlib.blake2b(text.encode(), digest_size=64).digest()
            raw = [digest[i % 64] - 127.5 for i in range(dim)]
            norm = math.sqrt(sum(x * x for x in raw)) or 1.0
            vectors.append([x / norm for x in raw])
        n = sum(max(1, len(t.split())) for t in inputs)
        await trio.sleep(n / self._behaviour.prompt_tokens_per_second)
        return Embeddings(vectors=vectors, prompt_eval_count=n)

    async def rerank(self, query: str, documents: Sequence[str]) -> Ranking:
        """The share of the query's words each document holds: a stand-in for a
        cross-encoder's score that orders documents as a reader would."""
        self._check_alive()
        wanted = set(query.lower().split())
        scores = [len(wanted & set(doc.lower().split())) / max(1, len(wanted)) for doc in documents]
        n = sum(max(1, len(query.split()) + len(doc.split())) for doc in documents)
        await trio.sleep(n / self._behaviour.prompt_tokens_per_second)
        return Ranking(scores=scores, prompt_eval_count=n)

    async def count_tokens(self, request: CompletionRequest) -> int:
        self._check_alive()
        return _prompt_tokens(_prompt(request))

    async def tokenize(self, text: str) -> list[int]:
        self._check_alive()
        return [_WORDS.index(w) if w in _WORDS else len(_WORDS) for w in text.split()]

    async def detokenize(self, tokens: Sequence[int]) -> str:
        self._check_alive()
        return " ".join(_WORDS[t] if 0 <= t < len(_WORDS) else "?" for t in tokens)

    async def healthy(self) -> bool:
        return not self._crashed.is_set()

    async def metrics(self) -> str:
        """A few of llama.cpp's ``/metrics`` series, under its names, from this engine's
        counts: so the server's re-export of runner metrics works without a runner."""
        self._check_alive()
        return generate_latest(self._registry).decode()

    def collect(self) -> list[Metric]:  # prometheus_client's collector protocol
        return [
            CounterMetricFamily(
                "llamacpp:prompt_tokens", "Number of prompt tokens processed",
                value=self.prompt_tokens,
            ),
            CounterMetricFamily(
                "llamacpp:tokens_predicted", "Number of generation tokens processed",
                value=self.predicted_tokens,
            ),
            GaugeMetricFamily(
                "llamacpp:requests_processing", "Number of requests processing",
                value=self.active_streams,
            ),
        ]  # fmt: skip


class SimulatedEngineFactory:
    """Opens :class:`SimulatedEngine` instances; see the module docstring."""

    def __init__(
        self,
        devices: SimulatedDevices | None = None,
        *,
        default: SimulatedBehaviour | None = None,
        models: Mapping[str, SimulatedBehaviour] | None = None,
    ) -> None:
        self._devices = devices
        self.default = default or SimulatedBehaviour()
        self.models = dict(models or {})
        self.engines: dict[str, SimulatedEngine] = {}  # live ones, by model name
        self.loads = 0
        self._owners = itertools.count()

    async def keep_spare(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()  # a simulated load has nothing to start ahead

    def behaviour_for(self, spec: LoadSpec) -> SimulatedBehaviour:
        return self.models.get(spec.name) or self.models.get(spec.model_path) or self.default

    async def _memory(self, spec: LoadSpec, info: GGUFInfo) -> MemoryUsage:
        options = MemoryOptions(
            num_ctx=spec.num_ctx,
            num_parallel=spec.num_parallel,
            num_batch=spec.num_batch,
            kv_cache_type=spec.kv_cache_type,
            kv_cache_type_k=spec.kv_cache_type_k,
            kv_cache_type_v=spec.kv_cache_type_v,
            flash_attention=spec.flash_attention,
            projector=projector_bytes(await read_model_info(spec.projector))
            if spec.projector
            else 0,
        )
        if spec.draft_model:
            draft = draft_bytes(await read_model_info(spec.draft_model), options)
            options = replace(options, draft=draft)
        est = estimate(info, options)
        if not spec.gpu_ids or spec.num_gpu == 0 or self._devices is None:
            return MemoryUsage(total=est.total)
        inventory = await self._devices.inventory()
        free = {g.id: g.free for g in inventory.gpus}
        reserves = {g.id: gpu_context_reserve(g.library) for g in inventory.gpus}
        factor = self.behaviour_for(spec).vram_factor
        layout = plan_layout(
            est,
            [(g, free.get(g, 0)) for g in spec.gpu_ids],
            num_gpu=spec.num_gpu,
            reserves=reserves,
            factors=dict.fromkeys(spec.gpu_ids, factor),
        )
        vram = {k: v for k, v in layout.vram_by_gpu.items() if v > 0}
        return MemoryUsage(total=layout.host_bytes + sum(vram.values()), vram_by_gpu=vram)

    @asynccontextmanager
    async def open(
        self, spec: LoadSpec, *, progress: LoadProgress | None = None
    ) -> AsyncIterator[SimulatedEngine]:
        behaviour = self.behaviour_for(spec)
        info = await read_model_info(spec.model_path)
        self.loads += 1
        await _load(info.file_size, behaviour, progress)
        if behaviour.fail_load == "oom":
            raise OutOfMemoryError(f"{spec.name}: cudaMalloc failed: out of memory")
        if behaviour.fail_load:
            raise RunnerStartError(f"{spec.name}: llama_model_load: error loading model")
        memory = await self._memory(spec, info)
        owner = f"{spec.name}#{next(self._owners)}"
        devices = self._devices

        def book_cache(held: int) -> None:  # the cache's host RAM, as the runner's would be
            if devices is not None:
                devices.release(f"{owner}/prompt-cache")
                devices.allocate_host(f"{owner}/prompt-cache", held)

        engine = SimulatedEngine(spec, info, memory, behaviour, book_cache)
        try:
            if self._devices is not None:
                for gpu_id, nbytes in memory.vram_by_gpu.items():
                    self._devices.allocate(owner, gpu_id, nbytes)
                self._devices.allocate_host(owner, memory.total - memory.vram)
            self.engines[spec.name] = engine
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_for_crash, engine, nursery.cancel_scope)
                try:
                    yield engine
                finally:
                    nursery.cancel_scope.cancel()
            if engine._crashed.is_set():
                raise RunnerCrashedError(f"runner for {spec.name} crashed (SIGABRT)", -6)
        finally:
            if self.engines.get(spec.name) is engine:
                del self.engines[spec.name]
            if self._devices is not None:
                self._devices.release(owner)
                self._devices.release(f"{owner}/prompt-cache")


def _prompt(request: CompletionRequest) -> str:
    """What the simulated model reads: the prompt, or the messages' text joined."""
    return request.prompt or " ".join(m.content for m in request.messages or ())


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _prompt_tokens(prompt: str) -> int:
    """A simulated prompt's tokens: its words, at least one."""
    return max(1, len(prompt.split()))


async def _load(total: int, behaviour: SimulatedBehaviour, progress: LoadProgress | None) -> None:
    """Take ``load_seconds``, reading the file in equal steps; a failing load fails halfway."""
    steps = LOAD_STEPS // 2 if behaviour.fail_load else LOAD_STEPS
    for step in range(steps + 1):
        if progress is not None:
            progress(total * step // LOAD_STEPS, total)
        if step < steps:
            await trio.sleep(behaviour.load_seconds / LOAD_STEPS)
    if behaviour.fail_load:
        await trio.sleep(behaviour.load_seconds / 2)


async def _watch_for_crash(engine: SimulatedEngine, scope: trio.CancelScope) -> None:
    await engine._crashed.wait()
    scope.cancel()  # the model is gone: cancel whatever the opener is doing with it
