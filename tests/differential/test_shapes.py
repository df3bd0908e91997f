"""The differential suite's own parts, checked without a reference server: what counts as a
difference, and the allow-list as docs/compat.md holds it."""

from __future__ import annotations

import pytest
from allowlist import COMPAT, read_allow_list
from corpus import CORPUS
from shapes import Reduced, differences, reduce_body, shape, stream_shape


def test_shape_keeps_json_types_not_values() -> None:
    assert shape({"a": 10000, "b": 10000.0, "c": None, "d": [], "e": True}) == {
        "a": "integer", "b": "float", "c": "null", "d": "list(empty)", "e": "boolean",
    }  # fmt: skip
    assert shape([{"x": 1}, {"y": "s"}]) == [{"x": "integer", "y": "string"}]
    assert shape([1, "a"]) == ["integer|string"]
    assert shape([[{"a": 1}], [{"a": None}]]) == [[{"a": "integer|null"}]]


def test_a_stream_shape_does_not_depend_on_its_length() -> None:
    token, final = {"t": "string"}, {"done": "boolean"}
    assert stream_shape([token, token, token, token, final]) == stream_shape([token, token, final])
    assert stream_shape([token, token, final]) == [token, token, final]
    assert stream_shape([token, final]) == [token, final]


def test_differences_name_where() -> None:
    ours = Reduced(404, {"content-type": "application/json"}, {"error": "string"}, {"error": "a"})
    theirs = Reduced(405, {"content-type": "text/plain", "allow": "POST"}, {"text": "t"}, {})
    found = {where for where, _, _ in differences(ours, theirs)}
    assert found == {
        "status", "header/content-type", "header/allow", "body/error", "body/text", "value/error",
    }  # fmt: skip
    same = Reduced(200, {}, {"a": [{"b": "integer"}]})
    assert differences(same, same) == []
    nested = Reduced(200, {}, {"a": [{"b": "float"}]})
    assert differences(same, nested) == [("body/a/items/b", "integer", "float")]


def test_bodies_are_read_by_media_type() -> None:
    shaped, parsed = reduce_body("application/x-ndjson", b'{"a": 1}\n{"a": 2}\n{"done": true}\n')
    assert shaped == {"ndjson": {"first": {"a": "integer"}, "middle": {"a": "integer"},
                                 "last": {"done": "boolean"}}}  # fmt: skip
    assert parsed[-1] == {"done": True}
    shaped, _ = reduce_body("text/event-stream", b"event: x\ndata: {}\n\ndata: [DONE]\n\n")
    assert shaped == {
        "sse": {"events": ["x", "message [DONE]"], "x": {}, "message [DONE]": "string"}
    }
    assert reduce_body("text/plain", b"404 page not found")[0] == {"text": "404 page not found"}


def test_the_allow_list_is_read_from_compat_md() -> None:
    rows = read_allow_list(COMPAT.read_text())
    assert rows, "docs/compat.md lists the deliberate differences"
    assert all(len(row.why) > 20 for row in rows), "every row says why"
    names = {case.name for case in CORPUS}
    for row in rows:
        for case in row.cases:
            bare = case.split(" → ")[0]
            assert any(ch in bare for ch in "*?[") or bare in names, f"no such case: {case}"


def test_a_malformed_row_is_refused() -> None:
    with pytest.raises(ValueError, match="not in the form"):
        read_allow_list("## Allow-list\n\n| `a` | b | why |\n")
    with pytest.raises(ValueError, match="no '## Allow-list' section"):
        read_allow_list("# nothing\n")
