"""Imported only by the server process the ranks are forked from (meshlab.workers.ranks.spawn preloads it first):
the server dies with the worker that started it, and the ranks, each armed the same way, die with the server. The
ranks hold the server's liveness pipe open, so without this a rank stopped or stuck would keep the server, and so
itself, alive after the worker died."""

from meshlab.runtime.protocol import die_with_parent

die_with_parent()
