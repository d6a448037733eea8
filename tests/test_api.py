"""The FastAPI service (client_scripts/api.py) under uvicorn, in front of a real tritonserver.

Every test talks HTTP to a real uvicorn process on a free loopback port; the
app talks to a real Triton (the session's, or one of this module's own when
the test stops it). Smoke weights: labels are meaningless but must be one of
the eleven, and the API must give the answer Triton gives.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import schemathesis
import tritonclient.http as triton_http
from food11 import FOOD11_LABELS
from hypothesis import HealthCheck, given, settings
from PIL import Image
from support.repository import rendered_repository
from support.serving import classify

from provision import config, sample_images
from provision.host.background import free_ports
from provision.host.tritonserver import TritonProcess
from provision.perf import write_input_json

# One worker runs every test of the session's tritonserver (pytest-xdist's loadgroup): one server, not one per worker.
pytestmark = [pytest.mark.triton, pytest.mark.xdist_group("session_triton")]

CLIENT_SCRIPTS = config.PROJECT_ROOT / "client_scripts"
TEN_MB = 10 * 1024 * 1024


class ApiProcess:
    """`uvicorn api:app --app-dir client_scripts` on a free port, configured by environment."""

    def __init__(self, log_file: Path, **env: str):
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = log_file
        command = [sys.executable, "-m", "uvicorn", "api:app", "--app-dir", str(CLIENT_SCRIPTS)]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        with open(log_file, "wb") as log:
            self.process = subprocess.Popen(
                command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, cwd=config.PROJECT_ROOT
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the API did not start:\n{log_file.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> str:
        """SIGTERM (uvicorn then runs the lifespan shutdown); returns the log."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.log_file.read_text()


def triton_address(server: TritonProcess) -> str:
    return f"{server.host}:{server.http_port}"


def upload(data: bytes, name: str = "photo.jpg", content_type: str = "image/jpeg") -> dict:
    return {"file": (name, data, content_type)}


@pytest.fixture(scope="module")
def api(triton_server, tmp_path_factory):
    """The API with its defaults, in front of the session's Triton."""
    process = ApiProcess(tmp_path_factory.mktemp("api") / "api.log", TRITON_URL=triton_address(triton_server))
    yield process
    process.stop()


