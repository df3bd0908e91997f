"""A runner's CPU threads changed while it runs (runner/threads.py, runner/import_slot.py):
on the real engine, in a process of its own and through the process engine."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import xllamacpp.xllamacpp as engine_module

from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.runner.import_slot import ImportSlotError, import_slot
from ollamatrio.runner.threads import ENTRY, ThreadShare
from ollamatrio.types import CompletionRequest, LoadSpec

REPO = Path(__file__).resolve().parent.parent
TinyGGUF = Callable[..., Path]

# Loads a model in this process, puts a ThreadShare in front of GOMP_parallel, and decodes
# at each limit: every region must get the limit, and the text must not change.
_SCRIPT = """
import json, os, sys
import xllamacpp as xlc, xllamacpp.xllamacpp as engine
from ollamatrio.runner.threads import share_threads
p = xlc.CommonParams()
p.model.path = sys.argv[1]
p.n_ctx = 256
p.warmup = False
p.verbosity = -1
p.cpuparams.n_threads = p.cpuparams_batch.n_threads = 2
server = xlc.Server(p)
share = share_threads(engine.__file__, 2)
for limit in (2, 1, 5):
    share.set(limit)
    regions = share.regions
    body = {"prompt": "a b c", "n_predict": 6, "temperature": 0, "ignore_eos": True}
    answer = server.handle_completions(body)
    print(json.dumps({"limit": share.limit, "granted": share.granted,
                      "regions": share.regions - regions,
                      "text": answer["choices"][0]["text"]}), flush=True)
os._exit(0)
"""


def test_the_engines_parallel_regions_get_the_limit_and_compute_the_same(tiny_gguf: TinyGGUF):
    model = tiny_gguf()
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(model)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    runs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(r["limit"], r["granted"]) for r in runs] == [(2, 2), (1, 1), (2, 2)]  # 5: capped
    assert all(r["regions"] >= 6 for r in runs)  # a region per decoded token at least
    assert len({r["text"] for r in runs}) == 1


def test_the_engine_imports_the_entry_through_a_slot_and_a_missing_one_is_an_error():
    slot = import_slot(str(engine_module.__file__), ENTRY)
    assert slot.value  # filled by the dynamic linker (or its lazy stub)
    with pytest.raises(ImportSlotError, match="does not import"):
        import_slot(str(engine_module.__file__), "no_such_function_anywhere")
    with pytest.raises(ImportSlotError, match="ELF64"):
        import_slot(__file__, ENTRY)


def test_a_share_stays_between_one_thread_and_the_engines_own_count():
    share = ThreadShare(opener=None, threads=4)
    share.set(0)
    assert share.limit == 1
    share.set(9)
    assert share.limit == 4


def test_a_share_acts_on_the_clients_lines_and_ignores_anything_else():
    share = ThreadShare(opener=None, threads=4)
    assert share.apply(b'{"threads": 1}') == "threads 4 -> 1"
    assert share.apply(b'{"threads": 1}') is None  # no change, nothing to log
    for junk in (b"", b"threads", b'{"thread": 2}', b'{"threads": "x"}', b"[1]"):
        assert share.apply(junk).startswith("ignored a command")  # type: ignore[union-attr]
        assert share.limit == 1


async def test_a_runner_reports_its_pool_and_takes_a_smaller_count(tiny_gguf: TinyGGUF):
    factory = ProcessEngineFactory(kill_grace=2.0)
    spec = LoadSpec(model_path=str(tiny_gguf()), name="tiny", num_ctx=256, cores=2)
    with trio.fail_after(60):
        async with factory.open(spec) as engine:
            assert (engine.thread_pool, engine.threads) == (2, 2)
            await engine.use_threads(1)
            assert engine.threads == 1
            request = CompletionRequest(prompt="a b", options={"num_predict": 3})
            async with engine.complete(request) as stream:
                final = [chunk async for chunk in stream][-1]
            assert final.eval_count == 3


async def test_an_explicit_num_thread_is_fixed(tiny_gguf: TinyGGUF):
    factory = ProcessEngineFactory(kill_grace=2.0)
    spec = LoadSpec(model_path=str(tiny_gguf()), name="tiny", num_ctx=256, num_thread=1)
    with trio.fail_after(60):
        async with factory.open(spec) as engine:
            assert (engine.thread_pool, engine.threads) == (0, 1)
            await engine.use_threads(2)
            assert engine.threads == 1
