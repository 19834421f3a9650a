"""Rich rendering of the hardware catalog and model cards."""

from __future__ import annotations

from rich.table import Table


def render_hardware(rows: list[dict], console) -> None:
    table = Table(title="Hardware catalog (`meshlab hardware --json` adds every figure's source)",
                  title_justify="left")
    if not rows:
        console.print("the catalog is empty")
        return
    for column in rows[0]:
        table.add_column(str(column))
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)


def render_cards(rows: list[dict], console) -> None:
    table = Table(title="Built-in model cards", title_justify="left")
    for column in ("name", "class", "parameters", "blocks", "hidden", "heads", "components"):
        table.add_column(column)
    for row in rows:
        parts = ", ".join(f"{k} {v:,}" for k, v in row["components"].items())
        table.add_row(row["name"], row["class"], f"{row['parameters']:,}", str(row["blocks"]), str(row["hidden"]),
                      str(row["heads"]), parts)
    console.print(table)
