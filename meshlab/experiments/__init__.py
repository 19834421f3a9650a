"""Experiment definitions (strategies x workloads to run) and their recorded results (JSONL, one run a line)."""
