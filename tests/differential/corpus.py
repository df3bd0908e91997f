"""The requests sent to both servers, in order (later steps see the state earlier ones
left: loaded models, copies, deletions).

Every generation is greedy (temperature 0, a fixed seed) and short (a few tokens), so the
corpus stays within seconds of model time on two cores.  Both stores hold ``smol``, made
from the same Modelfile (``FROM`` SmolLM2-135M-Instruct Q4_1, one thread: two servers
share a small machine) by each side's CLI.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PIL import Image
from servers import REGISTRY_PORTS, free_port

MODEL = "smol"
GREEDY = {"temperature": 0, "seed": 1, "num_predict": 3}
TINY_PNG = (  # a 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/"
    "PchI7wAAAABJRU5ErkJggg=="
)
VISION = "smolvis"  # SmolLM2 with a tiny random CLIP projector (test_differential.py)


def _webp() -> str:
    """A small lossless WebP, made by Pillow: a format llama.cpp's decoder cannot read."""
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 40, 40)).save(out, "WEBP", lossless=True)
    return base64.b64encode(out.getvalue()).decode()


WEBP = _webp()
BROKEN_WEBP = WEBP[:40]  # cut in its bitstream (base64 of its first 30 bytes)
MISSING_BLOB = "sha256:" + "0" * 64
# A Hugging Face folder of an architecture neither server converts.
GPT2_CONFIG = b'{"architectures": ["GPT2LMHeadModel"], "n_layer": 2}'
GPT2_CONFIG_BLOB = "sha256:" + hashlib.sha256(GPT2_CONFIG).hexdigest()
GPT2_WEIGHTS = b"\x02\x00\x00\x00\x00\x00\x00\x00{}"  # an empty safetensors file
GPT2_WEIGHTS_BLOB = "sha256:" + hashlib.sha256(GPT2_WEIGHTS).hexdigest()
LOCAL = {"Origin": "http://localhost"}
# The registry both servers push to (test_differential.py starts the project's fake one
# there), and the name they push it as.
REGISTRY = f"127.0.0.1:{free_port(REGISTRY_PORTS)}"
PUSHED = f"{REGISTRY}/library/smol-pushed"

Values = Callable[[Any], dict[str, Any]]


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    body: Any = None  # sent as JSON unless ``raw`` is set
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # What must be equal, not only alike in shape: a function of the parsed answer.
    values: Values | None = None
    # Compare /api/ps and /api/tags after this step.
    state: bool = False
    # This step unloads this model: Ollama answers before its runner has exited and
    # lists it until then, so the state is compared once the reference no longer does.
    unloads: str = ""


def _final(parsed: Any) -> Any:
    """A native answer's last object (a stream's final line)."""
    if isinstance(parsed, list):
        return parsed[-1] if parsed else {}
    return parsed if isinstance(parsed, dict) else {}


def done_reason(parsed: Any) -> dict[str, Any]:
    return {"done_reason": _final(parsed).get("done_reason")}


def generated(parsed: Any) -> dict[str, Any]:
    """The counts that depend only on the prompt and the token budget."""
    final = _final(parsed)
    return {
        "done_reason": final.get("done_reason"),
        "eval_count": final.get("eval_count"),
        "prompt_eval_count": final.get("prompt_eval_count"),
        "context length": len(final["context"]) if "context" in final else None,
    }


def names(parsed: Any) -> dict[str, Any]:
    """The model names of a /api/tags, /api/ps or /v1/models answer."""
    items = parsed.get("models", parsed.get("data", [])) if isinstance(parsed, dict) else []
    return {"names": sorted(str(m.get("name", m.get("id"))) for m in items)}


def show_values(parsed: Any) -> dict[str, Any]:
    """What /api/show says the model will use and is."""
    info = parsed.get("model_info", {}) if isinstance(parsed, dict) else {}
    out = {
        key: parsed.get(key)
        for key in ("template", "parameters", "system", "capabilities")
        if isinstance(parsed, dict)
    }
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
        value = info.get(key)
        out[f"len {key}"] = len(value) if isinstance(value, list) else value
    out["tensors"] = len(parsed.get("tensors") or []) if isinstance(parsed, dict) else None
    return out


def statuses(parsed: Any) -> dict[str, Any]:
    """A progress stream's statuses in order, each once, a blob's digest left out (each
    server's config blob is its own)."""
    lines = parsed if isinstance(parsed, list) else [parsed]
    seen = [re.sub(r"\b[0-9a-f]{12}\b", "<digest>", str(line.get("status"))) for line in lines
            if isinstance(line, dict) and "status" in line]  # fmt: skip
    return {"statuses": list(dict.fromkeys(seen))}


