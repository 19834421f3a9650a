"""Whole diffusers pipelines as meshlab runs them: the runner (and its command line), the stock pipeline, the tiny
and random-weight builds, and the fixes XLA needs (torch)."""
