"""Closed, typed records: immutable values checked field by field, every field described, with a JSON Schema.

A record validates when it is made, from keywords (``Rule(match="*", shard="replicate")``) or from a document's
data (``Strategy.model_validate(data)``, which also converts nested mappings to records and says where each
problem is). Unknown keys are refused unless the record keeps them (``ALLOW_EXTRA``). The calls keep the names
of the pydantic calls meshlab used before (model_validate, model_copy, model_dump, model_json_schema), so the
code that reads strategies did not change.

Why not pydantic: `meshlab try` is meant to answer in under 0.25 s. On the 2-core development host pydantic
cost about 100 ms of its 0.32 s (60 ms to import, 33 ms to build the strategy's validators at first use), more
than planning, sizing and rendering together; these records need only the standard library and build nothing.

What a field can be: ``str``, ``int``, ``bool``, ``Literal[...]``, ``Optional`` / ``Union`` of these,
``list[X]``, ``dict[K, V]``, another record, and ``Annotated[str, Pattern(...)]``. Conversion is lax where a
YAML author would expect it (an integral float or a digit string for an int, "yes" / "no" for a bool) and
nowhere else (a number is not a string).
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Annotated, Any, ClassVar, Literal, Union

_NONE = type(None)
_UNIONS = (Union, types.UnionType)  # Optional[X] / Union[X, Y], and X | Y
MISSING = type("Missing", (), {"__repr__": lambda self: "MISSING"})()  # no default: the field is required
_TRUE = {"true", "yes", "on", "y", "t", "1"}
_FALSE = {"false", "no", "off", "n", "f", "0"}


class Pattern:
    """The regular expression a string must match (``Annotated[str, Pattern(r"^...$", "a mesh axis name")]``)."""

    __slots__ = ("regex", "description")

    def __init__(self, regex: str, description: str = ""):
        self.regex, self.description = regex, description


class Problem:
    """One thing wrong with the data: where (keys and indices from the root), its kind, and what."""

    __slots__ = ("loc", "type", "msg")

    def __init__(self, loc: tuple, kind: str, msg: str):
        # kind: "missing", "extra_forbidden", "value_error", or what was expected ("int_type", "literal_error", ...)
        self.loc, self.type, self.msg = loc, kind, msg

    def __repr__(self) -> str:
        return f"Problem({self.loc!r}, {self.type!r}, {self.msg!r})"


class RecordError(ValueError):
    """The data does not make a record: every problem found, each placed."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(f"{'.'.join(map(str, p.loc)) or 'record'}: {p.msg}" for p in problems))

    def errors(self) -> list[dict]:
        return [{"loc": p.loc, "type": p.type, "msg": p.msg} for p in self.problems]


