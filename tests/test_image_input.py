"""INPUT_IMAGE decoding: an image file's bytes or its base64, what is an image, and what each bad input is told."""

from __future__ import annotations

import base64

import pytest
from PIL import Image
from serving_common import InvalidImage, decode_image, image_file_bytes, image_file_format

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
        (b"not base64!!", r"neither an image file's bytes \(JPEG, PNG, GIF, WebP, BMP or TIFF\) nor base64"),
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


# ---- the file's bytes, as the seed's clients send them

# One file of every accepted format (Pillow writes them all).
FILES = {
    "JPEG": JPEG,
    "PNG": sample_images.encode(sample_images.picture(seed=1), "PNG"),
    "GIF": sample_images.encode(sample_images.picture(seed=2), "GIF"),
    "WebP": sample_images.encode(sample_images.picture(seed=3), "WEBP"),
    "BMP": sample_images.encode(sample_images.picture(seed=4), "BMP"),
    "TIFF-little-endian": sample_images.encode(sample_images.picture(seed=5), "TIFF"),
    "TIFF-big-endian": sample_images.encode(sample_images.picture(seed=6), "TIFF", tiffinfo={}, big_endian=True),
}


@pytest.mark.parametrize("name", list(FILES))
def test_an_image_files_bytes_decode_to_the_same_image_as_its_base64(name):
    data = FILES[name]
    assert image_file_format(data) == name.split("-")[0]
    assert image_file_bytes(data) == (data, "bytes")
    assert image_file_bytes(base64.b64encode(data)) == (data, "base64")
    raw, text = decode_image(data), decode_image(base64.b64encode(data))
    assert raw.mode == "RGB" and raw.size == sample_images.SMALL
    assert raw.tobytes() == text.tobytes()


@pytest.mark.parametrize("name", list(FILES))
def test_no_base64_text_of_an_image_looks_like_a_files_bytes(name):
    for text in (base64.b64encode(FILES[name]), base64.encodebytes(FILES[name])):
        assert image_file_format(text) is None


def test_the_file_s_bytes_may_be_sent_as_numpy_bytes_of_an_object_array():
    import numpy as np

    (item,) = np.array([[JPEG]], dtype=np.object_).reshape(-1)  # what Triton hands the model
    assert decode_image(item).size == sample_images.SMALL


def test_the_size_limit_applies_to_the_file_s_bytes_too():
    with pytest.raises(InvalidImage, match=f"INPUT_IMAGE is {len(JPEG)} bytes, over the limit of 1000 bytes"):
        decode_image(JPEG, max_encoded_bytes=1000)
    assert decode_image(JPEG, max_encoded_bytes=len(JPEG)).size == sample_images.SMALL


@pytest.mark.parametrize(
    "payload, message",
    [
        (JPEG[: len(JPEG) // 2], r"truncated.*\(read as the file's bytes\)"),
        (base64.b64encode(JPEG[: len(JPEG) // 2]), r"truncated.*\(read as base64\)"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 20, r"\(read as the file's bytes\)"),
        (b"GIF89a\x10\x00\x10\x00 no more", r"\(read as the file's bytes\)"),
    ],
    ids=["truncated-jpeg-bytes", "truncated-jpeg-base64", "png-signature-only", "gif-header-only"],
)
def test_an_error_says_how_the_element_was_read(payload, message):
    with pytest.raises(InvalidImage, match=message):
        decode_image(payload)
