"""The one worker protocol of check and run, through a real child process (tests/backend/protocol_worker.py)."""

import os

import pytest

from meshlab.backend.protocol import WorkerFailed, call_worker
from meshlab.errors import BackendError, InputError

MODULE = "tests.backend.protocol_worker"


def call(action: str, **request):
    seen = []
    env = dict(os.environ)
    env.pop("MESHLAB_DEBUG", None)
    return call_worker(MODULE, {"action": action, **request}, env, timeout_s=20, progress=seen.append), seen


def test_a_payload_and_the_progress_come_back():
    payload, seen = call("echo", value=[1, 2])
    assert payload == {"echo": [1, 2]} and seen == ["doing echo"]


def test_bad_input_comes_back_as_the_same_error():
    with pytest.raises(InputError, match="the plan does not apply; use another plan"):
        call("refuse")


@pytest.mark.parametrize("action, status, message", [
    ("oom", "oom", "the test work failed: RuntimeError: RESOURCE_EXHAUSTED"),
    ("crash", "error", "the test work failed: ValueError: something broke"),
    ("killed", "oom", "the torch worker stopped (exit code -9)"),
])
def test_failures_come_back_with_their_status(action, status, message):
    with pytest.raises(WorkerFailed) as caught:
        call(action)
    assert caught.value.status == status and message in caught.value.problem
    assert isinstance(caught.value, BackendError)  # exit 3 at the CLI


def test_a_worker_past_its_time_is_stopped(tmp_path):
    with pytest.raises(WorkerFailed, match="took longer than 1 s"):
        call_worker(MODULE, {"action": "sleep"}, dict(os.environ), timeout_s=1, folder=tmp_path)
    assert list(tmp_path.iterdir()) == []  # its scratch folder is gone


def test_an_interrupted_parent_stops_its_worker():
    """Ctrl-C or SIGTERM (the CLI turns it into SystemExit) while a worker runs: the worker is killed, not
    orphaned (call_worker's scratch folder then goes with its with-block)."""
    import subprocess
    import sys

    from meshlab.backend.protocol import _follow

    script = "import json, sys, time; print(json.dumps({'progress': 'started'}), flush=True); time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)

    def interrupted(_message):
        raise SystemExit(143)

    with pytest.raises(SystemExit):
        _follow(process, interrupted, None)
    assert process.poll() is not None  # killed and reaped, not left sleeping
