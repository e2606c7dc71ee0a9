"""Test helpers for the implementation adapters: the test-only flash_attn stand-in on sys.path
(in this process and, as a pool task, on every rank)."""

from __future__ import annotations

import sys
from pathlib import Path

STAND_INS = str(Path(__file__).resolve().parent / "stand_ins")


def use_stand_ins() -> bool:
    """Put tests/stand_ins first on sys.path (idempotent). A pool task, too: the persistent
    ranks then import the stand-in flash_attn; processes spawned later inherit sys.path.
    Returns whether the imported flash_attn is the stand-in."""
    if STAND_INS not in sys.path:
        sys.path.insert(0, STAND_INS)
    try:
        import flash_attn  # noqa: PLC0415
    except ImportError:
        return False
    return bool(getattr(flash_attn, "STAND_IN", False))
