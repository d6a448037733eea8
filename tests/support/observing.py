"""What a test reads off a run: fab's output as it comes, the tasks a deploy changed, what Triton serves."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import urllib.error
import urllib.request

from provision.model_repo import model_names


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def printed_lines(process: subprocess.Popen) -> queue.Queue:
    """The process's output lines as they come (None at its end), so a test can wait with a timeout."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, process.stdout), lines.put(None)], daemon=True).start()
    return lines


def read_until(lines: queue.Queue, text: str, timeout_s: float = 60) -> str:
    """A process's output (printed_lines) up to the first line holding `text`; fails if it ends first."""
    output = ""
    while text not in output:
        line = lines.get(timeout=timeout_s)
        assert line is not None, f"the process ended before {text!r}:\n{output[-4000:]}"
        output += line
    return output


def the_rest(lines: queue.Queue, timeout_s: float = 120) -> str:
    """A process's output (printed_lines) to its end."""
    return "".join(iter(lambda: lines.get(timeout=timeout_s), None))


def changed_tasks(output: str) -> list[str]:
    return [line.split(None, 2)[-1] for line in output.splitlines() if line.strip().startswith("changed")]


def only_model_touched(model: str, tasks: list[str]) -> bool:
    """No task names a model other than `model` (tasks about models end with "(MODEL)")."""
    others = [name for name in model_names() if name != model]
    return not [task for task in tasks if task.endswith(tuple(f"({name})" for name in others))]


def served_instance_counts(triton_url: str, model: str) -> list[int]:
    """The instance counts of the model's config as the running server has loaded it."""
    with urllib.request.urlopen(f"{triton_url}/v2/models/{model}/config", timeout=10) as response:
        return [group["count"] for group in json.loads(response.read())["instance_group"]]
