"""The one vocabulary: every option literal of a configuration, and its tuple of values.

Pure Python (no torch): the CLI, the scenarios, the model and the kernels all take their
option values from here, so that each concept is spelled once.
"""

from __future__ import annotations

from typing import Literal, get_args

Layout = Literal["contiguous", "zigzag", "striped"]
"""How the sequence is cut over the ring (see cpbench/attention/layouts.py)."""
Dtype = Literal["float32", "bfloat16", "float16"]
Backend = Literal["auto", "sdpa", "naive", "flash_attn"]
Phase = Literal["fwd", "fwd+bwd"]
Device = Literal["cpu", "cuda"]
ScenarioDevice = Literal["auto", "cpu", "cuda"]
Scheme = Literal["single", "ring", "ulysses", "usp"]

LAYOUTS: tuple[str, ...] = get_args(Layout)
DTYPES: tuple[str, ...] = get_args(Dtype)
BACKENDS: tuple[str, ...] = get_args(Backend)
PHASES: tuple[str, ...] = get_args(Phase)
DEVICES: tuple[str, ...] = get_args(Device)
SCENARIO_DEVICES: tuple[str, ...] = get_args(ScenarioDevice)

CliDevice = ScenarioDevice
"""A `--device` option: auto picks cuda when a GPU is visible."""
DEFAULT_DTYPE: dict[str, str] = {"cpu": "float32", "cuda": "bfloat16"}
"""Dtype of a configuration that names none, per device."""
