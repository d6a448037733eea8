"""`make demo`: the whole job on the local target.

Renders the model repository for this machine, starts a real tritonserver,
waits until every model is READY, runs one inference on each model with a
generated JPEG, and stops the server.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import tritonclient.http as triton_http

from provision import config, local_serving, sample_images
from provision.local_triton import TritonError
from provision.model_repo import model_names


def _infer(client, model: str, image_b64: bytes, outputs: list[str]) -> dict:
    items = np.array([[image_b64]], dtype=np.object_)
    image_input = triton_http.InferInput("INPUT_IMAGE", list(items.shape), "BYTES")
    image_input.set_data_from_numpy(items)
    result = client.infer(model, [image_input])
    return {name: result.as_numpy(name).reshape(-1)[0] for name in outputs}


def main() -> int:
    settings = config.defaults()
    repository, values = local_serving.render_local_repository(settings)
    print(f"model repository rendered for {values.gpu_count} GPU(s): {repository}")
    if values.smoke_weights:
        print("SMOKE WEIGHTS: random values, labels and captions are meaningless")
    server = local_serving.local_triton(settings)
    models = model_names()
    started = time.monotonic()
    try:
        states = server.start(models, settings["triton_ready_timeout_s"])
    except TritonError as error:
        print(f"error: {error}", file=sys.stderr)
        server.stop()
        return 1
    print(f"tritonserver ready in {time.monotonic() - started:.1f} s at {server.url} (log {server.log_file})")
    for model in models:
        print(f"  {model}: {states[model]}")
    try:
        client = triton_http.InferenceServerClient(f"{server.host}:{server.http_port}")
        image = sample_images.b64(sample_images.jpeg())
        for model in models:
            if model == "conditional_captioning":
                continue  # reached through the ensemble
            outputs = ["OUTPUT", "FOOD_LABEL"] if model == "ensemble" else ["FOOD_LABEL", "PROBABILITY"]
            answer = _infer(client, model, image, outputs)
            shown = ", ".join(
                f"{k}={v.decode() if isinstance(v, bytes) else round(float(v), 4)}" for k, v in answer.items()
            )
            print(f"  {model}: {shown}")
    finally:
        server.stop()
        print("tritonserver stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
