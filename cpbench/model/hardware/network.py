"""The network between nodes as a plan sees it: NVLink domains that span nodes, rails, the
spine (a `Fabric`). Pure Python. The tiers: docs/plan.md, "Tiers across nodes"."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from pydantic import TypeAdapter

from cpbench.config.file_schema import FileModel
from cpbench.errors import CpbenchError
from cpbench.model.hardware.profile import LinkCost, LinkTierProfile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

NetworkTier = Literal["node", "nvlink_domain", "rail", "network"]
"""Which link a group's traffic crosses (docs/plan.md, "Tiers across nodes")."""


@dataclass(frozen=True)
class Fabric:
    """How the nodes of a cluster are wired (docs/plan.md, "Tiers across nodes")."""

    name: str
    """Short name."""
    description: str
    """One line."""
    network: LinkTierProfile
    """The per-GPU NIC link (busbw per NIC; `devices_per_nic` GPUs share one)."""
    nvlink_domain: int | None = None
    """GPUs joined by NVLink across nodes (None: the node is the NVLink domain)."""
    nvlink: LinkTierProfile | None = None
    """The domain's NVLink link (with `nvlink_domain`)."""
    rail_optimised: bool = True
    """Whether GPU k of every node of a rail group shares leaf switch k."""
    rail_group_nodes: int = 32
    """Nodes of a rail group (a scalable unit): same-rail traffic inside it crosses one leaf."""
    spine_factor: float = 1.0
    """Bandwidth through the spine / through a leaf (1 = non-blocking, < 1 oversubscribed)."""
    source: str = ""
    """Where the layout and numbers come from."""

    def __post_init__(self) -> None:
        if self.nvlink_domain is not None and self.nvlink is None:
            raise CpbenchError(f"fabric {self.name}: an NVLink domain needs its nvlink link")
        if not 0 < self.spine_factor <= 1:
            raise CpbenchError(f"fabric {self.name}: spine_factor must be in (0, 1], got "
                               f"{self.spine_factor}")
        if self.rail_group_nodes < 1:
            raise CpbenchError(f"fabric {self.name}: rail_group_nodes must be >= 1, got "
                               f"{self.rail_group_nodes}")

    def spine(self) -> LinkTierProfile:
        """The NIC link through the spine (busbw x spine_factor)."""
        if self.spine_factor == 1:
            return self.network

        def scaled(c: LinkCost) -> LinkCost:
            return LinkCost(c.latency_s, c.busbw * self.spine_factor,
                            f"{c.source}; x {self.spine_factor:g} through the spine")

        n = self.network
        return LinkTierProfile(n.tier, f"{n.name} through the spine", scaled(n.all_to_all),
                               scaled(n.send_recv), n.devices_per_nic)


class _FabricTable(FileModel):
    """`[fabrics.NAME]`: one fabric (`Fabric`); `network` and `nvlink` name `[links]` tables."""

    description: str
    network: str
    nvlink_domain: int | None = None
    nvlink: str | None = None
    rail_optimised: bool = True
    rail_group_nodes: int = 32
    spine_factor: float = 1.0
    source: str = ""


class FabricsFile(FileModel):
    """`cpbench/data/fabrics/fabrics.toml`: the built-in fabrics and the links they name."""

    links: dict[str, dict[str, Any]]
    """Links by name (`LinkTierProfile` tables)."""
    fabrics: dict[str, _FabricTable]
    """Fabrics by name."""


def _load_fabrics() -> dict[str, Fabric]:
    path = resources.files("cpbench") / "data" / "fabrics" / "fabrics.toml"
    spec = FabricsFile.model_validate(tomllib.loads(path.read_text("utf-8")))
    link = TypeAdapter(LinkTierProfile)
    links = {name: link.validate_python(t, by_name=True) for name, t in spec.links.items()}
    return {
        name: Fabric(name, f.description, links[f.network], f.nvlink_domain,
                     links[f.nvlink] if f.nvlink is not None else None, f.rail_optimised,
                     f.rail_group_nodes, f.spine_factor, f.source)
        for name, f in spec.fabrics.items()
    }


FABRICS = _load_fabrics()
"""Built-in fabrics, by name."""


def load_fabric(name: str) -> Fabric:
    """A built-in fabric; CpbenchError listing them otherwise."""
    if name not in FABRICS:
        raise CpbenchError(f"fabric {name!r} is not one of {', '.join(FABRICS)}")
    return FABRICS[name]
