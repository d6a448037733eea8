"""The classifier's fast preprocessing against the seed's reference path.

Reference (the seed's): Pillow decodes the whole JPEG, then Resize(256),
CenterCrop(224), ToTensor, Normalize. Ours differs in two places only:

- reduced-size decoding: a JPEG whose short side is over twice the 512 px
  floor is decoded at 1/2, 1/4 or 1/8 scale by libjpeg (keeping >= 512 px);
- on a GPU, the resize and crop of the decoded image run on the device
  (torch's antialiased bilinear), and with gpu_decode nvJPEG decodes.

Network input, in grey levels (0..255) per channel value. On the generated
pictures (smooth colour fields): mean absolute difference <= 0.1 and maximum
<= 3, at least 5 times below what the JPEG compression already did to them.
Real photos carry more detail and differ more: measured mean 0.13-0.32, max 6
(about the size of their own JPEG compression error, 0.5-2x); asserted: mean
<= 0.5, max <= 8. Images that are not reduced give bit-identical inputs.

Labels and probabilities, with a trained MobileNetV2 (nsfwjs's, see
trained_mobilenet.py; its port is checked against TF.js in
test_trained_mobilenet.py): the reference and the reduced input of each image
go through the network, and the stated tolerance is

    same top-1 label, and max |delta p| over the classes <= 0.05.

The images: the generated 4000x3000 (both orientations), 2048x1536, 1280x960,
grey and CMYK phone photos, and seven real photos (scikit-learn's china and
flower; scikit-image's astronaut, chelsea, coffee, rocket, hubble_deep_field)
brought to 4000x3000, 3000x4000 and 2048x1536 and saved as JPEG quality 90,
plus a 4000x3000 mosaic of the photos at their own resolution (full detail).
Measured on these 29: the same label every time, max |delta p| 0.029 (the
mosaic and rocket 2048x1536, where the top probability is 0.6-0.7; <= 0.005
where it is >= 0.9), mean 0.004. Over 84 more random crops of the photos
(4:2:0 at quality 90 and 4:4:4 at 95) no label changed either and max
|delta p| was 0.039.

The yardstick, JPEG itself, on the same images and network: compressing the
picture at quality 90 (lossless -> JPEG, both through the reference path)
moves the probabilities by up to 0.019 (0.052 over the crops), mean 0.002;
re-encoding the decoded JPEG at quality 90 / 95 by up to 0.016 / 0.011 (0.04
over the crops). Reduced decoding moves the backbone's 1280 ImageNet features
as much as that one compression does: relative change 0.025 on average against
0.025 (asserted: at most twice). Hence on by default (provision/defaults.yaml).

With the real Food-11 weights (FOOD11_WEIGHTS=path/to/food11.pth) the same
tolerance is asserted on the classifier's own label and top probability. The
smoke weights cannot show any of this: a randomly initialised MobileNetV2 is
chaotic (0.05 grey levels of mean input change move its top probability by up
to 0.26), so with them only the inputs are compared.
"""

from __future__ import annotations

import copy
import itertools
import os
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from food11 import (
    CROP_TO,
    IMAGENET_MEAN,
    IMAGENET_STD,
    REDUCED_DECODING_MIN_SIDE,
    Food11Classifier,
    build_network,
    for_inference,
    reference_transform,
)
from PIL import Image
from serving_common import InvalidImage, decode_image, threads_per_instance
from support import trained_mobilenet

from provision import sample_images, smoke_weights

# One worker runs them all (pytest-xdist's loadgroup): the weights, the classifier and the trained
# network are loaded once.
pytestmark = pytest.mark.xdist_group("preprocessing")

MEAN_GREY_LEVELS = 0.1
MAX_GREY_LEVELS = 3.0
PHOTO_MEAN_GREY_LEVELS = 0.5
PHOTO_MAX_GREY_LEVELS = 8.0
PROBABILITY_TOLERANCE = 0.05
# On average over the images, reduced decoding moves the trained network's features
# at most this many times as much as the JPEG compression of the picture did (measured: 1.0).
FEATURE_CHANGE_OVER_JPEG = 2.0

# (size, seed): phone photos in both orientations, a 3 MP and a 1.2 MP photo, a web image.
LARGE = [((4000, 3000), 0), ((4000, 3000), 1), ((3000, 4000), 2), ((2048, 1536), 3), ((1280, 960), 4)]
SMALL = [((512, 384), 5), ((640, 480), 6)]

_STD_GREY = torch.tensor(IMAGENET_STD).view(3, 1, 1) * 255


