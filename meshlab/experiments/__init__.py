"""Running and measuring: `run` and `profile` orchestration (the parent's side), experiment definitions (strategies
x workloads), run records (JSONL, one run a line), and `report` (measured beside predicted)."""
