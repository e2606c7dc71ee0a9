"""The Python half of the GPU acceptance run (benchmarks/gpu_acceptance.sh).

    python benchmarks/acceptance_summary.py plan OUT_DIR --template scenarios/gpu-acceptance.toml
        --inference-template scenarios/gpu-inference.toml [--dry-run]
    python benchmarks/acceptance_summary.py summary OUT_DIR > OUT_DIR/summary.md

`plan` reads OUT_DIR/doctor.json (validated through `DoctorReport`), writes doctor.txt (the
same report as `cpbench doctor` prints it), scenario.toml (the template with its backend axis
set to the kernels doctor finds usable in bf16; in the dry run also tiny sizes, the CPU and 2
ranks), inference.toml (the inference template, `--inference-template`; the dry run's sizes
likewise) and plan.json, and prints one line for the script: `DEVICE WORLD IMPL[,...]
KERNEL[,...]` (the implementations to verify: cpbench and every usable external one, the dry
run taking each library once, without its variants; the usable kernels, each verified on the
inference path). Without a GPU outside the dry run it exits 2 with the reason.

`summary` writes the one-page markdown summary of a run's folder: the machine and versions, the
steps with their exit codes and seconds, verify counts per implementation and kind (training,
prefill, decode), TFLOP/s per kernel, the inference sweep's time to first token and decode
latency per scheme, the memory sources of the sweep records and every configuration that did
not run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

import tomli_w
from rich.console import Console

from cpbench.app.doctor.schema import DoctorReport
from cpbench.app.doctor.statuses import impl_statuses, kernel_statuses, probe_config
from cpbench.config.impls import base_name
from cpbench.config.vocabulary import Device
from cpbench.render.doctor import render_doctor
from cpbench.results.scenarios.loading import load_scenario
from cpbench.results.store import read_records
from cpbench.units import format_memory

DTYPE = "bfloat16"
"""The dtype of the acceptance run (verify and sweep): what training runs in."""
DRY_WORLD_SIZE = 2
DRY_SETTINGS: dict[str, Any] = {
    "name": "gpu-acceptance-dry",
    "description": "Dry run of the GPU acceptance sweep: the same axes, tiny sizes, 2 gloo ranks.",
    "world_size": DRY_WORLD_SIZE,
    "device": "cpu",
    "warmup": 0,
    "iters": 1,
    "precision": "off",  # one timed step: the script is checked, not the CPU's speed
    "timeout": 60,
    "check_max_seq_len": 256,
}
"""Top-level settings the dry run puts over the template's."""
DRY_AXES: dict[str, Any] = {"seq_len": [256], "heads": 4, "kv_heads": 2, "head_dim": 32}
"""Axes the dry run puts over the template's: sizes a 2-core CPU runs in seconds."""
DRY_INFERENCE_SIZES: dict[str, Any] = {"heads": 4, "kv_heads": 2, "head_dim": 32}
"""Sizes the dry run puts over every table of the inference template, with one length per axis
(the last) cut by DRY_LENGTH_DIVISOR (and at least 1 token), one batch: every scheme and cache
layout still runs."""
DRY_LENGTH_DIVISOR = 64
"""The inference template's cached_len / new_tokens over this in the dry run (16K -> 256)."""


