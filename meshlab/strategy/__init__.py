"""The strategy file: its pydantic schema (on core's closed base), the YAML reader that keeps line numbers, and the
loader's located errors (pure, no torch)."""
