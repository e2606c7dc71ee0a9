"""The parent process of a sweep creates no CUDA context: what it runs before any rank exists
(scenario expansion, the impls' capability and install checks, the environment record) must
not initialise CUDA, nor import the libraries whose import does (yunchang with flashinfer
installed calls `torch.cuda.get_device_capability()`; TransformerEngine loads its CUDA
libraries). A context made there sits on GPU 0 for the whole sweep, taking memory from the
rank that measures on it.

On a CPU machine `torch.cuda.is_initialized()` is False whatever runs, so the check is made
meaningful here: a fresh interpreter (nothing imported yet) records every call of
`torch.cuda._lazy_init` (through which torch's CUDA queries initialise CUDA) and raises there,
has a fake
`flashinfer` on its path (as on a GPU node: importing yunchang would then query the GPU), and
the test asserts that none of those libraries was imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.impl_support import STAND_INS

ROOT = Path(__file__).resolve().parent.parent

PARENT_SIDE = r"""
import json, sys, traceback
sys.path[:0] = [{stand_ins!r}, {fakes!r}]  # the flash_attn stand-in; the fake flashinfer
import torch

lazy_init_calls = []

def recording_lazy_init():
    lazy_init_calls.append("".join(traceback.format_stack(limit=6)))
    raise RuntimeError("CUDA initialised in the parent process (torch.cuda._lazy_init)")

torch.cuda._lazy_init = recording_lazy_init

from cpbench.app.sweep import impl_skip_reason
from cpbench.bench.environment import process_environment
from cpbench.config.impls import IMPLS
from cpbench.impls import get_adapter
from cpbench.results.scenarios.loading import parse_scenario

spec = parse_scenario(
    {{"axes": {{"seq_len": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "dtype": "bfloat16",
              "mesh": ["1x2", "2x1"], "layout": ["zigzag", "contiguous"],
              "impl": list(IMPLS)}}}},
    "parent.toml",
)
reasons = {{}}
for device in ("cpu", "cuda"):
    for config, feasibility in spec.expand(device, 2):
        reasons[config.key] = feasibility.reason if not feasibility.ok else impl_skip_reason(config)
installed = {{name: get_adapter(name).installed() for name in IMPLS}}
process_environment()
libraries = ("yunchang", "ring_flash_attn", "transformer_engine", "transformers", "flashinfer")
print(json.dumps({{
    "initialized": torch.cuda.is_initialized(),
    "lazy_init_calls": lazy_init_calls,
    "imported": [m for m in libraries if m in sys.modules],
    "installed": installed,
    "reasons": reasons,
}}))
"""

FAKE_FLASHINFER_PREFILL = '''
"""A fake flashinfer (as on a GPU node): yunchang.globals imports this, then queries the GPU."""
def single_prefill_with_kv_cache(*args, **kwargs):
    raise NotImplementedError
'''


def test_parent_side_of_a_sweep_neither_initialises_cuda_nor_imports_the_libraries(
    tmp_path: Path,
) -> None:
    fakes = tmp_path / "fakes"
    (fakes / "flashinfer").mkdir(parents=True)
    (fakes / "flashinfer" / "__init__.py").write_text("")
    (fakes / "flashinfer" / "prefill.py").write_text(FAKE_FLASHINFER_PREFILL)
    script = PARENT_SIDE.format(stand_ins=STAND_INS, fakes=str(fakes))
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["lazy_init_calls"] == [], result["lazy_init_calls"]
    assert result["initialized"] is False
    assert result["imported"] == []
    # Looked up without importing, yet right: with the flash_attn stand-in on the path the
    # libraries count as installed; TransformerEngine is not installed here.
    installed = result["installed"]
    assert installed["ring_flash_attn"] is None and installed["yunchang"] is None
    assert "pip install 'cpbench[te]'" in installed["transformer_engine"]
    reasons = result["reasons"]
    assert len(reasons) == 2 * 2 * 2 * 7  # devices x meshes x layouts x impls
    runnable = [key for key, reason in reasons.items() if reason is None]
    assert any(key.endswith("-impl_yunchang") for key in runnable)
    assert any(key.endswith("-impl_ring_flash_attn") for key in runnable)
    te_cuda = [r for k, r in reasons.items() if "impl_transformer_engine" in k and "cuda" in k]
    assert te_cuda and any(r and "cpbench[te]" in r for r in te_cuda)
