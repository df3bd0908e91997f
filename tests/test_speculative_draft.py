"""Speculative decoding by a model: the DRAFT layer through create, show, copy, delete and
prune; the vocabulary check; ``draft_num_predict`` and ``speculative`` at load; memory and
placement; the runner's llama.cpp parameters; MTP heads; and (slow, real runners) SmolLM2
drafting for itself with the same greedy text as without."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ollamatrio.errors import InvalidRequestError, NoSuchModelError
from ollamatrio.gguf import GGMLQuantizationType, GGUFInfo, TensorInfo, read_gguf
from ollamatrio.gguf.speculation import has_mtp_heads, vocabulary_mismatch
from ollamatrio.memory import MemoryOptions, draft_bytes, estimate, plan_layout
from ollamatrio.modelfile import parse_modelfile
from ollamatrio.scheduler.options import (
    DEFAULT_DRAFT_NUM_PREDICT,
    draft_num_predict,
    needs_reload,
    resolve_load_options,
)
from ollamatrio.store import MEDIA_DRAFT, ModelStore, create_model
from ollamatrio.testing.vocab import build_vocabulary
from ollamatrio.types import LoadSpec

TinyGGUF = Callable[..., Path]
MiB = 1 << 20
DRAFT_LAYERS = 1  # the tiny draft: one block, the target's vocabulary


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def upload(store: ModelStore, path: Path) -> str:
    digest = sha(path.read_bytes())
    store.write_blob(digest, [path.read_bytes()])
    return digest


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


def create(store: ModelStore, name: str, **kwargs: Any) -> None:
    for _ in create_model(store, name, **kwargs):
        pass


def with_draft(store: ModelStore, tiny_gguf: TinyGGUF, name: str = "spec") -> str:
    """``name`` created from the tiny model and the tiny draft's file; the draft's digest."""
    target = upload(store, tiny_gguf())
    draft = upload(store, tiny_gguf(layers=DRAFT_LAYERS, name="tiny-draft"))
    create(store, name, files={"t.gguf": target}, draft_files={"d.gguf": draft})
    return draft


# -- the store ------------------------------------------------------------------------


def test_create_stores_the_draft_as_its_own_layer(store: ModelStore, tiny_gguf: TinyGGUF) -> None:
    draft = with_draft(store, tiny_gguf)
    model = store.resolve("spec")
    assert MEDIA_DRAFT == "application/vnd.ollama.image.draft"  # Ollama's media type
    assert [layer.media_type.rsplit(".", 1)[1] for layer in model.manifest.layers] == [
        "model",
        "draft",
    ]
    assert model.drafts == (store.blob_path(draft),)
    assert model.model_path != store.blob_path(draft)
    # Ollama's config field; the draft is no family of the model's.
    assert model.config["draft"] == {"model_format": "gguf", "architecture": "llama"}
    assert model.details.families == ("llama",)


def test_a_stored_model_named_as_draft_lends_its_weights(
    store: ModelStore, tiny_gguf: TinyGGUF
) -> None:
    create(store, "base", files={"t.gguf": upload(store, tiny_gguf())})
    create(store, "small", files={"d.gguf": upload(store, tiny_gguf(layers=DRAFT_LAYERS))})
    create(store, "spec", from_model="base", draft="small")
    model = store.resolve("spec")
    (layer,) = [layer for layer in model.manifest.layers if layer.media_type == MEDIA_DRAFT]
    assert layer.from_ == "small:latest"
    assert model.drafts == (store.resolve("small").model_path,)
    with pytest.raises(NoSuchModelError, match='draft model "nope" not found'):
        create(store, "x", from_model="base", draft="nope")
    with pytest.raises(InvalidRequestError, match="either draft_files or draft"):
        create(store, "x", from_model="base", draft="small", draft_files={"d.gguf": layer.digest})


def test_a_model_made_from_one_with_a_draft_keeps_it_unless_given_another(
    store: ModelStore, tiny_gguf: TinyGGUF
) -> None:
    with_draft(store, tiny_gguf)
    parent = store.resolve("spec")
    create(store, "child", from_model="spec", system="be brief")
    child = store.resolve("child")
    assert child.drafts == parent.drafts
    assert child.config["draft"] == parent.config["draft"]
    other = upload(store, tiny_gguf(layers=DRAFT_LAYERS, embd=32, heads=2))
    create(store, "other", from_model="spec", draft_files={"o.gguf": other})
    assert store.resolve("other").drafts == (store.blob_path(other),)  # one draft, the new one


def test_copy_delete_and_prune_keep_the_draft_while_a_model_names_it(
    store: ModelStore, tiny_gguf: TinyGGUF
) -> None:
    draft = with_draft(store, tiny_gguf)
    store.copy("spec", "copy")
    assert store.resolve("copy").drafts == (store.blob_path(draft),)
    store.delete("spec")
    store.prune()
    assert store.blob_path(draft).exists()
    store.delete("copy")
    assert not store.blob_path(draft).exists()


# -- the vocabulary check ---------------------------------------------------------------


def changed_token(index: int, text: str) -> dict[str, Any]:
    tokens = build_vocabulary("llama", 300).tokens
    tokens[index] = text
    return {"tokenizer.ggml.tokens": tokens}


MISMATCHES = [
    ("tokenizer", {"tokenizer": "gpt2"}, "tokenizer model 'gpt2' differs from 'llama'"),
    ("size", {"vocab": 600}, "vocabulary size 600 differs from 300"),
    ("bos", {"extra_metadata": {"tokenizer.ggml.bos_token_id": 7}},
        "tokenizer.ggml.bos_token_id 7 differs from 1"),
    ("token", {"extra_metadata": changed_token(100, "zebra")},
        "token 100 is 'zebra', not '<0x61>'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "reason"), [m[1:] for m in MISMATCHES], ids=[m[0] for m in MISMATCHES]
)
def test_a_draft_with_another_vocabulary_is_a_400_naming_the_difference(
    store: ModelStore, tiny_gguf: TinyGGUF, kwargs: dict[str, Any], reason: str
) -> None:
    target = upload(store, tiny_gguf())
    draft = upload(store, tiny_gguf(layers=DRAFT_LAYERS, **kwargs))
    with pytest.raises(InvalidRequestError) as caught:
        create(store, "spec", files={"t.gguf": target}, draft_files={"odd.gguf": draft})
    assert str(caught.value) == (
        f'draft model "odd.gguf" does not share the model\'s vocabulary: {reason}'
    )
    assert not store.exists("spec")


def test_a_vocabulary_padded_by_a_few_tokens_still_drafts(tiny_gguf: TinyGGUF) -> None:
    # llama.cpp allows up to 128 extra tokens (a family's padding).
    target = read_gguf(tiny_gguf())
    assert vocabulary_mismatch(target, read_gguf(tiny_gguf(vocab=428))) is None
    assert vocabulary_mismatch(target, read_gguf(tiny_gguf(vocab=429))) is not None


# -- MTP heads ----------------------------------------------------------------------------


def header(arch: str, metadata: dict[str, Any], tensors: tuple[str, ...] = ()) -> GGUFInfo:
    return GGUFInfo(
        path=Path("m.gguf"), version=3, file_size=0, data_offset=0, alignment=32,
        metadata={"general.architecture": arch, **metadata},
        tensors=tuple(
            TensorInfo(name, GGMLQuantizationType.F32, (4,), 0, 16, None) for name in tensors
        ),
    )  # fmt: skip


def test_mtp_heads_are_found_by_key_or_by_tensor_name() -> None:
    assert has_mtp_heads(header("glm4moe", {"glm4moe.nextn_predict_layers": 1}))
    assert not has_mtp_heads(header("glm4moe", {"glm4moe.nextn_predict_layers": 0}))
    assert has_mtp_heads(header("deepseek2", {}, ("blk.61.nextn.eh_proj.weight",)))
    assert has_mtp_heads(header("qwen35", {}, ("mtp.fc.weight",)))
    assert not has_mtp_heads(header("llama", {}, ("blk.0.attn_q.weight",)))


# -- load options --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "has_drafter", "configured", "wanted"),
    [
        ({}, True, None, DEFAULT_DRAFT_NUM_PREDICT),  # Ollama's default with a drafter
        ({}, False, None, 0),  # nothing to draft with
        ({"draft_num_predict": 8}, False, None, 0),
        ({"draft_num_predict": 8}, True, None, 8),
        ({}, True, 6, 6),  # the model's TOML value
        ({"draft_num_predict": 2}, True, 6, 2),  # the request's still wins
        ({"draft_num_predict": 0}, True, None, 0),  # off
        ({"speculative": "auto", "draft_num_predict": 3}, True, None, 3),
    ],
)
def test_draft_num_predict(
    options: dict[str, Any], has_drafter: bool, configured: int | None, wanted: int
) -> None:
    assert draft_num_predict(options, has_drafter=has_drafter, configured=configured) == wanted


def test_another_draft_num_predict_reloads() -> None:
    def load(options: dict[str, Any]) -> Any:
        return resolve_load_options(
            options, default_num_ctx=2048, context_length_configured=False, train_ctx=8192,
            num_parallel=1, embedding_only=False, has_draft_model=True,
        )  # fmt: skip

    assert not needs_reload(load({}), load({"draft_num_predict": 4}))
    assert needs_reload(load({}), load({"draft_num_predict": 5}))
    assert needs_reload(load({}), load({"speculative": "off"}))


# -- memory and placement -----------------------------------------------------------------


def test_the_draft_shares_the_first_gpu_only_when_the_whole_model_fits_beside_it(
    tiny_gguf: TinyGGUF,
) -> None:
    options = MemoryOptions(num_ctx=2048)
    draft = draft_bytes(read_gguf(tiny_gguf(layers=DRAFT_LAYERS)), options)
    alone = estimate(read_gguf(tiny_gguf()), options)
    est = estimate(read_gguf(tiny_gguf()), MemoryOptions(num_ctx=2048, draft=draft))
    assert draft > 0
    assert est.total == alone.total + draft  # a CPU-only load holds both

    roomy = plan_layout(est, [("gpu0", 1 << 30)])
    assert roomy.fits_fully
    assert roomy.draft_on_gpu
    assert roomy.vram == plan_layout(alone, [("gpu0", 1 << 30)]).vram + draft

    # Room for the model, not for both: the draft goes to the CPU, the layers stay.
    just = plan_layout(alone, [("gpu0", 1 << 30)]).vram + draft // 2
    tight = plan_layout(est, [("gpu0", just)])
    assert tight.fits_fully
    assert not tight.draft_on_gpu
    assert tight.host_bytes == plan_layout(alone, [("gpu0", just)]).host_bytes + draft

    assert plan_layout(est, [("gpu0", 1 << 30)], num_gpu=0).host_bytes == est.total


# -- the runner's parameters ----------------------------------------------------------------


def runner_params(**spec: Any) -> Any:
    import xllamacpp as xlc

    from ollamatrio.runner.llama import build_params
    from ollamatrio.runner.options import ModelFacts, RunnerConfig, plan_load

    load = LoadSpec(model_path="m.gguf", name="m", num_thread=2, **spec)
    # Through the JSON the runner reads on its stdin.
    config = RunnerConfig.from_json(RunnerConfig(spec=load, api_key="k", socket_dir="/t").to_json())
    return xlc, build_params(config, plan_load(config.spec, ModelFacts()))


def test_the_runner_loads_the_draft_model_beside_the_model() -> None:
    xlc, p = runner_params(draft_model="/blobs/d", draft_num_predict=3, draft_gpu_layers=-1)
    kinds = xlc.common_speculative_type
    assert p.speculative.types == [kinds.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
    assert p.speculative.draft.mparams.path == "/blobs/d"
    assert p.speculative.draft.n_max == 3
    assert p.speculative.draft.n_gpu_layers == -1
    assert p.speculative.draft.cpuparams.n_threads == 2
    assert not p.load_mtp


def test_the_runner_loads_mtp_heads() -> None:
    xlc, p = runner_params(mtp=True, draft_num_predict=2)
    assert p.load_mtp
    assert p.speculative.types == [xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_MTP]
    assert p.speculative.draft.n_max == 2


def test_the_runner_drafts_nothing_without_a_drafter_or_a_count() -> None:
    none = [__import__("xllamacpp").common_speculative_type.COMMON_SPECULATIVE_TYPE_NONE]
    for spec in ({}, {"draft_model": "/blobs/d", "draft_num_predict": 0}):
        _, p = runner_params(**spec)
        assert p.speculative.types == none
        assert not p.load_mtp


# -- the API (simulated engine) ---------------------------------------------------------------


async def upload_plan(c: httpx.AsyncClient, text: str, folder: Path, name: str) -> httpx.Response:
    """What ``ollama create -f`` does with Modelfile text: upload the files, then create."""
    plan = await trio.to_thread.run_sync(parse_modelfile(text).to_create_request, folder)
    for blob in plan.uploads:
        r = await c.post(f"/api/blobs/{blob.digest}", content=blob.path.read_bytes())
        assert r.status_code in (200, 201), r.text
    return await c.post("/api/create", json=plan.body(name, stream=False))


async def test_draft_round_trips_through_create_show_copy_and_delete(
    api_server: Any, tiny_gguf: TinyGGUF, tmp_path: Path
) -> None:
    folder = tmp_path / "modelfile"
    folder.mkdir()
    (folder / "draft.gguf").write_bytes(tiny_gguf(layers=DRAFT_LAYERS).read_bytes())
    (folder / "odd.gguf").write_bytes(tiny_gguf(layers=DRAFT_LAYERS, vocab=600).read_bytes())
    with trio.fail_after(60):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
            r = await upload_plan(c, "FROM tiny\nDRAFT ./draft.gguf\n", folder, "spec")
            assert r.status_code == 200, r.text
            draft = srv.store.resolve("spec").drafts[0]
            show = (await c.post("/api/show", json={"model": "spec"})).json()
            assert f"\nDRAFT {draft}\n" in show["modelfile"]
            assert show["draft_info"]["general.architecture"] == "llama"
            assert show["draft_info"]["llama.block_count"] == DRAFT_LAYERS
            plain = (await c.post("/api/show", json={"model": "tiny"})).json()
            assert "DRAFT" not in plain["modelfile"]
            assert "draft_info" not in plain

            r = await c.post("/api/copy", json={"source": "spec", "destination": "dup"})
            assert r.is_success
            dup = (await c.post("/api/show", json={"model": "dup"})).json()
            assert f"\nDRAFT {draft}\n" in dup["modelfile"]
            assert (await c.request("DELETE", "/api/delete", json={"model": "spec"})).is_success
            assert draft.exists()
            assert (await c.request("DELETE", "/api/delete", json={"model": "dup"})).is_success
            assert not draft.exists()

            r = await upload_plan(c, "FROM tiny\nDRAFT odd.gguf\n", folder, "odd")
            assert r.status_code == 400
            assert r.json() == {
                "error": 'draft model "odd.gguf" does not share the model\'s vocabulary: '
                "vocabulary size 600 differs from 300"
            }
            r = await upload_plan(c, "FROM tiny\nDRAFT tiny\n", folder, "self")  # a name
            assert r.status_code == 200, r.text


def runner_spec(srv: Any, model: str) -> LoadSpec:
    (info,) = [i for i in srv.scheduler.ps() if i.name == model]
    spec: LoadSpec = srv.scheduler.runner(info.model_path).spec
    return spec


async def test_the_scheduler_loads_the_draft_as_the_options_say(
    api_server: Any, tiny_gguf: TinyGGUF
) -> None:
    with trio.fail_after(60):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
            draft = await trio.to_thread.run_sync(with_draft, srv.store, tiny_gguf)
            path = str(srv.store.blob_path(draft))

            async def generate(options: dict[str, Any]) -> LoadSpec:
                body = {"model": "spec", "prompt": "hi", "stream": False, "options": options}
                r = await c.post("/api/generate", json={**body, "raw": True})
                assert r.status_code == 200, r.text
                return runner_spec(srv, "spec:latest")

            spec = await generate({"num_predict": 1})
            assert (spec.draft_model, spec.draft_num_predict, spec.mtp) == (path, 4, False)
            with_draft_size = srv.scheduler.ps()[0].size
            spec = await generate({"num_predict": 1, "draft_num_predict": 2})
            assert (spec.draft_model, spec.draft_num_predict) == (path, 2)
            # (The ``speculative`` option's "off" does the same: test_draft_num_predict.)
            spec = await generate({"num_predict": 1, "draft_num_predict": 0})
            assert (spec.draft_model, spec.draft_num_predict) == (None, 0)
            assert srv.scheduler.ps()[0].size < with_draft_size  # the draft is counted


async def test_mtp_heads_are_a_capability_and_get_loaded(
    api_server: Any, tiny_gguf: TinyGGUF
) -> None:
    mtp = tiny_gguf(extra_metadata={"llama.nextn_predict_layers": 1})
    with trio.fail_after(60):
        async with (
            api_server(models={"mtp": mtp}) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=30) as c,
        ):
            show = (await c.post("/api/show", json={"model": "mtp"})).json()
            assert "mtp" in show["capabilities"]
            plain = (await c.post("/api/show", json={"model": "tiny"})).json()
            assert "mtp" not in plain["capabilities"]
            body = {"model": "mtp", "prompt": "hi", "raw": True, "stream": False,
                    "options": {"num_predict": 1}}  # fmt: skip
            assert (await c.post("/api/generate", json=body)).status_code == 200
            spec = runner_spec(srv, "mtp:latest")
            assert (spec.mtp, spec.draft_model, spec.draft_num_predict) == (True, None, 4)


# -- real runners (slow) ------------------------------------------------------------------------


async def test_smollm2_drafting_for_itself_writes_the_same_greedy_text(
    api_server: Any, smollm2_path: Path
) -> None:
    """SmolLM2 is its own draft (the same file: a draft by name); greedy text with the
    draft model equals the text without it, and llama.cpp reports the drafted tokens."""
    from ollamatrio.engines.process import ProcessEngineFactory

    prompt = "def fibonacci(n):\n"
    with trio.fail_after(600):
        async with (
            api_server(
                engines=ProcessEngineFactory(load_timeout=300), models={"smol": smollm2_path}
            ) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=300) as c,
        ):
            r = await c.post(
                "/api/create", json={"model": "smol-spec", "from": "smol", "draft": "smol",
                                     "stream": False},
            )  # fmt: skip
            assert r.status_code == 200, r.text

            async def generate(model: str) -> str:
                options = {"temperature": 0, "num_predict": 48, "num_ctx": 512}
                body = {"model": model, "prompt": prompt, "raw": True, "stream": False,
                        "options": options}  # fmt: skip
                r = await c.post("/api/generate", json=body)
                assert r.status_code == 200, r.text
                text: str = r.json()["response"]
                return text

            plain = await generate("smol")
            drafted = await generate("smol-spec")
            assert drafted == plain
            assert len(plain) > 20
            spec = runner_spec(srv, "smol-spec:latest")
            assert spec.draft_model == str(smollm2_path_in(srv.store))
            assert spec.draft_num_predict == 4
            (info,) = srv.scheduler.ps()
            engine = srv.scheduler.runner(info.model_path).engine
            metrics = await engine.metrics()
            drafted_tokens = _counter(metrics, "llamacpp:spec_decode_num_draft_tokens_total")
            accepted = _counter(metrics, "llamacpp:spec_decode_num_accepted_tokens_total")
            assert drafted_tokens > 0
            assert 0 < accepted <= drafted_tokens  # the same model: most drafts are accepted


def smollm2_path_in(store: ModelStore) -> Path:
    path = store.resolve("smol").model_path
    assert path is not None
    return path


def _counter(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the runner's metrics")
