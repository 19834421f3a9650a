"""From a strategy to a plan: rules to specs per parameter, the planned strategy (card, hardware, mesh, memory),
token counts, per-chip memory, and how inputs split (pure, no torch)."""
