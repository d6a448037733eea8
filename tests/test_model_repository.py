"""The source model repository and its rendering for hosts with 0, 1 and 2 GPUs."""

from __future__ import annotations

import filecmp
import re

import pytest
import torch
from food11 import FOOD11_LABELS, Food11Classifier, WeightsError, build_network

from provision import config, sample_images
from provision.model_repo import (
    RenderValues,
    TuningError,
    check_tuned,
    model_names,
    read_tuned,
    render,
    render_config,
    tunable_settings,
)

CLASSIFIERS = ["food_classifier", "gpu_food_classifier", "batching_food_classifier", "multigpu_food_classifier"]
ALL_MODELS = sorted(CLASSIFIERS + ["conditional_captioning", "ensemble"])
SOURCE = config.MODEL_REPOSITORY


def values(gpus: int, **extra) -> RenderValues:
    return RenderValues(gpu_count=gpus, food11_weights_path="/w/food11.pth", blip_source="/w/blip", **extra)


def instance_groups(pbtxt: str) -> list[str]:
    block = re.search(r"instance_group \[(.*?)\n\]", pbtxt, re.S)
    return re.findall(r"\{(.*?)\}", block.group(1), re.S) if block else []


def test_the_repository_has_the_seeds_six_models():
    assert model_names() == ALL_MODELS


def test_one_classifier_implementation_serves_all_four_variants():
    for variant in CLASSIFIERS[1:]:
        for module in ("model.py", "food11.py", "serving_common.py"):
            path = SOURCE / variant / "1" / module
            assert path.is_symlink(), f"{path} must link to food_classifier/1/{module}, not copy it"
            assert path.resolve() == (SOURCE / "food_classifier" / "1" / module).resolve()
    assert not list(SOURCE.rglob("*.pth")), "weights are loaded from a configured path, never stored in the repository"


def test_seed_batching_settings():
    batching = render_config("batching_food_classifier", values(1))
    assert "max_batch_size: 16" in batching
    assert re.search(r"preferred_batch_size: \[ 4, 8 \]\s+max_queue_delay_microseconds: 100", batching)
    assert "max_batch_size: 1\n" in render_config("food_classifier", values(1))


def test_seed_tensor_names_and_types():
    for model in CLASSIFIERS:
        text = render_config(model, values(0))
        assert re.search(r'name: "INPUT_IMAGE"\s+data_type: TYPE_STRING', text)
        assert re.search(r'name: "FOOD_LABEL"\s+data_type: TYPE_STRING', text)
        assert re.search(r'name: "PROBABILITY"\s+data_type: TYPE_FP32', text)
    ensemble = render_config("ensemble", values(0))
    assert 'platform: "ensemble"' in ensemble and re.search(r'name: "OUTPUT"\s+data_type: TYPE_STRING', ensemble)


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_gpu_hosts_get_gpu_instances(gpus):
    gpu_groups = instance_groups(render_config("gpu_food_classifier", values(gpus)))
    assert len(gpu_groups) == 1 and "KIND_GPU" in gpu_groups[0] and "gpus: [ 0 ]" in gpu_groups[0]
    multi_groups = instance_groups(render_config("multigpu_food_classifier", values(gpus, instances_per_gpu=2)))
    assert len(multi_groups) == gpus, "one instance group per GPU of the host"
    for gpu, group in enumerate(multi_groups):
        assert "KIND_GPU" in group and f"gpus: [ {gpu} ]" in group and "count: 2" in group
    assert "instance_group" in render_config("food_classifier", values(gpus))
    assert "KIND_CPU" in render_config("food_classifier", values(gpus)), "food_classifier is the CPU baseline"


def test_hosts_without_gpus_run_the_gpu_variants_on_cpu_visibly_labelled():
    for model in ["gpu_food_classifier", "batching_food_classifier", "multigpu_food_classifier"]:
        text = render_config(model, values(0))
        groups = instance_groups(text)
        assert len(groups) == 1 and "KIND_CPU" in groups[0] and "KIND_GPU" not in text
        assert f"NO GPU ON THIS HOST: {model} runs on the CPU" in text


def test_rendering_writes_plain_files_with_the_configured_paths(tmp_path):
    names = render(tmp_path / "models", values(2))
    assert names == ALL_MODELS
    rendered = tmp_path / "models"
    for model in CLASSIFIERS:
        model_py = rendered / model / "1" / "model.py"
        assert model_py.is_file() and not model_py.is_symlink()
        assert filecmp.cmp(model_py, SOURCE / "food_classifier" / "1" / "model.py", shallow=False)
        assert 'string_value: "/w/food11.pth"' in (rendered / model / "config.pbtxt").read_text()
    assert not list(rendered.rglob("*.j2")) and not (rendered / "_templates").exists()
    assert 'string_value: "/w/blip"' in (rendered / "conditional_captioning" / "config.pbtxt").read_text()


def test_smoke_weights_are_labelled_in_the_configs(render_values):
    assert render_values.smoke_weights
    assert 'key: "smoke_weights"' in render_config("food_classifier", render_values)
    assert 'key: "smoke_weights"' not in render_config("food_classifier", values(0))


# ---- weights formats


@pytest.fixture(scope="module")
def images():
    return [sample_images.picture(seed=seed) for seed in range(4)]


