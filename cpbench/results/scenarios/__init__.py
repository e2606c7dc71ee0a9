"""Scenarios: TOML files that describe a sweep, and the benchmark points they expand to.

A scenario holds run settings (world size, device, warm-up, iterations, timeout) and an `[axes]`
table; `Scenario.expand` takes the product of the axes and pairs every point (`BenchConfig`)
with its `Feasibility`. Infeasible points are kept: the sweep records them as `skipped` with the
rule that rejects them. The file is described by the pydantic models `ScenarioFile` and
`ScenarioAxes` (strict types, no unknown keys); mistakes in it (unknown keys, wrong types, a mesh
that does not multiply to the world size) raise `CpbenchError` naming the file, the key, the
value and the rule: `<file>: key '<key>': <value> <rule>`, the first problem only.

```toml
name = "example"
world_size = 4              # or "auto": all local GPUs on cuda, 4 ranks on cpu
device = "cpu"              # auto | cpu | cuda

[axes]
seq_len = [1024, 2048]
heads = 8
kv_heads = [8, 2]           # or gqa_ratio = [1, 4]
head_dim = 64
mesh = "all"                # or ["4x1", "2x2"] or [[4, 1], [2, 2]]
layout = ["zigzag", "contiguous"]
impl = ["cpbench", "torch_cp"]   # optional: external implementations (cpbench.impls)
documents = ["none", "lognormal:mean=1024"]   # optional: packed documents (see below)
window = ["none", 1024]                      # optional: sliding windows
```

Masks: `documents` takes the sources `cpbench.config.documents.resolve_documents` takes
(explicit lengths "512,512,...", a file of lengths, or a distribution such as
"lognormal:mean=1024,max=8192"), or "none" (one document); each is resolved for every seq_len
with the scenario's `seed` (top level, default 0), and the resolved lengths go into the
configuration (a file path is taken relative to the scenario file when it is there). `window`
takes positive token counts (a window >= L is allowed: it sees everything causal does) or
"none". Both need a causal mask.

Further products: each `[[also]]` table overrides some axes of `[axes]`; the sweep runs the
product of `[axes]`, then the product of each `[[also]]` table's axes (a configuration already
listed is not run twice), e.g. a sliding-window study next to a layout study:

```toml
[[also]]
documents = "none"
layout = "contiguous"
window = ["none", 1024]
```

Inference: `phase = "prefill"` or `"decode"` times one forward step of `new_tokens` (T) on
`cached_len` (P, default 0) cached tokens instead of a training step over `seq_len` (which an
inference table does not take, nor the training step's mesh, layout, kv_replication, impl,
documents, window, cp_comm and heads_k_stride: the mesh is the step's, W x 1 for the ulysses
prefill scheme and 1 x W otherwise, its shards contiguous). A prefill takes `scheme` (pass_kv,
pass_q, all_gather, ulysses; default pass_kv), a decode `cache_layout` (contiguous,
interleaved; default contiguous) and 1 to 8 new tokens; `batch` is the decode batch. One table
is training or inference; an `[[also]]` table that names the other kind of phase drops the
axes of the first kind it does not set:

```toml
[axes]
heads = 8
head_dim = 64
phase = "prefill"
cached_len = [0, 4096]
new_tokens = [64, 4096]
scheme = ["pass_kv", "pass_q"]

[[also]]
phase = "decode"
new_tokens = [1, 4]
cache_layout = ["contiguous", "interleaved"]
batch = [1, 8]
```

By job (pure Python, no torch: the CLI lists and validates scenarios without importing it):

- file_schema.py: the file's layout, the pydantic models `ScenarioFile`, `ScenarioSettings`
  and `ScenarioAxes`;
- messages.py: a validation error in the words above;
- scenario.py: the runtime `Scenario` (the validated settings and axes in one model) and its
  expansion into benchmark points;
- loading.py: `parse_scenario`, `load_scenario` (a path, a built-in or a ./scenarios name),
  `available_scenarios`, `default_scenario`.
"""
