"""`cpbench plan`: the whole-model memory model against hand-computed numbers and Korthikanti et
al.'s published formulas, the search, and the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cpbench.app.plan import PlanRequest, PlanResult, plan_report, plan_training
from cpbench.cli.main import app
from cpbench.config.constraints import seq_divisor
from cpbench.errors import CpbenchError
from cpbench.model.plan.memory import (
    Parallelism,
    layer_activation_bytes,
    peak_stage,
    plan_memory,
)
from cpbench.model.plan.step import model_flops
from cpbench.model.plan.transformer import PRESETS, ModelSpec, load_model
from cpbench.units import GIB
from tests.golden import assert_same_document

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

runner = CliRunner()

# --------------------------------------------------------------------- parameter counts


def test_llama3_8b_parameters_by_hand() -> None:
    m = PRESETS["llama3-8b"]
    # embedding 128256 x 4096 = 525,336,576; per layer: Q 4096x4096 + K, V 2 x 4096x1024 +
    # O 4096x4096 = 41,943,040, MLP 3 x 4096 x 14336 = 176,160,768, norms 2 x 4096 = 8192
    assert m.layer_params == 41_943_040 + 176_160_768 + 8_192 == 218_112_000
    # 32 layers 6,979,584,000 + final norm 4096 + untied head 525,336,576
    assert m.total_params == 525_336_576 + 32 * 218_112_000 + 4_096 + 525_336_576
    assert m.total_params == 8_030_261_248  # Meta's model card: 8.03 B


def test_qwen25_7b_parameters_by_hand() -> None:
    m = PRESETS["qwen2.5-7b"]
    # Q 3584x3584, K/V 2 x 3584x512, O 3584x3584, Q/K/V biases 3584 + 2 x 512 = 4608
    assert m.attention_params == 3584 * 4608 + 3584 * 3584 + 4608 == 29_364_736
    # MLP 3 x 3584 x 18944 = 203,685,888; norms 7168
    assert m.layer_params == 29_364_736 + 203_685_888 + 7_168
    # embedding = head = 152064 x 3584 = 544,997,376
    assert m.total_params == 2 * 544_997_376 + 28 * m.layer_params + 3_584 == 7_615_616_512


# ------------------------------------------------------------------ memory by component


def test_llama3_8b_single_rank_memory_by_hand() -> None:
    """One rank, no sharding, L = 8192, no recompute, fused attention kernel."""
    m = PRESETS["llama3-8b"]
    par = Parallelism(tp=1, ulysses=1, ring=1, pp=1, dp=1, recompute="none", zero=0)
    (stage,) = plan_memory(m, par, 8192, attention_buffers=0.0)
    n = 8_030_261_248
    assert stage.component("weights") == 2 * n  # bf16
    assert stage.component("gradients") == 4 * n  # fp32 main grads
    assert stage.component("optimizer") == 12 * n  # fp32 master + Adam m, v
    # per layer, s = 8192, b = 1, e = 2: norm inputs + QKV input + MLP input 4 x 2 s h
    # = 268,435,456; Q, O 2 x 2 s (32 x 128) + K, V 2 x 2 s (8 x 128) = 167,772,160;
    # SwiGLU 3 x 2 s 14336 = 704,643,072; LSE 4 x 32 x s = 1,048,576
    per_layer = 268_435_456 + 167_772_160 + 704_643_072 + 1_048_576
    assert per_layer == 34 * 8192 * 4096 + 4 * 32 * 8192  # Llama-3-8B lands on 34 s b h
    assert stage.component("activations") == 32 * per_layer
    # logits: final norm + head inputs 2 x 2 s h, bf16 logits + fp32 softmax 6 s v
    assert stage.component("logits/loss") == 4 * 8192 * 4096 + 6 * 8192 * 128256


def test_qwen25_7b_sharded_memory_by_hand() -> None:
    """TP 2 (with SP) x CP 2 x DP 2, ZeRO-1, full recompute, L = 32768."""
    m = PRESETS["qwen2.5-7b"]
    par = Parallelism(tp=2, ulysses=1, ring=2, pp=1, dp=2, recompute="full", zero=1)
    (stage,) = plan_memory(m, par, 32768, attention_buffers=0.0)
    # per rank: linear weights / 2, norms replicated, embedding and head / 2, final norm
    linear = 29_364_736 + 203_685_888
    params = 28 * (linear / 2 + 7_168) + 544_997_376 / 2 + 544_997_376 / 2 + 3_584
    assert stage.component("weights") == pytest.approx(2 * params, rel=1e-12)
    assert stage.component("gradients") == pytest.approx(4 * params, rel=1e-12)
    # ZeRO-1 shards the optimizer over DP x CP = 4 ranks
    assert stage.component("optimizer") == pytest.approx(12 * params / 4, rel=1e-12)
    # full recompute keeps each layer's input: 2 B x (s = 32768 / CP 2) x h / TP 2
    assert stage.component("activations") == 28 * 2 * 16384 * 3584 / 2
    # one layer rebuilt in backward: (4 x 2 s h) / 2 + (2 x 2 s (3584 + 512) + 3 x 2 s 18944
    # + 4 x 28 s) / 2 with s = 16384
    s = 16384
    working = (8 * s * 3584) / 2 + (4 * s * 4096 + 6 * s * 18944 + 4 * 28 * s) / 2
    assert stage.component("recompute working set") == working


# ------------------------------------------------------------------- Korthikanti et al.


GPT3 = ModelSpec(
    "gpt3-175b", 12288, 96, 96, 96, 128, 4 * 12288, "gelu", 51200, dropout=True,
    source="Korthikanti et al. 2022, Table 3 (175B: 96 heads, hidden 12288, 96 layers, TP 8)",
)


def korthikanti_layer_bytes(
    s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
    selective: bool = False,
) -> float:
    """The paper's closed forms (Table 2) for a GPT layer, bytes per layer."""
    attention = 0 if selective else 5 * a * s / h
    if t == 1:
        return s * b * h * (34 + attention)
    if sequence_parallel:
        return s * b * h * (34 / t + attention / t)
    return s * b * h * (10 + 24 / t + attention / t)


