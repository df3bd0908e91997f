"""Images with vision models: the tiny CLIP projector generator, a model created from two
GGUF files (the projector detected by its architecture), the image checks every route
shares, and images reaching a real llama.cpp runner with the projector loaded."""

from __future__ import annotations

import base64
import hashlib
import io
import struct
import zlib
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
import trio
from PIL import Image, features

from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.errors import InvalidRequestError
from ollamatrio.generation.images import MAX_PIXELS, runner_images
from ollamatrio.generation.requests import ChatRequest, GenerateRequest
from ollamatrio.gguf import read_gguf
from ollamatrio.memory import MemoryOptions, estimate, plan_layout, projector_bytes
from ollamatrio.store import MEDIA_PROJECTOR
from ollamatrio.testing.tiny_clip import image_tokens, tiny_png, write_tiny_clip
from ollamatrio.types import CompletionRequest, Message

PNG = base64.b64encode(tiny_png()).decode()


def encoded(fmt: str, mode: str = "RGB", size: tuple[int, int] = (8, 8), **save: Any) -> bytes:
    """A picture (a gradient, so that pixels differ) in ``fmt``, made by Pillow."""
    picture = Image.new(mode, size)
    picture.putdata([(x * 30, y * 30, 90, 200)[: len(mode)] for y in range(size[1])
                     for x in range(size[0])])  # fmt: skip
    out = io.BytesIO()
    picture.save(out, fmt, **save)
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def webp_header(width: int, height: int) -> bytes:
    """A lossless WebP whose header claims ``width`` x ``height`` pixels, with no pixel data
    behind it: a decompression bomb's shape, a few dozen bytes for any size."""
    bits = (width - 1) | (height - 1) << 14  # VP8L: 14 bits each, then alpha and version 0
    payload = b"\x2f" + struct.pack("<I", bits) + bytes(15)
    chunk = b"VP8L" + struct.pack("<I", len(payload)) + payload  # of even size, as RIFF asks
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


WEBP_BYTES = encoded("WEBP", lossless=True)
WEBP = b64(WEBP_BYTES)
BROKEN_WEBP = b64(encoded("WEBP")[:40])  # cut in its bitstream
BOMB = b64(webp_header(8000, 8000))  # 64 megapixels


@pytest.fixture
def projector(tmp_path: Path) -> Path:
    return write_tiny_clip(tmp_path / "mmproj.gguf", text_embd=64)  # the tiny model's width


async def create_vision_model(url: str, model: Path, projector: Path, name: str = "vis") -> None:
    """``/api/create`` from two uploaded GGUF files, as ``ollama create`` sends them."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        files = {}
        for path in (model, projector):
            data = path.read_bytes()
            digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
            assert (await c.post(f"/api/blobs/{digest}", content=data)).status_code in (200, 201)
            files[path.name] = digest
        r = await c.post("/api/create", json={"model": name, "files": files, "stream": False})
        assert r.status_code == 200, r.text


# -- the generator --------------------------------------------------------------------


def test_the_tiny_projector_is_a_clip_gguf(projector: Path) -> None:
    info = read_gguf(projector)
    assert info.architecture == "clip"
    assert info.metadata["clip.projector_type"] == "mlp"
    assert info.metadata["clip.vision.projection_dim"] == 64
    assert image_tokens() == 16


def test_the_tiny_png_is_a_png() -> None:
    data = tiny_png(3, 2, (1, 2, 3))
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    start = data.index(b"IDAT") + 4
    pixels = zlib.decompress(data[start : data.index(b"IEND") - 8])
    assert pixels == (b"\x00" + bytes((1, 2, 3)) * 3) * 2


async def as_third_image(image: str) -> str:
    """``image`` as the runner takes it, sent as the third of a request's images."""
    ready = await runner_images(GenerateRequest("m", images=(PNG, PNG, image)))
    assert isinstance(ready, GenerateRequest)
    return ready.images[2]


