"""Reading scenarios: a parsed TOML document (`parse_scenario`), a file by path, a built-in
(`cpbench/data/*.toml`) or a ./scenarios name (`load_scenario`), and the default sweep of a
device. Pure Python (no torch)."""

from __future__ import annotations

import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cpbench.config.documents import DISTRIBUTIONS
from cpbench.config.vocabulary import DEVICES, INFERENCE_PHASES
from cpbench.errors import CpbenchError
from cpbench.reading import loads_toml, read_text
from cpbench.results.scenarios.file_schema import (
    INFERENCE_AXES,
    TRAINING_STEP_AXES,
    ScenarioAxes,
    ScenarioFile,
)
from cpbench.results.scenarios.messages import scenario_error
from cpbench.results.scenarios.scenario import Scenario, resolved_documents

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_WORLD_SIZE = 2**20
"""Most ranks a scenario may name (a world of 10**400 would take forever to factorize)."""
BUILTIN = "<builtin>"
"""`Scenario.source` of a scenario shipped inside the package (`cpbench/data/*.toml`)."""


def parse_scenario(data: dict, source: str) -> Scenario:
    """Build and validate a scenario from a parsed TOML document; `source` names the file in
    error messages."""
    try:
        spec = ScenarioFile.model_validate(data)
    except ValidationError as exc:
        raise scenario_error(exc, source) from None
    scenario = _scenario(spec, spec.axes or ScenarioAxes.model_construct(heads=()), source)
    extras = []
    for number, override in enumerate(spec.also, 1):
        where = f"{source} ([[also]] table {number})"
        merged = _merged_axes(data.get("axes") or {}, override)
        try:
            axes = ScenarioFile.model_validate({**data, "axes": merged, "also": []}).axes
        except ValidationError as exc:
            raise scenario_error(exc, where) from None
        assert axes is not None  # [[also]] needs [axes] (ScenarioFile)
        extras.append(_scenario(spec, axes, where, base=source))
    return scenario.model_copy(update={"also": tuple(extras)})


