"""Quantized and converted models loaded by real llama.cpp runners: a tiny Hugging Face
folder created through the CLI (``FROM ./folder``, with and without ``-q``), and (slow)
SmolLM2 in F16 quantized to Q8_0, and SmolLM2's real tokenizer carried through a
safetensors import."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from gguf import GGMLQuantizationType

from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.testing.float_copy import write_f16_copy
from ollamatrio.testing.tiny_hf import (
    tokenizer_from_gguf,
    tokenizer_from_vocabulary,
    write_tiny_hf,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cli import cli

T = GGMLQuantizationType


@pytest.fixture(scope="session")
def smollm2_f16(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 with every matrix dequantized to F16: a float model to quantize, made once
    per session."""
    folder = tmp_path_factory.mktemp("smollm2_f16")
    return write_f16_copy(smollm2_path, folder / "SmolLM2-135M-Instruct.F16.gguf")


async def _generate(c: httpx.AsyncClient, model: str, prompt: str, **options: Any) -> Any:
    body = {"model": model, "prompt": prompt, "raw": True, "stream": False, "options": options}
    r = await c.post("/api/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def test_a_safetensors_folder_created_by_the_cli_answers(
    api_server: Any, tmp_path: Path
) -> None:
    """``ollamatrio create`` from a Modelfile's ``FROM ./my-finetune`` (BF16, Llama 3.1's
    rope scaling): the folder's files are uploaded, converted (and with ``-q q4_0``
    quantized), and the result answers."""
    work = tmp_path / "work"
    llama_3_1 = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}  # rope_freqs.weight
    write_tiny_hf(
        work / "my-finetune", tokenizer_from_vocabulary(), dtype="bf16", config_extra=llama_3_1
    )
    (work / "Modelfile").write_text("FROM ./my-finetune\n")
    modelfile = str(work / "Modelfile")
    with trio.fail_after(180):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=None) as c,
        ):
            plain = await cli(srv.url, "create", "finetune", "-f", modelfile)
            assert plain.returncode == 0, plain.stderr
            small = await cli(srv.url, "create", "finetune:q4", "-q", "q4_0", "-f", modelfile)
            assert small.returncode == 0, small.stderr
            assert "converting model" in plain.stderr.decode()
            assert "quantizing BF16 model to Q4_0" in small.stderr.decode()
            tags = {m["name"]: m for m in (await c.get("/api/tags")).json()["models"]}
            assert tags["finetune:latest"]["details"]["quantization_level"] == "BF16"
            assert tags["finetune:q4"]["details"]["quantization_level"] == "Q4_0"
            assert tags["finetune:q4"]["size"] < tags["finetune:latest"]["size"]
            for name in ("finetune", "finetune:q4"):
                answer = await _generate(c, name, "hello", num_predict=4, ignore_eos=True)
                assert answer["eval_count"] == 4, answer
                assert answer["done_reason"] == "length"
            refused = await cli(srv.url, "create", "x", "-q", "q6_K", "-f", modelfile)
            assert refused.returncode == 1
            assert "unsupported quantization type Q6_K - supported types are" in (
                refused.stderr.decode()
            )


@pytest.mark.slow
async def test_smollm2_quantized_to_q8_0_answers(api_server: Any, smollm2_f16: Path) -> None:
    """F16 SmolLM2 quantized on create: Ollama's progress lines, the Q8_0 size and level
    in ``/api/tags``, and the fact the model knows.  (Its chat answer at temperature 0
    without the demo's system prompt is as odd as the published Q4_1 file's: the matrix
    products of quantized weights round the activations too, F16 ones do not.)"""
    with trio.fail_after(600):
        async with (
            api_server(
                engines=ProcessEngineFactory(load_timeout=120), models={"smol-f16": smollm2_f16}
            ) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=None) as c,
        ):
            body = {"model": "smol-q8", "from": "smol-f16", "quantize": "q8_0"}
            async with c.stream("POST", "/api/create", json=body) as r:
                lines = [json.loads(line) async for line in r.aiter_lines() if line]
            statuses = [line["status"] for line in lines]
            assert "quantizing F16 model to Q8_0" in statuses
            assert statuses[-1] == "success", lines
            tags = {m["name"]: m for m in (await c.get("/api/tags")).json()["models"]}
            q8, f16 = tags["smol-q8:latest"], tags["smol-f16:latest"]
            assert q8["details"]["quantization_level"] == "Q8_0"
            assert 0.5 < q8["size"] / f16["size"] < 0.6  # 8.5 bits a value, 16 before
            answer = await _generate(c, "smol-q8", "The capital of France is", num_predict=4,
                                     temperature=0)  # fmt: skip
            assert "Paris" in answer["response"], answer


