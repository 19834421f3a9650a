"""What every stage shares: errors, output files, the closed pydantic base of meshlab's schemas, partition specs,
meshes, the hardware catalog with its GEMM-rate grid, and measured profiles (pure, no torch)."""
