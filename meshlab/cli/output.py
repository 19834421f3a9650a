"""The CLI's one output helper: JSON to stdout, rich tables to the terminal, errors as one line."""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pydantic
import typer

from meshlab.core.errors import BackendError, InputError, MeshlabError

EXIT_BAD_INPUT = 2
EXIT_BACKEND = 3


def print_json(document: object, model) -> None:
    """`document` as JSON on stdout, once its model (a pydantic model, see meshlab.core.document) reads it back."""
    from meshlab.core.document import document_text

    sys.stdout.write(document_text(document, model) + "\n")


def print_schema(schema: dict) -> None:
    """A JSON Schema (the one document with no model of its own: it is a model's)."""
    sys.stdout.write(json.dumps(schema, indent=2) + "\n")


def png_path(path: Path | None) -> Path | None:
    """`--plot`'s file, which must be named .png (the plot is a PNG), or an InputError."""
    if path is not None and Path(path).suffix.lower() != ".png":
        from meshlab.core.errors import InputError, Location

        raise InputError(f"{path}: the plot is a PNG image", f"name a .png file, e.g. "
                         f"{Path(path).with_suffix('.png')}", Location("command line: --plot"))
    return path


def console():
    """A rich console: a terminal's width, or COLUMNS where it is set; otherwise (stdout is not a terminal) a page of
    140 columns, wide enough that tables do not wrap, where a table whose words do not fit even so is printed at
    its own width rather than cropped (rich cuts a cell's text, or whole columns, without a mark)."""
    import os

    from rich.console import Console
    from rich.table import Table

    class Unclipped(Console):
        def print(self, *objects, **kwargs):
            unbounded = self.options.update_width(10_000)  # a measure is clamped to the width it is given
            sizes = [self.measure(o, options=unbounded) for o in objects if isinstance(o, Table)]
            if all(size.minimum <= self.width for size in sizes):
                return super().print(*objects, **kwargs)
            # rich's collapse to a table's minimum still crops its last column: give it its whole width
            page, self.width = self.width, max(size.maximum for size in sizes)  # print's width= cannot exceed this
            try:
                super().print(*objects, **kwargs)
            finally:
                self.width = page

    if sys.stdout.isatty() or "COLUMNS" in os.environ:  # a terminal's width, or the one asked for, is kept
        return Console(highlight=False)
    return Unclipped(highlight=False, width=140)


def fail(error: MeshlabError) -> NoReturn:
    sys.stderr.write(f"meshlab: error: {error.one_line()}\n")
    raise typer.Exit(EXIT_BACKEND if isinstance(error, BackendError) else EXIT_BAD_INPUT)


def reports_errors(command: Callable) -> Callable:
    """Turn meshlab's errors into one line on stderr and an exit code, in one place."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except MeshlabError as error:
            fail(error)
        except OSError as error:  # stdout's own failures go on to `meshlab.cli.app.main` (output_failed)
            if error.errno in (errno.ENOSPC, errno.EDQUOT) and getattr(sys.stdout, "failed", None) is not error:
                fail(InputError(f"cannot write {error.filename or 'a file'}: {error.strerror}",
                                "free space and run it again"))  # a file the command wrote
            raise
        except pydantic.ValidationError as error:  # a value built in code from input that its record refuses
            fail(InputError(_one_line(error), "see `meshlab schema` for each field's type and bounds"))
        except KeyboardInterrupt:
            sys.stderr.write("meshlab: interrupted\n")
            raise typer.Exit(130) from None

    return wrapper


def _one_line(error: pydantic.ValidationError) -> str:
    """Every problem of a record built in code, each placed by its field path, on one line."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg'].removeprefix('Value error, ')}"
                     for e in error.errors(include_url=False))


#: Write errors of the output stream: a full disk, a quota, an I/O error, a reader that went away.
STDOUT_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EPIPE)


class WatchedStdout:
    """sys.stdout while the CLI runs (`meshlab.cli.app.main` installs it): the same stream, remembering the write
    error it raised, so a full disk on stdout is told apart from one under a file the command writes."""

    def __init__(self, stream):
        self._stream = stream
        self.failed: OSError | None = None

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as error:
            self.failed = error
            raise

    def flush(self):
        try:
            return self._stream.flush()
        except OSError as error:
            self.failed = error
            raise

    def __getattr__(self, name):
        return getattr(self._stream, name)


def output_failed(error: OSError) -> int | None:
    """If `error` is stdout failing: say so in one line (nothing for a closed pipe, as `| head` expects), point
    stdout at /dev/null so Python's flush at exit prints no traceback, and give the exit code. None: the error is
    about something else."""
    if error.errno not in STDOUT_ERRORS or getattr(sys.stdout, "failed", None) is not error:
        return None
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if error.errno == errno.EPIPE:
        return 1
    sys.stderr.write(f"meshlab: error: cannot write the output: {error.strerror}; free space or write it "
                     f"elsewhere\n")
    return EXIT_BAD_INPUT


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"



def warn_unmatched_rules(planned, strict: bool) -> None:
    """Each rule of `planned` that matches nothing: a warning on stderr, or with `strict` the first one an error."""
    from meshlab.plan.planned import unmatched_rules

    problems = unmatched_rules(planned)
    if strict and problems:
        raise problems[0]
    for problem in problems:
        sys.stderr.write(f"meshlab: warning: {problem.one_line()}\n")
