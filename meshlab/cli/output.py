"""The CLI's one output helper: JSON to stdout, rich tables to the terminal, errors as one line."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import NoReturn

import typer

from meshlab.errors import BackendError, InputError, MeshlabError
from meshlab.strategy.records import RecordError

EXIT_BAD_INPUT = 2
EXIT_BACKEND = 3


def print_json(document: object) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


def console():
    """A rich console; when stdout is not a terminal, wide enough that tables do not wrap."""
    import os

    from rich.console import Console

    width = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 140
    return Console(highlight=False, width=width)


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
        except RecordError as error:  # a value built in code from input that its record refuses: still input
            fail(InputError(str(error), "see `meshlab schema` for each field's type and bounds"))
        except KeyboardInterrupt:
            sys.stderr.write("meshlab: interrupted\n")
            raise typer.Exit(130) from None

    return wrapper


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
