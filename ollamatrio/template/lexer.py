"""The lexer: template text cut into text and actions, each action into tokens, with Go's
trim markers (``{{-``, ``-}}``), comments and literals (strings, raw strings, characters,
numbers)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import error_at

_SPACE = " \t\r\n"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FIELDS = re.compile(r"(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_NUMBER = re.compile(
    r"[+-]?(?:0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|"
    r"(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][+-]?[0-9]+)?)"
)


@dataclass(frozen=True)
class Token:
    kind: str  # field var dot ident string number bool nil ( ) | := = ,
    value: Any
    pos: int
    end: int


@dataclass(frozen=True)
class Text:
    text: str
    pos: int


@dataclass(frozen=True)
class Action:
    tokens: tuple[Token, ...]
    pos: int  # offset of "{{"


def lex(source: str) -> list[Text | Action]:
    items: list[Text | Action] = []
    pos = 0
    while True:
        start = source.find("{{", pos)
        if start < 0:
            if pos < len(source):
                items.append(Text(source[pos:], pos))
            return items
        trim_left = source.startswith("-", start + 2) and source[start + 3 : start + 4] in (
            tuple(_SPACE)
        )
        text = source[pos:start]
        if trim_left:
            text = text.rstrip(_SPACE)
        if text:
            items.append(Text(text, pos))
        inner = start + (3 if trim_left else 2)
        probe = inner + 1 if trim_left else inner
        if source.startswith("/*", probe):
            close = source.find("*/", probe + 2)
            if close < 0:
                raise error_at(source, start, "unclosed comment")
            after = close + 2
            trim_right = False
            if source.startswith(" -}}", after):
                trim_right, after = True, after + 4
            elif source.startswith("}}", after):
                after += 2
            else:
                raise error_at(source, close, "comment ends before closing delimiter")
        else:
            tokens, after, trim_right = _lex_action(source, inner)
            items.append(Action(tuple(tokens), start))
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
            raise error_at(source, pos, "unclosed action")
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
                raise error_at(source, start, "unterminated raw quoted string")
            tokens.append(Token("string", source[pos + 1 : close], start, close + 1))
            pos = close + 1
        elif ch == "'":
            value, pos = _lex_string(source, pos, quote="'")
            if len(value) != 1:
                raise error_at(source, start, "malformed character constant")
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
                    raise error_at(source, start, f"bad number syntax: {text!r}") from None
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
            raise error_at(source, pos, f"unexpected {ch!r} in action")


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def _lex_string(source: str, pos: int, quote: str = '"') -> tuple[str, int]:
    """A Go interpreted string literal starting at ``pos``; returns (value, offset after)."""
    out: list[str] = []
    i = pos + 1
    while True:
        if i >= len(source) or source[i] == "\n":
            raise error_at(source, pos, "unterminated quoted string")
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
                raise error_at(source, i, "bad escape in string")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        elif esc and esc in "01234567":
            digits = source[i + 1 : i + 4]
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise error_at(source, i, f"unknown escape sequence \\{esc}")
