"""The planted defects: each names the file, the exact text it replaces (which must occur once),
the replacement, why it matters, and the tests that must catch it. Every mutant names the narrowest
tests that catch it. `fast` mutants are a subset caught by unit-level tests in seconds (CI runs
them: tests/test_mutation.py); the whole list, the multi-rank tests (gloo pools, minutes)
included, runs with `python -m tests.mutation`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """One planted defect."""

    name: str
    """Short unique name (`--only NAME`)."""
    file: str
    """Path of the mutated file, relative to the repository root."""
    old: str
    """Exact text replaced; must occur exactly once in `file`."""
    new: str
    """Its replacement."""
    why: str
    """The defect in words: what a wrong program would get past."""
    tests: tuple[str, ...]
    """Node ids or files of the tests that must fail on the mutant: no pytest options, since the
    baseline runs the union of every mutant's tests in one pytest (a `-k` there would select
    for all of them)."""
    fast: bool = False
    """Caught by unit-level tests within seconds (the CI subset)."""


JUDGE = "cpbench/bench/reference.py"
ROWCHECK = "cpbench/bench/rowcheck.py"
RECORD = "cpbench/app/record.py"
BOUNDARY = "cpbench/attention/boundary.py"
COMM = "cpbench/attention/comm.py"
RING = "cpbench/attention/ring.py"
LAYOUTS = "cpbench/attention/layouts.py"
SCHEMES = "cpbench/model/cost/schemes.py"
INFERENCE_COST = "cpbench/model/inference_cost.py"
PLAN_MEMORY = "cpbench/model/plan/memory.py"
BY_HAND = "tests/test_cost_by_hand.py::"
MEMORY_BY_HAND = "tests/test_plan_memory_by_hand.py::"
BYTES_EQUAL = ("tests/test_cp_attention.py::test_counted_bytes_equal_analytic_bytes",)
BOUNDARY_TEST = ("tests/test_impls.py::test_library_boundary_counting",)
RING_CASES = ("tests/test_cp_attention.py::test_every_scheme_layout_gqa_case_matches_reference",)
MASK_CASES = (
    "tests/test_masks_attention.py::test_every_mask_layout_scheme_gqa_case_matches_reference",
)

MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------ the judge
    Mutant(
        "judge-reference-vs-itself",
        JUDGE,
        "name: float((got.double() - ref).abs().max())",
        "name: float((ref - ref).abs().max())",
        "the judge compares the reference with itself: every result passes",
        ("tests/test_judge.py::test_an_error_just_above_the_bound_fails_and_just_below_passes",),
        fast=True,
    ),
    Mutant(
        "judge-result-vs-itself",
        JUDGE,
        "name: float((got.double() - ref).abs().max())",
        "name: float((got.double() - got.double()).abs().max())",
        "the judge compares the result with itself",
        ("tests/test_judge.py::test_an_error_just_above_the_bound_fails_and_just_below_passes",),
    ),
    Mutant(
        "run-case-judges-the-references",
        JUDGE,
        "verdict = judge(case, gathered, refs, tolerances)",
        "verdict = judge(case, refs, refs, tolerances)",
        "run_case_on_rank hands the judge the references in place of the gathered results",
        ("tests/test_judge.py::test_run_case_on_rank_judges_what_the_scheme_returned",),
        fast=True,
    ),
    Mutant(
        "reference-cache-ignores-the-mask",
        JUDGE,
        "key = (*_input_key(case), case.dtype, case.causal, mask, str(q.device))",
        "key = (*_input_key(case), case.dtype, case.causal, str(q.device))",
        "the memo of references hands a case the reference of another mask on the same inputs",
        ("tests/test_judge.py::test_the_reference_is_shared_by_meshes_and_layouts_and_by_nothing_else",),
        fast=True,
    ),
    Mutant(
        "judge-ignores-gradients",
        JUDGE,
        '"passed": all(errors[n] <= bounds[n] for n in CHECKED),',
        '"passed": errors["out"] <= bounds["out"],',
        "the verdict looks at the forward output only: a wrong dQ/dK/dV passes",
        ("tests/test_judge.py::test_an_error_just_above_the_bound_fails_and_just_below_passes",),
        fast=True,
    ),
    Mutant(
        "judge-passed-from-the-wrong-errors",
        JUDGE,
        '"passed": all(errors[n] <= bounds[n] for n in CHECKED),',
        '"passed": min(errors.values()) <= max(bounds.values()),',
        "passed computed from the smallest error against the largest bound",
        ("tests/test_judge.py::test_an_error_just_above_the_bound_fails_and_just_below_passes",),
    ),
    Mutant(
        "judge-tolerance-100x",
        JUDGE,
        "return allowed_error(dtype, float(reference.abs().max()), terms, length, absolute)",
        "return 100 * allowed_error(dtype, float(reference.abs().max()), terms, length, absolute)",
        "every bound 100 times wider",
        ("tests/test_judge.py::test_a_wrong_output_and_a_wrong_dk_alone_fail",),
        fast=True,
    ),
    Mutant(
        "tolerance-bf16-accumulator-allowed",
        "cpbench/config/tolerances.py",
        "SIGMAS = 5.0",
        "SIGMAS = 25.0",
        "a bound wide enough for a bf16 accumulator (the old tolerance's width)",
        ("tests/test_judge.py::test_a_bf16_accumulator_fails_where_an_fp32_one_passes",),
        fast=True,
    ),
    Mutant(
        "tolerance-ignores-the-group",
        "cpbench/config/tolerances.py",
        'partials = group * ring if tensor in ("dk", "dv") else ring',
        "partials = ring",
        "the bound of dK/dV forgets the GQA group's roundings (real GQA cases would fail)",
        ("tests/test_judge.py::test_the_bound_is_the_error_model_by_hand",),
    ),
    # ---------------------------------------------------------- the sampled-row check
    Mutant(
        "rowcheck-reference-vs-itself",
        ROWCHECK,
        "error[0] = (got - ref).abs().max()",
        "error[0] = (ref - ref).abs().max()",
        "the full-length check compares the reference rows with themselves",
        ("tests/test_judge.py::test_row_check_passes_a_right_forward_and_fails_one_wrong_row",),
    ),
    Mutant(
        "rowcheck-always-passes",
        ROWCHECK,
        '"passed": max_error <= bound,',
        '"passed": True,',
        "the full-length check passes whatever the error",
        ("tests/test_judge.py::test_row_check_passes_a_right_forward_and_fails_one_wrong_row",),
        fast=True,
    ),
    Mutant(
        "rowcheck-reference-ignores-the-mask",
        ROWCHECK,
        'scores = scores.masked_fill(~keep, float("-inf"))',
        "scores = scores",
        "the rows' reference attends to every key whatever the mask",
        ("tests/test_judge.py::test_reference_rows_equal_the_full_reference_under_the_mask",),
    ),
    Mutant(
        "rowcheck-misses-the-last-row",
        ROWCHECK,
        "return torch.linspace(0, run_len - 1, rows).round().long().unique()",
        "return torch.linspace(0, run_len - 2, rows).round().long().unique()",
        "the sample never holds the last position, where long-range errors are largest",
        ("tests/test_judge.py::test_sampled_rows_are_spread_and_include_both_ends",),
    ),
    # ------------------------------------------------------ the byte comparison
    Mutant(
        "record-counter-returns-the-analytic-bytes",
        RECORD,
        "counted = [r.bytes.get(phase, {}) for r in per_rank]",
        "counted = [dict(expected) for r in per_rank]",
        "the measured bytes are the model's: measured == analytic whatever was sent",
        ("tests/test_judge.py::test_a_rank_that_sent_two_bytes_more_is_a_mismatch",),
        fast=True,
    ),
    Mutant(
        "record-bytes-match-on-any-rank",
        RECORD,
        "match = match and all(same_bytes(c, expected) for c in counted)",
        "match = match and any(same_bytes(c, expected) for c in counted)",
        "one rank's right bytes hide the others' wrong ones",
        ("tests/test_judge.py::test_a_rank_that_sent_two_bytes_more_is_a_mismatch",),
    ),
    Mutant(
        "record-bytes-match-by-total",
        RECORD,
        "match = match and all(same_bytes(c, expected) for c in counted)",
        "match = match and all(sum(c.values()) == sum(expected.values()) for c in counted)",
        "bytes moved from one collective to another pass when the total agrees",
        (
            "tests/test_judge.py::test_bytes_moved_between_collectives_are_a_mismatch_although_the_total_agrees",
        ),
    ),
    # --------------------------------------- the boundary counter (multi-rank tests)
    Mutant(
        "comm-all-to-all-sent-twice",
        COMM,
        "    with labelled(tag):\n        dist.all_to_all_single(out, x, group=group)\n",
        "    with labelled(tag):\n        dist.all_to_all_single(out, x, group=group)\n"
        "        dist.all_to_all_single(out, x, group=group)\n",
        "every all-to-all goes over the wire twice (same result): only a count of what is "
        "handed to torch.distributed sees it; the wrapper's own arithmetic (the old count) "
        "said once",
        BYTES_EQUAL,
    ),
    Mutant(
        "boundary-all-to-all-unlabelled",
        COMM,
        "    with labelled(tag):\n        dist.all_to_all_single(out, x, group=group)\n",
        "    with contextlib.nullcontext():\n        dist.all_to_all_single(out, x, group=group)\n",
        "the all-to-all is counted under the kind of call, not the model's collective",
        BYTES_EQUAL,
    ),
    Mutant(
        "boundary-all-to-all-ignores-splits",
        BOUNDARY,
        "    if not splits:\n        return total * (n - 1) // n",
        "    if True:\n        return total * (n - 1) // n",
        "uneven all-to-all splits counted as even ones",
        BOUNDARY_TEST,
    ),
    Mutant(
        "boundary-gather-counts-the-own-chunk",
        BOUNDARY,
        'record("all_gather", _nbytes(_arg(a, k, index, name)) * (n - 1))',
        'record("all_gather", _nbytes(_arg(a, k, index, name)) * n)',
        "an all-gather counted with the chunk a rank keeps",
        ("tests/test_allgather_scheme.py::test_counted_gather_bytes_equal_the_formulas",),
    ),
    Mutant(
        "boundary-prebuilt-p2pop-not-normalised",
        BOUNDARY,
        "        for op in sends:\n            op.op = counted_isend\n",
        "        for op in sends[:0]:\n            op.op = counted_isend\n",
        "a P2POp built before counting started is not counted (torch >= 2.12: rejected)",
        BOUNDARY_TEST,
    ),
    # -------------------------------------------------------------- the ring
    Mutant(
        "ring-merge-weights-swapped",
        RING,
        "out.mul_(old_w).add_(block_out.to(out.dtype) * new_w)",
        "out.mul_(new_w).add_(block_out.to(out.dtype) * old_w)",
        "the softmax merge weighs each partial output by the other's weight",
        RING_CASES,
    ),
    Mutant(
        "ring-merge-keeps-the-old-lse",
        RING,
        "    lse.copy_(new_lse)\n",
        "    lse.copy_(lse)\n",
        "the merge never updates the running log-sum-exp",
        RING_CASES,
    ),
    Mutant(
        "ring-dkv-drops-the-received-accumulator",
        RING,
        "dkv_acc = _add_grads(received, grads, kv)",
        "dkv_acc = _add_grads(None, grads, kv)",
        "a dK/dV hop's received accumulator is dropped: only the gradients (out is right)",
        RING_CASES,
    ),
    Mutant(
        "ring-dkv-last-hop-to-the-next-rank",
        RING,
        "spec.peer(-(steps - 1)) if last else spec.send_to,\n"
        "                    spec.peer(steps - 1) if last else spec.recv_from,",
        "spec.send_to,\n                    spec.recv_from,",
        "the dK/dV accumulator's last hop goes to the next rank, not home (shortened rings)",
        MASK_CASES,
    ),
    # ----------------------------------------------------------- the layouts
    Mutant(
        "layouts-unshard-uses-the-order-not-its-inverse",
        LAYOUTS,
        "inverse[order] = torch.arange(order.numel())",
        "inverse = order.clone()",
        "unshard puts tokens back by the forward permutation (right for contiguous only)",
        ("tests/test_layouts.py::test_shard_unshard_round_trip",),
        fast=True,
    ),
    Mutant(
        "layouts-shard-of-the-next-rank",
        LAYOUTS,
        "index = positions(seq_len, ulysses, ring, layout, rank, mask).to(x.device)",
        "index = positions(seq_len, ulysses, ring, layout, (rank + 1) % (ulysses * ring), mask)"
        ".to(x.device)",
        "each rank takes its neighbour's shard",
        ("tests/test_layouts.py::test_shard_unshard_round_trip",),
    ),
    # ------------------------------------------------------------ the cost model
    Mutant(
        "cost-more-bandwidth-is-slower",
        "cpbench/model/hardware/profile.py",
        "return calls * self.latency_s + bytes_sent * sharing / self.busbw",
        "return calls * self.latency_s + bytes_sent * sharing * self.busbw * 1e-22",
        "communication time grows with the link's bandwidth",
        ("tests/test_cost_model.py::test_more_bandwidth_is_never_slower",),
        fast=True,
    ),
    # --------------------------------------------- the cost model by hand, per scheme
    Mutant(
        "cost-ring-dkv-in-flight-one-hop-early",
        SCHEMES,
        "(dkv if first >= 2 else 0)",
        "(dkv if first >= 1 else 0)",
        "the ring backward counts a dK/dV accumulator in flight from step 1, one hop early "
        "(the own chunk's gradient stays home: the first leaves after step 1)",
        (
            f"{BY_HAND}test_ring_contiguous_forward_and_backward_by_hand",
            f"{BY_HAND}test_ring_zigzag_forward_and_backward_by_hand",
        ),
        fast=True,
    ),
    Mutant(
        "cost-ring-kv-hop-at-the-last-step",
        SCHEMES,
        "in_flight = (kv if first < k - 1 else 0)",
        "in_flight = (kv if first < k else 0)",
        "the ring posts a K/V hop at its last step too: k hops priced where k - 1 are sent",
        (
            f"{BY_HAND}test_ring_contiguous_forward_and_backward_by_hand",
            f"{BY_HAND}test_ring_zigzag_forward_and_backward_by_hand",
        ),
        fast=True,
    ),
    Mutant(
        "cost-ring-home-hop-hidden",
        SCHEMES,
        "        total += home\n        comm += home",
        "        comm += home",
        "the last dK/dV hop home is counted as communication but not waited for",
        (f"{BY_HAND}test_ring_zigzag_forward_and_backward_by_hand",),
        fast=True,
    ),
    Mutant(
        "cost-ring-step-at-the-mean-rank",
        SCHEMES,
        "alone = busiest_flops / rate + overhead + merge",
        "alone = mean_flops / rate + overhead + merge",
        "a ring step is priced at the mean rank's work, not the busiest's: contiguous's causal "
        "imbalance disappears",
        (f"{BY_HAND}test_ring_contiguous_forward_and_backward_by_hand",),
        fast=True,
    ),
    Mutant(
        "cost-ring-merge-on-every-head",
        "cpbench/model/cost/work.py",
        "q_elements = config.batch * config.ring_shard * config.heads_per_rank * config.head_dim",
        "q_elements = config.batch * config.ring_shard * config.heads * config.head_dim",
        "USP: the ring's fp32 merges are priced on all h query heads, not the h/U a rank holds",
        (f"{BY_HAND}test_usp_forward_and_backward_by_hand",),
        fast=True,
    ),
    Mutant(
        "cost-ulysses-all-to-all-on-the-send-recv-link",
        SCHEMES,
        "return intra.all_to_all.seconds(bytes_sent), [term]",
        "return intra.send_recv.seconds(bytes_sent), [term]",
        "Ulysses' all-to-alls inside a node are priced on the send/recv link cost",
        (f"{BY_HAND}test_ulysses_forward_and_backward_by_hand",),
        fast=True,
    ),
    Mutant(
        "cost-gather-reduce-scatter-one-stride-early",
        SCHEMES,
        "(rs_s if g >= 1 else 0.0)",
        "(rs_s if g >= 0 else 0.0)",
        "all-gather backward: a reduce-scatter is counted in flight during the stride that "
        "produces it",
        (f"{BY_HAND}test_all_gather_two_strides_by_hand",),
        fast=True,
    ),
    Mutant(
        "cost-gather-hides-nothing-behind-the-own-chunk",
        SCHEMES,
        "own = per_stride * own_share",
        "own = 0.0 * own_share",
        "all-gather: the first gather is not overlapped with the own chunk it is computed beside",
        (f"{BY_HAND}test_all_gather_one_stride_by_hand",),
        fast=True,
    ),
    Mutant(
        "cost-gather-next-stride-behind-the-rest-only",
        SCHEMES,
        "work_s = per_stride - own if g == short else per_stride",
        "work_s = per_stride - own if g == 0 else per_stride",
        "all-gather forward with strides: the next stride's gather hides behind the rest of "
        "the stride only, not the next stride's own chunk (the model before issue 38)",
        (f"{BY_HAND}test_all_gather_two_strides_by_hand",),
        fast=True,
    ),
    Mutant(
        "cost-prefill-ring-one-hop-too-many",
        INFERENCE_COST,
        "ring = (w - 1) * overlapped(step, hop, profile.overlap) + step",
        "ring = w * overlapped(step, hop, profile.overlap)",
        "pass-KV / pass-Q prefill: W hops priced where the ring sends W - 1",
        (f"{BY_HAND}test_prefill_pass_kv_by_hand",),
        fast=True,
    ),
    Mutant(
        "cost-prefill-pass-q-tail-one-call",
        INFERENCE_COST,
        'tail = tier.all_to_all.seconds(sent["a2a_out"] + sent["a2a_lse"], calls=2)',
        'tail = tier.all_to_all.seconds(sent["a2a_out"] + sent["a2a_lse"], calls=1)',
        "pass-Q: the outputs' and LSEs' all-to-alls home pay one latency for two calls",
        (f"{BY_HAND}test_prefill_pass_q_by_hand",),
        fast=True,
    ),
    Mutant(
        "cost-prefill-all-gather-not-overlapped",
        INFERENCE_COST,
        "first = overlapped(own, gather, profile.overlap)",
        "first = own + gather",
        "all-gather prefill: the gather is not overlapped with the own chunk's work",
        (f"{BY_HAND}test_prefill_all_gather_by_hand",),
        fast=True,
    ),
    Mutant(
        "cost-prefill-ulysses-q-kv-one-call",
        INFERENCE_COST,
        'sent["a2a_q"] + sent["a2a_kv"], calls=2',
        'sent["a2a_q"] + sent["a2a_kv"], calls=1',
        "Ulysses prefill: the Q and K/V all-to-alls pay one latency for two calls",
        (f"{BY_HAND}test_prefill_ulysses_by_hand",),
        fast=True,
    ),
    Mutant(
        "cost-decode-is-the-memory-read",
        INFERENCE_COST,
        "total = max(memory, compute) + comm + overhead",
        "total = memory + comm + overhead",
        "decode: the step is the K/V read even when the kernel takes longer",
        (f"{BY_HAND}test_decode_by_hand",),
        fast=True,
    ),
    Mutant(
        "cost-decode-merge-one-call",
        INFERENCE_COST,
        "comm = tier.all_to_all.seconds(sum(sent.values()), calls=2)",
        "comm = tier.all_to_all.seconds(sum(sent.values()), calls=1)",
        "decode: the merge's two calls (outputs, LSEs) pay one latency",
        (f"{BY_HAND}test_decode_by_hand",),
        fast=True,
    ),
    Mutant(
        "inference-all-gather-waits-before-the-own-chunk",
        "cpbench/attention/inference.py",
        "        _attend_chunk(kernel, q, q_runs, chunk, r, shards, scale, out, lse)\n"
        "        chunks = gathering.wait()\n",
        "        chunks = gathering.wait()\n"
        "        _attend_chunk(kernel, q, q_runs, chunk, r, shards, scale, out, lse)\n",
        "the all-gather prefill waits for the gather before computing the own chunk: slower "
        "than the overlap it is priced with",
        (f"{BY_HAND}test_the_all_gather_prefill_runs_the_overlap_it_is_priced_with",),
        fast=True,
    ),
    # ------------------------------------------------ the plan's memory by hand, per stage
    Mutant(
        "plan-zero-gradients-sharded-from-stage-1",
        PLAN_MEMORY,
        '("gradients", GRAD_BYTES, "fp32", 2, "ZeRO-2+")',
        '("gradients", GRAD_BYTES, "fp32", 1, "ZeRO-2+")',
        "ZeRO stage threshold off by one: gradients sharded from stage 1 instead of 2",
        (f"{MEMORY_BY_HAND}test_weight_gradient_and_optimizer_bytes_per_zero_stage",),
        fast=True,
    ),
    Mutant(
        "plan-zero-weights-sharded-from-stage-2",
        PLAN_MEMORY,
        '("weights", WEIGHT_BYTES, "bf16", 3, "ZeRO-3")',
        '("weights", WEIGHT_BYTES, "bf16", 2, "ZeRO-3")',
        "ZeRO stage threshold off by one: weights sharded from stage 2 instead of 3",
        (f"{MEMORY_BY_HAND}test_weight_gradient_and_optimizer_bytes_per_zero_stage",),
        fast=True,
    ),
    Mutant(
        "plan-zero-optimizer-sharded-from-stage-2",
        PLAN_MEMORY,
        '"fp32 master + Adam m, v", 1,',
        '"fp32 master + Adam m, v", 2,',
        "ZeRO stage threshold off by one: optimizer states sharded from stage 2 instead of 1",
        (f"{MEMORY_BY_HAND}test_weight_gradient_and_optimizer_bytes_per_zero_stage",),
        fast=True,
    ),
    Mutant(
        "plan-zero-shards-over-dp-alone",
        PLAN_MEMORY,
        "return self.dp * self.cp",
        "return self.dp",
        "ZeRO shards over the DP ranks alone, not DP x CP (the CP ranks hold the same weights)",
        (
            f"{MEMORY_BY_HAND}test_zero_shards_over_dp_times_cp_not_dp_alone",
            f"{MEMORY_BY_HAND}test_weight_gradient_and_optimizer_bytes_per_zero_stage",
        ),
        fast=True,
    ),
    Mutant(
        "plan-zero3-gathers-one-layer",
        PLAN_MEMORY,
        "ZERO3_GATHERED_LAYERS = 2",
        "ZERO3_GATHERED_LAYERS = 1",
        "ZeRO 3 holds one layer's full weights, not the running and the prefetched one",
        (f"{MEMORY_BY_HAND}test_weight_gradient_and_optimizer_bytes_per_zero_stage",),
        fast=True,
    ),
    # ------------------------------------------------------------- exit codes
    Mutant(
        "exit-bad-input-is-1",
        "cpbench/errors.py",
        "EXIT_BAD_INPUT = 2",
        "EXIT_BAD_INPUT = 1",
        "bad input exits 1, like a wrong result",
        ("tests/test_cli.py::test_bad_input_is_one_clear_line_and_exit_2",),
    ),
    Mutant(
        "exit-wrong-result-is-0",
        "cpbench/errors.py",
        "EXIT_WRONG_RESULT = 1",
        "EXIT_WRONG_RESULT = 0",
        "a wrong result (or a failed run) exits 0",
        ("tests/test_judge.py::test_verify_exits_1_when_a_case_failed_its_check",),
        fast=True,
    ),
    Mutant(
        "exit-verify-ignores-failures",
        "cpbench/cli/verify.py",
        "    if failed:\n        raise typer.Exit(EXIT_WRONG_RESULT)",
        "    if failed and not failed:\n        raise typer.Exit(EXIT_WRONG_RESULT)",
        "verify prints the failed cases and exits 0",
        ("tests/test_judge.py::test_verify_exits_1_when_a_case_failed_its_check",),
    ),
)
