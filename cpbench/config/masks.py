"""The attention mask of a configuration, described once: `MaskSpec` (causal, documents, window).

The five kinds and `MaskSpec.visible`, the definition: docs/design.md section 1. Pure Python."""

from __future__ import annotations

import bisect
import hashlib
import itertools
from dataclasses import dataclass, replace
from functools import cached_property

from cpbench.config.constraints import is_int
from cpbench.config.vocabulary import Mask
from cpbench.errors import CpbenchError


@dataclass(frozen=True)
class MaskSpec:
    """Which (query, key) pairs of a packed sequence attend."""

    causal: bool = True
    """Queries see only keys at positions <= their own (false: full attention)."""
    documents: tuple[int, ...] | None = None
    """Lengths of the packed documents, in order, summing to the sequence length; None = one
    document filling the sequence."""
    window: int | None = None
    """Sliding window W: a query sees the last W keys (itself included); None = unbounded."""

    def __post_init__(self) -> None:
        if not isinstance(self.causal, bool):
            raise CpbenchError(f"causal must be true or false, got {self.causal!r}")
        if self.window is not None:
            if not is_int(self.window) or self.window <= 0:
                raise CpbenchError(f"window must be a positive integer, got {self.window!r}")
            if not self.causal:
                raise CpbenchError(
                    f"a sliding window ({self.window}) needs a causal mask: the window counts "
                    f"the keys before a query"
                )
        if self.documents is not None:
            if not isinstance(self.documents, tuple) or not self.documents:
                raise CpbenchError(
                    f"documents must be a non-empty tuple of lengths, got {self.documents!r}"
                )
            # every length an int (exactly) and positive, in two passes over C loops: a packed
            # sequence holds 100,000 documents and every configuration makes its mask
            if set(map(type, self.documents)) != {int} or min(self.documents) <= 0:
                bad = [d for d in self.documents if not is_int(d) or d <= 0]
                if bad:
                    raise CpbenchError(
                        f"document lengths must be positive integers, got {bad[0]!r}"
                    )
            if not self.causal and self.has_documents:
                raise CpbenchError(
                    "a document mask is causal within each document: it cannot be combined "
                    "with full attention"
                )

    @property
    def has_documents(self) -> bool:
        """More than one document: the rule "one document = no documents", written once."""
        return self.documents is not None and len(self.documents) > 1

    def normalized(self) -> MaskSpec:
        """This mask with a single document dropped (it is the whole sequence)."""
        return self if self.has_documents or self.documents is None else replace(self, documents=None)

    @property
    def kind(self) -> Mask:
        """The mask's name (a `Mask`)."""
        if not self.causal:
            return "full"
        if self.has_documents:
            return "document_sliding_window" if self.window is not None else "document"
        return "sliding_window" if self.window is not None else "causal"

    @property
    def plain(self) -> bool:
        """Only causal or full: no documents (beyond one) and no window."""
        return self.kind in ("causal", "full")

    @property
    def label(self) -> str:
        """Short human-readable name: `causal`, `full`, `document (12 docs)`, `window 1024`,
        `document (12 docs) + window 1024`."""
        kind = self.kind
        docs = f"document ({len(self.documents or ())} docs)"
        if kind == "document":
            return docs
        if kind == "sliding_window":
            return f"window {self.window}"
        if kind == "document_sliding_window":
            return f"{docs} + window {self.window}"
        return kind

    def check_length(self, seq_len: int) -> None:
        """Raise unless the documents fill exactly `seq_len` tokens."""
        if self.documents is not None and sum(self.documents) != seq_len:
            raise CpbenchError(
                f"the documents' lengths sum to {sum(self.documents)} "
                f"({len(self.documents)} documents), not the sequence length {seq_len}"
            )

    def for_length(self, seq_len: int) -> MaskSpec:
        """This mask with its documents made explicit for a sequence of `seq_len` tokens (one
        document when none are given); checks the lengths."""
        self.check_length(seq_len)
        return self if self.documents is not None else replace(self, documents=(seq_len,))

    def truncated(self, seq_len: int) -> MaskSpec:
        """This mask on the first `seq_len` tokens (the capped-length reference check): the
        documents that start before it, the last one cut at `seq_len`."""
        if self.documents is None:
            return self
        kept: list[int] = []
        for d in self.documents:
            if sum(kept) >= seq_len:
                break
            kept.append(min(d, seq_len - sum(kept)))
        return replace(self, documents=tuple(kept))

    @cached_property
    def starts(self) -> tuple[int, ...]:
        """Start position of each document (needs `documents`)."""
        if self.documents is None:
            raise CpbenchError("this mask has no documents; call for_length(seq_len) first")
        return tuple(itertools.accumulate(self.documents, initial=0))[:-1]

    def document_of(self, position: int) -> int:
        """Index of the document holding a token position."""
        return bisect.bisect_right(self.starts, position) - 1

    def visible(self, query: int, key: int) -> bool:
        """The definition: may the query at position `query` attend to the key at `key`?"""
        if not self.causal:
            return True
        if key > query:
            return False
        if self.window is not None and query - key >= self.window:
            return False
        if self.documents is not None and self.document_of(query) != self.document_of(key):
            return False
        return True

    def short_key(self) -> str:
        """The mask's part of a configuration id: `causal`, `full`, `docs<hash>`, `w<W>`."""
        parts = ["causal" if self.causal else "full"]
        if self.has_documents and self.documents is not None:
            parts.append(f"docs{len(self.documents)}x{documents_digest(self.documents)}")
        if self.window is not None:
            parts.append(f"w{self.window}")
        return "-".join(parts)


def documents_digest(documents: tuple[int, ...]) -> str:
    """A short stable digest of a document list (ids of configurations that differ only in it)."""
    text = ",".join(str(d) for d in documents).encode()
    return hashlib.sha1(text).hexdigest()[:8]
