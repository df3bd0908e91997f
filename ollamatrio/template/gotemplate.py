"""Ollama's Go ``text/template`` prompt templates, rendered in Python.

A Modelfile ``TEMPLATE`` is Go template syntax.  This module covers the subset Ollama's
templates use: text and ``{{ }}`` actions with ``{{-``/``-}}`` trimming, comments, fields
(``.Messages``, ``$.Tools``, ``$m.Role``), variables (``:=``, ``=``), pipelines,
``if``/``else if``/``else``, ``range`` (with ``else``, ``break``, ``continue``), ``with``,
Go's built-in functions (less ``call``, ``html``, ``js``, ``urlquery``) and Ollama's
``json``.

:func:`render_prompt` follows Ollama's ``template.Execute``: templates that mention
``.Messages`` get the whole conversation; older ones are executed once per user turn with
``.System``/``.Prompt``/``.Response`` (the legacy path).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequestError
from ..gofmt import format_float, format_value, quote


class TemplateError(InvalidRequestError):
    """A template that cannot be parsed or executed (a 400, with the position)."""


# -- lexer -----------------------------------------------------------------------------

_SPACE = " \t\r\n"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FIELDS = re.compile(r"(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_NUMBER = re.compile(
    r"[+-]?(?:0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|"
    r"(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][+-]?[0-9]+)?)"
)
_KEYWORDS = frozenset(
    {"if", "else", "end", "range", "with", "break", "continue", "define", "template", "block"}
)


@dataclass(frozen=True)
class Token:
    kind: str  # field var dot ident string number bool nil ( ) | := = ,
    value: Any
    pos: int
    end: int


@dataclass(frozen=True)
class _Text:
    text: str
    pos: int


@dataclass(frozen=True)
class _Action:
    tokens: tuple[Token, ...]
    pos: int  # offset of "{{"


def _position(source: str, pos: int) -> str:
    line = source.count("\n", 0, pos) + 1
    column = pos - (source.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {column}"


def _error(source: str, pos: int, message: str) -> TemplateError:
    return TemplateError(f"template: {_position(source, pos)}: {message}")


def _lex(source: str) -> list[_Text | _Action]:
    items: list[_Text | _Action] = []
    pos = 0
    while True:
        start = source.find("{{", pos)
        if start < 0:
            if pos < len(source):
                items.append(_Text(source[pos:], pos))
            return items
        trim_left = source.startswith("-", start + 2) and source[start + 3 : start + 4] in (
            tuple(_SPACE)
        )
        text = source[pos:start]
        if trim_left:
            text = text.rstrip(_SPACE)
        if text:
            items.append(_Text(text, pos))
        inner = start + (3 if trim_left else 2)
        probe = inner + 1 if trim_left else inner
        if source.startswith("/*", probe):
            close = source.find("*/", probe + 2)
            if close < 0:
                raise _error(source, start, "unclosed comment")
            after = close + 2
            trim_right = False
            if source.startswith(" -}}", after):
                trim_right, after = True, after + 4
            elif source.startswith("}}", after):
                after += 2
            else:
                raise _error(source, close, "comment ends before closing delimiter")
        else:
            tokens, after, trim_right = _lex_action(source, inner)
            items.append(_Action(tuple(tokens), start))
        pos = after
        if trim_right:
            while pos < len(source) and source[pos] in _SPACE:
                pos += 1


def _lex_action(source: str, pos: int) -> tuple[list[Token], int, bool]:
    """Tokens of one action from ``pos``; returns them, the offset after ``}}``, and
    whether the action ends with the right trim marker."""
    tokens: list[Token] = []
    n = len(source)
    while True:
        if pos >= n:
            raise _error(source, pos, "unclosed action")
        ch = source[pos]
        if ch in _SPACE:
            space = pos
            while pos < n and source[pos] in _SPACE:
                pos += 1
            if source.startswith("-}}", pos) and space < pos:
                return tokens, pos + 3, True
            continue
        if source.startswith("}}", pos):
            return tokens, pos + 2, False
        start = pos
        if ch in "()|,":
            tokens.append(Token(ch, ch, start, pos + 1))
            pos += 1
        elif source.startswith(":=", pos):
            tokens.append(Token(":=", ":=", start, pos + 2))
            pos += 2
        elif ch == "=":
            tokens.append(Token("=", "=", start, pos + 1))
            pos += 1
        elif ch == '"':
            value, pos = _lex_string(source, pos)
            tokens.append(Token("string", value, start, pos))
        elif ch == "`":
            close = source.find("`", pos + 1)
            if close < 0:
                raise _error(source, start, "unterminated raw quoted string")
            tokens.append(Token("string", source[pos + 1 : close], start, close + 1))
            pos = close + 1
        elif ch == "'":
            value, pos = _lex_string(source, pos, quote="'")
            if len(value) != 1:
                raise _error(source, start, "malformed character constant")
            tokens.append(Token("number", ord(value), start, pos))
        elif ch == "$":
            match = _IDENT.match(source, pos + 1)
            name = "$" + (match.group() if match else "")
            pos = match.end() if match else pos + 1
            fields = _FIELDS.match(source, pos)
            names: tuple[str, ...] = ()
            if fields:
                names = tuple(fields.group()[1:].split("."))
                pos = fields.end()
            tokens.append(Token("var", (name, names), start, pos))
        elif ch == "." and (fields := _FIELDS.match(source, pos)):
            tokens.append(Token("field", tuple(fields.group()[1:].split(".")), start, fields.end()))
            pos = fields.end()
        elif (number := _NUMBER.match(source, pos)) and number.group() not in "+-.":
            text = number.group().replace("_", "")
            try:
                number_value: int | float = int(text, 0)
            except ValueError:
                try:
                    number_value = float(text)
                except ValueError:
                    raise _error(source, start, f"bad number syntax: {text!r}") from None
            tokens.append(Token("number", number_value, start, number.end()))
            pos = number.end()
        elif ch == ".":
            tokens.append(Token("dot", ".", start, pos + 1))
            pos += 1
        elif match := _IDENT.match(source, pos):
            word = match.group()
            if word in ("true", "false"):
                tokens.append(Token("bool", word == "true", start, match.end()))
            elif word == "nil":
                tokens.append(Token("nil", None, start, match.end()))
            else:
                tokens.append(Token("ident", word, start, match.end()))
            pos = match.end()
        else:
            raise _error(source, pos, f"unexpected {ch!r} in action")


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def _lex_string(source: str, pos: int, quote: str = '"') -> tuple[str, int]:
    """A Go interpreted string literal starting at ``pos``; returns (value, offset after)."""
    out: list[str] = []
    i = pos + 1
    while True:
        if i >= len(source) or source[i] == "\n":
            raise _error(source, pos, "unterminated quoted string")
        ch = source[i]
        if ch == quote:
            return "".join(out), i + 1
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        esc = source[i + 1 : i + 2]
        if esc in _ESCAPES:
            out.append(_ESCAPES[esc])
            i += 2
        elif esc in ('"', "'", "\\"):
            out.append(esc)
            i += 2
        elif esc in ("x", "u", "U"):
            width = {"x": 2, "u": 4, "U": 8}[esc]
            digits = source[i + 2 : i + 2 + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise _error(source, i, "bad escape in string")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        elif esc and esc in "01234567":
            digits = source[i + 1 : i + 4]
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise _error(source, i, f"unknown escape sequence \\{esc}")


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


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.items = _lex(source)
        self.index = 0
        self.loops = 0

    def error(self, pos: int, message: str) -> TemplateError:
        return _error(self.source, pos, message)

    def parse(self) -> tuple[Node, ...]:
        nodes, stop = self.parse_list()
        if stop is not None:
            raise self.error(stop.pos, f"unexpected {{{{{stop.tokens[0].value}}}}}")
        return nodes

    def parse_list(self) -> tuple[tuple[Node, ...], _Action | None]:
        """Nodes up to an ``else``/``end`` action (returned) or the end of input (None)."""
        nodes: list[Node] = []
        while self.index < len(self.items):
            item = self.items[self.index]
            self.index += 1
            if isinstance(item, _Text):
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

    def parse_branch(self, kind: str, item: _Action, skip: int) -> Branch:
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


# -- values ----------------------------------------------------------------------------


def truth(value: Any) -> bool:
    """Go's notion of a true value: not false, 0, nil, or empty."""
    if value is None:
        return False
    if isinstance(value, bool | int | float | str | bytes | list | tuple | dict):
        return bool(value)
    if isinstance(value, Mapping | Sequence):
        return len(value) > 0
    return True


