"""Every package our code imports is declared by the install that code serves, and every install declares nothing
dead.

The installs are pyproject's `dependencies` (the base install: capture, analyze, diff, check, the dashboard) and
its extras (`fleet`, `hta`, `hf`, `test`), read back from the installed metadata with `importlib.metadata` (so
pyproject and the installed metadata must agree: test_metadata_is_current). SERVES below says which install each
module serves. Each module's imports are read with ast (at module level and inside functions; `if TYPE_CHECKING:`
blocks left out), the standard library and our own packages set aside, each import name mapped to its distribution
with `packages_distributions()`, and that distribution must be declared by the base install or by the module's
extra. A requirement with extras (`dask[distributed,diagnostics]`) declares the packages those extras of it
declare (`distributed`, `bokeh`), one level deep.

Why: `pip install -e '.[fleet]'` gave an analyze-many that failed on `import pandas` (the job report and the
collectives table import it) because [fleet] never declared pandas: bokeh used to bring it (3.9 no longer does),
and CI installs [test,hta], where traceinsight brings it. Nothing here relies on what another package happens to
depend on.
"""
from __future__ import annotations

import ast
import functools
import importlib.metadata as metadata
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "gpu-idle-analyzer"
OURS = {"analyzer", "dashboard", "workloads", "tests"}  # our packages (tests: one test module imports another)
SCRIPT_FOLDERS = {"tests", "benchmarks", "scripts"}  # run with their own folder on sys.path
BASE = "base"  # the [project] dependencies

# Which install each module serves: a folder, a file, or `file::function` (the imports inside that function, e.g. a
# base module's function that only an extra's code calls). The most specific entry wins. A module that nothing
# below names is an error (test_every_module_serves_an_install), so a new module is placed on purpose.
SERVES = {
    "analyzer": BASE,  # capture (torch, pyyaml and the stdlib only: test_architecture.py), analyze, diff, check
    "dashboard": BASE,  # `python -m analyzer dashboard` / `python -m dashboard`
    "workloads": BASE,  # what capture runs
    # analyze-many / query and what only they use
    "analyzer/fleet": "fleet",
    "analyzer/cli.py::cmd_analyze_many": "fleet",
    "analyzer/cli.py::cmd_query": "fleet",
    "analyzer/report/hta.py": "hta",  # analyze --hta
    "analyzer/mcp": "mcp",  # python -m analyzer mcp
    "analyzer/cli.py::cmd_mcp": "mcp",
    "workloads/hf_generate.py": "hf",  # workloads/hf_generate.yaml
    "workloads/hf_generate_static.py": "hf",  # its fixed twin (timing.compare_fix)
    # Development: the suite, and the benchmarks and scripts run from a checkout set up with the test extra
    "tests": "test",
    "benchmarks": "test",
    "scripts": "test",
}

# The suite runs these extras' code with the test extra alone (CI installs test,hta): tests/fleet/test_fleet.py,
# test_job_report.py, test_collectives.py and test_dashboard_job.py run the fleet's code, test_third_party_workloads.py
# and test_runtime_vs_transformers.py run hf_generate. So the test extra declares what those modules import too,
# or the suite passes only thanks to what some other package brings (pandas came with traceinsight). The hta
# extra is not among them: its test accepts HTA missing (tests/test_cli_analyze.py checks the install hint then).
TEST_RUNS = ("fleet", "hf", "mcp")

# (module, import name) -> why that module may import a package its install does not declare. Only optional
# imports whose absence the module handles belong here.
UNDECLARED_OK = {
    ("tests/test_cli_analyze.py", "hta"): "try/except: without HTA the test checks the report's install hint",
    ("benchmarks/bench_analyze.py", "hta"): "try/except ImportError: without HTA its row says 'HTA not installed'",
}

# (extra, distribution) -> why the extra declares a package none of its modules imports (nor probes with
# importlib.util.find_spec).
DECLARED_UNUSED_OK = {
    ("test", "pytest-xdist"): "a pytest plugin (`-n auto` in CONTRIBUTING.md's core loop): pytest loads it, no module "
                              "imports it",
    ("hta", "psutil"): "traceinsight 0.6.1 (and HolisticTraceAnalysis 0.5.0) import psutil without declaring it",
}

