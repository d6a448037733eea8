"""The tasks' flags, checked before anything starts: one line naming the flag, what was given and
what is accepted. A flag that fails here has changed nothing and written nothing."""

from __future__ import annotations

from provision.errors import UsageError


class FlagError(UsageError):
    """A flag's value is not one the task accepts; the message names the flag, the value and what is accepted."""


def concurrency_range(value: str, flag: str = "--concurrency") -> str:
    """perf_analyzer's start[:end[:step]], positive integers, start <= end (it reads "2-4" as 2 alone)."""
    parts = str(value).split(":")
    numbers = [int(part) for part in parts if part.strip().isdigit()]
    if not 1 <= len(parts) <= 3 or len(numbers) != len(parts) or min(numbers) < 1 or numbers[0] > numbers[min(1, len(numbers) - 1)]:
        raise FlagError(
            f"{flag} {value}: give perf_analyzer's start:end:step, positive integers with start <= end "
            "(e.g. 2:8:2, or 4 for one level)"
        )
    return ":".join(str(number) for number in numbers)


def positive_number(value, flag: str, unit: str = "") -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = 0.0
    if not number > 0:
        shown = f"{value:g}" if isinstance(value, (int, float)) else value
        raise FlagError(f"{flag} {shown}: give a number greater than 0{f' ({unit})' if unit else ''}")
    return number


def whole_number(value: int, flag: str, least: int, unit: str = "") -> int:
    """A whole-number flag (Invoke has made it an int) of at least `least`."""
    if value < least:
        raise FlagError(f"{flag} {value}: give a whole number of at least {least}{f' ({unit})' if unit else ''}")
    return value


def positive_integers(value: str, flag: str) -> list[int]:
    """"4,8,16" -> [4, 8, 16]."""
    parts = [part.strip() for part in str(value).split(",") if part.strip()]
    if not parts or not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise FlagError(f"{flag} {value}: give comma-separated whole numbers of at least 1 (e.g. 4,8,16)")
    return [int(part) for part in parts]


def models(names: list[str], known: list[str], flag: str = "--model", not_offered: dict | None = None) -> list[str]:
    """The models named, each one of `known`; `not_offered`: {model: why the task does not take it}."""
    for name in names:
        if name in (not_offered or {}):
            raise FlagError(f"{flag} {name}: not measured: {not_offered[name]}")
    unknown = [name for name in names if name not in known]
    if unknown:
        raise FlagError(f"{flag} {', '.join(unknown)}: no such model; the models are {', '.join(known)}")
    return names


def for_target(target: str, given: dict, readers: dict[str, tuple[str, ...]], common: tuple[str, ...]) -> None:
    """Refuse a flag given for a target that does not read it (it would be ignored without a word).

    given: {flag's parameter name: value} of the flags given; readers: {target: the flags it reads}."""
    for name, value in given.items():
        if name in common or name in readers.get(target, ()):
            continue
        flag = "--" + name.replace("_", "-")
        owners = [other for other, names in readers.items() if name in names]
        shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
        raise FlagError(
            f"{flag} {shown}: a flag of the {' and '.join(owners)} target{'s' if len(owners) > 1 else ''}, "
            f"and this provision is for the {target} target, which does not read it: add --target {owners[0]}, "
            f"or leave {flag} out"
        )
