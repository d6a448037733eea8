"""A trained MobileNetV2 for the tests, from a package registry: nsfwjs's.

The course's food11.pth cannot be fetched here, and random weights prove
nothing about preprocessing (a random network is chaotic). The npm package
nsfwjs (MIT licence) bundles a Keras-applications MobileNetV2 trained on real
photos, 224x224 RGB input in [0, 1] (nsfwjs divides the pixels by 255), with
its own head: the ImageNet backbone's 1280 features -> Dense 256 relu ->
Dense 128 relu -> Dense 5 softmax (Drawing, Hentai, Neutral, Porn, Sexy).
Its weights are uint8-quantised per tensor (value = q * scale + min), as
TF.js stores them.

This module gets the package once (`npm pack` into .runtime/nsfwjs, checked
against its published sha512), reads the layers model with node (the files are
JS modules), dequantises the weights as TF.js does, and runs the Keras layer
graph in PyTorch: `load()` gives a torch module that takes NCHW [0, 1] images
and returns the five probabilities (or, with output=FEATURES, the 1280 ImageNet
features; `outputs` gives several layers' from one pass). tests/test_trained_mobilenet.py checks it against TF.js.

    python tests/support/trained_mobilenet.py      # fetch the package (make test does)
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

PACKAGE = "nsfwjs@4.4.0"
TARBALL = "nsfwjs-4.4.0.tgz"
INTEGRITY = "sha512-krC1fgeTLXtZwgdpKJ0jm7hqv0gTSRQQRL+FhOaxaJ9Wj92t42BO3csO2odwgTAgZgf2RvkwPtp0R8Aa7dc+MA=="
MODEL_DIR = "package/dist/models/mobilenet_v2"
CLASSES = ("Drawing", "Hentai", "Neutral", "Porn", "Sexy")
OUTPUT = "dense_3"  # the five probabilities
FEATURES = "flatten_1"  # the backbone's 1280 pooled ImageNet features, before nsfwjs's head

# Prints {modelTopology, weightsManifest, weightData (base64)} as one JSON document.
_DUMP = """
const dir = process.argv[1];
const model = require(dir + "/model.min.js");
const weightData = require(dir + "/group1-shard1of1.min.js");
process.stdout.write(JSON.stringify({...model, weightData}));
"""


class NodeMissing(RuntimeError):
    """node or npm is not installed (make test installs them)."""


def cache_dir() -> Path:
    from provision import config

    return config.runtime_dir() / "nsfwjs"


def fetch(cache: Path | None = None) -> Path:
    """The unpacked model folder, from `npm pack` (once: reused when present)."""
    cache = cache or cache_dir()
    model_dir = cache / MODEL_DIR
    if (model_dir / "model.min.js").is_file():
        return model_dir
    if shutil.which("npm") is None:
        raise NodeMissing("fetching the trained MobileNetV2 needs npm (make test installs node and npm)")
    cache.mkdir(parents=True, exist_ok=True)
    tarball = cache / TARBALL
    if not tarball.is_file():
        subprocess.run(["npm", "pack", PACKAGE, "--silent"], cwd=cache, check=True, stdout=subprocess.DEVNULL)
    digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    if digest != INTEGRITY:
        tarball.unlink()
        raise RuntimeError(f"{PACKAGE}: the tarball's {digest} is not the published {INTEGRITY}")
    with tarfile.open(tarball) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(MODEL_DIR) or m.name == "package/LICENSE"]
        archive.extractall(cache, members=members, filter="data")
    tarball.unlink()  # 25 MB, mostly the other two models
    return model_dir


def read_model(model_dir: Path) -> tuple[list[dict], dict[str, np.ndarray]]:
    """The Keras layers (in graph order) and the dequantised float32 weights by name."""
    if shutil.which("node") is None:
        raise NodeMissing("reading the trained MobileNetV2 needs node (make test installs node and npm)")
    dumped = subprocess.run(
        ["node", "-e", _DUMP, str(model_dir.resolve())], check=True, capture_output=True, text=True
    ).stdout
    model = json.loads(dumped)
    data = np.frombuffer(base64.b64decode(model["weightData"]), dtype=np.uint8)
    weights, offset = {}, 0
    for group in model["weightsManifest"]:
        for spec in group["weights"]:
            size = math.prod(spec["shape"])
            quantization = spec["quantization"]
            assert spec["dtype"] == "float32" and quantization["dtype"] == "uint8", spec
            q = data[offset : offset + size].astype(np.float64)
            # As TF.js dequantises: v * scale + min in double precision, stored as float32.
            weights[spec["name"]] = (
                (q * quantization["scale"] + quantization["min"]).astype(np.float32).reshape(spec["shape"])
            )
            offset += size
    assert offset == data.size, f"{data.size - offset} weight bytes left over"
    return model["modelTopology"]["model_config"]["config"]["layers"], weights


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow's 'same' padding of one axis: (before, after), the extra pixel after."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class KerasMobileNet(torch.nn.Module):
    """A Keras functional model's layer graph, run in PyTorch on NCHW tensors.

    Keras is channels-last: conv kernels are HWIO (depthwise HWC1), Dense
    kernels (in, out), Flatten reads NHWC order. Everything is converted here.
    """

    def __init__(self, layers: list[dict], weights: dict[str, np.ndarray]):
        super().__init__()
        self.layers = layers
        self.params = torch.nn.ParameterDict()
        for name, value in weights.items():
            layer, _, kind = name.rpartition("/")
            self.params[f"{layer}.{kind}".replace(".", "__")] = torch.nn.Parameter(
                self._to_torch(layer, kind, torch.from_numpy(value.copy())), requires_grad=False
            )

    def _class_of(self, layer_name: str) -> str:
        return next(layer["class_name"] for layer in self.layers if layer["name"] == layer_name)

    def _to_torch(self, layer: str, kind: str, value: torch.Tensor) -> torch.Tensor:
        kind_of_layer = self._class_of(layer)
        if kind_of_layer == "Conv2D" and kind == "kernel":
            return value.permute(3, 2, 0, 1).contiguous()  # HWIO -> OIHW
        if kind_of_layer == "DepthwiseConv2D" and kind == "depthwise_kernel":
            h, w, channels, multiplier = value.shape
            return value.permute(2, 3, 0, 1).reshape(channels * multiplier, 1, h, w).contiguous()  # HWC1 -> (C*M)1HW
        return value

    def _param(self, layer: str, kind: str) -> torch.Tensor | None:
        key = f"{layer}__{kind}"
        return self.params[key] if key in self.params else None

    @staticmethod
    def _activate(x: torch.Tensor, activation: str) -> torch.Tensor:
        if activation == "linear":
            return x
        if activation == "relu":
            return F.relu(x)
        if activation == "softmax":
            return torch.softmax(x, dim=-1)
        raise NotImplementedError(f"activation {activation}")

    def _conv(self, x: torch.Tensor, name: str, config: dict, depthwise: bool) -> torch.Tensor:
        assert config["data_format"] == "channels_last" and tuple(config["dilation_rate"]) == (1, 1), config
        (kh, kw), (sh, sw) = config["kernel_size"], config["strides"]
        if config["padding"] == "same":
            top, bottom = _same_padding(x.shape[2], kh, sh)
            left, right = _same_padding(x.shape[3], kw, sw)
            x = F.pad(x, (left, right, top, bottom))
        else:
            assert config["padding"] == "valid", config
        weight = self._param(name, "depthwise_kernel" if depthwise else "kernel")
        bias = self._param(name, "bias") if config["use_bias"] else None
        x = F.conv2d(x, weight, bias, stride=(sh, sw), groups=x.shape[1] if depthwise else 1)
        return self._activate(x, config["activation"])

    def _layer(self, layer: dict, inputs: list[torch.Tensor]) -> torch.Tensor:
        kind, name, config = layer["class_name"], layer["name"], layer["config"]
        x = inputs[0]
        if kind == "ZeroPadding2D":
            (top, bottom), (left, right) = config["padding"]
            return F.pad(x, (left, right, top, bottom))
        if kind in ("Conv2D", "DepthwiseConv2D"):
            return self._conv(x, name, config, depthwise=kind == "DepthwiseConv2D")
        if kind == "BatchNormalization":
            assert config["axis"] in (-1, 3), config
            shape = (1, -1, 1, 1)
            mean, variance = self._param(name, "moving_mean"), self._param(name, "moving_variance")
            x = (x - mean.view(shape)) / torch.sqrt(variance.view(shape) + config["epsilon"])
            if config["scale"]:
                x = x * self._param(name, "gamma").view(shape)
            if config["center"]:
                x = x + self._param(name, "beta").view(shape)
            return x
        if kind == "ReLU":
            assert not config.get("negative_slope") and not config.get("threshold"), config
            return x.clamp(min=0) if config.get("max_value") is None else x.clamp(0, config["max_value"])
        if kind == "Add":
            return torch.stack(inputs).sum(dim=0)
        if kind == "AveragePooling2D":
            assert config["padding"] == "valid", config
            return F.avg_pool2d(x, tuple(config["pool_size"]), tuple(config["strides"]))
        if kind == "GlobalAveragePooling2D":
            return x.mean(dim=(2, 3))
        if kind == "Flatten":
            return x.permute(0, 2, 3, 1).flatten(1) if x.ndim == 4 else x.flatten(1)  # NHWC order, as Keras
        if kind == "Dense":
            x = x @ self._param(name, "kernel")
            if config["use_bias"]:
                x = x + self._param(name, "bias")
            return self._activate(x, config["activation"])
        if kind == "Dropout":
            return x  # inference
        raise NotImplementedError(f"Keras layer {kind} ({name})")

    @torch.inference_mode()
    def outputs(self, images: torch.Tensor, names: tuple[str, ...]) -> list[torch.Tensor]:
        """NCHW float images in [0, 1] -> the outputs of the named layers, in one pass."""
        found: dict[str, torch.Tensor] = {}
        for layer in self.layers:
            if layer["class_name"] == "InputLayer":
                x = images
            else:
                # Each layer here has one inbound node: [[name, node, tensor, kwargs], ...].
                (node,) = layer["inbound_nodes"]
                x = self._layer(layer, [found[source] for source, *_ in node])
            found[layer["name"]] = x
            if all(name in found for name in names):
                return [found[name] for name in names]
        raise KeyError(f"no layer {set(names) - set(found)}")

    def forward(self, images: torch.Tensor, output: str = OUTPUT) -> torch.Tensor:
        """NCHW float images in [0, 1] -> the five probabilities (or the named layer's output)."""
        (x,) = self.outputs(images, (output,))
        return x


def load(cache: Path | None = None) -> KerasMobileNet:
    """nsfwjs's trained MobileNetV2 as a torch module (fetched once, see fetch)."""
    return KerasMobileNet(*read_model(fetch(cache))).eval()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project, for provision
    print(fetch())
