"""The layers of ARCHITECTURE.md, enforced: capture -> trace -> views -> detectors -> report -> api -> cli, with the
dashboard beside the cli, the workloads beside capture and the benchmarks above everything. Every import (at module
level or inside a function) is read from the source with ast; a layer may import only the layers it lists and the
third-party packages it lists, and no module may reach itself through its imports."""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEAVES = {"analyzer.errors", "analyzer.units", "analyzer.arrays", "analyzer.progress", "analyzer.codepaths", "analyzer"}  # `analyzer`: __version__ only
ALLOWED = {  # layer -> layers it may import (besides itself and the leaves)
    "analyzer.capture": {"workloads.runtime"},  # the workloads it runs: that module, and scripts loaded by path
    "analyzer.trace": set(),
    "analyzer.views": {"analyzer.trace"},
    "analyzer.detectors": {"analyzer.views", "analyzer.trace"},
    "analyzer.report": {"analyzer.detectors", "analyzer.views", "analyzer.trace"},
    "analyzer.timeline": {"analyzer.report", "analyzer.views", "analyzer.trace"},
    "analyzer.compare": {"analyzer.report"},
    "analyzer.api": {"analyzer.report", "analyzer.timeline", "analyzer.compare", "analyzer.detectors", "analyzer.views",
                     "analyzer.trace"},
    "analyzer.fleet": {"analyzer.api", "analyzer.report", "analyzer.trace", "analyzer.views"},
    "analyzer.mcp": {"analyzer.api", "analyzer.fleet"},  # the MCP server: runs and reports through the door, SQL
    # over a dataset through the fleet's sandboxed query
    "analyzer.cli": {"analyzer.api", "analyzer.capture", "analyzer.report", "analyzer.compare", "analyzer.fleet",
                     "analyzer.mcp", "dashboard"},
    "analyzer.__main__": {"analyzer.cli"},
    "dashboard": {"analyzer.api", "analyzer.report.palette"},
    "workloads": set(),  # analyzer.errors (a leaf) only: the scripts know nothing of the analyzer
    "benchmarks": {"analyzer", "dashboard", "workloads"},  # they time the internals; nothing imports them
}
# layer -> third-party packages (import names) it may import; the stdlib is always allowed. What each install
# declares for them is tests/test_extras.py's business; this is which layer may depend on what at all.
THIRD_PARTY = {
    "analyzer.capture": {"torch", "yaml"},  # runs on a GPU box as `python3 -m analyzer capture`, nothing installed
    "analyzer.trace": {"numpy", "msgspec"},
    "analyzer.views": {"numpy"},
    "analyzer.detectors": {"numpy"},
    "analyzer.report": {"numpy", "msgspec", "plotly", "hta"},  # hta: `analyze --hta` only, under try/except
    "analyzer.timeline": {"numpy"},
    "analyzer.compare": {"numpy", "plotly"},  # plotly: diff.html's figures
    "analyzer.api": {"numpy"},
    "analyzer.fleet": {"numpy", "pandas", "pyarrow", "duckdb", "distributed", "psutil"},
    "analyzer.mcp": {"mcp", "pydantic"},  # the official SDK and the pydantic its tool schemas are made of
    "analyzer.cli": {"mcp"},  # cmd_mcp: an install hint where the [mcp] extra is missing
    "analyzer.__main__": set(),
    "dashboard": {"numpy", "dash", "flask", "plotly", "werkzeug"},
    "workloads": {"torch", "numpy", "transformers"},  # transformers: workloads/hf_generate.py ([hf] extra)
    "benchmarks": {"torch", "transformers", "hta", "distributed", "playwright", "werkzeug"},
}
OURS = ("analyzer", "dashboard", "workloads", "benchmarks")
LEAF_ALLOWED = {leaf: set() for leaf in LEAVES}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every analyzer / dashboard module this file imports, resolved to module names (`from x import y` counts
    x.y when x.y is a module, else x)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in MODULES else base)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m.split(".")[0] in OURS}


def third_party(path: Path) -> set[str]:
    """Top-level names of the packages this file imports that are neither ours, the stdlib, nor its own folder's
    modules (benchmarks import their siblings by name)."""
    siblings = {p.stem for p in path.parent.glob("*.py")}
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return {m for m in out if m not in OURS and m not in sys.stdlib_module_names and m not in siblings
            and m != "__future__"}


FILES = sorted(p for pattern in ("analyzer/**/*.py", "dashboard/**/*.py", "workloads/**/*.py", "benchmarks/**/*.py")
               for p in ROOT.glob(pattern))
MODULES = {module_name(p) for p in FILES}
GRAPH = {module_name(p): imports(p) for p in FILES}


def layer(module: str) -> str:
    if module in LEAF_ALLOWED:
        return module
    for name in sorted(ALLOWED, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    raise AssertionError(f"{module} belongs to no layer of ARCHITECTURE.md")


def test_every_module_belongs_to_a_layer():
    for module in MODULES:
        layer(module)


def test_layers_import_only_downward():
    wrong = []
    for module, targets in GRAPH.items():
        own = layer(module)
        allowed = LEAF_ALLOWED.get(own, ALLOWED.get(own, set())) | {own}
        for target in targets:
            if target in LEAVES or layer(target) in allowed or any(
                    target == a or target.startswith(a + ".") for a in allowed):
                continue
            wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_dashboard_uses_the_one_door():
    for module, targets in GRAPH.items():
        if module.startswith("dashboard"):
            outside = {t for t in targets if t.startswith("analyzer")} - {
                "analyzer.api", "analyzer.report.palette", "analyzer.units", "analyzer.errors", "analyzer"}
            assert not outside, f"{module} reaches into {sorted(outside)}"


def test_no_import_circles():
    """Depth-first search over the whole graph (function-level imports included)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(GRAPH.get(module, ())):
            if target not in GRAPH:
                continue
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


def test_each_layer_imports_only_its_third_party_packages():
    wrong = []
    for path in FILES:
        module = module_name(path)
        own = layer(module)
        allowed = THIRD_PARTY["analyzer.api" if own in LEAVES else own]
        wrong += [f"{module} imports {name}" for name in sorted(third_party(path) - allowed)]
    assert not wrong, "\n".join(wrong)


def test_the_capture_reaches_the_workloads_through_their_runtime_only():
    reached = {t for m, targets in GRAPH.items() if layer(m) == "analyzer.capture" for t in targets
               if t.startswith("workloads")}
    assert reached == {"workloads.runtime"}, reached
