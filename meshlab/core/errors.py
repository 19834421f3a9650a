"""meshlab's exception types.

The core raises these; the CLI turns each into one line
``meshlab: error: FILE:LINE:COL: what is wrong; how to fix it`` in one place (``meshlab.cli.output``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    """Where in an input file a problem sits (1-based line and column, as editors count)."""

    file: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        parts = [self.file]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        return ":".join(parts)


class MeshlabError(Exception):
    """A user-facing error: what is wrong, how to fix it, and where (when known)."""

    def __init__(
        self, problem: str, fix: str = "", location: Location | None = None, field: tuple = ()
    ):
        self.problem = problem
        self.fix = fix
        self.location = location
        self.field = field  # path of the strategy field at fault, e.g. ("rules", 2); placed by the loader
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = f"{self.location}: " if self.location else ""
        fix = f"; {self.fix}" if self.fix else ""
        return f"{where}{self.problem}{fix}"

    def at(self, location: Location) -> "MeshlabError":
        """The same error, placed at `location` unless it already has a place."""
        if self.location is not None:
            return self
        return type(self)(self.problem, self.fix, location, self.field)


class InputError(MeshlabError):
    """Bad input: a file, a strategy, a model card or a command-line value. Exit code 2."""


class PlanError(InputError):
    """A strategy that cannot be planned on its model and mesh (axis, rank, divisibility)."""


class MissingExtra(InputError):
    """An optional extra the command needs is not installed (torch_xla, diffusers, jax, libtpu, torchax): the
    user's to fix, like bad input (exit code 2), and the fix names the install command."""


class LoweringError(InputError):
    """A front end has no lowering for an op of the model's class (torchax): the input's to fix with another front
    end (exit 2)."""


class BackendError(MeshlabError):
    """torch_xla is missing, SPMD is off, or XLA rejected what meshlab asked of it. Exit code 3."""


def error_message(exc: BaseException) -> str:
    """The first lines of an XLA error, without the C++ stack trace that follows them."""
    lines = []
    for line in str(exc).splitlines():
        if line.strip().startswith(("*** Begin stack trace", "Frames:", "Exception raised from", "frame #")):
            break
        if line.strip():
            lines.append(line.strip())
    return " ".join(lines)[:500] or type(exc).__name__
