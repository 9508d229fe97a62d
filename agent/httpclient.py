"""The CLI's one HTTP client: JSON to and from the agent or the simulator, bearer token optional."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def request_json(method: str, url: str, body: Any = None, token: str | None = None,
                 timeout: float = 10.0) -> tuple[int, Any]:
    """(status, decoded JSON); an HTTP error status is returned, not raised; OSError when unreachable."""
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
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        try:
            return err.code, json.loads(err.read() or b"null")
        except ValueError:
            return err.code, {"error": err.reason}
