"""When a slot state is worth saving and restoring, and how long an unload may spend saving.

Measured on this project's CPU test machine with SmolLM2-135M (docs/memory.md, "Prompt
states on disk"; ``scripts/bench_slot_restore.py``): a restore reads the state file
(22.5 KiB a token for that model) at page-cache or disk speed and costs a few
milliseconds of requests around it (the prompt rendered and tokenized, ``/slots``, the
restore), while evaluating a prompt costs milliseconds *per token*.  Restoring wins from
a few dozen tokens on; the floors below leave room for GPUs, where evaluation is one to
two orders of magnitude faster and the state of a larger model is larger.
"""

from __future__ import annotations

# A slot holding fewer tokens is not saved: re-evaluating it costs about what the restore
# round trip does on a GPU, and it would push longer states out of the bounded folder.
MIN_SAVE_TOKENS = 256
# A saved state is restored only when it shares at least this many leading tokens with
# the incoming prompt (the same reasoning, at the restore side).
MIN_RESTORE_TOKENS = 256
# Seconds an unloading runner may spend saving its slots, all of them together.  An
# eviction that needs the memory waits at most this long for it; what is not saved by
# then is lost (the save in flight is dropped, never half-kept).
SAVE_SECONDS = 3.0