@pytest.mark.parametrize(
    ("tp", "sp", "recompute", "factor"),
    [
        # Table 2 rows, with a = 96, s = 2048, h = 12288: 5 a s / h = 80
        (1, False, "none", 34 + 80),  # no parallelism: sbh(34 + 5as/h)
        (8, False, "none", 10 + 24 / 8 + 80 / 8),  # tensor parallel: sbh(10 + 24/t + 5as/ht)
        (8, True, "none", 34 / 8 + 80 / 8),  # tensor + sequence parallel
        (8, True, "selective", 34 / 8),  # + selective activation recompute
        (8, True, "full", 2 / 8),  # full recompute: the layer input 2sbh, sequence-sharded
    ],
)
def test_activation_formula_matches_korthikanti(
    tp: int, sp: bool, recompute: str, factor: float
) -> None:
    """Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
    (arXiv:2205.05198), Table 2, for the GPT-3 175B configuration of their Table 3."""
    s, b, h, a = 2048, 1, 12288, 96
    assert 5 * a * s / h == 80
    ours = layer_activation_bytes(
        GPT3, s, b, tp, recompute, sequence_parallel=sp, scores_materialised=True  # type: ignore[arg-type]
    )
    assert ours == pytest.approx(s * b * h * factor, rel=1e-12)
    if recompute != "full":
        paper = korthikanti_layer_bytes(s, b, h, a, tp, sp, selective=recompute == "selective")
        assert ours == pytest.approx(paper, rel=1e-12)


def test_fused_kernel_drops_the_score_terms() -> None:
    flash = layer_activation_bytes(GPT3, 2048, 1, 8, "none", True, scores_materialised=False)
    # 34 s b h / t plus the fp32 log-sum-exp 4 a s b / t instead of 5 a s^2 b / t
    assert flash == pytest.approx(2048 * 12288 * 34 / 8 + 4 * 96 * 2048 / 8, rel=1e-12)


# ------------------------------------------------------------------------------ search


@pytest.fixture(scope="module")
def result_8b() -> PlanResult:
    return plan_training(PlanRequest("llama3-8b", 262144, 16, 8, keep=0))  # every plan, rejection


def test_plan_ranks_fitting_plans_and_rejects_the_rest(result_8b: PlanResult) -> None:
    r = result_8b
    cap = r.profile.memory_bytes
    assert r.feasible and r.rejected
    times = [p.time.total_s for p in r.feasible]
    assert times == sorted(times, key=lambda t: float(f"{t:.4g}"))
    assert all(p.peak.total <= cap for p in r.feasible)
    memory = [x for x in r.rejected if x.kind == "memory"]
    assert memory and all(x.total_bytes is not None and x.total_bytes > cap for x in memory)
    # every GPU is used: world = TP x CP x PP x DP
    assert all(p.par.world == 16 for p in r.feasible)
    # at 256K no plan without recompute fits an 8B model on 80 GB (activations 34 s h per layer
    # alone are 32 x 34 x 16384 x 4096 B = 68 GiB at CP 16)
    assert all(p.par.recompute == "full" for p in r.feasible)
    assert any("activations" in x.rule and "none recompute" in x.rule for x in memory)


