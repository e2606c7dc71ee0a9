"""Counting a band's cells in closed form: the cells (i, j) of a rows x cols rectangle with
lo <= j - i <= hi, and the clamped sums they come from; for one rectangle (Python ints) or for
many at once (int64 numpy arrays, the same formulas). What the mask geometry counts pairs and
work with (docs/design.md section 1). numpy is imported only by the array functions."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def sum_clamped(a: int, n: int, cap: int) -> int:
    """sum_{i=0}^{n-1} min(max(a + i, 0), cap), cap >= 0."""
    if n <= 0:
        return 0
    i_zero = min(max(-a, 0), n)
    i_cap = min(max(cap - a, 0), n)
    i_cap = max(i_cap, i_zero)
    count = i_cap - i_zero
    linear = count * a + (i_zero + i_cap - 1) * count // 2
    return linear + (n - i_cap) * cap


def band_pairs(rows: int, cols: int, lo: int | None, hi: int | None) -> int:
    """Cells (i, j) of a rows x cols rectangle with lo <= j - i <= hi."""
    upper = rows * cols if hi is None else sum_clamped(hi + 1, rows, cols)
    lower = 0 if lo is None else sum_clamped(lo, rows, cols)
    return max(upper - lower, 0)


def sum_clamped_array(a: np.ndarray, n: np.ndarray, cap: np.ndarray | int) -> np.ndarray:
    """`sum_clamped` of each element (arrays broadcast; n >= 0, cap >= 0)."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    i_zero = np.minimum(np.maximum(-a, 0), n)
    i_cap = np.maximum(np.minimum(np.maximum(cap - a, 0), n), i_zero)
    count = i_cap - i_zero
    linear = count * a + (i_zero + i_cap - 1) * count // 2
    return linear + (n - i_cap) * cap


def band_pairs_array(
    rows: np.ndarray, cols: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """`band_pairs` of each element, both offsets bounded (lo <= -(rows - 1) counts as no lower
    bound and hi >= cols - 1 as no upper one: the same cells)."""
    import numpy as np  # noqa: PLC0415 (only here: `cpbench --help` loads no numpy)

    upper = sum_clamped_array(hi + 1, rows, cols)
    lower = sum_clamped_array(lo, rows, cols)
    return np.maximum(upper - lower, 0)
