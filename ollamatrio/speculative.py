"""The ``speculative`` option: whether a runner drafts tokens for the model to verify.

Speculative decoding lets a cheap drafter propose several tokens that the model checks in one
batched pass; a drafted token is kept only where it is the token the model itself samples
there, so the answer does not change, only the number of passes it costs.  The values:

* ``auto`` (the default): the drafter the measurements say pays (docs/speculative.md): the
  model's draft model (or MTP heads) when it has one, else n-gram drafting;
* ``off``: no drafting;
* ``ngram``: n-gram drafting, which proposes the tokens that followed the same few tokens
  earlier in the context (agents re-emitting a file, a diff quoting the prompt); no second
  model;
* ``draft``: the model's draft model (a Modelfile ``DRAFT`` line), or its own
  multi-token-prediction heads; a model with neither refuses the request.

The drafter is chosen when a runner loads (llama.cpp takes it from its load parameters and
ignores per-request fields), so the option is a load-time one, like ``num_ctx``: a request
whose option asks for another drafter than the loaded runner's reloads it.  ``auto`` and
``ngram`` load the same drafter for a model without a draft model, so switching between them
never reloads.

A leaf: it imports nothing of the project, so the option's parsing is shared by the
Modelfile parser, the model configuration, the API's option checks and the scheduler.
"""

from __future__ import annotations

from typing import Final, Literal

Mode = Literal["auto", "off", "ngram", "draft"]
#: What a runner is loaded with: no drafter, n-gram drafting, or a draft model.
Drafter = Literal["none", "ngram", "draft"]

OPTION: Final = "speculative"
MODES: Final[tuple[Mode, ...]] = ("auto", "off", "ngram", "draft")
DEFAULT: Final[Mode] = "auto"


class SpeculativeError(ValueError):
    """A value of the option that cannot be used; the message names the option."""


def parse_mode(value: object) -> Mode:
    """``value`` as a mode: one of :data:`MODES` (case-insensitive), or raise."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        for mode in MODES:
            if mode == lowered:
                return mode
    shown = f'"{value}"' if isinstance(value, str) else type(value).__name__
    raise SpeculativeError(
        f"option {OPTION} must be one of " + ", ".join(f'"{m}"' for m in MODES) + f", not {shown}"
    )


def drafter_for(mode: Mode, *, has_draft_model: bool = False) -> Drafter:
    """The drafter a runner is loaded with for ``mode``.  ``draft`` without a draft model is
    an error (the caller answers 400)."""
    if mode == "off":
        return "none"
    if mode == "ngram":
        return "ngram"
    if mode == "draft":
        if not has_draft_model:
            raise SpeculativeError(
                f'option {OPTION} "draft" needs a draft model, and this model has none '
                "(a DRAFT line in its Modelfile)"
            )
        return "draft"
    return "draft" if has_draft_model else AUTO_WITHOUT_DRAFT_MODEL


#: What ``auto`` loads for a model without a draft model (docs/speculative.md, measured).
AUTO_WITHOUT_DRAFT_MODEL: Final[Drafter] = "ngram"
