"""Small helpers the tests share: requests to Triton with tritonclient, uploads to the API."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from provision.perf import PerfRun
from provision.report import write_report


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


def settled_counts(client, model: str, quiet: float = 0.2, timeout: float = 10.0) -> tuple[int, int]:
    """model_counts once they stop moving: the baseline for counts_since.

    Triton records a batch's statistics just after it has sent its responses,
    so counts read straight after an earlier test's answers can still miss
    that test's last batch, which would then be counted as this test's.
    """
    deadline = time.monotonic() + timeout
    counts = model_counts(client, model)
    while True:
        time.sleep(quiet)
        again = model_counts(client, model)
        if again == counts or time.monotonic() > deadline:
            return again
        counts = again


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


def bench_run(
    results: Path,
    run_id: str,
    models: list[str],
    url: str,
    env: dict,
    input_json: Path,
    configs: dict[str, str] | None = None,
    concurrency_range: str = "1:2:1",
    request_count: int = 8,
) -> Path:
    """A short real benchmark run written as `fab bench` writes it: perf_analyzer CSVs under
    hosts/local/ (and the deployed configs given, under hosts/local/configs/), then write_report."""
    run = results / run_id
    host = run / "hosts" / "local"
    (host / "configs").mkdir(parents=True)
    for model, text in (configs or {}).items():
        (host / "configs" / f"{model}.pbtxt").write_text(text)
    # Windows of a request count, not of time: on a busy machine a time window may
    # come back empty and perf_analyzer then fails (fab bench --quick does the same).
    profile = {
        "name": "quick",
        "concurrency_range": concurrency_range,
        "measurement_mode": "count_windows",
        "measurement_request_count": request_count,
        "measurement_interval_ms": 2000,
    }
    commands = {}
    for model in models:
        perf = PerfRun(
            model=model,
            url=url,
            input_json=input_json,
            csv_path=host / f"{model}.csv",
            concurrency_range=profile["concurrency_range"],
            measurement_interval_ms=profile["measurement_interval_ms"],
            measurement_mode=profile["measurement_mode"],
            measurement_request_count=profile["measurement_request_count"],
            stability_percentage=999,  # accept the first windows: this machine is noisy
            max_trials=10,  # more windows to find 3 alike in, on a starved machine (make test: 5 were too few)
        )
        perf.run(str(Path(sys.executable).parent / "perf_analyzer"), env=env, timeout_s=300)
        commands[model] = " ".join(perf.command())
    write_report(
        run,
        run_id=run_id,
        target="local",
        profile=profile,
        commands=commands,
        smoke_weights=True,
        git={"commit": None, "dirty": False},
    )
    return run


APIS = ("triton_http", "triton_grpc")  # a cluster balancer's backends, as fab status names them


def status_once(lab, lines: list[str], timeout_s: float = 30) -> str:
    """`fab status` once it shows every one of `lines`: HAProxy checks each server every 2 s, and a
    check a busy server answers late counts as failed for one round (status shows `UP 1/2` then)."""
    deadline = time.monotonic() + timeout_s
    while not all(line in (status := lab.fab("status").stdout) for line in lines):
        assert time.monotonic() < deadline, f"not all of {lines} in:\n{status}"
        time.sleep(1)
    return status


def inference_count(address: str, model: str) -> int:
    """How many inferences of `model` the Triton at host:port has served (its statistics API)."""
    (stats,) = triton_http.InferenceServerClient(address).get_inference_statistics(model)["model_stats"]
    return int(stats["inference_count"])
