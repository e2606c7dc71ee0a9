"""Input and output: scenarios (TOML), results store (JSONL), schema."""
