"""Safe YAML reading that remembers where every value came from, and refuses hostile documents.

Only the composer runs (no object construction); scalars are resolved by PyYAML's safe constructor. Aliases
are expanded under a node budget, so an alias bomb stops after ``MAX_NODES`` nodes instead of eating memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from meshlab.core.errors import InputError, Location
from meshlab.core.files import is_device

MAX_BYTES = 1 << 20  # a strategy is a few KiB; a MiB is already absurd
MAX_DEPTH = 32
MAX_NODES = 20_000

PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")

FieldPath = tuple  # of str keys and int indices


@dataclass(frozen=True)
class YamlDocument:
    """A parsed document: plain Python values, and the (line, column) of every value by its field path."""

    file: str
    data: object
    positions: dict = field(default_factory=dict)

    def locate(self, path: FieldPath) -> Location:
        """The position of the deepest known value on `path` (1-based line and column)."""
        for end in range(len(path), -1, -1):
            mark = self.positions.get(tuple(path[:end]))
            if mark is not None:
                return Location(self.file, mark[0], mark[1])
        return Location(self.file)


def read_yaml(path: Path) -> YamlDocument:
    return parse_yaml(_read_text(path), path)


def parse_yaml(text: str, path: Path) -> YamlDocument:
    """`text` parsed as if read from `path` (errors and positions name it)."""
    loader = None
    try:
        _check_depth(text, path)  # PyYAML's composer recurses: 10,000 levels of "[" would overflow Python's stack
        loader = yaml.SafeLoader(text)  # its reader refuses unprintable characters right here
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Location(str(path), mark.line + 1, mark.column + 1) if mark else Location(str(path))
        raise InputError(f"invalid YAML: {exc.problem or exc.context}", "fix the syntax at that spot", where) from None
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "\0")
        raise InputError(f"invalid YAML: {exc.reason} (U+{code:04X})", "remove that character",
                         Location(str(path), line, column)) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", "fix the syntax", Location(str(path))) from None
    finally:
        if loader is not None:
            loader.dispose()
    if node is None:
        raise InputError("the file is empty", "write a strategy (see strategies/2d.yaml)", Location(str(path)))
    converter = _Converter(str(path), yaml.SafeLoader(""))
    data = converter.convert(node, (), 0)
    return YamlDocument(str(path), data, converter.positions)


_OPEN = (yaml.FlowSequenceStartToken, yaml.FlowMappingStartToken, yaml.BlockSequenceStartToken,
         yaml.BlockMappingStartToken)
_CLOSE = (yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken, yaml.BlockEndToken)


def _check_depth(text: str, path: Path) -> None:
    """Nesting deeper than MAX_DEPTH is an error at the token that goes too deep; the scanner does not recurse."""
    depth = 0
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        if isinstance(token, _OPEN):
            depth += 1
            if depth > MAX_DEPTH:
                mark = token.start_mark
                raise InputError(f"nesting deeper than {MAX_DEPTH} levels", "a strategy is a few levels deep",
                                 Location(str(path), mark.line + 1, mark.column + 1))
        elif isinstance(token, _CLOSE):
            depth -= 1


def _read_text(path: Path) -> str:
    where = Location(str(path))
    if path.is_dir():
        raise InputError("is a directory, not a strategy file", "give a .yaml file", where)
    if is_device(path):  # /dev/zero never ends; a pipe (cat x | meshlab try /dev/stdin) is read
        raise InputError("is a device, not a strategy file", "give a .yaml file", where)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise InputError("no such file", "check the path (built-in strategies are in strategies/)", where) from None
    except OSError as exc:
        raise InputError(f"cannot read the file: {exc.strerror}", "check the path and its permissions", where) from None
    if len(raw) > MAX_BYTES:
        raise InputError(f"the file is larger than {MAX_BYTES} bytes", "a strategy is a few KiB; split or trim it", where)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputError(
            f"not valid UTF-8 (byte 0x{raw[exc.start]:02x})", "save the file as UTF-8", Location(str(path), line, column)
        ) from None


class _Converter:
    def __init__(self, file: str, constructor: yaml.SafeLoader):
        self.file = file
        self.constructor = constructor
        self.positions: dict[FieldPath, tuple[int, int]] = {}
        self.nodes = 0

    def convert(self, node: yaml.Node, path: FieldPath, depth: int) -> object:
        self.nodes += 1
        where = Location(self.file, node.start_mark.line + 1, node.start_mark.column + 1)
        if self.nodes > MAX_NODES:
            raise InputError(f"the document expands to more than {MAX_NODES} values (aliases?)", "remove anchors and aliases", where)
        if depth > MAX_DEPTH:
            raise InputError(f"nesting deeper than {MAX_DEPTH} levels", "a strategy is a few levels deep", where)
        self.positions.setdefault(path, (where.line, where.column))
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and node.tag not in PLAIN_TAGS:
            raise InputError(f"unsupported YAML tag {node.tag}", "remove the tag; strategies are plain data", where)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth, where)
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, (*path, i), depth + 1) for i, item in enumerate(node.value)]
        return self._scalar(node, where)

    def _mapping(self, node: yaml.MappingNode, path: FieldPath, depth: int, where: Location) -> dict:
        result: dict[str, object] = {}
        for key_node, value_node in node.value:
            key_where = Location(self.file, key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise InputError("YAML merge keys (<<) are not supported", "write the keys out", key_where)
            key = self._scalar(key_node, key_where)
            if not isinstance(key, str):
                raise InputError(f"a key must be a string, got {key!r}", "quote the key", key_where)
            if key in result:
                raise InputError(f"duplicate key {key!r}", "keep one of them", key_where)
            self.positions[(*path, key)] = (key_where.line, key_where.column)  # errors point at the key
            result[key] = self.convert(value_node, (*path, key), depth + 1)
        return result

    def _scalar(self, node: yaml.Node, where: Location) -> object:
        if not isinstance(node, yaml.ScalarNode):
            raise InputError("a key must be a plain value, not a list or mapping", "use a string key", where)
        try:
            value = self.constructor.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as exc:
            raise InputError(f"unsupported YAML value: {exc.problem}", "use plain strings, numbers, booleans or null", where) from None
        except ValueError as exc:  # e.g. an integer past Python's 4300-digit limit
            raise InputError(f"unreadable YAML value: {exc}", "use a number of a sensible size", where) from None
        if isinstance(value, (bytes, bytearray)) or type(value).__name__ in ("date", "datetime", "set"):
            raise InputError(f"unsupported YAML value of type {type(value).__name__}", "use plain strings or numbers", where)
        return value
