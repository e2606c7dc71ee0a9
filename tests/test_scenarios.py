"""Scenario files: parsing, validation messages, expansion and the shipped scenarios."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cpbench.config.bench import BenchConfig, factorizations
from cpbench.errors import CpbenchError
from cpbench.results.scenarios.file_schema import (
    AXIS_KEYS,
    TOP_LEVEL_KEYS,
    ScenarioAxes,
    ScenarioFile,
)
from cpbench.results.scenarios.loading import (
    BUILTIN,
    available_scenarios,
    default_scenario,
    load_scenario,
    parse_scenario,
)
from cpbench.results.scenarios.scenario import Scenario

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

ROOT = Path(__file__).resolve().parents[1]

# name -> (device, world size used for the expansion, points, feasible)
SHIPPED = {
    "cpu-smoke": ("cpu", 4, 24, 24),
    "gpu-node": ("cuda", 8, 8, 8),
    "llama3-8b-node": ("cuda", 8, 32, 32),
    "gqa-ratio": ("cuda", 8, 24, 24),
    "layout-study": ("cuda", 8, 12, 12),
    "two-node": ("cuda", 16, 8, 8),
    "cpu-world4": ("cpu", 4, 18, 18),
    "gpu-acceptance": ("cuda", 8, 48, 48),
    "packed-documents": ("cpu", 4, 10, 10),
    "cpu-inference": ("cpu", 2, 24, 24),
    "gpu-inference": ("cuda", 8, 24, 24),
    "dynamic-cp": ("cpu", 4, 0, 0),  # no [axes]: a [dynamic] study only
}


@pytest.fixture
def in_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(ROOT)
    return ROOT


def write(tmp_path: Path, text: str, name: str = "x.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


BASE = """
name = "t"
world_size = 8
device = "cuda"

