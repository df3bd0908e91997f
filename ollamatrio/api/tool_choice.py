"""``tool_choice`` in each dialect's spelling, read into the core's terms: the tools offered
(none, for ``none``) and the :class:`ToolChoice` (must the answer be a call, of which tool).

- ``/v1/chat/completions``: ``"none"``, ``"auto"``, ``"required"``,
  ``{"type": "function", "function": {"name": ...}}``;
- ``/v1/responses``: the same strings, ``{"type": "function", "name": ...}``;
- Anthropic ``/v1/messages``: ``{"type": "auto" | "any" | "tool" | "none", "name"?}``
  (``disable_parallel_tool_use`` is accepted: a forced answer is one call anyway).

Ollama ignores ``tool_choice`` (ollama#17921, #11171); here a required call is forced
through the runner's grammar (``engines/forced_call.py``).  A required call with no tools,
or a named tool that is not offered, is a 400.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidRequestError
from ..types import ToolChoice

Tools = tuple[Mapping[str, Any], ...]

_MODES = {"auto": ToolChoice(), "required": ToolChoice(required=True)}


def openai_tool_choice(tools: Tools, value: Any) -> tuple[Tools, ToolChoice]:
    """``/v1/chat/completions``' ``tool_choice`` over its (chat-shaped) tools."""
    if isinstance(value, dict) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        return tools, _named(tools, name)
    return _mode(tools, value)


def responses_tool_choice(tools: Tools, value: Any) -> tuple[Tools, ToolChoice]:
    """``/v1/responses``' ``tool_choice`` over its tools (in the chat shape already)."""
    if isinstance(value, dict) and value.get("type") == "function":
        return tools, _named(tools, value.get("name"))
    return _mode(tools, value)


def anthropic_tool_choice(tools: Tools, value: Any) -> tuple[Tools, ToolChoice]:
    """Anthropic's ``tool_choice`` over its tools (in the chat shape already)."""
    if value is None:
        return tools, ToolChoice()
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "tool":
        return tools, _named(tools, value.get("name"))
    modes = {"auto": "auto", "any": "required", "none": "none"}
    if kind not in modes:
        raise InvalidRequestError(f"tool_choice.type: unknown value {json.dumps(kind)}")
    return _mode(tools, modes[kind])


def _mode(tools: Tools, value: Any) -> tuple[Tools, ToolChoice]:
    if value is None:
        return tools, ToolChoice()
    if value == "none":
        return (), ToolChoice()
    if not isinstance(value, str) or value not in _MODES:
        raise InvalidRequestError(
            f"invalid value for 'tool_choice': {json.dumps(value)} (expected \"none\", "
            '"auto", "required" or a function)'
        )
    choice = _MODES[value]
    if choice.required and not tools:
        raise InvalidRequestError("tool_choice requires a tool call, but no tools are given")
    return tools, choice


def _named(tools: Sequence[Mapping[str, Any]], name: Any) -> ToolChoice:
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("tool_choice: the function's name is required")
    if name not in _names(tools):
        raise InvalidRequestError(f"tool_choice: no tool named {json.dumps(name)} is given")
    return ToolChoice(required=True, name=name)


def _names(tools: Sequence[Mapping[str, Any]]) -> set[str]:
    names = set()
    for tool in tools:
        function = tool.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return names
