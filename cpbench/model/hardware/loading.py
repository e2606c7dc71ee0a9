"""Finding a hardware profile: the built-ins (`cpbench/data/hardware/*.toml`) by name, a TOML
file by path, and the profile for a set of devices (`choose_profile`, cpbench's one rule)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from cpbench.errors import CpbenchError
from cpbench.model.hardware.file_schema import profile_from_toml
from cpbench.model.hardware.profile import HardwareProfile
from cpbench.reading import read_text

CPU_PROFILE = "cpu-local"
"""The profile of ranks that run on CPU."""
FALLBACK_GPU_PROFILE = "h100-sxm"
"""The profile of GPU records whose device no built-in profile matches (with a warning)."""


def _data_dir() -> Any:
    return resources.files("cpbench") / "data" / "hardware"


def builtin_profiles() -> tuple[str, ...]:
    """Names of the profiles shipped with cpbench, sorted."""
    names = (p.name for p in _data_dir().iterdir())
    return tuple(sorted(n.removesuffix(".toml") for n in names if n.endswith(".toml")))


@functools.cache
def _builtin(name: str) -> HardwareProfile:
    """A built-in profile, read once (what `profile_for_devices` matches)."""
    return load_profile(name)


def profile_for_devices(device_names: Sequence[str]) -> str | None:
    """The built-in profile that describes every one of these device names (as records'
    `environment.devices` or torch.cuda.get_device_name spell them: 'NVIDIA H100 80GB HBM3' ->
    h100-sxm, 'NVIDIA H200' -> h200-sxm, 'NVIDIA A100-SXM4-80GB' -> a100-80gb, 'NVIDIA L40S'
    -> l40s-pcie, 'cpu: ...' -> cpu-local); None when none or more than one does (or no name
    is given). The device-name step of `choose_profile`."""
    names = [str(n) for n in device_names if str(n).strip()]
    if not names:
        return None
    matches = [
        name
        for name in builtin_profiles()
        if all(_builtin(name).matches_device(device) for device in names)
    ]
    return matches[0] if len(matches) == 1 else None


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A built-in profile by name, or a TOML file by path; CpbenchError naming the choices."""
    text = str(name_or_path)
    names = builtin_profiles()
    if text in names:
        resource = _data_dir().joinpath(f"{text}.toml")
        return profile_from_toml(resource.read_text(encoding="utf-8"), origin="built-in")
    path = Path(text).expanduser()
    if path.is_file():
        return profile_from_toml(read_text(path, "hardware profile"), str(path), name=text)
    raise CpbenchError(
        f"hardware {text!r} is neither a built-in profile ({', '.join(names)}) "
        f"nor an existing TOML file"
    )


@dataclass(frozen=True)
class ProfileChoice:
    """The profile for some devices (`choose_profile`), and why."""

    name: str
    """A built-in profile's name, or the name or path given."""
    reason: str
    """Why it was chosen, in one sentence."""
    warning: str | None = None
    """Set when no built-in profile describes the devices (the fallback was taken)."""


def choose_profile(
    device_names: Sequence[str],
    *,
    cpu: bool = False,
    given: str | None = None,
    subject: str = "the records",
    names_from: str = "environment.devices",
) -> ProfileChoice:
    """The profile for these devices, the one rule of cpbench (calibrate, probe, recommend,
    report): the one `given` (--hardware); cpu-local when the ranks run on CPU; the built-in
    profile that describes every device name (`profile_for_devices`); else h100-sxm with a
    warning. `subject` (what ran) and `names_from` (where the names come from) word the why."""
    if given:
        return ProfileChoice(given, "given with --hardware")
    if cpu:
        return ProfileChoice(CPU_PROFILE, f"{subject} were measured on CPU")
    names = sorted(set(device_names))
    quoted = ", ".join(repr(n) for n in names)
    matched = profile_for_devices(names)
    if matched is not None:
        return ProfileChoice(matched, f"{subject} name {quoted}")
    if names:
        problem = f"no built-in hardware profile describes {quoted} ({names_from})"
    else:
        problem = f"{subject} name no device ({names_from})"
    return ProfileChoice(
        FALLBACK_GPU_PROFILE,
        f"fallback: {problem}",
        f"{problem}: starting from {FALLBACK_GPU_PROFILE}; pass --hardware NAME|PATH with a "
        f"profile of this GPU",
    )
