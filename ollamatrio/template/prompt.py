"""Ollama's prompt rendering (``template.Execute``): templates that mention ``.Messages``
get the whole collated conversation; older ones are executed once per user turn with
``.System``/``.Prompt``/``.Response`` (the legacy path), the last turn cut after
``.Response``."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from .interpreter import GoTemplate, parse
from .parser import ActionNode, Branch, Chain, Command, Field, Node, Operand, Pipe


def is_go_template(text: str | None) -> bool:
    """A template layer in Go syntax (Jinja ones, passed to llama.cpp, use ``{%``)."""
    return bool(text) and "{%" not in str(text)


_RESPONSE = ActionNode(Pipe((), False, (Command((Field(("Response",), 0),), 0),), 0))


@functools.lru_cache(maxsize=64)
def _ollama_template(source: str) -> GoTemplate:
    """Ollama's ``template.Parse``: ``{{ .Response }}`` is appended to templates that
    mention neither ``.Messages`` nor ``.Response``."""
    tmpl = parse(source)
    if "messages" in tmpl.vars or "response" in tmpl.vars:
        return tmpl
    return GoTemplate(source, (*tmpl.nodes, _RESPONSE), tmpl.vars | {"response"})


def _cut_after_response(nodes: Sequence[Node]) -> tuple[Node, ...]:
    """Ollama's ``deleteNode``: keep the first ``.Response`` action and drop everything
    after it, so the last turn ends where the model's answer begins."""
    cut = False

    def operands(args: Sequence[Operand]) -> tuple[Operand, ...]:
        nonlocal cut
        kept: list[Operand] = []
        for op in args:
            if cut:
                continue
            if isinstance(op, Field) and "Response" in op.names:
                cut = True
            elif isinstance(op, Chain):
                sub = pipe(op.pipe)
                if sub is None:
                    continue
                op = Chain(sub, op.names, op.pos)
            kept.append(op)
        return tuple(kept)

    def pipe(p: Pipe) -> Pipe | None:
        commands = []
        for cmd in p.commands:
            args = operands(cmd.args)
            if not args:
                return None
            commands.append(Command(args, cmd.pos))
        return Pipe(p.decl, p.assign, tuple(commands), p.pos) if commands else None

    def walk(items: Sequence[Node]) -> tuple[Node, ...]:
        kept: list[Node] = []
        for node in items:
            if cut:
                break
            if isinstance(node, ActionNode):
                p = pipe(node.pipe)
                if p is not None:
                    kept.append(ActionNode(p))
            elif isinstance(node, Branch):
                body = walk(node.body)
                orelse = walk(node.orelse)
                kept.append(Branch(node.kind, node.pipe, body, orelse))
            else:
                kept.append(node)
        return tuple(kept)

    return walk(nodes)


def _message(m: Mapping[str, Any]) -> dict[str, Any]:
    """A message with every field of Ollama's ``api.Message`` present (zero values)."""
    calls = []
    for call in m.get("tool_calls") or ():
        function = dict(call.get("function") or {})
        function.setdefault("index", 0)
        function.setdefault("name", "")
        function.setdefault("arguments", {})
        calls.append({**call, "function": function})
    return {
        "role": m.get("role") or "",
        "content": m.get("content") or "",
        "thinking": m.get("thinking") or "",
        "images": list(m.get("images") or ()),
        "tool_calls": calls,
        "tool_name": m.get("tool_name") or "",
        "tool_call_id": m.get("tool_call_id") or "",
    }


def collate(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Ollama's ``collate``: consecutive messages of one role (tool results excepted) are
    joined with a blank line; the system messages are also returned joined."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for raw in messages:
        m = _message(raw)
        if m["role"] == "system":
            system.append(m["content"])
        if out and out[-1]["role"] == m["role"] and m["role"] != "tool":
            out[-1]["content"] += "\n\n" + m["content"]
        else:
            out.append(m)
    return "\n\n".join(system), out


def render_prompt(
    template: str,
    messages: Sequence[Mapping[str, Any]] = (),
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    think: bool | str | None = None,
    prompt: str = "",
    suffix: str = "",
) -> str:
    """The prompt Ollama renders for ``messages`` with a Go ``template``.

    With ``prompt`` and ``suffix`` (fill-in-the-middle) the template sees only those.
    Templates that mention ``.Messages`` get the collated conversation; the others (the
    legacy path) are executed once per user turn with ``.System``/``.Prompt``/
    ``.Response``, the last turn stopping at ``.Response``.
    """
    tmpl = _ollama_template(template)
    base: dict[str, Any] = {
        "System": "",
        "Prompt": "",
        "Suffix": "",
        "Response": "",
        "Messages": [],
        "Tools": [dict(t) for t in tools or ()],
        "Think": bool(think) and think != "false",
        "ThinkLevel": think if isinstance(think, str) else "",
        "IsThinkSet": think is not None,
    }
    system, collated = collate(messages)
    if prompt and suffix:
        return tmpl.execute({**base, "Prompt": prompt, "Suffix": suffix})
    if "messages" in tmpl.vars:
        return tmpl.execute({**base, "System": system, "Messages": collated})

    out: list[str] = []
    turn = {"System": "", "Prompt": "", "Response": ""}

    def flush() -> None:
        out.append(tmpl.execute({**base, **turn}))
        turn.update(System="", Prompt="", Response="")

    for m in collated:
        role = m["role"]
        if role == "system":
            if turn["Prompt"] or turn["Response"]:
                flush()
            turn["System"] = m["content"]
        elif role == "user":
            if turn["Response"]:
                flush()
            turn["Prompt"] = m["content"]
        elif role == "assistant":
            turn["Response"] = m["content"]
    out.append(tmpl.execute({**base, **turn}, _cut_after_response(tmpl.nodes)))
    return "".join(out)
