"""Speculative decoding in a real runner (SmolLM2): n-gram drafting changes the cost of an
answer, never the answer.

The check that would catch a broken verifier: the drafting runner's greedy answer is
replayed token by token against a runner that does not draft, each token asked of it
with the answer so far as the prompt (teacher forcing).  A verifier that let drafts through
unchecked would put drafted tokens where the model would have chosen another; the prompt
is one where drafts are proposed and some are rejected, so such tokens would be there to
find.  The tolerance: llama.cpp's logits depend a little on the batch a token is evaluated
in (verification evaluates drafts as one batch), so a token may differ from the replay's
where the two best candidates are within :data:`TIE_NATS` of each other, and nowhere else
(measured on SmolLM2: one such place in this answer, by 0.104 nats, where the runner without
a drafter had written the same token as the drafting one).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from helpers.runner_process import RawRunner, start_raw_runner

from ollamatrio.engines.runner_client import open_runner_http
from ollamatrio.engines.runner_http import RunnerHttp
from ollamatrio.types import LoadSpec

pytestmark = pytest.mark.slow

TIE_NATS = 0.25  # a logprob gap this small between the best two tokens is a tie
ANSWER_TOKENS = 96

# A function quoted once, and a diff asked for: the answer quotes the function's lines (drafts
# pay) and departs from them where the change goes and where the diff's own markup begins
# (drafts there are wrong and must be rejected).
FILE = """def host_bytes(pid: int = 0) -> int:
    \"\"\"Resident memory of the process, without the file pages it maps.\"\"\"
    info = psutil.Process(pid or os.getpid()).memory_full_info()
    return int(info.uss)


def vram_by_gpu(pid: int) -> dict[str, int]:
    \"\"\"Bytes of GPU memory the process holds, per device id; empty without NVML.\"\"\"
    used: dict[str, int] = {}
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory:
                used[uuid] = used.get(uuid, 0) + proc.usedGpuMemory
    return used
