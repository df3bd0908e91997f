"""Prompt states that survive their runner: slot states saved to disk on unload, restored
into the next runner of the same model and options (issue 22, item 3)."""

from .index import Match, SlotCache
from .key import cache_key
from .statefile import read_state_tokens
from .worth import MIN_RESTORE_TOKENS, MIN_SAVE_TOKENS, SAVE_SECONDS

__all__ = [
    "MIN_RESTORE_TOKENS",
    "MIN_SAVE_TOKENS",
    "SAVE_SECONDS",
    "Match",
    "SlotCache",
    "cache_key",
    "read_state_tokens",
]
