"""Test-only stand-in for the flash-attn package on CPU (see tests/stand_ins/README.md).

yunchang compares `flash_attn.__version__ < '2.6.3'` to pick the 2.7+ call signatures, which
the stand-in implements; the version string says what it is."""

from flash_attn.flash_attn_interface import flash_attn_func

__version__ = "2.7.4+cpu.stand.in"
STAND_IN = True

__all__ = ["STAND_IN", "__version__", "flash_attn_func"]
