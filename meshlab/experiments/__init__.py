"""Running and measuring: `run` and `profile` orchestration (the parent's side), experiment definitions (strategies
x workloads), run records (JSONL, one run a line), `report` (measured beside predicted) and
`calibrate` (hardware figures fitted from run records)."""
