"""The `lab` settings, merged in one order for every entry point. The one reader of them.

The levels, each beating the one before (docs/configuration.md):

  1. the project's defaults, provision/defaults.yaml
  2. the user's file, ~/.fabric.yaml (and /etc/fabric.yaml below it)
  3. the project-local file, fabric.yaml beside tasks.py
  4. FABRIC_LAB_* environment variables (FABRIC_LAB_PORTS_TRITON_HTTP=9000)
  5. in `fab`: a runtime file (`fab -f FILE`); then each task's flags

Invoke's own Config does the merge, with the defaults given as the tasks'
collection configuration: Invoke ranks that below every file, where a project's
fabric.yaml holding the defaults would rank above the user's file and hide it.
tasks.py passes what Fabric merged to settings(); code that runs outside Fabric
(`python -m provision...`, the demo, the benchmarks, the tests) gets the same
merge from settings(), which builds the same Config. Either way the result is
plain dicts and lists. A key no default has (`lab.prots`) gets a warning naming
the closest real one; `fab config` (and `python -m provision.config`) print the
merged settings and where each changed value came from.
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
import json
import os
import sys
from functools import cache, lru_cache
from pathlib import Path
from types import ModuleType

import invoke.config
import yaml
from invoke.env import Environment as _InvokeEnvironment

from provision.errors import UsageError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = PROJECT_ROOT / "model_repository"
SERVING_REQUIREMENTS = MODEL_REPOSITORY / "requirements.txt"
CLIENT_SCRIPTS = PROJECT_ROOT / "client_scripts"
DEFAULTS_FILE = Path(__file__).resolve().parent / "defaults.yaml"
ENV_PREFIX = "FABRIC_LAB_"
# Settings whose value is a mapping of the user's own keys (model -> its settings): no key is misspelled there.
FREE_FORM = {("models", "tuned")}


@cache
def client_script(name: str) -> ModuleType:
    """client_scripts/<name>.py as a module: code the hosts, the API container and the notebook run
    (standard library only) that the controller runs too, so that there is one copy of it."""
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "") == CLIENT_SCRIPTS / f"{name}.py":
        return loaded  # one module object, whoever imports it (compare_runs imports run_folder)
    spec = importlib.util.spec_from_file_location(name, CLIENT_SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # The scripts import each other by name, as they do beside each other on a host or in the notebook.
    sys.path.insert(0, str(CLIENT_SCRIPTS))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(str(CLIENT_SCRIPTS))
    return module


class _Environment(_InvokeEnvironment):
    """Invoke's reader of FABRIC_* variables, casting each variable's text to the type of the value it
    replaces. Invoke reads a boolean as false only for "0" or "", so that FABRIC_LAB_MODELS_GPU_DECODE=false
    meant true, and ends every command in a traceback for a number that is not one: here a boolean takes
    the words of TRUE_WORDS and FALSE_WORDS, and text that is not of the type stays text, for
    type_problems (below) to name."""

    def _cast(self, old, new: str):
        if isinstance(old, bool):
            word = new.strip().lower()
            return True if word in TRUE_WORDS else False if word in FALSE_WORDS else new
        if isinstance(old, (int, float)):
            for kind in (type(old), float):  # 2.5 where the default is 3: a number all the same
                try:
                    return kind(new)
                except ValueError:
                    pass
            return new
        if isinstance(old, (list, dict)):  # Invoke cannot read one from a variable: its text, named below
            return new
        return super()._cast(old, new)


# Invoke's Config reads the environment through the name `Environment` of its module: Fabric's `fab`
# (which imports tasks.py, and so this module, before it reads the environment) and settings() alike.
invoke.config.Environment = _Environment


@lru_cache(maxsize=1)
def _defaults() -> dict:
    with open(DEFAULTS_FILE, encoding="utf-8") as file:
        return yaml.safe_load(file)["lab"]


def defaults() -> dict:
    """provision/defaults.yaml's `lab:` section: a fresh copy (the tasks' collection configuration)."""
    return copy.deepcopy(_defaults())


def _plain(value):
    """Mappings and sequences of any kind (Invoke's DataProxy, say) as dicts and lists."""
    if hasattr(value, "items"):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _merged(base: dict, overrides: dict) -> dict:
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = (
            _merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
        )
    return merged


def _invoke_config():
    """Invoke's Config under Fabric's names (fabric.yaml files, FABRIC_ variables), the defaults at the
    bottom: what `fab` merges (but its runtime file), for code that runs without it."""
    from invoke import Config

    class FabricNamed(Config):
        prefix = "fabric"

    config = FabricNamed(defaults={**Config.global_defaults(), "lab": defaults()}, project_location=str(PROJECT_ROOT))
    config.load_project()
    config.load_shell_env()
    return config


def settings(overrides=None, runtime_path: str | None = None, strict: bool = True) -> dict:
    """The merged `lab` settings (defaults, user file, project file, FABRIC_LAB_*), then `overrides`
    (in `fab`: what Fabric merged, its runtime file and the task's flags included): a fresh, plain copy.
    A value of the wrong type is a UsageError naming the setting and where it was set (strict False:
    a warning on stderr)."""
    merged = _plain(_invoke_config().lab) if overrides is None else _merged(defaults(), _plain(overrides))
    warn_unknown_keys()
    problems = type_problems(merged, runtime_path)
    if problems and strict:
        raise UsageError("; ".join(problems))
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    return merged


# -- each value of the type of its default --------------------------------------------------------------

TRUE_WORDS, FALSE_WORDS = ("true", "yes", "on", "1"), ("false", "no", "off", "0", "")
_KIND_WORDS = {bool: "true or false", int: "a number", float: "a number", list: "a list", dict: "a mapping"}


def _of_kind(value, default) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, (int, float)):  # 2.5 where the default is 3 is a number too (the reader rounds)
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, (list, dict)):
        return isinstance(value, type(default))
    return True  # text and settings with no default: any value (their readers check what they need)


