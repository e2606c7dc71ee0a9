"""Benchmark harness: worker pool, timers, memory probes, counting communicator."""
