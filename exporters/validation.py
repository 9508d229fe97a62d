"""One way to turn a pydantic ValidationError into lines that name the bad field's path.

Shared by the agent config and every device profile format, so an operator
reads the same kind of message whichever file they got wrong.
"""

from __future__ import annotations

from typing import Any, Callable

from pydantic import ValidationError


def error_lines(err: ValidationError, title: str,
                rename: Callable[[list[Any]], list[Any]] | None = None, show_input: bool = False) -> str:
    """`title` then one `  path: message` line per error; `rename` may swap list indices for names."""
    lines = [title]
    for e in err.errors():
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
        got = f" (got {inp!r})" if show_input and e["type"] != "missing" and not isinstance(inp, dict) else ""
        lines.append(f"  {path}: {msg}{got}")
    return "\n".join(lines)