def type_problems(merged: dict, runtime_path: str | None = None) -> list[str]:
    """A line for each setting whose value is not of its default's type, naming where it was set."""
    defaults_by_path = _leaves(_defaults())
    wrong = {path: value for path, value in _leaves(merged).items()
             if path in defaults_by_path and not _of_kind(value, defaults_by_path[path])}  # fmt: skip
    if not wrong:
        return []
    variables = {path: name for name, path in _environment_names().items()}
    sources = {}
    for where, values in levels(runtime_path=runtime_path)[1:]:
        for path in _leaves(values):
            sources[path] = variables[path] if where.startswith("environment") else where
    return [
        f"lab.{'.'.join(path)} is {json.dumps(value)} ({sources.get(path, 'a task flag')}): "
        f"give {_KIND_WORDS[type(defaults_by_path[path])]}"
        for path, value in wrong.items()
    ]


# -- where each value comes from, and keys that are no setting --------------------------------------------


def _read(path: Path) -> dict:
    """A settings file's `lab:` section ({} without one); .yaml, .yml or .json, as Invoke reads them."""
    if not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return _plain((data or {}).get("lab") or {}) if isinstance(data, dict) else {}


def _first_file(prefix: str) -> Path:
    """Invoke's choice among prefix.yaml, .yml, .json (the first that exists)."""
    candidates = [Path(os.path.expanduser(f"{prefix}{suffix}")) for suffix in (".yaml", ".yml", ".json")]
    return next((path for path in candidates if path.is_file()), candidates[0])


def levels(project_location: Path = PROJECT_ROOT, runtime_path: str | None = None) -> list[tuple[str, dict]]:
    """[(where, its `lab` values)], lowest first: what each level sets, as it is written there."""
    files = [_first_file(prefix) for prefix in ("/etc/fabric", "~/.fabric", str(project_location / "fabric"))]
    found = [
        ("defaults (provision/defaults.yaml)", defaults()),
        *[(str(path), _read(path)) for path in files],
        ("environment (FABRIC_LAB_*)", _environment_values()),
    ]
    if runtime_path:
        found.append((f"fab -f {runtime_path}", _read(Path(runtime_path))))
    return found