@pytest.mark.parametrize(
    ("image", "message"),
    [
        ("not base64!", "invalid image 3: not valid base64"),
        (b64(b"hello world"), "invalid image 3: not a PNG, JPEG, GIF, BMP, WebP, "),
        ("", "invalid image 3: not a PNG, JPEG, GIF, BMP, WebP, "),
        (b64(b"RIFF\x24\x00\x00\x00WEBPVP8 "), "invalid image 3: broken WebP data"),
        (BROKEN_WEBP, "invalid image 3: broken WebP data"),
        (BOMB, f"invalid image 3: a 8000x8000 WebP has more than {MAX_PIXELS} pixels"),
        # Past Pillow's own bound too, which it checks as it reads the header.
        (b64(webp_header(16383, 16383)), f"invalid image 3: more than {MAX_PIXELS} pixels"),
    ],
    ids=["base64", "text", "empty", "webp header", "webp cut", "bomb", "bomb past pillow's"],
)
async def test_a_broken_image_is_named(image: str, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        await as_third_image(image)


@pytest.mark.parametrize("head", [b"\xff\xd8\xff\xe0", b"GIF89a", b"BM", b"\x89PNG\r\n\x1a\n"])
async def test_image_formats_the_runner_decodes_pass(head: bytes) -> None:
    plain = b64(head + b"rest")
    wrapped = base64.encodebytes(head + b"x" * 100).decode()  # line breaks, as Go allows
    req = GenerateRequest("m", images=(plain, wrapped))
    assert await runner_images(req) is req  # untouched: nothing decoded them


def codec(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not features.check(name), reason=f"Pillow built without {name}")


@pytest.mark.parametrize(
    ("fmt", "sent_mode", "save", "mode", "exact"),
    [
        ("WEBP", "RGB", {"lossless": True}, "RGB", True),
        ("WEBP", "RGBA", {"lossless": True}, "RGBA", True),
        ("WEBP", "RGB", {"quality": 80}, "RGB", False),  # lossy: the same size, near pixels
        ("TIFF", "RGB", {}, "RGB", True),
        ("TIFF", "CMYK", {}, "RGB", False),  # PNG has no CMYK
        ("ICO", "RGBA", {"sizes": [(8, 8)]}, "RGBA", True),
        pytest.param("AVIF", "RGB", {}, "RGB", False, marks=codec("avif")),
        pytest.param(
            "JPEG2000", "RGB", {"irreversible": False}, "RGB", True, marks=codec("jpg_2000")
        ),
    ],
    ids=["webp", "webp rgba", "webp lossy", "tiff", "tiff cmyk", "ico", "avif", "jpeg 2000"],
)
async def test_other_formats_reach_the_runner_as_png(
    fmt: str, sent_mode: str, save: dict[str, Any], mode: str, exact: bool
) -> None:
    data = encoded(fmt, sent_mode, **save)
    png = base64.b64decode(await as_third_image(b64(data)))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(io.BytesIO(png)) as seen, Image.open(io.BytesIO(data)) as sent:
        assert (seen.format, seen.mode, seen.size) == ("PNG", mode, sent.size)
        if exact:
            assert seen.tobytes() == sent.convert(mode).tobytes()


async def test_only_the_images_that_need_it_are_converted_in_place() -> None:
    req = ChatRequest(
        "m",
        messages=(
            Message("user", "a", images=(PNG, WEBP)),
            Message("assistant", "b"),
            Message("user", "c", images=(WEBP,)),
        ),
    )
    ready = await runner_images(req)
    assert isinstance(ready, ChatRequest)
    images = [m.images for m in ready.messages]
    assert images[0][0] == PNG
    assert images[1] == ()
    assert [base64.b64decode(i)[:4] for i in (images[0][1], images[2][0])] == [b"\x89PNG"] * 2
    assert [m.content for m in ready.messages] == ["a", "b", "c"]


# -- the store and the routes (simulated engine) ------------------------------------


async def test_a_model_created_from_a_model_and_a_projector_has_vision(
    api_server, tiny_gguf, projector: Path
) -> None:
    with trio.fail_after(60):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            await create_vision_model(srv.url, tiny_gguf(), projector)
            model = srv.store.resolve("vis")
            assert len(model.projectors) == 1
            manifest = srv.store.manifest_path(model.name).read_text()
            assert MEDIA_PROJECTOR in manifest
            show = (await c.post("/api/show", json={"model": "vis"})).json()
            assert "vision" in show["capabilities"]
            assert show["projector_info"]["general.architecture"] == "clip"
            assert show["projector_info"]["clip.projector_type"] == "mlp"
            plain = (await c.post("/api/show", json={"model": "tiny"})).json()
            assert "vision" not in plain["capabilities"]
            assert "projector_info" not in plain


NO_VISION = '"tiny" does not support vision'
NOT_AN_IMAGE = "invalid image 1: not a PNG, JPEG, GIF, BMP, WebP, "
BROKEN = "invalid image 2: broken WebP data"
TOO_LARGE = f"invalid image 1: a 8000x8000 WebP has more than {MAX_PIXELS} pixels"


def chat(model: str, images: list[str]) -> dict[str, Any]:
    message = {"role": "user", "content": "what is this?", "images": images}
    return {"model": model, "messages": [message], "stream": False}


def openai_chat(model: str, url: str) -> dict[str, Any]:
    parts = [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": url}}]
    return {"model": model, "messages": [{"role": "user", "content": parts}]}


def anthropic_message(
    model: str, data: str, max_tokens: int = 8, media_type: str = "image/png"
) -> dict[str, Any]:
    source = {"type": "base64", "media_type": media_type, "data": data}
    blocks = [{"type": "image", "source": source}, {"type": "text", "text": "what?"}]
    return {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": blocks}],
    }


def responses_input(model: str, url: str) -> dict[str, Any]:
    parts = [{"type": "input_text", "text": "what?"}, {"type": "input_image", "image_url": url}]
    return {"model": model, "input": [{"role": "user", "content": parts}], "store": False}


@pytest.mark.parametrize(
    ("path", "body", "status", "error"),
    [
        ("/api/chat", chat("vis", [PNG]), 200, None),
        ("/v1/messages", anthropic_message("vis", PNG), 200, None),
        ("/v1/responses", responses_input("vis", f"data:image/png;base64,{PNG}"), 200, None),
        ("/v1/messages", anthropic_message("tiny", PNG), 400, NO_VISION),
        ("/v1/responses", responses_input("tiny", f"data:image/png;base64,{PNG}"), 400,
         NO_VISION),
        ("/v1/messages", anthropic_message("vis", "aGVsbG8="), 400,
         NOT_AN_IMAGE),
        ("/v1/responses", responses_input("vis", "data:image/png;base64,aGVsbG8="), 400,
         NOT_AN_IMAGE),
        ("/api/generate", {"model": "vis", "prompt": "x", "images": [PNG], "stream": False},
         200, None),
        ("/v1/chat/completions", openai_chat("vis", f"data:image/png;base64,{PNG}"), 200, None),
        ("/api/chat", chat("tiny", [PNG]), 400, NO_VISION),
        ("/api/generate", {"model": "tiny", "prompt": "x", "images": [PNG]}, 400, NO_VISION),
        ("/v1/chat/completions", openai_chat("tiny", f"data:image/png;base64,{PNG}"), 400,
         NO_VISION),
        ("/api/chat", chat("vis", [PNG, "%%%"]), 400, "invalid image 2: not valid base64"),
        ("/api/generate", {"model": "vis", "prompt": "x", "images": ["aGVsbG8="]}, 400,
         NOT_AN_IMAGE),
        ("/v1/chat/completions", openai_chat("vis", "data:image/png;base64,aGVsbG8="), 400,
         NOT_AN_IMAGE),
        ("/api/chat", chat("vis", [PNG, BROKEN_WEBP]), 400, BROKEN),
        ("/api/generate", {"model": "vis", "prompt": "x", "images": [WEBP, BROKEN_WEBP]}, 400,
         BROKEN),
        ("/api/chat", chat("vis", [BOMB]), 400, TOO_LARGE),
        ("/v1/chat/completions", openai_chat("vis", f"data:image/webp;base64,{BOMB}"), 400,
         TOO_LARGE),
        ("/v1/messages", anthropic_message("vis", BOMB, media_type="image/webp"), 400,
         TOO_LARGE),
        ("/v1/responses", responses_input("vis", f"data:image/webp;base64,{BOMB}"), 400,
         TOO_LARGE),
    ],
)  # fmt: skip
async def test_images_on_every_route(
    api_server, tiny_gguf, projector: Path, path: str, body: dict[str, Any], status: int,
    error: str | None,
) -> None:  # fmt: skip
    with trio.fail_after(60):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
            await create_vision_model(srv.url, tiny_gguf(), projector)
            r = await c.post(path, json=body)
            assert r.status_code == status, r.text
            if error is not None:
                got = r.json()["error"]
                assert error in (got if isinstance(got, str) else got["message"])
            if error is not None and path.startswith("/v1/"):  # the dialect's error shape
                assert got["type"] == "invalid_request_error"
                if path == "/v1/messages":
                    assert r.json()["type"] == "error"


def sent_images(request: CompletionRequest | None) -> list[bytes]:
    """The images a generation request carried to its engine, decoded."""
    assert request is not None
    images = [*request.images, *(i for m in request.messages or () for i in m.images)]
    return [base64.b64decode(i) for i in images]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/generate", {"model": "vis", "prompt": "x", "images": [WEBP], "stream": False}),
        ("/api/chat", chat("vis", [WEBP])),
        ("/v1/chat/completions", openai_chat("vis", f"data:image/webp;base64,{WEBP}")),
        ("/v1/messages", anthropic_message("vis", WEBP, media_type="image/webp")),
        ("/v1/responses", responses_input("vis", f"data:image/webp;base64,{WEBP}")),
    ],
)
async def test_a_webp_reaches_the_runner_as_png_on_every_route(
    api_server, tiny_gguf, projector: Path, path: str, body: dict[str, Any]
) -> None:
    with trio.fail_after(60):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
            await create_vision_model(srv.url, tiny_gguf(), projector)
            r = await c.post(path, json=body)
            assert r.status_code == 200, r.text
            (png,) = sent_images(srv.engines.engines["vis:latest"].last_request)
            assert png.startswith(b"\x89PNG\r\n\x1a\n")
            with Image.open(io.BytesIO(png)) as seen, Image.open(io.BytesIO(WEBP_BYTES)) as sent:
                assert seen.tobytes() == sent.convert("RGB").tobytes()


