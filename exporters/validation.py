"""One way to turn a pydantic ValidationError into lines that name the bad field's path.

Shared by the agent config and every device profile format, so an operator
reads the same kind of message whichever file they got wrong. Bounded: the
bad value is shown through a size-limited repr (never the whole value, which
may be megabytes or a shared structure that expands without end), each line
is cut, and at most MAX_ERRORS errors are listed.
"""

from __future__ import annotations

import reprlib
from typing import Any, Callable, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

MAX_ERRORS = 20
MAX_LINE = 240  # an error line names the field, what is wrong and the choices (a bounded echo of the input)

_repr = reprlib.Repr()
_repr.maxlevel = 2
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlong = 40
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxdict = 4


def short_repr(value: Any) -> str:
    """repr() bounded in size and cost, for echoing user input in an error message."""
    return _repr.repr(value)


def terminal_safe(value: object, keep: str = "") -> str:
    """The text with every control or format character (except those in `keep`) escaped: \\x1b, \\n,
    \\u202e... Strings that came from outside (alert labels, device answers, file names, error texts)
    can then neither move the cursor, recolour or clear a terminal, nor break a table row."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in keep else ascii(ch)[1:-1] for ch in text)


def cut(text: str, limit: int = MAX_LINE) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


def error_lines(err: ValidationError, title: str,
                rename: Callable[[list[Any]], list[Any]] | None = None, show_input: bool = False) -> str:
    """`title` then one `  path: message` line per error; `rename` may swap list indices for names."""
    lines = [cut(title)]
    errors = err.errors(include_url=False)
    for e in errors[:MAX_ERRORS]:
        loc = list(e["loc"])
        if rename is not None:
            loc = rename(loc)
        path = ".".join(str(p) for p in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check spelling)"
        elif e["type"] == "missing":
            msg = "required field missing"
        else:
            msg = e["msg"]
        inp = e.get("input")
        got = f" (got {short_repr(inp)})" if show_input and e["type"] != "missing" and not isinstance(inp, dict) else ""
        lines.append(cut(f"  {path}: {msg}{got}"))
    if len(errors) > MAX_ERRORS:
        lines.append(f"  ... and {len(errors) - MAX_ERRORS} more errors")
    return "\n".join(lines)


def validate_document(model: type[M], data: Any, source: str, what: str, error: type[Exception],
                      rename: Callable[[list[Any]], list[Any]] | None = None) -> M:
    """`data` (a parsed YAML or JSON file) as `model`, or `error` whose lines name `source` and each bad field.

    One shape for every device profile format, so a profile that is not a mapping, or one with a bad
    field, reads the same way whichever format it is.
    """
    if not isinstance(data, dict):
        raise error(f"{source}: expected a mapping at the top level")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise error(error_lines(err, f"{source}: invalid {what}", rename)) from None
