"""Rerank: ``POST /api/rerank`` and ``POST /v1/rerank`` (llama-server's, Jina's and Cohere's
shape), for models whose GGUF declares rank pooling; scheduled as embeddings are.

The bodies are checked as pure functions; the routes run against the simulated engine and,
for real, against a runner process loading a generated BERT reranker (rank pooling and a
classifier head), through httpx and Cohere's own client."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import trio

from ollamatrio.api.pipeline import Reranked
from ollamatrio.api.rerank_wire import native_answer, rerank_request, v1_answer
from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.errors import InvalidRequestError
from ollamatrio.gguf import read_gguf
from ollamatrio.memory import EMBEDDING_BATCH_CAP, MemoryOptions, estimate
from ollamatrio.testing import write_tiny_reranker

QUERY = "what is the capital of france"
DOCUMENTS = [
    "the cat sat on the mat",
    "paris is the capital of france",
    "the weather today is sunny",
]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_reranker(tmp_path_factory.mktemp("reranker") / "rerank.gguf")


# -- bodies ----------------------------------------------------------------------------


def test_documents_are_strings_or_objects_with_text() -> None:
    req = rerank_request(
        {"model": "r", "query": "q", "documents": ["a", {"text": "b", "title": "t"}], "top_n": 1}
    )
    assert (req.query, req.documents, req.top_n) == ("q", ("a", "b"), 1)
    assert not req.return_documents  # llama-server's default


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"query": "q", "documents": [3]}, "documents[0]"),
        ({"query": "q", "documents": ["a", {"title": "t"}]}, "documents[1]"),
        ({"query": "q", "documents": "a"}, "'documents'"),
        ({"documents": ["a"]}, "query is required"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents"),
    ],
)
def test_bad_bodies_are_refused(body: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=re.escape(message)):
        rerank_request({"model": "r", **body})


def test_answers_in_both_shapes() -> None:
    req = rerank_request(
        {"model": "r", "query": "q", "documents": ["a", "b"], "return_documents": True}
    )
    done = Reranked([(1, 0.9), (0, -0.5)], prompt_eval_count=12, load_duration=0.5,
                    total_duration=1.0)  # fmt: skip
    results = [
        {"index": 1, "relevance_score": 0.9, "document": {"text": "b"}},
        {"index": 0, "relevance_score": -0.5, "document": {"text": "a"}},
    ]
    assert native_answer(req, done) == {
        "model": "r",
        "results": results,
        "total_duration": 1_000_000_000,
        "load_duration": 500_000_000,
        "prompt_eval_count": 12,
    }
    assert v1_answer(req, done) == {
        "model": "r",
        "object": "list",
        "usage": {"prompt_tokens": 12, "total_tokens": 12},
        "results": results,
    }


# -- memory ----------------------------------------------------------------------------


def test_memory_prediction_takes_a_reranker_as_an_embedding_model(reranker: Path) -> None:
    """Nothing of its own: rank pooling is a pooling type, so the whole input goes in one
    batch, and the classifier head's tensors are weights like any others."""
    info = read_gguf(reranker)
    e = estimate(info, MemoryOptions(4096))
    assert e.num_ctx == 512  # the training context
    assert e.n_ubatch == min(512, EMBEDDING_BATCH_CAP)
    assert e.weights == info.tensor_bytes
    assert e.output_buffer > 4 * info.vocab_size  # the pooled output counted


# -- routes (simulated engine) ---------------------------------------------------------


