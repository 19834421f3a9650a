"""Cost model: FLOPs, HBM bytes, collectives and predicted time of a plan (pure, no torch).

``meshlab.cost.predict.predict(plan, strategy, hardware)`` is the entry point; the modules follow the flow:
``layout`` (samples, tokens and calls per chip) -> ``graph`` (Linears with roles, attentions) -> ``flops``
(work per op) and ``collectives`` (derived per layer) -> ``topology`` (collective time over the wiring) ->
``timing`` (step time, roofline, assumptions).
"""
