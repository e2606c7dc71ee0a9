"""Length distributions beyond `recommend --lengths` (issue 37, item 4): `cpbench plan --lengths`
prices every plan's attention under the document mask of the packed documents, and
`recommend --inference --prompt-lens` gives each request the CP degree of the least TTFT."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cpbench.app.plan import PlanRequest, PlanResult, plan_training
from cpbench.app.recommend.inference import InferenceRequest, serving_policy
from cpbench.cli.main import app
from cpbench.config.problem import CpProblem
from cpbench.model.hardware.loading import load_profile
from cpbench.model.inference_cost import fastest_prefill, price_prefill
from cpbench.model.plan.search import PlanSearch, SearchSpace

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

runner = CliRunner()
DISTRIBUTION = "lognormal:mean=2048,sigma=1.2,min=256,max=65536"
PLAN = ("llama3-8b", 65536, 8)


@pytest.fixture(scope="module")
def plans() -> tuple[PlanResult, PlanResult]:
    """The same plan search on one causal sequence and on packed documents."""
    return (plan_training(PlanRequest(*PLAN, keep=3)),
            plan_training(PlanRequest(*PLAN, keep=3, lengths=DISTRIBUTION, seed=1)))  # fmt: skip


# ---------------------------------------------------------------------------------- plan


def test_packed_documents_make_the_plans_attention_and_step_cheaper(plans) -> None:  # type: ignore[no-untyped-def]
    plain, packed = plans
    d = packed.documents
    assert plain.documents is None and d is not None
    assert d.count > 1 and sum(d.lengths) == PLAN[1] and d.longest <= PLAN[1]
    assert d.mean == pytest.approx(PLAN[1] / d.count, rel=1e-12)
    w, p = packed.winner, plain.winner
    assert w is not None and p is not None
    # the comparison it prints is the plain search's own winner
    assert d.single_step_s == pytest.approx(p.time.total_s, rel=1e-12)
    assert w.time.total_s < p.time.total_s
    assert w.time.attention_s < p.time.attention_s
    # every winner's candidate carries the documents; the plain one none
    assert w.attention.candidate.documents == d.lengths
    assert p.attention.candidate.documents is None
    # useful FLOPs (the MFU's numerator) count only the documents' pairs; the GEMMs are equal
    assert w.time.model_flops < p.time.model_flops
    assert w.par.label() == p.par.label()  # here the same mesh wins: only attention moved
    assert w.time.gemm_s == pytest.approx(p.time.gemm_s, rel=1e-12)


def test_the_search_bound_stays_below_the_document_priced_attention(plans) -> None:  # type: ignore[no-untyped-def]
    """The pruning bound (balanced compute of the mask's pairs) must not exceed what the cost
    model prices under the documents, or the search would prune a plan that ranks."""
    _, packed = plans
    assert packed.documents is not None
    r = packed.request
    model, profile = packed.model, packed.profile
    space = SearchSpace(model=model, profile=profile, gpus=r.gpus, gpus_per_node=8,
                        seq_len=r.seq_len, global_batch=packed.global_batch,
                        efficiency=packed.efficiency, documents=packed.documents.lengths)  # fmt: skip
    search = PlanSearch(space)
    checked = 0
    for tp, ulysses, ring in ((1, 1, 8), (1, 2, 4), (2, 1, 4), (1, 8, 1), (4, 1, 2)):
        mesh = search.mesh(tp, ulysses, ring)
        assert mesh.ok and mesh.priced is not None
        prediction, _ = mesh.priced
        forward, backward = mesh.bound_s
        assert forward <= prediction.forward.total_s * (1 + 1e-9)
        assert backward <= prediction.backward.total_s * (1 + 1e-9)
        checked += 1
    assert checked == 5


def test_cli_plan_names_the_distribution_and_the_change() -> None:
    args = ["plan", "--model", "llama3-8b", "--seq-len", "65536", "--gpus", "8", "--top", "2",
            "--lengths", DISTRIBUTION, "--seed", "1"]  # fmt: skip
    text = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    flat = " ".join(text.stdout.split())  # the console's width is the one it started with
    assert f"Packed documents ({DISTRIBUTION}, seed 1)" in flat
    assert "per sequence of 65536 tokens" in flat and "on one causal sequence" in flat
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    docs = doc["documents"]
    assert docs["source"] == DISTRIBUTION and docs["count"] == len(docs["lengths"]) > 1
    assert sum(docs["lengths"]) == 65536 and docs["longest"] == max(docs["lengths"])
    assert doc["inputs"]["lengths"] == DISTRIBUTION and doc["inputs"]["seed"] == 1
    assert doc["feasible"][0]["step_s"] < docs["single_step_s"]


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ("", "empty source"),
        ("foo", "'foo' is neither comma-separated lengths"),
        ("lognormal:mean=x", "mean = 'x' is not a number"),
        ("lognormal:sigma=1", "lognormal needs mean="),
        ("100,200", "sum to 300, not the sequence length 8192"),
    ],
)
def test_cli_plan_bad_lengths_is_one_line_and_exit_2(lengths: str, message: str) -> None:
    result = runner.invoke(app, ["plan", "--model", "llama3-8b", "--seq-len", "8192", "--gpus",
                                 "8", "--lengths", lengths])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------------- serving

SERVING = ["recommend", "--inference", "--heads", "32", "--kv-heads", "8", "--gpus", "8"]
PROMPTS = "lognormal:mean=4096,sigma=1.5,min=128,max=65536"


def test_serving_policy_short_on_one_gpu_long_on_all_and_never_slower() -> None:
    result = runner.invoke(app, [*SERVING, "--prompt-lens", PROMPTS, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    policy = doc["policy"]
    assert policy[0]["world"] == 1 and policy[0]["low"] == doc["prompts"]["min"]
    assert policy[-1]["world"] == 8 and policy[-1]["high"] == doc["prompts"]["max"]
    assert sum(r["share"] for r in policy) == pytest.approx(1.0, abs=1e-9)
    assert sum(r["requests"] for r in policy) == doc["prompts"]["requests"]
    for before, after in zip(policy, policy[1:], strict=False):  # ranges ordered, disjoint
        assert before["high"] < after["low"] and before["world"] != after["world"]
    mean = doc["mean_ttft_s"]
    weighted = sum(r["share"] * r["mean_ttft_s"] for r in policy)
    assert mean["policy"] == pytest.approx(weighted, rel=1e-9)
    assert mean["policy"] <= mean["static_cp"] + 1e-9 and mean["policy"] <= mean["no_cp"] + 1e-9
    assert mean["static_cp"] == doc["static_ttft_s"]["8"] and mean["no_cp"] == doc["static_ttft_s"]["1"]
    for t in doc["static_ttft_s"].values():
        assert mean["policy"] <= t + 1e-9
    assert set(doc["cp_pays_above"]) == {"2", "4", "8"}
    assert doc["inputs"]["prompt_lens"] == PROMPTS and doc["inputs"]["mode"] == "prefill_policy"
    text = runner.invoke(app, [*SERVING, "--prompt-lens", PROMPTS], env={"COLUMNS": "120"})
    assert text.exit_code == 0
    assert "Serving policy" in text.stdout and "Mean TTFT: policy" in text.stdout
    assert "CP pays above" in text.stdout


def test_serving_policy_picks_the_least_ttft_degree_for_each_request() -> None:
    request = InferenceRequest(heads=32, kv_heads=8, prompt_len=1, gpus=8)
    policy = serving_policy(request, "128,256,300,20000,65536,65536")
    by_length = {t: r for r in policy.ranges for t in policy.prompts if r.low <= t <= r.high}
    assert by_length[128].world == 1 and by_length[65536].world == 8
    shape = CpProblem(seq_len=65536, heads=32, kv_heads=8, head_dim=128)
    profile = load_profile("h100-sxm")
    for t in set(policy.prompts):  # the chosen degree has the least time of every degree
        times = {w: fastest_prefill(0, t, shape, w, profile) for w in (1, 2, 4, 8)}
        best = min(times, key=lambda w: (times[w].total_s, w))  # type: ignore[union-attr]
        assert by_length[t].world == best
    assert policy.static_ttft_s[1] == pytest.approx(
        sum(price_prefill("pass_kv", 0, t, shape, 1, profile).total_s for t in policy.prompts)
        / 6, rel=1e-12)
    assert policy.ranges[-1].requests == 3  # 20000 and twice 65536 on CP 8


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prompt-lens", ""], "empty source"),
        (["--prompt-lens", "12,ab"], "'12,ab' is neither comma-separated lengths"),
        (["--prompt-lens", "100000000", "--layers", "32"], "does not fit"),
        (["--prompt-lens", "100", "--prompt-len", "5"], "give one of the two"),
        (["--prompt-lens", "100", "--decode-batch", "4"], "leave out --decode-batch"),
        (["--prompt-lens", "100", "--seq-len", "4096"], "--seq-len: training option"),
    ],
)
def test_serving_policy_bad_input_is_one_line_and_exit_2(extra: list[str], message: str) -> None:
    result = runner.invoke(app, [*SERVING, *extra])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_prompt_lens_needs_inference() -> None:
    result = runner.invoke(app, ["recommend", "--heads", "32", "--kv-heads", "8",
                                 "--prompt-lens", "100"])  # fmt: skip
    assert result.exit_code == 2 and "--prompt-lens needs --inference" in result.stderr
