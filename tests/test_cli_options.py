"""Every command-line option is declared once (`cpbench.cli.options`), and one option name means
one help text and one type in every command."""

from __future__ import annotations

import ast
import inspect
import types
import typing
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from typer.models import ArgumentInfo, OptionInfo

from cpbench.cli import options
from cpbench.cli.main import app
from cpbench.config.inference import STEP_OPTIONS
from cpbench.config.problem import CpProblem

pytestmark = pytest.mark.torch_free  # the floor-torch run has it in CI (tests/ci_split.py)

CLI = Path(options.__file__).parent


def _option_calls(path: Path) -> list[ast.Call]:
    """The calls of `typer.Option` (or a bare `Option`) in one module."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "Option":
                calls.append(node)
    return calls


def test_no_option_is_declared_outside_the_options_module() -> None:
    """`typer.Option` is called once, in `options._option`, which every option goes through;
    the flags of its calls are all different."""
    for path in sorted(CLI.glob("*.py")):
        calls = _option_calls(path)
        assert path.name == "options.py" or not calls, f"{path.name} declares an option"
    tree = ast.parse((CLI / "options.py").read_text(encoding="utf-8"))
    declarations = [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_option"
    ]  # fmt: skip
    flags = [a.value for call in declarations for a in call.args if isinstance(a, ast.Constant)]
    assert len(_option_calls(CLI / "options.py")) == 1
    spelled = [f for flag in flags for f in flag.split("/")]
    assert len(spelled) == len(set(spelled)), sorted(f for f in spelled if spelled.count(f) > 1)
    assert len(declarations) == len(options.OPTIONS) > 70


def _callbacks() -> dict[str, Any]:
    found = {(c.name or c.callback.__name__): c.callback for c in app.registered_commands}
    assert app.registered_callback is not None
    return {**found, "(cpbench)": app.registered_callback.callback}


def _parameters(callback: Any) -> dict[str, tuple[Any, OptionInfo | ArgumentInfo]]:
    """Each parameter's annotation and the typer declaration in its `Annotated` metadata."""
    hints = typing.get_type_hints(inspect.unwrap(callback), include_extras=True)
    out = {}
    for name, hint in hints.items():
        if get_origin(hint) is Annotated:
            base, *meta = get_args(hint)
            (info,) = [m for m in meta if isinstance(m, OptionInfo | ArgumentInfo)]
            out[name] = (base, info)
    return out


def _value_type(annotation: Any) -> type:
    """The type of one value an option takes: None, list[...] and Literal[...] looked through
    (a repeatable option, an optional one and a fixed set of choices take the same values)."""
    if get_origin(annotation) in (Union, types.UnionType):
        (annotation,) = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is list:
        (annotation,) = get_args(annotation)
    if get_origin(annotation) is Literal:
        (kind,) = {type(v) for v in get_args(annotation)}
        return kind
    assert isinstance(annotation, type), annotation
    return annotation


def test_every_command_takes_its_options_from_the_one_declaration() -> None:
    """Each option of each command is the declaration `options.OPTIONS` holds for its flag
    (the same object everywhere), so one flag has one help; and one value type."""
    declared = {id(info): flag for flag, info in options.OPTIONS.items()}
    types_by_flag: dict[str, set[type]] = defaultdict(set)
    used: set[str] = set()
    callbacks = _callbacks()
    assert {"recommend", "calibrate", "validate", "run", "sweep", "plan"} <= set(callbacks)
    for command, callback in callbacks.items():
        for name, (annotation, info) in _parameters(callback).items():
            if isinstance(info, ArgumentInfo):
                continue
            assert id(info) in declared, f"{command} --{name}: not from cpbench.cli.options"
            flag = declared[id(info)]
            used.add(flag)
            types_by_flag[flag].add(_value_type(annotation))
            assert info.help, f"{flag} has no help"
    assert used == set(options.OPTIONS), set(options.OPTIONS) - used
    mixed = {flag: kinds for flag, kinds in types_by_flag.items() if len(kinds) > 1}
    assert not mixed
    shared = [f for f in ("--seq-len", "--json", "--dtype", "--kernel", "--device") if f in used]
    assert len(shared) == 5


def test_the_help_of_a_problem_field_is_its_docstring() -> None:
    assert options.OPTIONS["--seq-len"].help == "L: global sequence length in tokens."
    assert options.OPTIONS["--window"].help == (
        "Sliding window W: a query sees the last W keys, itself included; None = unbounded."
    )
    assert options.OPTIONS["--layout"].help.startswith("Token layout; zigzag unless told")


@dataclass
class _Base:
    size: int
    """The size,
    on two lines (`SIZES`)."""
    plain: int = 0


@dataclass
class _Derived(_Base):
    colour: str = "red"
    """`Colour`; its name."""


def test_field_help_reads_the_docstring_under_a_field_of_the_class_or_a_base() -> None:
    assert options.field_help(_Derived, "size") == "The size, on two lines."
    assert options.field_help(_Derived, "colour") == "its name."
    with pytest.raises(KeyError):
        options.field_help(_Derived, "plain")


def test_defaults_shared_with_the_configuration_come_from_it() -> None:
    """formulas' problem defaults are `CpProblem`'s / the benchmark point's."""
    formulas = inspect.signature(_callbacks()["formulas"]).parameters
    problem = CpProblem(seq_len=8, heads=1, kv_heads=1, head_dim=1)
    for name in ("batch", "dtype", "causal", "ulysses", "ring", "cp_comm"):
        assert formulas[name].default == getattr(problem, name), name
    assert formulas["layout"].default == options.DEFAULTS["layout"] == "zigzag"


def test_the_step_kind_table_names_the_options_recommend_and_run_refuse() -> None:
    """An option is of one kind of step, or of both; every CLI option the table names exists."""
    training, inference = set(STEP_OPTIONS["training"]), set(STEP_OPTIONS["inference"])
    assert not training & inference
    axes_only = {"mesh", "kv_replication"}  # scenario axes that no command takes as an option
    for name in (training | inference) - axes_only:
        assert "--" + name.replace("_", "-") in options.OPTIONS, name
    run = _callbacks()["run"]
    values = {n: p.default for n, p in inspect.signature(run).parameters.items()}
    assert options.other_kind_given(run, values, "inference") == []
    values |= {"causal": False, "seq_len": 64, "cached_len": 3, "heads": 2}
    assert options.other_kind_given(run, values, "inference") == ["--seq-len", "--no-causal"]
    assert options.other_kind_given(run, values, "training") == ["--cached-len"]
