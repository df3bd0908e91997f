"""The OpenAI Responses dialect's translations (``POST /v1/responses``): a body (and the
stored conversation it continues) to the core's :class:`ChatRequest`, and the core's folded
:class:`Answer` to a ``response`` object.

Items are read as Ollama's ``openai/responses.go`` reads them: ``message`` items (``role``,
content as a string or ``input_text``/``output_text``/``input_image`` parts),
``function_call``, ``function_call_output`` and ``reasoning`` (its summary is the thinking of
the assistant turn that follows).  The streamed events are written by
:mod:`.stream`.  Everything here is pure: no I/O, no scheduler.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import InvalidRequestError
from ...generation.answer import Answer
from ...generation.relay import Timings
from ...generation.requests import ChatRequest, Format, Message, Think, ToolCall
from ..bodies import check_option, get_bool, get_keep_alive, get_model, get_str
from ..openai import wire as openai_wire
from ..tool_choice import responses_tool_choice


@dataclass(frozen=True)
class ResponsesCall:
    """A translated ``/v1/responses`` body, before any stored conversation is added."""

    model: str
    input: tuple[dict[str, Any], ...]  # this request's items, each with an id
    instructions: str
    tools: tuple[Mapping[str, Any], ...]  # as the body gave them (Responses' flat shape)
    tool_choice: Any
    options: Mapping[str, Any]
    format: Format
    think: Think
    stream: bool
    store: bool
    previous_response_id: str
    keep_alive: float | None
    echo: Mapping[str, Any] = field(default_factory=dict)  # fields the response repeats


# -- requests --------------------------------------------------------------------------


def responses_call(body: Mapping[str, Any]) -> ResponsesCall:
    """A ``/v1/responses`` body."""
    model = get_model(body)
    items = input_items(body.get("input"))
    instructions = get_str(body, "instructions")
    sampling = {k: body[k] for k in ("temperature", "top_p", "options") if k in body}
    options = openai_wire.sampling_options(sampling)
    if body.get("max_output_tokens") is not None:
        options["num_predict"] = check_option(
            "num_predict", body["max_output_tokens"], "max_output_tokens"
        )
    tools = function_tools(body.get("tools"))
    tool_choice = body.get("tool_choice", "auto")
    echo = {
        "instructions": instructions or None,
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "temperature": options["temperature"],
        "top_p": options["top_p"],
        "tool_choice": tool_choice,
        "tools": list(tools),
        "reasoning": body.get("reasoning") if isinstance(body.get("reasoning"), dict) else None,
        "text": body.get("text") if isinstance(body.get("text"), dict) else _TEXT,
    }
    return ResponsesCall(
        model=model,
        input=items,
        instructions=instructions,
        tools=tools,
        tool_choice=tool_choice,
        options=options,
        format=text_format(body.get("text")),
        think=openai_wire.reasoning({"reasoning": body.get("reasoning")}),
        stream=get_bool(body, "stream", False),
        store=get_bool(body, "store", True),
        previous_response_id=get_str(body, "previous_response_id"),
        keep_alive=get_keep_alive(body),
        echo=echo,
    )


_TEXT = {"format": {"type": "text"}}


def chat_request(call: ResponsesCall, history: Sequence[Mapping[str, Any]] = ()) -> ChatRequest:
    """The core's chat request for ``call``, continuing ``history`` (a stored
    conversation's items): the whole conversation, rendered as ``/api/chat`` would."""
    messages = items_messages([*history, *call.input])
    if call.instructions:
        messages = (Message(role="system", content=call.instructions), *messages)
    if not messages:
        raise InvalidRequestError("input is required")
    offered = tuple(chat_tool(tool) for tool in call.tools)
    tools, choice = responses_tool_choice(offered, call.tool_choice)
    return ChatRequest(
        model=call.model,
        messages=messages,
        tools=tools,
        tool_choice=choice,
        format=call.format,
        options=call.options,
        keep_alive=call.keep_alive,
        think=call.think,
        stream=call.stream,
    )


