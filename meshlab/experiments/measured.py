"""`meshlab report`: recorded runs as rows, measured beside predicted, with the error in %. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, RootModel

from meshlab.core.document import Document
from meshlab.experiments.comparable import comparison_problem, ran_platform
from meshlab.experiments.records import RecordSet, RunRecord


@dataclass(frozen=True)
class ReportRow:
    source: str  # file:line of the record
    time: str
    strategy: str
    ran_on: str  # e.g. "cpu x8" or "tpu v6e x8"
    workload: str
    status: str
    steady_step_s: float | None
    predicted_step_s: float | None
    predicted_for: str  # the catalog hardware the prediction is for
    first_step_s: float | None
    total_s: float | None
    compiles: int | None
    peak_bytes: int | None  # per device, as the platform or the XLA dump reported it
    predicted_peak_bytes: int | None
    reason: str
    #: why the measurement is not held against the prediction (None: it is): see meshlab.experiments.comparable
    not_compared: str | None = None

    @property
    def comparable(self) -> bool:
        return self.not_compared is None

    @property
    def step_error_pct(self) -> float | None:
        if not self.comparable or not self.steady_step_s or self.predicted_step_s is None:
            return None
        return 100.0 * (self.predicted_step_s - self.steady_step_s) / self.steady_step_s


def report_rows(records: RecordSet) -> tuple[ReportRow, ...]:
    return tuple(_row(r) for r in records.records)


def _row(record: RunRecord) -> ReportRow:
    timings, prediction, workload = record.timings, record.prediction, record.workload
    return ReportRow(
        source=record.source,
        time=(record.time or "")[5:16].replace("T", " "),
        strategy=record.strategy.name or "?",
        ran_on=f"{ran_platform(record)} x{'?' if record.hardware.devices is None else record.hardware.devices}",
        workload=f"{workload.get('height')}x{workload.get('width')}, {workload.get('steps')} steps"
        + (", cfg" if workload.get("cfg") else ""),
        status=record.status,
        steady_step_s=timings.steady_step_median_s,
        predicted_step_s=prediction.step_s,
        predicted_for=prediction.hardware or "?",
        first_step_s=timings.first_step_s,
        total_s=timings.total_s,
        compiles=record.compiles.total,
        peak_bytes=record.memory.peak_bytes_per_device,
        predicted_peak_bytes=prediction.peak_bytes_per_chip,
        reason=record.reason or "",
        not_compared=comparison_problem(record),
    )


class ReportRowDocument(Document):
    """One recorded run: measured beside predicted, and the error where they are comparable."""

    source: str = Field(description="file:line of the record")
    time: str
    strategy: str
    ran_on: str
    workload: str
    status: str
    steady_step_s: float | None
    predicted_step_s: float | None
    predicted_for: str
    step_error_pct: float | None
    first_step_s: float | None
    total_s: float | None
    compiles: int | None
    peak_bytes_per_device: int | None
    predicted_peak_bytes_per_chip: int | None
    reason: str
    not_compared: str | None = Field(description="why the run is not held against the prediction (null: it is)")


class ReportDocument(RootModel[list[ReportRowDocument]]):
    """`meshlab report --json`: one row per recorded run."""


def report_document(rows: tuple[ReportRow, ...]) -> list[dict]:
    return [
        {"source": r.source, "time": r.time, "strategy": r.strategy, "ran_on": r.ran_on, "workload": r.workload,
         "status": r.status, "steady_step_s": r.steady_step_s, "predicted_step_s": r.predicted_step_s,
         "predicted_for": r.predicted_for, "step_error_pct": r.step_error_pct, "first_step_s": r.first_step_s,
         "total_s": r.total_s, "compiles": r.compiles, "peak_bytes_per_device": r.peak_bytes,
         "predicted_peak_bytes_per_chip": r.predicted_peak_bytes, "reason": r.reason,
         "not_compared": r.not_compared}
        for r in rows
    ]