def _dry_inference_table(table: dict[str, Any]) -> dict[str, Any]:
    def cut(value: Any) -> Any:
        if isinstance(value, list):
            return [cut(v) for v in value]
        return value if value == 0 else max(1, value // DRY_LENGTH_DIVISOR)

    def last(value: Any) -> Any:  # one length per axis: the script is checked, not the CPU
        return value[-1] if isinstance(value, list) else value

    out = {**table, **DRY_INFERENCE_SIZES}
    if "cached_len" in out:
        out["cached_len"] = cut(last(out["cached_len"]))
    if "new_tokens" in out:  # a decode's 1-8 tokens stay
        out["new_tokens"] = last(out["new_tokens"]) if out.get("phase") == "decode" else cut(
            last(out["new_tokens"]))
    if "batch" in out:
        out["batch"] = last(out["batch"])
    return out


# ----------------------------------------------------------------------------- plan


def _write_scenario(path: Path, template: Path, data: dict[str, Any]) -> None:
    path.write_text(
        f"# written by benchmarks/acceptance_summary.py plan from {template.name}\n"
        + tomli_w.dumps(data)
    )
    load_scenario(str(path))  # a mistake in the template stops the run here


def plan(out: Path, template: Path, inference_template: Path, dry: bool) -> dict[str, Any]:
    """Write doctor.txt, scenario.toml, inference.toml and plan.json under `out`; return the
    plan."""
    report = DoctorReport.model_validate_json((out / "doctor.json").read_text())
    with (out / "doctor.txt").open("w", encoding="utf-8") as f:
        console = Console(file=f, width=100, no_color=True, highlight=False)
        for renderable in render_doctor(report):
            console.print(renderable)
    device: Device = "cpu" if dry else report.device
    if device != "cuda" and not dry:
        raise SystemExit(
            f"no GPU: {report.summary[0]}. Run `{sys.argv[0]} ... --dry-run` for the CPU "
            "rehearsal of the acceptance run"
        )
    world = DRY_WORLD_SIZE if dry else report.cuda_device_count
    # doctor checked its own device (and the impls on 2 CPU ranks or every GPU): a dry run on a
    # GPU machine checks the CPU here
    same = device == report.device
    kernels = report.kernels if same else kernel_statuses(device)
    backends = [k.name for k in kernels if k.dtype == DTYPE and k.usable and k.name != "auto"]
    impls = report.impls if same else impl_statuses(probe_config(device, world))
    usable_impls = [i.name for i in impls if i.usable]
    if dry:  # each library once (its default variant): the dry run stays under a minute
        first: dict[str, str] = {}
        for name in usable_impls:
            first.setdefault(base_name(name), name)
        usable_impls = list(first.values())

    data = tomllib.loads(template.read_text())
    data["axes"]["backend"] = backends
    data["axes"]["dtype"] = DTYPE
    if dry:
        data.update(DRY_SETTINGS)
        data["axes"].update(DRY_AXES)
    _write_scenario(out / "scenario.toml", template, data)
    inference = tomllib.loads(inference_template.read_text())
    if dry:
        inference.update({**DRY_SETTINGS, "name": "gpu-inference-dry",
                          "description": "Dry run of the GPU acceptance inference sweep."})
        inference["axes"] = _dry_inference_table(inference["axes"])
        inference["also"] = [_dry_inference_table(t) for t in inference.get("also", [])]
    _write_scenario(out / "inference.toml", inference_template, inference)
    result = {
        "dry_run": dry,
        "device": device,
        "world_size": world,
        "dtype": DTYPE,
        "kernels": backends,
        "refused_kernels": {
            k.name: k.reason for k in kernels if k.dtype == DTYPE and not k.usable
        },
        "impls": usable_impls,
        "refused_impls": {i.name: i.reason for i in impls if not i.usable},
        "template": str(template),
        "inference_template": str(inference_template),
    }
    (out / "plan.json").write_text(json.dumps(result, indent=1))
    return result


# ----------------------------------------------------------------------------- summary


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _steps(out: Path) -> list[tuple[str, str, str]]:
    try:
        lines = (out / "steps.tsv").read_text().splitlines()
    except OSError:
        return []
    steps: list[tuple[str, str, str]] = []
    for line in lines:
        if line.strip():
            name, rc, seconds = (line.split("\t") + ["", "", ""])[:3]
            steps.append((name, rc, seconds))
    return steps


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def _tflops(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def verify_counts(doc: dict[str, Any] | None, kind: str | None = None) -> dict[str, Any]:
    """passed / failed / skipped counts and the worst error-to-tolerance ratio of one
    `cpbench verify --json` document (None: the step wrote nothing readable), of its cases of
    one kind (`case_kind`) when given."""
    if not doc:
        return {"passed": 0, "failed": 0, "skipped": 0, "worst": None, "readable": False}
    cases = [c for c in doc.get("cases", []) if kind is None or case_kind(c) == kind]
    ratios = [c["max_error"] / c["tolerance"] for c in cases
              if c.get("tolerance") and c.get("max_error") is not None]
    return {
        "passed": sum(c.get("passed") is True for c in cases),
        "failed": sum(c.get("passed") is False for c in cases),
        "skipped": sum(c.get("passed") is None for c in cases),
        "worst": max(ratios) if ratios else None,
        "readable": True,
    }


def case_kind(case: dict[str, Any]) -> str:
    """training, prefill or decode: what a verify case checks (`inference` marks the last two)."""
    return str(case.get("inference") or "training")


def inference_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per inference step kind (prefill by scheme, decode by cache layout): points ok and not,
    and the ok points' best and worst seconds (prefill: time to first token; decode: seconds
    per decode step) with their configuration, and the best tokens/s."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        step = (r.get("config") or {}).get("inference")
        if not step or r.get("status") == "skipped":
            continue
        what = step.get("scheme") if step["phase"] == "prefill" else step.get("cache_layout")
        groups.setdefault(f"{step['phase']} {what}", []).append(r)
    rows = []
    for name, rs in groups.items():
        ok = [r for r in rs if r.get("status") == "ok" and r.get("inference")]

        def seconds(r: dict[str, Any]) -> float:
            section = r["inference"]
            return float(section.get("ttft_s") or section.get("step_latency_s") or 0.0)

        fastest = min(ok, key=seconds, default=None)
        slowest = max(ok, key=seconds, default=None)
        rows.append({
            "step": name,
            "ok": len(ok),
            "not_ok": Counter(r.get("status") for r in rs if r not in ok),
            "fastest": None if fastest is None else (seconds(fastest), _step_label(fastest)),
            "slowest": None if slowest is None else (seconds(slowest), _step_label(slowest)),
            "best_tokens_per_s": max((r["inference"]["tokens_per_s"] for r in ok), default=None),
        })
    return rows


def _step_label(r: dict[str, Any]) -> str:
    c = r.get("config", {})
    step = c.get("inference") or {}
    return f"P{step.get('cached_len')} T{step.get('new_tokens')} B{c.get('batch')}"


def _ms(value: tuple[float, str] | None) -> str:
    return "-" if value is None else f"{value[0] * 1e3:.3g} ms ({value[1]})"


def kernel_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kernel actually run (config.kernel, else the one requested): configurations ok and
    not, best and median TFLOP/s (all ranks), best TFLOP/s per GPU and its configuration."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("status") == "skipped":
            continue
        config = r.get("config", {})
        groups.setdefault(config.get("kernel") or config.get("backend", "?"), []).append(r)
    rows = []
    for kernel, rs in groups.items():
        ok = [r for r in rs if r.get("status") == "ok" and r.get("flops")]
        tflops = [r["flops"]["achieved_tflops"] for r in ok]
        best = max(ok, key=lambda r: r["flops"]["achieved_tflops"], default=None)
        per_gpu = [r["flops"].get("achieved_tflops_per_rank") for r in ok]
        rows.append({
            "kernel": kernel,
            "ok": len(ok),
            "not_ok": Counter(r.get("status") for r in rs if r not in ok),
            "best_tflops": max(tflops, default=None),
            "median_tflops": statistics.median(tflops) if tflops else None,
            "best_tflops_per_gpu": max((v for v in per_gpu if v is not None), default=None),
            "best_config": _label(best) if best else None,
        })
    return sorted(rows, key=lambda row: -(row["best_tflops"] or 0))


def _label(r: dict[str, Any]) -> str:
    c = r.get("config", {})
    return (f"L{c.get('seq_len')} {c.get('ulysses')}x{c.get('ring')} {c.get('layout')}, "
            f"{(r.get('timing') or {}).get('median', 0) * 1e3:.2f} ms")


def memory_sources(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What measured the memory of the ok records: `memory.source` (the probe of peak_bytes)
    and `memory.sources` (each measured field: what measured it, the text before its first
    colon), counted over records; the fields that hold numbers; the largest peak per rank."""
    sources: Counter[str] = Counter()
    fields: Counter[str] = Counter()
    peak: float | None = None
    for r in records:
        memory = r.get("memory") or {}
        if r.get("status") != "ok" or not memory:
            continue
        named = dict(memory.get("sources") or {})
        if memory.get("source") and "peak_bytes" not in named:
            named["peak_bytes"] = memory["source"]
        for field, text in named.items():
            sources[f"{field}: {str(text).split(':', 1)[0].strip()}"] += 1
        for key, value in memory.items():
            if key in ("source", "sources") or value is None:
                continue
            if isinstance(value, list) and all(v is None for v in value):
                continue
            fields[key] += 1
        peaks = [p for p in memory.get("peak_bytes") or [] if p is not None]
        if peaks:
            peak = max(peak or 0, *peaks)
    return {"sources": dict(sources), "fields": dict(fields), "peak_bytes": peak}


def build_summary(out: Path) -> str:
    """The markdown summary of an acceptance run's folder (whatever of it exists)."""
    doctor = _load_json(out / "doctor.json") or {}
    plan_data = _load_json(out / "plan.json") or {}
    lines = []
    host = doctor.get("hostname", "?")
    title = "cpbench GPU acceptance" + (" (dry run on CPU)" if plan_data.get("dry_run") else "")
    lines += [f"# {title}: {host}", ""]
    for sentence in doctor.get("summary", []):
        lines.append(f"- {sentence}")
    gpus = doctor.get("gpus", [])
    if gpus:
        names = Counter(f"{g['name']} ({_gib(g.get('memory_total_bytes'))})" for g in gpus)
        lines.append("- GPUs: " + ", ".join(f"{n} x {name}" for name, n in names.items()))
    topo = doctor.get("topology") or {}
    if topo.get("matrix") and not topo.get("reason"):
        links = Counter(c for row in topo["matrix"] for c in row if c != "X")
        lines.append(f"- interconnect ({topo.get('source')}): "
                     + ", ".join(f"{k} x{v // 2}" for k, v in sorted(links.items())))
    if plan_data:
        lines.append(
            f"- run: {plan_data['device']}, world size {plan_data['world_size']}, "
            f"{plan_data['dtype']}; kernels {', '.join(plan_data['kernels']) or 'none'}; "
            f"impls {', '.join(plan_data['impls']) or 'none'}"
        )
    lines.append("")

    lines += ["## Versions", ""]
    versions = [
        ("torch", doctor.get("torch")), ("CUDA", doctor.get("torch_cuda")),
        ("NCCL", doctor.get("nccl")), ("cuDNN", doctor.get("cudnn")),
        ("driver", (doctor.get("nvml") or {}).get("driver_version")),
    ] + [(p["name"], p.get("version")) for p in doctor.get("packages", [])
         if p["name"] != "torch"]
    lines += _table([name for name, _ in versions], [[v or "-" for _, v in versions]])
    lines.append("")

    steps = _steps(out)
    lines += ["## Steps", ""]
    lines += _table(["step", "exit", "seconds"], [list(s) for s in steps]) if steps else [
        "no steps recorded"]
    lines.append("")

    try:
        pytest_lines = (out / "cuda-kernels.txt").read_text().strip().splitlines()
    except OSError:
        pytest_lines = []
    if pytest_lines:
        lines += ["## Kernels against float64 (tests/test_cuda_kernels.py)", "",
                  pytest_lines[-1].strip("= "), ""]

    lines += [f"## Verify ({plan_data.get('dtype', DTYPE)})", ""]
    rows = []
    for path in sorted(out.glob("verify-*.json")):
        doc = _load_json(path)
        run = path.stem.removeprefix("verify-")
        if not verify_counts(doc)["readable"]:
            rows.append([run, "-", "-", "-", "-", "no result (see logs)"])
            continue
        for kind in dict.fromkeys(case_kind(c) for c in doc.get("cases", [])):
            counts = verify_counts(doc, kind)
            worst = counts["worst"]
            rows.append([run, kind, str(counts["passed"]), str(counts["failed"]),
                         str(counts["skipped"]), "-" if worst is None else f"{worst:.2f}"])
    lines += _table(["run", "cases", "passed", "failed", "skipped", "worst error / tolerance"],
                    rows) if rows else ["verify did not run"]
    lines += ["", "run: the implementation, or inference-KERNEL (`verify --inference --kernel "
              "KERNEL`: its training cases, prefill and decode)."]
    lines.append("")

    inference_records: list[dict[str, Any]] = []
    if (out / "inference.jsonl").exists():
        inference_records = read_records(out / "inference.jsonl")
    lines += ["## Inference (sweep)", ""]
    inference_statuses = Counter(r.get("status") for r in inference_records)
    lines.append(f"{len(inference_records)} records: " + (", ".join(
        f"{n} {s}" for s, n in sorted(inference_statuses.items())) or "none"))
    lines.append("")
    irows = inference_rows(inference_records)
    if irows:
        lines += _table(
            ["step", "ok", "not ok", "fastest", "slowest", "best tokens/s"],
            [[row["step"], str(row["ok"]),
              ", ".join(f"{n} {s}" for s, n in row["not_ok"].items()) or "-",
              _ms(row["fastest"]), _ms(row["slowest"]),
              "-" if row["best_tokens_per_s"] is None else f"{row['best_tokens_per_s']:,.0f}"]
             for row in irows],
        )
        lines += ["", "prefill: time to first token (median seconds of one prefill of T new "
                  "tokens on P cached); decode: median seconds per decode step of T tokens at "
                  "a batch of B; tokens/s = B x T / that median."]
    lines.append("")

    records: list[dict[str, Any]] = []
    if (out / "sweep.jsonl").exists():
        records = read_records(out / "sweep.jsonl")
    statuses = Counter(r.get("status") for r in records)
    lines += ["## Kernels (sweep)", ""]
    lines.append(f"{len(records)} records: "
                 + (", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "none"))
    lines.append("")
    krows = kernel_rows(records)
    if krows:
        lines += _table(
            ["kernel", "ok", "not ok", "best TFLOP/s", "median TFLOP/s", "best TFLOP/s per GPU",
             "best configuration"],
            [[k["kernel"], str(k["ok"]),
              ", ".join(f"{n} {s}" for s, n in k["not_ok"].items()) or "-",
              _tflops(k["best_tflops"]), _tflops(k["median_tflops"]),
              _tflops(k["best_tflops_per_gpu"]), k["best_config"] or "-"] for k in krows],
        )
        lines += ["", "TFLOP/s: attention FLOPs of one fwd+bwd step over all ranks / median "
                  "step time; per GPU: divided by the world size."]
    lines.append("")

    memory = memory_sources(records)
    lines += ["## Memory", ""]
    lines.append("- sources: " + ("; ".join(f"{s} ({n} records)" for s, n in
                                            memory["sources"].items()) or "none"))
    lines.append("- fields measured: " + (", ".join(memory["fields"]) or "none"))
    lines.append(f"- largest peak per rank (peak_bytes): {format_memory(memory['peak_bytes'])}")
    lines.append("")

    both = records + inference_records
    not_run = [r for r in both if r.get("status") in ("failed", "timeout")]
    wrong = [r for r in both if (r.get("accuracy") or {}).get("passed") is False]
    if not_run or wrong:
        lines += ["## Problems", ""]
        for r in wrong:
            lines.append(f"- wrong result: {r['id']}")
        for r in not_run:
            error = str(r.get("error") or "").strip().splitlines()
            lines.append(f"- {r['status']}: {r['id']}: {error[0][:200] if error else ''}")
        lines.append("")
    report = _load_json(out / "report.json")
    if report:
        lines.append(f"Report: {Path(report['output']).name} ({report.get('records')} records, "
                     f"{report.get('figures')} figures)")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_plan = sub.add_parser("plan", help="doctor.json -> doctor.txt, scenario.toml, plan.json")
    p_plan.add_argument("out", type=Path)
    p_plan.add_argument("--template", type=Path, required=True)
    p_plan.add_argument("--inference-template", type=Path, required=True)
    p_plan.add_argument("--dry-run", action="store_true")
    p_sum = sub.add_parser("summary", help="the markdown summary of a run's folder, on stdout")
    p_sum.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "plan":
        result = plan(args.out, args.template, args.inference_template, args.dry_run)
        print(result["device"], result["world_size"], ",".join(result["impls"]),
              ",".join(result["kernels"]))
    else:
        sys.stdout.write(build_summary(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
