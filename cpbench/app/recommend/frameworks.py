"""The settings that reproduce a recommended mesh in Megatron-LM, DeepSpeed, yunchang,
torchtitan and ring-flash-attn, each with its caveats as facts (`cpbench.render.recommend`
words them)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from importlib import resources
from typing import get_args

from pydantic import BaseModel, ConfigDict, model_validator

from cpbench.app.recommend.parallel import ParallelSizes
from cpbench.app.recommend.types import (
    Caveat,
    CaveatKind,
    FrameworkSetting,
    RankedCandidate,
)
from cpbench.config.vocabulary import LAYOUTS, Layout
from cpbench.model.cost.prediction import Prediction
from cpbench.reading import loads_toml

# ------------------------------------------------------------------ the data table


class _TableModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainingFramework(_TableModel):
    """One training framework's row of `cpbench/data/settings/frameworks.toml`."""

    name: str
    ulysses: bool
    """It can express a Ulysses (all-to-all) level."""
    ring: bool
    """It can express a ring level."""
    ulysses_all_gather: bool = False
    """It combines a Ulysses level with an all-gather one."""
    causal_layouts: tuple[Layout, ...] = ()
    """The ring layouts it runs under a causal mask (empty: any)."""
    documents: str = ""
    """How it takes packed documents, in words."""
    # its settings, templates the code fills (`cpbench plan`'s: plan_*), its flag names and
    # the names it gives schemes and layouts (the TOML file's comments say which is which)
    setting: str = ""
    plan_setting: str = ""
    plan_recompute: str = ""
    all_gather_setting: str = ""
    flags: dict[str, str] = {}
    comm_types: dict[str, str] = {}
    rotate_methods: dict[str, str] = {}
    ring_impl_types: dict[Layout, str] = {}
    closest_layouts: dict[Layout, Layout] = {}
    """The layout it runs for one it has no name for."""

    def ring_layout(self, layout: Layout) -> Layout:
        """The layout it runs for `layout` (itself, or its closest)."""
        return self.closest_layouts.get(layout, layout)


class ServingFramework(_TableModel):
    """One serving framework's row of the table."""

    name: str
    prefill_schemes: tuple[str, ...]
    docs: str
    design: str = ""
    decode_docs: str = ""
    prefill: str
    prefill_replicas: str
    prefill_one: str
    decode: str
    decode_replicas: str = ""
    decode_one: str
    decode_note: str
    decode_gqa: bool
    """Its decode CP shards a GQA / MHA cache (False: the MLA path only)."""


class ServingNotes(_TableModel):
    prefill_one: str
    decode_one: str
    all_gather: str
    cache: str
    cannot_prefill: str
    cannot_prefill_note: str
    cannot_decode: str


class TrainingFrameworks(_TableModel):
    megatron: TrainingFramework
    deepspeed: TrainingFramework
    yunchang: TrainingFramework
    torchtitan: TrainingFramework
    ring_flash_attn: TrainingFramework
    all_gather_cp: TrainingFramework


class ServingFrameworks(_TableModel):
    vllm: ServingFramework
    sglang: ServingFramework
    notes: ServingNotes


class FrameworkTable(_TableModel):
    """`cpbench/data/settings/frameworks.toml`: what each framework can express, its flags and
    setting templates, and the words of every caveat kind."""

    training: TrainingFrameworks
    caveats: dict[CaveatKind, str]
    differs: dict[CaveatKind, str]
    """A few words on what differs, for the caveats that say why a framework cannot express
    the pick."""
    plan: dict[str, str]
    serving: ServingFrameworks

    @model_validator(mode="after")
    def _complete(self) -> FrameworkTable:
        missing = set(get_args(CaveatKind)) - set(self.caveats)
        if missing:
            raise ValueError(f"caveats without words: {', '.join(sorted(missing))}")
        y = self.training.yunchang
        named = set(y.ring_impl_types) | set(y.closest_layouts)
        if named != set(LAYOUTS) or not set(y.closest_layouts.values()) <= set(y.ring_impl_types):
            raise ValueError("yunchang: every layout needs a ring_impl_type or a closest layout")
        m = self.training.megatron.comm_types
        if set(m) != {"ring", "all_gather", "ulysses", "hybrid"}:
            raise ValueError("megatron.comm_types: ring, all_gather, ulysses and hybrid")
        if set(self.training.torchtitan.rotate_methods) != {"p2p", "all_gather"}:
            raise ValueError("torchtitan.rotate_methods: p2p and all_gather")
        return self


@functools.cache
def framework_table() -> FrameworkTable:
    """The table, loaded and validated once."""
    path = resources.files("cpbench") / "data" / "settings" / "frameworks.toml"
    return FrameworkTable.model_validate(loads_toml(path.read_text("utf-8"), "frameworks.toml"))


# ------------------------------------------------------------------ the settings


def _closest(
    kind: CaveatKind, r: RankedCandidate, ranked: Sequence[RankedCandidate], *values: int
) -> Caveat:
    """A caveat naming the closest alternative `r` (its label, rank and time)."""
    return Caveat(kind, values, candidate=r.label, position=ranked.index(r) + 1, time_s=r.time_s)


