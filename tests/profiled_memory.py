"""An independent measure of a call's working set on the CPU, for tests that hold meshlab's own op-by-op tracker
(meshlab.models.importer.decode_trace.live_tensors) to it: torch.profiler's memory timeline. It reads the profiler's
private timeline, here only."""

from __future__ import annotations

from typing import Any, Callable


def profiled_call(call: Callable[[], Any]) -> tuple[int, Any]:
    """The peak bytes of the CPU tensors `call` holds at once, every allocation the timeline ties to a tensor whatever
    its category, parameters aside (the category alone leaves HunyuanVideo's VAE uncounted past its attention mask),
    and what `call` returned. Runs without grad."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler import _memory_profiler as memory

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                                  with_stack=True) as prof:
        out = call()
    timeline = prof._memory_profile()

    def counted(key, version) -> bool:
        return isinstance(key, memory.TensorKey) and \
            timeline._categories.get(key, version) != memory.Category.PARAMETER

    current = peak = 0
    for _, action, (key, version), nbytes in timeline.timeline:
        if key.device.type != "cpu":
            continue
        if action in (memory.Action.PREEXISTING, memory.Action.CREATE):
            current += nbytes if counted(key, version) else 0
        elif action == memory.Action.INCREMENT_VERSION:
            current += (nbytes if counted(key, version + 1) else 0) - (nbytes if counted(key, version) else 0)
        elif action == memory.Action.DESTROY:
            current -= nbytes if counted(key, version) else 0
        peak = max(peak, current)
    return peak, out
