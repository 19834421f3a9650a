"""A real worker for the protocol's tests: ``python -m tests.runtime.protocol_worker REQUEST RESULT``."""

import os
import signal
import sys
import time

from typing import Any

from meshlab.runtime.protocol import report_progress, serve
from meshlab.runtime.requests import Request
from meshlab.runtime.results import Payload
from meshlab.core.errors import InputError


class ActionRequest(Request):
    """What the test worker is asked to do."""

    action: str
    value: Any = None


class EchoPayload(Payload):
    """What the test worker hands back."""

    echo: Any


def handle(request: ActionRequest) -> dict:
    action = request.action
    report_progress(f"doing {action}")
    if action == "echo":
        return {"echo": request.value}
    if action == "misnamed":  # a payload the parent's model does not read
        return {"echoed": request.value}
    if action == "refuse":
        raise InputError("the plan does not apply", "use another plan")
    if action == "oom":
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while allocating 3 GiB")
    if action == "invalid":  # a pydantic error of the handler's own, not of the request
        from meshlab.strategy.schema import Workload

        Workload(steps=0)
    if action == "crash":
        raise ValueError("something broke")
    if action == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "sleep":
        time.sleep(30)
    raise AssertionError(action)


if __name__ == "__main__":
    sys.exit(serve(handle, sys.argv[1:], "the test work", ActionRequest))
