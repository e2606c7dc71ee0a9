"""Results: the typed record (schema), the JSONL store and its pandas frame, and scenarios (the
TOML files that expand into benchmark points)."""
