"""What every Python model of this repository needs, Triton or not.

- decoding of the INPUT_IMAGE tensor: one image file, sent as its bytes or as
  base64 text -> one RGB PIL image;
- reading the model-config parameters;
- choosing the device of an instance (the GPU Triton assigned, else the CPU).

Shared by the classifier and the captioning model (each model version folder
links to this file). Pure Python + Pillow, so tests and benchmarks import it
without Triton.

Every way an input can be unusable raises InvalidImage with a message meant
for the client; the models turn it into an error for that request alone.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import os

from PIL import Image, UnidentifiedImageError

# Defaults of the model-config parameters max_encoded_bytes / max_pixels.
# max_encoded_bytes limits the INPUT_IMAGE element as sent, bytes or base64.
DEFAULT_MAX_ENCODED_BYTES = 20 * 1024 * 1024  # a 20 MB file, or ~15 MB of file as base64
DEFAULT_MAX_PIXELS = 40_000_000  # a 48 MP phone photo is 8000x6000; 4000x3000 is 12 MP

_DATA_URL_MARK = b";base64,"

# A file of this name beside a weights file (or inside a weights folder) marks
# weights made by `provision.smoke_weights`: real architecture, random values.
SMOKE_MARKER = "SMOKE_WEIGHTS"


def is_smoke_weights(path: str) -> bool:
    """Whether `path` (a weights file or folder) was generated as smoke weights."""
    if not path or not os.path.exists(path):
        return False
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    return os.path.exists(os.path.join(folder, SMOKE_MARKER))


class InvalidImage(ValueError):
    """The request's image cannot be used; str(error) tells the client why."""


