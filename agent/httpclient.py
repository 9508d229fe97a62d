"""The CLI's one HTTP client: JSON to and from the agent or the simulator, bearer token optional."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


MAX_ANSWER_BYTES = 64 << 20
BAD_ANSWER = 502  # the status reported for a success answer that is not JSON (a proxy's page, a cut body)


class _NotJson(ValueError):
    pass


def _decode(raw: bytes) -> Any:
    if len(raw) > MAX_ANSWER_BYTES:
        raise _NotJson(f"answer over {MAX_ANSWER_BYTES} bytes")
    try:
        return json.loads(raw or b"null")
    except (ValueError, RecursionError):
        raise _NotJson("answer is not JSON") from None


def request_json(method: str, url: str, body: Any = None, token: str | None = None,
                 timeout: float = 10.0) -> tuple[int, Any]:
    """(status, decoded JSON); an HTTP error status is returned, not raised; OSError when unreachable.

    The answer is read up to a bound and a non-JSON one becomes {"error": ...}: the CLI prints a
    message, never a traceback, whatever answers on the port."""
    data = None if body is None else json.dumps(body).encode()
    if data is None and method == "POST":
        data = b""
    req = urllib.request.Request(url, data=data, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            try:
                return resp.status, _decode(resp.read(MAX_ANSWER_BYTES + 1))
            except _NotJson as exc:
                return BAD_ANSWER, {"error": str(exc)}
    except urllib.error.HTTPError as err:
        try:
            return err.code, _decode(err.read(MAX_ANSWER_BYTES + 1))
        except _NotJson:
            return err.code, {"error": err.reason}
