"""From a typed request to what the engine is asked: the :class:`CompletionRequest`.

Dialect-neutral: every dialect's generation and chat requests come here once translated.  A
Go template (the request's own, or a model's Go template layer over a GGUF without a chat
template of its own) is rendered here, as Ollama renders it; otherwise the conversation goes
to the engine as messages, for llama.cpp to apply the GGUF's Jinja template (and to fit it
into the context, dropping the oldest turns).  Tool calling and images always take the
messages path.  The messages stay typed (:class:`~ollamatrio.types.Message`) on both paths;
only the Go template interpreter is handed Ollama's JSON shape, here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..gguf import GGUFInfo
from ..store import Model
from ..template import is_go_template, parse, render_prompt
from ..types import CompletionRequest, Message
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
        messages = [] if req.suffix else _generate_messages(req, model)
        prompt = render_prompt(
            template, _template_messages(messages), think=req.think, prompt=req.prompt,
            suffix=req.suffix,
        )  # fmt: skip
        completion = CompletionRequest(prompt=prompt)
    elif req.raw or req.suffix:
        completion = CompletionRequest(prompt=req.prompt, suffix=req.suffix or None)
    else:
        completion = CompletionRequest(messages=_generate_messages(req, model))
    return _with_common(completion, req, options)


def _generate_messages(req: GenerateRequest, model: Model) -> list[Message]:
    messages: list[Message] = []
    system = req.system or model.system
    if system:
        messages.append(Message("system", system))
    if not req.context:
        messages.extend(_model_messages(model))
    messages.append(Message("user", req.prompt, images=req.images))
    return messages


def _model_messages(model: Model) -> list[Message]:
    """The Modelfile's ``MESSAGE`` turns, stored as Ollama's JSON."""
    return [Message.from_ollama(m) for m in model.messages]


def _template_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The one place messages become mappings again: the Go template interpreter reads
    ``.Messages`` as Ollama's ``api.Message`` JSON (it fills in the zero fields itself)."""
    return [m.to_ollama() for m in messages]


def chat_completion(
    req: ChatRequest, model: Model, info: GGUFInfo, options: Mapping[str, Any]
) -> CompletionRequest:
    """A conversation's next turn: the model's system prompt and Modelfile messages come
    first, then the request's messages."""
    messages: list[Message] = []
    if model.system and req.messages[0].role != "system":
        messages.append(Message("system", model.system))
    messages.extend(_model_messages(model))
    messages.extend(req.messages)
    template = None if req.tools or req.has_images else go_template(model, info)
    if template is not None:
        prompt = render_prompt(template, _template_messages(messages), think=req.think)
        return _with_common(CompletionRequest(prompt=prompt), req, options)
    completion = CompletionRequest(
        messages=messages, tools=list(req.tools) or None, tool_choice=req.tool_choice
    )
    return _with_common(completion, req, options)


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
        tool_choice=completion.tool_choice,
        think=req.think,
        # A prompt carries its images beside it; messages carry their own.
        images=req.images if isinstance(req, GenerateRequest) and completion.prompt else (),
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs,
        truncate=req.truncate,
        report_stop=isinstance(req, ChatRequest) and req.report_stop,
        # Ollama returns the token context on /api/generate except in raw mode.
        context=req.context if isinstance(req, GenerateRequest) else (),
        return_context=isinstance(req, GenerateRequest) and not req.raw,
    )
