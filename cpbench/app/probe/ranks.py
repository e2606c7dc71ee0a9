"""What every rank of a probe runs (`probe_on_rank`), as nccl-tests does: time per call =
median over repetitions of the max over ranks (each repetition starts at a barrier:
`cpbench.bench.timing.time_iterations`), the repetitions fitted to the budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpbench.app.probe.plan import KernelTest, ProbePlan
from cpbench.config.vocabulary import DTYPE_BYTES

MIN_ITERS = 5
"""Timed repetitions of one collective at least (the median of 5)."""
MAX_ITERS = 30
"""Timed repetitions of one collective at most."""
MIN_REPS = 1
"""Timed kernel calls of one shape at least (after one warm-up call)."""
MAX_REPS = 5
"""Timed kernel calls of one shape at most."""


@dataclass(frozen=True)
class RankResult:
    """What one rank returns: the max-over-ranks samples (the same on every rank) and its
    environment."""

    comm: tuple[tuple[float, ...], ...]
    """Per comm test, the seconds of each timed repetition (max over ranks)."""
    kernel: tuple[tuple[float, ...], ...]
    """Per kernel test, the seconds of each timed call (max over the computing ranks); empty
    on ranks that do not compute."""
    hostname: str
    device_name: str
    """Its device ('cpu: <model>' or the GPU's name)."""


def _budgeted(estimate: float, budget: float, low: int, high: int) -> int:
    if estimate <= 0:
        return high
    return int(min(high, max(low, budget // estimate)))


def probe_on_rank(plan: ProbePlan, comm_budget_s: float, kernel_budget_s: float) -> RankResult:
    """Every rank: time the plan's collectives, then (the first `kernel_ranks` ranks) its
    kernel shapes. Collective over the default group: every rank runs the same tests in the
    same order, and the repetition counts come from max-over-ranks times (the same on every
    rank), so the collectives stay matched."""
    import torch  # noqa: PLC0415 - runs in the ranks
    import torch.distributed as dist  # noqa: PLC0415

    from cpbench.attention.comm import all_to_all, ring_exchange  # noqa: PLC0415
    from cpbench.attention.kernels import default_scale, select_kernel  # noqa: PLC0415
    from cpbench.attention.mesh import build_mesh  # noqa: PLC0415
    from cpbench.bench.environment import rank_environment  # noqa: PLC0415
    from cpbench.bench.timing import time_iterations  # noqa: PLC0415

    settings = plan.settings
    cuda = settings.device == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = getattr(torch, settings.dtype)
    element = DTYPE_BYTES[settings.dtype]
    comm_samples: list[tuple[float, ...]] = []
    remaining = comm_budget_s
    for index, test in enumerate(plan.comm_tests):
        mesh = build_mesh(test.ulysses, test.ring)
        elements = test.size_bytes // element
        if test.kind == "all_to_all":
            x = torch.ones(test.ulysses, elements // test.ulysses, dtype=dtype, device=device)

            def step(x: Any = x, mesh: Any = mesh) -> object:
                return all_to_all(x, mesh.ulysses_group, mesh.ulysses, "probe")

        else:
            x = torch.ones(elements, dtype=dtype, device=device)

            def step(x: Any = x, mesh: Any = mesh) -> object:
                return ring_exchange(
                    x, mesh.ring_next, mesh.ring_prev, mesh.ring_group, "probe"
                ).wait()

        first = time_iterations(step, 1, 1, device)[0]
        share = remaining / (len(plan.comm_tests) - index)
        iters = _budgeted(first, share, MIN_ITERS, MAX_ITERS)
        samples = time_iterations(step, 0, iters, device)
        remaining -= first + sum(samples)
        comm_samples.append(tuple(samples))
    rank = dist.get_rank()
    ranks = plan.kernel_ranks
    group = None if ranks >= settings.world_size else dist.new_group(list(range(ranks)))
    kernel_samples: list[tuple[float, ...]] = []
    if rank < ranks:
        kernel = select_kernel(device, dtype, settings.kernel)
        generator = torch.Generator(device="cpu").manual_seed(rank)
        remaining = kernel_budget_s
        backward = settings.phase == "fwd+bwd"
        for index, shape in enumerate(plan.kernel_tests):
            scale = default_scale(shape.head_dim)

            def tensor(heads: int, shape: KernelTest = shape) -> Any:
                size = (shape.batch, shape.seq_len, heads, shape.head_dim)
                t = torch.randn(size, generator=generator, dtype=torch.float32)
                return t.to(device=device, dtype=dtype)

            q, dout = tensor(shape.heads), tensor(shape.heads)
            k, v = tensor(shape.kv_heads), tensor(shape.kv_heads)

            def call(
                q: Any = q, k: Any = k, v: Any = v, dout: Any = dout, scale: float = scale
            ) -> object:
                out, lse = kernel.forward(q, k, v, True, scale)
                if backward:
                    return kernel.backward(dout, q, k, v, out, lse, True, scale)
                return out

            first = time_iterations(call, 0, 1, device, group=group)[0]
            share = remaining / (len(plan.kernel_tests) - index)
            reps = _budgeted(first, share - first, MIN_REPS, MAX_REPS)
            samples = time_iterations(call, 0, reps, device, group=group)
            remaining -= first + sum(samples)
            kernel_samples.append(tuple(samples))
            del q, k, v, dout
    dist.barrier()
    env = rank_environment(settings.device)
    return RankResult(
        tuple(comm_samples), tuple(kernel_samples), str(env["hostname"]), str(env["device"])
    )
