"""The base of every JSON document a command prints (`--json`) or a process hands back, and the one way to write one.

Each document has a pydantic model beside the code that builds it. The writer does not build the model: it builds
plain data, and `document_text` serializes it and reads the text back through the model before anything is
printed, as a reader of the document would read it (JSON mode, strict: an int is not a string, a float is not an
int; an unknown key is refused). So a field added to a document without its model, or of another type, fails at
the write, in the tests that run every command's `--json`, and the model is the document's contract and its JSON
Schema (`meshlab schema NAME`). Validators are built at first use, so a command that prints no JSON pays nothing.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, RootModel, ValidationError

from meshlab.core.closed import problem_line
from meshlab.core.errors import BackendError


class Document(BaseModel):
    """A closed, strictly typed JSON document (or part of one), as a reader reads it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True, populate_by_name=True)


def document_text(document: object, model: type[BaseModel] | type[RootModel]) -> str:
    """`document` as indented JSON, once `model` has read that text back; a document that does not match its model
    is meshlab's own fault, said in one line (BackendError), and nothing is printed."""
    text = json.dumps(document, indent=2)
    try:
        model.model_validate_json(text)
    except ValidationError as exc:
        raise BackendError(f"meshlab built a {model.__name__} that its own schema refuses "
                           f"({problem_line(exc, json.loads(text), 'the document')})",
                           "this is a bug in meshlab: report it with the command that printed this") from None
    return text