@pytest.mark.slow
async def test_smollm2_quantized_to_q4_k_m_answers(
    api_server: Any, smollm2_f16: Path, tmp_path: Path
) -> None:
    """F16 SmolLM2 to Q4_K_M, made by ggml in the engine's library: Ollama's mix (rows of
    576 values are not whole 256-value blocks, so those matrices fall back to Q5_0 and
    attn_v to Q8_0; the feed-forward's down projection, rows of 1536, gets Q4_K or Q6_K),
    the level in ``/api/tags``, and the model still knows the fact."""
    from ollamatrio.gguf import read_gguf

    with trio.fail_after(600):
        async with (
            api_server(
                engines=ProcessEngineFactory(load_timeout=120), models={"smol-f16": smollm2_f16}
            ) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=None) as c,
        ):
            body = {"model": "smol-q4km", "from": "smol-f16", "quantize": "q4_K_M"}
            async with c.stream("POST", "/api/create", json=body) as r:
                lines = [json.loads(line) async for line in r.aiter_lines() if line]
            statuses = [line["status"] for line in lines]
            assert "quantizing F16 model to Q4_K_M" in statuses
            assert statuses[-1] == "success", lines
            tags = {m["name"]: m for m in (await c.get("/api/tags")).json()["models"]}
            q4, f16 = tags["smol-q4km:latest"], tags["smol-f16:latest"]
            assert q4["details"]["quantization_level"] == "Q4_K_M"
            assert q4["size"] / f16["size"] < 0.45
            shown = (await c.post("/api/show", json={"model": "smol-q4km"})).json()
            assert shown["details"]["quantization_level"] == "Q4_K_M"
            answer = await _generate(c, "smol-q4km", "The capital of France is", num_predict=4,
                                     temperature=0)  # fmt: skip
            assert "Paris" in answer["response"], answer
            model_blob = srv.store.resolve("smol-q4km").model_path
            assert model_blob is not None
            types = {t.name: t.type for t in read_gguf(model_blob, cache=False).tensors}
            assert types["blk.0.ffn_down.weight"] == T.Q6_K
            assert types["blk.4.ffn_down.weight"] == T.Q4_K
            assert types["blk.0.attn_q.weight"] == T.Q5_0
            assert types["blk.0.attn_v.weight"] == T.Q8_0
            assert types["token_embd.weight"] == T.Q8_0  # tied output, rows of 576


@pytest.mark.slow
async def test_smollm2_tokenizer_survives_the_safetensors_import(
    api_server: Any, smollm2_path: Path, tmp_path: Path
) -> None:
    """A random-weight model with SmolLM2's real tokenizer (tokenizer.json written from
    its GGUF): llama.cpp loads it and reads a prompt as the same tokens as SmolLM2 does."""
    files = write_tiny_hf(tmp_path / "hf", tokenizer_from_gguf(smollm2_path), tie_embeddings=True)
    prompt = "Hello world! The year 2024, naïve café: <|im_start|>user\nHi<|im_end|>"
    with trio.fail_after(600):
        async with (
            api_server(
                engines=ProcessEngineFactory(load_timeout=120), models={"smol": smollm2_path}
            ) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=None) as c,
        ):
            digests = {}
            for name, path in files.items():
                data = path.read_bytes()
                digests[name] = "sha256:" + hashlib.sha256(data).hexdigest()
                r = await c.post(f"/api/blobs/{digests[name]}", content=data)
                assert r.status_code == 201, r.text
            r = await c.post(
                "/api/create", json={"model": "random", "files": digests, "stream": False}
            )
            assert r.status_code == 200, r.text
            real = await _generate(c, "smol", prompt, num_predict=1)
            random = await _generate(c, "random", prompt, num_predict=3, ignore_eos=True)
            assert random["prompt_eval_count"] == real["prompt_eval_count"]
            assert random["eval_count"] == 3
            shown = (await c.post("/api/show", json={"model": "random"})).json()
            assert shown["model_info"]["tokenizer.ggml.pre"] == "smollm"


async def test_a_qwen2_folder_answers(api_server: Any, tmp_path: Path) -> None:
    """The Qwen2 layout (q/k/v biases, rotary halves stored as llama.cpp reads them)
    converted through ``/api/create`` with ``files`` loads and generates."""
    files = write_tiny_hf(tmp_path / "qwen", tokenizer_from_vocabulary(),
                          architecture="Qwen2ForCausalLM", dtype="f16")  # fmt: skip
    with trio.fail_after(180):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=None) as c,
        ):
            digests = {}
            for name, path in files.items():
                data = path.read_bytes()
                digests[name] = "sha256:" + hashlib.sha256(data).hexdigest()
                r = await c.post(f"/api/blobs/{digests[name]}", content=data)
                assert r.status_code == 201, r.text
            body = {"model": "qwen", "files": digests, "quantize": "q8_0", "stream": False}
            r = await c.post("/api/create", json=body)
            assert r.status_code == 200, r.text
            shown = (await c.post("/api/show", json={"model": "qwen"})).json()
            assert shown["details"]["family"] == "qwen2"
            assert shown["details"]["quantization_level"] == "Q8_0"
            answer = await _generate(c, "qwen", "hello", num_predict=4, ignore_eos=True)
            assert answer["eval_count"] == 4, answer
