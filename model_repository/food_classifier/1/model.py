"""Triton Python-backend entry point of every Food-11 classifier variant.

(Triton puts this version folder on sys.path, so food11 and serving_common,
which sit beside this file, import as top-level modules.)

food_classifier, gpu_food_classifier, batching_food_classifier and
multigpu_food_classifier all run this file (the other variants link to it);
their config.pbtxt decides the batching and where the instances run.

Input  INPUT_IMAGE  TYPE_STRING  base64 image file, one per batch item
Output FOOD_LABEL   TYPE_STRING  one of the eleven Food-11 labels
       PROBABILITY  TYPE_FP32    softmax probability of that label

All images of all requests that Triton hands to one execute() call go through
the network in one forward pass. An image that cannot be decoded fails its own
request only; the others in the batch are answered normally.
"""

import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from food11 import Food11Classifier
from serving_common import (
    DEFAULT_MAX_ENCODED_BYTES,
    DEFAULT_MAX_PIXELS,
    InvalidImage,
    decode_image,
    instance_device,
    model_parameters,
    triton_error_response,
)


class _Log:
    """Triton's logger, so our lines land in the server log with the model name."""

    def __init__(self, model_name: str):
        self.prefix = f"[{model_name}] "

    def info(self, message, *args):
        pb_utils.Logger.log_info(self.prefix + (message % args if args else message))

    def warning(self, message, *args):
        pb_utils.Logger.log_warn(self.prefix + (message % args if args else message))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = model_parameters(config)
        self.name = args["model_name"]
        self.log = _Log(self.name)
        self.max_encoded_bytes = int(params.get("max_encoded_bytes") or DEFAULT_MAX_ENCODED_BYTES)
        self.max_pixels = int(params.get("max_pixels") or DEFAULT_MAX_PIXELS)

        threads = int(params.get("torch_threads") or 0)
        if threads > 0:
            torch.set_num_threads(threads)

        device = instance_device(args["model_instance_kind"], args["model_instance_device_id"], self.log)
        self.classifier = Food11Classifier(params["weights_path"], device=device)

        self.log.info(
            "instance %s on %s, weights %s, max_batch_size %s, torch threads %d",
            args["model_instance_name"],
            device,
            params["weights_path"],
            config.get("max_batch_size", 0),
            torch.get_num_threads(),
        )
        if params.get("cpu_fallback"):
            self.log.warning("%s", params["cpu_fallback"])
        if self.classifier.smoke_weights:
            self.log.warning("SMOKE WEIGHTS: randomly initialised network, labels are meaningless")

    def execute(self, requests):
        responses = [None] * len(requests)
        accepted = []  # (request index, input shape, preprocessed tensors)
        for index, request in enumerate(requests):
            items = pb_utils.get_input_tensor_by_name(request, "INPUT_IMAGE").as_numpy()
            try:
                tensors = [
                    self.classifier.preprocess(decode_image(item, self.max_encoded_bytes, self.max_pixels))
                    for item in items.reshape(-1)
                ]
            except InvalidImage as error:
                responses[index] = triton_error_response(pb_utils, f"{self.name}: {error}")
                continue
            accepted.append((index, items.shape, tensors))

        if not accepted:
            return responses
        try:
            batch = torch.stack([tensor for _, _, tensors in accepted for tensor in tensors])
            labels, probabilities = self.classifier.predict(batch)
        except Exception as error:  # noqa: BLE001 - fail these requests, keep the stub alive
            for index, _, _ in accepted:
                responses[index] = triton_error_response(
                    pb_utils, f"{self.name}: inference failed: {error}", client_error=False
                )
            return responses

        offset = 0
        for index, shape, tensors in accepted:
            count = len(tensors)
            label_bytes = np.array([label.encode() for label in labels[offset : offset + count]], dtype=np.object_)
            responses[index] = pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("FOOD_LABEL", label_bytes.reshape(shape)),
                    pb_utils.Tensor("PROBABILITY", probabilities[offset : offset + count].reshape(shape)),
                ]
            )
            offset += count
        return responses