@pytest.fixture(scope="module")
def http(api):
    with httpx.Client(base_url=api.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def triton(triton_server):
    with triton_http.InferenceServerClient(triton_address(triton_server)) as client:
        yield client


PHOTO = sample_images.jpeg(seed=11)
_truncated_source = sample_images.jpeg(seed=12)


# --------------------------------------------------------------------------- success paths


def test_healthz_says_the_process_is_alive(http):
    response = http.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readyz_is_ready_when_triton_and_the_needed_models_are(http, triton_server):
    response = http.get("/readyz")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ready" and body["triton"] == triton_address(triton_server)
    assert body["models"]["batching_food_classifier"] == "READY" and body["models"]["ensemble"] == "READY"


def test_classify_answers_like_triton_with_the_batching_classifier_by_default(http, triton):
    response = http.post("/classify", files=upload(PHOTO))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "batching_food_classifier"
    assert body["label"] in FOOD11_LABELS and 0 < body["probability"] <= 1
    ((label, probability),) = classify(triton, "batching_food_classifier", [sample_images.b64(PHOTO)])
    assert body["label"] == label and body["probability"] == pytest.approx(probability, abs=1e-6)


def test_the_upload_reaches_triton_as_it_came_without_re_encoding(http, triton):
    """An upload of base64 text classifies like the file itself: the API passed the text on
    untouched (encoding it once more would have given the model base64 of base64)."""
    ((label, probability),) = classify(triton, "batching_food_classifier", [PHOTO])
    for upload_body in (PHOTO, base64.b64encode(PHOTO), base64.encodebytes(PHOTO)):
        response = http.post("/classify", files=upload(upload_body, "photo.txt", "text/plain"))
        assert response.status_code == 200, response.text
        assert response.json()["label"] == label and response.json()["probability"] == pytest.approx(probability)
    response = http.post("/caption", files=upload(base64.b64encode(PHOTO), "photo.txt", "text/plain"))
    assert response.status_code == 200 and response.json()["label"] == label, response.text


@pytest.mark.parametrize("model", ["food_classifier", "gpu_food_classifier", "multigpu_food_classifier"])
def test_classify_serves_another_variant_when_asked(http, model):
    response = http.post("/classify", params={"model": model}, files=upload(PHOTO))
    assert response.status_code == 200, response.text
    assert response.json()["model"] == model and response.json()["label"] in FOOD11_LABELS


def test_classify_accepts_png_grayscale_and_rgba(http):
    for mode, format in (("L", "JPEG"), ("RGBA", "PNG"), ("P", "PNG")):
        data = sample_images.encode(sample_images.picture(seed=13).convert(mode), format)
        response = http.post("/classify", files=upload(data, f"x.{format.lower()}", f"image/{format.lower()}"))
        assert response.status_code == 200, f"{mode} {format}: {response.text}"


def test_caption_returns_the_ensembles_caption_and_its_label(http, triton):
    response = http.post("/caption", files=upload(PHOTO))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "ensemble" and body["caption"].strip()
    assert body["label"] in FOOD11_LABELS and 0 < body["probability"] <= 1
    # Conditioned on its label (the smoke BLIP starts its caption with the prompt).
    assert body["caption"].startswith(f"a photo of {body['label'].lower()}")
    ((label, _),) = classify(triton, "food_classifier", [sample_images.b64(PHOTO)])
    assert body["label"] == label, "the ensemble's label is food_classifier's"


def test_openapi_docs_are_served(http):
    spec = http.get("/openapi.json").json()
    assert {"/classify", "/caption", "/healthz", "/readyz"} <= set(spec["paths"])
    variants = spec["components"]["schemas"]["ClassifierModel"]["enum"]
    assert "batching_food_classifier" in variants and "food_classifier" in variants
    assert http.get("/docs").status_code == 200


# --------------------------------------------------------------------------- the client's mistakes

BAD_UPLOADS = {
    # name: (bytes, expected status, words the message must contain)
    "empty": (b"", 400, "empty"),
    "not-an-image": (
        b"plain text, no picture here",
        400,
        "neither an image file's bytes (JPEG, PNG, GIF, WebP, BMP or TIFF) nor base64",
    ),
    "truncated": (_truncated_source[: len(_truncated_source) // 3], 400, "truncated"),
    "too-many-pixels": (sample_images.encode(Image.new("RGB", (5000, 4000)), "PNG"), 400, "over the limit"),
}


@pytest.mark.parametrize("endpoint", ["/classify", "/caption"])
@pytest.mark.parametrize("bad", list(BAD_UPLOADS))
def test_an_unusable_upload_is_the_clients_error_with_a_message(http, endpoint, bad):
    data, status, words = BAD_UPLOADS[bad]
    response = http.post(endpoint, files=upload(data))
    assert response.status_code == status, response.text
    assert words in response.json()["detail"]
    assert http.get("/readyz").status_code == 200, "a bad upload must not hurt the service"


def test_a_request_without_a_file_is_422(http):
    response = http.post("/classify", data={"image": "x"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "file"]


def test_an_unknown_variant_is_422_and_lists_the_known_ones(http):
    response = http.post("/classify", params={"model": "resnet"}, files=upload(PHOTO))
    assert response.status_code == 422
    assert "batching_food_classifier" in response.text


def test_a_body_that_is_not_multipart_is_a_client_error(http):
    response = http.post("/classify", content=b"\xff\xd8 raw jpeg bytes", headers={"Content-Type": "image/jpeg"})
    assert response.status_code == 422
    broken = http.post(
        "/classify", content=b"--b\r\nbroken", headers={"Content-Type": "multipart/form-data; boundary=b"}
    )
    assert 400 <= broken.status_code < 500


def _raw_post(api, headers: bytes, chunks, chunked: bool = False, limit_bytes: int = 3 * TEN_MB) -> tuple[int, int]:
    """POST over a plain socket, stop sending once the server answers; (status, bytes sent)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", api.port), timeout=30) as sock:
        sock.sendall(b"POST /classify HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n")
        for chunk in chunks:
            if sent > limit_bytes or select.select([sock], [], [], 0)[0]:
                break  # the server has answered (or we sent far more than any limit)
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        answer = b""
        while b"\r\n" not in answer:
            data = sock.recv(4096)
            if not data:
                break
            answer += data
    return int(answer.split(b" ", 2)[1]), sent


MULTIPART_HEAD = (
    b'--B\r\nContent-Disposition: form-data; name="file"; filename="big.jpg"\r\nContent-Type: image/jpeg\r\n\r\n'
)


def test_a_declared_size_over_10_mb_is_413_before_the_body_is_sent(api):
    headers = b"Content-Type: multipart/form-data; boundary=B\r\nContent-Length: %d\r\n" % (TEN_MB + 200_000)
    status, sent = _raw_post(api, headers, [MULTIPART_HEAD])
    assert status == 413
    assert sent < 1024, "the server answered without waiting for the body"


def test_a_streamed_body_over_10_mb_is_413_once_the_count_passes_the_limit(api, http):
    headers = b"Content-Type: multipart/form-data; boundary=B\r\nTransfer-Encoding: chunked\r\n"
    chunks = [MULTIPART_HEAD] + [b"\xff" * 65536] * (3 * TEN_MB // 65536)
    status, sent = _raw_post(api, headers, chunks, chunked=True)
    assert status == 413
    assert sent > TEN_MB, "refused only once over the limit"
    assert http.get("/healthz").status_code == 200


def test_an_upload_just_over_10_mb_is_413_and_one_under_is_not(http):
    over = http.post("/classify", files=upload(b"\xff" * (TEN_MB + 1)))
    assert over.status_code == 413 and "limit" in over.json()["detail"]
    under = http.post("/classify", files=upload(b"\xff" * (TEN_MB - 1000)))
    # Under the API's limit, it reaches the model, which finds it is no image.
    assert under.status_code == 400 and "INPUT_IMAGE" in under.json()["detail"]


# --------------------------------------------------------------------------- under load


def test_200_requests_at_concurrency_16_all_succeed_with_triton_answers(http, api, triton):
    photos = [sample_images.jpeg(seed=seed) for seed in range(20, 28)]
    expected = dict(enumerate(classify(triton, "batching_food_classifier", [sample_images.b64(p) for p in photos])))

    async def load() -> list[tuple[int, httpx.Response]]:
        limit = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=api.url, timeout=120, limits=httpx.Limits(max_connections=16)) as c:

            async def one(i: int):
                async with limit:
                    return i % len(photos), await c.post("/classify", files=upload(photos[i % len(photos)]))

            return await asyncio.gather(*(one(i) for i in range(200)))

    started = time.monotonic()
    answers = asyncio.run(load())
    elapsed = time.monotonic() - started
    errors = [(r.status_code, r.text) for _, r in answers if r.status_code != 200]
    assert not errors, f"{len(errors)} of 200 failed: {errors[:3]}"
    for photo, response in answers:
        label, probability = expected[photo]
        assert response.json()["label"] == label
        assert response.json()["probability"] == pytest.approx(probability, abs=1e-4)
    print(f"200 requests at concurrency 16 in {elapsed:.1f} s ({200 / elapsed:.1f} req/s)")


# --------------------------------------------------------------------------- Triton down, slow


@pytest.fixture(scope="module")
def own_triton(tmp_path_factory, render_values, triton_runtime):
    """A second tritonserver this module may stop: just the models a caption needs."""
    keep = {"food_classifier", "conditional_captioning", "ensemble"}
    repository = rendered_repository(tmp_path_factory.mktemp("own-repo"), render_values, keep)
    server = TritonProcess.on_free_ports(triton_runtime.root, repository, tmp_path_factory.mktemp("own-triton-run"))
    server.models = sorted(keep)
    yield server
    server.stop()


def _wait_ready(client: httpx.Client, timeout_s: float = 30) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while (response := client.get("/readyz")).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    return response


def test_triton_down_is_503_and_the_api_recovers_when_it_returns(own_triton, tmp_path):
    """Not started yet -> 503; started -> 200; stopped -> 503; started again -> 200."""
    api = ApiProcess(
        tmp_path / "api.log",
        TRITON_URL=triton_address(own_triton),
        API_CLASSIFIER_MODEL="food_classifier",
        API_CLASSIFIER_MODELS="food_classifier",
    )
    try:
        with httpx.Client(base_url=api.url, timeout=60) as client:

            def assert_down(when: str):
                ready = client.get("/readyz")
                assert ready.status_code == 503 and ready.json()["status"] == "not ready", when
                assert "unreachable" in ready.json()["detail"], when
                for endpoint in ("/classify", "/caption"):
                    response = client.post(endpoint, files=upload(PHOTO))
                    assert response.status_code == 503, f"{when}: {endpoint} {response.text}"
                    assert "unreachable" in response.json()["detail"]
                assert client.get("/healthz").status_code == 200, "the process itself stays alive"

            def assert_up(when: str):
                assert _wait_ready(client).status_code == 200, when
                assert client.post("/classify", files=upload(PHOTO)).status_code == 200, when
                assert client.post("/caption", files=upload(PHOTO)).status_code == 200, when

            assert_down("before Triton started")
            own_triton.start(own_triton.models, timeout_s=300)
            assert_up("once Triton is up")
            assert own_triton.stop()
            assert_down("after Triton stopped")
            own_triton.start(own_triton.models, timeout_s=300)
            assert_up("after Triton restarted")
    finally:
        log = api.stop()
    assert "Application shutdown complete" in log and "Unclosed" not in log, log[-2000:]


def test_readyz_is_503_while_a_needed_model_is_missing(triton_server, tmp_path):
    api = ApiProcess(tmp_path / "api.log", TRITON_URL=triton_address(triton_server), API_CAPTION_MODEL="no_such_model")
    try:
        response = httpx.get(f"{api.url}/readyz", timeout=30)
        assert response.status_code == 503
        assert response.json()["models"]["no_such_model"] == "NOT IN REPOSITORY"
        caption = httpx.post(f"{api.url}/caption", files=upload(PHOTO), timeout=30)
        assert caption.status_code == 503 and "no_such_model" in caption.json()["detail"]
    finally:
        api.stop()


def test_triton_slower_than_the_timeout_is_504(triton_server, tmp_path):
    # A phone photo takes Triton far longer than 50 ms to decode and caption.
    api = ApiProcess(tmp_path / "api.log", TRITON_URL=triton_address(triton_server), API_TRITON_TIMEOUT_S="0.05")
    try:
        phone = sample_images.jpeg(sample_images.PHONE, seed=14)
        response = httpx.post(f"{api.url}/caption", files=upload(phone), timeout=60)
        assert response.status_code == 504, response.text
        assert "did not answer within 0.05 s" in response.json()["detail"]
        assert httpx.get(f"{api.url}/healthz", timeout=10).status_code == 200
    finally:
        api.stop()


# --------------------------------------------------------------------------- fuzzing the spec


@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
def test_no_request_generated_from_the_openapi_spec_gets_a_server_error(api, mode):
    """Requests that follow the spec, and requests that break it on purpose: never a 5xx."""
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    statuses: dict[int, int] = {}

    @given(case=schema.as_strategy(mode))
    @settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    def send(case):
        response = case.call(base_url=api.url, timeout=60)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, f"{case.method} {case.path}: {response.status_code} {response.text[:300]}"

    send()
    print(f"{mode.value}: responses by status {dict(sorted(statuses.items()))}")
    assert sum(statuses.values()) >= 20, "the fuzzer sent too few requests to mean anything"


# --------------------------------------------------------------------------- the client scripts


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CLIENT_SCRIPTS / name), *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("name", ["classify.py", "caption.py", "make_perf_input.py"])
def test_each_client_script_explains_itself(name):
    done = run_script(name, "--help")
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr


def test_classify_script_prints_the_same_line_through_the_api_as_from_triton(api, triton_server, tmp_path):
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(PHOTO)
    direct = run_script("classify.py", str(photo), "--url", triton_address(triton_server))
    via_api = run_script("classify.py", str(photo), "--api", api.url)
    assert direct.returncode == 0 and via_api.returncode == 0, direct.stderr + via_api.stderr
    assert via_api.stdout == direct.stdout and via_api.stdout.startswith(f"{photo}: ")
    chosen = run_script("classify.py", str(photo), "--api", api.url, "--model", "food_classifier")
    assert chosen.returncode == 0 and chosen.stdout == direct.stdout


def test_caption_script_captions_from_triton_and_through_the_api(api, triton_server, tmp_path):
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(PHOTO)
    direct = run_script("caption.py", str(photo), "--url", triton_address(triton_server))
    via_api = run_script("caption.py", str(photo), "--api", api.url)
    assert direct.returncode == 0 and via_api.returncode == 0, direct.stderr + via_api.stderr
    assert via_api.stdout == direct.stdout
    label = direct.stdout.split("[", 1)[1].split(" ", 1)[0]
    assert label in FOOD11_LABELS and f"] a photo of {label.lower()}" in direct.stdout


def test_client_scripts_report_the_apis_error_and_exit_1(api, tmp_path):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(BAD_UPLOADS["truncated"][0])
    for name in ("classify.py", "caption.py"):
        done = run_script(name, str(broken), "--api", api.url)
        assert done.returncode == 1 and "HTTP 400" in done.stderr and "truncated" in done.stderr, done.stderr
    (closed,) = free_ports(1)
    done = run_script("classify.py", str(broken), "--api", f"http://127.0.0.1:{closed}")
    assert done.returncode == 1 and "cannot reach the API" in done.stderr


def test_make_perf_input_writes_one_entry_per_image_as_the_file_s_bytes_or_base64(tmp_path):
    photos = [tmp_path / f"p{i}.jpg" for i in range(2)]
    for seed, photo in enumerate(photos):
        photo.write_bytes(sample_images.jpeg(seed=seed))
    output = tmp_path / "input.json"
    done = run_script("make_perf_input.py", *map(str, photos), "-o", str(output))
    assert done.returncode == 0 and "as raw" in done.stdout, done.stderr
    # raw (the default): perf_analyzer's {"b64": ...} holding the serialized BYTES element, length then file.
    entries = json.loads(output.read_text())["data"]
    for entry, photo in zip(entries, photos):
        serialized = base64.b64decode(entry["INPUT_IMAGE"]["b64"])
        assert serialized == struct.pack("<I", photo.stat().st_size) + photo.read_bytes()
    # Exactly what the benchmark's own writer makes for the same files, in either form.
    expected = write_input_json(tmp_path / "expected.json", [p.read_bytes() for p in photos])
    assert json.loads(output.read_text()) == json.loads(expected.read_text())
    done = run_script("make_perf_input.py", *map(str, photos), "-o", str(output), "--encoding", "base64")
    assert done.returncode == 0, done.stderr
    entries = json.loads(output.read_text())["data"]
    assert [base64.b64decode(entry["INPUT_IMAGE"][0]) for entry in entries] == [p.read_bytes() for p in photos]
    expected = write_input_json(tmp_path / "expected.json", [p.read_bytes() for p in photos], encoding="base64")
    assert json.loads(output.read_text()) == json.loads(expected.read_text())

    renamed = run_script("make_perf_input.py", str(photos[0]), "-o", str(output), "--input-name", "IMAGE")
    assert renamed.returncode == 0 and list(json.loads(output.read_text())["data"][0]) == ["IMAGE"]
    missing = run_script("make_perf_input.py", str(tmp_path / "nope.jpg"), "-o", str(output))
    assert missing.returncode == 1 and "nope.jpg" in missing.stderr
    unknown = run_script("make_perf_input.py", str(photos[0]), "-o", str(output), "--encoding", "hex")
    assert unknown.returncode == 2 and "invalid choice: 'hex'" in unknown.stderr


# --------------------------------------------------------------------------- the container


# Its hadolint check is in tests/test_lint.py (every Dockerfile).
DOCKERFILE = config.PROJECT_ROOT / "Dockerfile.api"


def test_the_container_refuses_to_start_without_a_triton_address_or_a_jupyter_token():
    text = DOCKERFILE.read_text()
    script = config.PROJECT_ROOT / "client_scripts" / "entrypoint.sh"
    assert f'ENTRYPOINT ["/bin/sh", "/app/client_scripts/{script.name}"]' in text
    bare = {"PATH": os.environ["PATH"]}
    no_triton = subprocess.run(["sh", str(script)], env={**bare, "JUPYTER_TOKEN": "t"}, capture_output=True, text=True)
    assert no_triton.returncode == 2 and "TRITON_URL" in no_triton.stderr
    no_token = subprocess.run(
        ["sh", str(script)], env={**bare, "TRITON_URL": "triton:8000"}, capture_output=True, text=True
    )
    assert no_token.returncode == 2 and "JUPYTER_TOKEN" in no_token.stderr
    assert "ENV JUPYTER_TOKEN" not in text and "ARG JUPYTER_TOKEN" not in text, "the token is never baked in"
    container_requirements = (config.PROJECT_ROOT / "client_scripts" / "requirements-container.txt").read_text()
    assert "tritonclient[all]==2.51.0" in container_requirements and "USER 10001" in text