"""
PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nHere is a function:\n```python\n" + FILE + "```\n"
    "Write a unified diff that renames `vram_by_gpu` to `gpu_memory_by_pid`. "
    "Quote the context lines of the original.<|im_end|>\n<|im_start|>assistant\n"
)


@dataclass
class Pair:
    plain: RawRunner
    drafting: RawRunner


@pytest.fixture(scope="module")
def runners(smollm2_path: Path) -> Iterator[Pair]:
    def start(drafter: str) -> RawRunner:
        spec = LoadSpec(
            model_path=str(smollm2_path), name="smollm2", num_ctx=2048, speculative=drafter
        )
        runner = start_raw_runner(spec)
        assert runner.ready["event"] == "ready", runner.ready
        return runner

    pair = Pair(start("none"), start("ngram"))
    yield pair
    pair.plain.stop()
    pair.drafting.stop()


@pytest.fixture
async def http(runners: Pair) -> AsyncIterator[tuple[RunnerHttp, RunnerHttp]]:
    async with (
        open_runner_http(runners.plain.socket, runners.plain.config.api_key) as plain,
        open_runner_http(runners.drafting.socket, runners.drafting.config.api_key) as drafting,
    ):
        yield plain, drafting


async def post(http: RunnerHttp, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, raw = await http.request("POST", path, json.dumps(body).encode())
    assert status == 200, raw[:300]
    answer: dict[str, Any] = json.loads(raw)
    return answer


async def greedy(http: RunnerHttp, prompt: list[int], n: int, **extra: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": True}
    return await post(http, "/completion", {**body, "return_tokens": True, **extra})


async def test_a_drafted_answer_is_the_models_own_token_by_token(
    http: tuple[RunnerHttp, RunnerHttp],
) -> None:
    plain, drafting = http
    with trio.fail_after(600):
        tokenized = await post(plain, "/tokenize", {"content": PROMPT, "add_special": True})
        prompt = [int(t) for t in tokenized["tokens"]]
        drafted = await greedy(drafting, prompt, ANSWER_TOKENS)
        answer = [int(t) for t in drafted["tokens"]]
        timings = drafted["timings"]
        # The test has teeth only if drafts were proposed and some of them were wrong.
        assert timings["draft_n"] > timings["draft_n_accepted"] > 0, timings

        ties = []
        for i, token in enumerate(answer):
            step = await greedy(plain, prompt + answer[:i], 1, n_probs=2)
            if int(step["tokens"][0]) == token:
                continue
            top = step["completion_probabilities"][0]["top_logprobs"]
            logprob = {int(t["id"]): float(t["logprob"]) for t in top}
            assert token in logprob, f"token {i} ({token}) is not among the model's best two"
            gap = max(logprob.values()) - logprob[token]
            assert gap < TIE_NATS, f"token {i} ({token}) lost to another by {gap:.3f} nats"
            ties.append(i)
    # Where the texts part, if they do: how often is printed with -rA for the record.
    print(f"{len(answer)} tokens, {len(ties)} near-ties taken otherwise: {ties}; {timings}")


async def test_greedy_answers_with_and_without_drafting_agree(
    http: tuple[RunnerHttp, RunnerHttp],
) -> None:
    plain, drafting = http
    with trio.fail_after(600):
        tokenized = await post(plain, "/tokenize", {"content": PROMPT, "add_special": True})
        prompt = [int(t) for t in tokenized["tokens"]]
        without = (await greedy(plain, prompt, ANSWER_TOKENS))["tokens"]
        with_drafts = await greedy(drafting, prompt, ANSWER_TOKENS)
    same = next(
        (i for i, (a, b) in enumerate(zip(without, with_drafts["tokens"], strict=False)) if a != b),
        len(without),
    )
    # Identical up to a near-tie at most (the teacher-forced test checks every token); here
    # the whole answer, as measured on SmolLM2 (docs/speculative.md).
    assert same >= len(without) // 2, (same, with_drafts["timings"])
    print(f"texts agree for {same} of {len(without)} tokens; {with_drafts['timings']}")


async def test_prose_drafts_little(http: tuple[RunnerHttp, RunnerHttp]) -> None:
    # The adaptive side: text that repeats nothing of its context gives the drafter no key
    # to match, so it drafts (almost) nothing and costs (almost) nothing.
    _, drafting = http
    story = (
        "<|im_start|>user\nWrite a story about a lighthouse keeper in a storm.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with trio.fail_after(300):
        answer = await post(
            drafting, "/completion",
            {"prompt": story, "n_predict": ANSWER_TOKENS, "temperature": 0},
        )  # fmt: skip
    timings = answer["timings"]
    # llama.cpp leaves draft_n out of the timings of a request that drafted nothing.
    assert timings.get("draft_n", 0) <= timings["predicted_n"] // 4, timings


def test_drafting_survives_a_context_shift(smollm2_path: Path) -> None:
    # Context shift is on by default (Ollama's B27, docs/behaviours.md); llama.cpp's map
    # drafters abort the runner after one, so the drafter chosen must not.
    spec = LoadSpec(model_path=str(smollm2_path), name="smollm2", num_ctx=128, speculative="ngram")
    runner = start_raw_runner(spec)
    try:
        assert runner.ready["event"] == "ready", runner.ready

        async def generate() -> dict[str, Any]:
            async with open_runner_http(runner.socket, runner.config.api_key) as http:
                body = {"prompt": " ".join(map(str, range(1, 26))), "n_predict": 300,
                        "temperature": 0, "ignore_eos": True}  # fmt: skip
                return await post(http, "/completion", body)

        answer = trio.run(generate)
        assert answer["timings"]["predicted_n"] == 300  # past the context, shifted
        assert runner.process.poll() is None  # still running
    finally:
        runner.stop()


NATO = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike "
    "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
)


async def test_drafts_the_model_refuses_are_never_accepted_and_stay_rare(
    http: tuple[RunnerHttp, RunnerHttp],
) -> None:
    # The passage is in the context, and the answer starts copying it; every token of its
    # second half is banned (logit bias), so each draft of it must be rejected at its first
    # token.  Accepted must stay 0 (a verifier that let drafts through would accept them),
    # and drafting needs 12 fresh tokens matching the context before each try.
    plain, drafting = http
    lead = "<|im_start|>user\nSpell the alphabet.<|im_end|>\n<|im_start|>assistant\n"
    with trio.fail_after(600):
        lead_ids = (await post(plain, "/tokenize", {"content": lead, "add_special": True}))[
            "tokens"
        ]
        passage = (await post(plain, "/tokenize", {"content": " " + NATO}))["tokens"]
        half = len(passage) // 2
        allowed = set(passage[: half + 1])
        banned = sorted(set(passage[half + 1 :]) - allowed)
        prompt = [*lead_ids, *passage, *passage[:half]]
        answer = await greedy(
            drafting, prompt, ANSWER_TOKENS, logit_bias=[[t, False] for t in banned]
        )
    timings = answer["timings"]
    assert not set(answer["tokens"]) & set(banned)
    assert timings.get("draft_n", 0) > 0, timings  # the passage was drafted, so it was tried
    assert timings.get("draft_n_accepted", 0) == 0, timings
    # Measured: one draft of 48 tokens, rejected, then none (the answer left the passage and
    # no 12 tokens of it matched the context again).  The bound allows a model that re-enters
    # the passage: one try per 12 tokens written.
    tries = 1 + timings["predicted_n"] // 12
    assert timings["draft_n"] <= 48 * tries, timings
    print(f"drafted {timings['draft_n']}, accepted 0, in {timings['predicted_n']} tokens")