class FieldInvalid(ValueError):
    """Raised by a record's ``_check`` to place its problem at one of the record's fields."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


class _Field:
    """A record field as declared: its default (or factory), description and bounds; its type comes later."""

    __slots__ = ("name", "default", "factory", "metadata")

    def __init__(self, default: Any, factory: Any, metadata: dict):
        self.name, self.default, self.factory, self.metadata = "", default, factory, metadata

    @property
    def required(self) -> bool:
        return self.default is MISSING and self.factory is MISSING

    def make_default(self) -> Any:
        return self.default if self.factory is MISSING else self.factory()


def field(default: Any = MISSING, *, factory: Any = MISSING, description: str = "", ge: int | None = None,
          le: int | None = None, min_length: int | None = None, max_length: int | None = None) -> Any:
    """A record field: its default (or `factory` for a fresh one each time), its description and its bounds
    (`ge` / `le` on a number; `min_length` / `max_length` on a string, list or mapping)."""
    metadata = {"description": description, "ge": ge, "le": le, "min_length": min_length, "max_length": max_length}
    return _Field(default, factory, metadata)


class Closed:
    """Base of every record: immutable, made from keywords, validated when made, compared by value.

    Each annotated class attribute is a field (``name: type = field(...)``, or a plain default); fields are
    keyword-only. A subclass may define ``_check(self)``, run after its fields validate, raising ``ValueError``
    (a problem of the whole record) or ``FieldInvalid`` (a problem of one field). (Not a dataclass: a frozen
    dataclass compiles five methods per class, about a millisecond per record type at every start.)"""

    ALLOW_EXTRA: ClassVar[bool] = False  # keep unknown keys in the field `extra` instead of refusing them
    EXAMPLE: ClassVar[str] = "the documentation"  # a file to copy from, named where a field has no description
    _declared: ClassVar[tuple[_Field, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        declared = {f.name: f for f in cls._declared}
        for name, annotation in cls.__dict__.get("__annotations__", {}).items():
            if "ClassVar" in str(annotation):
                continue
            value = cls.__dict__.get(name, MISSING)
            declared[name] = value if isinstance(value, _Field) else _Field(value, MISSING, {})
            declared[name].name = name
            if name in cls.__dict__:
                delattr(cls, name)
        cls._declared = tuple(declared.values())

    def __init__(self, **values: Any) -> None:
        for spec in self._declared:
            if spec.name in values:
                object.__setattr__(self, spec.name, values.pop(spec.name))
            elif spec.required:
                raise TypeError(f"{type(self).__name__}() needs the keyword {spec.name!r}")
            else:
                object.__setattr__(self, spec.name, spec.make_default())
        if values:
            raise TypeError(f"{type(self).__name__}() takes no keyword {next(iter(values))!r}")
        self._validate()

    def _validate(self) -> None:
        problems: list[Problem] = []
        for spec, hint in _fields(type(self)):
            value = getattr(self, spec.name)
            converted = _convert(hint, spec.metadata, value, (spec.name,), problems)
            if converted is not value and converted is not _FAILED:
                object.__setattr__(self, spec.name, converted)
        if not problems:
            check = getattr(self, "_check", None)
            try:
                if check is not None:
                    check()
            except FieldInvalid as exc:
                problems.append(Problem((exc.field,), "value_error", str(exc)))
            except ValueError as exc:
                problems.append(Problem((), "value_error", str(exc)))
        if problems:
            raise RecordError(problems)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; use model_copy(update={{{name!r}: ...}})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _values(self) -> tuple:
        return tuple(getattr(self, spec.name) for spec in self._declared)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        shown = ", ".join(f"{spec.name}={getattr(self, spec.name)!r}" for spec in self._declared)
        return f"{type(self).__name__}({shown})"

    # --- made from data -------------------------------------------------------------------------------------

    @classmethod
    def model_validate(cls, data: object):
        """The record `data` (a mapping, as YAML or JSON gives it) describes, or RecordError with every problem."""
        problems: list[Problem] = []
        record = _record(cls, data, (), problems)
        if problems:
            raise RecordError(problems)
        return record

    def model_copy(self, update: dict | None = None):
        """The same record with some fields replaced (validated again)."""
        return type(self)(**{**{spec.name: getattr(self, spec.name) for spec in self._declared}, **(update or {})})

    def model_dump(self, mode: str = "python", exclude_none: bool = False) -> dict:
        """Plain data: nested records as mappings, kept unknown keys merged back in (`mode` is accepted for
        callers that ask for JSON; the values are JSON's already)."""
        del mode
        out = {}
        for spec in self._declared:
            value = getattr(self, spec.name)
            if spec.name == "extra" and self.ALLOW_EXTRA:
                out.update(value)
            elif not (exclude_none and value is None):
                out[spec.name] = _dump(value, exclude_none)
        return out

    # --- what the fields are ----------------------------------------------------------------------------------

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in cls._declared if not (f.name == "extra" and cls.ALLOW_EXTRA)]

    @classmethod
    def field_description(cls, name: str) -> str:
        """The field's description; for an undescribed field holding a record, the first line of its docstring."""
        described = next((f.metadata.get("description", "") for f in cls._declared if f.name == name), "")
        record = None if described else cls.field_record(name)
        if record is not None and record.__doc__:
            first = inspect.cleandoc(record.__doc__).splitlines()[0].rstrip(".")
            described = first[:1].lower() + first[1:]
        return described

    @classmethod
    def field_metadata(cls, name: str) -> dict:
        """The field's description and bounds (ge, le, min_length, max_length; None where unset)."""
        return dict(next(f.metadata for f in cls._declared if f.name == name))

    @classmethod
    def field_record(cls, name: str) -> type[Closed] | None:
        """The record type a field holds (directly, in a list or in a union), if any."""
        hint = next((h for f, h in _fields(cls) if f.name == name), None)
        return _record_in(hint)

    @classmethod
    def model_json_schema(cls) -> dict:
        """JSON Schema (draft 2020-12) of the record, nested records inline, each field with its description."""
        return _record_schema(cls)


# --- validation -----------------------------------------------------------------------------------------------

_FAILED = object()


def _fields(cls: type[Closed]) -> list[tuple[_Field, Any]]:
    """Each field with its resolved type (resolved once per class, at its first record)."""
    cached = cls.__dict__.get("_record_fields")
    if cached is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        cached = [(f, hints[f.name]) for f in cls._declared]
        type.__setattr__(cls, "_record_fields", cached)
    return cached