async def test_rerank_routes_sort_cut_and_return_documents(api_server, reranker: Path) -> None:
    async with (
        api_server(models={"tiny-rerank": reranker}) as srv,
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        show = (await c.post("/api/show", json={"model": "tiny-rerank"})).json()
        assert show["capabilities"] == ["embedding", "rerank"]

        body = {"model": "tiny-rerank", "query": QUERY, "documents": DOCUMENTS}
        r = await c.post("/api/rerank", json={**body, "top_n": 2, "return_documents": True})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert [x["index"] for x in answer["results"]] == [1, 2]  # the query words they hold
        assert answer["results"][0]["document"] == {"text": DOCUMENTS[1]}
        assert answer["prompt_eval_count"] > 0
        assert answer["total_duration"] >= answer["load_duration"] > 0

        r = await c.post("/v1/rerank", json=body)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["object"] == "list"
        assert len(answer["results"]) == 3
        scores = [x["relevance_score"] for x in answer["results"]]
        assert scores == sorted(scores, reverse=True)
        assert "document" not in answer["results"][0]
        (ps,) = srv.scheduler.ps()
        assert ps.name == "tiny-rerank:latest"

        # No documents only loads the model, as an embedding request without input does.
        r = await c.post("/api/rerank", json={"model": "tiny-rerank", "keep_alive": 0})
        assert r.json() == {"model": "tiny-rerank", "results": []}


async def test_a_model_without_rank_pooling_is_refused(api_server) -> None:
    async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
        for model in ("tiny", "tiny-embed"):
            body = {"model": model, "query": "q", "documents": ["a"]}
            r = await c.post("/api/rerank", json=body)
            assert r.status_code == 400
            assert r.json() == {"error": f'"{model}" does not support rerank'}
            r = await c.post("/v1/rerank", json=body)
            assert r.status_code == 400
            assert r.json()["error"]["message"] == f'"{model}" does not support rerank'
        r = await c.post("/api/rerank", json={"model": "nope", "query": "q", "documents": ["a"]})
        assert r.status_code == 404
        assert srv.scheduler.ps() == []


# -- a real runner ---------------------------------------------------------------------


async def test_a_real_reranker_scores_through_httpx_and_cohere(api_server, reranker: Path) -> None:
    """A runner loads the generated BERT reranker with rank pooling and scores every pair;
    llama.cpp's scores come back sorted, cut, with documents, and Cohere's client reads
    them from ``/v1/rerank``."""
    cohere = pytest.importorskip("cohere")
    with trio.fail_after(120):
        async with (
            api_server(
                engines=ProcessEngineFactory(load_timeout=60), models={"tiny-rerank": reranker}
            ) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=60) as c,
        ):
            body = {"model": "tiny-rerank", "query": QUERY, "documents": DOCUMENTS}
            r = await c.post("/api/rerank", json=body)
            assert r.status_code == 200, r.text
            full = r.json()["results"]
            assert sorted(x["index"] for x in full) == [0, 1, 2]
            scores = [x["relevance_score"] for x in full]
            assert scores == sorted(scores, reverse=True)
            assert len(set(scores)) == 3  # the documents really were read
            assert r.json()["prompt_eval_count"] > 3 * len(QUERY.split())

            (info,) = srv.scheduler.ps()
            runner = srv.scheduler.runner(info.model_path)
            assert runner.spec.embedding
            predicted = estimate(read_gguf(reranker), MemoryOptions(info.context_length)).total
            measured = runner.engine.memory.total
            # Measured here: 56.3 MB resident, 58.4 MB predicted.
            assert predicted / 2 <= measured <= predicted * 1.25, (measured, predicted)

            r = await c.post("/v1/rerank", json={**body, "top_n": 2, "return_documents": True})
            assert r.status_code == 200, r.text
            top = r.json()["results"]
            assert [x["index"] for x in top] == [x["index"] for x in full[:2]]
            assert top[0]["document"] == {"text": DOCUMENTS[top[0]["index"]]}
            assert top[0]["relevance_score"] == pytest.approx(full[0]["relevance_score"], 1e-5)

            # Documents longer than the runner's batch: a 400 naming the limit.
            r = await c.post("/api/rerank", json={**body, "documents": ["paris " * 600]})
            assert r.status_code == 400
            assert "exceed the context length" in r.json()["error"]

            # Cohere's client on our own httpx client, closed with the block above.
            co = cohere.AsyncClient(base_url=srv.url, api_key="unused", httpx_client=c)
            answer = await co.rerank(
                model="tiny-rerank", query=QUERY, documents=DOCUMENTS, top_n=2,
                return_documents=True,
            )  # fmt: skip
            assert [x.index for x in answer.results] == [x["index"] for x in full[:2]]
            assert answer.results[0].document is not None
            assert answer.results[0].document.text == DOCUMENTS[answer.results[0].index]
            assert answer.results[0].relevance_score == pytest.approx(scores[0], 1e-5)
