"""The Food-11 classifier: weights, preprocessing and batched prediction.

One implementation for every classifier variant (CPU, GPU, dynamic batching,
multi-GPU): the variants differ only in their config.pbtxt. Pure PyTorch, so
tests and benchmarks run exactly this code in-process, without Triton.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from serving_common import (
    DEFAULT_MAX_ENCODED_BYTES,
    DEFAULT_MAX_PIXELS,
    InvalidImage,
    decode_image,
    image_file_bytes,
    is_smoke_weights,
    open_image,
)
from torchvision import models, transforms
from torchvision.transforms import functional as F

# The eleven Food-11 classes, in the order of the network's outputs.
FOOD11_LABELS = (
    "Bread",
    "Dairy product",
    "Dessert",
    "Egg",
    "Fried food",
    "Meat",
    "Noodles/Pasta",
    "Rice",
    "Seafood",
    "Soup",
    "Vegetable/Fruit",
)

# The course's preprocessing (ImageNet statistics, as the network was fine-tuned with).
RESIZE_TO = 256
CROP_TO = 224
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Reduced-size JPEG decoding keeps at least this many pixels on the short side:
# twice the Resize target, so the final resize still averages >= 2x2 decoded
# pixels per output pixel. Measured against the full decode (tests/test_preprocessing.py):
# network inputs differ by < 0.1 grey level on average on generated pictures, up to
# 0.32 on real photos (at most 6 levels); a trained MobileNetV2 gives the same labels,
# probabilities within 0.05.
REDUCED_DECODING_MIN_SIDE = 2 * RESIZE_TO


def reference_transform() -> transforms.Compose:
    """The seed's preprocessing of a fully decoded RGB image, the reference our path is held to."""
    return transforms.Compose(
        [
            transforms.Resize(RESIZE_TO),
            transforms.CenterCrop(CROP_TO),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


class WeightsError(RuntimeError):
    """The weights file is missing or is not a Food-11 MobileNetV2."""


def build_network(num_classes: int = len(FOOD11_LABELS)) -> torch.nn.Module:
    """MobileNetV2 with an 11-way head, the architecture of the course's food11.pth."""
    return models.mobilenet_v2(weights=None, num_classes=num_classes)


def _state_dict_of(checkpoint: object) -> dict | None:
    """The state_dict inside a checkpoint, if it is one (plain or wrapped in a dict)."""
    if isinstance(checkpoint, dict):
        for key in ("state_dict", "model_state_dict"):
            if isinstance(checkpoint.get(key), dict):
                return checkpoint[key]
        if all(isinstance(value, torch.Tensor) for value in checkpoint.values()):
            return checkpoint
    return None


def load_network(weights_path: str | os.PathLike) -> torch.nn.Module:
    """Load food11.pth: a whole pickled model (the course's format) or a state_dict."""
    weights_path = Path(weights_path)
    if not weights_path.is_file():
        raise WeightsError(
            f"Food-11 weights not found at {weights_path}: set the model parameter weights_path, "
            "or generate smoke weights with `python -m provision.smoke_weights`"
        )
    try:
        # A state_dict loads without unpickling code.
        checkpoint = torch.load(weights_path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - any failure here means "not a plain state_dict"
        # The course saves the whole model with torch.save(model): that needs full
        # unpickling, acceptable for a file the operator put on the server.
        checkpoint = torch.load(weights_path, map_location="cpu", weights_only=False)

    if isinstance(checkpoint, torch.nn.Module):
        network = checkpoint
    else:
        state_dict = _state_dict_of(checkpoint)
        if state_dict is None:
            raise WeightsError(
                f"{weights_path} holds a {type(checkpoint).__name__}, expected a pickled MobileNetV2 or its state_dict"
            )
        network = build_network()
        try:
            network.load_state_dict(state_dict)
        except RuntimeError as error:
            raise WeightsError(f"{weights_path} is not a Food-11 MobileNetV2 state_dict: {error}") from None

    outputs = _output_features(network)
    if outputs != len(FOOD11_LABELS):
        raise WeightsError(f"{weights_path} has {outputs} outputs, expected the {len(FOOD11_LABELS)} Food-11 classes")
    return network


def for_inference(network: torch.nn.Module) -> tuple[torch.nn.Module, bool]:
    """The network as served: (network, whether its BatchNorms were folded).

    Each BatchNorm is folded into the convolution before it (torch.fx's fuse,
    with the running statistics of eval mode) and the weights are stored
    channels_last: the same function to float rounding (tests/test_preprocessing.py),
    and on the CPU the forward pass of MobileNetV2, most of a small image's
    time, takes a third (15-20 -> 6 ms per image of a batch of 8, one thread;
    benchmarks/classifier_throughput.py).
    A network that torch.fx cannot trace (someone's own module) is served unfolded.
    """
    network = network.eval()
    try:
        from torch.fx.experimental.optimization import fuse

        network, folded = fuse(network), True
    except Exception:  # noqa: BLE001 - tracing can fail in many ways; the network still works as it is
        folded = False
    return network.to(memory_format=torch.channels_last), folded


def _output_features(network: torch.nn.Module) -> int | None:
    last_linear = None
    for module in network.modules():
        if isinstance(module, torch.nn.Linear):
            last_linear = module
    return None if last_linear is None else last_linear.out_features


class Food11Classifier:
    """Food-11 MobileNetV2 on one device: encoded images in, (label, probability) out.

    The path of a dynamic batch (model.py runs exactly this, and so do tests
    and benchmarks in-process):

      prepare(items)   image files (bytes or base64) -> decoded, resized, cropped uint8 images, every
                       item in parallel on a thread pool (Pillow releases the GIL
                       while it decodes and resizes); an unusable item gives its
                       InvalidImage instead of an image;
      to_batch(...)    one uint8 NCHW tensor for the whole batch, moved to the
                       device once, then scaled and normalised there;
      predict(batch)   one forward pass under inference_mode.

    The arithmetic is the seed's (Resize(256), CenterCrop(224), ToTensor,
    Normalize, in that order and precision); what differs is where it runs:
    - reduced_decoding: a large JPEG is decoded at 1/2, 1/4 or 1/8 scale
      (keeping REDUCED_DECODING_MIN_SIDE px), within a tolerance of the full
      decode that tests/test_preprocessing.py checks;
    - on a GPU the resize and crop run on the device too (device_preprocessing),
      on the decoded uint8 image: torch's antialiased bilinear resize, again
      within that tolerance of Pillow's;
    - gpu_decode (GPU instances, off by default): baseline JPEGs are decoded
      by torchvision.io.decode_jpeg on the device (nvJPEG); other images, and
      any JPEG the device decoder refuses, take the Pillow path.
    """

    def __init__(
        self,
        weights_path: str | os.PathLike,
        device: str = "cpu",
        threads: int = 1,
        reduced_decoding: bool = True,
        gpu_decode: bool = False,
        device_preprocessing: bool | None = None,
        max_encoded_bytes: int = DEFAULT_MAX_ENCODED_BYTES,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ):
        self.device = torch.device(device)
        self.weights_path = Path(weights_path)
        self.smoke_weights = is_smoke_weights(self.weights_path)
        self.network, self.folded = for_inference(load_network(self.weights_path).to(self.device))
        self.max_encoded_bytes = max_encoded_bytes
        self.max_pixels = max_pixels
        self.min_side = REDUCED_DECODING_MIN_SIDE if reduced_decoding else None
        on_gpu = self.device.type == "cuda"
        self.device_preprocessing = on_gpu if device_preprocessing is None else device_preprocessing
        # Device decoding hands full-size images to the device resize.
        self.gpu_decode = gpu_decode and self.device_preprocessing
        # Preprocessing and the forward pass take turns in execute(), so the
        # pool may use the same CPUs as torch's threads without competing.
        self.threads = max(1, int(threads))
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="food11-prep") if self.threads > 1 else None
        shape = (1, 3, 1, 1)
        self._mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32, device=self.device).view(shape)
        self._std = torch.tensor(IMAGENET_STD, dtype=torch.float32, device=self.device).view(shape)

    def close(self) -> None:
        """Stop the preprocessing threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    # -- one image

    def decode(self, item: object) -> Image.Image:
        """One INPUT_IMAGE element -> an RGB image (reduced-size decoding for large JPEGs)."""
        return decode_image(item, self.max_encoded_bytes, self.max_pixels, self.min_side)

    def _from_image(self, image: Image.Image) -> np.ndarray | torch.Tensor:
        """An RGB image -> what to_batch takes: the 224x224 crop, or the whole image for the device."""
        if image.mode != "RGB":
            image = image.convert("RGB")
        if self.device_preprocessing:
            return torch.from_numpy(np.array(image))  # HWC uint8 (a writable copy), resized on the device
        # Pillow's resize and crop, exactly as transforms.Resize and CenterCrop do them.
        return np.asarray(F.center_crop(F.resize(image, RESIZE_TO), CROP_TO))

    def _prepare_one(self, item: object) -> np.ndarray | torch.Tensor | InvalidImage:
        try:
            return self._from_image(self.decode(item))
        except InvalidImage as error:
            return error

    # -- a batch

    def prepare(self, items: list) -> list[np.ndarray | torch.Tensor | InvalidImage]:
        """Decode and preprocess every item, in parallel; an unusable item gives its InvalidImage."""
        items = list(items)
        if self.gpu_decode:
            return self._prepare_on_device(items)
        if self._pool is None or len(items) < 2:
            return [self._prepare_one(item) for item in items]
        return list(self._pool.map(self._prepare_one, items))

    def to_batch(self, prepared: list[np.ndarray | torch.Tensor]) -> torch.Tensor:
        """Prepared images -> the normalised float32 NCHW batch, on the device."""
        if self.device_preprocessing:
            crops = [self._device_crop(image) for image in prepared]
            batch = torch.stack(crops)
        else:
            # One NHWC uint8 array, one tensor, one copy to NCHW: no per-item tensors.
            batch = torch.from_numpy(np.stack(prepared)).permute(0, 3, 1, 2).contiguous()
            batch = batch.to(self.device, non_blocking=True)
        # ToTensor then Normalize, the same float32 operations in the same order.
        return batch.to(torch.float32).div(255).sub(self._mean).div(self._std)

    def _device_crop(self, image: torch.Tensor) -> torch.Tensor:
        """A decoded uint8 image (HWC from Pillow, CHW from decode_jpeg) -> its 3x224x224 crop, on the device."""
        if image.ndim == 3 and image.shape[-1] == 3 and image.shape[0] != 3:
            image = image.permute(2, 0, 1)
        image = image.to(self.device, non_blocking=True)
        # uint8 in, uint8 out (rounded), as Pillow's resize: antialiased bilinear.
        image = F.resize(image, RESIZE_TO, antialias=True)
        return F.center_crop(image, CROP_TO)

    def _prepare_on_device(self, items: list) -> list[torch.Tensor | np.ndarray | InvalidImage]:
        """gpu_decode: baseline RGB/grey JPEGs decoded by nvJPEG in one call, the rest by Pillow."""
        from torchvision.io import ImageReadMode, decode_jpeg

        prepared: list = [None] * len(items)
        on_device: list[tuple[int, bytes]] = []
        for index, item in enumerate(items):
            try:
                data, _ = image_file_bytes(item, self.max_encoded_bytes)
                header = open_image(data, self.max_pixels)  # format, mode and size limit, no pixels yet
            except InvalidImage as error:
                prepared[index] = error
                continue
            # A JPEG that does not end with its EOI marker may be truncated: let Pillow say so.
            if header.format == "JPEG" and header.mode in ("RGB", "L") and data.rstrip(b"\0").endswith(b"\xff\xd9"):
                on_device.append((index, data))
            else:
                prepared[index] = self._prepare_one(item)
        if on_device:
            try:
                tensors = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for _, data in on_device]
                decoded = decode_jpeg(tensors, mode=ImageReadMode.RGB, device=self.device)
                for (index, _), image in zip(on_device, decoded):
                    prepared[index] = image
            except RuntimeError:
                # The device decoder refused one of them: Pillow decodes each, and names what is wrong.
                for index, _ in on_device:
                    prepared[index] = self._prepare_one(items[index])
        return prepared

    # -- inference

    @torch.inference_mode()
    def predict(self, batch: torch.Tensor) -> tuple[list[str], np.ndarray]:
        """A batch of preprocessed images -> labels and softmax probabilities (float32)."""
        logits = self.network(batch.to(self.device, non_blocking=True).contiguous(memory_format=torch.channels_last))
        probabilities = torch.softmax(logits.float(), dim=1)
        best_probability, best_index = probabilities.max(dim=1)
        labels = [FOOD11_LABELS[i] for i in best_index.tolist()]
        return labels, best_probability.cpu().numpy().astype(np.float32)

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        """An RGB image -> the normalised 3x224x224 tensor the network expects."""
        return self.to_batch([self._from_image(image)])[0]

    def classify(self, images: list) -> list[tuple[str, float]]:
        """For scripts and tests: RGB images, or encoded items as INPUT_IMAGE carries them
        (the file's bytes or base64), through the served path -> [(label, probability)]."""
        prepared = [
            self._from_image(image) if isinstance(image, Image.Image) else self._prepare_one(image) for image in images
        ]
        errors = [p for p in prepared if isinstance(p, InvalidImage)]
        if errors:
            raise errors[0]
        labels, probabilities = self.predict(self.to_batch(prepared))
        return list(zip(labels, probabilities.tolist()))
