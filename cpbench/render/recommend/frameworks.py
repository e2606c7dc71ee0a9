"""The words of a framework setting's caveats (`cpbench.app.recommend.types.Caveat`):
`CAVEATS` words each kind, `setting_note` a setting's caveats in one note."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cpbench.units import format_seconds

if TYPE_CHECKING:
    from cpbench.app.recommend.frameworks import FrameworkTable
    from cpbench.app.recommend.types import Caveat, FrameworkSetting

ALTERNATIVE_KINDS = ("ag_alternative",)
"""Caveat kinds that mark a setting of another candidate than the winner (the all-gather
alternative): listed apart from the winner's settings."""


def lazy_framework_table() -> FrameworkTable:
    """The framework table, imported when first drawn: importing `cpbench.app.recommend`
    brings scipy, which `cpbench --help` does without."""
    from cpbench.app.recommend.frameworks import framework_table as table  # noqa: PLC0415

    return table()


def _fields(c: Caveat) -> dict[str, Any]:
    documents = {f.name: f.documents for f in dict(lazy_framework_table().training).values()}
    return {
        "v": c.values, "name": c.name, "candidate": c.candidate,
        "position": c.position, "time": format_seconds(c.time_s, 2),
        "documents": documents.get(c.name, ""),
    }  # fmt: skip


def caveat_text(c: Caveat) -> str:
    """One caveat in words."""
    return lazy_framework_table().caveats[c.kind].format(**_fields(c))


def setting_note(f: FrameworkSetting) -> str:
    """A framework setting's caveats in words (or `cpbench plan`'s note as written)."""
    text = "; ".join(caveat_text(c) for c in f.caveats)
    return text + "." if text else f.note


def is_alternative(f: FrameworkSetting) -> bool:
    """The setting runs another candidate than the winner (the all-gather alternative)."""
    return any(c.kind in ALTERNATIVE_KINDS for c in f.caveats)


def closest_label(f: FrameworkSetting) -> str:
    """What a setting of a framework that cannot express the pick runs instead, in a few
    words: `closest: 1x8 zigzag (#12; no Ulysses, U = 8)`; `none (...)` when it has no
    setting; empty when it expresses the pick."""
    if f.expressible:
        return ""
    table = lazy_framework_table()
    caveats = f.caveats
    differs = "; ".join(
        table.differs[c.kind].format(**_fields(c)) for c in caveats if c.kind in table.differs
    )
    if f.settings in ("", "-"):
        return f"none ({differs})" if differs else "none"
    ran = next((c for c in caveats if c.candidate and c.kind != "ag_best_has_ulysses"), None)
    if ran is None:
        return f"closest ({differs})" if differs else "closest"
    where = "; ".join(x for x in (f"#{ran.position}" * bool(ran.position), differs) if x)
    return f"closest: {ran.candidate}" + (f" ({where})" if where else "")
