"""profiling.ipynb executed top to bottom, and what it showed.

Where Jupyter runs (the process runtime's serving virtualenv on the host, the docker runtime's API
container), the notebook is executed by `jupyter nbconvert --execute`, whose executor is nbclient,
in the folder Jupyter serves and with Jupyter's own environment; here, by nbclient directly.
"""

from __future__ import annotations

import json

NBCONVERT = ["jupyter", "nbconvert", "--to", "notebook", "--execute", "--ExecutePreprocessor.timeout=600"]


def outputs(notebook: dict) -> tuple[str, int]:
    """(the text and markdown a notebook showed, how many PNGs); `notebook` as nbformat or JSON reads it."""
    texts, images = [], 0
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            texts.append(_text(output.get("text", "")))
            data = output.get("data", {})
            texts.append(_text(data.get("text/markdown", "")))
            images += "image/png" in data
    return "\n".join(texts), images


def executed(path) -> tuple[str, int]:
    """outputs() of an executed notebook's file."""
    return outputs(json.loads(path.read_text()))


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value
