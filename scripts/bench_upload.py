"""Blob uploads against a real server process: how far its resident memory rises.

Each case starts a fresh ``python -m ollamatrio serve`` (simulated engine, empty store) and
uploads ``--size`` MiB to ``POST /api/blobs/<digest>`` while sampling the server's RSS
(``ollamatrio/testing/uploads.py``): raw sockets with ``Content-Length`` and chunked
framing, under the right digest and a wrong one, and the official ``ollama`` Python client's
``create_blob`` on a file of that size.  Prints one row per case: the answer, the time, the
server's RSS before and at its peak, and what was left in the store's blobs folder.

    PYTHONPATH=$PWD python scripts/bench_upload.py --size 1024 [--pythonpath OTHER_TREE]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import ollama

from ollamatrio.testing.uploads import (
    MIB,
    WRONG_DIGEST,
    RssWatch,
    ServerProcess,
    block_of,
    digest_of,
    pieces,
    server_process,
    upload,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="MiB per upload (1024)")
    parser.add_argument(
        "--pattern", choices=["random", "zeros"], default="random",
        help="the body: a seeded random 1 MiB block repeated (default), or zeros (holes)",
    )  # fmt: skip
    parser.add_argument(
        "--cases", default="cl-right,cl-wrong,chunked-right,chunked-wrong,ollama-client",
        help="comma-separated subset of the cases",
    )  # fmt: skip
    parser.add_argument(
        "--pythonpath", help="the server's PYTHONPATH (another tree, e.g. from git archive)"
    )
    args = parser.parse_args()
    env = {"PYTHONPATH": args.pythonpath} if args.pythonpath else None
    size = args.size * MIB
    block = block_of(args.pattern)
    right = digest_of(block, size)

    def raw(digest: str, chunked: bool) -> Callable[[ServerProcess], str]:
        def run(server: ServerProcess) -> str:
            answer = upload(server.address, digest, block, size, chunked=chunked)
            return f"{answer.status} in {answer.seconds:.1f} s"

        return run

    def client(server: ServerProcess) -> str:
        path = server.models.parent / "upload.bin"
        with open(path, "wb") as f:
            for piece in pieces(block, size):
                f.write(piece)
        try:
            start = time.perf_counter()
            digest = ollama.Client(host=server.url).create_blob(path)
            assert digest == right, digest
            return f"ok in {time.perf_counter() - start:.1f} s"
        finally:
            path.unlink()

    cases: dict[str, Callable[[ServerProcess], str]] = {
        "cl-right": raw(right, False),
        "cl-wrong": raw(WRONG_DIGEST, False),
        "chunked-right": raw(right, True),
        "chunked-wrong": raw(WRONG_DIGEST, True),
        "ollama-client": client,
    }
    print(f"{args.size} MiB of {args.pattern} per upload; server RSS in MiB")
    print(f"{'case':<15} {'answer':<16} {'RSS before':>10} {'peak':>7} {'rise':>7}  blobs left")
    for name in args.cases.split(","):
        with tempfile.TemporaryDirectory() as tmp, server_process(Path(tmp) / "models", env) as srv:
            with RssWatch(srv.proc.pid) as watch:
                answer = cases[name](srv)
            left = ",".join(f[:20] for f in srv.blob_files()) or "-"
            print(
                f"{name:<15} {answer:<16} {watch.base / MIB:>10.0f} {watch.peak / MIB:>7.0f} "
                f"{watch.rise / MIB:>7.0f}  {left}",
                flush=True,
            )


if __name__ == "__main__":
    main()
