"""`cpbench plan` against the published end-to-end rows (cpbench/data/published/end_to_end.toml):
predicted vs published tokens/s/GPU (or TFLOP/s/GPU) and memory, one line per row, or `--json`.

    PYTHONPATH=$PWD python benchmarks/plan_validation.py

(The lead wires `cpbench.model.plan.validation.validate_end_to_end` into `cpbench validate
--published`; this script runs it meanwhile.)
"""

from __future__ import annotations

import argparse
import json

from cpbench.model.plan.validation import end_to_end_json, validate_end_to_end


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON document")
    args = parser.parse_args()
    rows = end_to_end_json(validate_end_to_end())
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("tokens/s/GPU = global batch x L / step / GPUs; TFLOP/s/GPU = model FLOPs (MFU "
          "convention) / step / GPUs; memory GiB per rank: predicted tensor total (+ 2 GiB "
          "runtime reserve) vs published (what it counts: see --json)")
    for r in rows:
        metric = ("tok/s", r["published_tokens_per_s_per_gpu"],
                  r["predicted_tokens_per_s_per_gpu"], r["tokens_error"])
        if r["published_tokens_per_s_per_gpu"] is None:
            metric = ("TFLOP/s", r["published_tflops_per_gpu"], r["predicted_tflops_per_gpu"],
                      r["tflops_error"])
        name, pub, got, err = metric
        plan = r["plan"] or f"not planned: {r['rule']}"
        print(f"{r['id']:<28} {r['role']:<9} scale {r['peak_scale']:.3f} {plan:<32} {name} "
              f"pub {_num(pub)} pred {_num(got)} ({_pct(err)}); mem pub "
              f"{_num(r['published_memory_gib'], 1)} pred {_num(r['predicted_tensor_gib'], 1)}"
              f" (+reserve {_num(r['predicted_with_reserve_gib'], 1)}) of "
              f"{r['capacity_gib']:.1f}")


if __name__ == "__main__":
    main()
