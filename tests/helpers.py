"""Small helpers the tests share: requests to Triton with tritonclient, uploads to the API."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid

import numpy as np
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException


def image_input(items: list[bytes], name: str = "INPUT_IMAGE") -> triton_http.InferInput:
    array = np.array(items, dtype=np.object_).reshape(-1, 1)
    tensor = triton_http.InferInput(name, list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array)
    return tensor


def classify(client, model: str, items: list[bytes]) -> list[tuple[str, float]]:
    """[(label, probability)] for the items of one request."""
    result = client.infer(model, [image_input(items)])
    labels = result.as_numpy("FOOD_LABEL").reshape(-1)
    probabilities = result.as_numpy("PROBABILITY").reshape(-1)
    return [(label.decode(), float(p)) for label, p in zip(labels, probabilities)]


def classify_error(client, model: str, items: list[bytes]) -> InferenceServerException:
    """The error of a request that must fail."""
    try:
        client.infer(model, [image_input(items)])
    except InferenceServerException as error:
        return error
    raise AssertionError(f"{model} accepted an input it should reject")


def model_counts(client, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of a model: batching makes the first larger."""
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def counts_since(
    client, model: str, before: tuple[int, int], inferences: int, timeout: float = 10.0
) -> tuple[int, int]:
    """(inferences, executions) since `before`, once `inferences` have been counted.

    Triton records a batch's statistics after it has sent the responses, so a
    client holding every answer can still read the counts of the batch before
    the last; waiting for the expected count (or the timeout) reads them settled.
    """
    deadline = time.monotonic() + timeout
    while True:
        since = tuple(after - prior for after, prior in zip(model_counts(client, model), before))
        if since[0] >= inferences or time.monotonic() > deadline:
            return since
        time.sleep(0.05)


def post_image(url: str, image: bytes) -> dict:
    """POST an image to the API as a browser's form upload does; the JSON answer."""
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="photo.jpg"\r\n'
            "Content-Type: image/jpeg\r\n\r\n"
        ).encode()
        + image
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())
