"""Comparing and searching plans: compare, sweep, and try's quick question (pure, no torch)."""