# -- a real runner ----------------------------------------------------------------


async def test_an_image_reaches_a_runner_with_the_projector_loaded(
    api_server, tiny_gguf, projector: Path
) -> None:
    """Each route's image becomes the projector's embeddings in the prompt: the image
    request evaluates at least one image's worth of positions more than the same text."""
    options = {"num_predict": 1, "temperature": 0}
    with trio.fail_after(180):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            ollama.AsyncClient(host=srv.url) as c,
        ):
            await create_vision_model(srv.url, tiny_gguf(), projector)
            text = {"role": "user", "content": "what is in the picture?"}
            # The image first: its prompt has no cached prefix beyond the text's.
            seen = await c.chat("vis", [{**text, "images": [PNG]}], options=options)
            plain = await c.chat("vis", [text], options=options)
            assert seen.prompt_eval_count >= plain.prompt_eval_count + image_tokens()
            (info,) = srv.scheduler.ps()
            assert srv.scheduler.runner(info.model_path).projector is not None

            seen_g = await c.generate("vis", "describe it", images=[PNG], options=options)
            plain_g = await c.generate("vis", "describe it", options=options)
            assert seen_g.prompt_eval_count >= plain_g.prompt_eval_count + image_tokens()

            oai = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="ollama")
            async with oai:
                parts = [
                    {"type": "text", "text": "and this one?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                ]
                seen_o = await oai.chat.completions.create(
                    model="vis", messages=[{"role": "user", "content": parts}], max_tokens=1
                )
                plain_o = await oai.chat.completions.create(
                    model="vis",
                    messages=[{"role": "user", "content": "and this one?"}],
                    max_tokens=1,
                )
            assert seen_o.usage is not None
            assert plain_o.usage is not None
            assert seen_o.usage.prompt_tokens >= plain_o.usage.prompt_tokens + image_tokens()


async def test_a_webp_reaches_a_real_runner(api_server, tiny_gguf, projector: Path) -> None:
    """llama.cpp's decoder has no WebP: the image's tokens in the prompt show that the runner
    got a picture it could read."""
    options = {"num_predict": 1, "temperature": 0}
    with trio.fail_after(180):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            ollama.AsyncClient(host=srv.url) as c,
        ):
            await create_vision_model(srv.url, tiny_gguf(), projector)
            text = {"role": "user", "content": "what is in the picture?"}
            # The image first: its prompt has no cached prefix beyond the text's.
            seen = await c.chat("vis", [{**text, "images": [WEBP]}], options=options)
            plain = await c.chat("vis", [text], options=options)
            assert seen.prompt_eval_count >= plain.prompt_eval_count + image_tokens()


async def test_an_image_block_and_an_input_image_reach_the_runner(
    api_server, tiny_gguf, projector: Path
) -> None:
    """``/v1/messages`` image blocks (base64) and ``/v1/responses`` ``input_image`` data
    URLs, through the official SDKs, reach the runner with the projector loaded: the image
    request's input tokens exceed the same text's by at least the image's tokens."""
    with trio.fail_after(180):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            anthropic.AsyncAnthropic(base_url=srv.url, api_key="ollama", max_retries=0) as ac,
            openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="ollama", max_retries=0) as oc,
        ):
            await create_vision_model(srv.url, tiny_gguf(), projector)
            # The image first: its prompt has no cached prefix beyond the text's.
            seen = await ac.messages.create(**anthropic_message("vis", PNG, max_tokens=1))
            text = [{"role": "user", "content": "what?"}]
            plain = await ac.messages.create(model="vis", max_tokens=1, messages=text)
            assert seen.usage.input_tokens >= plain.usage.input_tokens + image_tokens()
            (info,) = srv.scheduler.ps()
            assert srv.scheduler.runner(info.model_path).projector is not None

            body = responses_input("vis", f"data:image/png;base64,{PNG}")
            seen_r = await oc.responses.create(**body, max_output_tokens=1)
            plain_r = await oc.responses.create(
                model="vis", input="what?", store=False, max_output_tokens=1
            )
            assert seen_r.usage is not None
            assert plain_r.usage is not None
            assert seen_r.usage.input_tokens >= plain_r.usage.input_tokens + image_tokens()


