"""One protocol for meshlab's torch workers (`check` and `run`): a request file in, progress lines out, a result
file back. The parent side imports no torch.

The parent writes the request (JSON: one of ``meshlab.runtime.requests``' models) into a folder and starts ``python -m
MODULE REQUEST RESULT`` with the device environment (torch_xla reads it when it starts, so each plan gets a fresh
process). The worker prints progress as JSON lines ``{"progress": "..."}`` on stdout and writes RESULT once, atomically
(``WorkerResult``):

- ``{"ok": <payload>}``, or
- ``{"error": {"type", "status", "problem", "fix"}}`` (``WorkerError``): ``type`` is meshlab's error class
  (InputError, PlanError, BackendError), ``status`` what the run record calls it (``refused`` for bad input,
  ``oom`` when memory ran out, ``error`` otherwise). With ``MESHLAB_DEBUG`` set the worker re-raises after
  writing, for the traceback.

A worker that dies before writing RESULT (killed for memory, a crash in native code) or outlives its time is a
``WorkerFailed`` naming the exit code and the last lines of its stderr. A worker dies with its parent, however the
parent dies (`die_with_parent`): a ``meshlab check`` killed outright (SIGKILL, the kernel's OOM killer) leaves no
compile running on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, model_validator

from meshlab.runtime.requests import Request
from meshlab.core.errors import BackendError, InputError, MeshlabError, PlanError, error_message

Progress = Callable[[str], None]
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "out of memory", "Out of memory", "OOM")
_ERRORS = {"InputError": InputError, "PlanError": PlanError, "BackendError": BackendError}
#: the environment variable that gives a worker its parent's pid (`die_with_parent`)
PARENT_VARIABLE = "MESHLAB_WORKER_PARENT"


class WorkerFailed(BackendError):
    """The torch worker failed: `status` is "oom" or "error" (bad input comes back as meshlab's own errors)."""

    def __init__(self, problem: str, fix: str = "", location=None, field: tuple = (), status: str = "error"):
        super().__init__(problem, fix, location, field)
        self.status = status


class WorkerError(BaseModel):
    """A worker's failure as it writes it: meshlab's error class, what a run record calls it, and the one line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["InputError", "PlanError", "BackendError"]
    status: Literal["refused", "oom", "error"]
    problem: str
    fix: str


class WorkerResult(BaseModel):
    """The RESULT file: exactly one of a payload (`ok`) and an error."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")  # NaN stays NaN, as json

    ok: Optional[dict[str, Any]] = None
    error: Optional[WorkerError] = None

    @model_validator(mode="after")
    def _one_of(self) -> WorkerResult:
        if (self.ok is None) == (self.error is None):
            raise ValueError("a worker result holds exactly one of ok and error")
        return self


def is_out_of_memory(message: str) -> bool:
    """Whether an error message (XLA's, the runtime's, the worker's last line) says memory ran out."""
    return any(marker in message for marker in OOM_MARKERS)


# --- the parent's side -----------------------------------------------------------------------------------------


def call_worker(module: str, request: Request, env: dict[str, str], payload: type[BaseModel], *,
                folder: Path | None = None, timeout_s: float | None = None,
                progress: Progress = lambda _: None) -> dict:
    """Run `module`'s worker on `request` and return its payload, once read through `payload` (a model of
    meshlab.runtime.results); its errors come back as meshlab's errors."""
    with tempfile.TemporaryDirectory(prefix="meshlab-worker-", dir=folder) as scratch:
        request_path, result_path, stderr_path = (Path(scratch) / n for n in ("request.json", "result.json", "stderr"))
        request_path.write_text(request.model_dump_json())
        with stderr_path.open("w") as stderr:
            process = subprocess.Popen([sys.executable, "-m", module, str(request_path), str(result_path)],
                                       stdout=subprocess.PIPE, stderr=stderr, text=True,
                                       env={**env, PARENT_VARIABLE: str(os.getpid())})
            code = _follow(process, progress, timeout_s)
        if not result_path.exists():
            tail = _tail(stderr_path)
            killed = code in (-9, 137)
            status = "oom" if killed or is_out_of_memory(tail) else "error"
            fix = ("a signal -9 usually means it ran out of memory; use a plan with more headroom" if killed
                   else "rerun with MESHLAB_DEBUG=1 for the traceback")
            raise WorkerFailed(f"the torch worker stopped (exit code {code}): {tail}", fix, status=status)
        try:
            result = WorkerResult.model_validate_json(result_path.read_text())
        except ValidationError as exc:
            raise BackendError(f"the torch worker wrote a result meshlab cannot read: {exc.errors()[0]['msg']}",
                               "rerun with MESHLAB_DEBUG=1; the worker and this meshlab may be different versions")
    if result.error is not None:
        error = result.error
        if error.status in ("oom", "error") and error.type == "BackendError":
            raise WorkerFailed(error.problem, error.fix, status=error.status)
        raise _ERRORS[error.type](error.problem, error.fix)
    return read_payload(result.ok, payload, module)


