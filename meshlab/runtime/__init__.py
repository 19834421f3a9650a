"""Processes: the worker protocol and its requests, the environments of child processes and the TPU topology a
compile needs (no torch; the workers themselves, which import it, are ``meshlab/workers/``, above every stage)."""
