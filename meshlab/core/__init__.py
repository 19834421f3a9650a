"""The figures every stage shares: errors, output files, partition specs, meshes, token counts, the hardware catalog
and its GEMM-rate grid (pure, no torch)."""
