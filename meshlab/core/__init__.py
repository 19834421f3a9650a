"""The figures every stage shares: errors, output files, partition specs, meshes, token counts, the hardware catalog (pure, no torch)."""
