"""Processes: the worker protocol and its requests, the device environments of child processes (no torch; the workers that import it are in ``workers/``)."""