def chat_counts(parsed: Any) -> dict[str, Any]:
    final = _final(parsed)
    return {"prompt_eval_count": final.get("prompt_eval_count")}


def _gen(prompt: str = "Why is the sky blue?", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "options": GREEDY, **extra}


def _chat(content: str = "Hi", **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "options": GREEDY,
        **extra,
    }


def _conversation(*turns: tuple[str, str]) -> dict[str, Any]:
    """A non-streamed chat of these (role, content) messages."""
    return {**_chat(stream=False), "messages": [{"role": r, "content": c} for r, c in turns]}


def _v1chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "temperature": 0,
        "seed": 1,
        **extra,
    }


def _wrong_methods() -> list[Case]:
    pairs = [
        ("GET", "/api/chat"),
        ("GET", "/api/generate"),
        ("GET", "/api/embed"),
        ("GET", "/api/embeddings"),
        ("GET", "/api/show"),
        ("GET", "/api/create"),
        ("GET", "/api/copy"),
        ("GET", "/api/pull"),
        ("GET", "/api/push"),
        ("POST", "/api/tags"),
        ("POST", "/api/ps"),
        ("POST", "/api/delete"),
        ("GET", "/api/delete"),
        ("PUT", "/api/version"),
        ("DELETE", "/"),
        ("GET", f"/api/blobs/{MISSING_BLOB}"),
        ("GET", "/v1/chat/completions"),
        ("GET", "/v1/completions"),
        ("GET", "/v1/embeddings"),
        ("GET", "/v1/messages"),
        ("POST", "/v1/models"),
        ("DELETE", "/v1/models/smol"),
    ]
    return [Case(f"{method} {path}", method, path) for method, path in pairs]


