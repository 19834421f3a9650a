"""Holding a plan against the compiler, the parent's side: the checks against XLA's partitioner, DTensor and XLA:TPU
(``against_*``; their workers are ``meshlab.workers.check_*``), the HLO reader, the readback and the
verdicts (no torch)."""
