"""Test and benchmark images made on the spot: real JPEG/PNG files, no downloads.

The pictures are smooth colour fields with a few shapes (a "plate" and its
"food"), so they compress like photos rather than like noise. A camera's
photo also carries sensor noise and texture, which is most of its file size
(a 12 MP phone JPEG is 2-5 MB): `jpeg(..., grain=6)` adds that, and makes a
4000x3000 file of about 3 MB instead of 0.3 MB.
"""

from __future__ import annotations

import base64
import io
import random

from PIL import Image, ImageChops, ImageDraw, ImageFilter

SMALL = (512, 384)  # a typical web image
PHONE = (4000, 3000)  # a 12 MP phone photo


def picture(size: tuple[int, int] = SMALL, seed: int = 0) -> Image.Image:
    """An RGB picture: background gradient, a plate, some blobs of food."""
    rng = random.Random(seed)
    width, height = size
    base = Image.new("RGB", (64, 48))
    corners = [tuple(rng.randrange(256) for _ in range(3)) for _ in range(2)]
    draw = ImageDraw.Draw(base)
    for y in range(48):
        t = y / 47
        draw.line([(0, y), (63, y)], fill=tuple(int(a + (b - a) * t) for a, b in zip(*corners)))
    image = base.resize(size, Image.BILINEAR)
    draw = ImageDraw.Draw(image)
    cx, cy, r = width // 2, height // 2, int(min(size) * 0.4)
    draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(235, 235, 230), outline=(200, 200, 195), width=max(1, r // 30))
    for _ in range(6):
        br = int(r * rng.uniform(0.15, 0.35))
        bx, by = cx + rng.randint(-r // 2, r // 2), cy + rng.randint(-r // 2, r // 2)
        draw.ellipse([bx - br, by - br, bx + br, by + br], fill=tuple(rng.randrange(256) for _ in range(3)))
    return image.filter(ImageFilter.GaussianBlur(radius=max(1, min(size) // 200)))


def encode(image: Image.Image, format: str = "JPEG", **options) -> bytes:
    """The image as a file in `format` (JPEG quality 90 unless told)."""
    if format == "JPEG":
        options.setdefault("quality", 90)
    buffer = io.BytesIO()
    image.save(buffer, format=format, **options)
    return buffer.getvalue()


def jpeg(size: tuple[int, int] = SMALL, seed: int = 0, grain: float = 0) -> bytes:
    """A JPEG of picture(size, seed); grain > 0 adds Gaussian sensor noise of that many grey levels."""
    image = picture(size, seed)
    if grain:
        noise = Image.effect_noise(size, grain)  # grey levels around 128
        image = ImageChops.add(image, Image.merge("RGB", [noise] * 3), offset=-128)
    return encode(image)


def b64(data: bytes) -> bytes:
    """base64 of a file, the form INPUT_IMAGE takes."""
    return base64.b64encode(data)