def read_payload(data: Any, payload: Any, who: str) -> Any:
    """`data` once read through `payload` (a model, or a type such as ``list[Model]``); a payload that does not
    match is a BackendError naming the field, not a KeyError where the parent first reads it."""
    try:
        TypeAdapter(payload).validate_python(data)
    except ValidationError as exc:
        from meshlab.core.closed import problem_line

        raise BackendError(f"{who} handed back a result meshlab does not read ({problem_line(exc, data, 'it')})",
                           "rerun with MESHLAB_DEBUG=1; the worker and this meshlab may be different versions"
                           ) from None
    return data


def _follow(process: subprocess.Popen, progress: Progress, timeout_s: float | None) -> int:
    """Relay the worker's progress until it exits; past `timeout_s` it is killed and that is a WorkerFailed."""
    import threading

    fired = threading.Event()

    def stop() -> None:
        fired.set()
        process.kill()

    timer = threading.Timer(timeout_s, stop) if timeout_s else None
    if timer:
        timer.start()
    try:
        for line in process.stdout:
            _report_progress(line, progress)
        code = process.wait()
    except BaseException:  # interrupted or terminated: the worker goes too, and its scratch folder is removed
        process.kill()
        process.wait()
        raise
    finally:
        if timer:
            timer.cancel()
    if fired.is_set():
        raise WorkerFailed(f"the torch worker took longer than {timeout_s:.0f} s and was stopped", "raise --timeout")
    return code


def _report_progress(line: str, progress: Progress) -> None:
    try:
        message = json.loads(line).get("progress")
    except (json.JSONDecodeError, AttributeError):
        return
    if message:
        progress(message)


def _tail(path: Path, lines: int = 3) -> str:
    text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return " | ".join(text[-lines:])[:1000] or "no message"


# --- the worker's side -----------------------------------------------------------------------------------------


def die_with_parent(parent: int | None = None) -> None:
    """Linux: this process gets SIGKILL when the process that started it dies, however it dies (prctl's
    PR_SET_PDEATHSIG; the standard library has no call for it). `parent`: the pid that started it, where known;
    if that process died before the signal was armed (this process's parent is then another), it exits now."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        if ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL) != 0:  # PR_SET_PDEATHSIG, refused
            return
    except OSError:
        return
    if parent is not None and os.getppid() != parent:
        sys.stderr.write(f"meshlab: the process that started this one (pid {parent}) is gone; stopping\n")
        sys.stderr.flush()
        os._exit(1)


def report_progress(message: str) -> None:
    sys.stdout.write(json.dumps({"progress": message}) + "\n")
    sys.stdout.flush()


def serve(handler: Callable[[Any], dict], argv: list[str], what: str, request_type: Any) -> int:
    """The worker's main: read the request as `request_type` (a model of meshlab.runtime.requests, or a union of
    them), call `handler` with it, write its payload or its error as the result.

    `what` names the work in the message of an unexpected exception ("the check failed: ...")."""
    request_path, result_path = Path(argv[0]), Path(argv[1])
    parent = os.environ.pop(PARENT_VARIABLE, "")  # not handed on: a process this worker starts has another parent
    if parent.isdigit():  # started by call_worker: it dies with the meshlab command that started it
        die_with_parent(int(parent))
    failure: BaseException | None = None
    try:
        request = TypeAdapter(request_type).validate_json(request_path.read_text())
    except ValidationError as exc:  # the parent wrote what this worker does not read: versions differ
        request, failure = None, exc
        document = WorkerResult(error=WorkerError(
            type="BackendError", status="error", problem=f"{what} could not read its request: {exc.errors()[0]['msg']} "
            f"at {'.'.join(map(str, exc.errors()[0]['loc']))}", fix="reinstall meshlab; parent and worker disagree"))
    if failure is None:
        try:
            document = WorkerResult(ok=handler(request))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the parent as one error
            document, failure = WorkerResult(error=error_document(exc, what)), exc
    tmp = result_path.with_name(result_path.name + ".tmp")
    tmp.write_text(document.model_dump_json())
    os.replace(tmp, result_path)
    if failure is not None and os.environ.get("MESHLAB_DEBUG"):
        raise failure
    return 0


def error_document(exc: BaseException, what: str) -> WorkerError:
    if isinstance(exc, MeshlabError):
        status = "refused" if isinstance(exc, (InputError, PlanError)) else getattr(exc, "status", "error")
        return WorkerError(type=type(exc).__name__ if type(exc).__name__ in _ERRORS else "BackendError",
                           status=status, problem=exc.problem, fix=exc.fix)
    message = error_message(exc)
    return WorkerError(type="BackendError", status="oom" if is_out_of_memory(str(exc)) else "error",
                       problem=f"{what} failed: {type(exc).__name__}: {message}",
                       fix="rerun with MESHLAB_DEBUG=1 for the traceback")