# -- the projector's memory -----------------------------------------------------------


def test_the_projector_is_part_of_the_prediction(tiny_gguf, projector: Path) -> None:
    clip = read_gguf(projector)
    extra = projector_bytes(clip)
    assert extra > clip.tensor_bytes  # weights and the encoder's graph
    model = read_gguf(tiny_gguf())
    plain = estimate(model, MemoryOptions(num_ctx=2048))
    seen = estimate(model, MemoryOptions(num_ctx=2048, projector=extra))
    assert seen.total == plain.total + extra

    cpu = plan_layout(seen, [])
    assert cpu.host_bytes == plan_layout(plain, []).host_bytes + extra
    gpus = [("gpu-0", 1 << 30), ("gpu-1", 1 << 30)]
    on_gpu, without = plan_layout(seen, gpus), plan_layout(plain, gpus)
    assert on_gpu.host_bytes == without.host_bytes
    assert on_gpu.vram == without.vram + extra
    (first, *_) = on_gpu.vram_by_gpu
    assert on_gpu.vram_by_gpu[first] == without.vram_by_gpu[first] + extra


async def test_a_loaded_vision_model_reports_its_projector(
    api_server, tiny_gguf, projector: Path
) -> None:
    with trio.fail_after(60):
        async with api_server() as srv, ollama.AsyncClient(host=srv.url) as c:
            await create_vision_model(srv.url, tiny_gguf(), projector)
            # Both share one model file, so one runner at a time: the projector reloads it.
            await c.generate("tiny", "", keep_alive=60)
            (plain,) = (await c.ps()).models
            await c.generate("vis", "", keep_alive=60)
            (seen,) = (await c.ps()).models
            assert (plain.model, seen.model) == ("tiny:latest", "vis:latest")
            assert seen.size == plain.size + projector_bytes(read_gguf(projector))
