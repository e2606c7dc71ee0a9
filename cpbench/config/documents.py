"""Where packed documents come from: explicit lengths, a file of lengths, or a seeded
distribution, packed into one sequence. The sources: docs/design.md section 1. Pure Python."""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path
from typing import Literal, get_args

from cpbench.config.constraints import is_int
from cpbench.errors import CpbenchError
from cpbench.reading import loads_json, read_text

Distribution = Literal["lognormal", "powerlaw", "uniform"]
DISTRIBUTIONS: tuple[Distribution, ...] = get_args(Distribution)
_PARAMETERS: dict[str, tuple[str, ...]] = {
    "lognormal": ("mean", "sigma", "max", "min"),
    "powerlaw": ("alpha", "min", "max"),
    "uniform": ("min", "max"),
}


def pack_lengths(lengths: list[int], seq_len: int, source: str) -> tuple[int, ...]:
    """Fill one sequence of `seq_len` tokens with `lengths` in order, cutting the last."""
    packed: list[int] = []
    total = 0
    for length in lengths:
        if total >= seq_len:
            break
        if not is_int(length) or length <= 0:
            raise CpbenchError(
                f"document length {length!r} from {source} is not a positive integer"
            )
        take = min(length, seq_len - total)
        packed.append(take)
        total += take
    if total < seq_len:
        raise CpbenchError(
            f"the documents of {source} hold {total} tokens, fewer than the sequence length "
            f"{seq_len}: give more documents or a shorter sequence"
        )
    return tuple(packed)


def _parameters(kind: str, text: str) -> dict[str, float]:
    params: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in _PARAMETERS[kind]:
            raise CpbenchError(
                f"{kind} parameter {item!r} is not one of "
                f"{', '.join(p + '=<number>' for p in _PARAMETERS[kind])}"
            )
        try:
            params[name.strip()] = float(value)
        except ValueError:
            raise CpbenchError(
                f"{kind} parameter {name.strip()} = {value!r} is not a number"
            ) from None
    return params


def draw_lengths(
    kind: str, text: str, seq_len: int, seed: int, most: int | None = None
) -> list[int]:
    """Lengths drawn from a distribution until they hold at least `seq_len` tokens (at most
    `most` + 1 of them when given: the caller refuses more)."""
    params = _parameters(kind, text)
    rng = random.Random(seed)
    low = int(params.get("min", 1))
    high = int(params.get("max", seq_len))
    if low < 1 or high < low:
        raise CpbenchError(f"{kind}: need 1 <= min ({low}) <= max ({high})")
    if kind == "lognormal":
        mean = params.get("mean")
        if mean is None or mean <= 0:
            raise CpbenchError("lognormal needs mean=<positive number> (the mean length)")
        sigma = params.get("sigma", 1.0)
        if sigma < 0:
            raise CpbenchError(f"lognormal sigma ({sigma}) must be >= 0")
        mu = math.log(mean) - sigma * sigma / 2  # E[exp(N(mu, sigma))] = mean

        def draw() -> float:
            return rng.lognormvariate(mu, sigma)
    elif kind == "powerlaw":
        alpha = params.get("alpha")
        if alpha is None or alpha <= 0:
            raise CpbenchError("powerlaw needs alpha=<positive number> (the tail index)")

        def draw() -> float:
            return low * rng.paretovariate(alpha)
    else:

        def draw() -> float:
            return rng.uniform(low, high)

    lengths: list[int] = []
    total = 0
    while total < seq_len and (most is None or len(lengths) <= most):
        length = min(max(round(draw()), low), high)
        lengths.append(length)
        total += length
    return lengths


LENGTH_COLUMNS = ("length", "seq_len", "tokens", "num_tokens")
"""The CSV columns read as lengths, the first present (or the file's only column)."""


def _csv_lengths(path: Path, text: str) -> list[int]:
    rows = [(n, row) for n, row in enumerate(csv.reader(text.splitlines()), 1)
            if any(cell.strip() for cell in row)]  # fmt: skip
    if not rows:
        return []
    header = [h.strip() for h in rows[0][1]]
    names = [n for n in LENGTH_COLUMNS if n in header]
    if not names and len(header) != 1:
        raise CpbenchError(
            f"{path}: no length column: the header {header[:6]} names none of "
            f"{', '.join(LENGTH_COLUMNS)}"
        )
    column = header.index(names[0]) if names else 0
    if not names and header[0].isdigit():  # one column and no header: the first is a length
        rows.insert(0, (0, ["header"]))
    lengths = []
    for number, row in rows[1:]:
        cell = row[column].strip() if column < len(row) else ""
        try:
            lengths.append(int(cell))
        except ValueError:
            raise CpbenchError(f"{path}:{number}: {cell[:40]!r} is not a length") from None
    return lengths


