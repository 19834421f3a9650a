"""Read a strategy file into a validated ``Strategy``, or fail with one located, fixable error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

from meshlab.errors import InputError, MeshlabError
from meshlab.strategy.schema import Strategy
from meshlab.strategy.yaml_source import YamlDocument, read_yaml


@dataclass(frozen=True)
class LoadedStrategy:
    """A validated strategy and where it came from (to place later errors at a line)."""

    strategy: Strategy
    document: YamlDocument
    path: Path

    def place(self, error: MeshlabError) -> MeshlabError:
        """Give an error raised while planning the file, naming a field, its line in the file."""
        return error.at(self.document.locate(error.field))


def load_strategy(path: str | Path) -> LoadedStrategy:
    path = Path(path)
    document = read_yaml(path)
    if not isinstance(document.data, dict):
        raise InputError(
            f"a strategy is a mapping of keys, got a {type(document.data).__name__}",
            "start from strategies/2d.yaml",
            document.locate(()),
        )
    try:
        strategy = Strategy.model_validate(document.data)
    except ValidationError as exc:
        raise _first_error(exc, document) from None
    return LoadedStrategy(strategy, document, path)


def _first_error(exc: ValidationError, document: YamlDocument) -> InputError:
    error = exc.errors(include_url=False)[0]
    loc = tuple(part for part in error["loc"] if not _is_union_branch(part))
    where = document.locate(loc)
    field = _show_path(loc) or "the strategy"
    kind = error["type"]
    if kind == "extra_forbidden":
        parent = _show_path(loc[:-1]) or "the strategy"
        valid = ", ".join(_valid_keys(loc[:-1]))
        return InputError(f"unknown key {loc[-1]!r} in {parent}", f"valid keys are: {valid}", where)
    if kind == "missing":
        return InputError(f"{field} is missing", f"add `{loc[-1]}:` ({_description(loc)})", where)
    message = error["msg"].removeprefix("Value error, ")
    return InputError(f"{field}: {message}", _fix_for(loc), where)


def _is_union_branch(part: object) -> bool:
    """pydantic names the union member it tried ('list[...]', 'literal[...]', 'HardwareRef'): not a field."""
    return isinstance(part, str) and (part[:1].isupper() or "[" in part or part in ("str", "int", "none"))


def _show_path(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _field_model(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that the field path `loc` points into (for listing its valid keys)."""
    model: type[BaseModel] | None = Strategy
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        info = model.model_fields.get(part)
        model = _model_in(info.annotation) if info else None
    return model


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found:
            return found
    return None


def _valid_keys(loc: tuple) -> list[str]:
    model = _field_model(loc)
    return list(model.model_fields) if model else []


def _description(loc: tuple) -> str:
    model = _field_model(loc[:-1])
    info = model.model_fields.get(loc[-1]) if model else None
    return (info.description or "see strategies/2d.yaml") if info else "see strategies/2d.yaml"


def _fix_for(loc: tuple) -> str:
    return f"{_show_path(loc)} is {_description(loc)}" if loc else "see strategies/2d.yaml"