[axes]
seq_len = 4096
heads = 32
kv_heads = 8
head_dim = 128
"""


def minimal(**axes: object) -> dict:
    base: dict = {"seq_len": 4096, "heads": 8, "kv_heads": 8, "head_dim": 64}
    base.update(axes)
    return {"name": "t", "world_size": 4, "device": "cpu", "axes": base}


# --- shipped scenarios ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_scenarios_parse_and_expand(in_root: Path, name: str) -> None:
    device, world, points, feasible = SHIPPED[name]
    scenario = load_scenario(name)
    assert scenario.name == name
    assert scenario.description
    if scenario.world_size != "auto":
        assert scenario.world_size == world
    expanded = scenario.expand(device, world)
    assert len(expanded) == points
    assert sum(f.ok for _, f in expanded) == feasible
    assert all(c.world_size == world and c.device == device for c, _ in expanded)


def test_every_scenario_file_is_in_the_table(in_root: Path) -> None:
    files = {p.stem for p in (ROOT / "scenarios").glob("*.toml")}
    files |= {p.stem for p in (ROOT / "cpbench" / "data").glob("*.toml")}
    assert files == set(SHIPPED)
    assert set(available_scenarios()) == set(SHIPPED)


def test_load_by_path_and_builtin_source(in_root: Path) -> None:
    assert load_scenario("scenarios/gqa-ratio.toml").source == "scenarios/gqa-ratio.toml"
    assert load_scenario("gqa-ratio").source == "scenarios/gqa-ratio.toml"
    assert load_scenario("cpu-smoke").source == BUILTIN


def test_cpu_smoke_default() -> None:
    scenario = default_scenario("cpu")
    assert scenario.name == "cpu-smoke"
    assert scenario.resolve("auto", 0) == ("cpu", 4)
    expanded = scenario.expand("cpu", 4)
    feasible = [c for c, f in expanded if f.ok]
    assert len(feasible) >= 12
    assert {(c.ulysses, c.ring) for c in feasible} == {(1, 4), (2, 2), (4, 1)}
    assert {c.layout for c in feasible} >= {"zigzag", "contiguous"}
    assert any(c.kv_heads < c.heads for c in feasible)
    assert {c.dtype for c in feasible} == {"float32"}


def test_gpu_default_uses_every_local_gpu() -> None:
    scenario = default_scenario("cuda")
    assert scenario.name == "gpu-node"
    assert scenario.world_size == "auto"
    assert scenario.resolve("auto", 4) == ("cuda", 4)
    meshes = {(c.ulysses, c.ring) for c, _ in scenario.expand("cuda", 4)}
    assert meshes == {(1, 4), (2, 2), (4, 1)}


def test_keys_unique_across_every_shipped_expansion(in_root: Path) -> None:
    for name, (device, world, _, _) in SHIPPED.items():
        keys = [c.key for c, _ in load_scenario(name).expand(device, world)]
        assert len(keys) == len(set(keys)), name


# --- expansion -----------------------------------------------------------------------------


def test_mesh_all_is_every_factorisation() -> None:
    scenario = parse_scenario(minimal(mesh="all"), "x.toml")
    assert [(c.ulysses, c.ring) for c, _ in scenario.expand("cpu", 4)] == [(1, 4), (2, 2), (4, 1)]
    auto = parse_scenario({**minimal(heads=12, kv_heads=12), "world_size": "auto"}, "x.toml")
    assert [(c.ulysses, c.ring) for c, _ in auto.expand("cpu", 6)] == factorizations(6)
    assert factorizations(6) == [(1, 6), (2, 3), (3, 2), (6, 1)]


def test_mesh_strings_and_pairs() -> None:
    scenario = parse_scenario(minimal(mesh=["4x1", [2, 2], "1 x 4"]), "x.toml")
    assert scenario.mesh == ((4, 1), (2, 2), (1, 4))


def test_gqa_ratio_equals_kv_heads() -> None:
    data = minimal(gqa_ratio=[1, 4])
    del data["axes"]["kv_heads"]
    by_ratio = parse_scenario(data, "x.toml")
    by_heads = parse_scenario(minimal(kv_heads=[8, 2]), "x.toml")
    assert (by_ratio.kv_heads, by_ratio.gqa_ratio) == (None, (1, 4))
    keys_ratio = [c.key for c, _ in by_ratio.expand("cpu", 4)]
    keys_heads = [c.key for c, _ in by_heads.expand("cpu", 4)]
    assert keys_ratio == keys_heads


def test_no_kv_axis_means_mha() -> None:
    data = minimal()
    del data["axes"]["kv_heads"]
    configs = [c for c, _ in parse_scenario(data, "x.toml").expand("cpu", 4)]
    assert {c.kv_heads for c in configs} == {8}


def test_infeasible_points_are_kept_with_their_reason(in_root: Path) -> None:
    scenario = load_scenario("gqa-ratio").model_copy(update={"kv_replication": (1,)})
    expanded = scenario.expand("cuda", 8)
    assert len(expanded) == 24
    skipped = {(c.ulysses, c.kv_heads): f for c, f in expanded if not f.ok}
    assert set(skipped) == {(8, 4), (8, 2), (8, 1), (4, 2), (4, 1), (2, 1)}
    assert "replicate KV x8" in skipped[(8, 1)].reason
    # automatic replication makes the same points run, with their copies
    auto = {(c.ulysses, c.kv_heads): f for c, f in load_scenario("gqa-ratio").expand("cuda", 8)}
    assert auto[(8, 1)].ok and auto[(8, 1)].kv_replication == 8
    # heads not divisible by ulysses: skipped, not dropped
    odd = parse_scenario({**minimal(heads=8, kv_heads=8), "world_size": 6}, "x.toml")
    reasons = {(c.ulysses, c.ring): f.reason for c, f in odd.expand("cpu", 6)}
    assert len(reasons) == 4
    assert "must divide heads (8)" in reasons[(3, 2)]


def test_default_dtype_follows_device() -> None:
    scenario = parse_scenario({**minimal(), "world_size": "auto"}, "x.toml")
    assert {c.dtype for c, _ in scenario.expand("cpu", 4)} == {"float32"}
    assert {c.dtype for c, _ in scenario.expand("cuda", 4)} == {"bfloat16"}


def test_kv_replication_values() -> None:
    scenario = parse_scenario(minimal(kv_replication=["auto", "off", 2]), "x.toml")
    assert scenario.kv_replication == (None, 1, 2)


def test_resolve() -> None:
    scenario = parse_scenario({**minimal(), "world_size": "auto", "device": "auto"}, "x.toml")
    assert scenario.resolve("auto", 0) == ("cpu", 4)
    assert scenario.resolve("auto", 8) == ("cuda", 8)
    assert scenario.resolve("cpu", 8) == ("cpu", 4)
    with pytest.raises(CpbenchError, match="no GPU"):
        scenario.resolve("cuda", 0)
    fixed = parse_scenario(minimal(), "x.toml")
    assert fixed.resolve("auto", 0) == ("cpu", 4)


@pytest.mark.parametrize("world", [0, 65, 1_000_000])
def test_a_local_cpu_world_is_bounded(world: int) -> None:
    """A file's world_size, and the pool itself (verify, probe, efficiency, --world-size),
    refuse more local gloo ranks than a host can hold; 64 and 1 are accepted."""
    from cpbench.bench.pool import WorldSpec  # noqa: PLC0415

    scenario = parse_scenario({**minimal(), "world_size": world}, "x.toml") if world else None
    rule = rf"world size \({world}\) on the CPU must be 1 to 64 local ranks"
    if scenario is not None:
        with pytest.raises(CpbenchError, match=rule):
            scenario.resolve("cpu", 0)
        assert scenario.resolve("cpu", 0, launched_world=world) == ("cpu", world)  # torchrun
    with pytest.raises(CpbenchError, match=rule):
        WorldSpec(world, "cpu")
    assert WorldSpec(64, "cpu").world_size == 64 and WorldSpec(1, "cpu").world_size == 1
    assert WorldSpec(world or 1000, "cuda").backend == "nccl"  # GPUs: the caller counts them


def test_expand_checks_world_size() -> None:
    # a command-line override of the world size works with mesh = "all"
    assert len(parse_scenario(minimal(), "x.toml").expand("cpu", 8)) == 4
    auto = parse_scenario({**minimal(mesh=["2x2"]), "world_size": "auto"}, "x.toml")
    with pytest.raises(CpbenchError, match=r"x.toml: key 'mesh': \"2x2\".*!= world_size \(8\)"):
        auto.expand("cuda", 8)


# --- BenchConfig ---------------------------------------------------------------------------


def _config(**changes: object) -> BenchConfig:
    config = BenchConfig(
        seq_len=1024,
        batch=1,
        heads=8,
        kv_heads=2,
        head_dim=64,
        dtype="float32",
        causal=True,
        ulysses=2,
        ring=2,
        layout="zigzag",
        kv_replication=None,
        kernel="auto",
        phase="fwd+bwd",
        device="cpu",
        world_size=4,
    )
    return dataclasses.replace(config, **changes)


def test_key_and_scheme() -> None:
    config = _config()
    assert (
        config.key == "L1024-B1-h8-kv2-d64-float32-causal-U2xR2-zigzag-repauto-auto-fwd+bwd-cpu-w4"
    )
    assert config.scheme == "usp"
    assert _config(ulysses=1, ring=4).scheme == "ring"
    assert _config(ulysses=4, ring=1).scheme == "ulysses"
    assert _config(ulysses=1, ring=1, world_size=1).scheme == "single"


@pytest.mark.parametrize(
    "field, value",
    [
        ("seq_len", 2048),
        ("batch", 2),
        ("heads", 16),
        ("kv_heads", 8),
        ("head_dim", 128),
        ("dtype", "bfloat16"),
        ("causal", False),
        ("ulysses", 4),
        ("ring", 1),
        ("layout", "striped"),
        ("kv_replication", 1),
        ("kernel", "sdpa"),
        ("phase", "fwd"),
        ("device", "cuda"),
        ("world_size", 8),
        ("nodes", 2),
    ],
)
def test_key_differs_when_any_field_differs(field: str, value: object) -> None:
    assert field in {f.name for f in dataclasses.fields(BenchConfig)}
    assert _config(**{field: value}).key != _config().key


def test_to_dict_from_dict_round_trip() -> None:
    config = _config(kv_replication=2, ulysses=4, ring=1)
    record = config.to_dict(kv_replication=2, kernel="sdpa")
    assert record["kernel"] == "sdpa" and record["scheme"] == "ulysses"
    assert BenchConfig.from_dict(record) == config
    # automatic replication is recorded resolved
    auto = _config()
    feasibility = auto.feasibility
    assert feasibility.ok and feasibility.kv_replication == 1
    back = BenchConfig.from_dict(auto.to_dict(feasibility.kv_replication, None))
    assert back == dataclasses.replace(auto, kv_replication=1)
    assert back.feasibility == feasibility
    # nodes defaults to 1, extra keys are ignored
    del record["nodes"]
    assert BenchConfig.from_dict({**record, "extra": 1}) == config
    with pytest.raises(CpbenchError, match="lacks seq_len"):
        BenchConfig.from_dict({k: v for k, v in record.items() if k != "seq_len"})


def test_config_validation_and_feasibility() -> None:
    with pytest.raises(CpbenchError, match="layout 'diagonal'"):
        _config(layout="diagonal")
    with pytest.raises(CpbenchError, match="seq_len must be a positive integer"):
        _config(seq_len=0)
    bad_gqa = _config(kv_heads=3).feasibility
    assert not bad_gqa.ok and "multiple of kv_heads (3)" in bad_gqa.reason
    wrong_world = _config(world_size=8).feasibility
    assert not wrong_world.ok and "world size (8)" in wrong_world.reason


def test_check_seq_len() -> None:
    config = _config(seq_len=131072, ulysses=1, ring=8, world_size=8)  # zigzag: multiple of 16
    assert config.check_seq_len(4096) == 4096
    assert config.check_seq_len(4100) == 4096
    assert config.check_seq_len(10) == 16
    assert _config(seq_len=1024).check_seq_len(4096) == 1024


# --- validation errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (BASE + "\n" + "colour = 'red'\n", ["unknown key 'colour' in [axes]", "seq_len"]),
        ("iterations = 5\n" + BASE, ["unknown key 'iterations'", "allowed keys", "iters"]),
        ("seq_len = 8\n" + BASE, ["unknown key 'seq_len'", "[axes] table"]),
        (BASE + 'mesh = ["4by2"]\n', ["key 'mesh'", '"4by2" is not a mesh']),
        (BASE + 'mesh = ["3x3"]\n', ["key 'mesh'", '"3x3"', "= 9 != world_size (8)"]),
        (BASE + "mesh = [8]\n", ["key 'mesh'", "8 is not a mesh"]),
        (BASE + 'mesh = "0x8"\n', ["key 'mesh'", "'0x8'", "positive"]),
        (BASE.replace("seq_len = 4096", "seq_len = [4096, 0]"), ["key 'seq_len'", "0", "positive"]),
        (BASE.replace("seq_len = 4096", "seq_len = []"), ["key 'seq_len'", "empty"]),
        (BASE.replace("seq_len = 4096", "seq_len = 4096.5"), ["key 'seq_len'", "4096.5"]),
        (BASE.replace("seq_len = 4096", "seq_len = [1, 1]"), ["key 'seq_len'", "repeated"]),
        (BASE + 'layout = ["zigzag", "diagonal"]\n', ["key 'layout'", "'diagonal'", "striped"]),
        (BASE + 'dtype = "fp8"\n', ["key 'dtype'", "'fp8'", "bfloat16"]),
        (BASE + 'backend = "xformers"\n', ["key 'backend'", "'xformers'", "flash_attn"]),
        (BASE + 'phase = "bwd"\n', ["key 'phase'", "'bwd'", "fwd+bwd"]),
        (BASE + "causal = 1\n", ["key 'causal'", "1 is not true or false"]),
        (BASE + 'kv_replication = "maybe"\n', ["key 'kv_replication'", "'maybe'"]),
        (BASE + "gqa_ratio = 4\n", ["'kv_heads' = 8", "'gqa_ratio' = 4", "exactly one"]),
        (BASE.replace("kv_heads = 8", "gqa_ratio = [3]"), ["key 'gqa_ratio'", "3", "heads (32)"]),
        (BASE.replace("kv_heads = 8", "kv_heads = 5"), ["key 'kv_heads'", "5", "heads (32)"]),
        (BASE.replace("world_size = 8", "world_size = 0"), ["key 'world_size'", "0"]),
        (BASE.replace("world_size = 8", "world_size = 'many'"), ["key 'world_size'", "'many'"]),
        (BASE.replace('device = "cuda"', 'device = "tpu"'), ["key 'device'", "'tpu'"]),
        ("warmup = -1\n" + BASE, ["key 'warmup'", "-1", ">= 0"]),
        ("iters = 0\n" + BASE, ["key 'iters'", "0", "positive"]),
        ("timeout = 0\n" + BASE, ["key 'timeout'", "0", "positive"]),
        ("nodes = 3\n" + BASE, ["key 'world_size'", "8", "nodes (3)"]),
        ("name = 5\n" + BASE.replace('name = "t"\n', ""), ["key 'name'", "5"]),
        ("axes = 3\n", ["key 'axes'", "3"]),
        ('name = "t"\n', ["missing the [axes] table"]),
        (BASE.replace("seq_len = 4096\n", ""), ["key 'seq_len' is required"]),
        (BASE + "heads = 8\n", ["invalid TOML", "line"]),
        ("name = \n" + BASE, ["invalid TOML", "line 1"]),
    ],
)
def test_validation_errors(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = write(tmp_path, text)
    with pytest.raises(CpbenchError) as info:
        load_scenario(path)
    message = str(info.value)
    assert message.startswith(path + ": "), message
    for part in expected:
        assert part in message, (part, message)


def test_error_example_from_the_docs(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + 'mesh = "3x3"\n')
    with pytest.raises(CpbenchError) as info:
        load_scenario(path)
    assert str(info.value) == (
        f"{path}: key 'mesh': \"3x3\" gives ulysses (3) x ring (3) = 9 != world_size (8)"
    )


def test_unknown_names_and_files(in_root: Path) -> None:
    with pytest.raises(CpbenchError, match="unknown scenario 'nope'; available: .*cpu-smoke"):
        load_scenario("nope")
    with pytest.raises(CpbenchError, match="missing.toml: no such scenario file"):
        load_scenario("missing.toml")
    with pytest.raises(CpbenchError, match="device 'auto'"):
        default_scenario("auto")


def test_scenario_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "[axes]\nseq_len = 1024\nheads = 8\n", name="tiny.toml")
    scenario = load_scenario(path)
    assert isinstance(scenario, Scenario)
    assert scenario.name == "tiny"
    assert (scenario.world_size, scenario.device, scenario.nodes) == ("auto", "auto", 1)
    assert (scenario.warmup, scenario.iters, scenario.timeout) == (3, 10, 300.0)
    assert scenario.check_max_seq_len == 4096
    assert scenario.mesh == "all"
    assert (scenario.batch, scenario.head_dim, scenario.causal) == ((1,), (128,), (True,))
    assert (scenario.layout, scenario.kv_replication) == (("zigzag",), (None,))
    assert (scenario.backend, scenario.phase) == (("auto",), ("fwd+bwd",))


# --- the file models -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("warmup = true\n" + BASE, "key 'warmup': True is not an integer"),
        ('iters = "4"\n' + BASE, "key 'iters': '4' is not an integer"),
        ("nodes = 1.0\n" + BASE, "key 'nodes': 1.0 is not an integer"),
        (BASE.replace("world_size = 8", "world_size = true"), "key 'world_size': True is not"),
        (BASE.replace("heads = 32", "heads = [32, true]"), "key 'heads': True is not an integer"),
        (BASE.replace("seq_len = 4096", 'seq_len = "4096"'), "key 'seq_len': '4096' is not an"),
        (BASE + 'causal = "yes"\n', "key 'causal': 'yes' is not true or false"),
        ("timeout = true\n" + BASE, "key 'timeout': True must be a positive, finite number"),
        ("timeout = inf\n" + BASE, "key 'timeout': inf must be a positive, finite number"),
        ("description = 3\n" + BASE, "key 'description': 3 is not a string"),
        (BASE + "mesh = [[2, 4, 1]]\n", "key 'mesh': [2, 4, 1] is not a mesh"),
        (BASE + 'kv_replication = ["off", 1]\n', "key 'kv_replication': 1 is repeated in"),
    ],
)
def test_types_are_strict(tmp_path: Path, text: str, expected: str) -> None:
    """No coercion: an integer key takes neither `true` nor "4", a bool no string."""
    path = write(tmp_path, text)
    with pytest.raises(CpbenchError) as info:
        load_scenario(path)
    assert str(info.value).startswith(f"{path}: {expected}"), str(info.value)


def test_first_problem_is_reported_in_reading_order(tmp_path: Path) -> None:
    # an unknown top-level key comes before the bad values, a bad value before a later one
    both = write(tmp_path, "colour = 1\nwarmup = -1\n" + BASE.replace("heads = 32", "heads = 0"))
    with pytest.raises(CpbenchError, match="unknown key 'colour'"):
        load_scenario(both)
    values = write(tmp_path, "warmup = -1\n" + BASE.replace("heads = 32", "heads = 0"), "y.toml")
    with pytest.raises(CpbenchError, match=r"key 'warmup': -1 must be >= 0$"):
        load_scenario(values)


def test_file_keys_and_their_descriptions() -> None:
    assert TOP_LEVEL_KEYS == (
        "name", "description", "world_size", "device", "warmup", "iters", "timeout",
        "check_max_seq_len", "nodes", "seed", "precision", "max_iters", "budget", "check_rows",
        "axes", "also", "dynamic",
    )  # fmt: skip
    assert AXIS_KEYS == (
        "seq_len", "batch", "heads", "kv_heads", "gqa_ratio", "head_dim", "dtype", "causal",
        "mesh", "layout", "kv_replication", "backend", "phase", "impl", "documents", "window",
        "cp_comm", "heads_k_stride", "cached_len", "new_tokens", "scheme", "cache_layout",
    )  # fmt: skip
    for model in (ScenarioFile, ScenarioAxes):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
    # every axis of the file is an attribute of Scenario
    assert set(AXIS_KEYS) <= set(Scenario.model_fields)


# --- masks: the documents and window axes, [[also]] ------------------------------------------


def test_documents_and_window_axes_resolve_per_length_with_the_seed(tmp_path: Path) -> None:
    data = minimal(
        seq_len=[4096, 8192],
        documents=["none", "lognormal:mean=512", "1024,3072"],
        window=["none", 512, 100000],
    )
    data["seed"] = 3
    # explicit lengths must fill every seq_len: 1024 + 3072 = 4096 only
    with pytest.raises(
        CpbenchError,
        match=r"x\.toml: key 'documents': documents '1024,3072' "
        r"sum to 4096, not the sequence length 8192",
    ):
        parse_scenario(data, "x.toml")
    data["axes"]["seq_len"] = 4096
    configs = [c for c, f in parse_scenario(data, "x.toml").expand("cpu", 4) if f.ok]
    masks = {(c.documents, c.window) for c in configs}
    assert len(masks) == 3 * 3
    drawn = {c.documents for c in configs if c.documents and len(c.documents) > 2}
    (lengths,) = drawn  # one draw, the same for every point
    assert sum(lengths) == 4096 and len(lengths) > 3
    assert {c.mask.kind for c in configs} == {
        "causal", "sliding_window", "document", "document_sliding_window",
    }  # fmt: skip
    assert (None, 100000) in masks  # a window longer than the sequence is allowed
    # the same seed gives the same lengths, another seed others
    again = [c.documents for c, _ in parse_scenario(data, "x.toml").expand("cpu", 4)]
    assert lengths in again
    data["seed"] = 4
    other = {c.documents for c, _ in parse_scenario(data, "x.toml").expand("cpu", 4)}
    assert lengths not in other
    # plain points keep their ids (no mask suffix)
    assert all(not c.key.endswith("w4096") for c in configs)
    plain = [c for c in configs if c.documents is None and c.window is None]
    assert plain and all(c.key.endswith("-cpu-w4") for c in plain)


def test_a_documents_file_is_found_beside_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "lengths.txt").write_text("# one per line\n1000\n3000\n500\n")
    path = write(tmp_path, BASE + 'documents = "lengths.txt"\n')
    (config, _), *_ = load_scenario(path).expand("cuda", 8)
    assert config.documents == (1000, 3000, 96)  # the last one cut at L = 4096


@pytest.mark.parametrize(
    ("axes", "expected"),
    [
        ('documents = ""\n', "key 'documents': '' is not a document source"),
        ("documents = 3\n", "key 'documents': 3 is not a document source"),
        ('documents = "zipf:a=1"\n', "key 'documents': documents 'zipf:a=1': distribution"),
        ('documents = "lognormal:mean=-1"\n', "key 'documents': lognormal needs mean="),
        ('documents = "100,200"\n', "key 'documents': documents '100,200' sum to 300"),
        ("window = 0\n", "key 'window': 0 is not a window"),
        ("window = true\n", "key 'window': True is not a window"),
        ('window = "wide"\n', "key 'window': 'wide' is not a window"),
        ('window = [512, "none", 512]\n', "key 'window': 512 is repeated in"),
        ("window = 512\ncausal = [true, false]\n", "key 'window': 512 needs a causal mask"),
        (
            'layout = "diagonal"\n',
            "key 'layout': 'diagonal' is not one of contiguous, zigzag, "
            "striped, doc_zigzag, balanced",
        ),
    ],
)
def test_bad_mask_axes_name_the_key_and_the_rule(tmp_path: Path, axes: str, expected: str) -> None:
    path = write(tmp_path, BASE + axes)
    with pytest.raises(CpbenchError) as info:
        load_scenario(path)
    assert str(info.value).startswith(f"{path}: {expected}"), str(info.value)


def test_every_layout_is_an_axis_value() -> None:
    data = minimal(
        layout=["contiguous", "zigzag", "striped", "doc_zigzag", "balanced"],
        documents="lognormal:mean=300",
        mesh=["1x4"],
    )
    expanded = parse_scenario(data, "x.toml").expand("cpu", 4)
    assert [c.layout for c, _ in expanded] == list(data["axes"]["layout"])
    assert all(f.ok for _, f in expanded)


def test_also_tables_add_their_products_without_repeating_a_point(tmp_path: Path) -> None:
    text = BASE + (
        'layout = ["zigzag", "balanced"]\nmesh = ["1x8"]\ndocuments = "2048,2048"\n'
        '\n[[also]]\nlayout = "contiguous"\ndocuments = "none"\nwindow = ["none", 512]\n'
        '\n[[also]]\nlayout = "zigzag"\n'  # the first point again: not repeated
        "gqa_ratio = 2\n"  # replaces kv_heads of [axes]
    )
    scenario = load_scenario(write(tmp_path, text))
    expanded = scenario.expand("cuda", 8)
    got = [(c.layout, c.documents, c.window, c.kv_heads) for c, _ in expanded]
    assert got == [
        ("zigzag", (2048, 2048), None, 8),
        ("balanced", (2048, 2048), None, 8),
        ("contiguous", None, None, 8),
        ("contiguous", None, 512, 8),
        ("zigzag", (2048, 2048), None, 16),
    ]
    assert len({c.key for c, _ in expanded}) == len(expanded)


@pytest.mark.parametrize(
    ("also", "expected"),
    [
        ("window = -3\n", "([[also]] table 1): key 'window': -3 is not a window"),
        ("colour = 1\n", "([[also]] table 1): unknown key 'colour' in [axes]"),
        ('mesh = ["3x3"]\n', "([[also]] table 1): key 'mesh': \"3x3\" gives ulysses (3)"),
    ],
)
def test_a_bad_also_table_is_named(tmp_path: Path, also: str, expected: str) -> None:
    path = write(tmp_path, BASE + "\n[[also]]\n" + also)
    with pytest.raises(CpbenchError) as info:
        load_scenario(path)
    assert str(info.value).startswith(f"{path} {expected}"), str(info.value)


def test_precision_keys_and_distinct_points() -> None:
    """precision / max_iters / budget / check_rows parse with their rules; distinct() merges
    every layout of a ring-degree-1 mesh (and an "auto" replication equal to the number given)
    into one point named contiguous, listing the other ids."""
    scenario = parse_scenario(
        {
            **minimal(layout=["zigzag", "striped", "contiguous"], kv_replication=["auto", 1]),
            "precision": 0.02,
            "max_iters": 40,
            "budget": 1.5,
            "check_rows": 64,
        },
        "x.toml",
    )
    assert (scenario.precision, scenario.max_iters, scenario.budget, scenario.check_rows) == (
        0.02,
        40,
        1.5,
        64,
    )
    assert parse_scenario({**minimal(), "precision": "off"}, "x.toml").precision is None
    points = scenario.distinct("cpu", 4)
    expanded = scenario.expand("cpu", 4)
    assert len(expanded) == 3 * 2 * 3  # layouts x replication x meshes
    # kv 8 needs no copies on any mesh: "auto" = 1; at R = 1 the three layouts are one.
    assert len(points) == 3 * 2 + 1  # R > 1: 3 layouts x 2 meshes; R = 1: once
    (ulysses,) = [p for p in points if p.config.ring == 1]
    assert ulysses.config.layout == "contiguous" and len(ulysses.equivalent) == 5
    assert all("U4xR1" in e for e in ulysses.equivalent)
    for bad, rule in (
        ({"precision": 1.5}, "key 'precision': 1.5 is not a relative width"),
        ({"precision": 0}, "key 'precision': 0 is not a relative width"),
        ({"max_iters": 2, "iters": 5}, r"key 'max_iters': 2 is below iters \(5\)"),
        ({"budget": 0}, "key 'budget': 0 must be a positive"),
    ):
        with pytest.raises(CpbenchError, match=rule):
            parse_scenario({**minimal(), **bad}, "x.toml")


def test_cp_comm_and_head_stride_axes_expand_and_dedupe(tmp_path: Path) -> None:
    """A stride is an all-gather knob (p2p points take only "none"); at ring 1 there is no ring
    axis, so all_gather is the same computation as p2p and is measured once."""
    path = tmp_path / "ag.toml"
    path.write_text(
        'name = "ag"\ndescription = "d"\nworld_size = 2\ndevice = "cpu"\n[axes]\n'
        'seq_len = 256\nheads = 4\nkv_heads = 2\nhead_dim = 16\nmesh = ["1x2", "2x1"]\n'
        'layout = "zigzag"\ncp_comm = ["p2p", "all_gather"]\nheads_k_stride = ["none", 1]\n'
    )
    scenario = load_scenario(str(path))
    points = {
        (c.ulysses, c.ring, c.cp_comm, c.heads_k_stride) for c, _ in scenario.expand("cpu", 2)
    }
    assert points == {
        (u, r, comm, stride)
        for u, r in ((1, 2), (2, 1))
        for comm, stride in (("p2p", None), ("all_gather", None), ("all_gather", 1))
    }
    distinct = scenario.distinct("cpu", 2)
    kept = {(p.config.ulysses, p.config.cp_comm, p.config.heads_k_stride) for p in distinct}
    assert kept == {
        (1, "p2p", None),
        (1, "all_gather", None),
        (1, "all_gather", 1),
        (2, "p2p", None),
    }
    bad = tmp_path / "bad.toml"
    bad.write_text(path.read_text().replace('["p2p", "all_gather"]', '["p2p", "gather"]'))
    with pytest.raises(CpbenchError, match="gather"):
        load_scenario(str(bad))


@pytest.mark.parametrize("name", ["../../../x", "/tmp/abs", "x[/red]y", ".hidden", "", "a b", "x" * 101])
def test_a_scenario_name_is_a_plain_file_name(name: str) -> None:
    """The name names the default output (results/<name>-<time>.jsonl): a path in it put the
    file outside results/, rich markup crashed the sweep's progress line."""
    with pytest.raises(CpbenchError, match=r"key 'name': .* is not a plain name"):
        parse_scenario({**minimal(), "name": name}, "x.toml")
    for good in ("cpu-smoke", "llama3.1_8b+fp8", "x" * 100):
        assert parse_scenario({**minimal(), "name": good}, "x.toml").name == good
