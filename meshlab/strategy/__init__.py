"""The strategy file: its pydantic schema, the YAML reader that keeps line numbers, and the loader's located errors
(pure, no torch)."""
