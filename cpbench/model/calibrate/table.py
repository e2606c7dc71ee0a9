"""Measured step times from a table: a user's training log or another tool's benchmark, as CSV
or JSONL, one configuration a row. The columns: docs/cost-model.md, "Calibrating from a table"."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cpbench.config.problem import MeshCandidate
from cpbench.config.vocabulary import CpComm, Phase
from cpbench.errors import CpbenchError
from cpbench.model.calibrate.measurements import Measurement
from cpbench.reading import loads_json, read_text


class TableRow(BaseModel):
    """One measured configuration of a table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq_len: int = Field(gt=0)
    """Global sequence length (tokens per sequence)."""
    heads: int = Field(gt=0)
    """Query heads (of one TP rank, when TP splits them)."""
    kv_heads: int = Field(gt=0)
    """KV heads."""
    head_dim: int = Field(gt=0)
    """Head dimension."""
    batch: int = Field(default=1, gt=0)
    """Sequences per step."""
    mask: Literal["causal", "full"] = "causal"
    """causal or full attention."""
    documents: str | None = None
    """Packed document lengths, separated by `+` (they sum to seq_len); empty: one sequence."""
    window: int | None = Field(default=None, gt=0)
    """Sliding window W (a query sees the last W keys); empty: unbounded."""
    ulysses: int = Field(gt=0)
    """U: the Ulysses (all-to-all) degree."""
    ring: int = Field(gt=0)
    """R: the ring degree."""
    layout: Literal["contiguous", "zigzag", "striped", "doc_zigzag", "balanced"] = "zigzag"
    """Token layout of the ring (any value when R = 1)."""
    exchange: CpComm = "p2p"
    """How the ring axis exchanges K/V: p2p (ring hops) or all_gather."""
    heads_k_stride: int | None = Field(default=None, gt=0)
    """KV heads per gather of an all_gather exchange; empty: all at once."""
    phase: Phase = "fwd+bwd"
    """fwd or fwd+bwd (a training step of attention)."""
    dtype: Literal["float32", "float16", "bfloat16"] = "bfloat16"
    """Activation dtype."""
    gpu: str
    """The device, as `nvidia-smi` names it (e.g. `NVIDIA A100-SXM4-80GB`), or `cpu`: the
    built-in profile to start from is chosen by it."""
    devices_per_node: int | None = Field(default=None, gt=0)
    """Devices per node of the run; empty: every rank in one node."""
    step_s: float | None = Field(default=None, gt=0)
    """Measured step time, seconds (of one attention layer or of whatever the rows share:
    rankings and ratios need only a common unit, the absolute fit the attention layer's)."""
    step_ms: float | None = Field(default=None, gt=0)
    """The same in milliseconds (give one of step_s and step_ms)."""
    compute_only_s: float | None = Field(default=None, gt=0)
    """Measured time with communication removed, seconds, when known."""
    comm_only_s: float | None = Field(default=None, gt=0)
    """Measured communication alone, seconds, when known."""
    hardware: str = ""
    """The machine, to group results by (e.g. `8x H800 NVLink`); empty: the gpu."""
    profile: str = ""
    """The built-in profile to start from when no profile describes the gpu (e.g. `a100-80gb`
    for an A800, an A100 whose NVLink runs at 400 of the A100's 600 GB/s); empty: chosen by
    the gpu. The rows of one machine name one profile."""
    source: str = ""
    """Where the row comes from (a URL, a file and line)."""

    @model_validator(mode="after")
    def _one_step_time(self) -> TableRow:
        if (self.step_s is None) == (self.step_ms is None):
            raise ValueError(
                f"give exactly one of step_s and step_ms, got step_s={self.step_s}, "
                f"step_ms={self.step_ms}"
            )
        return self

    @property
    def seconds(self) -> float:
        """The step time in seconds."""
        return self.step_s if self.step_s is not None else float(self.step_ms or 0.0) / 1e3

    def candidate(self) -> MeshCandidate:
        """The configuration measured (CpbenchError when infeasible)."""
        documents = (
            tuple(int(x) for x in self.documents.split("+")) if self.documents else None
        )
        return MeshCandidate(
            seq_len=self.seq_len, batch=self.batch, heads=self.heads, kv_heads=self.kv_heads,
            head_dim=self.head_dim, ulysses=self.ulysses, ring=self.ring,
            layout=self.layout if self.ring > 1 else "contiguous", dtype=self.dtype,
            causal=self.mask == "causal", phase=self.phase, documents=documents,
            window=self.window, cp_comm=self.exchange if self.ring > 1 else "p2p",
            heads_k_stride=self.heads_k_stride if self.ring > 1 else None,
        ).require_feasible()  # fmt: skip

    def measurement(self, row_id: str) -> Measurement:
        """The row as a Measurement."""
        candidate = self.candidate()
        world = candidate.ulysses * candidate.ring
        cpu = self.gpu.strip().lower() == "cpu"
        return Measurement(
            row_id,
            candidate,
            self.devices_per_node or world,
            self.seconds,
            self.compute_only_s,
            self.comm_only_s,
            "cpu" if cpu else "cuda",
            () if cpu else (self.gpu.strip(),),
        )