def input_items(value: Any) -> tuple[dict[str, Any], ...]:
    """``input`` as a tuple of items with ids: a string is one user message."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise InvalidRequestError("invalid value for 'input': expected a string or a list")
    out = []
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidRequestError(f"invalid value for 'input[{index}]': expected an object")
        kind = item.get("type") or "message"
        if kind not in _ITEM_PREFIXES:
            raise InvalidRequestError(f"unsupported input item type: {json.dumps(kind)}")
        out.append({"id": item.get("id") or new_id(_ITEM_PREFIXES[kind]), **item, "type": kind})
    return tuple(out)


_ITEM_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def items_messages(items: Sequence[Mapping[str, Any]]) -> tuple[Message, ...]:
    """Responses items as the core's messages.  Consecutive function calls join the
    assistant message before them; a reasoning item's summary is the thinking of the
    assistant turn that follows it."""
    out: list[Message] = []
    names: dict[str, str] = {}  # call_id → function name, for the outputs
    thinking = ""
    for index, item in enumerate(items):
        kind = item.get("type") or "message"
        if kind == "reasoning":
            thinking += _summary_text(item)
        elif kind == "message":
            role = item.get("role")
            if not isinstance(role, str) or not role:
                raise InvalidRequestError(f"input[{index}]: role is required")
            text, images = message_content(item.get("content"))
            role = "system" if role == "developer" else role
            mine = thinking if role == "assistant" else ""
            thinking = "" if role == "assistant" else thinking
            out.append(Message(role=role, content=text, thinking=mine, images=images))
        elif kind == "function_call":
            call = function_call(item)
            names[call.id] = call.name
            last = out[-1] if out else None
            if last is not None and last.role == "assistant" and not thinking:
                out[-1] = Message(
                    role="assistant", content=last.content, thinking=last.thinking,
                    images=last.images, tool_calls=(*last.tool_calls, call),
                )  # fmt: skip
            else:
                out.append(Message(role="assistant", content="", thinking=thinking,
                                   tool_calls=(call,)))  # fmt: skip
                thinking = ""
        else:  # function_call_output
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise InvalidRequestError(f"input[{index}]: call_id is required")
            output = item.get("output")
            if not isinstance(output, str):
                output = json.dumps(output)
            out.append(Message(role="tool", content=output, tool_name=names.get(call_id, ""),
                               tool_call_id=call_id))  # fmt: skip
    return tuple(out)


def message_content(content: Any) -> tuple[str, tuple[str, ...]]:
    """(text, base64 images) of a message item's content."""
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, list):
        raise InvalidRequestError("invalid message content: expected a string or a list")
    texts: list[str] = []
    images: list[str] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequestError(f"invalid {kind} part: text is required")
            texts.append(text)
        elif kind == "refusal":
            texts.append(str(part.get("refusal") or ""))
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise InvalidRequestError("invalid input_image part: image_url is required")
            images.append(openai_wire.decode_image_url(url))
        else:
            raise InvalidRequestError(f"unsupported content part type: {json.dumps(kind)}")
    return "".join(texts), tuple(images)


def function_call(item: Mapping[str, Any]) -> ToolCall:
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("invalid function_call item: name is required")
    arguments = openai_wire.call_arguments(item.get("arguments"), "invalid function_call arguments")
    call_id = item.get("call_id") or item.get("id") or ""
    return ToolCall(name=name, arguments=arguments, id=str(call_id))


def _summary_text(item: Mapping[str, Any]) -> str:
    parts = item.get("summary") or item.get("content") or ()
    texts = [p.get("text") for p in parts if isinstance(p, dict)]
    return "".join(t for t in texts if isinstance(t, str))