def _read_lengths(path: Path) -> list[int]:
    text = read_text(path, "documents file")
    if path.suffix == ".csv":
        return _csv_lengths(path, text)
    if path.suffix == ".json":
        try:
            data = loads_json(text, str(path))
        except json.JSONDecodeError as exc:
            raise CpbenchError(f"{path}: not JSON ({exc})") from None
        if isinstance(data, dict):
            data = data.get("lengths")
        if not isinstance(data, list):
            raise CpbenchError(f'{path}: expected a JSON list of lengths or {{"lengths": [...]}}')
        return data
    lengths = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            lengths.append(int(line))
        except ValueError:
            shown = line if len(line) <= 40 else f"{line[:37]}... ({len(line)} characters)"
            raise CpbenchError(f"{path}:{number}: {shown!r} is not a document length") from None
    return lengths


def _source_lengths(
    source: str, tokens: int, seed: int, what: str, most: int | None = None
) -> tuple[list[int], str, bool]:
    """(the lengths of a source string, where they come from, whether they were given
    explicitly): a distribution drawn to `tokens` (at most `most` + 1 draws), a file, or
    comma-separated lengths; CpbenchError naming `what` (documents, lengths) otherwise."""
    source = source.strip()
    if not source:
        raise CpbenchError(f"{what}: empty source (lengths, a file, or a distribution)")
    kind, sep, rest = source.partition(":")
    if sep and kind in DISTRIBUTIONS:
        return draw_lengths(kind, rest, tokens, seed, most), source, False
    path = Path(source)
    if path.is_file():
        return _read_lengths(path), str(path), False
    parts = [p.strip() for p in source.split(",")]
    if all(p.isdigit() for p in parts):
        return [int(p) for p in parts], "the explicit lengths", True
    if sep:
        raise CpbenchError(
            f"{what} {source!r}: distribution {kind!r} is not one of {', '.join(DISTRIBUTIONS)}"
        )
    raise CpbenchError(
        f"{what} {source!r} is neither comma-separated lengths, an existing file, nor a "
        f"distribution ({', '.join(d + ':...' for d in DISTRIBUTIONS)})"
    )


def resolve_documents(source: str, seq_len: int, seed: int = 0) -> tuple[int, ...]:
    """The document lengths of one packed sequence of `seq_len` tokens from a source string
    (docs/design.md section 1)."""
    lengths, where, explicit = _source_lengths(source, seq_len, seed, "documents")
    if explicit and sum(lengths) != seq_len:
        raise CpbenchError(
            f"documents {source.strip()!r} sum to {sum(lengths)}, not the sequence length "
            f"{seq_len}"
        )
    return pack_lengths(lengths, seq_len, where)


MAX_BATCH_SEQUENCES = 1_000_000
"""The most sequences a global batch holds (a budget of more is refused, not drawn for ever)."""


def global_batch(source: str, tokens: int, seed: int = 0) -> tuple[int, ...]:
    """The whole sequences of one global batch: a distribution drawn until they hold at least
    `tokens` (the step's token budget), a file's lengths in order until they do (all of them
    when they hold fewer), or explicit comma-separated lengths (all of them). Never cut: unlike
    a packed sequence, a sequence of a batch is scheduled whole (docs/dynamic-cp.md)."""
    if not source.strip():
        raise CpbenchError("lengths: empty source (lengths, a file, or a distribution)")
    if tokens < 1:
        raise CpbenchError(f"the token budget per step ({tokens}) must be at least 1")
    lengths, where, explicit = _source_lengths(source, tokens, seed, "lengths",
                                               MAX_BATCH_SEQUENCES)  # fmt: skip
    batch: list[int] = []
    total = 0
    for length in lengths:
        if not is_int(length) or length <= 0:
            raise CpbenchError(f"sequence length {length!r} from {where} is not a positive integer")
        if total >= tokens and not explicit:  # explicit lengths are the batch, all of them
            break
        batch.append(length)
        total += length
        if len(batch) > MAX_BATCH_SEQUENCES:
            raise CpbenchError(f"{where} holds more than {MAX_BATCH_SEQUENCES:,} sequences "
                               f"within the step's {tokens:,} tokens: give a smaller budget")
    if not batch:
        raise CpbenchError(f"{where} holds no sequence length")
    return tuple(batch)
