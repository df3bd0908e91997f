"""Claude Code's billing block, which is removed from ``system`` before templating.

Claude Code sends as the first ``system`` block one line such as
``x-anthropic-billing-header: cc_version=2.1.328.a3f; cc_entrypoint=sdk-cli;``.  It is
billing metadata for Anthropic's API, not text for the model, and its three hex characters
derive from the session's first prompt: kept, it makes two sessions differ at character ~47
of a ~12k-token prefix, so no session can reuse another's evaluated system text and tools.
vLLM strips it server-side; Claude Code omits it with ``CLAUDE_CODE_ATTRIBUTION_HEADER=0``.

The rule (docs/api.md, "Stable prompts"): the first system block is dropped only when its
whole text is that one header line of ``key=value;`` pairs, so nothing the model is meant
to read is ever changed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

PREFIX = "x-anthropic-billing-header:"
# The whole block: the prefix, then ``key=value;`` pairs (values without ``;`` or newlines).
_BLOCK = re.compile(r"x-anthropic-billing-header:(?:[ \t]*[\w.-]+=[^;\r\n]*;)*[ \t]*\r?\n?")


def is_billing_block(text: str) -> bool:
    """Whether ``text`` is exactly one billing header line and nothing else."""
    return _BLOCK.fullmatch(text) is not None


def without_billing_block(texts: Sequence[str]) -> Sequence[str]:
    """A system prompt's block texts without a leading billing block."""
    if texts and is_billing_block(texts[0]):
        return texts[1:]
    return texts