def function_tools(value: Any) -> tuple[Mapping[str, Any], ...]:
    """The function tools; other kinds (web search, file search) have no engine here and
    are left out, as Ollama does."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise InvalidRequestError("invalid value for 'tools': expected a list of objects")
    tools = tuple(tool for tool in value if tool.get("type") == "function")
    for tool in tools:
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise InvalidRequestError("invalid function tool: name is required")
    return tools


def chat_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses function tool (flat) in the chat shape the templates read."""
    function = {"name": tool["name"], "parameters": tool.get("parameters") or {}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def text_format(value: Any) -> Format:
    """``text.format``: ``json_schema`` constrains to its schema, ``json_object`` to JSON."""
    spec = value.get("format") if isinstance(value, dict) else None
    if not isinstance(spec, dict) or spec.get("type") in (None, "text"):
        return None
    if spec["type"] == "json_object":
        return "json"
    if spec["type"] == "json_schema":
        schema = spec.get("schema")
        return schema if isinstance(schema, dict) else None
    raise InvalidRequestError(f"invalid text.format type: {json.dumps(spec['type'])}")


# -- responses -------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class Draft:
    """A response being made: its id, creation time and the request fields it repeats.
    Output item ids derive from the response's id, so that a stream's items and the
    stored object agree."""

    call: ResponsesCall
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def item_id(self, prefix: str, index: int = 0) -> str:
        return f"{prefix}_{self.id.removeprefix('resp_')}_{index}"

    def envelope(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": self.call.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": self.call.previous_response_id or None,
            "store": self.call.store,
            "truncation": "disabled",
            "usage": None,
            # The rest of OpenAI's Response object, as Ollama fills it (openai/responses.go):
            # settings this server does not take, at their defaults.
            "completed_at": None,
            "presence_penalty": 0,
            "frequency_penalty": 0,
            "top_logprobs": 0,
            "max_tool_calls": None,
            "background": False,
            "service_tier": "default",
            "safety_identifier": None,
            "prompt_cache_key": None,
            **self.call.echo,
        }


def reasoning_item(draft: Draft, thinking: str, status: str = "completed") -> dict[str, Any]:
    summary = [{"type": "summary_text", "text": thinking}] if thinking else []
    return {"id": draft.item_id("rs"), "type": "reasoning", "summary": summary}


def message_item(draft: Draft, text: str, status: str = "completed") -> dict[str, Any]:
    content = [output_text(text)] if status == "completed" else []
    return {
        "id": draft.item_id("msg"), "type": "message", "status": status,
        "role": "assistant", "content": content,
    }  # fmt: skip


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(
    draft: Draft, call: ToolCall, index: int, status: str = "completed"
) -> dict[str, Any]:
    arguments = call.arguments
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
    return {
        "id": draft.item_id("fc", index),
        "type": "function_call",
        "status": status,
        "call_id": call.id or draft.item_id("call", index),
        "name": call.name,
        "arguments": arguments if status == "completed" else "",
    }


def output_items(draft: Draft, answer: Answer) -> list[dict[str, Any]]:
    """The answer's items: reasoning, then the message, then the function calls."""
    items = []
    if answer.thinking:
        items.append(reasoning_item(draft, answer.thinking))
    if answer.content or not answer.tool_calls:
        items.append(message_item(draft, answer.content))
    items += [function_call_item(draft, c, n) for n, c in enumerate(answer.tool_calls)]
    return items


def usage(timings: Timings) -> dict[str, Any]:
    prompt, completion = timings.prompt_eval_count, timings.eval_count
    return {
        "input_tokens": prompt,  # the whole prompt; the part reused from the cache below
        "input_tokens_details": {"cached_tokens": timings.prompt_cached_count},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_object(draft: Draft, answer: Answer) -> dict[str, Any]:
    """The finished ``response``: ``incomplete`` (``max_output_tokens``) when the answer
    ran out of tokens."""
    incomplete = answer.done_reason == "length"
    response = draft.envelope(
        "incomplete" if incomplete else "completed", output_items(draft, answer)
    )
    if incomplete:
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        response["completed_at"] = int(time.time())
    response["usage"] = usage(answer.timings)
    return response


def input_items_page(
    items: Sequence[Mapping[str, Any]], *, order: str, limit: int, after: str
) -> dict[str, Any]:
    """``GET /v1/responses/{id}/input_items``: a list page, newest first unless ``asc``."""
    ordered = list(items) if order == "asc" else list(reversed(items))
    if after:
        ids = [item.get("id") for item in ordered]
        ordered = ordered[ids.index(after) + 1 :] if after in ids else []
    page = [dict(item) for item in ordered[:limit]]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(ordered) > limit,
    }


def deleted_object(response_id: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "deleted": True}
