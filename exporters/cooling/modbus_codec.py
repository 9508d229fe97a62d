"""Modbus register codec: raw 16-bit words <-> numbers, for every word and byte order.

Kept apart from the collector so the simulator encodes with the very same
rules the collector decodes with, and so a test can check both directions
without a network. Orders are named as in Telegraf and most vendor manuals:
ABCD (big endian), CDAB (word-swapped, e.g. Liebert DCD "float sw"), BADC
(byte-swapped words), DCBA (little endian).
"""

from __future__ import annotations

import math
import struct
from typing import Literal

DataType = Literal["u16", "i16", "u32", "i32", "f32", "bit"]
Order = Literal["ABCD", "CDAB", "BADC", "DCBA"]

WIDTH: dict[str, int] = {"u16": 1, "i16": 1, "u32": 2, "i32": 2, "f32": 2, "bit": 1}
_FMT = {"u16": ">H", "i16": ">h", "u32": ">I", "i32": ">i", "f32": ">f"}


def _reorder(data: bytes, order: str) -> bytes:
    """Map wire bytes to big-endian bytes (the permutation is its own inverse)."""
    if len(data) == 2:
        return data[::-1] if order in ("BADC", "DCBA") else data
    a, b, c, d = data
    return {"ABCD": bytes((a, b, c, d)), "CDAB": bytes((c, d, a, b)),
            "BADC": bytes((b, a, d, c)), "DCBA": bytes((d, c, b, a))}[order]


def decode(words: list[int], dtype: str, order: str = "ABCD") -> float:
    """Decode the registers of one point (1 or 2 words) into a raw number."""
    if dtype == "bit":
        raise ValueError("bits are not decoded from registers")
    if len(words) != WIDTH[dtype]:
        raise ValueError(f"{dtype} needs {WIDTH[dtype]} registers, got {len(words)}")
    wire = b"".join(int(w).to_bytes(2, "big") for w in words)
    return struct.unpack(_FMT[dtype], _reorder(wire, order))[0]


def encode(raw: float, dtype: str, order: str = "ABCD") -> list[int]:
    """Encode a raw number into the registers of one point (inverse of `decode`)."""
    if dtype == "f32":
        packed = struct.pack(">f", float(raw))
    else:
        packed = struct.pack(_FMT[dtype], int(round(raw)))
    wire = _reorder(packed, order)
    return [int.from_bytes(wire[i:i + 2], "big") for i in range(0, len(wire), 2)]


def clamp_raw(raw: float, dtype: str) -> float:
    """Clamp a raw value into what the type can hold (the simulator's saturating ADC)."""
    if dtype == "f32" or dtype == "bit":
        return raw
    bits = 16 * WIDTH[dtype]
    lo, hi = ((-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype.startswith("i") else (0, (1 << bits) - 1))
    if math.isnan(raw):
        return lo
    return min(max(round(raw), lo), hi)
