"""`cpbench doctor`: a truthful report on this (GPU-less) machine, its JSON form, the wall
time, and the GPU logic (visible GPUs, the interconnect matrix) with a fake NVML module."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from cpbench.app import doctor
from cpbench.app.doctor.gpus import nvml_gpus, visible_nvml_indices
from cpbench.app.doctor.schema import DoctorReport, Gpu, Topology
from cpbench.app.doctor.topology import parse_topo_matrix, read_topology
from cpbench.app.doctor.versions import format_cudnn
from cpbench.cli.main import app
from cpbench.render.doctor import render_doctor

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- this machine


@pytest.fixture(scope="module")
def report_json() -> dict[str, Any]:
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_json_has_the_report_schema(report_json: dict[str, Any]) -> None:
    assert set(report_json) == set(DoctorReport.model_fields)
    report = DoctorReport.model_validate(report_json)  # extra keys forbidden, types checked
    assert report.model_dump(mode="json") == report_json


def test_json_is_truthful_on_this_machine(report_json: dict[str, Any]) -> None:
    r = DoctorReport.model_validate(report_json)
    assert r.torch == torch.__version__
    assert r.torch_cuda == torch.version.cuda
    assert r.cuda_available is torch.cuda.is_available() is False
    assert (r.device, r.gpus, r.topology.matrix, r.cuda_device_count) == ("cpu", [], [], 0)
    assert r.summary[0].startswith("no GPU: CUDA not available (")
    assert r.summary[0].endswith("sweeps run on CPU with gloo")
    backends = {b.name: b for b in r.backends}
    assert backends["gloo"].usable and backends["gloo"].built
    assert not backends["nccl"].usable and backends["nccl"].reason
    versions = {p.name: p.version for p in r.packages}
    assert versions["torch"] == importlib.metadata.version("torch")
    assert versions["ring-flash-attn"] == importlib.metadata.version("ring-flash-attn")
    assert versions["flash-attn"] is None  # not installed here (the tests' stand-in has no
    assert versions["TransformerEngine"] is None  # metadata and is not on the path)
    assert r.elapsed_seconds > 0  # wall time (the whole command: test_doctor_command_runs_whole_and_fits_80_columns)


# This machine (no GPU, no flash-attn), written out by hand: kernel -> (resolved, reason words),
# the same for float32, bfloat16 and float16.
CPU_KERNELS: dict[str, tuple[str | None, str | None]] = {
    "auto": ("sdpa", None),
    "sdpa": ("sdpa", None),
    "naive": ("naive", None),
    "flash_attn": (None, "kernel 'flash_attn' needs CUDA, fp16/bf16 and flash-attn >= 2.7"),
    "flash_attn3": (None, "kernel 'flash_attn3' needs a CUDA device (got cpu)"),
    "cudnn": (None, "kernel 'cudnn' needs a CUDA device (got cpu)"),
    "efficient": (None, "kernel 'efficient' needs a CUDA device (got cpu)"),
}


def test_kernels_on_this_machine_are_as_written_out(report_json: dict[str, Any]) -> None:
    r = DoctorReport.model_validate(report_json)
    assert {(k.name, k.dtype) for k in r.kernels} == {
        (name, dtype) for name in CPU_KERNELS for dtype in ("float32", "bfloat16", "float16")
    }
    for k in r.kernels:
        resolved, words = CPU_KERNELS[k.name]
        assert (k.usable, k.resolved) == (words is None, resolved), k
        assert (k.reason is None) if words is None else (words in str(k.reason)), k
    assert set(r.usable_kernels("bfloat16")) == {"sdpa", "naive"}


def test_every_impl_is_listed_with_a_reason_when_not_usable(report_json: dict[str, Any]) -> None:
    r = DoctorReport.model_validate(report_json)
    from cpbench.config.impls import IMPLS  # noqa: PLC0415

    assert [i.name for i in r.impls] == list(IMPLS)
    assert all((i.reason is None) is i.usable for i in r.impls)
    usable = {i.name: i.usable for i in r.impls}
    assert usable["cpbench"] is True
    assert usable["ring_flash_attn"] is False  # flash-attn is not installed here


def test_doctor_command_runs_whole_and_fits_80_columns() -> None:
    """The whole command in a fresh interpreter (torch import included), with no PATH: it
    exits 0, says how sweeps run here, and its report fits 80 columns. Its time is a measurement
    (pytest --durations prints it; 2.7 s wall idle here, about 5 s of CPU under CI's load), not
    a pass/fail bound: a bound on a shared 2-core machine failed on load alone."""
    done = subprocess.run([sys.executable, "-m", "cpbench", "doctor"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env={"COLUMNS": "80", "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert "sweeps run on CPU with gloo" in " ".join(done.stdout.split())
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


# ----------------------------------------------------------------------------- fake NVML


class FakeNvmlError(Exception):
    pass


@dataclass
class FakeNvml:
    """The parts of pynvml the doctor reads, over a described machine: per GPU its PCIe switch,
    socket and NVLinks ((peer index or "switch", links))."""

    switch_of: list[int]
    socket_of: list[int]
    nvlinks: dict[int, list[tuple[int | str, int]]] = field(default_factory=dict)
    topology_supported: bool = True
    names: list[str] | None = None
    """Per GPU its product name (None: all H100)."""
    migs: dict[int, list[str]] = field(default_factory=dict)
    """Per GPU the UUIDs ("MIG-...") of its MIG instances."""

    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_NOT_SUPPORTED = 5
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_DEVICE_TYPE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    NVML_TOPOLOGY_SINGLE = 10
    NVML_TOPOLOGY_NODE = 40
    NVML_TOPOLOGY_SYSTEM = 50

    def bus(self, i: int) -> str:
        return f"00000000:{0x18 + i:02X}:00.0"

    def _links(self, i: int) -> list[tuple[int | str, int]]:
        """One entry per physical link: (remote, link index)."""
        out: list[tuple[int | str, int]] = []
        for remote, count in self.nvlinks.get(i, []):
            out.extend((remote, len(out) + k) for k in range(count))
        return out

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        pass

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "560.35.03"

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        return 12060

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.switch_of)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        return i

    def nvmlDeviceGetUUID(self, h: int | tuple[int, int]) -> str:  # noqa: N802
        if isinstance(h, tuple):  # a MIG instance's handle
            return self.migs[h[0]][h[1]]
        return f"GPU-{h:02d}aaaaaa-0000"

    def nvmlDeviceGetName(self, h: int) -> bytes:  # noqa: N802
        return (self.names[h] if self.names else "NVIDIA H100 80GB HBM3").encode()

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:  # noqa: N802
        return len(self.migs.get(h, []))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, j: int) -> tuple[int, int]:  # noqa: N802
        if j >= len(self.migs.get(h, [])):
            raise FakeNvmlError("NVML_ERROR_NOT_FOUND")
        return (h, j)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(total=80 * 2**30, used=(h + 1) * 2**20)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:  # noqa: N802
        return (9, 0)

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=self.bus(h).encode())

    def nvmlDeviceGetNumaNodeId(self, h: int) -> int:  # noqa: N802
        return self.socket_of[h]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:  # noqa: N802
        if link >= len(self._links(h)):
            raise FakeNvmlError("NVML_ERROR_INVALID_ARGUMENT")
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> SimpleNamespace:  # noqa: N802
        remote = self._links(h)[link][0]
        return SimpleNamespace(busId="00000000:FF:00.0" if remote == "switch" else
                               self.bus(int(remote)))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:  # noqa: N802
        remote = self._links(h)[link][0]
        return self.NVML_NVLINK_DEVICE_TYPE_SWITCH if remote == "switch" else 0

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:  # noqa: N802
        assert index == self.NVML_P2P_CAPS_INDEX_NVLINK
        peers = {r for r, _ in self.nvlinks.get(a, [])}
        joined = b in peers or ("switch" in peers and "switch" in {
            r for r, _ in self.nvlinks.get(b, [])})
        return self.NVML_P2P_STATUS_OK if joined else self.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:  # noqa: N802
        if not self.topology_supported:
            raise FakeNvmlError("NVML_ERROR_FUNCTION_NOT_FOUND")
        if self.switch_of[a] == self.switch_of[b]:
            return self.NVML_TOPOLOGY_SINGLE
        if self.socket_of[a] == self.socket_of[b]:
            return self.NVML_TOPOLOGY_NODE
        return self.NVML_TOPOLOGY_SYSTEM


def two_switches_two_sockets() -> FakeNvml:
    """8 GPUs: PCIe switch 0 (GPUs 0-3) on socket 0, switch 1 (GPUs 4-7) on socket 1;
    NVLink bridges of 4 links join the pairs 0-1, 2-3, 4-5, 6-7."""
    pairs = [(0, 1), (2, 3), (4, 5), (6, 7)]
    nvlinks: dict[int, list[tuple[int | str, int]]] = {}
    for a, b in pairs:
        nvlinks[a] = [(b, 4)]
        nvlinks[b] = [(a, 4)]
    return FakeNvml(switch_of=[0] * 4 + [1] * 4, socket_of=[0] * 4 + [1] * 4, nvlinks=nvlinks)


EXPECTED_8 = [
    ["X", "NV4", "PIX", "PIX", "SYS", "SYS", "SYS", "SYS"],
    ["NV4", "X", "PIX", "PIX", "SYS", "SYS", "SYS", "SYS"],
    ["PIX", "PIX", "X", "NV4", "SYS", "SYS", "SYS", "SYS"],
    ["PIX", "PIX", "NV4", "X", "SYS", "SYS", "SYS", "SYS"],
    ["SYS", "SYS", "SYS", "SYS", "X", "NV4", "PIX", "PIX"],
    ["SYS", "SYS", "SYS", "SYS", "NV4", "X", "PIX", "PIX"],
    ["SYS", "SYS", "SYS", "SYS", "PIX", "PIX", "X", "NV4"],
    ["SYS", "SYS", "SYS", "SYS", "PIX", "PIX", "NV4", "X"],
]


def test_eight_gpus_two_switches_two_sockets_nvlink_pairs() -> None:
    nvml = two_switches_two_sockets()
    gpus = nvml_gpus(nvml, env=None)
    assert [g.index for g in gpus] == [g.nvml_index for g in gpus] == list(range(8))
    assert gpus[5].pci_bus_id == "00000000:1D:00.0"
    assert (gpus[0].name, gpus[0].compute_capability) == ("NVIDIA H100 80GB HBM3", "9.0")
    assert gpus[0].memory_total_bytes == 80 * 2**30
    topo = read_topology(nvml, gpus)
    assert topo.source == "nvml" and topo.reason is None
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert topo.matrix == EXPECTED_8
    assert topo.numa == [0, 0, 0, 0, 1, 1, 1, 1]


def test_visible_devices_pick_and_reorder_the_gpus() -> None:
    nvml = two_switches_two_sockets()
    gpus = nvml_gpus(nvml, env="4,5,0")
    assert [(g.index, g.nvml_index) for g in gpus] == [(0, 4), (1, 5), (2, 0)]
    topo = read_topology(nvml, gpus)
    assert topo.gpus == ["GPU0", "GPU1", "GPU2"]
    assert topo.matrix == [["X", "NV4", "SYS"], ["NV4", "X", "SYS"], ["SYS", "SYS", "X"]]
    assert topo.numa == [1, 1, 0]


def _mixed_host() -> FakeNvml:
    """PCI order (NVML's): GPU 0 an A100, GPU 1 an H100, GPU 2 an A100."""
    return FakeNvml(switch_of=[0, 0, 1], socket_of=[0, 0, 1],
                    names=["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3",
                           "NVIDIA A100-SXM4-80GB"])  # fmt: skip


def test_a_mixed_host_lists_the_gpus_in_cudas_order() -> None:
    """Under the default CUDA_DEVICE_ORDER=FASTEST_FIRST, CUDA numbers the H100 first; the
    doctor takes CUDA's order (UUIDs as torch prints them, no prefix) and matches each to NVML
    by UUID. Main assumed CUDA order = NVML order and called the A100 cuda:0."""
    nvml = _mixed_host()
    cuda_order = ["01aaaaaa-0000", "00aaaaaa-0000", "02aaaaaa-0000"]
    gpus = nvml_gpus(nvml, None, None, lambda: cuda_order)
    assert [(g.index, g.nvml_index) for g in gpus] == [(0, 1), (1, 0), (2, 2)]
    assert gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].uuid == "GPU-01aaaaaa-0000"
    # CUDA_VISIBLE_DEVICES=0 is CUDA's device 0 (the H100), which CUDA applies itself
    gpus = nvml_gpus(nvml, "0", "FASTEST_FIRST", lambda: cuda_order[:1])
    assert [(g.index, g.nvml_index, g.name) for g in gpus] == [(0, 1, "NVIDIA H100 80GB HBM3")]


def test_pci_order_or_one_model_needs_no_cuda_query() -> None:
    """With CUDA_DEVICE_ORDER=PCI_BUS_ID, or GPUs all of one model (ties go in PCI order),
    NVML's order is CUDA's: no CUDA query (no context made)."""

    def refuse() -> list[str]:
        raise AssertionError("CUDA queried")

    gpus = nvml_gpus(_mixed_host(), None, "PCI_BUS_ID", refuse)
    assert [(g.index, g.nvml_index) for g in gpus] == [(0, 0), (1, 1), (2, 2)]
    same = nvml_gpus(two_switches_two_sockets(), "3,1", None, refuse)
    assert [(g.index, g.nvml_index) for g in same] == [(0, 3), (1, 1)]
    # CUDA unusable (None): NVML's order is what there is
    assert [g.nvml_index for g in nvml_gpus(_mixed_host(), None, None, None)] == [0, 1, 2]


def test_a_mig_instance_in_cuda_visible_devices_is_its_gpu() -> None:
    """CUDA_VISIBLE_DEVICES=MIG-<uuid> names an instance of GPU 2: the doctor lists that GPU
    (main's list stopped at the MIG entry and showed no GPU)."""
    nvml = FakeNvml(switch_of=[0, 0, 1, 1], socket_of=[0, 0, 1, 1],
                    migs={2: ["MIG-7777aaaa-0001", "MIG-7777aaaa-0002"]})
    gpus = nvml_gpus(nvml, "MIG-7777aaaa-0002")
    assert [(g.index, g.nvml_index) for g in gpus] == [(0, 2)]
    assert nvml_gpus(nvml, "MIG-0000dead-0000") == []  # no such instance: CUDA sees none


def test_nvswitch_counts_each_gpus_links_into_the_switches() -> None:
    nvml = FakeNvml(switch_of=[0, 0, 1, 1], socket_of=[0, 0, 1, 1],
                    nvlinks={i: [("switch", 18)] for i in range(4)})
    topo = read_topology(nvml, nvml_gpus(nvml, env=None))
    assert topo.matrix == [["X" if a == b else "NV18" for b in range(4)] for a in range(4)]


@pytest.mark.parametrize(
    ("env", "expected"),
    [(None, [0, 1, 2, 3]), ("", []), ("-1", []), ("2,1", [2, 1]), ("0,7,1", [0]),
     ("GPU-03", [3]), ("GPU-0", []), ("1,1", [1])],
)
def test_cuda_visible_devices_as_cuda_reads_it(env: str | None, expected: list[int]) -> None:
    uuids = [f"GPU-{i:02d}aaaaaa-0000" for i in range(4)]
    assert visible_nvml_indices(uuids, env) == expected


SMI_TOPO = (
    "\x1b[4m\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV4\tPIX\tSYS\tPIX\t0-47\t0\t\tN/A\n"
    "GPU1\tNV4\t X \tPIX\tSYS\tPIX\t0-47\t0\t\tN/A\n"
    "GPU2\tPIX\tPIX\t X \tSYS\tSYS\t0-47\t0\t\tN/A\n"
    "GPU3\tSYS\tSYS\tSYS\t X \tSYS\t48-95\t1\t\tN/A\n"
    "NIC0\tPIX\tPIX\tSYS\tSYS\t X \n"
    "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP\n"
    "NIC Legend:\n\n  NIC0: mlx5_0\n"
)


def test_parse_nvidia_smi_topo_m() -> None:
    labels, matrix, numa = parse_topo_matrix(SMI_TOPO)
    assert labels == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert matrix[0] == ["X", "NV4", "PIX", "SYS"]
    assert matrix[3] == ["SYS", "SYS", "SYS", "X"]
    assert numa == [0, 0, 0, 1]


def test_falls_back_to_nvidia_smi_when_nvml_lacks_the_topology_calls() -> None:
    nvml = FakeNvml(switch_of=[0, 0, 0, 1], socket_of=[0, 0, 0, 1], topology_supported=False)
    gpus = nvml_gpus(nvml, env="3,0")
    topo = read_topology(nvml, gpus, smi=lambda: SMI_TOPO)
    assert topo.source == "nvidia-smi"
    assert topo.matrix == [["X", "SYS"], ["SYS", "X"]]
    assert topo.numa == [1, 0]


def test_no_matrix_says_why() -> None:
    def no_smi() -> str:
        raise FileNotFoundError("nvidia-smi is not on PATH")

    nvml = FakeNvml(switch_of=[0, 0], socket_of=[0, 0], topology_supported=False)
    topo = read_topology(nvml, nvml_gpus(nvml, env=None), smi=no_smi)
    assert (topo.source, topo.matrix) == (None, [])
    assert "NVML_ERROR_FUNCTION_NOT_FOUND" in (topo.reason or "")
    assert "nvidia-smi is not on PATH" in (topo.reason or "")
    one = read_topology(None, [Gpu(index=0, nvml_index=None, name="g", memory_total_bytes=1,
                                   memory_used_bytes=None, compute_capability=None, uuid=None,
                                   pci_bus_id=None, numa_node=None)])
    assert one.reason == "1 GPU visible: no interconnect to show"


def test_cudnn_version_text() -> None:
    assert format_cudnn(90100) == "9.1.0"
    assert format_cudnn(91002) == "9.10.2"
    assert format_cudnn(8902) == "8.9.2"
    assert format_cudnn(None) is None


def test_a_gpu_report_renders_at_80_columns(report_json: dict[str, Any]) -> None:
    """The GPU sections (GPUs, the 8x8 matrix with its legend) fit 80 columns."""
    nvml = two_switches_two_sockets()
    gpus = nvml_gpus(nvml, env=None)
    topo: Topology = read_topology(nvml, gpus)
    report = DoctorReport.model_validate(
        {**report_json, "gpus": [g.model_dump() for g in gpus], "topology": topo.model_dump()}
    )
    console = Console(width=80, record=True, color_system=None)
    for renderable in render_doctor(report):
        console.print(renderable)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "GPU interconnect (from nvml)" in text
    assert "NV#: a bonded set of # NVLinks" in text
    row = next(line for line in text.splitlines() if line.startswith("│ GPU4 "))
    assert row.split()[1:11:1].count("SYS") == 4
    assert "NVIDIA H100 80GB" in text and "80.00 GiB" in text  # the name may wrap


def test_a_gpu_machine_end_to_end_with_fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    """collect() on a (faked) 8-GPU node: the GPUs and matrix from NVML, CUDA as the device,
    every kernel and impl checked there (each with a reason where it cannot run), and the
    summary that says so; with 6 of them visible through CUDA_VISIBLE_DEVICES. The fake is
    the `pynvml` module, so NVML is loaded through cpbench's one loader (`bench.nvml`)."""
    nvml = two_switches_two_sockets()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # what bench.nvml.load_nvml imports
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 6)
    r = doctor.collect(env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5"})
    assert (r.device, r.cuda_device_count, len(r.gpus)) == ("cuda", 6, 6)
    assert r.topology.matrix == [row[:6] for row in EXPECTED_8[:6]]
    assert (r.nvml.driver_version, r.nvml.cuda_driver_version) == ("560.35.03", "12.6")
    assert r.summary[0] == "6 GPUs visible (NVIDIA H100 80GB HBM3): sweeps run on CUDA with NCCL"
    assert {k.device for k in r.kernels} == {"cuda"}
    assert all((k.reason is None) is k.usable for k in r.kernels)
    assert all((i.reason is None) is i.usable for i in r.impls)
    assert "world 6" in r.probe_config


def test_islands_from_the_fake_nvml_two_switches_two_sockets() -> None:
    """NVLink pairs inside PCIe switches of 4 on two sockets: three tiers of islands."""
    nvml = two_switches_two_sockets()
    topo = read_topology(nvml, nvml_gpus(nvml, env=None))
    assert [(t.kind, t.islands) for t in topo.tiers] == [
        ("nvlink", [[0, 1], [2, 3], [4, 5], [6, 7]]),
        ("pcie_switch", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ("socket", [[0, 1, 2, 3, 4, 5, 6, 7]]),
    ]
    no_matrix = read_topology(None, [])
    assert no_matrix.tiers == []  # this CPU machine: one island, nothing to split


def test_nvml_that_does_not_load_is_reported_with_its_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """doctor loads NVML through `bench.nvml.load_nvml`: no nvidia-ml-py (the import fails)
    is a reason in the report, not an error, and the GPUs come from torch (none here)."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    r = doctor.collect(env={})
    assert r.nvml.available is False and r.nvml.driver_version is None
    assert (r.nvml.reason or "").startswith("ModuleNotFoundError: ")
    assert (r.device, r.gpus) == ("cpu", [])


def test_doctor_says_which_kernels_a_pre_ampere_gpu_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a T4 (compute capability 7.5) with flash-attn installed, flash-attn 2 and PyTorch's
    CUDA flash op are listed as not usable, saying why (both need 8.0: main called them
    usable, and they raise "FlashAttention only supports Ampere GPUs or newer" there); the
    memory-efficient op runs fp16, and that is what `auto` resolves to."""
    from cpbench.app.doctor.statuses import kernel_statuses  # noqa: PLC0415
    from cpbench.attention.kernels import ops, select  # noqa: PLC0415

    monkeypatch.setattr(ops, "device_capability", lambda d: (7, 5) if d.type == "cuda" else None)
    monkeypatch.setattr(select, "flash_attn_available", lambda: True)
    monkeypatch.setattr(select, "_kernel_instance", lambda cls: SimpleNamespace(name=cls.name))
    status = {(k.name, k.dtype): k for k in kernel_statuses("cuda")}
    for name in ("flash_attn", "sdpa"):
        k = status[(name, "float16")]
        assert not k.usable and k.reason is not None
        assert "compute capability >= 8.0" in k.reason and "7.5" in k.reason
    assert status[("efficient", "float16")].usable
    assert status[("auto", "float16")].resolved == "efficient"
    bf16 = status[("auto", "bfloat16")]
    assert not bf16.usable and "bf16 only from compute capability 8.0" in str(bf16.reason)


@pytest.mark.parametrize(
    ("version", "capability", "usable", "words"),
    [
        ((2, 7, 2), (10, 0), False, "8.x and 9.0 only"),  # B200 before flash-attn 2.7.3
        ((2, 7, 2), (12, 0), False, "8.x and 9.0 only"),  # RTX 50xx
        ((2, 7, 2), (9, 0), True, None),
        ((2, 7, 2), (8, 6), True, None),
        ((2, 7, 4), (10, 0), True, None),  # 2.7.3 on: any compute capability >= 8.0
        ((2, 8, 3), (12, 0), True, None),
        ((2, 8, 3), (7, 5), False, "compute capability >= 8.0"),
    ],
)
def test_doctor_models_flash_attn_2s_capability_check_per_release(  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch, version, capability, usable, words
) -> None:
    """flash_api.cpp `mha_fwd`: up to 2.7.2 `is_sm8x || is_sm90` (major 8, or exactly 9.0),
    from 2.7.3 `cc_major >= 8` (commit bbb21d65). Main called flash-attn 2.7.2 usable on an
    sm100 GPU, where it raises "FlashAttention only supports Ampere GPUs or newer"."""
    from cpbench.app.doctor.statuses import kernel_statuses  # noqa: PLC0415
    from cpbench.attention.kernels import ops, select  # noqa: PLC0415

    monkeypatch.setattr(ops, "device_capability", lambda d: capability if d.type == "cuda" else None)
    monkeypatch.setattr(select, "flash_attn_available", lambda: True)
    monkeypatch.setattr(select, "flash_attn_version", lambda: version)
    monkeypatch.setattr(select, "_kernel_instance", lambda cls: SimpleNamespace(name=cls.name))
    k = {(k.name, k.dtype): k for k in kernel_statuses("cuda")}[("flash_attn", "bfloat16")]
    assert k.usable is usable
    assert (k.reason is None) if words is None else (words in str(k.reason))