def go_json(value: Any) -> str:
    """``encoding/json``'s compact output, HTML characters escaped as Go does."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def go_str(value: Any) -> str:
    """``fmt.Sprint`` of one value, as a template prints it: nil prints nothing, and
    mappings print as JSON: the structures templates print (tools, tool-call arguments) have
    ``String`` methods that return JSON in Ollama."""
    if value is None:
        return ""
    if isinstance(value, Mapping):
        return go_json(value)
    if isinstance(value, list | tuple):
        return "[" + " ".join(go_str(v) for v in value) + "]"
    return format_value(value)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def field_of(value: Any, name: str) -> Any:
    """``value.Name``: a mapping key by the Go name, its JSON (snake_case) spelling, or its
    lower-case spelling; absent keys read as nil, as with Ollama's ``missingkey=zero``."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        for key in (name, _snake(name), name.lower()):
            if key in value:
                return value[key]
        return None
    if hasattr(value, name):
        return getattr(value, name)
    raise TemplateError(f"can't evaluate field {name} in type {type(value).__name__}")


def _byte_len(value: str) -> int:
    return len(value.encode("utf-8"))


# -- functions -------------------------------------------------------------------------


def _fn_len(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return _byte_len(value)
    if isinstance(value, Mapping | list | tuple):
        return len(value)
    raise TemplateError(f"len of type {type(value).__name__}")


def _fn_index(value: Any, *keys: Any) -> Any:
    for key in keys:
        if isinstance(value, Mapping):
            value = value.get(key)
        elif isinstance(value, list | tuple | str):
            if not isinstance(key, int) or isinstance(key, bool):
                raise TemplateError(f"cannot index slice/array with type {type(key).__name__}")
            if not 0 <= key < len(value):
                raise TemplateError(f"index out of range: {key}")
            value = value[key] if not isinstance(value, str) else value.encode()[key]
        elif value is None:
            raise TemplateError("index of untyped nil")
        else:
            raise TemplateError(f"can't index item of type {type(value).__name__}")
    return value


def _fn_slice(value: Any, *bounds: Any) -> Any:
    if not isinstance(value, str | list | tuple):
        raise TemplateError(f"can't slice item of type {type(value).__name__}")
    if len(bounds) > (2 if isinstance(value, str) else 3):
        raise TemplateError("too many slice indexes")
    size = _byte_len(value) if isinstance(value, str) else len(value)
    for b in bounds:
        if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b <= size:
            raise TemplateError(f"slice index out of range: {b}")
    low = bounds[0] if bounds else 0
    high = bounds[1] if len(bounds) > 1 else size
    if low > high:
        raise TemplateError(f"invalid slice index: {low} > {high}")
    if isinstance(value, str):
        return value.encode()[low:high].decode("utf-8", errors="replace")
    return list(value[low:high])


def _comparable(a: Any, b: Any) -> None:
    numeric = (int, float)
    if isinstance(a, numeric) and isinstance(b, numeric) and not isinstance(a, bool):
        return
    if a is None or b is None or type(a) is type(b):
        return
    raise TemplateError(f"incompatible types for comparison: {go_str(a)!r} and {go_str(b)!r}")


def _fn_eq(first: Any, *others: Any) -> bool:
    if not others:
        raise TemplateError("missing argument for comparison")
    for other in others:
        _comparable(first, other)
        if first == other:
            return True
    return False


def _ordered(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def compare(a: Any, b: Any) -> bool:
        _comparable(a, b)
        try:
            return op(a, b)
        except TypeError:
            raise TemplateError(f"invalid type for comparison: {type(a).__name__}") from None

    return compare


def _fn_print(*args: Any) -> str:
    """``fmt.Sprint``: a space between operands when neither side is a string."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if i and not isinstance(arg, str) and not isinstance(args[i - 1], str):
            out.append(" ")
        out.append(go_str(arg))
    return "".join(out)


_VERB = re.compile(r"%([-+# 0]*)(\d+)?(?:\.(\d+))?([a-zA-Z%])")


def _fn_printf(fmt: Any, *args: Any) -> str:
    """``fmt.Sprintf`` for the common verbs (%v %s %q %d %f %e %g %t %x %X %c %%)."""
    if not isinstance(fmt, str):
        raise TemplateError("printf: the format must be a string")
    values = iter(args)
    used = 0

    def verb(match: re.Match[str]) -> str:
        nonlocal used
        flags, width, precision, kind = match.groups()
        if kind == "%":
            return "%"
        try:
            arg = next(values)
        except StopIteration:
            return f"%!{kind}(MISSING)"
        used += 1
        spec = flags + (width or "") + (f".{precision}" if precision is not None else "")
        if kind in "vs":
            return f"%{spec}s" % go_str(arg)
        if kind == "q":
            return f"%{spec}s" % quote(go_str(arg))
        if kind == "t" and isinstance(arg, bool):
            return f"%{spec}s" % go_str(arg)
        if kind in "dxXoc" and isinstance(arg, int) and not isinstance(arg, bool):
            return f"%{spec}{'d' if kind == 'd' else kind}" % arg
        if kind in "xX" and isinstance(arg, str):
            text = arg.encode().hex()
            return f"%{spec}s" % (text.upper() if kind == "X" else text)
        if kind in "feEgG" and isinstance(arg, int | float) and not isinstance(arg, bool):
            if kind in "gG" and precision is None:
                return f"%{spec}s" % format_float(float(arg))  # Go's %g: shortest form
            return f"%{spec}{kind}" % arg
        return f"%!{kind}({type(arg).__name__}={go_str(arg)})"

    out = _VERB.sub(verb, fmt)
    if used < len(args):
        extra = ", ".join(f"{type(a).__name__}={go_str(a)}" for a in args[used:])
        out += f"%!(EXTRA {extra})"
    return out


_EAGER: dict[str, Callable[..., Any]] = {
    "not": lambda value: not truth(value),
    "len": _fn_len,
    "index": _fn_index,
    "slice": _fn_slice,
    "print": _fn_print,
    "println": lambda *args: " ".join(go_str(a) for a in args) + "\n",
    "printf": _fn_printf,
    "eq": _fn_eq,
    "ne": lambda a, b: not _fn_eq(a, b),
    "lt": _ordered(lambda a, b: a < b),
    "le": _ordered(lambda a, b: a <= b),
    "gt": _ordered(lambda a, b: a > b),
    "ge": _ordered(lambda a, b: a >= b),
    "json": go_json,
}
# Go's built-ins (less call, html, js, urlquery) and Ollama's json.
FUNCTIONS = frozenset({"and", "or", *_EAGER})
_ARITY = {"not": (1, 1), "len": (1, 1), "index": (1, None), "slice": (1, None), "eq": (1, None)}
_ARITY |= {name: (2, 2) for name in ("ne", "lt", "le", "gt", "ge")}
_ARITY |= {"json": (1, 1), "printf": (1, None), "and": (1, None), "or": (1, None)}


# -- evaluation ------------------------------------------------------------------------


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
        return _error(self.source, pos, message)

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
    low, high = _ARITY.get(head.name, (0, None))
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
        return _EAGER[head.name](*args)
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


# -- templates -------------------------------------------------------------------------


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
    nodes = _Parser(source).parse()
    return GoTemplate(source, nodes, frozenset(_identifiers(nodes)))


def is_go_template(text: str | None) -> bool:
    """A template layer in Go syntax (Jinja ones, passed to llama.cpp, use ``{%``)."""
    return bool(text) and "{%" not in str(text)


# -- Ollama's Execute ------------------------------------------------------------------

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
