"""Applying a plan to a torch module: PyTorch/XLA SPMD, DTensor, scan over block lists, model rewrites and
activation hooks (torch)."""
