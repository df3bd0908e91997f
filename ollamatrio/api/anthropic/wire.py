"""The Anthropic dialect's translations: ``/v1/messages`` bodies to the core's typed chat
request, and the core's folded answers to Anthropic ``message`` objects.

As Ollama's ``anthropic/anthropic.go``: content blocks become messages (``text`` and
``image`` a user's text and images, ``tool_use`` an assistant's tool calls, ``tool_result``
tool messages, ``thinking`` an assistant's earlier reasoning); ``system`` (a string or text
blocks) a system message; Anthropic's tools (``input_schema``) function tools.  Fields this
server does not act on (``metadata``, ``cache_control``, ``output_config``,
``context_management``, a tool's ``defer_loading``, ...) are accepted and ignored, as Claude
Code sends them.  The streamed events are written by :mod:`.stream`.  Everything
here is pure: no I/O, no scheduler.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidRequestError
from ...generation.answer import Answer
from ...generation.requests import ChatRequest, Message, Think, ToolCall
from ..bodies import check_option, get_bool, get_model, get_str, merge_options
from ..tool_choice import anthropic_tool_choice
from .billing_header import without_billing_block

# Anthropic's error types by HTTP status (its documented table); anything else is api_error.
_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",  # a full queue: try again (Retry-After)
    529: "overloaded_error",
}
# Anthropic sampling fields that are Ollama options of another name.
_SAMPLING_FIELDS: Mapping[str, str] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "max_tokens": "num_predict",
}
# Block types of an assistant's history that carry nothing a template can show.
_IGNORED_BLOCKS = frozenset({"redacted_thinking"})


# -- errors ----------------------------------------------------------------------------


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "api_error")


def error_object(message: str, status: int) -> dict[str, Any]:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"},
    "request_id"}`` (an id of its own, as Anthropic's and Ollama's)."""
    return {
        "type": "error",
        "error": {"type": error_type(status), "message": message},
        "request_id": f"req_{secrets.token_hex(12)}",
    }


# -- requests --------------------------------------------------------------------------


@dataclass(frozen=True)
class AnthropicRequest:
    """A translated ``/v1/messages`` body: the core's chat request."""

    core: ChatRequest


def messages_request(body: Mapping[str, Any]) -> AnthropicRequest:
    """A ``/v1/messages`` body; ``max_tokens`` is required, as Anthropic's API has it."""
    model = get_model(body)
    if body.get("max_tokens") is None:
        raise InvalidRequestError("max_tokens is required and must be positive")  # Ollama's
    return AnthropicRequest(_chat_request(body, model))


def count_tokens_request(body: Mapping[str, Any]) -> ChatRequest:
    """A ``/v1/messages/count_tokens`` body: a messages body without ``max_tokens``."""
    return _chat_request(body, get_model(body))


def _chat_request(body: Mapping[str, Any], model: str) -> ChatRequest:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidRequestError("messages is required")
    messages = system_messages(body.get("system")) + chat_messages(raw)
    offered, choice = anthropic_tool_choice(tools(body.get("tools")), body.get("tool_choice"))
    return ChatRequest(
        model=model,
        messages=messages,
        tools=offered,
        tool_choice=choice,
        options=sampling_options(body),
        think=thinking(body.get("thinking")),
        stream=get_bool(body, "stream", False),
        report_stop=True,  # stop_reason "stop_sequence" names it
    )


def sampling_options(body: Mapping[str, Any]) -> dict[str, Any]:
    """Ollama options from Anthropic's sampling fields, checked as the options they become
    (errors name the Anthropic field).  Only the fields given are set: the model's own
    parameters stay for the rest, as in Ollama."""
    options: dict[str, Any] = {}
    for key, option in _SAMPLING_FIELDS.items():
        if body.get(key) is not None:
            options[option] = check_option(option, body[key], key)
    if options.get("num_predict", 1) < 1:
        raise InvalidRequestError("max_tokens: must be at least 1")
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise InvalidRequestError("stop_sequences: expected a list of strings")
        if stop:
            options["stop"] = stop
    merge_options(options)
    return options


