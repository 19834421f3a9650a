"""Whole diffusers pipelines as meshlab runs them: the runner, the stock pipeline, the tiny and random-weight builds,
and the fixes XLA needs (torch)."""
