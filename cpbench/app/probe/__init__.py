"""`cpbench probe`: measure this machine's links and local attention kernel, and write a
hardware profile from them, in under a minute. One module per job: docs/probe.md."""
