"""The classifier's fast preprocessing against the seed's reference path.

Reference (the seed's): Pillow decodes the whole JPEG, then Resize(256),
CenterCrop(224), ToTensor, Normalize. Ours differs in two places only:

- reduced-size decoding: a JPEG whose short side is over twice the 512 px
  floor is decoded at 1/2, 1/4 or 1/8 scale by libjpeg (keeping >= 512 px);
- on a GPU, the resize and crop of the decoded image run on the device
  (torch's antialiased bilinear), and with gpu_decode nvJPEG decodes.

The stated tolerance, on the network input in grey levels (0..255) per
channel value: mean absolute difference <= 0.1 and maximum <= 3. That is far
below what the JPEG file already carries (its compression error is checked to
be at least 5 times larger, even for these smooth pictures). Everything else is the same arithmetic: images
that are not reduced give bit-identical inputs.

Labels and probabilities: with real weights (FOOD11_WEIGHTS=path/to/food11.pth)
the label must be the same and the probability within 0.02. The smoke
weights cannot show this: a randomly initialised MobileNetV2 is chaotic
(measured: 0.05 grey levels of mean input change move its top probability by
up to 0.26), so with them only the inputs are compared.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from food11 import IMAGENET_STD, REDUCED_DECODING_MIN_SIDE, Food11Classifier, reference_transform
from PIL import Image
from serving_common import InvalidImage, decode_image, threads_per_instance

from provision import sample_images, smoke_weights

MEAN_GREY_LEVELS = 0.1
MAX_GREY_LEVELS = 3.0
PROBABILITY_TOLERANCE = 0.02

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
    with pytest.raises(InvalidImage, match="not valid base64"):
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


@pytest.mark.skipif(not os.environ.get("FOOD11_WEIGHTS"), reason="needs real weights: FOOD11_WEIGHTS=food11.pth")
def test_real_weights_give_the_same_labels_and_close_probabilities():
    classifier = Food11Classifier(os.environ["FOOD11_WEIGHTS"])
    reference = Food11Classifier(os.environ["FOOD11_WEIGHTS"], reduced_decoding=False)
    for size, seed in LARGE:
        item = sample_images.b64(sample_images.jpeg(size, seed))
        ((label, probability),) = classifier.classify([item])
        ((expected_label, expected),) = reference.classify([item])
        assert label == expected_label, size
        assert abs(probability - expected) <= PROBABILITY_TOLERANCE, size


def test_reference_transform_is_the_seeds(classifier):
    image = Image.fromarray(np.full((300, 400, 3), 128, dtype=np.uint8))
    assert torch.equal(classifier.preprocess(image), reference_transform()(image))
