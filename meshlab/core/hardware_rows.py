"""The ``meshlab hardware`` table and its ``--json`` document: one row per catalog system, display strings beside
every figure's value and source. Apart from meshlab.core.hardware so that planning (``meshlab try``) does not build
these pydantic models, which only the hardware listing reads."""

from __future__ import annotations

from typing import Any

from pydantic import Field, RootModel

from meshlab.core.document import Document
from meshlab.core.hardware import FIGURES, OPTIONAL_FIGURES, Hardware, catalog, figure_given
from meshlab.core.hardware_figures import HardwareFigures


class HardwareRow(Document):
    """One catalog system: display strings (the table's), and with --json every figure's value and source."""

    name: str
    kind: str
    chips: str
    topology: str
    hbm: str
    usable_hbm: str
    hbm_bandwidth: str
    bf16_peak: str
    ici: str
    wraparound: str
    dcn: str
    usd_per_chip_hour: str
    figures: HardwareFigures | None = Field(None, description="every figure's value, as an override names it")
    sources: dict[str, str] | None = Field(None, description="figure -> where its value comes from")


class HardwareList(RootModel[list[HardwareRow]]):
    """`meshlab hardware --json`: the catalog, every figure with its source."""


def describe_rows(with_sources: bool = False) -> list[dict[str, Any]]:
    """One row of display strings per catalog entry, for the ``meshlab hardware`` table.

    With `with_sources` (the ``--json`` twin) each row also carries ``figures`` (every figure's raw value,
    JSON-ready) and ``sources`` (where each comes from).
    """
    return [_row(hardware, with_sources) for hardware in catalog().values()]


def _row(hw: Hardware, with_sources: bool) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": hw.name,
        "kind": hw.kind,
        "chips": str(hw.chips),
        "topology": "x".join(map(str, hw.topology)) + (f" x{hw.slices} slices" if hw.slices > 1 else ""),
        "hbm": _gib(hw.hbm_bytes),
        "usable_hbm": _gib(hw.usable_hbm_bytes),
        "hbm_bandwidth": f"{hw.hbm_bandwidth / 1e12:.2f} TB/s",
        "bf16_peak": f"{hw.bf16_flops / 1e12:.0f} TFLOP/s",
        "ici": f"{hw.ici_link_bandwidth / 1e9:.0f} GB/s x {hw.ici_links}",
        "wraparound": _wrap(hw),
        "dcn": f"{hw.dcn_bandwidth_per_host / 1e9:.0f} GB/s/host",
        "usd_per_chip_hour": "-" if hw.usd_per_chip_hour is None else f"${hw.usd_per_chip_hour:.2f}",
    }
    if with_sources:
        given = FIGURES + tuple(name for name in OPTIONAL_FIGURES if figure_given(hw, name))
        row["figures"] = {name: _plain(getattr(hw, name)) for name in given}
        if hw.attention_rates:
            row["figures"]["attention_rates"] = {k: [list(p) for p in points] for k, points in hw.attention_rates}
        if hw.matmul_rates is not None:
            row["figures"]["matmul_rates"] = hw.matmul_rates.to_json()
        row["sources"] = {name: hw.sources[name] for name in given}
    return row


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}".rstrip("0").rstrip(".") + " GiB"


def _wrap(hw: Hardware) -> str:
    if hw.interconnect == "nvswitch":
        return "switch"
    if all(hw.wraparound):
        return "all axes"
    wrapped = [str(i) for i, w in enumerate(hw.wraparound) if w]
    return f"axis {', '.join(wrapped)}" if wrapped else "none"
