"""The JSON Schema of every file meshlab reads or writes, and of every document a command prints with `--json`, by
name, for `meshlab schema NAME`. Each comes from the pydantic model the file is read through (a printed document is
read back through its model before it is printed: meshlab.core.document), so the two describe the same fields and
types. What a reader checks beyond its model is not in the schema: a catalog figure's value is read as the override
of the same name reads it (`hardware-overrides` describes it), and a card's dispatch counts must name its block
lists."""

from __future__ import annotations

from importlib import import_module
from typing import Union

DRAFT = "https://json-schema.org/draft/2020-12/schema"

#: name -> (what the file is, and where meshlab reads or writes it; the model it is read through, as module:name,
#: imported only when its schema is asked for)
SCHEMAS: dict[str, tuple[str, str]] = {
    "strategy": ("meshlab strategy", "meshlab.strategy.schema:Strategy"),
    "experiment": ("meshlab experiment (experiments/*.yaml)", "meshlab.experiments.definition:Experiment"),
    "hardware-overrides": ("the figures a strategy's hardware: {name: ..., <figure>: ...} overrides",
                           "meshlab.core.hardware_figures:HardwareFigures"),
    "hardware-entry": ("one system of meshlab/data/hardware.yaml, merged with its accelerator",
                       "meshlab.core.hardware_figures:CatalogEntry"),
    "card": ("a model card, as meshlab models import writes it", "meshlab.models.card_file:CardFile"),
    "run-record": ("one line of experiments/results/*.jsonl, as meshlab run appends it",
                   "meshlab.experiments.records:RunRecord"),
    "profile": ("a profile file, as meshlab profile writes it", "meshlab.core.profile_file:ProfileFile"),
    "cache-manifest": ("meshlab-cache.json in a compile-cache folder (meshlab run --cache-dir)",
                       "meshlab.experiments.compile_cache:CacheManifest"),
    "compile-times": ("XLA:TPU compile times check --backend tpu keeps ($MESHLAB_COMPILE_TIMES)",
                      "meshlab.plan.compile_times:CompileTimesFile"),
    "worker-request": ("the request file the CLI hands a worker process", "meshlab.runtime.requests:WORKER_REQUESTS"),
    "worker-result": ("the result file a worker process writes back", "meshlab.runtime.protocol:WorkerResult"),
    "worker-payload": ("a worker's result payload (the ok of its result file), as the parent reads it",
                       "meshlab.runtime.results:WORKER_PAYLOADS"),
    # what the commands print with --json (each read back through its model before it is printed)
    "try": ("meshlab try --json", "meshlab.search.documents:TryDocument"),
    "compare": ("meshlab compare --json", "meshlab.search.documents:ComparisonDocument"),
    "sweep": ("meshlab sweep --json", "meshlab.search.documents:SweepDocument"),
    "explain": ("meshlab explain --json", "meshlab.cost.document:ExplainDocument"),
    "check": ("meshlab check --json (XLA's partitioner on CPU devices)", "meshlab.check.documents:CheckDocument"),
    "check-dtensor": ("meshlab check --backend dtensor --json", "meshlab.check.documents:DTensorCheckDocument"),
    "check-tpu": ("meshlab check --backend tpu --json", "meshlab.check.documents:TpuCheckDocument"),
    "spec-map": ("meshlab export --format json", "meshlab.export.snippets:SpecMapDocument"),
    "hardware-list": ("meshlab hardware --json", "meshlab.core.hardware_rows:HardwareList"),
    "models-list": ("meshlab models list --json", "meshlab.models.listing:CardList"),
    "report": ("meshlab report --json", "meshlab.experiments.measured:ReportDocument"),
    "calibration": ("meshlab calibrate --json", "meshlab.experiments.calibrate:CalibrationDocument"),
}


def json_schema(name: str) -> dict:
    """The JSON Schema (draft 2020-12) of the file `name` (a key of SCHEMAS), titled with what the file is."""
    title, where = SCHEMAS[name]
    module, _, attribute = where.partition(":")
    found = getattr(import_module(module), attribute)
    if isinstance(found, tuple):  # the names of several models: their union
        from pydantic import TypeAdapter

        kinds = tuple(getattr(import_module(module), kind) for kind in found)
        schema = TypeAdapter(Union[kinds]).json_schema()  # type: ignore[valid-type]
    else:
        schema = found.model_json_schema()
    return {"$schema": DRAFT, **schema, "title": title}
