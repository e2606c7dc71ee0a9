"""Validation: the model's predictions against measurements, in sample or on a holdout."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cpbench.config.problem import check_choice
from cpbench.config.vocabulary import SPLITS, Split
from cpbench.errors import CpbenchError
from cpbench.model.calibrate.fit import calibration_summary, fit_profile
from cpbench.model.calibrate.measurements import Measurement, as_measurements
from cpbench.model.calibrate.stats import spearman
from cpbench.model.hardware.profile import HardwareProfile

TIE = 1e-6
"""Relative difference under which two predictions are a tie."""


def validation_rows(
    measurements: Sequence[Measurement], profile: HardwareProfile
) -> list[dict[str, Any]]:
    """Predicted vs measured per configuration: error = predicted / measured - 1."""
    rows = []
    for m in measurements:
        p = m.predict(profile)
        rows.append(
            {
                "id": m.record_id,
                "config": m.label,
                "ulysses": m.candidate.ulysses,
                "ring": m.candidate.ring,
                "layout": m.candidate.layout,
                "seq_len": m.candidate.shape.seq_len,
                "phase": m.candidate.phase,
                "measured_s": m.median_s,
                "predicted_s": p.step_s,
                "error": p.step_s / m.median_s - 1,
                "measured_compute_only_s": m.compute_only_s,
                "predicted_compute_only_s": p.compute_only_s,
                "measured_comm_only_s": m.comm_only_s,
                "predicted_comm_only_s": p.comm_only_s,
            }
        )
    return rows


def validation_summary(
    measurements: Sequence[Measurement], rows: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Median/max absolute error, Spearman over all rows, and regret per comparable group.

    Regret of a group (same problem, dtype, mask, phase, ranks): measured time of the
    configuration the model ranks fastest / the measured fastest - 1; `regret` is the largest.
    Configurations the model cannot tell apart (within TIE, e.g. the layouts of a U x 1 mesh,
    which run the same computation) count with their mean measured time.
    """
    if not rows:
        raise CpbenchError("nothing to validate: no measurements")
    errors = [abs(r["error"]) for r in rows]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, m in enumerate(measurements):
        groups.setdefault(m.group, []).append(i)
    details = []
    for members in groups.values():
        fastest = min(rows[i]["predicted_s"] for i in members)
        chosen = [i for i in members if rows[i]["predicted_s"] <= fastest * (1 + TIE)]
        best = min(members, key=lambda i: rows[i]["measured_s"])
        chosen_s = statistics.fmean(rows[i]["measured_s"] for i in chosen)
        details.append(
            {
                "configurations": len(members),
                "chosen": " = ".join(rows[i]["config"] for i in chosen),
                "best": rows[best]["config"],
                "regret": chosen_s / rows[best]["measured_s"] - 1,
                "spearman": spearman(
                    [rows[i]["predicted_s"] for i in members],
                    [rows[i]["measured_s"] for i in members],
                ),
            }
        )
    rankable = [d for d in details if d["configurations"] > 1]
    return {
        "n": len(rows),
        "median_abs_error": statistics.median(errors),
        "max_abs_error": max(errors),
        "spearman": spearman([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]),
        "regret": max((d["regret"] for d in rankable), default=None),
        "regret_mean": (statistics.fmean(d["regret"] for d in rankable) if rankable else None),
        "groups": details,
    }


def validate_profile(
    records: Iterable[Mapping[str, Any]] | Sequence[Measurement], profile: HardwareProfile
) -> dict[str, Any]:
    """Predicted vs measured for every usable record, with the summary metrics."""
    measurements = as_measurements(records)
    if not measurements:
        raise CpbenchError("nothing to validate: no records with status 'ok' and a timing.median")
    rows = validation_rows(measurements, profile)
    return {"profile": profile.name, "rows": rows, **validation_summary(measurements, rows)}


# -------------------------------------------------------------------------------- holdout


def split_measurements(
    measurements: Sequence[Measurement],
    fraction: float = 0.5,
    seed: int = 0,
    split: Split = "stratified",
) -> tuple[list[Measurement], list[Measurement]]:
    """(train, test): `fraction` of the configurations held out, at least one on each side.

    `stratified` orders the configurations by mesh (U x R), shuffled inside each mesh, and holds
    out every 1/fraction-th one (systematic sampling from a random offset), so each mesh with
    several configurations lands on both sides; `random` shuffles them all.
    """
    check_choice("split", split, SPLITS)
    if not 0 < fraction < 1:
        raise CpbenchError(f"holdout fraction must be between 0 and 1 (exclusive), got {fraction}")
    n = len(measurements)
    if n < 2:
        raise CpbenchError(f"a holdout split needs at least 2 measured configurations, got {n}")
    rng = random.Random(seed)
    items = list(measurements)
    rng.shuffle(items)
    n_test = min(n - 1, max(1, round(n * fraction)))
    if split == "random":
        return items[n_test:], items[:n_test]
    items.sort(key=lambda m: (m.candidate.ulysses, m.candidate.ring))  # stable: shuffled inside
    offset = rng.random()
    test_index = {min(n - 1, math.floor((k + offset) * n / n_test)) for k in range(n_test)}
    train = [m for i, m in enumerate(items) if i not in test_index]
    test = [m for i, m in enumerate(items) if i in test_index]
    return train, test


def holdout_evaluation(
    records: Iterable[Mapping[str, Any]] | Sequence[Measurement],
    seed: int = 0,
    *,
    prior: HardwareProfile | str | None = None,
    fraction: float = 0.5,
    split: Split = "stratified",
) -> dict[str, Any]:
    """Calibrate on part of the configurations, predict the rest.

    Returns median_abs_error, max_abs_error, spearman, regret (measured time of the held-out
    configuration the calibrated model ranks fastest vs the measured fastest held-out one, per
    comparable group, the largest), n_train, n_test, the rows and the calibration summary.
    """
    measurements = as_measurements(records)
    train, test = split_measurements(measurements, fraction, seed, split)
    result = fit_profile(train, prior)
    rows = validation_rows(test, result.profile)
    summary = validation_summary(test, rows)
    del summary["n"]  # n_test
    return {
        "n_train": len(train),
        "n_test": len(test),
        **summary,
        "split": split,
        "fraction": fraction,
        "seed": seed,
        "prior": result.prior.name,
        "train": [m.label for m in train],
        "rows": rows,
        "calibration": calibration_summary(result),
    }
