"""Comparing and searching plans: compare, sweep, try's document and its quick question (pure, no torch)."""
