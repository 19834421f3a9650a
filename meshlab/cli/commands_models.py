"""`meshlab models ...`: list the built-in model cards, show one, import one from diffusers."""

from __future__ import annotations

from pathlib import Path

import typer

from meshlab.cli.output import console, print_json, reports_errors
from meshlab.core.errors import InputError

models = typer.Typer(help="Model cards: the parameter inventories meshlab plans over.", no_args_is_help=True)


@models.command("list")
@reports_errors
def list_cards(as_json: bool = typer.Option(False, "--json")) -> None:
    """The built-in model cards."""
    from meshlab.cli.render_catalog import render_cards
    from meshlab.models.card import builtin_cards, load_card
    from meshlab.models.listing import CardList, card_row

    rows = [card_row(load_card(name)) for name in builtin_cards()]
    print_json(rows, CardList) if as_json else render_cards(rows, console())


@models.command("import")
@reports_errors
def import_card(
    preset: str = typer.Argument(None, help="a preset name (see `meshlab models list`); or use --config"),
    config: Path = typer.Option(None, "--config", help="a local diffusers config.json"),
    class_name: str = typer.Option(None, "--class", help="diffusers class for --config (default: its _class_name), "
                                   "e.g. WanTransformer3DModel"),
    name: str = typer.Option(None, "--name", help="card name (default: the preset or the config's folder)"),
    out: Path = typer.Option(..., "--out", "-o", help="where to write the card .json"),
) -> None:
    """Generate a card from the real diffusers class on the meta device (needs the xla extra)."""
    importer = _importer()
    if (preset is None) == (config is None):
        raise InputError("give either a preset or --config", "e.g. `meshlab models import qwen-image -o card.json`")
    from meshlab.core.files import output_path

    inputs = [config] if config is not None else []
    output_path(out, inputs, "-o")  # before the import, which builds the model
    if config is not None:  # the class defaults to the config's _class_name
        card = importer.import_from_config_file(config, class_name, name or config.parent.name)
    else:
        card = importer.import_preset(preset)
    importer.write_card(card, out, inputs)
    console().print(f"wrote {out}: {card.name}, {card.total_params:,} parameters in {len(card.parameters)} tensors")


def _importer():
    try:
        from meshlab.models.importer import card_import as importer
    except ImportError as exc:
        raise InputError(f"importing model cards needs torch and diffusers ({exc.name} is missing)",
                         "install the extra: pip install -e '.[xla]'") from None
    return importer
