"""From a strategy to a plan: rules to specs per parameter, the planned strategy (card, hardware, mesh, memory),
per-chip memory, how inputs split, and try's document (pure, no torch)."""
