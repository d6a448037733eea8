"""The whole model repository on a real tritonserver 2.51, over HTTP with tritonclient.

Smoke weights: the answers are meaningless, but the served answers must equal
the same weights run in-process, alone or batched, and bad input must fail
its own request only.
"""

from __future__ import annotations

import base64
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.http as triton_http
from food11 import FOOD11_LABELS, Food11Classifier
from PIL import Image
from support.repository import rendered_repository
from support.serving import classify, classify_error, counts_since, image_input, settled_counts
from tritonclient.utils import InferenceServerException

from provision import config, sample_images
from provision.host.tritonserver import TritonProcess
from provision.model_repo import model_names

# One worker runs every test of the session's tritonserver (pytest-xdist's loadgroup): one server, not one per worker.
pytestmark = [pytest.mark.triton, pytest.mark.xdist_group("session_triton")]

CLASSIFIERS = ["food_classifier", "gpu_food_classifier", "batching_food_classifier", "multigpu_food_classifier"]
BATCHING = "batching_food_classifier"


def _b64(image: Image.Image, format: str = "JPEG") -> bytes:
    return base64.b64encode(sample_images.encode(image, format))


# A few images of every kind a client may send.
IMAGES = {
    "small-jpeg": sample_images.b64(sample_images.jpeg(seed=1)),
    "other-jpeg": sample_images.b64(sample_images.jpeg(seed=2)),
    "grayscale-jpeg": _b64(sample_images.picture(seed=3).convert("L")),
    "rgba-png": _b64(sample_images.picture(seed=4).convert("RGBA"), "PNG"),
    "cmyk-jpeg": _b64(sample_images.picture(seed=5).convert("CMYK")),
    "phone-jpeg": sample_images.b64(sample_images.jpeg(sample_images.PHONE, seed=6)),
}

