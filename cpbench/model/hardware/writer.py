"""Writing a hardware profile back as the TOML file `file_schema.profile_from_dict` reads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from cpbench.files import write_atomically
from cpbench.model.hardware.file_schema import PROFILE_SCHEMA_VERSION
from cpbench.model.hardware.profile import HardwareProfile, LinkCost
from cpbench.units import GB


def _round(value: float) -> float:
    """Six significant digits: what a written profile keeps of a (fitted) number."""
    return float(f"{value:.6g}")


def profile_document(profile: HardwareProfile) -> dict[str, Any]:
    """The profile as the TOML document `profile_from_dict` reads (numbers rounded to 6
    digits; keys absent where the profile has nothing)."""

    def cost(c: LinkCost) -> dict[str, Any]:
        return {
            "latency_us": _round(c.latency_s * 1e6),
            "busbw_GBps": _round(c.busbw / GB),
            "source": c.source,
        } | ({} if c.fit_residual is None else {"fit_residual": _round(c.fit_residual)})

    document: dict[str, Any] = {
        "schema_version": PROFILE_SCHEMA_VERSION,
        "name": profile.name,
        "description": profile.description,
        "devices_per_node": profile.devices_per_node,
    }
    if profile.compute_slots_per_node is not None:
        document["compute_slots_per_node"] = profile.compute_slots_per_node
    document["device"] = {"kind": profile.device_kind, "names": list(profile.device_names)}
    document["memory"] = {
        "capacity_gib": _round(profile.memory_gib),
        "bandwidth_GBps": _round(profile.memory_bandwidth / GB),
        "source": profile.memory_source,
    }
    document["peak_tflops"] = {
        **{dtype: _round(peak) for dtype, peak in sorted(profile.peak_tflops.items())},
        "source": profile.peak_source,
    }
    document["efficiency"] = {
        "default": profile.default_kernel,
        "source": profile.default_kernel_source,
        **{
            family: {
                "seq_len": list(curve.seq_lens),
                "efficiency": [_round(v) for v in curve.values],
                "source": curve.source,
            }
            for family, curve in profile.curves.items()
        },
    }
    document["overheads"] = {
        "step_overhead_us": _round(profile.step_overhead_s * 1e6),
        "overlap": _round(profile.overlap),
        "source": profile.overheads_source,
    }
    document["links"] = {
        tier.tier: {
            "name": tier.name,
            "devices_per_nic": tier.devices_per_nic,
            "all_to_all": cost(tier.all_to_all),
            "send_recv": cost(tier.send_recv),
        }
        for tier in (profile.intra_node, profile.inter_node)
    }
    if profile.topology is not None:
        document["topology"] = {
            "source": profile.topology.source,
            "tiers": [
                {
                    "kind": t.kind,
                    "island": t.island,
                    "name": t.name,
                    "peer_to_peer": t.peer_to_peer,
                    "all_to_all": cost(t.all_to_all),
                    "send_recv": cost(t.send_recv),
                }
                for t in profile.topology.tiers
            ],
        }
    if profile.calibration is not None:
        c = profile.calibration
        document["calibration"] = {
            "prior": c.prior,
            "points": c.points,
            "residual": _round(c.residual),
            "files": list(c.files),
        }
    return document


def profile_to_toml(profile: HardwareProfile, header: str = "") -> str:
    """The profile as TOML that `load_profile` reads back (numbers rounded to 6 digits), after
    `header` as comment lines."""
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comments + tomli_w.dumps(profile_document(profile))


def save_profile(
    profile: HardwareProfile, path: str | Path, header: str = "", inputs: Sequence[str | Path] = ()
) -> Path:
    """Write the profile as TOML (never over one of `inputs`, what it was fitted to);
    CpbenchError when the file cannot be written."""
    return write_atomically(path, profile_to_toml(profile, header), "hardware profile", inputs)