def test_parts_sum_to_the_step_and_mfu_convention(result_8b: PlanResult) -> None:
    w = result_8b.feasible[0]
    t = w.time
    parts = (t.gemm_s + t.attention_s + t.tp_comm_s + t.pp_comm_s + t.bubble_s + t.dp_comm_s
             + t.optimizer_s)
    assert parts == pytest.approx(t.total_s, rel=1e-12)
    assert 0 < t.attention_share < 1
    flops = model_flops(result_8b.model, 262144, 16)
    assert t.mfu == pytest.approx(flops / (t.total_s * 16 * 989.5e12), rel=1e-9)
    assert t.tokens_per_s_per_gpu == pytest.approx(16 * 262144 / t.total_s / 16, rel=1e-12)


def test_longest_sequence_is_the_bisection_edge(result_8b: PlanResult) -> None:
    from cpbench.model.plan.memory import attention_buffer_bytes  # noqa: PLC0415
    from cpbench.model.plan.search import PlanSearch, SearchSpace  # noqa: PLC0415

    r = result_8b
    w = r.feasible[0]
    search = PlanSearch(SearchSpace(r.model, r.profile, 16, 8, 262144, 16, r.efficiency,
                                    r.reserve_bytes))
    per_token = attention_buffer_bytes(w.attention.candidate) / 262144
    q = seq_divisor(w.par.ulysses, w.par.ring, w.par.layout)
    assert w.max_seq_len % q == 0 and w.max_seq_len >= 262144
    fits = peak_stage(search.memory(w.par, w.max_seq_len, per_token)).total
    over = peak_stage(search.memory(w.par, w.max_seq_len + q, per_token)).total
    assert fits <= r.profile.memory_bytes < over


def test_pipeline_bubble_and_first_stage_micro_batches() -> None:
    r = plan_training(PlanRequest("llama3-8b", 32768, 16, 8, tp=2, cp=2, pp=4, recompute="none",
                         global_batch=16))
    p = next(x for x in r.feasible if x.par.pp == 4)
    m = p.par.micro_batches  # DP = 16 / (2 x 2 x 4) = 1: 16 / (DP 1 x micro-batch 1) = 16
    assert (p.par.dp, m) == (1, 16)
    assert p.time.bubble_fraction == pytest.approx(3 / (16 + 4 - 1))
    assert p.time.bubble_s == pytest.approx(3 * p.time.micro_batch_s)
    first = next(s for s in p.stages if s.stage == "first")
    last = next(s for s in p.stages if s.stage == "last")
    # 1F1B: the first stage holds PP = 4 micro-batches in flight, the last one
    assert first.component("activations") == pytest.approx(4 * last.component("activations"))


def test_shortest_cp_and_settings(result_8b: PlanResult) -> None:
    r = result_8b
    smallest = min(p.par.cp for p in r.feasible)
    assert r.shortest_cp is not None and r.shortest_cp.par.cp == smallest
    megatron = r.frameworks[0]
    w = r.feasible[0].par
    assert f"--context-parallel-size {w.cp}" in megatron.settings
    assert f"--tensor-model-parallel-size {w.tp}" in megatron.settings
    assert "--recompute-granularity full" in megatron.settings
    assert "--cp-comm-type" in megatron.settings


# ----------------------------------------------------------------------------- loading


def test_hf_config_and_toml_load(tmp_path: Path) -> None:
    hf = {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "hidden_act": "silu", "vocab_size": 128256, "tie_word_embeddings": False,
    }
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf))
    loaded = load_model(str(folder / "config.json"))
    assert loaded.total_params == PRESETS["llama3-8b"].total_params
    assert loaded.name == "Meta-Llama-3-8B"
    toml = tmp_path / "tiny.toml"
    toml.write_text("hidden = 256\nlayers = 2\nheads = 4\nffn_hidden = 512\nvocab = 1000\n")
    tiny = load_model(str(toml))
    assert (tiny.kv_heads, tiny.head_dim, tiny.ffn_type) == (4, 64, "swiglu")
    toml.write_text("hidden = 256\nlayers = 2\nheads = 4\nffn_hidden = 512\nvocab = 1000\n"
                    "widht = 3\n")
    with pytest.raises(CpbenchError, match="widht is not a model key"):
        load_model(str(toml))


