"""The JSON Schema of every file meshlab reads or writes, by name, for `meshlab schema NAME`. Each comes from the
pydantic model the file is read through, so the two describe the same fields and types. What a reader checks beyond
its model is not in the schema: a catalog figure's value is read as the override of the same name reads it
(`hardware-overrides` describes it), and a card's dispatch counts must name its block lists."""

from __future__ import annotations

from typing import Any, Callable

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _strategy() -> Any:
    from meshlab.strategy.schema import Strategy

    return Strategy


def _experiment() -> Any:
    from meshlab.experiments.definition import Experiment

    return Experiment


def _hardware_overrides() -> Any:
    from meshlab.core.hardware_figures import HardwareFigures

    return HardwareFigures


def _hardware_entry() -> Any:
    from meshlab.core.hardware_figures import CatalogEntry

    return CatalogEntry


def _card() -> Any:
    from meshlab.models.card_file import CardFile

    return CardFile


def _run_record() -> Any:
    from meshlab.experiments.records import RunRecord

    return RunRecord


def _profile() -> Any:
    from meshlab.core.profile_file import ProfileFile

    return ProfileFile


def _cache_manifest() -> Any:
    from meshlab.experiments.compile_cache import CacheManifest

    return CacheManifest


def _worker_request() -> Any:
    from typing import Union

    from pydantic import TypeAdapter

    from meshlab.runtime import requests

    kinds = tuple(getattr(requests, name) for name in requests.WORKER_REQUESTS)
    return TypeAdapter(Union[kinds])  # type: ignore[valid-type]


def _worker_result() -> Any:
    from meshlab.runtime.protocol import WorkerResult

    return WorkerResult


#: name -> (what the file is, where meshlab reads or writes it, the model it is read through)
SCHEMAS: dict[str, tuple[str, Callable[[], Any]]] = {
    "strategy": ("meshlab strategy", _strategy),
    "experiment": ("meshlab experiment (experiments/*.yaml)", _experiment),
    "hardware-overrides": ("the figures a strategy's hardware: {name: ..., <figure>: ...} overrides",
                           _hardware_overrides),
    "hardware-entry": ("one system of meshlab/data/hardware.yaml, merged with its accelerator", _hardware_entry),
    "card": ("a model card, as meshlab models import writes it", _card),
    "run-record": ("one line of experiments/results/*.jsonl, as meshlab run appends it", _run_record),
    "profile": ("a profile file, as meshlab profile writes it", _profile),
    "cache-manifest": ("meshlab-cache.json in a compile-cache folder (meshlab run --cache-dir)", _cache_manifest),
    "worker-request": ("the request file the CLI hands a worker process", _worker_request),
    "worker-result": ("the result file a worker process writes back", _worker_result),
}


def json_schema(name: str) -> dict:
    """The JSON Schema (draft 2020-12) of the file `name` (a key of SCHEMAS), titled with what the file is."""
    title, model = SCHEMAS[name]
    found = model()
    schema = found.json_schema() if hasattr(found, "json_schema") else found.model_json_schema()
    return {"$schema": DRAFT, **schema, "title": title}
