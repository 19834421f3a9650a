"""The import contract: torch (and the rest of the heavy stack) is imported only where it may be.

- A module that imports torch, torch_xla, diffusers, transformers, accelerate, jax, torchax, libtpu or numpy anywhere
  (at its top or inside a function) lives in one of the folders that may (``MAY_IMPORT_HEAVY``).
- No module outside them reaches the heavy stack when it is imported: the imports that run at import time (a
  module's top-level statements, not those inside functions) are followed through meshlab's own modules, and a
  chain that ends in a heavy package fails the test, naming every link.
- Imports between meshlab's folders run one way, down ``LAYERS``: a module imports only from its own folder and the
  folders on lower layers (any import, at the top, inside a function or under ``TYPE_CHECKING``). Folders on one
  layer do not import each other.

Read from the source with ``ast``: nothing is imported to check it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "meshlab"
HEAVY = {"torch", "torch_xla", "diffusers", "transformers", "accelerate", "jax", "jaxlib", "torchax", "libtpu",
         "numpy"}
#: Where the heavy stack may be imported: building cards from diffusers (models/importer), applying plans
#: (parallelisms), the workers the CLI starts (workers), whole pipelines (pipelines), and the public apply
#: API, which imports torch_xla only when it is called. Every other folder is torch-free.
MAY_IMPORT_HEAVY = ("meshlab/models/importer/", "meshlab/parallelisms/", "meshlab/workers/",
                    "meshlab/pipelines/", "meshlab/api.py")

#: meshlab's folders from the ground up. The workers a parent starts sit above the stages they run; the CLI above
#: everything it renders (it starts the workers by module name, so it imports none of them).
LAYERS = (
    ("core",),  # errors, files, specs, meshes, the hardware catalog and profiles
    ("strategy", "models", "runtime"),  # the strategy file, model cards, the worker protocol
    ("plan",),
    ("cost", "export", "parallelisms"),
    ("search", "pipelines", "check", "experiments"),
    ("api",),
    ("workers",),
    ("cli",),
    ("__main__",),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(node: ast.AST, module: str) -> list[str]:
    """The modules one import statement names, absolute (a relative import resolved against `module`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module.split(".")[: len(module.split(".")) - node.level]
            base = ".".join(package + ([node.module] if node.module else []))
        return [base] + [f"{base}.{alias.name}" for alias in node.names]
    return []


def all_imports(path: Path, module: str | None = None) -> list[tuple[str, int]]:
    module = module or module_name(path)
    return [(name, node.lineno) for node in ast.walk(ast.parse(path.read_text())) for name in imported(node, module)]


def import_time_imports(path: Path, module: str | None = None) -> list[tuple[str, int]]:
    """The imports that run when the module is imported: its top-level statements (into if / try blocks, not into
    functions or classes' methods)."""
    module, found = module or module_name(path), []

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.If) and _type_checking(node.test):
                continue
            found.extend((name, node.lineno) for name in imported(node, module))
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit([n for n in inner if isinstance(n, ast.stmt)] or
                          [s for h in inner if isinstance(h, ast.ExceptHandler) for s in h.body])
    visit(ast.parse(path.read_text()).body)
    return found


def _type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def may_import_heavy(path: Path) -> bool:
    where = path.relative_to(REPO).as_posix()
    return any(where == allowed or where.startswith(allowed) for allowed in MAY_IMPORT_HEAVY)


def test_the_heavy_stack_is_imported_only_where_it_may_be():
    offenders = [f"{path.relative_to(REPO)}:{line} imports {name}"
                 for path in MODULES.values() if not may_import_heavy(path)
                 for name, line in all_imports(path) if name.split(".")[0] in HEAVY]
    assert not offenders, "\n".join(offenders)


