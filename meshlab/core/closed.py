"""The base of every schema meshlab reads or writes: a closed, immutable pydantic model.

Closed: an unknown key is refused (a misspelt key is a mistake, not something to ignore). Immutable: a strategy
is a value, changed only by ``model_copy(update=...)``, which validates the new values as loading would (pydantic's
own ``model_copy`` does not; the sweep builds strategies from computed values, and one out of bounds must be the
same located error as in a file). Validators are built at first use (``defer_build``), so importing the schema
costs no validator build on a command that never validates.

The loader's located errors walk these models by field name; the helpers below give it the field's nested model,
description and bounds from pydantic's ``model_fields``.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, ClassVar

import annotated_types
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):  # pydantic's lax mode would read YAML's true as 1
        raise ValueError("Input should be an integer, not true or false")
    return value


#: An integer as a YAML author writes one: 3, 3.0 or "3", never true or false.
Int = Annotated[int, BeforeValidator(_not_a_bool)]


class Closed(BaseModel):
    """A closed, immutable, validated record (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, validate_default=False)

    #: A file to copy from, named in an error where a field has no description.
    EXAMPLE: ClassVar[str] = "the documentation"

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False):
        """The same record with some fields replaced, validated again (nested records stay records)."""
        del deep  # records are immutable: a shallow copy shares nothing that can change
        values = {name: getattr(self, name) for name in type(self).model_fields}
        return type(self).model_validate({**values, **(self.model_extra or {}), **(update or {})})

    @classmethod
    def field_names(cls) -> list[str]:
        return list(cls.model_fields)

    @classmethod
    def field_description(cls, name: str) -> str:
        """The field's description; for an undescribed field holding a record, the first line of its docstring."""
        described = cls.model_fields[name].description or ""
        record = None if described else cls.field_record(name)
        if record is not None and record.__doc__:
            first = inspect.cleandoc(record.__doc__).splitlines()[0].rstrip(".")
            described = first[:1].lower() + first[1:]
        return described

    @classmethod
    def field_metadata(cls, name: str) -> dict:
        """The field's description and bounds (ge, le, min_length, max_length; None where unset)."""
        info = cls.model_fields[name]
        found: dict[str, Any] = {"description": info.description or "", "ge": None, "le": None,
                                 "min_length": None, "max_length": None}
        for constraint in info.metadata:
            for key in ("ge", "le", "min_length", "max_length"):
                if isinstance(constraint, (annotated_types.BaseMetadata, annotated_types.GroupedMetadata)):
                    value = getattr(constraint, key, None)
                    if value is not None:
                        found[key] = value
        return found

    @classmethod
    def field_record(cls, name: str) -> type[Closed] | None:
        """The record type a field holds (directly, in a list or in a union), if any."""
        return _record_in(cls.model_fields[name].annotation)


def _record_in(annotation: object) -> type[Closed] | None:
    if isinstance(annotation, type) and issubclass(annotation, Closed):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _record_in(arg)
        if found is not None:
            return found
    return None


def first_problem(exc: ValidationError, data: object) -> tuple[tuple, str, str]:
    """The most specific problem pydantic found in `data`: its path through the data (the union members pydantic
    names, like ``constrained-int``, left out, so the path is what the author wrote), its type, and its message.
    Where several members of a union failed at that same place, their messages are joined with " or "."""
    errors = exc.errors(include_url=False)
    located = [(data_path(e["loc"], data, missing=e["type"] == "missing"), e) for e in errors]
    loc, error = max(located, key=lambda pair: len(pair[0]))  # the most specific; the first among equals
    if error["type"] in ("missing", "extra_forbidden"):
        return loc, error["type"], error["msg"]
    messages = [e["msg"].removeprefix("Value error, ") for path, e in located  # a validator's ValueError as written
                if path == loc and e["type"] not in ("missing", "extra_forbidden")]
    first, *others = dict.fromkeys(messages)
    return loc, error["type"], " or ".join([first, *(m.removeprefix("Input should be ") for m in others)])


def problem_line(exc: ValidationError, data: object, whole: str) -> str:
    """The first problem (`first_problem`) as ``field.path: message``; `whole` names the document where the problem
    is the document's own."""
    loc, _kind, message = first_problem(exc, data)
    return f"{'.'.join(map(str, loc)) or whole}: {message}"


def data_path(loc: tuple, data: object, missing: bool) -> tuple:
    """The parts of a problem's path that walk the document's data (and, for a missing field, its name), so
    the path names what the user wrote."""
    path = []
    for position, part in enumerate(loc):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        elif missing and position == len(loc) - 1:
            pass
        else:
            continue
        path.append(part)
    return tuple(path)