# --------------------------------------------------------------------------------- CLI


def test_cli_plan_prints_plans_rejections_settings_and_share() -> None:
    result = runner.invoke(app, ["plan", "--model", "llama3-8b", "--seq-len", "262144",
                                 "--gpus", "16", "--gpus-per-node", "8"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("Feasible plans", "Rejected: out of memory", "Settings for the winner",
                 "--context-parallel-size", "--sequence-parallel", "attention (cpbench cost",
                 "Shortest CP that fits", "Memory per rank of the winner"):
        assert text in out, text
    assert "attention" in out and "% of it" in out  # the winner's attention share


def test_cli_plan_json_parses() -> None:
    result = runner.invoke(app, ["plan", "--model", "mistral-7b", "--seq-len", "65536",
                                 "--gpus", "8", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["winner"] == 1 and report["feasible"]
    first = report["feasible"][0]
    assert first["step_s"] == pytest.approx(sum(first["parts_s"].values()), rel=1e-9)
    assert first["memory_bytes"] <= report["inputs"]["memory_capacity_bytes"]
    assert report == plan_report(plan_training(PlanRequest("mistral-7b", 65536, 8))).model_dump(
        mode="json")


PLAN_GOLDEN = Path(__file__).parent / "fixtures" / "plan_json.jsonl"
"""`cpbench plan ARGS --json` of five problems, captured before the report became typed: one
node, two nodes, --max-seq-len, nothing fits, ZeRO-3 with full recompute on a fabric."""


@pytest.mark.parametrize(
    "case",
    [json.loads(line) for line in PLAN_GOLDEN.read_text(encoding="utf-8").splitlines()],
    ids=lambda case: " ".join(case["args"]),
)
def test_plan_json_is_the_captured_shape_plus_its_version(case: dict) -> None:
    result = runner.invoke(app, ["plan", *case["args"], "--json"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith('{\n "schema_version": 1,\n')  # the first key
    document = json.loads(result.stdout)
    assert document.pop("schema_version") == 1
    assert_same_document(document, case["json"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-17"], "model 'gpt-17' is neither a preset"),
        (["--model", "llama3-8b", "--seq-len", "0"], "seq_len must be a positive integer, got 0"),
        (["--model", "llama3-8b", "--recompute", "some"], "recompute 'some' is not one of"),
        (["--model", "llama3-8b", "--zero", "4"], "ZeRO stage 4 is not one of"),
        (["--model", "llama3-8b", "--gpus", "12"], "gpus (12) must be a multiple of gpus per node"),
    ],
)
def test_cli_plan_bad_input_exit_2(args: list[str], message: str) -> None:
    base = ["plan", "--seq-len", "8192", "--gpus", "8"]
    result = runner.invoke(app, [*base, *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output + result.stderr


def test_plan_memory_rejection_names_the_component() -> None:
    r = plan_training(PlanRequest("llama3-70b", 131072, 8, tp=8, cp=1, pp=1, recompute="none"))
    assert not r.feasible
    (x,) = [x for x in r.rejected if x.kind == "memory"]
    assert x.rule.startswith("activations ")
    assert f"of {r.profile.memory_bytes / GIB:.1f} GiB" in x.rule
    assert "at CP 1 with none recompute" in x.rule


def test_uneven_pipeline_stages_hold_the_ceiling() -> None:
    m = PRESETS["llama3-8b"]  # 32 layers on PP 5: the busiest stage holds 7
    even = Parallelism(tp=1, ulysses=1, ring=1, pp=4, dp=1)
    uneven = Parallelism(tp=1, ulysses=1, ring=1, pp=5, dp=1, uneven_stages=True)
    assert (even.stage_layers(32), uneven.stage_layers(32)) == (8, 7)
    with pytest.raises(CpbenchError, match=r"layers \(32\) must be divisible by PP \(5\)"):
        Parallelism(tp=1, ulysses=1, ring=1, pp=5, dp=1).stage_layers(32)
    first = next(s for s in plan_memory(m, uneven, 8192, 0.0) if s.stage == "first")
    # one micro-batch per step, so one in flight: 7 layers of activations
    assert first.component("activations") == pytest.approx(
        7 * layer_activation_bytes(m, 8192, 1), rel=1e-12)