def test_the_course_format_and_a_state_dict_give_the_same_answers(weights_dir, tmp_path, images):
    whole = weights_dir / "food11.pth"
    network = torch.load(whole, weights_only=False)
    assert isinstance(network, torch.nn.Module), "smoke food11.pth is a whole pickled model, like the course's"
    state_dict = tmp_path / "food11_state_dict.pth"
    torch.save(network.state_dict(), state_dict)
    wrapped = tmp_path / "checkpoint.pth"
    torch.save({"epoch": 3, "model_state_dict": network.state_dict()}, wrapped)

    reference = Food11Classifier(whole).classify(images)
    assert Food11Classifier(state_dict).classify(images) == reference
    assert Food11Classifier(wrapped).classify(images) == reference
    assert all(label in FOOD11_LABELS and 0 < p <= 1 for label, p in reference)


def test_smoke_weights_tell_images_apart(weights_dir, images):
    answers = Food11Classifier(weights_dir / "food11.pth").classify(images)
    assert len({round(p, 4) for _, p in answers}) > 1, "every image got the same answer: weights are degenerate"


def test_wrong_weights_are_refused_with_a_clear_error(tmp_path):
    with pytest.raises(WeightsError, match="not found"):
        Food11Classifier(tmp_path / "missing.pth")
    ten_classes = tmp_path / "ten.pth"
    torch.save(build_network(num_classes=10).state_dict(), ten_classes)
    with pytest.raises(WeightsError, match="not a Food-11 MobileNetV2"):
        Food11Classifier(ten_classes)
    torch.save(build_network(num_classes=10), ten_classes)
    with pytest.raises(WeightsError, match="10 outputs"):
        Food11Classifier(ten_classes)


# -- serving settings: declared once in each template, overridden by lab.models.tuned


def test_each_model_declares_its_serving_settings_once_in_its_template():
    cpu, gpus = values(0), values(2)
    assert tunable_settings("food_classifier", cpu) == {"instance_count": 1}
    assert tunable_settings("batching_food_classifier", gpus) == {
        "max_batch_size": 16, "preferred_batch_size": [4, 8], "max_queue_delay_us": 100, "instance_count": 1, "gpus": 1,
    }  # fmt: skip
    assert tunable_settings("multigpu_food_classifier", gpus)["gpus"] == 2, "every GPU of the host"
    assert tunable_settings("batching_food_classifier", cpu)["gpus"] == 0, "no GPU: CPU instances"
    assert tunable_settings("ensemble", cpu) is None, "an ensemble has no instances or batching of its own"


def test_tuned_settings_are_rendered_into_the_config():
    tuned = {"instance_count": 3, "gpus": 2, "max_batch_size": 8, "preferred_batch_size": [8], "max_queue_delay_us": 0}
    text = render_config("batching_food_classifier", values(2, tuned={"batching_food_classifier": tuned}))
    assert "max_batch_size: 8\n" in text
    assert re.search(r"dynamic_batching \{\s+preferred_batch_size: \[ 8 \]\s+max_queue_delay_microseconds: 0\s+\}", text)
    groups = instance_groups(text)
    assert [("count: 3" in g, f"gpus: [ {i} ]" in g) for i, g in enumerate(groups)] == [(True, True)] * 2
    no_preferred = {"batching_food_classifier": {"preferred_batch_size": []}}
    assert "preferred_batch_size" not in render_config("batching_food_classifier", values(0, tuned=no_preferred))
    cpu = render_config("food_classifier", values(0, tuned={"food_classifier": {"instance_count": 2}}))
    assert ["KIND_CPU" in g and "count: 2" in g for g in instance_groups(cpu)] == [True]


@pytest.mark.parametrize(
    ("tuned", "message"),
    [
        ({"batching_food_classifier": {"threads": 2}}, "batching_food_classifier takes max_batch_size, "),
        ({"batching_food_classifier": {"max_batch_size": 4}}, "preferred_batch_size is [4, 8]: each size must be 1..max_batch_size (4)"),
        ({"batching_food_classifier": {"gpus": 3}}, "gpus is 3: this host has 2 GPU(s)"),
        ({"food_classifier": {"instance_count": 0}}, "food_classifier.instance_count is 0: expected a whole number >= 1"),
        ({"food_classifier": {"max_batch_size": 8}}, "food_classifier takes instance_count; not max_batch_size"),
    ],
)
def test_wrong_tuned_settings_name_the_setting(tuned, message):
    (model,) = tuned
    with pytest.raises(TuningError) as raised:
        render_config(model, values(2, tuned=tuned))
    assert message in str(raised.value) and f"lab.models.tuned.{model}" in str(raised.value)


def test_a_deploy_checks_the_tuned_models_before_touching_a_host(tmp_path):
    settings = config.settings({"models": {"tuned": {"ensemble": {"instance_count": 2}}}})
    with pytest.raises(TuningError, match="'ensemble': it has no serving settings to tune"):
        check_tuned(settings)
    with pytest.raises(TuningError, match="'resnet': no such model"):
        check_tuned(config.settings({"models": {"tuned": {"resnet": {}}}}))
    check_tuned(config.settings({"models": {"tuned": {"food_classifier": {"instance_count": 2}}}}))
    best = tmp_path / "best.json"
    best.write_text('{"model": "food_classifier", "settings": {"instance_count": 2}, "measured": {}}')
    assert read_tuned(best) == {"food_classifier": {"instance_count": 2}}
    best.write_text("{}")
    with pytest.raises(TuningError, match="is not a best.json of fab tune"):
        read_tuned(best)