CORPUS: list[Case] = [
    # -- liveness, listing, before any load --------------------------------------------
    Case("root", "GET", "/"),
    Case("root head", "HEAD", "/"),
    Case("version", "GET", "/api/version"),
    Case("version head", "HEAD", "/api/version"),
    Case("tags", "GET", "/api/tags", values=names),
    Case("tags head", "HEAD", "/api/tags"),
    Case("ps empty", "GET", "/api/ps", values=names),
    Case("unknown path", "GET", "/api/nope"),
    *_wrong_methods(),
    # -- show ---------------------------------------------------------------------------
    Case("show", "POST", "/api/show", {"model": MODEL}, values=show_values),
    Case(
        "show verbose", "POST", "/api/show", {"model": MODEL, "verbose": True}, values=show_values
    ),
    Case("show unknown", "POST", "/api/show", {"model": "nope"}),
    Case("show without model", "POST", "/api/show", {}),
    Case("show malformed", "POST", "/api/show", raw=b"{"),
    # -- generate -----------------------------------------------------------------------
    Case(
        "generate load", "POST", "/api/generate", {"model": MODEL}, values=done_reason, state=True
    ),
    # The first prompt after the load: nothing cached yet, so the count is the whole prompt
    # on both sides (the template decision's measure, docs/compat.md).
    Case("chat first", "POST", "/api/chat", _chat(stream=False), values=chat_counts),
    Case("generate", "POST", "/api/generate", _gen(stream=False), values=generated),
    Case("generate stream", "POST", "/api/generate", _gen(), values=generated),
    Case("generate raw", "POST", "/api/generate", _gen(raw=True, stream=False), values=generated),
    Case(
        "generate template override",
        "POST",
        "/api/generate",
        # A plain continuation, so that all six tokens are generated ("context" counts them).
        _gen(
            "Once upon a time, there was",
            template="{{ .Prompt }}",
            stream=False,
            options={**GREEDY, "num_predict": 6},
        ),
        values=generated,
    ),
    Case(
        "generate template override stream",
        "POST",
        "/api/generate",
        _gen(
            "Once upon a time, there was",
            template="{{ .Prompt }}",
            options={**GREEDY, "num_predict": 6},
        ),
        values=generated,
    ),
    Case(
        "generate system", "POST", "/api/generate", _gen(system="Answer in French.", stream=False)
    ),
    Case("generate json", "POST", "/api/generate", _gen(format="json", stream=False)),
    Case(
        "generate schema",
        "POST",
        "/api/generate",
        _gen(format={"type": "object", "properties": {"a": {"type": "string"}}}, stream=False),
    ),
    Case(
        "generate options",
        "POST",
        "/api/generate",
        _gen(
            stream=False,
            options={
                **GREEDY,
                "top_k": 20,
                "top_p": 0.9,
                "min_p": 0.05,
                "repeat_penalty": 1.1,
                "repeat_last_n": 32,
                "presence_penalty": 0.1,
                "frequency_penalty": 0.1,
                "stop": ["\n\n"],
                "typical_p": 1.0,
                "num_keep": 4,
            },
        ),
        values=done_reason,
    ),
    Case(
        "generate logprobs",
        "POST",
        "/api/generate",
        _gen(stream=False, logprobs=True, top_logprobs=2),
    ),
    Case("generate think", "POST", "/api/generate", _gen(think=True, stream=False)),
    Case("generate suffix", "POST", "/api/generate", _gen(suffix="end", stream=False)),
    Case("generate unknown model", "POST", "/api/generate", {"model": "nope", "prompt": "x"}),
    Case("generate without model", "POST", "/api/generate", {"prompt": "x"}),
    Case("generate malformed", "POST", "/api/generate", raw=b'{"model": "smol",'),
    Case(
        "generate bad options",
        "POST",
        "/api/generate",
        _gen(stream=False, options={"temperature": "hot"}),
    ),
    Case("generate yaml", "POST", "/api/generate", _gen(format="yaml", stream=False)),
    Case(
        "generate image to text model",
        "POST",
        "/api/generate",
        _gen(images=[TINY_PNG], stream=False),
    ),
    Case(
        "generate webp to text model",
        "POST",
        "/api/generate",
        _gen(images=[WEBP], stream=False),
    ),
    # -- chat ---------------------------------------------------------------------------
    Case("chat", "POST", "/api/chat", _chat(stream=False), values=chat_counts),
    Case("chat stream", "POST", "/api/chat", _chat(), values=done_reason),
    Case(
        "chat system",
        "POST",
        "/api/chat",
        _conversation(("system", "Be brief."), ("user", "Hi")),
        values=chat_counts,
    ),
    Case(
        "chat history",
        "POST",
        "/api/chat",
        _conversation(("user", "Hi"), ("assistant", "Hello!"), ("user", "Bye")),
        values=chat_counts,
    ),
    Case("chat json", "POST", "/api/chat", _chat(format="json", stream=False)),
    Case(
        "chat tools",
        "POST",
        "/api/chat",
        _chat(
            stream=False,
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "get_time",
                        "description": "Time now",
                        "parameters": {"type": "object", "properties": {}},
                    },
                }
            ],
        ),
    ),
    Case("chat think", "POST", "/api/chat", _chat(think=True, stream=False)),
    Case("chat load", "POST", "/api/chat", {"model": MODEL, "messages": []}, values=done_reason),
    Case("chat unknown model", "POST", "/api/chat", {"model": "nope", "messages": []}),
    Case("chat without model", "POST", "/api/chat", {"messages": []}),
    Case("chat malformed", "POST", "/api/chat", raw=b"not json"),
    Case(
        "chat bad role",
        "POST",
        "/api/chat",
        {**_chat(stream=False), "messages": [{"role": 7, "content": "Hi"}]},
    ),
    Case(
        "chat image to text model",
        "POST",
        "/api/chat",
        {
            **_chat(stream=False),
            "messages": [{"role": "user", "content": "Hi", "images": [TINY_PNG]}],
        },
    ),
    # -- embeddings ---------------------------------------------------------------------
    Case("embed", "POST", "/api/embed", {"model": MODEL, "input": "Hi"}),
    Case("embed list", "POST", "/api/embed", {"model": MODEL, "input": ["Hi", "there"]}),
    Case("embed unknown model", "POST", "/api/embed", {"model": "nope", "input": "Hi"}),
    Case("embed without input", "POST", "/api/embed", {"model": MODEL}),
    Case("embeddings", "POST", "/api/embeddings", {"model": MODEL, "prompt": "Hi"}),
    Case("embeddings unknown model", "POST", "/api/embeddings", {"model": "nope", "prompt": "x"}),
    Case("ps after generate, chat and embed", "GET", "/api/ps", values=names),
    # -- OpenAI /v1 ---------------------------------------------------------------------
    Case("v1 models", "GET", "/v1/models", values=names),
    Case("v1 model", "GET", f"/v1/models/{MODEL}"),
    Case("v1 model unknown", "GET", "/v1/models/nope"),
    Case("v1 chat", "POST", "/v1/chat/completions", _v1chat()),
    Case("v1 chat stream", "POST", "/v1/chat/completions", _v1chat(stream=True)),
    Case(
        "v1 chat stream usage",
        "POST",
        "/v1/chat/completions",
        _v1chat(stream=True, stream_options={"include_usage": True}),
    ),
    Case(
        "v1 chat json",
        "POST",
        "/v1/chat/completions",
        _v1chat(response_format={"type": "json_object"}),
    ),
    Case("v1 chat unknown model", "POST", "/v1/chat/completions", _v1chat(model="nope")),
    Case("v1 chat without messages", "POST", "/v1/chat/completions", {"model": MODEL}),
    Case("v1 chat malformed", "POST", "/v1/chat/completions", raw=b"{"),
    Case(
        "v1 completions",
        "POST",
        "/v1/completions",
        {"model": MODEL, "prompt": "Hi", "max_tokens": 3, "temperature": 0},
    ),
    Case(
        "v1 completions stream",
        "POST",
        "/v1/completions",
        {"model": MODEL, "prompt": "Hi", "max_tokens": 3, "temperature": 0, "stream": True},
    ),
    Case(
        "v1 completions unknown model", "POST", "/v1/completions", {"model": "nope", "prompt": "Hi"}
    ),
    Case("v1 embeddings", "POST", "/v1/embeddings", {"model": MODEL, "input": "Hi"}),
    Case("v1 embeddings unknown model", "POST", "/v1/embeddings", {"model": "nope", "input": "x"}),
    Case(
        "v1 responses",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": "Hi", "max_output_tokens": 3, "temperature": 0},
    ),
    Case(
        "v1 responses stream",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": "Hi", "max_output_tokens": 3, "temperature": 0, "stream": True},
    ),
    Case("v1 responses unknown model", "POST", "/v1/responses", {"model": "nope", "input": "x"}),
    Case(
        "v1 messages",
        "POST",
        "/v1/messages",
        {
            "model": MODEL,
            "max_tokens": 3,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Hi"}],
        },
    ),
    Case(
        "v1 messages stream",
        "POST",
        "/v1/messages",
        {
            "model": MODEL,
            "max_tokens": 3,
            "temperature": 0,
            "stream": True,
            "messages": [{"role": "user", "content": "Hi"}],
        },
    ),
    Case(
        "v1 messages unknown model",
        "POST",
        "/v1/messages",
        {"model": "nope", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]},
    ),
    Case(
        "v1 messages without max_tokens",
        "POST",
        "/v1/messages",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
    ),
    # -- CORS ---------------------------------------------------------------------------
    Case(
        "cors preflight",
        "OPTIONS",
        "/api/chat",
        headers={
            **LOCAL,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    ),
    Case("cors simple", "GET", "/api/tags", headers=LOCAL),
    Case(
        "cors v1 preflight",
        "OPTIONS",
        "/v1/chat/completions",
        headers={**LOCAL, "Access-Control-Request-Method": "POST"},
    ),
    Case("cors foreign origin", "GET", "/api/tags", headers={"Origin": "http://evil.example"}),
    Case(
        "cors foreign preflight",
        "OPTIONS",
        "/api/chat",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    ),
    # -- the store ----------------------------------------------------------------------
    Case("copy", "POST", "/api/copy", {"source": MODEL, "destination": "smol-copy"}, state=True),
    Case("copy unknown", "POST", "/api/copy", {"source": "nope", "destination": "x"}),
    Case("copy without destination", "POST", "/api/copy", {"source": MODEL}),
    Case("copy bad name", "POST", "/api/copy", {"source": MODEL, "destination": "a/b/c/d/e"}),
    Case("delete", "DELETE", "/api/delete", {"model": "smol-copy"}, state=True),
    Case("delete unknown", "DELETE", "/api/delete", {"model": "nope"}),
    Case("delete without model", "DELETE", "/api/delete", {}),
    Case("blob head missing", "HEAD", f"/api/blobs/{MISSING_BLOB}"),
    Case("blob head bad digest", "HEAD", "/api/blobs/sha256:xyz"),
    Case("blob upload bad digest", "POST", "/api/blobs/sha256:xyz", raw=b"abc"),
    Case("blob upload wrong digest", "POST", f"/api/blobs/{MISSING_BLOB}", raw=b"abc"),
    Case(
        "create from model",
        "POST",
        "/api/create",
        {"model": "smol2", "from": MODEL, "parameters": {"num_ctx": 1024}, "stream": False},
        state=True,
    ),
    Case(
        "create stream",
        "POST",
        "/api/create",
        {"model": "smol3", "from": MODEL, "system": "Be brief."},
        state=True,
    ),
    Case("show created", "POST", "/api/show", {"model": "smol2"}, values=show_values),
    Case(
        "create from unknown model",
        "POST",
        "/api/create",
        {"model": "x", "from": "nope", "stream": False},
    ),
    Case(
        "create from unknown blob",
        "POST",
        "/api/create",
        {"model": "x", "files": {"a.gguf": MISSING_BLOB}, "stream": False},
    ),
    Case("create without from", "POST", "/api/create", {"model": "x", "stream": False}),
    Case("create without model", "POST", "/api/create", {"from": MODEL, "stream": False}),
    Case(
        "create bad parameter",
        "POST",
        "/api/create",
        {"model": "bad-param", "from": MODEL, "parameters": {"num_ctx": "big"}, "stream": False},
    ),
    Case("delete after bad parameter", "DELETE", "/api/delete", {"model": "bad-param"}, state=True),
    Case(
        "create quantize quantized model",
        "POST",
        "/api/create",
        {"model": "smol-q8", "from": MODEL, "quantize": "q8_0", "stream": False},
    ),
    Case(
        "create quantize k-quant",
        "POST",
        "/api/create",
        {"model": "smol-q4km", "from": MODEL, "quantize": "q4_K_M", "stream": False},
        state=True,
    ),
    Case("blob upload config", "POST", f"/api/blobs/{GPT2_CONFIG_BLOB}", raw=GPT2_CONFIG),
    Case("blob upload weights", "POST", f"/api/blobs/{GPT2_WEIGHTS_BLOB}", raw=GPT2_WEIGHTS),
    Case(
        "create from unsupported architecture",
        "POST",
        "/api/create",
        {
            "model": "x",
            "files": {"config.json": GPT2_CONFIG_BLOB, "model.safetensors": GPT2_WEIGHTS_BLOB},
            "stream": False,
        },
    ),
    Case("pull offline", "POST", "/api/pull", {"model": "nope-offline", "stream": False}),
    # -- images to a vision model (the same model file with a projector) -----------------
    Case(
        "generate image to vision model",
        "POST",
        "/api/generate",
        _gen("What is this?", model=VISION, images=[TINY_PNG], stream=False),
    ),
    Case(
        "generate webp to vision model",
        "POST",
        "/api/generate",
        _gen("What is this?", model=VISION, images=[WEBP], stream=False),
    ),
    Case(
        "v1 chat webp to vision model",
        "POST",
        "/v1/chat/completions",
        _v1chat(
            model=VISION,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/webp;base64,{WEBP}"},
                        },
                    ],
                }
            ],
        ),
    ),
    Case(
        "chat broken webp to vision model",
        "POST",
        "/api/chat",
        {
            **_chat(stream=False),
            "model": VISION,
            "messages": [{"role": "user", "content": "Hi", "images": [BROKEN_WEBP]}],
        },
    ),
    # -- push, to the registry both publish to --------------------------------------------
    Case("push copy", "POST", "/api/copy", {"source": MODEL, "destination": PUSHED}, state=True),
    Case(
        "push",
        "POST",
        "/api/push",
        {"model": PUSHED, "insecure": True, "stream": False},
        values=statuses,
    ),
    # Every blob is there now (each server's own after its first push): sent by neither.
    Case("push again", "POST", "/api/push", {"model": PUSHED, "insecure": True}, values=statuses),
    Case("push unknown model", "POST", "/api/push", {"model": "nope", "stream": False}),
    Case("push unknown model stream", "POST", "/api/push", {"model": "nope"}, values=statuses),
    Case("push without model", "POST", "/api/push", {}),
    Case("delete pushed", "DELETE", "/api/delete", {"model": PUSHED}, state=True),
    # -- the second model, then unloads --------------------------------------------------
    Case(
        "generate other model",
        "POST",
        "/api/generate",
        _gen(model="smol2", stream=False),
        values=done_reason,
        state=True,
    ),
    Case(
        "unload",
        "POST",
        "/api/generate",
        {"model": "smol2", "keep_alive": 0},
        values=done_reason,
        state=True,
        unloads="smol2:latest",
    ),
    # Ollama's runners are per model file: an unload for one name ends the runner that
    # another name of the same file loaded (smol2 is smol with another num_ctx).
    Case(
        "generate other model again",
        "POST",
        "/api/generate",
        _gen(model="smol2", stream=False),
        values=done_reason,
    ),
    Case(
        "unload by another name",
        "POST",
        "/api/generate",
        {"model": MODEL, "keep_alive": 0},
        values=done_reason,
        state=True,
        unloads="smol2:latest",
    ),
    Case(
        "chat unload",
        "POST",
        "/api/chat",
        {"model": MODEL, "messages": [], "keep_alive": 0},
        values=done_reason,
        state=True,
        unloads=f"{MODEL}:latest",
    ),
    Case("delete created", "DELETE", "/api/delete", {"model": "smol3"}, state=True),
]
