"""Import a local GGUF file into the model store (OLLAMA_MODELS) under a model name.

    python scripts/import_gguf.py NAME PATH.gguf [--system TEXT] [--param key=value ...]
    python scripts/import_gguf.py NAME [PATH.gguf] -f Modelfile [--quiet]

With a Modelfile, its SYSTEM, TEMPLATE, PARAMETER, MESSAGE and LICENSE lines go into the
model, as ``ollamatrio create`` would send them; its ``FROM`` (relative to the Modelfile)
names the GGUF file unless PATH is given.  ``--system`` and ``--param`` win over it.

Idempotent: an existing model of that name made from the same file and settings is left as
it is.  The running server sees the model at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ollamatrio.config import Settings
from ollamatrio.modelfile import decode_modelfile, parse_modelfile
from ollamatrio.store import ModelStore, import_gguf

#: The demo model's Modelfile (scripts/demo imports SmolLM2 with it).
DEMO_MODELFILE = Path(__file__).resolve().parent / "smollm2.Modelfile"

# What a Modelfile contributes besides its FROM (the keys of /api/create and of
# ModelStore.create alike).
MODELFILE_FIELDS = (
    "template", "system", "license", "parameters", "messages", "renderer", "parser", "requires"
)  # fmt: skip


def modelfile_create_args(modelfile: Path) -> tuple[Path | None, dict[str, Any]]:
    """The GGUF file a Modelfile's ``FROM`` names (None when it names no local file) and
    the rest of it as ``ModelStore.create`` arguments."""
    mf = parse_modelfile(decode_modelfile(modelfile.read_bytes()))
    plan = mf.to_create_request(modelfile.resolve().parent)
    if any(key in plan.request for key in ("adapters", "draft_files")):
        raise SystemExit(f"{modelfile}: ADAPTER and DRAFT are not supported here")
    path = plan.uploads[0].path if len(plan.uploads) == 1 else None
    return path, {key: plan.request[key] for key in MODELFILE_FIELDS if key in plan.request}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("path", nargs="?")
    ap.add_argument("-f", "--file", type=Path, metavar="MODELFILE")
    ap.add_argument("--system")
    ap.add_argument("--param", action="append", default=[], metavar="KEY=JSON_VALUE")
    ap.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    args = ap.parse_args()
    path, create_args = args.path, {}
    if args.file is not None:
        from_path, create_args = modelfile_create_args(args.file)
        path = path or from_path
    if path is None:
        ap.error("PATH is required (or a Modelfile whose FROM names a local GGUF file)")
    parameters = dict(create_args.pop("parameters", {}))
    for item in args.param:
        key, _, value = item.partition("=")
        parameters[key] = json.loads(value)
    if args.system is not None:
        create_args["system"] = args.system
    store = ModelStore(Settings.from_env().models_dir)
    for event in import_gguf(store, args.name, path, parameters=parameters or None, **create_args):
        if event.get("status") != "copying file" and not args.quiet:
            print(event["status"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
