"""The images of a typed request, made ready before any model work.

Each must be base64 of an image.  One in a format llama.cpp's decoder (stb_image) reads goes
to the runner as it came; one in another format that Pillow reads (WebP above all: browsers
and chat apps hand them out) is decoded here and sent as PNG.  A broken image, or one too
large to decode safely, is the client's 400 naming it, not a runner error after a load.

Pillow is imported on the first image that needs converting, never at start-up, and the
decoding runs in a worker thread, two at a time, so the event loop never waits on it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

import trio

from ..errors import InvalidRequestError
from .requests import ChatRequest, GenerateRequest

if TYPE_CHECKING:
    from PIL.Image import Image

#: Leading bytes of the formats the runner decodes itself.
_SIGNATURES: Final = (
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",  # JPEG
    b"GIF87a",
    b"GIF89a",
    b"BM",  # BMP
)
_NATIVE: Final = ("PNG", "JPEG", "GIF", "BMP")

#: The formats converted to PNG (Pillow's names), each with the name users know it by.
#: Not every format Pillow has a plugin for: EPS runs Ghostscript, and most of the rest are
#: niche formats no chat client sends, each one more decoder exposed to what clients send.
_CONVERTED: Final = {
    "WEBP": "WebP",
    "AVIF": "AVIF",  # where Pillow is built with libavif
    "TIFF": "TIFF",
    "ICO": "ICO",
    "JPEG2000": "JPEG 2000",
}

#: The most pixels an image converted here may have: 8K UHD (7680x4320) and more fit, while a
#: small file that claims a huge canvas (a decompression bomb) is refused before decoding.
MAX_PIXELS: Final = 40_000_000

#: Conversions at a time: each may hold a decoded image (up to MAX_PIXELS x 4 bytes).
_CONVERSIONS_AT_ONCE: Final = 2
_LIMITER: Final = trio.lowlevel.RunVar[trio.CapacityLimiter]("image conversions")


def request_images(req: GenerateRequest | ChatRequest) -> Iterator[str]:
    """Every base64 image of ``req``, in the order the model is given them."""
    if isinstance(req, GenerateRequest):
        yield from req.images
    else:
        for message in req.messages:
            yield from message.images


async def runner_images(req: GenerateRequest | ChatRequest) -> GenerateRequest | ChatRequest:
    """``req`` with its images as the runner takes them: each checked (a 400 names the
    first bad one, 1-based in request order), those in a format the runner cannot decode
    converted to PNG (in a worker thread).  ``req`` itself when nothing needs converting."""
    converted: dict[int, str] = {}
    for n, image in enumerate(request_images(req), start=1):
        data = _decode_base64(image, n)
        if not data.startswith(_SIGNATURES):
            converted[n] = await trio.to_thread.run_sync(
                _png_base64, data, n, limiter=_conversion_limiter()
            )
    if not converted:
        return req
    numbers = itertools.count(1)  # the images again, in the same order

    def swap(images: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(converted.get(next(numbers), image) for image in images)

    if isinstance(req, GenerateRequest):
        return dataclasses.replace(req, images=swap(req.images))
    messages = tuple(dataclasses.replace(m, images=swap(m.images)) for m in req.messages)
    return dataclasses.replace(req, messages=messages)


def _decode_base64(image: str, n: int) -> bytes:
    try:
        # Go's base64 (Ollama's []byte fields) ignores line breaks; so does this check.
        return base64.b64decode(image.replace("\r", "").replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(f"invalid image {n}: not valid base64") from None


def _conversion_limiter() -> trio.CapacityLimiter:
    """This run's limiter of conversions (one per ``trio.run``: tests start many)."""
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(_CONVERSIONS_AT_ONCE)
        _LIMITER.set(limiter)
        return limiter


def _png_base64(data: bytes, n: int) -> str:
    """Decode ``data`` (image ``n``) with Pillow and encode it as PNG, in base64."""
    from PIL import Image, UnidentifiedImageError

    Image.init()  # every plugin registered, so that the formats below can be named
    formats = [f for f in _CONVERTED if f in Image.OPEN]
    claimed = "WebP" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else "image"
    try:
        opened = Image.open(io.BytesIO(data), formats=formats)  # the header only
    except UnidentifiedImageError:
        readable = [*_NATIVE, *(_CONVERTED[f] for f in formats)]
        raise InvalidRequestError(
            f"invalid image {n}: not a {', '.join(readable[:-1])} or {readable[-1]} image"
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # Pillow's own bound (far above ours), checked as it reads the header.
        raise InvalidRequestError(f"invalid image {n}: more than {MAX_PIXELS} pixels") from None
    except Exception as exc:  # whatever a malformed header makes a decoder raise
        raise InvalidRequestError(f"invalid image {n}: broken {claimed} data ({exc})") from None
    with opened:
        name = _CONVERTED.get(opened.format or "", claimed)
        width, height = opened.size
        if width * height > MAX_PIXELS:
            raise InvalidRequestError(
                f"invalid image {n}: a {width}x{height} {name} has more than {MAX_PIXELS} pixels"
            )
        try:
            png = _encode_png(opened)
        except Exception as exc:  # whatever malformed data makes a decoder raise
            raise InvalidRequestError(f"invalid image {n}: broken {name} data ({exc})") from None
    return base64.b64encode(png).decode("ascii")


def _encode_png(image: Image) -> bytes:
    """The first frame of ``image`` as an RGB(A) PNG, compressed for speed (the runner
    decodes it at once; the size on the wire to it does not matter)."""
    if image.mode not in ("RGB", "RGBA"):
        image = image.convert("RGBA" if image.has_transparency_data else "RGB")
    out = io.BytesIO()
    image.save(out, "PNG", compress_level=1)
    return out.getvalue()
