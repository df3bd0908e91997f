"""The soak's hostile mix (``ollamatrio.testing.hostile``, ``scripts/soak.py --hostile``)
against a live server: every probe is answered as designed, and the server then still
serves a well-formed client.  The per-defect tests are the ``test_hostile_*.py`` files
beside this one; this one keeps the soak's expectations and the server's answers in step."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from ollamatrio.testing.hostile import Hostile, describe, status_of

BODY_TIMEOUT = 0.5  # seconds: the slow-body probe waits it out


@pytest.mark.parametrize(
    "kind",
    ["slow_body", "half_close", "http10", "h2_preface", "h2c_upgrade", "duplicate_host",
     "bad_host", "oversize_upload"],
)  # fmt: skip
async def test_each_hostile_probe_is_answered_as_designed(api_server: Any, kind: str) -> None:
    async with api_server(body_timeout=BODY_TIMEOUT) as srv:
        parts = urlsplit(srv.url)
        assert parts.hostname is not None
        assert parts.port is not None
        hostile = Hostile(parts.hostname, parts.port, "tiny", BODY_TIMEOUT,
                          upload_bytes=4 << 20, limit=5.0)  # fmt: skip
        assert sorted(hostile.kinds()) == sorted(
            ["slow_body", "half_close", "http10", "h2_preface", "h2c_upgrade",
             "duplicate_host", "bad_host", "oversize_upload"]
        )  # fmt: skip
        with trio.fail_after(30):
            await hostile.kinds()[kind]()
        (probe,) = hostile.probes
        assert probe.kind == kind
        assert probe.as_designed, probe
        async with httpx.AsyncClient(base_url=srv.url) as client:
            assert (await client.get("/api/version")).status_code == 200


def test_a_probe_reads_the_first_status_and_says_when_the_server_left_it_open() -> None:
    assert status_of(b"HTTP/1.1 408 Request Timeout\r\n\r\n") == 408
    assert status_of(b"HTTP/1.0 200 OK\r\n") == 200
    assert status_of(b"") == 0
    assert status_of(b"\x00\x00\x12\x04") == 0  # an HTTP/2 SETTINGS frame is no answer
    assert describe(400, True) == "400"
    assert describe(0, False) == "no response, left open"
