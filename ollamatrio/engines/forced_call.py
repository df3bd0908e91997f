"""A tool call that must be made (``tool_choice`` ``required``, or a named tool), forced
through llama.cpp's grammar, and tool calls that came out malformed.

llama.cpp takes ``tool_choice`` ``"required"``, but its tool-call grammar is lazy: it only
constrains what follows the model's own call marker (``<tool_call>``, ...), so a model that
answers in prose is never made to call, and a template whose call format llama.cpp does not
recognise has no tool grammar at all (both seen with SmolLM2).  A named tool is not a
``tool_choice`` llama.cpp reads (an object there is taken for ``"auto"``).  So a forced call
is asked for as vLLM does it: the tools stay in the prompt as the model's template shows
them (the prompt, and so its cached prefix, is that of every other turn), llama.cpp's own
tool parsing is off (``tool_choice: "none"``), and a JSON schema makes the answer exactly one
``{"name": ..., "arguments": {...}}`` object, the name one of the tools (or the named one),
the arguments that tool's parameter schema.  The answer is read back here into a call.

Malformed calls are those that cannot be passed on as a call: no function name, arguments
that are not a JSON object, or a forced answer cut short (``max_tokens``).  They are
returned as text, the model's own words, and counted, never silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ollamatrio.errors import InvalidRequestError
from ollamatrio.types import ToolCall, ToolChoice


def call_schema(tools: Sequence[Mapping[str, Any]], choice: ToolChoice) -> dict[str, Any] | None:
    """The JSON schema of the one call ``choice`` requires, or None when none is required."""
    if not choice.required:
        return None
    options = []
    for tool in tools:
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        if choice.name and function["name"] != choice.name:
            continue
        parameters = function.get("parameters")
        if not isinstance(parameters, Mapping) or not parameters:
            parameters = {"type": "object"}
        options.append({
            "type": "object",
            "properties": {"name": {"const": function["name"]}, "arguments": dict(parameters)},
            "required": ["name", "arguments"],
        })  # fmt: skip
    if not options:
        wanted = f"the tool {choice.name!r}" if choice.name else "a tool"
        raise InvalidRequestError(f"tool_choice requires {wanted}, but no such tool is offered")
    return options[0] if len(options) == 1 else {"anyOf": options}


def forced_call(text: str) -> ToolCall | None:
    """The call a forced answer spells, or None when it does not spell one (cut short)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    name, arguments = value.get("name"), value.get("arguments")
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ToolCall(name=name, arguments=arguments)


def is_malformed(call: ToolCall) -> bool:
    """A parsed call that cannot be passed on as one: no name, or arguments not an object."""
    return not call.name or isinstance(call.arguments, str)


def as_text(call: ToolCall) -> str:
    """A malformed call as the model wrote it, for the answer's text."""
    arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
    return f'{{"name": {json.dumps(call.name)}, "arguments": {arguments}}}'
