"""Triton Python-backend entry point of every Food-11 classifier variant.

(Triton puts this version folder on sys.path, so food11 and serving_common,
which sit beside this file, import as top-level modules.)

food_classifier, gpu_food_classifier, batching_food_classifier and
multigpu_food_classifier all run this file (the other variants link to it);
their config.pbtxt decides the batching and where the instances run.

Input  INPUT_IMAGE  TYPE_STRING  an image file, one per batch item: its bytes or its base64
Output FOOD_LABEL   TYPE_STRING  one of the eleven Food-11 labels
       PROBABILITY  TYPE_FP32    softmax probability of that label

All images of all requests that Triton hands to one execute() call go through
the network in one forward pass. An image that cannot be decoded fails its own
request only; the others in the batch are answered normally.
"""

import json
import os

# torch's OpenMP threads spin while they wait for work. Where other work shares
# the cores (the two models of the ensemble, perf_analyzer, a second server), a
# spinning thread keeps the one it waits for off the CPU: two servers on 2 cores
# fell from about 60 to 1 infer/s each (docs/performance.md). Passive waiting
# costs about a quarter of one model's throughput when it has the cores alone.
# libgomp reads this once, when torch loads it: so before `import torch`.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402
from food11 import Food11Classifier  # noqa: E402
from serving_common import (  # noqa: E402
    DEFAULT_MAX_ENCODED_BYTES,
    DEFAULT_MAX_PIXELS,
    InvalidImage,
    instance_device,
    model_parameters,
    parameter_flag,
    threads_per_instance,
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

        # Set before the first torch operation of this stub process.
        threads = threads_per_instance(config, int(params.get("torch_threads") or 0))
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)  # one forward pass at a time: no inter-op parallelism to use
        except RuntimeError:
            pass  # already fixed in this process

        device = instance_device(args["model_instance_kind"], args["model_instance_device_id"], self.log)
        self.classifier = Food11Classifier(
            params["weights_path"],
            device=device,
            threads=threads,
            reduced_decoding=parameter_flag(params, "reduced_decoding", default=False),
            gpu_decode=parameter_flag(params, "gpu_decode", default=False),
            max_encoded_bytes=int(params.get("max_encoded_bytes") or DEFAULT_MAX_ENCODED_BYTES),
            max_pixels=int(params.get("max_pixels") or DEFAULT_MAX_PIXELS),
        )

        self.log.info(
            "instance %s on %s, weights %s, max_batch_size %s, torch threads %d, reduced JPEG decoding %s, "
            "preprocessing on %s, GPU JPEG decoding %s, BatchNorm folded into the convolutions %s",
            args["model_instance_name"],
            device,
            params["weights_path"],
            config.get("max_batch_size", 0),
            torch.get_num_threads(),
            "on" if self.classifier.min_side else "off",
            "the device" if self.classifier.device_preprocessing else "the CPU",
            "on" if self.classifier.gpu_decode else "off",
            "yes" if self.classifier.folded else "no (torch.fx cannot trace this network)",
        )
        if params.get("cpu_fallback"):
            self.log.warning("%s", params["cpu_fallback"])
        if self.classifier.smoke_weights:
            self.log.warning("SMOKE WEIGHTS: randomly initialised network, labels are meaningless")

    def execute(self, requests):
        responses = [None] * len(requests)
        # Every image of every request, in one list: the whole dynamic batch is
        # decoded and preprocessed in parallel, then run in one forward pass.
        items, spans, shapes = [], [], []
        for request in requests:
            array = pb_utils.get_input_tensor_by_name(request, "INPUT_IMAGE").as_numpy()
            spans.append((len(items), len(items) + array.size))
            shapes.append(array.shape)
            items.extend(array.reshape(-1))
        prepared = self.classifier.prepare(items)

        accepted = []  # indices of the requests whose every image is usable
        for index, (start, end) in enumerate(spans):
            error = next((p for p in prepared[start:end] if isinstance(p, InvalidImage)), None)
            if error is not None:
                responses[index] = triton_error_response(pb_utils, f"{self.name}: {error}")
            else:
                accepted.append(index)
        if not accepted:
            return responses

        try:
            batch = self.classifier.to_batch([p for i in accepted for p in prepared[spans[i][0] : spans[i][1]]])
            labels, probabilities = self.classifier.predict(batch)
        except Exception as error:  # noqa: BLE001 - fail these requests, keep the stub alive
            for index in accepted:
                responses[index] = triton_error_response(
                    pb_utils, f"{self.name}: inference failed: {error}", client_error=False
                )
            return responses

        offset = 0
        for index in accepted:
            start, end = spans[index]
            count, shape = end - start, shapes[index]
            label_bytes = np.array([label.encode() for label in labels[offset : offset + count]], dtype=np.object_)
            responses[index] = pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("FOOD_LABEL", label_bytes.reshape(shape)),
                    pb_utils.Tensor("PROBABILITY", probabilities[offset : offset + count].reshape(shape)),
                ]
            )
            offset += count
        return responses

    def finalize(self):
        self.classifier.close()
