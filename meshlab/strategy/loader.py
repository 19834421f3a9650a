"""Read a strategy file into a validated ``Strategy``, or fail with one located, fixable error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meshlab.core.errors import InputError, MeshlabError
from pydantic import ValidationError

from meshlab.core.closed import Closed, first_problem
from meshlab.strategy.schema import Strategy
from meshlab.strategy.yaml_source import YamlDocument, read_yaml


@dataclass(frozen=True)
class LoadedStrategy:
    """A validated strategy and where it came from (to place later errors at a line)."""

    strategy: Strategy
    document: YamlDocument
    path: Path
    #: lines saying what planning took where the file is silent (meshlab.plan.planned fills the fields): the
    #: workload from the model's pipeline, the compile mode from the system
    taken: tuple[str, ...] = ()

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
        raise validation_error(exc, document, Strategy) from None
    return LoadedStrategy(strategy, document, path)


def validation_error(exc: ValidationError, document: YamlDocument, root: type[Closed]) -> InputError:
    """The most specific problem as one located InputError, with the valid keys or the field's description."""
    loc, kind, message = first_problem(exc, document.data)
    where = document.locate(loc)
    field = _show_path(loc) or "the file"
    if kind == "extra_forbidden":
        parent = _show_path(loc[:-1]) or "the file"
        valid = ", ".join(_valid_keys(root, loc[:-1]))
        return InputError(f"unknown key {loc[-1]!r} in {parent}", f"valid keys are: {valid}", where)
    if kind == "missing":
        return InputError(f"{field} is missing", f"add `{loc[-1]}:` ({_description(root, loc)})", where)
    return InputError(f"{field}: {message}", _fix_for(root, loc), where)


def _show_path(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _field_model(root: type[Closed], loc: tuple) -> type[Closed] | None:
    """The record type that the field path `loc` points into (for listing its valid keys)."""
    model: type[Closed] | None = root
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        model = model.field_record(part) if part in model.field_names() else None
    return model


def _valid_keys(root: type[Closed], loc: tuple) -> list[str]:
    model = _field_model(root, loc)
    return model.field_names() if model else []


def _description(root: type[Closed], loc: tuple) -> str:
    model = _field_model(root, loc[:-1])
    described = model.field_description(loc[-1]) if model and loc[-1] in model.field_names() else ""
    return described or f"see {root.EXAMPLE}"


def _fix_for(root: type[Closed], loc: tuple) -> str:
    """What the field is (an item of a list or mapping: what the field holding it is)."""
    field = loc
    while field and (isinstance(field[-1], int) or _field_model(root, field[:-1]) is None):
        field = field[:-1]
    described = _description(root, field) if field else ""
    if not described or described == f"see {root.EXAMPLE}":
        return f"see {root.EXAMPLE}"
    return f"{_show_path(field)} is {described}"
