"""The tokens of a relayed answer, read from each dialect's own counts (fleet/gateway_tokens.py)."""

from __future__ import annotations

import json

import pytest

from ollamatrio.fleet.gateway_tokens import TokenTally


def fed(*pieces: bytes) -> tuple[int, int, int]:
    tally = TokenTally()
    for piece in pieces:
        tally.feed(piece)
    return tally.counts()


def test_a_native_stream_in_pieces_that_split_its_lines():
    last = json.dumps({"done": True, "prompt_eval_count": 30, "prompt_cached_count": 10,
                       "eval_count": 7}).encode()  # fmt: skip
    body = b'{"response":"a","done":false}\n' * 3 + last + b"\n"
    assert fed(body[:17], body[17:50], body[50:]) == (20, 10, 7)


def test_a_native_answer_in_one_piece_without_a_newline():
    assert fed(b'{"done":true,"prompt_eval_count":5,"eval_count":2}') == (5, 0, 2)


def test_an_openai_stream_and_answer():
    final = {"usage": {"prompt_tokens": 12, "completion_tokens": 4,
                       "prompt_tokens_details": {"cached_tokens": 8}}}  # fmt: skip
    stream = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    stream += b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n"
    assert fed(stream) == (4, 8, 4)
    assert fed(json.dumps({"id": "x", **final}).encode()) == (4, 8, 4)


def test_an_anthropic_stream_takes_its_input_first_and_its_output_last():
    events = [
        {"type": "message_start", "message": {"usage": {
            "input_tokens": 9, "cache_read_input_tokens": 3, "output_tokens": 1}}},
        {"type": "content_block_delta", "delta": {"text": "hi"}},
        {"type": "message_delta", "usage": {"output_tokens": 6}},
    ]  # fmt: skip
    body = b"".join(b"event: x\ndata: " + json.dumps(e).encode() + b"\n\n" for e in events)
    assert fed(body) == (9, 3, 6)


def test_the_responses_api_completed_event():
    done = {
        "type": "response.completed",
        "response": {
            "usage": {
                "input_tokens": 20,
                "output_tokens": 5,
                "input_tokens_details": {"cached_tokens": 15},
            }
        },
    }
    assert fed(b"data: " + json.dumps(done).encode() + b"\n\n") == (5, 15, 5)


@pytest.mark.parametrize("body", [b"", b"not json at all", b'{"usage": "broken"', b"[1,2]"])
def test_anything_else_counts_nothing(body: bytes):
    assert fed(body) == (0, 0, 0)
