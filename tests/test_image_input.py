"""INPUT_IMAGE decoding: what is an image, and what each bad input is told."""

from __future__ import annotations

import base64

import pytest
from PIL import Image
from serving_common import InvalidImage, decode_image

from provision import sample_images

JPEG = sample_images.jpeg()


def test_a_base64_jpeg_decodes_to_rgb():
    image = decode_image(base64.b64encode(JPEG))
    assert image.mode == "RGB" and image.size == sample_images.SMALL


def test_line_wrapped_base64_and_data_urls_are_accepted():
    wrapped = base64.encodebytes(JPEG)  # 76-column lines, as the `base64` tool writes
    assert b"\n" in wrapped
    assert decode_image(wrapped).size == sample_images.SMALL
    assert decode_image(b"data:image/jpeg;base64," + base64.b64encode(JPEG)).size == sample_images.SMALL


@pytest.mark.parametrize(
    "mode, format",
    [("L", "JPEG"), ("RGBA", "PNG"), ("CMYK", "JPEG"), ("P", "PNG"), ("LA", "PNG")],
)
def test_grayscale_rgba_palette_and_cmyk_images_become_rgb(mode, format):
    image = sample_images.picture().convert(mode)
    decoded = decode_image(base64.b64encode(sample_images.encode(image, format)))
    assert decoded.mode == "RGB" and decoded.size == sample_images.SMALL


def test_transparent_pixels_become_white():
    image = Image.new("RGBA", (8, 8), (255, 0, 0, 0))
    decoded = decode_image(base64.b64encode(sample_images.encode(image, "PNG")))
    assert decoded.getpixel((0, 0)) == (255, 255, 255)


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"", "is empty"),
        (b"   \n", "is empty"),
        (b"not base64!!", "not valid base64"),
        (base64.b64encode(b"just some text, not a picture"), "not an image"),
        (base64.b64encode(JPEG[: len(JPEG) // 2]), "truncated"),
    ],
    ids=["empty", "whitespace", "invalid-base64", "not-an-image", "truncated-jpeg"],
)
def test_bad_inputs_raise_invalid_image_with_a_clear_message(payload, message):
    with pytest.raises(InvalidImage, match=message):
        decode_image(payload)


def test_an_image_over_the_pixel_limit_is_refused_before_decoding():
    big = base64.b64encode(sample_images.encode(Image.new("RGB", (3000, 2000)), "PNG"))
    with pytest.raises(InvalidImage, match=r"3000x2000 = 6000000 pixels, over the limit of 5000000"):
        decode_image(big, max_pixels=5_000_000)


def test_base64_over_the_size_limit_is_refused():
    with pytest.raises(InvalidImage, match="over the limit of 1000 bytes"):
        decode_image(base64.b64encode(JPEG), max_encoded_bytes=1000)
