"""From a typed request to what the engine is asked: the :class:`CompletionRequest`.

Dialect-neutral: every dialect's generation and chat requests come here once translated.  A
Go template (the request's own, or a model's Go template layer over a GGUF without a chat
template of its own) is rendered here, as Ollama renders it; otherwise the conversation goes
to the engine as messages, for llama.cpp to apply the GGUF's Jinja template (and to fit it
into the context, dropping the oldest turns).  Tool calling and images always take the
messages path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..gguf import GGUFInfo
from ..store import Model
from ..template.gotemplate import is_go_template, parse, render_prompt
from ..types import CompletionRequest
from .requests import ChatRequest, GenerateRequest


def go_template(model: Model, info: GGUFInfo, requested: str = "") -> str | None:
    """The Go template to render the prompt with here, as Ollama does, or None to let
    llama.cpp apply the GGUF's Jinja template: the request's own ``template``, or a Go
    template layer on a GGUF (``info``) that has no chat template of its own."""
    if requested:
        return requested
    if not is_go_template(model.template):
        return None
    return model.template if not info.chat_template else None


def generate_completion(
    req: GenerateRequest, model: Model, info: GGUFInfo, options: Mapping[str, Any]
) -> CompletionRequest:
    """A prompt's completion: a raw prompt, a prompt rendered with a Go template, or the
    prompt as chat messages so that the model's own template applies."""
    template = None if req.raw or req.images else go_template(model, info, req.template)
    if template is not None and (not req.suffix or "suffix" in parse(template).vars):
        messages = () if req.suffix else _generate_messages(req, model)
        prompt = render_prompt(
            template, messages, think=req.think, prompt=req.prompt, suffix=req.suffix
        )
        completion = CompletionRequest(prompt=prompt)
    elif req.raw or req.suffix:
        completion = CompletionRequest(prompt=req.prompt, suffix=req.suffix or None)
    else:
        completion = CompletionRequest(messages=_generate_messages(req, model))
    return _with_common(completion, req, options)


def _generate_messages(req: GenerateRequest, model: Model) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = req.system or model.system
    if system:
        messages.append({"role": "system", "content": system})
    if not req.context:
        messages.extend(dict(m) for m in model.messages)
    user: dict[str, Any] = {"role": "user", "content": req.prompt}
    if req.images:
        user["images"] = list(req.images)
    messages.append(user)
    return messages


def chat_completion(
    req: ChatRequest, model: Model, info: GGUFInfo, options: Mapping[str, Any]
) -> CompletionRequest:
    """A conversation's next turn: the model's system prompt and Modelfile messages come
    first, then the request's messages (in Ollama's JSON shape, which the engines and the
    Go templates read)."""
    messages: list[dict[str, Any]] = []
    if model.system and req.messages[0].role != "system":
        messages.append({"role": "system", "content": model.system})
    messages.extend(dict(m) for m in model.messages)
    messages.extend(m.to_ollama() for m in req.messages)
    template = None if req.tools or req.has_images else go_template(model, info)
    if template is not None:
        prompt = render_prompt(template, messages, think=req.think)
        return _with_common(CompletionRequest(prompt=prompt), req, options)
    return _with_common(
        CompletionRequest(messages=messages, tools=list(req.tools) or None), req, options
    )


def _with_common(
    completion: CompletionRequest, req: GenerateRequest | ChatRequest, options: Mapping[str, Any]
) -> CompletionRequest:
    return CompletionRequest(
        prompt=completion.prompt,
        messages=completion.messages,
        suffix=completion.suffix,
        options=options,
        format=req.format,
        tools=completion.tools,
        think=req.think,
        # A prompt carries its images beside it; messages carry their own.
        images=req.images if isinstance(req, GenerateRequest) and completion.prompt else (),
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs,
        truncate=req.truncate,
        # Ollama returns the token context on /api/generate except in raw mode.
        context=req.context if isinstance(req, GenerateRequest) else (),
        return_context=isinstance(req, GenerateRequest) and not req.raw,
    )
