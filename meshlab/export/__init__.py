"""A plan written for the tools that run it: PyTorch/XLA and DTensor snippets, diffusers and xDiT calls (pure, no
torch)."""
