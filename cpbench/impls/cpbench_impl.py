"""cpbench's own schemes behind the adapter protocol (for code that treats every impl alike;
`cpbench.bench.measure` keeps its direct path for cpbench, with the compute-only and
communication-only variants)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpbench.attention import build_mesh, cp_attention, shard, unshard
from cpbench.attention.mesh import CPMesh
from cpbench.config.bench import BenchConfig
from cpbench.impls.base import AdapterDefaults, NoStepContext


@dataclass(frozen=True)
class CpbenchRunner(NoStepContext):
    mesh: CPMesh
    config: BenchConfig

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        return shard(x, self.mesh, self.config.layout, mask=self.config.mask)

    def unshard(self, local: torch.Tensor) -> torch.Tensor:
        return unshard(local, self.mesh, self.config.layout, mask=self.config.mask)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        c = self.config
        return cp_attention(
            q,
            k,
            v,
            self.mesh,
            layout=c.layout,
            kernel=c.kernel,
            kv_replication=c.kv_replication,
            mask=c.mask,
        )


@dataclass(frozen=True)
class CpbenchAdapter(AdapterDefaults):
    """No capability rule: cpbench's rules are the mesh feasibility itself (check_mesh)."""

    name: str = "cpbench"

    def version(self) -> str | None:
        from cpbench import __version__  # noqa: PLC0415

        return __version__

    def prepare(self, config: BenchConfig) -> CpbenchRunner:
        return CpbenchRunner(build_mesh(config.ulysses, config.ring), config)
