"""The typed capture config and SCHEMA are one source: every schema key has a typed attribute of the schema's type
and every attribute a key; loading a YAML gives the same values through both. And the capture package's imports stay
what a bare GPU machine has (torch, pyyaml, the standard library), without circles."""
import ast
import dataclasses
import os
import subprocess
import sys

import pytest

from analyzer.capture import config as cfg
from analyzer.capture.config import FIELDS, SCHEMA, CaptureConfig, Field, config_mismatches, load_config
from conftest import REPO

SHIPPED = sorted((REPO / "workloads").glob("*.yaml"))
CAPTURE = REPO / "analyzer" / "capture"


def test_typed_config_matches_schema():
    assert config_mismatches() == []


def test_mismatches_are_found_both_ways(monkeypatch):
    extra = Field("profiler.with_modules", bool, False, "a key without an attribute")
    monkeypatch.setattr(cfg, "FIELDS", {**FIELDS, extra.key: extra})
    assert config_mismatches() == ["schema key 'profiler.with_modules' has no CaptureConfig attribute"]
    monkeypatch.setattr(cfg, "FIELDS", {k: f for k, f in FIELDS.items() if k != "serve.rate"})
    assert config_mismatches() == ["CaptureConfig attribute 'serve.rate' has no schema key"]
    retyped = dataclasses.replace(FIELDS["timing.warmup_steps"], kind=bool)
    monkeypatch.setattr(cfg, "FIELDS", {**FIELDS, retyped.key: retyped})
    assert config_mismatches() == ["'timing.warmup_steps': annotated <class 'int'>, schema says <class 'bool'>"]
    rechosen = dataclasses.replace(FIELDS["mode"], choices=("eager",))
    monkeypatch.setattr(cfg, "FIELDS", {**FIELDS, rechosen.key: rechosen})
    assert len(config_mismatches()) == 1 and "'mode'" in config_mismatches()[0]


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_typed_values_are_the_validated_values(path):
    config = load_config(path, ["profiler.active=3", "serve.rate=7"])
    assert config.profiler.active == config.get("profiler.active") == 3
    assert config.serve.rate == 7 and isinstance(config.serve.rate, int)  # kept as written (meta.json shows it so)
    nested = config.as_dict()
    for field in SCHEMA:
        section, _, leaf = field.key.rpartition(".")
        assert (nested[section][leaf] if section else nested[leaf]) == config.get(field.key)
    assert list(nested) == list(dict.fromkeys(f.key.split(".")[0] for f in SCHEMA))  # the YAML's order
    assert config.run_name == path.stem and config.path == path


def test_config_is_frozen_and_strict():
    config = load_config(REPO / "workloads/tiny.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.profiler.with_stack = False
    values = {f.key: config.get(f.key) for f in SCHEMA}
    assert CaptureConfig.from_values(config.path, values) == config
    with pytest.raises(TypeError, match="profiler.with_modules"):
        CaptureConfig.from_values(config.path, {**values, "profiler.with_modules": True})
    with pytest.raises(TypeError, match="'serve.rate'"):
        CaptureConfig.from_values(config.path, {k: v for k, v in values.items() if k != "serve.rate"})
    assert config.options(["hf", "compile"]) == {"hf.max_new_tokens": 16, "compile.mode": "default",
                                                 "compile.backend": "inductor"}


# --- imports ------------------------------------------------------------------------------------------------------

def _imports(path):
    """Every module a file imports, at any depth (deferred imports too), as absolute names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


def test_capture_imports_only_torch_pyyaml_stdlib():
    allowed_own = ("analyzer.capture", "analyzer.errors", "analyzer.progress", "analyzer.codepaths", "workloads")
    for path in sorted(CAPTURE.glob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            if top in ("analyzer", "workloads"):
                assert name.startswith(allowed_own), f"{path.name} imports {name}"
            else:
                assert top in sys.stdlib_module_names or top in ("torch", "yaml"), f"{path.name} imports {name}"


def test_capture_package_has_no_import_circle():
    modules = {f"analyzer.capture.{p.stem}": p for p in CAPTURE.glob("*.py") if p.stem != "__init__"}
    graph = {name: {m for m in _imports(path) if m in modules} for name, path in modules.items()}
    done, stack = set(), []

    def visit(name):
        assert name not in stack, f"import circle: {' -> '.join(stack[stack.index(name):] + [name])}"
        if name in done:
            return
        stack.append(name)
        for dep in graph[name]:
            visit(dep)
        stack.pop()
        done.add(name)

    for name in graph:
        visit(name)


def test_schema_command_does_not_import_torch():
    code = ("import sys; from analyzer.__main__ import main; main(['schema']); "
            "sys.exit('torch imported' if 'torch' in sys.modules else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout[-500:]
    assert "`profiler.with_stack`" in result.stdout
