"""Explicit model control on a real tritonserver 2.51: what a re-deploy (and `fab tune`) relies on.

Triton starts with every model of its repository (--load-model=*). A model
whose folder changed is loaded again through the repository API while the
others keep serving; a model whose new config cannot load keeps serving its
old one, and the load answers 400 or 500 with the reason, which the deploy prints.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request

import pytest
import tritonclient.http as triton_http
from support.serving import classify

from provision import sample_images
from provision.host.tritonserver import TritonProcess
from provision.model_repo import render

# One worker runs every test of the session's tritonserver (pytest-xdist's loadgroup): one server, not one per worker.
pytestmark = [pytest.mark.triton, pytest.mark.xdist_group("session_triton")]

IMAGE = sample_images.b64(sample_images.jpeg(seed=11))
MODELS = ["food_classifier", "batching_food_classifier"]


@pytest.fixture(scope="module")
def server(tmp_path_factory, render_values, triton_runtime):
    """A tritonserver with two of the classifiers, in a repository this module may change."""
    rendered = tmp_path_factory.mktemp("rendered")
    render(rendered, render_values)
    repository = tmp_path_factory.mktemp("repo")
    for model in MODELS:
        shutil.copytree(rendered / model, repository / model)
    triton = TritonProcess.on_free_ports(triton_runtime.root, repository, tmp_path_factory.mktemp("run"))
    triton.start(MODELS, timeout_s=300)
    yield triton
    triton.stop()


def repository_api(server: TritonProcess, model: str, action: str) -> tuple[int, dict]:
    request = urllib.request.Request(f"{server.url}/v2/repository/models/{model}/{action}", data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read() or b"{}")


def served_config(server: TritonProcess, model: str) -> dict:
    with urllib.request.urlopen(f"{server.url}/v2/models/{model}/config", timeout=10) as response:
        return json.loads(response.read())


def set_queue_delay(server: TritonProcess, microseconds: str) -> None:
    config = server.model_repository / "batching_food_classifier" / "config.pbtxt"
    text = config.read_text()
    start = text.index("max_queue_delay_microseconds:")
    end = text.index("\n", start)
    config.write_text(text[:start] + f"max_queue_delay_microseconds: {microseconds}" + text[end:])


def test_a_changed_config_is_served_after_a_load_without_a_restart(server):
    pid = server.pid()
    set_queue_delay(server, "2500")
    assert repository_api(server, "batching_food_classifier", "load")[0] == 200
    assert served_config(server, "batching_food_classifier")["dynamic_batching"]["max_queue_delay_microseconds"] == 2500
    assert server.pid() == pid and server.model_states() == {model: "READY" for model in MODELS}
    with triton_http.InferenceServerClient(f"{server.host}:{server.http_port}") as client:
        assert classify(client, "batching_food_classifier", [IMAGE])[0][0]


def test_a_config_that_cannot_load_is_refused_by_name_and_the_old_one_keeps_serving(server):
    set_queue_delay(server, "2500")
    repository_api(server, "batching_food_classifier", "load")
    set_queue_delay(server, "not-a-number")
    status, answer = repository_api(server, "batching_food_classifier", "load")
    # 400 for a model that fails its initialisation, 500 for a config Triton cannot parse.
    assert status in (400, 500) and "failed to load 'batching_food_classifier'" in answer["error"], answer
    assert server.model_states()["batching_food_classifier"] == "READY"
    with triton_http.InferenceServerClient(f"{server.host}:{server.http_port}") as client:
        assert classify(client, "batching_food_classifier", [IMAGE])[0][0], "the previous version still answers"
    set_queue_delay(server, "2500")
    assert repository_api(server, "batching_food_classifier", "load")[0] == 200


def test_a_model_that_left_the_repository_is_unloaded(server):
    assert repository_api(server, "food_classifier", "unload")[0] == 200
    # An unload answers at once and finishes in the background (in-flight requests complete first).
    deadline = time.monotonic() + 60
    while server.model_states()["food_classifier"] == "UNLOADING" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.model_states()["food_classifier"] == "UNAVAILABLE"
    assert server.model_states()["batching_food_classifier"] == "READY", "the others keep serving"
    assert repository_api(server, "food_classifier", "load")[0] == 200