# (module, module it imports) -> why a module of one install may import code that serves another extra.
CROSS_OK = {
    ("analyzer/mcp/answers.py", "analyzer.fleet.query"): "the query tool: its import is inside the function, which "
                                                         "the server reaches only with --dataset, where cmd_mcp "
                                                         "checked for the fleet extra first (an install hint)",
    ("analyzer/api/core.py", "analyzer.report.hta"): "analyze --hta: run_hta imports HTA under try/except and puts the "
                                                "failure, with the install hint, in the report",
}

# Import names whose distribution cannot be told from the name where the package is not installed here: any one of
# them declared will do. hta: traceinsight (declared) and HolisticTraceAnalysis 0.5.0 (its fallback, see
# analyzer/report/hta.py) both install the `hta` package.
DISTRIBUTIONS_OF = {"hta": ("traceinsight", "HolisticTraceAnalysis")}  # the first is the one to declare

# Calls that import a package named by a string: an import for every check.
IMPORT_CALLS = {"importorskip", "import_module"}
# Calls that only look for one (absence handled): the package counts as used by its extra, but need not be declared.
PROBE_CALLS = {"find_spec"}


# ---------------------------------------------------------------------------------------------------------- reading


def python_files() -> list[Path]:
    roots = sorted(OURS | SCRIPT_FOLDERS)
    return sorted(p for r in roots for p in (ROOT / r).rglob("*.py") if "__pycache__" not in p.parts)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def serves(module: str, function: str | None = None) -> str:
    """The install `module` (a path relative to the repo) serves, or that its function `function` (a dotted
    qualname, e.g. `Class.method`) serves."""
    if function:
        parts = function.split(".")
        for n in range(len(parts), 0, -1):
            key = f"{module}::{'.'.join(parts[:n])}"
            if key in SERVES:
                return SERVES[key]
    parts = module.split("/")
    for n in range(len(parts), 0, -1):
        key = "/".join(parts[:n])
        if key in SERVES:
            return SERVES[key]
    raise AssertionError(f"{module}: no entry of SERVES in tests/test_extras.py covers it; say which install it "
                         "serves (base, or the extra it belongs to)")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class Imports(ast.NodeVisitor):
    """(kind, dotted name, function qualname or None, line) of every import of a file: kind "import" (an import
    statement, pytest.importorskip, importlib.import_module), "probe" (importlib.util.find_spec) or "relative"
    (name resolved against the file's package)."""

    def __init__(self, path: Path):
        self.stack, self.found = [], []
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        self.package = parts[:-1]

    def _add(self, kind: str, name: str, node: ast.AST) -> None:
        self.found.append((kind, name, ".".join(self.stack) or None, node.lineno))

    def _scope(self, node) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):  # annotations only: never imported at run time
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add("import", alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:  # ours: resolved only to place it (test_base_never_imports_an_extra)
            anchor = self.package[: len(self.package) - node.level + 1]
            base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                self._add("relative", f"{base}:{alias.name}", node)
        elif node.module != "__future__":
            for alias in node.names:
                self._add("import", f"{node.module}:{alias.name}", node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name in IMPORT_CALLS | PROBE_CALLS and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and not node.args[0].value.startswith("."):
            self._add("import" if name in IMPORT_CALLS else "probe", node.args[0].value, node)
        self.generic_visit(node)


@functools.cache
def imports_of(path: Path) -> list[tuple[str, str, str | None, int]]:
    visitor = Imports(path)
    visitor.visit(ast.parse(path.read_text(), str(path)))
    return visitor.found


@functools.cache
def third_party(path: Path) -> list[tuple[str, str, str | None, int]]:
    """(kind, top-level import name, function, line) of the imports of packages not ours, not the standard library
    and not a module beside the file or at the top of its folder (tests' conftest and rawtrace, benchmarks'
    replicate_trace, run with their folder on sys.path)."""
    out = []
    for kind, name, function, line in imports_of(path):
        top = name.split(":")[0].split(".")[0]
        if kind == "relative" or top in OURS or top in sys.stdlib_module_names:
            continue
        if path.relative_to(ROOT).parts[0] in SCRIPT_FOLDERS and any(
                (folder / f"{top}.py").exists() or (folder / top / "__init__.py").exists()
                for folder in (path.parent, ROOT / path.relative_to(ROOT).parts[0])):  # tests/ is on sys.path too
            continue
        if (kind, top, function, line) not in out:  # once per statement
            out.append((kind, top, function, line))
    return out


def installs() -> dict[str, dict[str, Requirement]]:
    """install (BASE or an extra) -> {canonical distribution name: requirement}, from the installed metadata."""
    extras = metadata.metadata(PROJECT).get_all("Provides-Extra") or []
    out: dict[str, dict[str, Requirement]] = {BASE: {}, **{e: {} for e in extras}}
    for text in metadata.requires(PROJECT) or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):  # no marker, or an environment marker only
            groups = [BASE]
        else:
            groups = [e for e in extras if req.marker.evaluate({"extra": e})]
        for group in groups:
            out[group][canonicalize_name(req.name)] = req
    return out


@functools.cache
def extra_brings(name: str, extra: str) -> frozenset[str] | None:
    """The distributions that distribution `name`'s extra `extra` declares (from its installed metadata), or None
    where `name` is not installed here."""
    try:
        reqs = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return None
    out = set()
    for text in reqs:
        inner = Requirement(text)
        if inner.marker is not None and inner.marker.evaluate({"extra": extra}) \
                and not inner.marker.evaluate({"extra": ""}):
            out.add(canonicalize_name(inner.name))
    return frozenset(out)


def brought_by(req: Requirement) -> set[str]:
    """The distributions a requirement declares: its own and, for `pkg[x,y]`, those pkg's extras x and y declare."""
    names = {canonicalize_name(req.name)}
    for extra in req.extras:
        names |= extra_brings(req.name, extra) or set()
    return names


@functools.cache
def declared(group: str) -> dict[str, str]:
    """canonical distribution -> the requirement (as written) that declares it, for the base install plus `group`."""
    out = {}
    for g in dict.fromkeys([BASE, group]):
        for req in TABLE[g].values():
            for name in brought_by(req):
                out.setdefault(name, str(req))
    return out


PACKAGES = metadata.packages_distributions()


def distributions(top: str) -> set[str]:
    """The canonical distributions that may provide import name `top`: what is installed here, else the name
    itself (and DISTRIBUTIONS_OF's)."""
    found = {canonicalize_name(d) for d in PACKAGES.get(top, [])}
    found |= {canonicalize_name(d) for d in DISTRIBUTIONS_OF.get(top, ())}
    return found or {canonicalize_name(top)}


def where_to_add(group: str) -> str:
    return ("[project] dependencies" if group == BASE else f"[project.optional-dependencies] {group}") + \
        " in pyproject.toml (then pip install -e again)"


FILES = python_files()
TABLE = installs()
GROUPS = sorted({*SERVES.values()})


# ------------------------------------------------------------------------------------------------------------ tests


def test_metadata_is_current():
    """The checks below read the installed metadata: it must say what pyproject.toml says."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    written = {BASE: project.get("dependencies", []), **project.get("optional-dependencies", {})}

    def key(req: Requirement) -> str:  # the requirement without its marker, normalised
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        return f"{canonicalize_name(req.name)}{extras}{','.join(sorted(map(str, req.specifier)))}"

    differences = []
    for group in sorted(set(written) | set(TABLE)):
        want = {key(Requirement(r)) for r in written.get(group, [])}
        have = {key(r) for r in TABLE.get(group, {}).values()}
        if want != have:
            differences.append(f"{group}: pyproject only {sorted(want - have)}, installed only {sorted(have - want)}")
    assert not differences, (f"the installed metadata of {PROJECT} is not pyproject.toml's; re-run "
                             "pip install -e '.[test,hta]' (or scripts/setup.sh test,hta):\n" + "\n".join(differences))


def test_every_module_serves_an_install():
    for group in GROUPS:
        assert group in TABLE, f"SERVES names {group!r}, which is neither the base install nor an extra"
    for key in SERVES:
        path, _, function = key.partition("::")
        assert (ROOT / path).exists(), f"SERVES names {path}, which does not exist"
        if function:
            defined = {n.name for n in ast.walk(ast.parse((ROOT / path).read_text()))
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
            assert function.split(".")[0] in defined, f"SERVES names {key}, which {path} does not define"
    for path in FILES:
        serves(rel(path))  # raises for a module no entry covers
    assert set(TABLE) - {BASE} <= set(GROUPS), f"extras that no module serves: {set(TABLE) - {BASE} - set(GROUPS)}"


def test_exceptions_are_current():
    """Each exception listed above still applies, so none outlives its reason unnoticed."""
    for module, top in UNDECLARED_OK:
        assert any(t == top for _, t, _, _ in third_party(ROOT / module)), \
            f"UNDECLARED_OK: {module} no longer imports {top}; remove the entry"
    for group, name in DECLARED_UNUSED_OK:
        assert name in TABLE[group], f"DECLARED_UNUSED_OK: the {group} extra no longer declares {name}; remove the entry"
    for module, target in CROSS_OK:
        assert any(n.partition(":")[0] == target or n.replace(":", ".") == target for _, n, _, _ in
                   imports_of(ROOT / module)), f"CROSS_OK: {module} no longer imports {target}; remove the entry"


@pytest.mark.parametrize("group", GROUPS)
def test_imports_are_declared(group):
    """Each module's imports are declared by the base install or its extra (and, for the extras the suite runs,
    by the test extra too)."""
    targets = [group] + ["test"] * (group in TEST_RUNS)
    problems = []
    for path in FILES:
        module = rel(path)
        for kind, top, function, line in third_party(path):
            if kind != "import" or serves(module, function) != group or (module, top) in UNDECLARED_OK:
                continue
            candidates = distributions(top)
            for install in targets:
                if candidates & set(declared(install)):
                    continue
                where = f"{module}:{line}" + (f" (in {function})" if function else "")
                dist = " or ".join(sorted(candidates))
                add = canonicalize_name(DISTRIBUTIONS_OF[top][0]) if top in DISTRIBUTIONS_OF else dist
                why = "" if install == group else f" (the suite runs this [{group}] code with the test extra)"
                whom = "the base install does not" if install == BASE else \
                    f"neither the base install nor the {install} extra"
                problems.append(f"{where} serves [{group}] and imports {top!r} (distribution {dist}), which {whom} "
                                f"declares{why}: add {add!r} to {where_to_add(install)}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("group", [g for g in GROUPS if g != "test"])
def test_declarations_are_used(group):
    """Every package the base install or a (non-test) extra declares is imported, or probed for, by one of its
    modules, or DECLARED_UNUSED_OK says why it is needed anyway."""
    used = set()
    for path in FILES:
        module = rel(path)
        for _kind, top, function, _line in third_party(path):
            if serves(module, function) == group:
                used |= distributions(top)
    problems = []
    for name, req in TABLE[group].items():
        if (group, name) in DECLARED_UNUSED_OK:
            continue
        what = f"the {group} {'install' if group == BASE else 'extra'} declares {str(req)!r}"
        if not req.extras and name not in used:
            problems.append(f"{what}, which none of its modules imports: remove it from {where_to_add(group)}, or "
                            "say why it is needed in DECLARED_UNUSED_OK (tests/test_extras.py)")
        for extra in sorted(req.extras):  # each extra asked for brings something of use
            brings = extra_brings(req.name, extra)
            if brings is None:
                problems.append(f"{what}: {req.name} is not installed here, so what its [{extra}] extra brings "
                                "cannot be checked (pip install -e '.[test,hta]')")
            elif not brings & used:
                problems.append(f"{what}, but none of its modules imports (or probes for) what its [{extra}] extra "
                                f"brings ({', '.join(sorted(brings)) or 'nothing'}): drop [{extra}] in "
                                f"{where_to_add(group)}, or say why it is needed in DECLARED_UNUSED_OK")
    assert not problems, "\n".join(problems)


def module_file(dotted: str) -> Path | None:
    path = ROOT / dotted.replace(".", "/")
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_base_never_imports_an_extra():
    """A module of the base install (or of an extra) imports no module or function that serves another extra:
    otherwise SERVES would place that code wrongly, and its imports would be checked against the wrong install."""
    problems = []
    for path in FILES:
        module = rel(path)
        for kind, name, function, line in imports_of(path):
            dotted, _, attr = name.partition(":")
            source = serves(module, function)
            if kind == "probe" or dotted.split(".")[0] not in OURS or source == "test":
                continue
            if attr and module_file(f"{dotted}.{attr}"):  # from package import module
                dotted, attr = f"{dotted}.{attr}", ""
            target = module_file(dotted)
            if target is None:
                continue
            target_group = serves(rel(target), attr or None)
            if target_group in (BASE, source) or (module, dotted) in CROSS_OK:
                continue
            problems.append(f"{module}:{line} serves [{source}] and imports {dotted}{'.' + attr if attr else ''}, "
                            f"which serves [{target_group}]: place one of them in SERVES (tests/test_extras.py) "
                            "with the other, or list the import in CROSS_OK with the reason it is safe")
    assert not problems, "\n".join(problems)