def framework_settings(
    ranked: Sequence[RankedCandidate], sizes: ParallelSizes
) -> tuple[FrameworkSetting, ...]:
    """Settings for the winner in Megatron-LM, DeepSpeed, yunchang and torchtitan (then
    ring-flash-attn's, and the all-gather alternative when the winner does not gather)."""
    best = ranked[0].prediction
    t = framework_table().training
    if sizes.cp == 1:
        return tuple(
            FrameworkSetting(f.name, True, "-", caveats=(Caveat("cp1"),))
            for f in (t.megatron, t.deepspeed, t.yunchang, t.torchtitan)
        )
    settings: tuple[FrameworkSetting, ...] = (
        megatron_setting(best, sizes),
        deepspeed_setting(best, ranked),
        yunchang_setting(best, sizes),
        torchtitan_setting(best, ranked),
    )
    if best.candidate.all_gather:
        settings += (llama3_setting(best),)
    else:
        gathers = [r for r in ranked if r.prediction.candidate.all_gather]
        if gathers:
            pure = [r for r in gathers if r.prediction.candidate.ulysses == 1]
            settings += (all_gather_alternative((pure or gathers)[0], ranked, gathers[0]),)
    if best.candidate.mask.plain:
        return settings
    return tuple(_with_mask_caveats(s, best) for s in settings) + (ring_flash_setting(best),)


def all_gather_alternative(
    r: RankedCandidate, ranked: Sequence[RankedCandidate], best: RankedCandidate
) -> FrameworkSetting:
    """How the frameworks run an all-gather candidate when none wins: the best one they can
    express (U = 1), naming the best all-gather candidate of all when that one has Ulysses."""
    c = r.prediction.candidate
    t = framework_table().training
    comm = t.megatron.comm_types
    ag = comm["all_gather"] if c.ulysses == 1 else f"{comm['hybrid']} (no a2a+all_gather)"
    settings = t.all_gather_cp.setting.format(comm=ag, stride=c.gather_stride)
    caveats = [_closest("ag_alternative", r, ranked)]
    if best is not r:
        caveats.append(_closest("ag_best_has_ulysses", best, ranked))
    if c.ulysses > 1:
        caveats.append(Caveat("ag_ulysses_megatron", (c.ulysses,)))
    return FrameworkSetting(t.all_gather_cp.name, c.ulysses == 1, settings, caveats=tuple(caveats))


def llama3_setting(p: Prediction) -> FrameworkSetting:
    """ring-flash-attention's all-gather CP (its `llama3_*` functions) with the head stride."""
    c = p.candidate
    rf = framework_table().training.ring_flash_attn
    caveats = [Caveat("llama3", (c.gather_stride,))]
    if c.layout != "contiguous" and p.candidate.causal:
        caveats.append(Caveat("llama3_layout", name=c.layout))
    if c.ulysses > 1:
        caveats.append(Caveat("gather_only", (c.ulysses,)))
    code = rf.all_gather_setting.format(stride=c.gather_stride)
    return FrameworkSetting(rf.name, c.ulysses == 1 or rf.ulysses, code, caveats=tuple(caveats))


def _with_mask_caveats(setting: FrameworkSetting, p: Prediction) -> FrameworkSetting:
    mask = p.candidate.mask
    added: tuple[Caveat, ...] = ()
    if mask.documents is not None and len(mask.documents) > 1:
        added += (Caveat("documents", name=setting.framework),)
    if mask.window is not None:
        added += (Caveat("window"),)
    return replace(setting, caveats=setting.caveats + added)


def ring_flash_setting(p: Prediction) -> FrameworkSetting:
    """ring-flash-attn's varlen zigzag for packed documents (ring only)."""
    c = p.candidate
    rf = framework_table().training.ring_flash_attn
    caveats = [Caveat("ring_flash_documents")]
    if c.ulysses != 1:
        caveats.append(Caveat("ring_only", (c.ulysses,)))
    if c.mask.window is not None:
        caveats.append(Caveat("window"))
    return FrameworkSetting(rf.name, c.ulysses == 1 or rf.ulysses, rf.setting, caveats=tuple(caveats))


def cp_comm_type(ulysses: int, ring: int, cp_comm: str = "p2p") -> str:
    """Megatron's --cp-comm-type for a mesh: p2p (ring), all_gather (all-gather CP), a2a
    (Ulysses) or a2a+p2p (USP). Megatron has no a2a+all_gather: a U x A all-gather mesh with
    U > 1 maps to a2a+p2p, its closest (`megatron_setting` says so)."""
    comm = framework_table().training.megatron.comm_types
    if ulysses == 1:
        return comm["all_gather" if cp_comm == "all_gather" and ring > 1 else "ring"]
    return comm["ulysses" if ring == 1 else "hybrid"]


