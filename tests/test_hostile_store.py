"""The model store as a hostile client sees it, over raw sockets: concurrent create, copy
and delete of the same names leave no orphan blobs; error bodies name models and digests,
never the server's paths; a GGUF llama.cpp cannot load is refused at ``/api/create``."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import trio
from conftest import ServerFactory

from ollamatrio.testing.store_race import run_race, store_audit


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port


async def test_racing_create_copy_delete_leaves_no_orphans(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        host, port = host_port(srv.url)
        result = await trio.to_thread.run_sync(
            lambda: run_race(host, port, "tiny", threads=8, operations=30, seed=1)
        )
        models_dir = Path(srv.store.root)
    assert result.server_errors == 0, result.errors
    assert sum(result.operations.values()) == 240
    assert set(result.statuses) <= {200, 404}
    audit = store_audit(models_dir)  # the server has stopped: nothing writes the store
    assert audit.missing == ()
    assert audit.orphans == ()
