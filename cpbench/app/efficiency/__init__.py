"""`cpbench efficiency`: cpbench's own schemes side by side with the libraries, against a
single-process baseline measured in the same run, so that cpbench's comparisons are not biased
by overhead of its own.

For each world size P and dtype, on one pool of P ranks (gloo on CPU, NCCL on GPU, one thread
per rank by default):

* the cases: the single-process fused SDPA step (the baseline: the whole problem on rank 0,
  with the local kernel cpbench picks, the other ranks idle at a barrier), and every mesh
  U x R of P each implementation can express, with the layouts zigzag and contiguous where
  R > 1 (cpbench: every factorization; torch_cp: U = 1; ring_flash_attn: U = 1; yunchang:
  every factorization; what an implementation refuses is listed with its reason);
* the step: causal forward + backward on random shards (`cpbench.bench.reference.
  random_shards`), through the implementation's adapter (`cpbench.impls`);
* every case is prepared and warmed up on its own first (a case that fails is reported
  `failed`, the others still run); then `rounds` interleaved rounds: round r times every case
  once, in the case order rotated by r, each iteration starting at a barrier; an iteration's
  time is the max over ranks;
* per case: best (min over rounds), median, spread = (max - min) / median, and the parallel
  efficiency `t_single / (P x t_case)` from the best and from the median times; cpbench's
  cases also carry their ratio to the fastest library on the same mesh and layout.

No correctness check runs here (`cpbench verify` and the sweep do that); this measures time.

`profile_steps` is the other half: one ring step and one Ulysses step under torch.profiler
(CPU, plus CUDA device time on a GPU), the time split into attention kernels, copies, fills,
elementwise merge / accumulation, communication calls, waits and the rest (docs/profile.md).

By job: cases.py (settings, cases, what can run, the report's types), measure.py (the pool
tasks and the interleaved rounds: `run_efficiency`), profile.py (`profile_steps`).
"""