def heavy_chain(start: str) -> list[str] | None:
    """A chain of import-time imports from `start` to a heavy package, as "module:line -> ..." links."""
    seen, stack = set(), [(start, [])]
    while stack:
        module, chain = stack.pop()
        if module in seen:
            continue
        seen.add(module)
        for name, line in import_time_imports(MODULES[module]):
            link = chain + [f"{module}:{line} imports {name}"]
            if name.split(".")[0] in HEAVY:
                return link
            targets = [n for n in (name, name.rpartition(".")[0]) if n in MODULES]
            parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
            stack.extend((t, link) for t in dict.fromkeys(targets + [p for p in parents if p in MODULES]))
    return None


def test_no_light_module_reaches_the_heavy_stack_when_imported():
    chains = {module: heavy_chain(module) for module, path in MODULES.items() if not may_import_heavy(path)}
    broken = {module: chain for module, chain in chains.items() if chain}
    assert not broken, "\n".join(f"{module}: {' -> '.join(chain)}" for module, chain in broken.items())


def test_the_contract_can_fail(tmp_path):
    """The checks see an import inside a function, a relative import, and a chain through a meshlab module."""
    source = tmp_path / "m.py"
    source.write_text("from . import sibling\ndef f():\n    import torch\n")
    assert all_imports(source, "meshlab.cost.m") == [("meshlab.cost", 1), ("meshlab.cost.sibling", 1), ("torch", 3)]
    assert import_time_imports(source, "meshlab.cost.m") == [("meshlab.cost", 1), ("meshlab.cost.sibling", 1)]
    # a real chain: parallelisms' xla module imports torch_xla only inside functions, so at import time it is light
    assert heavy_chain("meshlab.parallelisms.xla") is None
    assert any(name == "torch_xla.runtime" or name.startswith("torch_xla") for name, _ in
               all_imports(MODULES["meshlab.parallelisms.xla"]))
    # the rewrites module imports torch at its top: a chain of one link
    assert heavy_chain("meshlab.parallelisms.rewrites")[0].startswith("meshlab.parallelisms.rewrites:")


def layer_of(module: str) -> tuple[str, int] | None:
    """The folder (or root module) of a meshlab module, and its layer; None for the package itself."""
    parts = module.split(".")
    if parts[0] != "meshlab" or len(parts) < 2:
        return None
    folder = parts[1]
    ranks = [i for i, layer in enumerate(LAYERS) if folder in layer]
    assert ranks, f"{module}: its folder {folder!r} is on no layer of LAYERS; put it on one"
    return folder, ranks[0]


def upward_imports(modules: dict[str, Path]) -> list[str]:
    """Every import of `modules` that goes to another folder on the same or a higher layer, as file:line sentences."""
    found = []
    for module, path in modules.items():
        here, where = layer_of(module), path.relative_to(REPO) if path.is_relative_to(REPO) else path
        for name, line in all_imports(path, module):
            there = layer_of(name) if name.startswith("meshlab.") else None
            if here and there and there[0] != here[0] and there[1] >= here[1]:
                found.append(f"{where}:{line} ({here[0]}, layer {here[1]}) imports {name} "
                             f"({there[0]}, layer {there[1]})")
    return found


def test_imports_run_down_the_layers():
    assert not upward_imports(MODULES), "\n".join(upward_imports(MODULES))


def test_every_folder_is_on_a_layer_and_the_layer_check_can_fail(tmp_path):
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    folders |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert folders == {folder for layer in LAYERS for folder in layer}
    source = tmp_path / "m.py"
    source.write_text("from meshlab.core.errors import InputError\ndef f():\n    from meshlab.cli import app\n"
                      "from meshlab.export import snippets\n")
    assert sorted(upward_imports({"meshlab.cost.m": source})) == [
        f"{source}:3 (cost, layer 3) imports meshlab.cli (cli, layer 7)",
        f"{source}:3 (cost, layer 3) imports meshlab.cli.app (cli, layer 7)",
        f"{source}:4 (cost, layer 3) imports meshlab.export (export, layer 3)",
        f"{source}:4 (cost, layer 3) imports meshlab.export.snippets (export, layer 3)",
    ]
