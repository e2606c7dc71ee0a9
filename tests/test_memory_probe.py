"""The CPU tensor-allocation tracker: counts storages created by the step, not views of the
inputs, and frees what dies."""

from __future__ import annotations

import torch

from cpbench.bench.memory import measure_peak_memory

MIB = 2**20


def test_views_of_inputs_are_not_new_memory() -> None:
    q = torch.randn(256, 1024)  # 1 MiB
    cpu = torch.device("cpu")
    assert measure_peak_memory(lambda: q.unsqueeze(0)[:, :10], cpu, (q,)).peak_bytes == MIB
    assert measure_peak_memory(lambda: q * 2, cpu, (q,)).peak_bytes == 2 * MIB


def test_peak_counts_temporaries_that_die_before_the_end() -> None:
    q = torch.randn(256, 1024)

    def step() -> torch.Tensor:
        a = q * 2  # +1 MiB
        b = a.exp()  # +1 MiB while a is alive: peak 3 MiB with q
        del a
        return b.sum()

    record = measure_peak_memory(step, torch.device("cpu"), (q,))
    assert record.peak_bytes == 3 * MIB  # q, a and b at once; the sum comes after a died
    assert record.source == "cpu-tensor-tracker"
    assert record.rss_peak_bytes is None or record.rss_peak_bytes > MIB


def test_cpu_record_names_its_sources_and_has_no_gpu_numbers() -> None:
    q = torch.randn(256, 1024)
    record = measure_peak_memory(lambda: q * 2, torch.device("cpu"), (q,))
    assert record.reserved_peak_bytes is None and record.nvml_process_peak_bytes is None
    assert set(record.sources) == {"peak_bytes", "rss_peak_bytes"}
    assert record.sources["peak_bytes"].startswith("cpu-tensor-tracker")
    expected_rss = "VmHWM" if record.rss_peak_bytes is not None else "unavailable"
    assert expected_rss in record.sources["rss_peak_bytes"]


def test_the_tracker_is_not_wrapped_to_skip_dynamo() -> None:
    """torch 2.13 wraps a dispatch mode's `__torch_dispatch__` in `torch._disable_dynamo`
    unless the mode opts out; the wrapper's first call imports torch._dynamo (3.7 s idle, 17 s
    on a loaded machine), which made the first configuration of a fresh rank time out under
    load. The tracker opts out (nothing compiles inside it): its handler is its own function."""
    from cpbench.bench.memory import TensorAllocationTracker  # noqa: PLC0415

    handler = TensorAllocationTracker.__dict__["__torch_dispatch__"]
    assert not hasattr(handler, "__wrapped__")
    assert handler.__qualname__ == "TensorAllocationTracker.__torch_dispatch__"


def test_pool_ranks_keep_their_startup_objects_out_of_the_collector(pool) -> None:  # type: ignore[no-untyped-def]
    """Each configuration's `release_cached_memory` runs a full collection; a rank freezes
    what its imports made (torch's objects: over 100,000) first, so the collection walks only
    what came after (before: every rank walked them all, 90 ms a configuration). What it walks
    depends on the session's earlier tasks (their caches), so only the frozen count is checked."""
    from tests import rank_tasks  # noqa: PLC0415

    for frozen, walked in pool(2).run(rank_tasks.collector_counts, timeout=60):
        assert frozen > 100_000, (frozen, walked)