def megatron_setting(p: Prediction, sizes: ParallelSizes) -> FrameworkSetting:
    """--context-parallel-size, --cp-comm-type and, for a2a+p2p, the hierarchical sizes."""
    c = p.candidate
    m = framework_table().training.megatron
    flag = m.flags
    comm = cp_comm_type(c.ulysses, c.ring, c.cp_comm)
    values = {"tp": sizes.tp, "pp": sizes.pp, "cp": sizes.cp, "comm": comm}
    flags = [f"{flag[name]} {value}" for name, value in values.items()]
    if comm == m.comm_types["hybrid"]:
        flags.append(f"{flag['hierarchical']} {c.ulysses} {c.ring}")
    caveats = [Caveat("te_chunks")]
    if c.ring > 1 and p.candidate.causal and c.layout not in m.causal_layouts:
        caveats.append(Caveat("te_layout", name=c.layout))
    if c.replication > 1:
        caveats.append(Caveat("kv_replication", (c.replication,)))
    if c.all_gather:
        caveats.append(Caveat("no_a2a_all_gather" if c.ulysses > 1 else "te_all_gather"))
    expressible = not (c.all_gather and c.ulysses > 1 and not m.ulysses_all_gather)
    return FrameworkSetting(m.name, expressible, " ".join(flags), caveats=tuple(caveats))


def deepspeed_setting(p: Prediction, ranked: Sequence[RankedCandidate]) -> FrameworkSetting:
    """--ds-sequence-parallel-size: Ulysses only. A mesh with a ring (R > 1) has no DeepSpeed
    setting: the cell says `-` and the caveats name the closest Ulysses-only mesh with its own
    flag (it runs that other mesh, not the winner)."""
    c = p.candidate
    ds = framework_table().training.deepspeed
    if (c.ring == 1 or ds.ring) and c.ulysses > 1:
        caveats = [Caveat("ds_ulysses")]
        if c.replication > 1:
            caveats.append(Caveat("ds_gqa", (c.shape.kv_heads, c.ulysses)))
        flag = ds.setting.format(ulysses=c.ulysses)
        return FrameworkSetting(ds.name, True, flag, caveats=tuple(caveats))
    ulysses_only = (r for r in ranked if r.prediction.candidate.ring == 1)
    alternative = next((r for r in ulysses_only if r.prediction.candidate.ulysses > 1), None)
    ring = Caveat("ds_ring", (c.ring,))
    if alternative is None:
        return FrameworkSetting(ds.name, False, "-", caveats=(ring, Caveat("no_ulysses_mesh")))
    a = alternative.prediction.candidate
    caveats = [ring, _closest("closest_ulysses", alternative, ranked, a.ulysses)]
    if a.replication > 1:
        caveats.append(Caveat("ds_gqa", (a.shape.kv_heads, a.ulysses)))
    return FrameworkSetting(ds.name, False, "-", caveats=tuple(caveats))


def yunchang_setting(p: Prediction, sizes: ParallelSizes) -> FrameworkSetting:
    """set_seq_parallel_pg(U, R, rank, world_size) and the ring implementation of the layout;
    a layout it has no ring implementation for (doc_zigzag, balanced) gets the closest one it
    has, labelled: it cannot express the winner."""
    c = p.candidate
    y = framework_table().training.yunchang
    layout: Layout = c.layout if c.ring > 1 else "contiguous"
    runs = y.ring_layout(layout)
    impl = y.ring_impl_types[runs]
    code = y.setting.format(ulysses=c.ulysses, ring=c.ring, world=sizes.world, impl=impl)
    caveats = [Caveat("yunchang", name=impl)]
    if runs != layout:
        caveats.append(Caveat("closest_layout", name=layout, candidate=f"{c.ulysses}x{c.ring} {runs}"))
    return FrameworkSetting(y.name, runs == layout, code, caveats=tuple(caveats))


def torchtitan_setting(p: Prediction, ranked: Sequence[RankedCandidate]) -> FrameworkSetting:
    """context_parallel_degree and rotate method; ring-only with head-tail load balancing. For
    a winner with a Ulysses level: the setting of the closest ring-only candidate (none when no
    ring-only mesh is feasible)."""
    c = p.candidate
    t = framework_table().training.torchtitan
    rotate = t.rotate_methods["all_gather" if c.all_gather else "p2p"]
    settings = t.setting.format(cp=c.world, rotate=rotate)
    if c.ulysses == 1 or t.ulysses:
        return FrameworkSetting(t.name, True, settings, caveats=(Caveat("torchtitan"),))

    def ring_only(r: RankedCandidate) -> bool:
        a = r.prediction.candidate
        return a.ulysses == 1 and (
            a.layout in t.causal_layouts or (a.layout == "contiguous" and not a.causal)
        )

    ring_alternative = next(filter(ring_only, ranked), None)
    caveats = (Caveat("torchtitan"), Caveat("titan_ulysses", (c.ulysses,)))
    if ring_alternative is None:
        return FrameworkSetting(t.name, False, "-", caveats=(*caveats, Caveat("no_ring_mesh")))
    closest = _closest("closest_ring", ring_alternative, ranked, c.world)
    return FrameworkSetting(t.name, False, settings, caveats=(*caveats, closest))
