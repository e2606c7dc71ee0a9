"""Numbers with their units, formatted once for every table, sentence and page."""

from __future__ import annotations

GIB = 1024**3
GB = 1e9

def format_bytes(value: float) -> str:
    """Bytes with a binary unit: 1536 -> '1.50 KiB'."""
    for unit, size in (("TiB", 1024**4), ("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def format_count(value: float) -> str:
    """A count with an SI suffix: 1.5e12 -> '1.50 T'."""
    for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:g}"


def format_seconds(seconds: float | None, digits: int = 1) -> str:
    """Seconds as milliseconds: 0.0123 -> '12.3 ms'; None -> '-'."""
    return "-" if seconds is None else f"{seconds * 1e3:.{digits}f} ms"
