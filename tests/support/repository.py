"""The model repository rendered as the tests' server has it."""

from __future__ import annotations

import shutil
from pathlib import Path

from provision.model_repo import RenderValues, render


def rendered_repository(folder: Path, render_values: RenderValues, models: set[str] | None = None) -> Path:
    """folder/models: the repository rendered as the tests' server has it, only `models` kept (None: all)."""
    repository = folder / "models"
    render(repository, render_values)
    for model in repository.iterdir():
        if models is not None and model.name not in models:
            shutil.rmtree(model)
    return repository