def _merged_axes(axes: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """[axes] with an [[also]] table's keys replacing them (naming kv_heads or gqa_ratio
    replaces both; naming an inference phase drops the training step's axes it does not set,
    and the other inference phase's (scheme, cache_layout); naming a training phase drops the
    inference axes)."""
    merged = dict(axes)
    if "kv_heads" in override or "gqa_ratio" in override:
        merged.pop("kv_heads", None)
        merged.pop("gqa_ratio", None)
    if "phase" in override:
        phase = override["phase"]
        phases = phase if isinstance(phase, list) else [phase]
        inference = any(p in INFERENCE_PHASES for p in phases)
        dropped = list(TRAINING_STEP_AXES if inference else INFERENCE_AXES)
        dropped += [k for k, p in (("scheme", "prefill"), ("cache_layout", "decode"))
                    if inference and p not in phases]
        for key in dropped:
            if key not in override:
                merged.pop(key, None)
    merged.update(override)
    return merged


def _scenario(
    spec: ScenarioFile, axes: ScenarioAxes, source: str, base: str | None = None
) -> Scenario:
    """The scenario of a validated file and one set of axes (`source` names it in messages,
    `base` is the file when that differs); its documents are resolved once for every sequence
    length (an error names the file and the key)."""
    documents = tuple(
        None if d is None else _document_path(d, base or source) for d in axes.documents
    )
    for d in documents:
        for seq_len in (axes.seq_len or ()) if d is not None else ():
            try:
                resolved_documents(d, seq_len, spec.seed)
            except CpbenchError as exc:
                raise CpbenchError(f"{source}: key 'documents': {exc}") from None
    values = {key: value for key, value in [*spec, *axes] if key not in ("axes", "also")}
    values["name"] = spec.name if spec.name is not None else _default_name(source)
    values["source"], values["documents"] = source, documents
    values["has_axes"] = bool(axes.heads)  # an [axes] table has heads; no table: none
    if spec.dynamic is not None:
        values["dynamic_lengths"] = _document_path(spec.dynamic.lengths, base or source)
    if axes.kv_heads is None and axes.gqa_ratio is None:
        values["gqa_ratio"] = (1,)
    scenario = Scenario.model_construct(**values)  # validated already
    if scenario.world_size != "auto":
        if scenario.world_size > MAX_WORLD_SIZE:
            raise CpbenchError(
                f"{source}: key 'world_size': {scenario.world_size} ranks is more than "
                f"{MAX_WORLD_SIZE} (the most a scenario may name)"
            )
        if scenario.has_axes:  # a mesh that does not fit is an error in the file
            scenario.meshes(scenario.world_size)
        device = scenario.device if scenario.device != "auto" else "cpu"
        scenario.dynamic_study(device, scenario.world_size)  # a batch that does not fit too
    if scenario.dynamic is not None:
        from cpbench.model.hardware.loading import load_profile  # noqa: PLC0415

        try:
            load_profile(scenario.dynamic.hardware or "cpu-local")
        except CpbenchError as exc:
            raise CpbenchError(f"{source}: key 'hardware' in [dynamic]: {exc}") from None
    return scenario


def _document_path(source: str, scenario_source: str) -> str:
    """A document file named relative to the scenario file, as a path from here; any other
    source as given."""
    kind = source.partition(":")[0]
    if kind in DISTRIBUTIONS or Path(source).is_absolute() or scenario_source.startswith("<"):
        return source
    beside = Path(scenario_source).parent / source
    return str(beside) if beside.is_file() and not Path(source).is_file() else source


def _default_name(source: str) -> str:
    """The file's stem made a plain name (`SCENARIO_NAME`: it names the output file and is
    printed): any other character becomes '-'."""
    if source == BUILTIN:
        return "unnamed"
    plain = re.sub(r"[^A-Za-z0-9._+-]", "-", Path(source).stem).lstrip("._+-")[:100]
    return plain or "unnamed"


def _builtin_dir() -> Any:
    return resources.files("cpbench") / "data"


def available_scenarios() -> list[str]:
    """Names `load_scenario` accepts: built-in ones, then those in ./scenarios."""
    names = sorted(
        p.name[: -len(".toml")] for p in _builtin_dir().iterdir() if p.name.endswith(".toml")
    )
    local = Path("scenarios")
    if local.is_dir():
        names += sorted(p.stem for p in local.glob("*.toml") if p.stem not in names)
    return names


def _parse_text(text: str, source: str) -> Scenario:
    try:
        data = loads_toml(text, f"{source}: invalid TOML")
    except tomllib.TOMLDecodeError as exc:
        raise CpbenchError(f"{source}: invalid TOML: {exc}") from None
    return parse_scenario(data, source)


def load_scenario(name_or_path: str) -> Scenario:
    """Load a scenario from a .toml path, or by name: the package's built-in
    `cpbench/data/<name>.toml` first, then `scenarios/<name>.toml` under the current directory."""
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or "/" in name_or_path or path.is_file():
        if not path.is_file():
            raise CpbenchError(f"{name_or_path}: no such scenario file")
        return _parse_text(read_text(path, "scenario file"), name_or_path)
    builtin = _builtin_dir() / f"{name_or_path}.toml"
    if builtin.is_file():
        return _parse_text(builtin.read_text(encoding="utf-8"), BUILTIN)
    local = Path("scenarios") / f"{name_or_path}.toml"
    if local.is_file():
        return _parse_text(read_text(local, "scenario file"), str(local))
    raise CpbenchError(
        f"unknown scenario {name_or_path!r}; available: {', '.join(available_scenarios())} "
        f"(or give a path to a .toml file)"
    )


def default_scenario(device: str) -> Scenario:
    """The built-in sweep for a machine: cpu-smoke on cpu, gpu-node on cuda."""
    if device not in DEVICES:
        raise CpbenchError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    return load_scenario("cpu-smoke" if device == "cpu" else "gpu-node")
