"""The syntax tree of a template and the parser that builds it from the lexer's items:
pipelines, commands and operands, ``if``/``range``/``with`` with their ``else`` branches,
``break`` and ``continue``; functions must be known (:mod:`.functions`) when parsed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import TemplateError, error_at
from .functions import FUNCTIONS
from .lexer import Action, Text, Token, lex

_KEYWORDS = frozenset(
    {"if", "else", "end", "range", "with", "break", "continue", "define", "template", "block"}
)


# -- syntax tree -----------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    names: tuple[str, ...]
    pos: int


@dataclass(frozen=True)
class Variable:
    name: str
    names: tuple[str, ...]  # fields after the variable: $m.Role
    pos: int


@dataclass(frozen=True)
class Dot:
    pos: int


@dataclass(frozen=True)
class Literal:
    value: Any
    pos: int


@dataclass(frozen=True)
class Function:
    name: str
    pos: int


@dataclass(frozen=True)
class Chain:
    """A parenthesised pipeline, possibly followed by fields: ``(index .X 0).Name``."""

    pipe: Pipe
    names: tuple[str, ...]
    pos: int


Operand = Field | Variable | Dot | Literal | Function | Chain


@dataclass(frozen=True)
class Command:
    args: tuple[Operand, ...]
    pos: int


@dataclass(frozen=True)
class Pipe:
    decl: tuple[str, ...]  # variables declared or assigned
    assign: bool  # "=" rather than ":="
    commands: tuple[Command, ...]
    pos: int


@dataclass(frozen=True)
class ActionNode:
    pipe: Pipe


@dataclass(frozen=True)
class TextNode:
    text: str


@dataclass(frozen=True)
class Branch:
    kind: str  # if | range | with
    pipe: Pipe
    body: tuple[Node, ...]
    orelse: tuple[Node, ...]


@dataclass(frozen=True)
class LoopControl:
    kind: str  # break | continue
    pos: int


Node = TextNode | ActionNode | Branch | LoopControl


# -- parser ----------------------------------------------------------------------------


class Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.items = lex(source)
        self.index = 0
        self.loops = 0

    def error(self, pos: int, message: str) -> TemplateError:
        return error_at(self.source, pos, message)

    def parse(self) -> tuple[Node, ...]:
        nodes, stop = self.parse_list()
        if stop is not None:
            raise self.error(stop.pos, f"unexpected {{{{{stop.tokens[0].value}}}}}")
        return nodes

    def parse_list(self) -> tuple[tuple[Node, ...], Action | None]:
        """Nodes up to an ``else``/``end`` action (returned) or the end of input (None)."""
        nodes: list[Node] = []
        while self.index < len(self.items):
            item = self.items[self.index]
            self.index += 1
            if isinstance(item, Text):
                nodes.append(TextNode(item.text))
                continue
            if not item.tokens:
                raise self.error(item.pos, "missing value for command")
            head = item.tokens[0]
            word = head.value if head.kind == "ident" else None
            if word in ("else", "end"):
                return tuple(nodes), item
            if word in ("if", "range", "with"):
                nodes.append(self.parse_branch(word, item, 1))
            elif word in ("break", "continue"):
                if len(item.tokens) > 1:
                    raise self.error(item.tokens[1].pos, f"unexpected token in {{{{{word}}}}}")
                if not self.loops:
                    raise self.error(item.pos, f"{{{{{word}}}}} outside {{{{range}}}}")
                nodes.append(LoopControl(word, item.pos))
            elif word in ("define", "template", "block"):
                raise self.error(item.pos, f"{{{{{word}}}}} is not supported")
            else:
                nodes.append(ActionNode(self.parse_pipe(item.tokens, item.pos)))
        return tuple(nodes), None

    def parse_branch(self, kind: str, item: Action, skip: int) -> Branch:
        tokens = item.tokens[skip:]
        if not tokens:
            raise self.error(item.pos, f"missing value for {kind}")
        pipe = self.parse_pipe(tokens, item.pos, decl_limit=2 if kind == "range" else 1)
        if kind == "range":
            self.loops += 1
        body, stop = self.parse_list()
        if kind == "range":
            self.loops -= 1
        if stop is None:
            raise self.error(item.pos, f"unexpected EOF: {{{{{kind}}}}} has no {{{{end}}}}")
        head = stop.tokens[0].value
        orelse: tuple[Node, ...] = ()
        if head == "else":
            rest = stop.tokens[1:]
            if rest and rest[0].kind == "ident" and rest[0].value in ("if", "with"):
                if kind == "range" or rest[0].value != kind:
                    raise self.error(rest[0].pos, f"unexpected {rest[0].value} in {kind} else")
                # "else if" is an if nested in the else branch that shares the end.
                orelse = (self.parse_branch(rest[0].value, stop, 2),)
                return Branch(kind, pipe, body, orelse)
            if rest:
                raise self.error(rest[0].pos, "unexpected token after else")
            orelse, stop = self.parse_list()
            if stop is None or stop.tokens[0].value != "end":
                where = item.pos if stop is None else stop.pos
                raise self.error(where, f"expected {{{{end}}}} for {{{{{kind}}}}}")
        if len(stop.tokens) > 1:
            raise self.error(stop.tokens[1].pos, "unexpected token after end")
        return Branch(kind, pipe, body, orelse)

    def parse_pipe(self, tokens: Sequence[Token], pos: int, decl_limit: int = 1) -> Pipe:
        decl: list[str] = []
        assign = False
        i = 0
        # "$x :=", "$x =", or (range) "$i, $v :="
        j = 0
        names: list[str] = []
        while j < len(tokens) and tokens[j].kind == "var" and not tokens[j].value[1]:
            names.append(tokens[j].value[0])
            if j + 1 < len(tokens) and tokens[j + 1].kind == "," and len(names) < decl_limit:
                j += 2
                continue
            break
        if names and j + 1 < len(tokens) and tokens[j + 1].kind in (":=", "="):
            decl, assign, i = names, tokens[j + 1].kind == "=", j + 2
        commands, i = self.parse_commands(tokens, i, pos, top=True)
        if i != len(tokens):
            raise self.error(tokens[i].pos, f"unexpected {tokens[i].value!r} in command")
        return Pipe(tuple(decl), assign, tuple(commands), pos)

    def parse_commands(
        self, tokens: Sequence[Token], i: int, pos: int, *, top: bool
    ) -> tuple[list[Command], int]:
        commands: list[Command] = []
        args: list[Operand] = []
        start = tokens[i].pos if i < len(tokens) else pos
        while i < len(tokens):
            tok = tokens[i]
            if tok.kind == "|":
                if not args:
                    raise self.error(tok.pos, "missing command before |")
                commands.append(Command(tuple(args), start))
                args = []
                i += 1
                start = tokens[i].pos if i < len(tokens) else tok.pos
                continue
            if tok.kind == ")":
                if top:
                    raise self.error(tok.pos, "unexpected right paren")
                break
            operand, i = self.parse_operand(tokens, i)
            args.append(operand)
        if not args:
            raise self.error(start, "missing value for command")
        commands.append(Command(tuple(args), start))
        return commands, i

    def parse_operand(self, tokens: Sequence[Token], i: int) -> tuple[Operand, int]:
        tok = tokens[i]
        if tok.kind == "field":
            return Field(tok.value, tok.pos), i + 1
        if tok.kind == "var":
            return Variable(tok.value[0], tok.value[1], tok.pos), i + 1
        if tok.kind == "dot":
            return Dot(tok.pos), i + 1
        if tok.kind in ("string", "number", "bool", "nil"):
            return Literal(tok.value, tok.pos), i + 1
        if tok.kind == "ident":
            if tok.value in _KEYWORDS:
                raise self.error(tok.pos, f"unexpected {tok.value!r} in command")
            if tok.value not in FUNCTIONS:
                raise self.error(tok.pos, f'function "{tok.value}" not defined')
            return Function(tok.value, tok.pos), i + 1
        if tok.kind == "(":
            commands, j = self.parse_commands(tokens, i + 1, tok.pos, top=False)
            if j >= len(tokens) or tokens[j].kind != ")":
                raise self.error(tok.pos, "unclosed left paren")
            names: tuple[str, ...] = ()
            follows = tokens[j + 1] if j + 1 < len(tokens) else None
            if follows is not None and follows.kind == "field" and follows.pos == tokens[j].end:
                names = follows.value
                j += 1
            return Chain(Pipe((), False, tuple(commands), tok.pos), names, tok.pos), j + 1
        raise self.error(tok.pos, f"unexpected {tok.value!r} in operand")
