"""Holding a plan against the compiler: the XLA, DTensor and XLA:TPU checks' parent side, the HLO reader, the readback and the verdicts (no torch; the workers run the compiles)."""
