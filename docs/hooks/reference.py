"""mkdocs hook: write the strategy file's field reference from the pydantic schema itself, so the page cannot drift.

A page that holds the line ``<!-- strategy-fields -->`` gets, in its place, one table per record of the schema
(``meshlab.strategy.schema``): each field's name, type, default and description, read from ``model_fields``.
"""

from __future__ import annotations

import typing

from pydantic import BaseModel

MARKER = "<!-- strategy-fields -->"


def on_page_markdown(markdown: str, **_kwargs) -> str:
    if MARKER not in markdown:
        return markdown
    from meshlab.strategy.schema import Strategy

    return markdown.replace(MARKER, "\n\n".join(_tables(Strategy)))


def _tables(root: type[BaseModel]) -> list[str]:
    seen: list[type[BaseModel]] = []
    queue = [root]
    while queue:
        model = queue.pop(0)
        if model in seen:
            continue
        seen.append(model)
        queue += [found for info in model.model_fields.values() for found in _records(info.annotation)]
    return [_table(model) for model in seen]


def _table(model: type[BaseModel]) -> str:
    doc = " ".join((model.__doc__ or "").split())
    rows = ["| field | type | default | what it is |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        default = "required" if info.is_required() else (
            "`[]`" if info.default_factory is list else "`{}`" if info.default_factory is dict
            else "its defaults" if info.default_factory is not None else f"`{_yaml(info.default)}`")
        described = model.field_description(name) if hasattr(model, "field_description") else info.description
        rows.append(f"| `{name}` | {_type(info.annotation)} | {default} | {_cell(described or '')} |")
    return f"### {model.__name__}\n\n{doc}\n\n" + "\n".join(rows)


def _records(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [found for arg in typing.get_args(annotation) for found in _records(arg)]


def _type(annotation) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is typing.Annotated:
        return "axis name" if args[0] is str else _type(args[0])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join(_type(a) for a in args)
    if origin is list:
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"mapping of {_type(args[0])} to {_type(args[1])}"
    return getattr(annotation, "__name__", str(annotation))


def _yaml(value) -> str:
    if value == "":
        return '""'
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
