"""The package layout stays true: every import goes down the layers, and no modules import each other.

Layers, lowest first (docs/ARCHITECTURE.md): a module may import only from its own layer and the layers it
is allowed below. Every import counts, including the ones inside functions (lazy imports are still
dependencies). The research code (turborag_research: the data generators and experiment runners) stays out
of the runtime: only the CLI commands that generate data or run a recipe import it, inside the command, and
no generator lives under turborag/. The checkers are tested on made-up violations too, so this test can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import turborag

ROOT = Path(turborag.__file__).parent

ALLOWED: dict[str, set[str]] = {
    "store": set(),
    "core": {"store"},
    "rag": {"core", "store"},
    "eval": {"core", "rag"},
    "train": {"core"},  # the trainer; the data generators are research code (turborag_research)
    "serve": {"core", "rag", "store"},
    "bench": {"store", "core", "rag", "eval", "train", "serve"},
    "cli": {"store", "core", "rag", "eval", "train", "serve", "bench"},
}


def module_names() -> dict[str, Path]:
    """'turborag.core.kv' -> its file, for every module of the package."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports_of(name: str, source: str, known: set[str]) -> set[str]:
    """The turborag modules that `source` (module `name`) imports, anywhere in the file."""
    package = name if name in known and _is_package(name, known) else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m == "turborag" or m.startswith("turborag.")}


def _is_package(name: str, known: set[str]) -> bool:
    return any(other.startswith(name + ".") for other in known)


def layer(module: str) -> str | None:
    """'turborag.core.kv' -> 'core'; the top-level facade and __main__ belong to no layer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for src, targets in sorted(graph.items()):
        here = layer(src)
        if here is None:
            continue
        for dst in sorted(targets):
            there = layer(dst)
            if there is None:
                out.append(f"{src} imports {dst} (the top-level facade is for users, not for the package)")
            elif there != here and there not in ALLOWED[here]:
                out.append(f"{src} ({here}) imports {dst} ({there})")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), i.e. import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_graph() -> dict[str, set[str]]:
    modules = module_names()
    known = set(modules)
    return {name: imports_of(name, path.read_text(), known) - {name} for name, path in modules.items()}


def test_every_layer_is_a_package():
    modules = module_names()
    loose = [m for m in modules if m.count(".") == 1 and layer(m) is None and m != "turborag.__main__"]
    assert not loose, f"modules outside the layers: {loose}"
    assert {layer(m) for m in modules} - {None} == set(ALLOWED)


def test_imports_go_down_the_layers():
    assert violations(package_graph()) == []


def test_no_import_cycles():
    assert cycles(package_graph()) == []


RESEARCH = "turborag_research"
# The generators that moved to turborag_research: no module of the runtime has their names again.
GENERATORS = ("synth", "realtext", "prose", "docstyle", "mix", "families", "recipe")


def research_imports(source: str) -> list[tuple[int, bool]]:
    """(line, inside a function) of every import of turborag_research in `source`."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            names = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and not child.level:
                names = [child.module or ""]
            if any(n == RESEARCH or n.startswith(RESEARCH + ".") for n in names):
                found.append((child.lineno, in_function))
            visit(
                child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            )

    visit(ast.parse(source), False)
    return found


def research_violations(sources: dict[str, str]) -> list[str]:
    """Imports of turborag_research that the runtime may not have: any outside turborag.cli, and the
    module-level ones inside it (importing the CLI must not import the research code)."""
    out = []
    for name, source in sorted(sources.items()):
        for line, lazy in research_imports(source):
            if layer(name) != "cli":
                out.append(f"{name}:{line} imports {RESEARCH} (only the CLI may, inside a command)")
            elif not lazy:
                out.append(f"{name}:{line} imports {RESEARCH} at module level (import it inside the command)")
    return out


def test_the_runtime_imports_research_code_only_lazily_in_the_cli():
    modules = module_names()
    assert research_violations({name: path.read_text() for name, path in modules.items()}) == []
    # the commands that generate data and run a recipe do import it (so the check above checks something)
    lazy = {name for name, path in modules.items() if research_imports(path.read_text())}
    assert {"turborag.cli.data", "turborag.cli.finetune"} <= lazy


def test_no_generator_is_left_in_the_runtime():
    left = [m for m in module_names() if m.rpartition(".")[2] in GENERATORS]
    assert left == [], f"data generators belong in {RESEARCH}/, not in turborag/: {left}"


def test_the_research_checker_catches_eager_and_non_cli_imports():
    eager = "from turborag_research.mix import build_mix\n"
    lazy = "def f():\n    import turborag_research.recipe as r\n    return r\n"
    assert research_imports(eager) == [(1, False)] and research_imports(lazy) == [(2, True)]
    assert research_imports("from turborag.rag import x\nimport turborag_researchers\n") == []
    got = research_violations(
        {"turborag.cli.data": eager, "turborag.cli.finetune": lazy, "turborag.core.kv": lazy}
    )
    assert got == [
        "turborag.cli.data:1 imports turborag_research at module level (import it inside the command)",
        "turborag.core.kv:2 imports turborag_research (only the CLI may, inside a command)",
    ]