def grey_levels(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| of two normalised network inputs, in grey levels of the 0..255 image."""
    return (a - b).abs() * _STD_GREY


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("weights")
    smoke_weights.generate(directory)
    return directory / smoke_weights.FOOD11_FILE


@pytest.fixture(scope="module")
def classifier(weights) -> Food11Classifier:
    return Food11Classifier(weights, threads=2)


def reference_input(item: bytes) -> torch.Tensor:
    return reference_transform()(decode_image(item))


def our_input(classifier: Food11Classifier, item: bytes) -> torch.Tensor:
    (prepared,) = classifier.prepare([item])
    assert not isinstance(prepared, InvalidImage), prepared
    return classifier.to_batch([prepared])[0]


def assert_within_tolerance(ours: torch.Tensor, reference: torch.Tensor, context: str) -> None:
    difference = grey_levels(ours, reference)
    assert difference.mean() <= MEAN_GREY_LEVELS, f"{context}: mean {difference.mean():.3f} grey levels"
    assert difference.max() <= MAX_GREY_LEVELS, f"{context}: max {difference.max():.2f} grey levels"


def test_a_large_jpeg_is_decoded_at_the_smallest_scale_that_keeps_the_floor():
    phone = sample_images.b64(sample_images.jpeg(sample_images.PHONE))
    assert decode_image(phone, min_side=REDUCED_DECODING_MIN_SIDE).size == (1000, 750)  # 1/4 scale
    assert decode_image(phone).size == sample_images.PHONE  # without min_side: the whole image
    small = sample_images.b64(sample_images.jpeg(sample_images.SMALL))
    assert decode_image(small, min_side=REDUCED_DECODING_MIN_SIDE).size == sample_images.SMALL
    png = sample_images.b64(sample_images.encode(sample_images.picture((2048, 1536)), "PNG"))
    assert decode_image(png, min_side=REDUCED_DECODING_MIN_SIDE).size == (2048, 1536)  # not a JPEG


@pytest.mark.parametrize("size,seed", LARGE, ids=[f"{w}x{h}" for (w, h), _ in LARGE])
def test_reduced_decoding_stays_within_tolerance_of_the_seed_path(classifier, size, seed):
    picture = sample_images.picture(size, seed)
    item = sample_images.b64(sample_images.encode(picture))
    ours, reference = our_input(classifier, item), reference_input(item)
    assert_within_tolerance(ours, reference, f"{size}")
    # For scale: what JPEG compression already did to the same picture.
    compression = grey_levels(reference, reference_transform()(picture)).mean()
    assert grey_levels(ours, reference).mean() * 5 <= compression


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_grey_and_cmyk_phone_photos_stay_within_tolerance(classifier, mode):
    item = sample_images.b64(sample_images.encode(sample_images.picture(sample_images.PHONE, 7).convert(mode)))
    assert_within_tolerance(our_input(classifier, item), reference_input(item), mode)


@pytest.mark.parametrize("size,seed", SMALL, ids=[f"{w}x{h}" for (w, h), _ in SMALL])
def test_images_that_are_not_reduced_get_the_seed_input_bit_for_bit(classifier, size, seed):
    item = sample_images.b64(sample_images.jpeg(size, seed))
    assert torch.equal(our_input(classifier, item), reference_input(item))


def test_a_batch_is_the_items_preprocessed_alone(classifier):
    items = [sample_images.b64(sample_images.jpeg(size, seed)) for size, seed in LARGE[:2] + SMALL]
    prepared = classifier.prepare(items)  # on the thread pool
    alone = torch.stack([our_input(classifier, item) for item in items])
    assert torch.equal(classifier.to_batch(prepared), alone)


def test_classify_takes_encoded_items_through_the_served_path(classifier):
    phone = sample_images.b64(sample_images.jpeg(sample_images.PHONE, 8))
    (label, probability), (again, same) = classifier.classify([phone, decode_image(phone, min_side=512)])
    assert (label, probability) == (again, same)
    with pytest.raises(InvalidImage, match="neither an image file's bytes .* nor base64"):
        classifier.classify([b"%%%"])


def test_device_preprocessing_stays_within_tolerance(weights):
    # The GPU path's arithmetic (torch resize and crop of the decoded image), run on the CPU here.
    on_device = Food11Classifier(weights, device_preprocessing=True)
    for size, seed in LARGE[:2] + SMALL:
        item = sample_images.b64(sample_images.jpeg(size, seed))
        assert_within_tolerance(our_input(on_device, item), reference_input(item), f"device path {size}")


def test_device_decoding_stays_within_tolerance_and_lets_pillow_judge_bad_files(weights):
    # gpu_decode's code path with torchvision's decode_jpeg on the CPU (nvJPEG on a GPU).
    on_device = Food11Classifier(weights, device_preprocessing=True, gpu_decode=True)
    assert on_device.gpu_decode
    good = sample_images.jpeg(sample_images.PHONE, 9)
    items = [
        sample_images.b64(good),
        sample_images.b64(sample_images.encode(sample_images.picture(seed=10), "PNG")),
        sample_images.b64(sample_images.encode(sample_images.picture(seed=11).convert("CMYK"))),
        sample_images.b64(good[: len(good) // 3]),
    ]
    prepared = on_device.prepare(items)
    assert isinstance(prepared[3], InvalidImage) and "truncated" in str(prepared[3])
    for item, image in zip(items[:3], prepared[:3]):
        assert_within_tolerance(on_device.to_batch([image])[0], reference_input(item), "device decode")


def test_threads_are_shared_out_among_the_instances(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert threads_per_instance({"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}) == 8
    assert threads_per_instance({"instance_group": [{"count": 2}, {"count": 2}]}) == 2
    assert threads_per_instance({"instance_group": [{"count": 16}]}) == 1
    assert threads_per_instance({"instance_group": [{"count": 4}]}, requested=3) == 3


def test_the_served_network_computes_what_the_loaded_one_does():
    """BatchNorm folded into the convolutions, channels_last weights: the same logits to float rounding."""
    torch.manual_seed(0)
    network = build_network()
    for module in network.modules():  # trained-looking statistics, so that folding them changes the weights
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.2, 0.2)
    network.eval()
    served, folded = for_inference(copy.deepcopy(network))
    assert folded and not any(isinstance(m, torch.nn.BatchNorm2d) for m in served.modules())
    batch = torch.randn(4, 3, CROP_TO, CROP_TO)
    with torch.inference_mode():
        expected = network(batch)
        logits = served(batch.contiguous(memory_format=torch.channels_last))
    assert torch.allclose(logits, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    assert torch.equal(torch.softmax(logits, 1).argmax(1), torch.softmax(expected, 1).argmax(1))


def test_a_network_torch_fx_cannot_trace_is_served_unfolded():
    class Branchy(torch.nn.Module):  # control flow on a value: torch.fx cannot trace it
        def __init__(self):
            super().__init__()
            self.conv, self.norm = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return self.norm(self.conv(x)) if x.sum() > 0 else x

    served, folded = for_inference(Branchy())
    assert not folded and isinstance(served, Branchy)


# -- labels and probabilities: the reference and the reduced input through a trained network

PHOTO_SIZES = [(4000, 3000), (3000, 4000), (2048, 1536)]
SKLEARN_PHOTOS = ("china", "flower")
SKIMAGE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field")
GENERATED_CASES = [f"generated-{w}x{h}-{seed}" for (w, h), seed in LARGE] + ["generated-grey", "generated-cmyk"]
PHOTO_CASES = [f"{name}-{w}x{h}" for name in SKLEARN_PHOTOS + SKIMAGE_PHOTOS for w, h in PHOTO_SIZES]
CASES = GENERATED_CASES + PHOTO_CASES + ["mosaic-4000x3000"]

_MEAN = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
_STD = torch.tensor(IMAGENET_STD).view(3, 1, 1)


@cache
def photos() -> dict[str, Image.Image]:
    """Real photos that ship inside scikit-learn and scikit-image (the dev extra): no downloads."""
    from skimage import data
    from sklearn.datasets import load_sample_image

    found = {name: Image.fromarray(load_sample_image(f"{name}.jpg")) for name in SKLEARN_PHOTOS}
    found.update({name: Image.fromarray(getattr(data, name)()) for name in SKIMAGE_PHOTOS})
    return found


def phone_sized(photo: Image.Image, size: tuple[int, int]) -> Image.Image:
    """The photo scaled (Lanczos) to cover size, centre-cropped to it: a phone-sized picture."""
    width, height = size
    scale = max(width / photo.width, height / photo.height)
    scaled = photo.resize((round(photo.width * scale), round(photo.height * scale)), Image.LANCZOS)
    left, top = (scaled.width - width) // 2, (scaled.height - height) // 2
    return scaled.crop((left, top, left + width, top + height))


def mosaic(size: tuple[int, int] = sample_images.PHONE) -> Image.Image:
    """The photos at their own resolution, tiled: a phone-sized picture with a photo's fine detail."""
    canvas, x, y, row = Image.new("RGB", size), 0, 0, 0
    for tile in itertools.cycle(photos().values()):
        if y >= size[1]:
            return canvas
        canvas.paste(tile, (x, y))
        x, row = x + tile.width, max(row, tile.height)
        if x >= size[0]:
            x, y, row = 0, y + row, 0


def case_picture(case: str) -> Image.Image:
    """The picture of a case, before JPEG encoding."""
    if case in ("generated-grey", "generated-cmyk"):
        return sample_images.picture(sample_images.PHONE, 7).convert("L" if case.endswith("grey") else "CMYK")
    if case.startswith("generated-"):
        ((size, seed),) = [(size, seed) for (size, seed), name in zip(LARGE, GENERATED_CASES) if name == case]
        return sample_images.picture(size, seed)
    if case.startswith("mosaic-"):
        return mosaic()
    name, _, size = case.rpartition("-")
    return phone_sized(photos()[name], tuple(int(side) for side in size.split("x")))


def unnormalised(x: torch.Tensor) -> torch.Tensor:
    """A normalised network input back to the [0, 1] image (the trained network's input)."""
    return x * _STD + _MEAN


@pytest.fixture(scope="module")
def trained() -> trained_mobilenet.KerasMobileNet:
    try:
        return trained_mobilenet.load()
    except trained_mobilenet.NodeMissing as missing:
        pytest.skip(str(missing))


@pytest.fixture(scope="module")
def measure(trained, classifier):
    """case -> what the trained network says of its reference input, its reduced input and its picture."""

    @cache
    def measured(case: str) -> dict:
        picture = case_picture(case)
        item = sample_images.b64(sample_images.encode(picture))  # JPEG quality 90
        reference, ours = reference_input(item), our_input(classifier, item)
        lossless = reference_transform()(picture.convert("RGB"))  # before the JPEG compression
        images = unnormalised(torch.stack([reference, ours, lossless]))
        probabilities, features = trained.outputs(images, (trained_mobilenet.OUTPUT, trained_mobilenet.FEATURES))

        def change(index: int) -> tuple[float, float]:
            """max |delta p| and the features' relative change of image index against the reference."""
            delta_p = (probabilities[index] - probabilities[0]).abs().max().item()
            return delta_p, ((features[index] - features[0]).norm() / features[0].norm()).item()

        grey = grey_levels(ours, reference)
        return {
            "labels": (probabilities[0].argmax().item(), probabilities[1].argmax().item()),
            "top": probabilities[0].max().item(),
            "ours": change(1),
            "jpeg": change(2),
            "grey": (grey.mean().item(), grey.max().item()),
        }

    return measured


@pytest.mark.parametrize("case", CASES)
def test_a_trained_network_gives_the_same_label_and_close_probabilities(measure, case):
    measured = measure(case)
    reference_label, our_label = (trained_mobilenet.CLASSES[i] for i in measured["labels"])
    delta_p, _ = measured["ours"]
    assert our_label == reference_label, f"{case}: {our_label} instead of {reference_label}"
    assert delta_p <= PROBABILITY_TOLERANCE, f"{case}: max |delta p| {delta_p:.4f} (top p {measured['top']:.3f})"
    mean, largest = measured["grey"]
    assert mean <= PHOTO_MEAN_GREY_LEVELS and largest <= PHOTO_MAX_GREY_LEVELS, f"{case}: {mean:.2f}/{largest:.0f}"


def test_reduced_decoding_moves_the_trained_features_about_as_much_as_jpeg_compression(measure):
    ours = np.mean([measure(case)["ours"][1] for case in CASES])
    jpeg = np.mean([measure(case)["jpeg"][1] for case in CASES])
    assert ours <= FEATURE_CHANGE_OVER_JPEG * jpeg, f"features change {ours:.3f} on average, JPEG's {jpeg:.3f}"


@pytest.mark.skipif(not os.environ.get("FOOD11_WEIGHTS"), reason="needs real weights: FOOD11_WEIGHTS=food11.pth")
def test_real_weights_give_the_same_labels_and_close_probabilities():
    classifier = Food11Classifier(os.environ["FOOD11_WEIGHTS"])
    reference = Food11Classifier(os.environ["FOOD11_WEIGHTS"], reduced_decoding=False)
    for case in CASES:
        item = sample_images.b64(sample_images.encode(case_picture(case)))
        ((label, probability),) = classifier.classify([item])
        ((expected_label, expected),) = reference.classify([item])
        assert label == expected_label, case
        assert abs(probability - expected) <= PROBABILITY_TOLERANCE, case


def test_reference_transform_is_the_seeds(classifier):
    image = Image.fromarray(np.full((300, 400, 3), 128, dtype=np.uint8))
    assert torch.equal(classifier.preprocess(image), reference_transform()(image))
