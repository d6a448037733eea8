"""The Food-11 classifier: weights, preprocessing and batched prediction.

One implementation for every classifier variant (CPU, GPU, dynamic batching,
multi-GPU): the variants differ only in their config.pbtxt. Pure PyTorch, so
tests and benchmarks run exactly this code in-process, without Triton.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from serving_common import is_smoke_weights
from torchvision import models, transforms

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


def _output_features(network: torch.nn.Module) -> int | None:
    last_linear = None
    for module in network.modules():
        if isinstance(module, torch.nn.Linear):
            last_linear = module
    return None if last_linear is None else last_linear.out_features


class Food11Classifier:
    """Food-11 MobileNetV2 on one device: images in, (label, probability) out."""

    def __init__(self, weights_path: str | os.PathLike, device: str = "cpu"):
        self.device = torch.device(device)
        self.weights_path = Path(weights_path)
        self.smoke_weights = is_smoke_weights(self.weights_path)
        self.network = load_network(self.weights_path).to(self.device).eval()
        self._transform = transforms.Compose(
            [
                transforms.Resize(RESIZE_TO),
                transforms.CenterCrop(CROP_TO),
                transforms.ToTensor(),
                transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ]
        )

    def preprocess(self, image: Image.Image) -> torch.Tensor:
        """An RGB image -> the normalised 3x224x224 tensor the network expects."""
        return self._transform(image)

    @torch.inference_mode()
    def predict(self, batch: torch.Tensor) -> tuple[list[str], np.ndarray]:
        """A batch of preprocessed images -> labels and softmax probabilities (float32)."""
        logits = self.network(batch.to(self.device, non_blocking=True))
        probabilities = torch.softmax(logits.float(), dim=1)
        best_probability, best_index = probabilities.max(dim=1)
        labels = [FOOD11_LABELS[i] for i in best_index.tolist()]
        return labels, best_probability.cpu().numpy().astype(np.float32)

    def classify(self, images: list[Image.Image]) -> list[tuple[str, float]]:
        """Convenience for scripts and tests: RGB images -> [(label, probability)]."""
        batch = torch.stack([self.preprocess(image) for image in images])
        labels, probabilities = self.predict(batch)
        return list(zip(labels, probabilities.tolist()))