def test_the_checker_catches_violations_and_cycles():
    known = {"turborag.core.kv", "turborag.cli.app", "turborag.cli", "turborag.store.kv_store"}
    lazy_upward = "def f():\n    from turborag.cli.app import app\n"
    graph = {"turborag.core.kv": imports_of("turborag.core.kv", lazy_upward, known)}
    assert graph["turborag.core.kv"] == {"turborag.cli.app"}
    assert violations(graph) == ["turborag.core.kv (core) imports turborag.cli.app (cli)"]
    facade = {"turborag.rag.x": imports_of("turborag.rag.x", "from turborag import Engine\n", known)}
    assert len(violations(facade)) == 1
    relative = imports_of("turborag.store.kv_store", "from ..cli import app\n", known)
    assert relative == {"turborag.cli.app"}
    a, b, c = "turborag.cli.a", "turborag.cli.b", "turborag.cli.c"
    loop = {a: {b}, b: {a}, c: set()}
    assert violations(loop) == [] and cycles(loop) == [[a, b]]


# The catalog's own SQL and its meta table (strings) stay in store/: the rest reads `catalog.settings()`
# (store/settings.py, typed) and calls the catalog's methods.
CATALOG_INTERNALS = ("meta", "set_meta", "db")


def catalog_internals(source: str) -> list[tuple[int, str]]:
    """(line, name) of every `x.meta(...)`, `x.set_meta(...)` call and `x.db` use in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in CATALOG_INTERNALS:
            found.append((node.lineno, node.attr))
    return sorted(found)


def test_no_catalog_metadata_or_sql_outside_the_store():
    out = [
        f"{name}:{line} uses .{attr}"
        for name, path in module_names().items()
        if layer(name) != "store"
        for line, attr in catalog_internals(path.read_text())
    ]
    assert out == [], "read catalog.settings() and call the catalog's methods instead: " + ", ".join(out)


def test_the_catalog_checker_catches_reads_and_sql():
    source = 'size = int(catalog.meta().get("chunk_tokens"))\ncatalog.db.execute("VACUUM")\nf.metadata()\n'
    assert catalog_internals(source) == [(1, "meta"), (2, "db")]


# Small functions read top to bottom (issue 40). Counted from the first line after the signature, the
# docstring included, so a CLI command's option list (its signature) does not count.
MAX_FUNCTION_LINES = 60


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of every function in `source` whose body is longer than `limit` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.body[0].lineno + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def test_no_function_is_longer_than_sixty_lines():
    out = [
        f"{name}.{fn} ({lines} lines)"
        for name, path in module_names().items()
        for fn, lines in long_functions(path.read_text())
    ]
    assert out == [], "split these: " + ", ".join(out)


def test_the_length_checker_counts_the_body_not_the_signature():
    signature = "def f(\n" + "    a: int = 1,\n" * 80 + "):\n"
    assert long_functions(signature + "    return a\n") == []
    body = "def g():\n    '''Why.'''\n" + "    x = 1\n" * 60
    assert long_functions(body) == [("g", 61)]


def test_only_the_cli_imports_the_cli():
    """The research code and the scripts build engines through the library (turborag.rag.engines), never
    through the command line's helpers, which exit the process on an error."""
    root = ROOT.parent
    known = set(module_names())
    found = []
    for path in [*(root / RESEARCH).rglob("*.py"), *(root / "scripts").rglob("*.py")]:
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        for target in imports_of(name, path.read_text(), known):
            if target == "turborag.cli" or target.startswith("turborag.cli."):
                found.append(f"{path.relative_to(root)} imports {target}")
    assert found == []


def test_the_architecture_doc_names_every_module_and_only_real_ones():
    """docs/ARCHITECTURE.md's table lists, per layer, exactly the modules the layer has (the CLI's command
    modules excepted: the table says "one module per command group")."""
    import re

    doc = (ROOT.parent / "docs" / "ARCHITECTURE.md").read_text()
    rows = {m[1]: re.findall(r"`(\w+)`", m[2]) for m in re.finditer(r"^\| `(\w+)` \| ([^|]*) \|", doc, re.M)}
    assert set(rows) == set(ALLOWED)
    for name, listed in rows.items():
        files = {p.stem for p in (ROOT / name).glob("*.py")} - {"__init__"}
        assert not set(listed) - files, f"{name}: the doc names modules that do not exist"
        if name != "cli":
            assert not files - set(listed), f"{name}: modules the doc does not name"
