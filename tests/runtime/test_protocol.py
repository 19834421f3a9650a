"""The one worker protocol of check and run, through a real child process (tests/runtime/protocol_worker.py)."""

import os
from pathlib import Path

import pytest

from meshlab.runtime.protocol import WorkerFailed, call_worker
from meshlab.runtime.requests import Request
from meshlab.core.errors import BackendError, InputError

from tests.runtime.protocol_worker import ActionRequest, EchoPayload

MODULE = "tests.runtime.protocol_worker"


def call(action: str, **request):
    seen = []
    env = dict(os.environ)
    env.pop("MESHLAB_DEBUG", None)
    return call_worker(MODULE, ActionRequest(action=action, **request), env, EchoPayload, timeout_s=20,
                       progress=seen.append), seen


def test_a_payload_and_the_progress_come_back():
    payload, seen = call("echo", value=[1, 2, None, float("inf")])
    assert payload == {"echo": [1, 2, None, float("inf")]} and seen == ["doing echo"]


def test_a_request_the_worker_does_not_read_is_a_backend_error_naming_the_field():
    class Misspelt(Request):
        acton: str

    with pytest.raises(BackendError, match="the test work could not read its request: Field required at action"):
        call_worker(MODULE, Misspelt(acton="echo"), dict(os.environ), EchoPayload, timeout_s=20)


def test_a_payload_the_parent_does_not_read_is_a_backend_error_naming_the_field():
    with pytest.raises(BackendError, match=r"tests.runtime.protocol_worker handed back a result meshlab does not read "
                                           r"\(echo: Field required\)") as caught:
        call("misnamed", value=1)
    assert "different versions" in caught.value.fix


def test_a_request_is_checked_when_the_parent_makes_it():
    from pydantic import ValidationError

    from meshlab.runtime.requests import RunWorkload, XlaRunRequest

    workload = RunWorkload(height=64, width=64, steps=2, cfg=True, batch=1, dtype="float32", cfg_scale=4.0)
    with pytest.raises(ValidationError, match="scratch"):
        XlaRunRequest(strategy="s.yaml", checkpoint="tiny", workload=workload, prompt="p", seed=0)
    with pytest.raises(ValidationError, match="Extra inputs"):
        XlaRunRequest(strategy="s.yaml", checkpoint="tiny", workload=workload, prompt="p", seed=0, scratch="/t",
                      colour="red")


def test_bad_input_comes_back_as_the_same_error():
    with pytest.raises(InputError, match="the plan does not apply; use another plan"):
        call("refuse")


@pytest.mark.parametrize("action, status, message", [
    ("oom", "oom", "the test work failed: RuntimeError: RESOURCE_EXHAUSTED"),
    ("crash", "error", "the test work failed: ValueError: something broke"),
    ("invalid", "error", "the test work failed: ValidationError: 1 validation error for Workload"),  # not the request
    ("killed", "oom", "the torch worker stopped (exit code -9)"),
])
def test_failures_come_back_with_their_status(action, status, message):
    with pytest.raises(WorkerFailed) as caught:
        call(action)
    assert caught.value.status == status and message in caught.value.problem
    assert isinstance(caught.value, BackendError)  # exit 3 at the CLI


def test_a_worker_past_its_time_is_stopped(tmp_path):
    with pytest.raises(WorkerFailed, match="took longer than 1 s"):
        call_worker(MODULE, ActionRequest(action="sleep"), dict(os.environ), EchoPayload, timeout_s=1,
                    folder=tmp_path)
    assert list(tmp_path.iterdir()) == []  # its scratch folder is gone


def test_an_interrupted_parent_stops_its_worker():
    """Ctrl-C or SIGTERM (the CLI turns it into SystemExit) while a worker runs: the worker is killed, not
    orphaned (call_worker's scratch folder then goes with its with-block)."""
    import subprocess
    import sys

    from meshlab.runtime.protocol import _follow

    script = "import json, sys, time; print(json.dumps({'progress': 'started'}), flush=True); time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)

    def interrupted(_message):
        raise SystemExit(143)

    with pytest.raises(SystemExit):
        _follow(process, interrupted, None)
    assert process.poll() is not None  # killed and reaped, not left sleeping


def test_a_worker_dies_with_a_parent_killed_outright():
    """SIGKILL (or the OOM killer) gives the parent no chance to stop its worker: the worker, armed with
    PR_SET_PDEATHSIG by serve, dies with it instead of sleeping on (here 30 s) as an orphan."""
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    parent = subprocess.Popen([sys.executable, "-c", (
        "import os; from meshlab.runtime.protocol import call_worker; "
        "from tests.runtime.protocol_worker import ActionRequest, EchoPayload; "
        f"call_worker({MODULE!r}, ActionRequest(action='sleep'), dict(os.environ), EchoPayload, "
        "progress=lambda m: print(m, flush=True))")], cwd=REPO, stdout=subprocess.PIPE, text=True)
    children: list[int] = []
    try:
        assert parent.stdout.readline().strip() == "doing sleep"  # the worker is in its handler
        children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent_of(p) == parent.pid]
        assert len(children) == 1
        worker = children[0]
        parent.kill()
        parent.wait()
        deadline = time.time() + 10
        while _running(worker) and time.time() < deadline:
            time.sleep(0.1)
        assert not _running(worker), "the worker outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        for pid in filter(_running, children):  # a worker left behind by a failure here
            os.kill(pid, 9)


def test_a_worker_whose_parent_died_before_it_was_armed_exits():
    import subprocess
    import sys

    from tests.conftest import REPO

    script = "import sys; from meshlab.runtime.protocol import die_with_parent; die_with_parent(int(sys.argv[1])); " \
             "print('alive')"
    for parent, code, out in ((os.getpid(), 0, "alive\n"), (os.getpid() + 1_000_000, 1, "")):
        done = subprocess.run([sys.executable, "-c", script, str(parent)], cwd=REPO, capture_output=True, text=True)
        assert (done.returncode, done.stdout) == (code, out), done.stderr
        assert ("is gone; stopping" in done.stderr) == (code == 1)


def _parent_of(proc) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed worker whose parent is gone is reaped by init)."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False