def _leaves(tree: dict, path: tuple = ()) -> dict[tuple, object]:
    """{key path: value} of a settings tree's leaves (a free-form mapping is one leaf)."""
    found = {}
    for key, value in tree.items():
        here = (*path, key)
        if isinstance(value, dict) and value and here not in FREE_FORM:
            found.update(_leaves(value, here))
        else:
            found[here] = value
    return found


def _environment_names() -> dict[str, tuple]:
    """{FABRIC_LAB_... variable: the key path it sets}, for every setting (Invoke's naming)."""
    return {ENV_PREFIX + "_".join(path).upper(): path for path in _leaves(_defaults())}


def _environment_values() -> dict:
    """The FABRIC_LAB_* variables set now, as a `lab` tree (values as the environment gives them)."""
    tree: dict = {}
    for name, path in _environment_names().items():
        if name in os.environ:
            node = tree
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = os.environ[name]
    return tree


def unknown_keys(project_location: Path = PROJECT_ROOT) -> list[str]:
    """A line per key no setting has, in a settings file or a FABRIC_LAB_* variable, naming the closest real one."""
    known = {".".join(("lab", *path)) for path in _leaves(_defaults())}
    known |= {".".join(("lab", *path[:n])) for path in _leaves(_defaults()) for n in range(1, len(path))}
    lines = []
    for where, values in levels(project_location)[1:-1]:  # the files
        for path in _leaves(values):
            name = ".".join(("lab", *path))
            if name not in known and not any(path[: len(free)] == free for free in FREE_FORM):
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
                lines.append(f"{name} in {where} is no setting" + (f": did you mean {close[0]}?" if close else ""))
    names = _environment_names()
    for variable in sorted(v for v in os.environ if v.startswith(ENV_PREFIX) and v not in names):
        close = difflib.get_close_matches(variable, names, n=1, cutoff=0.6)
        lines.append(f"{variable} is no setting" + (f": did you mean {close[0]}?" if close else ""))
    return lines


@cache
def warn_unknown_keys() -> None:
    """Print each unknown key's warning to stderr (a typo would otherwise change nothing silently): once per
    process, since settings() is read many times and the files and the environment are read here again."""
    for line in unknown_keys():
        print(f"warning: {line}", file=sys.stderr)


SECRET_WORDS = ("secret", "password", "token")


def explain(merged: dict, found: list[tuple[str, dict]]) -> list[str]:
    """`fab config`'s lines: every setting, and for one that differs from its default, where it was set."""
    sources = {}
    for where, values in found[1:]:
        for path in _leaves(values):
            sources[path] = where  # the last level that sets it wins
    default = _leaves(_defaults())
    lines = []
    for path, value in _leaves(merged).items():
        name = ".".join(("lab", *path))
        shown = "(set)" if any(word in name.lower() for word in SECRET_WORDS) and value else json.dumps(value)
        if path in default and value == default[path]:
            lines.append(f"{name} = {shown}")
        else:
            lines.append(f"{name} = {shown}    <- {sources.get(path, 'a task flag or override')}")
    credentials = [name for name in sorted(os.environ) if name.startswith("OS_")]
    lines.append(
        "credentials: " + (", ".join(f"{name} set" for name in credentials) if credentials else "no OS_* variable set")
    )
    return lines


def runtime_dir(lab: dict | None = None) -> Path:
    """The local runtime folder (absolute), from the given settings or the merged ones."""
    path = Path((lab or settings())["runtime_dir"])
    return path if path.is_absolute() else PROJECT_ROOT / path


if __name__ == "__main__":  # python -m provision.config: the merged settings and where each changed one came from
    for line in explain(settings(), levels()):
        print(line)
