"""The PyTorch port of nsfwjs's trained MobileNetV2 (trained_mobilenet.py) is exact.

TF.js itself (its pure-JS CPU backend, installed once into .runtime/tfjs) runs
the package's layers model on the same inputs: it reads the topology and the
quantised weights on its own, so this checks the dequantisation, the layout
conversions (NHWC, HWIO, HWC1), the padding and every layer at once.
Measured: the probabilities agree to 4e-7, the 1280 features to 2e-6 relative
(asserted: 1e-5), the install takes a few seconds, the run about 15 s.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from support import trained_mobilenet

from provision import config, sample_images

TFJS_PACKAGES = [
    "@tensorflow/tfjs-core@4.22.0",
    "@tensorflow/tfjs-layers@4.22.0",
    "@tensorflow/tfjs-backend-cpu@4.22.0",
]

# argv: tfjs folder, model folder, input (float32 NHWC), output JSON, image count.
_RUN_TFJS = """
const [tfjsDir, modelDir, inputPath, outputPath, count] = process.argv.slice(1);
const fs = require("fs");
const tf = require(tfjsDir + "/node_modules/@tensorflow/tfjs-core");
require(tfjsDir + "/node_modules/@tensorflow/tfjs-backend-cpu");
const tfl = require(tfjsDir + "/node_modules/@tensorflow/tfjs-layers");
const model = require(modelDir + "/model.min.js");
const weightData = new Uint8Array(Buffer.from(require(modelDir + "/group1-shard1of1.min.js"), "base64")).buffer;
(async () => {
  await tf.setBackend("cpu");
  const net = await tfl.loadLayersModel(tf.io.fromMemory({
    modelTopology: model.modelTopology, weightSpecs: model.weightsManifest[0].weights, weightData}));
  const raw = fs.readFileSync(inputPath);
  const x = tf.tensor4d(new Float32Array(raw.buffer, raw.byteOffset, raw.length / 4), [Number(count), 224, 224, 3]);
  const features = tfl.model({inputs: net.inputs, outputs: net.getLayer("flatten_1").output});
  fs.writeFileSync(outputPath, JSON.stringify({
    probabilities: await net.predict(x).array(), features: await features.predict(x).array()}));
})();
"""


@pytest.fixture(scope="module")
def tfjs_dir():
    if shutil.which("npm") is None:
        pytest.skip("needs node and npm (make test installs them)")
    directory = config.runtime_dir() / "tfjs"
    if not (directory / "node_modules" / "@tensorflow" / "tfjs-layers").is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(directory), *TFJS_PACKAGES],
            check=True,
        )
    return directory


@pytest.fixture(scope="module")
def network():
    try:
        return trained_mobilenet.load()
    except trained_mobilenet.NodeMissing as missing:
        pytest.skip(str(missing))


def fixed_inputs() -> torch.Tensor:
    """NCHW [0, 1] images: noise, a flat grey, a generated picture, a real photo."""
    generator = torch.Generator().manual_seed(0)
    picture = np.asarray(sample_images.picture((224, 224), seed=3), dtype=np.float32) / 255
    photo = np.asarray(_real_photo().resize((224, 224), Image.BICUBIC), dtype=np.float32) / 255
    return torch.stack(
        [
            torch.rand(3, 224, 224, generator=generator),
            torch.full((3, 224, 224), 0.5),
            torch.from_numpy(picture).permute(2, 0, 1),
            torch.from_numpy(photo).permute(2, 0, 1),
        ]
    )


def _real_photo() -> Image.Image:
    from sklearn.datasets import load_sample_image  # the dev extra: a photo inside the package

    return Image.fromarray(load_sample_image("china.jpg"))


def run_tfjs(tfjs_dir, images: torch.Tensor, work) -> dict:
    """TF.js's probabilities and features of NCHW images (it takes them NHWC)."""
    (work / "input.bin").write_bytes(images.permute(0, 2, 3, 1).contiguous().numpy().astype("<f4").tobytes())
    arguments = [tfjs_dir, trained_mobilenet.fetch(), work / "input.bin", work / "output.json"]
    command = ["node", "-e", _RUN_TFJS, *(str(Path(a).resolve()) for a in arguments), str(len(images))]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    return json.loads((work / "output.json").read_text())


def test_the_port_gives_tfjs_probabilities_and_features(tfjs_dir, network, tmp_path):
    images = fixed_inputs()
    expected = run_tfjs(tfjs_dir, images, tmp_path)
    expected_probabilities = torch.tensor(expected["probabilities"])
    expected_features = torch.tensor(expected["features"])
    probabilities, features = network.outputs(images, (trained_mobilenet.OUTPUT, trained_mobilenet.FEATURES))
    assert features.shape == expected_features.shape == (len(images), 1280)
    assert torch.equal(probabilities.argmax(1), expected_probabilities.argmax(1))
    assert (probabilities - expected_probabilities).abs().max() <= 1e-5
    relative = (features - expected_features).norm(dim=1) / expected_features.norm(dim=1)
    assert relative.max() <= 1e-5


def test_it_is_a_trained_network(network):
    # A random network's outputs hardly depend on the picture; this one calls a photo "Neutral" with confidence.
    probabilities = network(fixed_inputs())
    assert trained_mobilenet.CLASSES[probabilities[3].argmax()] == "Neutral" and probabilities[3].max() > 0.99
