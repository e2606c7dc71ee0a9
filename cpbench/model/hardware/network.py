"""The network between nodes as a plan sees it: NVLink domains that span nodes, rails, the
spine (a `Fabric`). Pure Python. The tiers: docs/plan.md, "Tiers across nodes"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cpbench.errors import CpbenchError
from cpbench.model.hardware.profile import LinkCost, LinkTierProfile

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


_GB = 1e9
_NDR = LinkTierProfile(
    "inter_node", "InfiniBand NDR / Spectrum-X 400 Gb/s per GPU (50 GB/s line rate)",
    LinkCost(50e-6, 38 * _GB, "estimate: the h100-sxm profile's inter-node all-to-all busbw "
             "(many-peer traffic below the 50 GB/s line rate)"),
    LinkCost(15e-6, 46 * _GB, "estimate: about 92% of the 400 Gb/s = 50 GB/s line rate (the "
             "h100-sxm profile's inter-node send/recv)"),
)
_NVLINK5 = LinkTierProfile(
    "intra_node", "NVLink 5 + NVLink Switch, 72-GPU domain (1.8 TB/s bidirectional per GPU)",
    LinkCost(25e-6, 720 * _GB, "estimate: 80% of the 900 GB/s per direction of the spec's "
             "1.8 TB/s bidirectional per GPU"),
    LinkCost(10e-6, 760 * _GB, "estimate: about 85% of 900 GB/s per direction"),
)

FABRICS: dict[str, Fabric] = {
    fabric.name: fabric
    for fabric in (
        Fabric(
            "hgx-rail", "HGX 8-GPU nodes, 400 Gb/s per GPU, rail-optimised leaf-spine, rail "
            "groups of 32 nodes", _NDR, None, None, True, 32, 1.0,
            "spec: NVIDIA HGX AI Factory reference architecture (https://docs.nvidia.com/"
            "reference-architectures/hgx-ai-factory-h100-h200-b200/abstract.md: 8 GPUs and 400 "
            "Gb/s per GPU, design points of 32, 64 and 128 nodes; network-logical-architecture."
            "md: 'GPUs are connected using a rail-optimized network topology'); 32-node rail "
            "groups = the smallest design point; a non-blocking spine is an estimate",
        ),
        Fabric(
            "roce-clos", "8-GPU nodes, RoCE 400 Gb/s per GPU, three-layer Clos (not rail-"
            "optimised)", _NDR, None, None, False, 1, 1.0,
            "Meta's Llama 3 cluster as summarised at https://ai-papers.xuzou.cn/papers/"
            "llama3_2024 ('RoCE fabric based on Arista 7800 and Minipack2 OCP switches', 'Both "
            "fabrics use 400 Gbps interconnects between GPUs', 'a three-layer Clos network'); "
            "rail wiring not stated there, so every cross-node flow is priced through the spine "
            "(non-blocking: an estimate)",
        ),
        Fabric(
            "nvl72", "GB200 NVL72: 72-GPU NVLink domains of 18 nodes x 4 GPUs, 400 Gb/s per "
            "GPU beyond", _NDR, 72, _NVLINK5, True, 32, 1.0,
            "spec as quoted at https://aiwiki.ai/wiki/nvidia_gb200_nvl72 ('72 Blackwell GPUs "
            "... joined into one NVLink domain', 'NVLink continuous across the whole rack at "
            "1.8 TB/s per GPU') and https://nomadterrace.com (NVIDIA's GB200 NVL72 blog "
            "summary: 1.8 TB/s bidirectional per GPU, 18 compute nodes); the NIC beyond the "
            "rack is taken as 400 Gb/s per GPU (estimate, not read)",
        ),
    )
}
"""Built-in fabrics, by name."""


def load_fabric(name: str) -> Fabric:
    """A built-in fabric; CpbenchError listing them otherwise."""
    if name not in FABRICS:
        raise CpbenchError(f"fabric {name!r} is not one of {', '.join(FABRICS)}")
    return FABRICS[name]
