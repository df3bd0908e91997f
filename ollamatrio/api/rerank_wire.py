"""Rerank bodies and answers: ``POST /api/rerank`` and ``POST /v1/rerank``.

Not Ollama's (it has no rerank): the shape llama-server, Jina and Cohere share.  A request
``{"model", "query", "documents", "top_n"?, "return_documents"?}``, whose documents are
strings or ``{"text": ...}`` objects, is answered with ``{"results": [{"index",
"relevance_score", "document"?: {"text"}}]}``, best first.  ``/api/rerank`` adds Ollama's
durations and count as ``/api/embed`` does; ``/v1/rerank`` adds llama-server's ``object``
and ``usage``.

Pure: no I/O, no scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidRequestError
from ..generation.requests import RerankRequest
from ..wire import ns
from .bodies import get_bool, get_int, get_keep_alive, get_list, get_model, get_options, get_str
from .pipeline import Reranked


def rerank_request(body: Mapping[str, Any]) -> RerankRequest:
    """A rerank body; no documents only loads the model."""
    documents = tuple(_document(item, i) for i, item in enumerate(get_list(body, "documents")))
    query = get_str(body, "query")
    if documents and not query:
        raise InvalidRequestError("query is required")
    top_n = get_int(body, "top_n")
    if top_n is not None and top_n < 1:
        raise InvalidRequestError("top_n must be a positive integer")
    return RerankRequest(
        model=get_model(body),
        query=query,
        documents=documents,
        top_n=top_n,
        return_documents=get_bool(body, "return_documents", False),
        options=get_options(body),
        keep_alive=get_keep_alive(body),
    )


def _document(item: object, index: int) -> str:
    """A document: a string, or an object whose ``text`` is one (Jina's and Cohere's)."""
    if isinstance(item, dict):
        item = item.get("text")
    if not isinstance(item, str):
        raise InvalidRequestError(
            f"invalid value for 'documents[{index}]': expected a string or an object with text"
        )
    return item


def results(req: RerankRequest, done: Reranked) -> list[dict[str, Any]]:
    out = []
    for index, score in done.ranked:
        result: dict[str, Any] = {"index": index, "relevance_score": score}
        if req.return_documents:
            result["document"] = {"text": req.documents[index]}
        out.append(result)
    return out


def native_answer(req: RerankRequest, done: Reranked) -> dict[str, Any]:
    """The ``/api/rerank`` object; a load-only request gets the model and no results."""
    if not req.documents:
        return {"model": req.model, "results": []}
    return {
        "model": req.model,
        "results": results(req, done),
        "total_duration": ns(done.total_duration),
        "load_duration": ns(done.load_duration),
        "prompt_eval_count": done.prompt_eval_count,
    }


def v1_answer(req: RerankRequest, done: Reranked) -> dict[str, Any]:
    """The ``/v1/rerank`` object, as llama-server writes it."""
    tokens = done.prompt_eval_count
    return {
        "model": req.model,
        "object": "list",
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results(req, done),
    }
