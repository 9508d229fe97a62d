"""One line per event, `key=value` fields (or one JSON object): greppable at 3 a.m., parseable by log shippers."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def _quote(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\n\t'):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        parts = [f"ts={ts}", f"level={record.levelname.lower()}", f"logger={record.name}",
                 f"event={_quote(record.getMessage())}"]
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                parts.append(f"{key}={_quote(value)}")
        if record.exc_info:
            parts.append(f"exc={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """The same fields as KeyValueFormatter, one JSON object per line (logging.format: json)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        out: dict[str, Any] = {"ts": ts, "level": record.levelname.lower(), "logger": record.name,
                               "event": record.getMessage()}
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, sort_keys=False)


FORMATTERS = {"keyvalue": KeyValueFormatter, "json": JsonFormatter}


def setup_logging(level: str = "info", fmt: str = "keyvalue") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FORMATTERS[fmt]())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # apscheduler logs every job run at INFO; our own per-source logs say what matters.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("pymodbus").setLevel(logging.CRITICAL)