def thinking(value: Any) -> Think:
    """``thinking``: ``enabled`` turns it on, ``disabled`` off; ``adaptive`` (Claude Code's)
    and none leave the model's default, so a model without thinking still answers."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequestError("thinking: expected an object")
    kind = value.get("type")
    if kind == "enabled":
        return True
    if kind == "disabled":
        return False
    if kind == "adaptive":
        return None
    raise InvalidRequestError(f"thinking.type: unknown value {json.dumps(kind)}")


def system_messages(system: Any) -> tuple[Message, ...]:
    """``system`` as a string or a list of text blocks: one system message.  Claude Code's
    billing block, when it is the first block, is left out (:mod:`.billing_header`)."""
    if system is None or system == "":
        return ()
    if isinstance(system, str):
        return (Message("system", system),)
    if not isinstance(system, list):
        raise InvalidRequestError("system: expected a string or a list of text blocks")
    texts = []
    for block in system:
        if not isinstance(block, dict) or block.get("type") != "text":
            raise InvalidRequestError("system: expected a string or a list of text blocks")
        texts.append(_block_text(block, "system"))
    kept = without_billing_block(texts)
    return (Message("system", "\n".join(kept)),) if kept else ()


def chat_messages(messages: Sequence[Any]) -> tuple[Message, ...]:
    """Anthropic's turns as the core's messages: a user turn's ``tool_result`` blocks become
    tool messages (ahead of its text, as they answer the turn before), an assistant turn's
    ``tool_use`` blocks its tool calls.  A ``system`` role in the list (Claude Code's
    environment message) stays a system message."""
    out: list[Message] = []
    names: dict[str, str] = {}  # tool_use id -> tool name, for the results
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidRequestError(f"{where}: expected an object")
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            raise InvalidRequestError(f"{where}.role: expected user or assistant")
        content = message.get("content")
        if isinstance(content, str):
            out.append(Message(role, content))
            continue
        if not isinstance(content, list):
            raise InvalidRequestError(f"{where}.content: expected a string or a list of blocks")
        if role == "assistant":
            message_out = _assistant(content, where)
            names.update((call.id, call.name) for call in message_out.tool_calls)
            out.append(message_out)
        else:
            out.extend(_user(role, content, where, names))
    return tuple(out)


def _assistant(blocks: Sequence[Any], where: str) -> Message:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for block in blocks:
        kind = _block_type(block, where)
        if kind == "text":
            texts.append(_block_text(block, where))
        elif kind == "thinking":
            thought = block.get("thinking")
            if not isinstance(thought, str):
                raise InvalidRequestError(f"{where}: a thinking block needs its thinking text")
            thoughts.append(thought)
        elif kind == "tool_use":
            calls.append(_tool_use(block, where, len(calls)))
        elif kind not in _IGNORED_BLOCKS:
            raise InvalidRequestError(f"{where}: unsupported content block type {kind!r}")
    return Message("assistant", "".join(texts), thinking="".join(thoughts), tool_calls=tuple(calls))


def _tool_use(block: Mapping[str, Any], where: str, index: int) -> ToolCall:
    name = block.get("name")
    call_id = block.get("id")
    arguments = block.get("input", {})
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"{where}: a tool_use block needs a name")
    if not isinstance(arguments, dict):
        raise InvalidRequestError(f"{where}: a tool_use block's input must be an object")
    return ToolCall(
        name=name, arguments=arguments, id=call_id if isinstance(call_id, str) else "", index=index
    )


def _user(role: str, blocks: Sequence[Any], where: str, names: Mapping[str, str]) -> list[Message]:
    results: list[Message] = []
    texts: list[str] = []
    images: list[str] = []
    for block in blocks:
        kind = _block_type(block, where)
        if kind == "text":
            texts.append(_block_text(block, where))
        elif kind == "image":
            images.append(image_data(block, where))
        elif kind == "tool_result":
            results.append(_tool_result(block, where, names))
        else:
            raise InvalidRequestError(f"{where}: unsupported content block type {kind!r}")
    if texts or images or not results:
        results.append(Message(role, "\n".join(texts), images=tuple(images)))
    return results


def _tool_result(block: Mapping[str, Any], where: str, names: Mapping[str, str]) -> Message:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise InvalidRequestError(f"{where}: a tool_result block needs its tool_use_id")
    content = block.get("content", "")
    images: list[str] = []
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = _block_type(part, where)
            if kind == "text":
                texts.append(_block_text(part, where))
            elif kind == "image":
                images.append(image_data(part, where))
            else:
                raise InvalidRequestError(f"{where}: unsupported tool_result block {kind!r}")
        content = "\n".join(texts)
    elif not isinstance(content, str):
        raise InvalidRequestError(f"{where}: a tool_result's content must be text or blocks")
    return Message(
        "tool", content, images=tuple(images), tool_name=names.get(call_id, ""),
        tool_call_id=call_id,
    )  # fmt: skip


def image_data(block: Mapping[str, Any], where: str) -> str:
    """An ``image`` block's base64 data (only ``base64`` sources: URLs are not fetched)."""
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64":
        raise InvalidRequestError(f"{where}: only base64 image sources are supported")
    data = source.get("data")
    if not isinstance(data, str):
        raise InvalidRequestError(f"{where}: an image source needs its data")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(f"{where}: invalid base64 image data") from None
    return data


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise InvalidRequestError(f"{where}: each content block needs a type")
    kind: str = block["type"]
    return kind


