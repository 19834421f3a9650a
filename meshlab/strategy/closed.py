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
from typing import Any, ClassVar

import annotated_types
from pydantic import BaseModel, ConfigDict


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
