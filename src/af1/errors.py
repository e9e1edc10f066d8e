"""The one exception type the CLI turns into a one-line message and exit code 2, and a validation error in one line."""

from collections.abc import Mapping

from pydantic import ValidationError


class Af1Error(Exception):
    """A problem with the user's input or environment, stated in one line."""


def in_one_line(exc: ValidationError, named: Mapping[str, str] | None = None) -> str:
    """A validation error's first problem in one line: where (dotted; its first part as `named` calls it, e.g. a field
    by its flag) and what."""
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    if loc and named:
        loc[0] = named.get(loc[0], loc[0])
    message = "unknown key" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")
    return f"{'.'.join(loc)}: {message}" if loc else message