def _clean(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A row with empty cells dropped (a CSV's missing optional value)."""
    return {k.strip(): v for k, v in raw.items() if k and v is not None and str(v).strip() != ""}


def _error_text(error: Any) -> str:
    """One pydantic error as `field: rule, got value`."""
    if not error["loc"]:
        return str(error["msg"]).removeprefix("Value error, ")
    field = ".".join(str(x) for x in error["loc"])
    return f"{field}: {error['msg']}, got {error.get('input')!r}"


def is_table(path: Path) -> bool:
    """Whether a file is a table: a .csv, or a .jsonl whose first row has no `config` (a file
    that cannot be read is left to the results reader to name)."""
    if path.suffix == ".csv":
        return True
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    try:
        text = read_text(path, "table")
        line = next((line for line in text.splitlines() if line.strip()), "")
        first = loads_json(line, str(path))
    except ValueError:  # CpbenchError, JSONDecodeError
        return False
    return isinstance(first, dict) and "config" not in first and (
        "step_s" in first or "step_ms" in first
    )


def read_table_rows(path: Path) -> list[tuple[str, TableRow]]:
    """(row id, row) of a table file; CpbenchError naming the file, row (the line of the file)
    and field on a bad value or an infeasible configuration."""
    text = read_text(path, "table")
    numbered: list[tuple[int, dict[str, Any]]] = []
    if path.suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))
        try:
            numbered = [(index + 2, _clean(r)) for index, r in enumerate(reader)]  # 1: header
        except csv.Error as exc:
            raise CpbenchError(f"{path} line {reader.line_num}: not CSV ({exc})") from None
    else:
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                data = loads_json(line, f"{path} line {number}")
            except json.JSONDecodeError as exc:
                raise CpbenchError(f"{path} line {number}: not JSON ({exc.msg})") from exc
            if not isinstance(data, dict):
                raise CpbenchError(
                    f"{path} line {number}: a table row must be a JSON object, "
                    f"not {type(data).__name__}"
                )
            numbered.append((number, _clean(data)))
    out = []
    for number, raw in numbered:
        where = f"{path} row {number}"
        try:
            row = TableRow.model_validate(raw)
            row.candidate()
        except ValidationError as exc:
            problems = "; ".join(_error_text(e) for e in exc.errors())
            raise CpbenchError(f"{where}: {problems}") from exc
        except (CpbenchError, ArithmeticError) as exc:
            raise CpbenchError(f"{where}: {exc}") from exc
        except ValueError as exc:  # documents that are not lengths
            raise CpbenchError(f"{where}: documents {raw.get('documents')!r}: {exc}") from exc
        out.append((f"{path.name}:{number}", row))
    return out


def measurements_from_table(path: Path) -> list[Measurement]:
    """The Measurements of a table file (`read_table_rows`)."""
    return [row.measurement(row_id) for row_id, row in read_table_rows(path)]
