"""`cpbench efficiency`: cpbench's own schemes side by side with the libraries, against a
single-process baseline measured in the same run, so that cpbench's comparisons are not biased
by overhead of its own. No correctness check runs here (`cpbench verify` and the sweep do that).

By job: cases.py (what is compared and reported), measure.py (the timed rounds:
`run_efficiency`), profile.py (where a step's time goes: `profile_steps`).
"""
