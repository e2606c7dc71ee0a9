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

By job (pure Python, no torch: the CLI lists and validates scenarios without importing it):

- file_schema.py: the file's layout, the pydantic models `ScenarioFile`, `ScenarioSettings`
  and `ScenarioAxes`;
- messages.py: a validation error in the words above;
- scenario.py: the runtime `Scenario` (the validated settings and axes in one model) and its
  expansion into benchmark points;
- loading.py: `parse_scenario`, `load_scenario` (a path, a built-in or a ./scenarios name),
  `available_scenarios`, `default_scenario`.
"""
