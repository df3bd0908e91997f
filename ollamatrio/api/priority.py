"""A request's place in the scheduler's queue: whose it is and how urgent (docs/scheduling.md,
"The queue").

The principal is the chain's (:attr:`~.chain.RequestState.principal`); the priority is
``interactive`` (the default) or ``batch``, asked for by an ``X-Priority`` header on any
route or a top-level ``priority`` field in a generation's body (which wins; the OpenAI and
Anthropic SDKs send it with ``extra_body``).  The cost is the prompt's tokens, estimated
before anything is tokenized: a character count over :data:`CHARS_PER_TOKEN`.
"""

from __future__ import annotations

from ..errors import InvalidRequestError
from ..generation.requests import ChatRequest, EmbedRequest, GenerateRequest, RerankRequest
from ..scheduler.fair_queue import PRIORITIES, Priority

FIELD = "priority"  # the body's field
HEADER = b"x-priority"  # the header, as ASGI gives its name

#: Characters per token of the cost estimate: about what BPE tokenizers give English text
#: and code; the queue only needs the proportions between requests right.
CHARS_PER_TOKEN = 4


def checked_priority(value: object) -> Priority:
    """``value`` as a priority, or a 400 saying which values there are."""
    if value in PRIORITIES:
        return value
    raise InvalidRequestError(
        f"invalid priority {value!r}: expected one of {', '.join(PRIORITIES)}"
    )


def estimated_cost(req: GenerateRequest | ChatRequest | EmbedRequest | RerankRequest) -> int:
    """The tokens ``req``'s prompt will be, estimated from its characters (at least 1)."""
    if isinstance(req, GenerateRequest):
        chars = len(req.prompt) + len(req.system) + len(req.suffix)
    elif isinstance(req, ChatRequest):
        chars = sum(len(m.content) + len(m.thinking) for m in req.messages)
        chars += sum(len(str(tool)) for tool in req.tools)
    elif isinstance(req, RerankRequest):  # the query goes with every document
        chars = sum(len(req.query) + len(doc) for doc in req.documents)
    else:
        chars = sum(len(text) for text in req.inputs)
    return max(1, chars // CHARS_PER_TOKEN)
