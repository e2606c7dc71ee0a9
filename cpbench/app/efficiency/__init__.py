"""`cpbench efficiency`: cpbench's own schemes side by side with the libraries, against a
single-process baseline measured in the same run (no correctness check here). One module per
job: cases, measure, profile; docs/profile.md."""
