"""The peer workload as other durable-execution engines run it (bench_peers)."""
