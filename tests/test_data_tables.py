"""The tables moved out of Python into cpbench/data/{models,fabrics,plan}/*.toml load to the
values the code held as literals (a few anchors, with their sources)."""

from __future__ import annotations

import pytest

from cpbench.model.hardware.network import FABRICS
from cpbench.model.plan.step import (
    FALLBACK_MATMUL_EFFICIENCY,
    MATMUL_EFFICIENCY,
    MFU_CONVENTION,
    STEP_TIME_CONVENTION,
)
from cpbench.model.plan.transformer import ALIASES, PRESETS, load_model

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)


def test_model_presets_keep_their_config_json_numbers() -> None:
    assert list(PRESETS) == [
        "llama3-8b", "llama3-70b", "llama3.1-405b", "qwen2.5-7b", "qwen2.5-72b", "mistral-7b"
    ]
    m = PRESETS["llama3.1-405b"]
    assert (m.hidden, m.layers, m.heads, m.kv_heads, m.head_dim, m.ffn_hidden, m.vocab) == (
        16384, 126, 128, 8, 128, 53248, 128256
    )
    assert m.source == (
        "Hugging Face config.json of meta-llama/Llama-3.1-405B "
        "(https://huggingface.co/meta-llama/Llama-3.1-405B/blob/main/config.json)"
    )
    q = PRESETS["qwen2.5-7b"]
    assert (q.hidden, q.kv_heads, q.ffn_hidden, q.vocab) == (3584, 4, 18944, 152064)
    assert q.qkv_bias
    assert not q.tied_embeddings and not q.dropout and q.ffn_type == "swiglu"
    assert PRESETS["mistral-7b"].vocab == 32000
    assert ALIASES["llama3-405b"] == "llama3.1-405b" and len(ALIASES) == 10
    assert load_model("Meta-Llama-3-70B") is PRESETS["llama3-70b"]


def test_fabrics_keep_their_links() -> None:
    assert list(FABRICS) == ["hgx-rail", "roce-clos", "nvl72"]
    nvl72 = FABRICS["nvl72"]
    assert nvl72.nvlink_domain == 72 and nvl72.nvlink is not None
    assert nvl72.nvlink.tier == "intra_node"
    assert nvl72.nvlink.all_to_all.latency_s == 25e-6 and nvl72.nvlink.all_to_all.busbw == 720e9
    assert nvl72.nvlink.send_recv.source == "estimate: about 85% of 900 GB/s per direction"
    ndr = FABRICS["hgx-rail"].network
    assert ndr is FABRICS["roce-clos"].network and ndr.tier == "inter_node"
    assert (ndr.all_to_all.latency_s, ndr.all_to_all.busbw) == (50e-6, 38e9)
    assert (ndr.send_recv.latency_s, ndr.send_recv.busbw) == (15e-6, 46e9)
    assert ndr.devices_per_nic == 1
    clos = FABRICS["roce-clos"]
    assert (clos.rail_optimised, clos.rail_group_nodes, clos.spine_factor) == (False, 1, 1.0)
    assert FABRICS["hgx-rail"].source.startswith("spec: NVIDIA HGX AI Factory reference")


def test_matmul_efficiencies_and_conventions() -> None:
    assert {k: v.value for k, v in MATMUL_EFFICIENCY.items()} == {
        "h100-sxm": 0.70, "h200-sxm": 0.72, "a100-80gb": 0.80, "l40s-pcie": 0.65, "cpu-local": 0.80
    }
    assert MATMUL_EFFICIENCY["a100-80gb"].source == (
        "estimate: cuBLAS bf16 GEMMs of transformer sizes reach about 250 of the 312 TFLOP/s "
        "dense peak on A100"
    )
    assert FALLBACK_MATMUL_EFFICIENCY.value == 0.6
    assert MFU_CONVENTION.startswith("MFU = (6 x N x tokens + 3 x causal attention forward")
    assert STEP_TIME_CONVENTION.endswith("the DP gradient reduction and the optimizer")
