"""Numbers with their units, formatted once for every table, sentence and page. Every formatter
takes None for "not measured" and answers "-"; the `unit=False` forms give the bare number for
a table whose header carries the unit ("time ms", "mem GiB")."""

from __future__ import annotations

GIB = 1024**3
MIB = 1024**2
GB = 1e9
MISSING = "-"


def format_bytes(value: float | None, spec: str = ".2f") -> str:
    """Bytes with a binary unit: 1536 -> '1.50 KiB' (`spec` ".3g": '1.5 KiB'); None -> '-'."""
    if value is None:
        return MISSING
    for unit, size in (("TiB", 1024**4), ("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(value) >= size:
            return f"{value / size:{spec}} {unit}"
    return f"{value:.0f} B"


def format_memory(value: float | None) -> str:
    """Memory and traffic sizes in MiB or GiB: 1.5 * 2**20 -> '1.5 MiB', 3 * 2**30 -> '3.00 GiB'.

    Below 1 MiB it still answers in MiB ('0.9 MiB'), so a column of sizes reads in one unit."""
    if value is None:
        return MISSING
    return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / MIB:.1f} MiB"


def format_count(value: float) -> str:
    """A count with an SI suffix: 1.5e12 -> '1.50 T'."""
    for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:g}"


def format_seconds(seconds: float | None, digits: int = 1, *, unit: bool = True) -> str:
    """Seconds as milliseconds: 0.0123 -> '12.3 ms' ('12.3' with unit=False); None -> '-'."""
    if seconds is None:
        return MISSING
    return f"{seconds * 1e3:.{digits}f}" + (" ms" if unit else "")


def format_gb(value: float | None, digits: int = 3, *, unit: bool = True) -> str:
    """Bytes in decimal gigabytes (link traffic): 2.52e8 -> '0.252 GB'; None -> '-'."""
    return MISSING if value is None else f"{value / GB:.{digits}f}" + (" GB" if unit else "")


def format_gib(value: float | None, digits: int = 2, *, unit: bool = True) -> str:
    """Bytes in binary gibibytes (device memory): 2**29 -> '0.50 GiB'; None -> '-'."""
    return MISSING if value is None else f"{value / GIB:.{digits}f}" + (" GiB" if unit else "")


def format_percent(value: float | None, digits: int = 1, *, sign: bool = False) -> str:
    """A fraction as a percentage: 0.094 -> '9.4%' ('+9.4%' with sign=True); None -> '-'."""
    if value is None:
        return MISSING
    return f"{value:+.{digits}%}" if sign else f"{value:.{digits}%}"


def format_number(value: float | None, digits: int = 3) -> str:
    """A dimensionless number with fixed decimals: 0.9041 -> '0.904'; None -> '-'."""
    return MISSING if value is None else f"{value:.{digits}f}"
