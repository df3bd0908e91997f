"""``python -m ollamatrio.testing OUT.gguf [options]``: write a generated test model."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import get_args

from ollamatrio.testing.tiny_gguf import CHATML, CORRUPTIONS, Dtype, Pooling, write_tiny_gguf
from ollamatrio.testing.vocab import TokenizerKind


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m ollamatrio.testing",
        description="Write a small random-weight llama GGUF model (or a sparse or corrupt one).",
    )
    ap.add_argument("out", help="output .gguf path")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    ap.add_argument("--ff", type=int, default=None, help="default: 2 * --embd")
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--dtype", choices=get_args(Dtype), default="f32")
    ap.add_argument("--tokenizer", choices=get_args(TokenizerKind), default="llama")
    ap.add_argument("--sparse", action="store_true", help="tensor data as a hole: no disk used")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="tiny-llama")
    ap.add_argument("--no-chat-template", action="store_true")
    ap.add_argument("--pooling", choices=get_args(Pooling), default=None)
    ap.add_argument("--corrupt", choices=CORRUPTIONS, default=None)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        path = write_tiny_gguf(
            args.out,
            layers=args.layers,
            embd=args.embd,
            heads=args.heads,
            kv_heads=args.kv_heads,
            ff=args.ff,
            vocab=args.vocab,
            ctx=args.ctx,
            dtype=args.dtype,
            tokenizer=args.tokenizer,
            sparse=args.sparse,
            seed=args.seed,
            name=args.name,
            pooling=args.pooling,
            corrupt=args.corrupt,
            chat_template=None if args.no_chat_template else CHATML,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    st = os.stat(path)
    on_disk = st.st_blocks * 512
    print(
        f"wrote {path}: {st.st_size} bytes declared ({st.st_size / 2**20:.1f} MiB), "
        f"{on_disk} bytes on disk ({on_disk / 2**20:.1f} MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
