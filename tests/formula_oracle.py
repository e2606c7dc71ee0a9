"""Second derivations the formula tests check `cpbench.model.formulas` against: an exact
evaluator of its formula strings and the per-rank volumes computed from the sizes directly."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from fractions import Fraction

from cpbench.config.problem import CpProblem, check_choice
from cpbench.config.vocabulary import PASSES, Pass
from cpbench.errors import CpbenchError
from cpbench.model.formulas import (
    FP32_BYTES,
    all_to_all_sent,
    ring_kv_chunk_elements,
    ulysses_kv_elements,
    ulysses_q_elements,
)


def evaluate_formula(formula: str, symbols: Mapping[str, int]) -> Fraction:
    """Exact value of a formula (+ - * / and parentheses over integers and symbols)."""
    tree = ast.parse(formula, mode="eval")
    return _evaluate_node(tree.body, symbols, formula)


def _evaluate_node(node: ast.expr, symbols: Mapping[str, int], formula: str) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return Fraction(node.value)
    if isinstance(node, ast.Name):
        if node.id not in symbols:
            raise CpbenchError(f"unknown symbol {node.id!r} in formula {formula!r}")
        return Fraction(symbols[node.id])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate_node(node.operand, symbols, formula)
    if isinstance(node, ast.BinOp):
        left = _evaluate_node(node.left, symbols, formula)
        right = _evaluate_node(node.right, symbols, formula)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div):
            return left / right
    raise CpbenchError(f"formula {formula!r} uses an unsupported expression")


def ulysses_elements_sent(config: CpProblem, phase: Pass = "forward") -> int:
    """Elements a rank sends in the Ulysses stage; equal forward and backward."""
    check_choice("phase", phase, PASSES)
    handed = 2 * ulysses_q_elements(config) + ulysses_kv_elements(config)
    return all_to_all_sent(handed, config.ulysses)


def ring_elements_sent(config: CpProblem, phase: Pass = "forward") -> int:
    """Elements a rank sends in the ring stage: (k-1) K/V hops, plus (k-1) dK/dV hops
    backward; k = R for causal or full attention over one sequence."""
    check_choice("phase", phase, PASSES)
    if config.ring == 1:
        return 0
    hops = config.kv_hops if phase == "forward" else config.kv_hops + config.dkv_hops
    return hops * ring_kv_chunk_elements(config)


def ring_bytes_sent(config: CpProblem, phase: Pass = "forward") -> int:
    """Bytes a rank sends in the ring stage (the backward dK/dV hops are fp32)."""
    check_choice("phase", phase, PASSES)
    if config.ring == 1:
        return 0
    chunk = ring_kv_chunk_elements(config)
    kv_bytes = config.kv_hops * chunk * config.bytes_per_element
    if phase == "forward":
        return kv_bytes
    return kv_bytes + config.dkv_hops * chunk * FP32_BYTES
