"""The interpreter: a parsed template (:class:`GoTemplate`, from :func:`parse`) executed
against data, with variables and their scopes, pipelines, short-circuit ``and``/``or``,
branches and ``range`` loops."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import TemplateError, error_at
from .functions import ARITY, EAGER
from .parser import (
    ActionNode,
    Branch,
    Chain,
    Command,
    Dot,
    Field,
    Function,
    Literal,
    LoopControl,
    Node,
    Operand,
    Parser,
    Pipe,
    TextNode,
    Variable,
)
from .values import field_of, go_str, truth


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


_MISSING = object()


@dataclass
class _State:
    source: str
    out: list[str] = field(default_factory=list)
    vars: list[tuple[str, Any]] = field(default_factory=list)

    def error(self, pos: int, message: str) -> TemplateError:
        return error_at(self.source, pos, message)

    def lookup(self, name: str, pos: int) -> Any:
        for key, value in reversed(self.vars):
            if key == name:
                return value
        raise self.error(pos, f"undefined variable: {name}")

    def assign(self, name: str, value: Any, pos: int) -> None:
        for i in range(len(self.vars) - 1, -1, -1):
            if self.vars[i][0] == name:
                self.vars[i] = (name, value)
                return
        raise self.error(pos, f"undefined variable: {name}")


def _walk_fields(value: Any, names: Sequence[str], state: _State, pos: int) -> Any:
    for name in names:
        try:
            value = field_of(value, name)
        except TemplateError as exc:
            raise state.error(pos, str(exc)) from None
    return value


def _operand(op: Operand, dot: Any, state: _State) -> Any:
    if isinstance(op, Field):
        return _walk_fields(dot, op.names, state, op.pos)
    if isinstance(op, Variable):
        return _walk_fields(state.lookup(op.name, op.pos), op.names, state, op.pos)
    if isinstance(op, Dot):
        return dot
    if isinstance(op, Literal):
        return op.value
    if isinstance(op, Chain):
        return _walk_fields(_pipe(op.pipe, dot, state), op.names, state, op.pos)
    raise state.error(op.pos, f"{op.name} is a function: it needs to be called")


def _command(cmd: Command, dot: Any, state: _State, piped: Any) -> Any:
    head, *rest = cmd.args
    if not isinstance(head, Function):
        if rest or piped is not _MISSING:
            raise state.error(cmd.pos, "can't give argument to non-function")
        return _operand(head, dot, state)
    arity = len(rest) + (piped is not _MISSING)
    low, high = ARITY.get(head.name, (0, None))
    if arity < low or (high is not None and arity > high):
        raise state.error(head.pos, f"wrong number of args for {head.name}: got {arity}")
    if head.name in ("and", "or"):
        # Short-circuit: evaluate operands left to right, stop at the deciding one.
        thunks: list[Callable[[], Any]] = [
            functools.partial(_operand, op, dot, state) for op in rest
        ]
        if piped is not _MISSING:
            thunks.append(lambda: piped)
        value: Any = None
        for thunk in thunks:
            value = thunk()
            if truth(value) != (head.name == "and"):
                return value
        return value
    args = [_operand(op, dot, state) for op in rest]
    if piped is not _MISSING:
        args.append(piped)
    try:
        return EAGER[head.name](*args)
    except TemplateError as exc:
        raise state.error(head.pos, f"error calling {head.name}: {exc}") from None


def _pipe(pipe: Pipe, dot: Any, state: _State) -> Any:
    value: Any = _MISSING
    for cmd in pipe.commands:
        value = _command(cmd, dot, state, value)
    for name in pipe.decl:
        if pipe.assign:
            state.assign(name, value, pipe.pos)
        else:
            state.vars.append((name, value))
    return value


def _iterate(value: Any, state: _State, pos: int) -> Iterator[tuple[Any, Any]]:
    if value is None:
        return iter(())
    if isinstance(value, Mapping):
        return ((k, value[k]) for k in sorted(value))
    if isinstance(value, list | tuple):
        return enumerate(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return ((i, i) for i in range(value))
    raise state.error(pos, f"range can't iterate over {go_str(value)}")


def _execute(nodes: Sequence[Node], dot: Any, state: _State) -> None:
    for node in nodes:
        if isinstance(node, TextNode):
            state.out.append(node.text)
        elif isinstance(node, ActionNode):
            value = _pipe(node.pipe, dot, state)
            if not node.pipe.decl:
                state.out.append(go_str(value))
        elif isinstance(node, LoopControl):
            raise _Break() if node.kind == "break" else _Continue()
        else:
            _branch(node, dot, state)


def _branch(node: Branch, dot: Any, state: _State) -> None:
    mark = len(state.vars)
    try:
        pipe = node.pipe
        if node.kind == "range":
            # Declared variables take the (index, element) of each iteration.
            value = _pipe(Pipe((), False, pipe.commands, pipe.pos), dot, state)
            ran = False
            for key, item in _iterate(value, state, pipe.pos):
                ran = True
                inner = len(state.vars)
                if len(pipe.decl) == 1:
                    state.vars.append((pipe.decl[0], item))
                elif len(pipe.decl) == 2:
                    state.vars.extend(((pipe.decl[0], key), (pipe.decl[1], item)))
                try:
                    _execute(node.body, item, state)
                except _Continue:
                    pass
                except _Break:
                    break
                finally:
                    del state.vars[inner:]
            if not ran:
                _execute(node.orelse, dot, state)
            return
        value = _pipe(pipe, dot, state)
        if truth(value):
            _execute(node.body, value if node.kind == "with" else dot, state)
        else:
            _execute(node.orelse, dot, state)
    finally:
        del state.vars[mark:]


def _identifiers(nodes: Sequence[Node]) -> set[str]:
    """Field and variable names the template mentions (Ollama's ``Template.Vars``)."""
    names: set[str] = set()

    def pipe(p: Pipe) -> None:
        for cmd in p.commands:
            for op in cmd.args:
                if isinstance(op, Field):
                    names.update(op.names)
                elif isinstance(op, Variable):
                    names.update((op.name, *op.names))
                elif isinstance(op, Chain):
                    pipe(op.pipe)

    def walk(items: Sequence[Node]) -> None:
        for node in items:
            if isinstance(node, ActionNode):
                pipe(node.pipe)
            elif isinstance(node, Branch):
                pipe(node.pipe)
                walk(node.body)
                walk(node.orelse)

    walk(nodes)
    return {n.lower() for n in names}


@dataclass(frozen=True)
class GoTemplate:
    source: str
    nodes: tuple[Node, ...]
    vars: frozenset[str]  # lower-case identifiers mentioned

    def execute(self, data: Any, nodes: Sequence[Node] | None = None) -> str:
        state = _State(self.source, vars=[("$", data)])
        _execute(self.nodes if nodes is None else nodes, data, state)
        return "".join(state.out)


@functools.lru_cache(maxsize=64)
def parse(source: str) -> GoTemplate:
    """Parse Go template text (cached per text); :class:`TemplateError` if it is invalid."""
    nodes = Parser(source).parse()
    return GoTemplate(source, nodes, frozenset(_identifiers(nodes)))
