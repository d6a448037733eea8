"""Triton Python-backend model: BLIP captioning conditioned on a food label.

Input  INPUT       TYPE_STRING  an image file: its bytes or its base64
       FOOD_LABEL  TYPE_STRING  label to condition on (from the classifier in the ensemble)
Output OUTPUT          TYPE_STRING  the caption, which starts with the prompt ("a photo of bread, ...")
       CONDITIONED_ON  TYPE_STRING  the label the caption was conditioned on, as it came

CONDITIONED_ON is what the ensemble answers as its FOOD_LABEL. Were the
classifier's label tensor both an output of the ensemble and the input of this
step, Triton (2.51 at least) would prune the classifier step whenever a client
asks for only some of the ensemble's outputs, and answer "unexpected deadlock,
at least one output is not set": its pruning counts a tensor the client did not
ask for as unused, though a later step reads it.

BLIP loads from the model parameter blip_source: a Hugging Face hub id such as
Salesforce/blip-image-captioning-base (where the host can reach the hub) or a
local folder written by save_pretrained (or by provision.smoke_weights).
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
from serving_common import (  # noqa: E402
    DEFAULT_MAX_ENCODED_BYTES,
    DEFAULT_MAX_PIXELS,
    InvalidImage,
    decode_image,
    instance_device,
    is_smoke_weights,
    model_parameters,
    triton_error_response,
)


class TritonPythonModel:
    def initialize(self, args):
        from transformers import BlipForConditionalGeneration, BlipProcessor

        config = json.loads(args["model_config"])
        params = model_parameters(config)
        self.name = args["model_name"]
        self.prompt_template = params.get("prompt_template") or "a photo of {label},"
        self.max_new_tokens = int(params.get("max_new_tokens") or 30)
        self.max_encoded_bytes = int(params.get("max_encoded_bytes") or DEFAULT_MAX_ENCODED_BYTES)
        self.max_pixels = int(params.get("max_pixels") or DEFAULT_MAX_PIXELS)
        threads = int(params.get("torch_threads") or 0)
        if threads > 0:
            torch.set_num_threads(threads)

        source = params["blip_source"]
        self.device = instance_device(args["model_instance_kind"], args["model_instance_device_id"])
        self.processor = BlipProcessor.from_pretrained(source)
        self.model = BlipForConditionalGeneration.from_pretrained(source).to(self.device).eval()
        pb_utils.Logger.log_info(f"[{self.name}] BLIP from {source} on {self.device}")
        if params.get("cpu_fallback"):
            pb_utils.Logger.log_warn(f"[{self.name}] {params['cpu_fallback']}")
        if is_smoke_weights(source):
            pb_utils.Logger.log_warn(f"[{self.name}] SMOKE WEIGHTS: tiny random BLIP, captions are meaningless")

    def _prompt(self, label: bytes) -> str:
        return self.prompt_template.format(label=label.decode("utf-8", errors="replace").lower())

    @torch.inference_mode()
    def _caption(self, images, prompts):
        inputs = self.processor(images=images, text=prompts, return_tensors="pt").to(self.device)
        generated = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens)
        return self.processor.batch_decode(generated, skip_special_tokens=True)

    def execute(self, requests):
        responses = [None] * len(requests)
        # Items with the same prompt have the same token length, so they batch
        # without padding (padding would shift the start of the generation).
        groups = {}  # prompt -> [(request index, position, image)]
        shapes, conditioned_on = {}, {}
        for index, request in enumerate(requests):
            images = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            labels = pb_utils.get_input_tensor_by_name(request, "FOOD_LABEL").as_numpy()
            try:
                decoded = [decode_image(item, self.max_encoded_bytes, self.max_pixels) for item in images.reshape(-1)]
            except InvalidImage as error:
                responses[index] = triton_error_response(pb_utils, f"{self.name}: {error}")
                continue
            shapes[index], conditioned_on[index] = images.shape, labels
            for position, (image, label) in enumerate(zip(decoded, labels.reshape(-1))):
                groups.setdefault(self._prompt(label), []).append((index, position, image))

        captions = {index: [None] * int(np.prod(shape)) for index, shape in shapes.items()}
        failed = {}
        for prompt, members in groups.items():
            try:
                texts = self._caption([image for _, _, image in members], [prompt] * len(members))
            except Exception as error:  # noqa: BLE001 - fail these requests, keep the stub alive
                for index, _, _ in members:
                    failed[index] = f"{self.name}: captioning failed: {error}"
                continue
            for (index, position, _), text in zip(members, texts):
                captions[index][position] = text.strip()

        for index, shape in shapes.items():
            if index in failed:
                responses[index] = triton_error_response(pb_utils, failed[index], client_error=False)
                continue
            output = np.array([text.encode() for text in captions[index]], dtype=np.object_).reshape(shape)
            responses[index] = pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("OUTPUT", output),
                    pb_utils.Tensor("CONDITIONED_ON", conditioned_on[index].astype(np.object_).reshape(shape)),
                ]
            )
        return responses
