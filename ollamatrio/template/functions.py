"""Go's template functions (less ``call``, ``html``, ``js``, ``urlquery``) and Ollama's
``json``: what each computes, and how many arguments it takes."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ..gofmt import format_float, quote
from .errors import TemplateError
from .values import go_json, go_str, truth


def _byte_len(value: str) -> int:
    return len(value.encode("utf-8"))


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


EAGER: dict[str, Callable[..., Any]] = {
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
FUNCTIONS = frozenset({"and", "or", *EAGER})
ARITY = {"not": (1, 1), "len": (1, 1), "index": (1, None), "slice": (1, None), "eq": (1, None)}
ARITY |= {name: (2, 2) for name in ("ne", "lt", "le", "gt", "ge")}
ARITY |= {"json": (1, 1), "printf": (1, None), "and": (1, None), "or": (1, None)}