_good = sample_images.jpeg(seed=7)
_oversized = sample_images.encode(Image.new("RGB", (5000, 4000)), "PNG")
BAD_INPUTS = {
    "neither-file-nor-base64": (b"%%% not base64 %%%", "neither an image file's bytes"),
    "not-an-image": (base64.b64encode(b"GIF? no, plain text"), "not an image"),
    "truncated-jpeg": (base64.b64encode(_good[: len(_good) // 3]), "truncated"),
    "truncated-jpeg-bytes": (_good[: len(_good) // 3], "(read as the file's bytes)"),
    "empty-string": (b"", "empty"),
    "oversized-image": (base64.b64encode(_oversized), "over the limit"),
    "oversized-image-bytes": (_oversized, "over the limit"),
}


def _file_bytes(item: bytes) -> bytes:
    """The image file inside one of IMAGES' base64 items: what the seed's clients send."""
    return base64.b64decode(item)


@pytest.fixture(scope="module")
def client(triton_server):
    with triton_http.InferenceServerClient(f"{triton_server.host}:{triton_server.http_port}", concurrency=16) as c:
        yield c


@pytest.fixture(scope="module")
def reference(render_values):
    """The same weights, decoding and preprocessing (reduced decoding of the phone photo included), in this process."""
    classifier = Food11Classifier(render_values.food11_weights_path, reduced_decoding=render_values.reduced_decoding)
    return {name: classifier.classify([data])[0] for name, data in IMAGES.items()}


def assert_same_answer(served, expected, context=""):
    assert served[0] == expected[0], f"{context}: label {served[0]} != in-process {expected[0]}"
    assert served[1] == pytest.approx(expected[1], abs=1e-4), f"{context}: probability differs"


def test_every_model_is_ready(triton_server, client):
    assert client.is_server_ready()
    assert sorted(triton_server.model_states()) == model_names()
    for model in model_names():
        assert client.is_model_ready(model), model


def test_gpu_variants_say_they_run_on_cpu_on_this_host(client):
    config = client.get_model_config("gpu_food_classifier")
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert "NO GPU ON THIS HOST" in config["parameters"]["cpu_fallback"]["string_value"]


@pytest.mark.parametrize("model", CLASSIFIERS)
def test_each_variant_answers_like_the_same_weights_in_process(client, reference, model):
    for name, data in IMAGES.items():
        (served,) = classify(client, model, [data])
        assert served[0] in FOOD11_LABELS and 0 < served[1] <= 1
        assert_same_answer(served, reference[name], f"{model} on {name}")


@pytest.mark.parametrize("model", CLASSIFIERS)
def test_each_variant_answers_the_file_s_bytes_as_it_answers_their_base64(client, reference, model):
    for name, data in IMAGES.items():
        (served,) = classify(client, model, [_file_bytes(data)])
        assert_same_answer(served, reference[name], f"{model} on the bytes of {name}")


def test_a_request_may_mix_file_bytes_and_base64(client, reference):
    names = list(IMAGES)
    items = [_file_bytes(IMAGES[name]) if index % 2 else IMAGES[name] for index, name in enumerate(names)]
    for name, served in zip(names, classify(client, BATCHING, items)):
        assert_same_answer(served, reference[name], f"item {name} of a mixed request")


# ---- the seed's client, as its client_scripts are written (but for the image path)


def _seed_client(url: str, model: str, image_path, output_names: list[str]):
    """What the seed's tritonclient scripts do: the file's raw bytes in a [1, 1] BYTES tensor,
    outputs asked for as JSON (binary_data=False); their base64 line is never used."""
    triton_client = triton_http.InferenceServerClient(url=url)
    with open(image_path, "rb") as f:
        image_bytes = f.read()
    inputs = [triton_http.InferInput("INPUT_IMAGE", [1, 1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([[image_bytes]], dtype=object))
    outputs = [triton_http.InferRequestedOutput(name, binary_data=False) for name in output_names]
    return triton_client.infer(model_name=model, inputs=inputs, outputs=outputs)


def _text(value) -> str:
    """A BYTES output element: JSON outputs come back as str, binary ones as bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)


def test_the_seed_s_client_classifies_with_food_classifier(triton_server, reference, tmp_path):
    image_path = tmp_path / "test_image.jpg"
    image_path.write_bytes(_file_bytes(IMAGES["small-jpeg"]))
    url = f"{triton_server.host}:{triton_server.http_port}"
    results = _seed_client(url, "food_classifier", image_path, ["FOOD_LABEL", "PROBABILITY"])
    predicted_class = results.as_numpy("FOOD_LABEL")
    probability = results.as_numpy("PROBABILITY")
    assert predicted_class.shape == probability.shape == (1, 1)
    assert_same_answer((_text(predicted_class[0, 0]), float(probability[0, 0])), reference["small-jpeg"], "seed client")


def test_the_seed_s_client_captions_with_the_ensemble(triton_server, reference, tmp_path):
    image_path = tmp_path / "test_image.jpg"
    image_path.write_bytes(_file_bytes(IMAGES["other-jpeg"]))
    url = f"{triton_server.host}:{triton_server.http_port}"
    results = _seed_client(url, "ensemble", image_path, ["OUTPUT", "FOOD_LABEL"])
    caption, label = _text(results.as_numpy("OUTPUT")[0, 0]), _text(results.as_numpy("FOOD_LABEL")[0, 0])
    assert label == reference["other-jpeg"][0]
    assert caption.startswith(f"a photo of {label.lower()}"), caption


def test_a_request_may_carry_several_images(client, reference):
    names = list(IMAGES)
    answers = classify(client, BATCHING, [IMAGES[name] for name in names])
    assert len(answers) == len(names)
    for name, served in zip(names, answers):
        assert_same_answer(served, reference[name], f"item {name} of a multi-image request")


def test_dynamically_batched_requests_get_the_answers_they_get_alone(client, reference):
    # A phone-sized image first keeps the instance busy while the 20 small ones queue.
    names = ["phone-jpeg"] + list(IMAGES)[:-1] * 4
    before = settled_counts(client, BATCHING)
    pending = [(name, client.async_infer(BATCHING, [image_input([IMAGES[name]])])) for name in names]
    for name, request in pending:
        result = request.get_result()
        served = (result.as_numpy("FOOD_LABEL")[0, 0].decode(), float(result.as_numpy("PROBABILITY")[0, 0]))
        assert_same_answer(served, reference[name], f"batched {name}")
    inferences, executions = counts_since(client, BATCHING, before, len(names))
    assert inferences == len(names)
    assert executions < inferences, "Triton never batched the concurrent requests"


def test_the_ensemble_captions_an_image_conditioned_on_its_label(client, reference):
    result = client.infer(
        "ensemble",
        [image_input([IMAGES["small-jpeg"]])],
        outputs=[triton_http.InferRequestedOutput(name) for name in ("OUTPUT", "FOOD_LABEL")],
    )
    caption = result.as_numpy("OUTPUT")[0, 0].decode()
    label = result.as_numpy("FOOD_LABEL")[0, 0].decode()
    assert label == reference["small-jpeg"][0]
    assert caption.strip(), "empty caption"
    assert caption.startswith(f"a photo of {label.lower()}"), caption


@pytest.mark.parametrize("bad", list(BAD_INPUTS))
@pytest.mark.parametrize("model", ["food_classifier", BATCHING, "ensemble"])
def test_bad_input_fails_its_own_request_with_a_clear_message(client, model, bad):
    payload, message = BAD_INPUTS[bad]
    error = classify_error(client, model, [payload])
    assert error.status() == "400", f"{bad}: HTTP {error.status()} {error.message()}"
    assert message in error.message() and "INPUT_IMAGE" in error.message()
    assert client.is_server_ready()
    assert classify(client, "food_classifier", [IMAGES["small-jpeg"]])  # the stub is still healthy


# Every subset a client may ask the ensemble for: Triton prunes the steps whose
# outputs nobody reads, and must still run both steps for any of these.
ENSEMBLE_OUTPUT_SUBSETS = [["OUTPUT"], ["FOOD_LABEL"], ["PROBABILITY"], ["OUTPUT", "PROBABILITY"]]


@pytest.mark.parametrize("outputs", ENSEMBLE_OUTPUT_SUBSETS, ids="+".join)
def test_the_ensemble_answers_any_subset_of_its_outputs(client, reference, outputs):
    requested = [triton_http.InferRequestedOutput(name) for name in outputs]
    result = client.infer("ensemble", [image_input([IMAGES["small-jpeg"]])], outputs=requested)
    answered = {output["name"] for output in result.get_response()["outputs"]}
    assert answered == set(outputs)
    label, probability = reference["small-jpeg"]
    if "FOOD_LABEL" in outputs:
        assert result.as_numpy("FOOD_LABEL")[0, 0].decode() == label
    if "PROBABILITY" in outputs:
        assert float(result.as_numpy("PROBABILITY")[0, 0]) == pytest.approx(probability, abs=1e-4)
    if "OUTPUT" in outputs:
        assert result.as_numpy("OUTPUT")[0, 0].decode().startswith(f"a photo of {label.lower()}")


@pytest.mark.parametrize("outputs", ENSEMBLE_OUTPUT_SUBSETS, ids="+".join)
def test_the_ensemble_asked_for_some_outputs_gives_the_failing_step_s_message(client, outputs):
    payload, message = BAD_INPUTS["truncated-jpeg-bytes"]
    requested = [triton_http.InferRequestedOutput(name) for name in outputs]
    with pytest.raises(InferenceServerException) as failure:
        client.infer("ensemble", [image_input([payload])], outputs=requested)
    assert failure.value.status() == "400"
    assert "food_classifier: INPUT_IMAGE is unreadable or truncated" in str(failure.value)
    assert message in str(failure.value)


def test_bad_requests_batched_with_good_ones_leave_the_good_ones_alone(client, reference):
    # The phone-sized image goes first: while the instance decodes it, the
    # others queue up and Triton batches good and bad requests together.
    good = [("good", "phone-jpeg")] + [("good", name) for name in list(IMAGES)[:4]] * 2
    bad = [("bad", name) for name in BAD_INPUTS]
    mix = good[:1] + [item for pair in zip(good[1:], bad + bad[:3]) for item in pair]
    before = settled_counts(client, BATCHING)
    pending = []
    for kind, name in mix:
        payload = IMAGES[name] if kind == "good" else BAD_INPUTS[name][0]
        pending.append((kind, name, client.async_infer(BATCHING, [image_input([payload])])))
    for kind, name, request in pending:
        if kind == "good":
            result = request.get_result()
            served = (result.as_numpy("FOOD_LABEL")[0, 0].decode(), float(result.as_numpy("PROBABILITY")[0, 0]))
            assert_same_answer(served, reference[name], f"good {name} batched with bad inputs")
        else:
            with pytest.raises(Exception, match=BAD_INPUTS[name][1]):
                request.get_result()
    inferences, executions = counts_since(client, BATCHING, before, len(mix))
    assert inferences == len(mix)
    assert executions < len(mix), "no dynamic batch formed: the test proved nothing"
    assert client.is_server_ready()


def test_one_bad_item_fails_a_multi_image_request_and_says_which_problem(client):
    error = classify_error(client, BATCHING, [IMAGES["small-jpeg"], BAD_INPUTS["truncated-jpeg"][0]])
    assert error.status() == "400" and "truncated" in error.message()


def test_the_classify_script_prints_a_label_per_file(triton_server, reference, tmp_path):
    photo = tmp_path / "photo.png"
    photo.write_bytes(_file_bytes(IMAGES["rgba-png"]))
    script = config.PROJECT_ROOT / "client_scripts" / "classify.py"
    url = f"{triton_server.host}:{triton_server.http_port}"
    done = subprocess.run(
        [sys.executable, str(script), str(photo), "--url", url, "--model", "food_classifier"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    label, probability = reference["rgba-png"]
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{photo}: {label} ({probability:.3f})"


def test_the_server_restarts_after_stop(tmp_path, render_values, triton_runtime):
    # A server of the test's own with one model: what is tested is the process's stop and start.
    repository = rendered_repository(tmp_path, render_values, {"food_classifier"})
    server = TritonProcess.on_free_ports(triton_runtime.root, repository, tmp_path / "run")
    try:
        server.start(["food_classifier"], timeout_s=300)
        assert server.stop()
        assert server.pid() is None and not server.is_ready()
        assert not server.stop(), "a second stop finds nothing to stop"
        server.start(["food_classifier"], timeout_s=300)
        with triton_http.InferenceServerClient(f"{server.host}:{server.http_port}") as client:
            assert classify(client, "food_classifier", [IMAGES["small-jpeg"]])
    finally:
        server.stop()
