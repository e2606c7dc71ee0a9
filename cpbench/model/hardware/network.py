"""The network between nodes as a plan sees it: NVLink domains that span nodes, rails, the
spine (a `Fabric`). Pure Python. The tiers: docs/plan.md, "Tiers across nodes"."""

from __future__ import annotations

import sys
from importlib import resources
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationInfo, model_validator
from pydantic.dataclasses import dataclass

from cpbench.errors import CpbenchError
from cpbench.model.hardware.profile import CONFIG, LinkCost, LinkTierProfile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

NetworkTier = Literal["node", "nvlink_domain", "rail", "network"]
"""Which link a group's traffic crosses (docs/plan.md, "Tiers across nodes")."""


@dataclass(frozen=True, config=CONFIG)
class Fabric:
    """How the nodes of a cluster are wired (docs/plan.md, "Tiers across nodes"); a
    `[fabrics.NAME]` table of cpbench/data/fabrics/fabrics.toml, its links named."""

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

    @model_validator(mode="before")
    @classmethod
    def _named_links(cls, data: Any, info: ValidationInfo) -> Any:
        """In the file, `network` and `nvlink` name tables of `[links]` (context "links")."""
        links = info.context.get("links", {}) if isinstance(info.context, dict) else {}
        if not isinstance(data, dict):
            return data
        return {**data, **{k: links[v] for k, v in data.items() if k in ("network", "nvlink")}}

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


def _load_fabrics() -> dict[str, Fabric]:
    path = resources.files("cpbench") / "data" / "fabrics" / "fabrics.toml"
    data = tomllib.loads(path.read_text("utf-8"))
    links = TypeAdapter(dict[str, LinkTierProfile]).validate_python(data["links"], by_name=True)
    fabrics = {name: {**table, "name": name} for name, table in data["fabrics"].items()}
    return TypeAdapter(dict[str, Fabric]).validate_python(fabrics, context={"links": links})


FABRICS = _load_fabrics()
"""Built-in fabrics, by name."""


def load_fabric(name: str) -> Fabric:
    """A built-in fabric; CpbenchError listing them otherwise."""
    if name not in FABRICS:
        raise CpbenchError(f"fabric {name!r} is not one of {', '.join(FABRICS)}")
    return FABRICS[name]