def _block_text(block: Mapping[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise InvalidRequestError(f"{where}: a text block needs its text")
    return text


def tools(value: Any) -> tuple[Mapping[str, Any], ...]:
    """Anthropic's client tools (``name``, ``description``, ``input_schema``) as function
    tools for the model's template; server tools (a ``type`` other than ``custom``, no
    schema) are left out (and every tool with ``tool_choice`` ``none``: :mod:`.tool_choice`)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidRequestError("tools: expected a list")
    out = []
    for index, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise InvalidRequestError(f"tools[{index}]: expected an object")
        if tool.get("type", "custom") != "custom" and "input_schema" not in tool:
            continue
        name = get_str(tool, "name")
        if not name:
            raise InvalidRequestError(f"tools[{index}].name: required")
        schema = tool.get("input_schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise InvalidRequestError(f"tools[{index}].input_schema: expected an object")
        function = {"name": name, "description": get_str(tool, "description"), "parameters": schema}
        out.append({"type": "function", "function": function})
    return tuple(out)


# -- answers ---------------------------------------------------------------------------


def new_message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def new_tool_use_id() -> str:
    return f"toolu_{secrets.token_hex(12)}"


def stop_fields(done_reason: str, stop_sequence: str, tool_calls: bool) -> dict[str, Any]:
    """How the answer ended, as Anthropic's ``stop_reason`` and ``stop_sequence``."""
    if tool_calls:
        reason = "tool_use"
    elif done_reason == "length":
        reason = "max_tokens"
    else:
        reason = "stop_sequence" if stop_sequence else "end_turn"
    return {"stop_reason": reason, "stop_sequence": stop_sequence or None}


def tool_input(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as a ``tool_use`` block's input (an object)."""
    if isinstance(call.arguments, str):
        try:
            parsed = json.loads(call.arguments)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return dict(call.arguments)


def tool_use_block(call: ToolCall, *, empty_input: bool = False) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": call.id or new_tool_use_id(),
        "name": call.name,
        "input": {} if empty_input else tool_input(call),
    }


def usage(prompt_tokens: int, output_tokens: int, cached: int = 0) -> dict[str, int]:
    """Anthropic's usage from the whole prompt's count and the part of it reused from the
    runner's cache: ``input_tokens`` are the tokens evaluated, ``cache_read_input_tokens``
    the reused ones (Anthropic counts them apart; nothing is written to a cache on request,
    so ``cache_creation_input_tokens`` is 0)."""
    return {
        "input_tokens": prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output_tokens,
    }


def message_object(model: str, answer: Answer, message_id: str | None = None) -> dict[str, Any]:
    """Anthropic's ``message`` for a folded answer: thinking, text, then tool_use blocks."""
    content: list[dict[str, Any]] = []
    if answer.thinking:
        content.append({"type": "thinking", "thinking": answer.thinking, "signature": ""})
    if answer.content or not answer.tool_calls:
        content.append({"type": "text", "text": answer.content})
    content.extend(tool_use_block(call) for call in answer.tool_calls)
    timings = answer.timings
    return {
        "id": message_id or new_message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        **stop_fields(answer.done_reason, answer.stop_sequence, bool(answer.tool_calls)),
        "usage": usage(timings.prompt_eval_count, timings.eval_count, timings.prompt_cached_count),
    }