def _record(cls: type[Closed], data: object, loc: tuple, problems: list[Problem]):
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        problems.append(Problem(loc, "model_type", f"Input should be a mapping of {_keys_hint(cls)}"))
        return _FAILED
    known = {f.name: (f, hint) for f, hint in _fields(cls)}
    names = cls.field_names()
    values, extra, before = {}, {}, len(problems)
    for key, value in data.items():
        if key in names:
            values[key] = _convert(known[key][1], known[key][0].metadata, value, (*loc, key), problems)
        elif cls.ALLOW_EXTRA:
            extra[key] = value
        else:
            problems.append(Problem((*loc, key), "extra_forbidden", "Extra inputs are not permitted"))
    for name in names:
        if name not in data and known[name][0].required:
            problems.append(Problem((*loc, name), "missing", "Field required"))
    if len(problems) > before:
        return _FAILED
    if cls.ALLOW_EXTRA:
        values["extra"] = extra
    try:
        return cls(**values)
    except RecordError as exc:
        problems.extend(Problem((*loc, *p.loc), p.type, p.msg) for p in exc.problems)
        return _FAILED


def _convert(hint: Any, metadata: Any, value: Any, loc: tuple, problems: list[Problem]) -> Any:
    """`value` as type `hint` (with the field's bounds in `metadata`), or _FAILED with the problem appended."""
    converted = _as_type(hint, value, loc, problems)
    if converted is _FAILED or converted is None or not metadata:
        return converted
    message = _bounds_problem(metadata, converted)
    if message:
        problems.append(Problem(loc, "value_error", message))
        return _FAILED
    return converted


def _as_type(hint: Any, value: Any, loc: tuple, problems: list[Problem]) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if hint is _NONE:
        return None if value is None else _fail(problems, loc, "none_required", "Input should be null")
    if origin is Annotated:
        converted = _as_type(args[0], value, loc, problems)
        for meta in args[1:]:
            if isinstance(meta, Pattern) and converted is not _FAILED and not re.fullmatch(meta.regex, converted):
                return _fail(problems, loc, "string_pattern_mismatch",
                             f"Input should be {meta.description or 'a string'} matching '{meta.regex}'")
        return converted
    if origin in _UNIONS:
        return _as_union(args, value, loc, problems)
    if origin is Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return value
        return _fail(problems, loc, "literal_error", f"Input should be {_alternatives(args)}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            return _fail(problems, loc, "list_type", "Input should be a list")
        items = [_as_type(args[0], item, (*loc, i), problems) for i, item in enumerate(value)]
        return _FAILED if _FAILED in items else items
    if origin is dict:
        if not isinstance(value, dict):
            return _fail(problems, loc, "dict_type", "Input should be a mapping")
        out = {}
        for key, item in value.items():
            converted_key = _as_type(args[0], key, (*loc, key), problems)
            out[converted_key] = _as_type(args[1], item, (*loc, key), problems)
        return _FAILED if _FAILED in out or _FAILED in out.values() else out
    if isinstance(hint, type) and issubclass(hint, Closed):
        return _record(hint, value, loc, problems)
    if hint is str:
        return value if isinstance(value, str) else _fail(problems, loc, "string_type", "Input should be a string")
    if hint is bool:
        return _as_bool(value, loc, problems)
    if hint is int:
        return _as_int(value, loc, problems)
    raise TypeError(f"records cannot hold {hint!r}")


def _as_union(members: tuple, value: Any, loc: tuple, problems: list[Problem]) -> Any:
    """The first member `value` converts to; else the problems of the member that got furthest (the deepest
    place, so a mapping's own error wins over 'not a string'), or, all equally shallow, one line naming each."""
    if value is None and _NONE in members:
        return None
    attempts = []
    for member in members:
        if member is _NONE:
            continue
        tried: list[Problem] = []
        converted = _as_type(member, value, loc, tried)
        if converted is not _FAILED:
            return converted
        attempts.append(tried)
    deepest = max(attempts, key=lambda tried: max(len(p.loc) for p in tried))
    if max(len(p.loc) for p in deepest) > len(loc):
        problems.extend(deepest)
        return _FAILED
    options = [p.msg.removeprefix("Input should be ") for tried in attempts for p in tried]
    if _NONE in members:
        options.append("null")
    return _fail(problems, loc, "union_error", "Input should be " + " or ".join(options))


def _as_bool(value: Any, loc: tuple, problems: list[Problem]) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return _fail(problems, loc, "bool_type", "Input should be true or false")


def _as_int(value: Any, loc: tuple, problems: list[Problem]) -> Any:
    if isinstance(value, bool):
        return _fail(problems, loc, "int_type", "Input should be an integer, not true or false")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]{1,30}\s*", value):
        return int(value)
    return _fail(problems, loc, "int_type", "Input should be an integer")


