"""The images of a typed request, checked before any model work: each must be base64 of an
image format llama.cpp's decoder (stb_image) reads, so that a broken one is the client's
400 naming it, not a runner error after a load."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from typing import Final

from ..errors import InvalidRequestError
from .requests import ChatRequest, GenerateRequest

#: Leading bytes of the formats the runner decodes.
_SIGNATURES: Final = (
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",  # JPEG
    b"GIF87a",
    b"GIF89a",
    b"BM",  # BMP
)
_FORMATS: Final = "PNG, JPEG, GIF or BMP"


def request_images(req: GenerateRequest | ChatRequest) -> Iterator[str]:
    """Every base64 image of ``req``, in the order the model is given them."""
    if isinstance(req, GenerateRequest):
        yield from req.images
    else:
        for message in req.messages:
            yield from message.images


def check_images(req: GenerateRequest | ChatRequest) -> None:
    """Raise a 400 naming the first image (1-based, in request order) that is not base64
    or not an image the runner can decode."""
    for n, image in enumerate(request_images(req), start=1):
        check_image(image, n)


def check_image(image: str, n: int = 1) -> None:
    """Raise a 400 naming image ``n`` unless ``image`` is base64 of a decodable image."""
    try:
        # Go's base64 (Ollama's []byte fields) ignores line breaks; so does this check.
        data = base64.b64decode(image.replace("\r", "").replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(f"invalid image {n}: not valid base64") from None
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        # Ollama converts WebP to PNG itself (Go's x/image/webp); llama.cpp cannot decode
        # it and this server has no image codec, so the client is told what to send.
        raise InvalidRequestError(
            f"invalid image {n}: WebP is not supported; send it as {_FORMATS}"
        )
    if not data.startswith(_SIGNATURES):
        raise InvalidRequestError(f"invalid image {n}: not a {_FORMATS} image")
