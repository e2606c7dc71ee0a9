"""Text that came from a file, shown as it is: control and bidirectional-formatting characters
become visible escapes, so that a record's id or a scenario's name cannot reorder, hide or
overwrite what is printed around it (the HTML report, figure labels)."""

from __future__ import annotations

import re

_HIDDEN = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"  # C0 and C1 controls, but tab and newlines
    "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"  # bidirectional marks, embeddings, isolates
    "\u2028\u2029\ufeff]"  # line and paragraph separators, a stray byte-order mark
)


def visible(text: str) -> str:
    """`text` with each hidden or reordering character written as `\\uXXXX`."""
    return _HIDDEN.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
