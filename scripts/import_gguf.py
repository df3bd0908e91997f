"""Import a local GGUF file into the model store (OLLAMA_MODELS) under a model name.

    python scripts/import_gguf.py NAME PATH.gguf [--system TEXT] [--param key=value ...]

Idempotent: an existing model of that name made from the same file is left as it is.
The running server sees the model at once (the store is read on every request).
"""

from __future__ import annotations

import argparse
import json
import sys

from ollamatrio.config import Settings
from ollamatrio.store import ModelStore


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("path")
    ap.add_argument("--system")
    ap.add_argument("--param", action="append", default=[], metavar="KEY=JSON_VALUE")
    args = ap.parse_args()
    parameters = {}
    for item in args.param:
        key, _, value = item.partition("=")
        parameters[key] = json.loads(value)
    store = ModelStore(Settings.from_env().models_dir)
    for event in store.import_gguf(
        args.name, args.path, system=args.system, parameters=parameters or None
    ):
        if event.get("status") != "copying file":
            print(event["status"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