def _bounds_problem(metadata: Any, value: Any) -> str | None:
    ge, le = metadata.get("ge"), metadata.get("le")
    if ge is not None and value < ge:
        return f"Input should be greater than or equal to {ge}"
    if le is not None and value > le:
        return f"Input should be less than or equal to {le}"
    least, most = metadata.get("min_length"), metadata.get("max_length")
    if least is None and most is None:
        return None
    unit = "character" if isinstance(value, str) else "item"
    what = {str: "String", list: "List", dict: "Mapping"}.get(type(value), "Value")
    if least is not None and len(value) < least:
        return f"{what} should have at least {least} {unit}{'s' if least != 1 else ''}"
    if most is not None and len(value) > most:
        return f"{what} should have at most {most} {unit}{'s' if most != 1 else ''}, not {len(value)}"
    return None


def _fail(problems: list[Problem], loc: tuple, kind: str, message: str) -> object:
    problems.append(Problem(loc, kind, message))
    return _FAILED


def _alternatives(values: tuple) -> str:
    shown = [repr(v) for v in values]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


def _keys_hint(cls: type[Closed]) -> str:
    return "keys (" + ", ".join(cls.field_names()) + ")"


def _record_in(hint: Any) -> type[Closed] | None:
    if isinstance(hint, type) and issubclass(hint, Closed):
        return hint
    for arg in typing.get_args(hint):
        found = _record_in(arg)
        if found:
            return found
    return None


def _dump(value: Any, exclude_none: bool) -> Any:
    if isinstance(value, Closed):
        return value.model_dump(exclude_none=exclude_none)
    if isinstance(value, (list, tuple)):
        return [_dump(v, exclude_none) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v, exclude_none) for k, v in value.items()}
    return value


# --- JSON Schema ----------------------------------------------------------------------------------------------

def _record_schema(cls: type[Closed]) -> dict:
    properties, required = {}, []
    for field, hint in _fields(cls):
        if field.name == "extra" and cls.ALLOW_EXTRA:
            continue
        schema = _type_schema(hint)
        meta = field.metadata
        if meta.get("description"):
            schema["description"] = meta["description"]
        for key, name in (("ge", "minimum"), ("le", "maximum")):
            if meta.get(key) is not None:
                schema[name] = meta[key]
        for key, names in (("min_length", ("minLength", "minItems", "minProperties")),
                           ("max_length", ("maxLength", "maxItems", "maxProperties"))):
            if meta.get(key) is not None:
                typed = [m.get("type") for m in schema.get("anyOf", [schema]) if m.get("type") != "null"]
                kind = {"string": 0, "array": 1, "object": 2}.get(typed[0] if typed else None, 1)
                schema[names[kind]] = meta[key]
        if field.required:
            required.append(field.name)
        else:
            schema["default"] = _dump(field.make_default(), False)
        properties[field.name] = schema
    out = {"type": "object", "title": cls.__name__, "properties": properties,
           "additionalProperties": cls.ALLOW_EXTRA}
    if cls.__doc__:
        out["description"] = inspect.cleandoc(cls.__doc__)
    if required:
        out["required"] = required
    return out


def _type_schema(hint: Any) -> dict:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is _NONE:
        return {"type": "null"}
    if origin is Annotated:
        schema = _type_schema(args[0])
        for meta in args[1:]:
            if isinstance(meta, Pattern):
                schema["pattern"] = meta.regex
                if meta.description:
                    schema["description"] = meta.description
        return schema
    if origin in _UNIONS:
        return {"anyOf": [_type_schema(a) for a in args]}
    if origin is Literal:
        kinds = {type(a) for a in args}
        return {"enum": list(args), **({"type": "string"} if kinds == {str} else {})}
    if origin is list:
        return {"type": "array", "items": _type_schema(args[0])}
    if origin is dict:
        return {"type": "object", "propertyNames": _type_schema(args[0]),
                "additionalProperties": _type_schema(args[1])}
    if isinstance(hint, type) and issubclass(hint, Closed):
        return _record_schema(hint)
    if hint is Any:
        return {}
    return {"type": {str: "string", int: "integer", bool: "boolean"}[hint]}