def as_bytes(item: object) -> bytes:
    """A BYTES tensor element (bytes, numpy.bytes_ or str) as bytes."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("ascii", errors="replace")
    raise InvalidImage(
        f"INPUT_IMAGE element has type {type(item).__name__}, expected an image file's bytes or its base64"
    )


# How each accepted image file begins. The JPEG, PNG and TIFF signatures hold
# bytes outside the base64 alphabet; those of GIF, WebP and BMP are letters,
# but the base64 of an image begins "/9j/", "iVBOR", "SUkq", "TU0A", "R0lG",
# "UklG" or "Qk", never "GIF8", "RIFF" or "BM" (and a BMP's reserved header
# bytes are zeros, which base64 never holds). So the first bytes alone tell an
# image file's bytes from the base64 of one.
ACCEPTED_FORMATS = "JPEG, PNG, GIF, WebP, BMP or TIFF"


def image_file_format(data: bytes) -> str | None:
    """The format whose magic number `data` begins with, or None (then it may be base64)."""
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "WebP"
    if data.startswith(b"BM") and data[6:10] == b"\0\0\0\0":
        return "BMP"
    if data.startswith((b"II*\0", b"MM\0*")):
        return "TIFF"
    return None


READ_AS = {"bytes": "the file's bytes", "base64": "base64"}


def decode_base64(text: bytes) -> bytes:
    """The file inside base64 text: plain, line-wrapped, or a data: URL."""
    if text.startswith(b"data:") and _DATA_URL_MARK in text:
        text = text.split(_DATA_URL_MARK, 1)[1]
    text = b"".join(text.split())  # `base64` and many clients wrap lines at 76 columns
    if not text:
        raise InvalidImage("INPUT_IMAGE is empty: expected an image file's bytes or its base64")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:
        raise InvalidImage(
            f"INPUT_IMAGE is neither an image file's bytes ({ACCEPTED_FORMATS}) nor base64 text ({error})"
        ) from None


def image_file_bytes(item: object, max_encoded_bytes: int = DEFAULT_MAX_ENCODED_BYTES) -> tuple[bytes, str]:
    """One INPUT_IMAGE element -> (the image file's bytes, how it was sent: "bytes" or "base64").

    The seed's clients send the file's bytes; perf_analyzer's JSON input and
    many others send base64. The size limit applies to the element as sent.
    """
    data = as_bytes(item)
    if len(data) > max_encoded_bytes:
        raise InvalidImage(f"INPUT_IMAGE is {len(data)} bytes, over the limit of {max_encoded_bytes} bytes")
    if image_file_format(data):
        return data, "bytes"
    return decode_base64(data), "base64"


def open_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Identify an image file and check its size, without decoding its pixels yet."""
    if not data:
        raise InvalidImage("INPUT_IMAGE decodes to zero bytes: expected an image file")
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise InvalidImage(
            f"INPUT_IMAGE is not an image: Pillow cannot identify the format of its {len(data)} bytes"
        ) from None
    except Image.DecompressionBombError as error:
        raise InvalidImage(f"INPUT_IMAGE is too large: {error}") from None
    except (OSError, SyntaxError, ValueError) as error:
        raise InvalidImage(f"INPUT_IMAGE is unreadable: {error}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise InvalidImage(
            f"INPUT_IMAGE is {width}x{height} = {width * height} pixels, over the limit of {max_pixels} pixels"
        )
    if width == 0 or height == 0:
        raise InvalidImage(f"INPUT_IMAGE has no pixels ({width}x{height})")
    return image


def to_rgb(image: Image.Image) -> Image.Image:
    """Decode the pixels and convert grayscale, palette, RGBA and CMYK images to RGB."""
    try:
        image.load()
    except Image.DecompressionBombError as error:
        raise InvalidImage(f"INPUT_IMAGE is too large: {error}") from None
    except (OSError, SyntaxError, ValueError) as error:
        # Pillow reports a truncated JPEG as "image file is truncated".
        raise InvalidImage(f"INPUT_IMAGE is unreadable or truncated: {error}") from None
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        # Transparent pixels become white, as an image viewer shows them.
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def reduce_on_decode(image: Image.Image, min_side: int) -> Image.Image:
    """Let a JPEG decode at 1/2, 1/4 or 1/8 scale while its short side stays >= min_side.

    libjpeg scales in the DCT domain, so a 4000x3000 photo meant for a 256 px
    network input never has its 12 M pixels decoded just to be averaged away.
    Call before the pixels are loaded; other formats are left as they are.
    The size limits (open_image) apply to the size of the upload, not this one.
    """
    width, height = image.size
    scale = min_side / min(width, height)
    if image.format == "JPEG" and scale < 0.5:
        # Pillow picks the largest reduction that keeps the image at least this size.
        image.draft(image.mode, (max(1, int(width * scale + 0.5)), max(1, int(height * scale + 0.5))))
    return image


def decode_image(
    item: object,
    max_encoded_bytes: int = DEFAULT_MAX_ENCODED_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    min_side: int | None = None,
) -> Image.Image:
    """One INPUT_IMAGE element (the file's bytes or its base64) -> an RGB image, or InvalidImage saying why not.

    min_side: decode large JPEGs at a reduced scale that keeps at least this
    many pixels on the short side (see reduce_on_decode); None decodes in full.
    """
    data, sent_as = image_file_bytes(item, max_encoded_bytes)
    try:
        image = open_image(data, max_pixels)
        if min_side:
            image = reduce_on_decode(image, min_side)
        return to_rgb(image)
    except InvalidImage as error:
        # How the server read the element tells a client which of its two forms went wrong.
        raise InvalidImage(f"{error} (read as {READ_AS[sent_as]})") from None


def model_parameters(model_config: dict) -> dict[str, str]:
    """The `parameters { key: ... value: { string_value: ... } }` of a model config."""
    return {key: value.get("string_value", "") for key, value in model_config.get("parameters", {}).items()}


def parameter_flag(params: dict[str, str], key: str, default: bool = False) -> bool:
    """A true/false model-config parameter ("true", "1", "yes", "on" are true)."""
    value = params.get(key, "").strip().lower()
    return default if not value else value in ("true", "1", "yes", "on")


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_per_instance(model_config: dict, requested: int = 0) -> int:
    """Torch (and preprocessing) threads for one instance of this model.

    requested > 0 is taken as it is. Otherwise the host's CPUs are shared out
    among the model's instances (every instance runs in its own stub process
    with its own thread pools): N instances x torch's default of one thread
    per core would put N threads on every core, and on a busy core an OpenMP
    thread that is descheduled stalls all the others at the next barrier.
    """
    if requested > 0:
        return requested
    instances = sum(int(group.get("count", 1)) for group in model_config.get("instance_group", [])) or 1
    return max(1, available_cpus() // instances)


def instance_device(instance_kind: str, device_id: str | int, log: logging.Logger | None = None) -> str:
    """The torch device for a Triton instance: its assigned GPU, or the CPU.

    A KIND_GPU instance on a host where torch sees no CUDA device falls back to
    the CPU (and says so) rather than failing to load.
    """
    if instance_kind.upper() == "GPU":
        import torch

        if torch.cuda.is_available():
            return f"cuda:{int(device_id)}"
        if log:
            log.warning("instance asked for GPU %s but torch sees no CUDA device: running on CPU", device_id)
    return "cpu"


def triton_error_response(pb_utils, message: str, client_error: bool = True):
    """An InferenceResponse that fails one request with `message`.

    client_error marks it INVALID_ARG (HTTP 400) where the backend supports codes.
    """
    error = None
    if client_error:
        try:
            error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
        except (AttributeError, TypeError):  # older python backends take no error code
            pass
    return pb_utils.InferenceResponse(output_tensors=[], error=error or pb_utils.TritonError(message))
