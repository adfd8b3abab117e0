"""Workload YAML files: the schema table, validation, and the typed config the capture reads.

`SCHEMA` is the one source of every key: its type, default, allowed values and meaning. `load_config()` validates a
YAML file (+ `--set` overrides) against it, one line per mistake, and returns a frozen `CaptureConfig` whose
attributes follow the YAML's nesting (`config.profiler.with_stack`, `config.serve.rate`). The typed classes are written
out so readers and type checkers can follow a key; `config_mismatches()` (run by the tests) checks them against SCHEMA
both ways, key by key and type by type. Imports only the standard library and pyyaml.
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from analyzer.errors import UsageError

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
WORKLOADS_DIR = REPO_ROOT / "workloads"
_NOT_SCRIPTS = {"__init__", "base"}


@dataclasses.dataclass(frozen=True)
class Field:
    key: str  # dotted path
    kind: type | tuple[type, ...]
    default: Any
    doc: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    nullable: bool = False


def script_names() -> list[str]:
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.py") if p.stem not in _NOT_SCRIPTS)


def _preset_names() -> tuple[str, ...]:
    # Lazily: workloads.qwen2 imports torch, which the schema docs do not need.
    from workloads.runtime import preset_names
    return preset_names()


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")  # torch.compile's

SCHEMA: tuple[Field, ...] = (
    Field("script", str, None, "workload script: a module in workloads/ or a path to a .py file defining `Workload`"),
    Field("name", str, None, "run name used in the run folder (default: the YAML file's stem)", nullable=True),
    Field("model.preset", str, "qwen2-0.5b", "model shape (ignored when model.checkpoint is set)"),
    Field("model.checkpoint", str, None, "local Hugging Face folder (config.json + *.safetensors)", nullable=True),
    Field("model.layers", int, None, "keep only the first N decoder layers (smaller traces)", minimum=1,
          nullable=True),
    Field("dtype", str, "auto", "auto = bfloat16 on CUDA, float32 on CPU",
          choices=("auto", "float32", "bfloat16", "float16")),
    Field("device", str, "auto", "auto = CUDA when available, else CPU (with a note); or cpu, cuda, cuda:N"),
    Field("batch_size", int, 1, "sequences decoded together (serve script: the most requests in a batch)",
          minimum=1),
    Field("prompt_length", int, 128, "prompt tokens per sequence (random ids)", minimum=1),
    Field("decode_steps", int, 32, "decode steps timed without the profiler", minimum=1),
    Field("mode", str, "eager", "decode as eager ops or by replaying a captured CUDA graph",
          choices=("eager", "cuda_graph")),
    Field("seed", int, 0, "seed of the random weights, prompts and sampling"),
    Field("sampling.temperature", (int, float), 0.0, "0 = greedy argmax; > 0 samples on the device", minimum=0),
    Field("sampling.top_k", int, 0, "0 = no top-k filter", minimum=0),
    Field("tp", int, 1, "tensor-parallel ranks: > 1 launches one process per rank (one GPU each over NCCL, or CPU "
          "processes over gloo), each writing rankN.trace.json.gz into one run folder; scripts with "
          "`tensor_parallel = True` only (tp_decode)", minimum=1),
    Field("straggler.rank", int, None, "tp_decode script: the rank that sleeps `straggler.delay_ms` before the "
          "first attention all-reduce of every decode step (a planted straggler); null = none", minimum=0,
          nullable=True),
    Field("straggler.delay_ms", (int, float), 2, "tp_decode script: the planted straggler's sleep", minimum=0),
    Field("timing.warmup_steps", int, 5, "decode steps run before anything is timed", minimum=0),
    Field("timing.sessions", int, 3, "timed sessions of decode_steps steps each (fresh sequences); their medians "
          "apart are the run-to-run noise a diff's verdict weighs a step-time change against", minimum=1),
    Field("timing.compare_modes", bool, False, "also time the other decode mode and record the eager/graph ratio"),
    Field("timing.compare_fix", str, None, "a workload script that is this one with its problem fixed (e.g. decode "
          "for item_sync): both are timed on the same model in one process, their sessions interleaved, for the "
          "fix's measured saving and its noise band (meta.json fix_comparison); separate captures drift apart by "
          "more than many fixes save", nullable=True),
    Field("timing.compare_fix_mode", str, None, "the decode mode the fixed twin runs in (cuda_graph: the fix for "
          "launch overhead); null = this run's mode", nullable=True, choices=("eager", "cuda_graph")),
    Field("timing.compare_fix_compile_mode", str, None, "compile_decode as the fixed twin: its `torch.compile` mode "
          "(reduce-overhead: the fix for a compiled step's launch overhead); null = this run's compile.mode",
          nullable=True, choices=COMPILE_MODES),
    Field("profiler.wait", int, 0, "profiler schedule: steps skipped before warm-up", minimum=0),
    Field("profiler.warmup", int, 2, "profiler schedule: steps traced but discarded", minimum=0),
    Field("profiler.active", int, 8, "decode steps recorded (after the recorded prefill)", minimum=1),
    Field("profiler.record_shapes", bool, True, "record input shapes of ops"),
    Field("profiler.profile_memory", bool, True, "record [memory] events (allocated / reserved bytes)"),
    Field("profiler.with_stack", bool, True, "record Python frames (python_function events)"),
    Field("profiler.cuda_sync_events", bool, True, "record cuda_sync events where the torch version offers them"),
    Field("profiler.cost_probe", bool, True, "measure the profiler's cost per recorded event before the window "
          "(a few seconds; the what-if takes the profiler's cost out of the trace with it)"),
    Field("profiler.stackless_pass", bool, True, "with with_stack: run the recorded window once more without Python "
          "stacks (rank0.stackless.trace.json.gz), which times the host's code between recorded calls without the "
          "Python events' cost; the what-if prices Python code from it (step workloads)"),
    Field("profiler.graph_timing", bool, True, "CUDA: run the recorded window twice more without the profiler, each "
          "CUDA graph replay timed on the GPU (behind a sleeping kernel, then not: its launch latency); the what-if "
          "takes CUPTI's cost off the trace's replays with it (step workloads that replay graphs)"),
    Field("serve.requests", int, 16, "serve script: requests in one session", minimum=1),
    Field("serve.arrival", str, "poisson", "serve script: arrival process (uniform = evenly spaced, burst = all at "
          "once)", choices=("poisson", "uniform", "burst")),
    Field("serve.rate", (int, float), 50.0, "serve script: mean arrivals per second (poisson, uniform)",
          minimum=1e-6),
    Field("serve.prompt_min", int, 32, "serve script: shortest prompt (tokens; lengths are uniform)", minimum=1),
    Field("serve.prompt_max", int, 128, "serve script: longest prompt (tokens)", minimum=1),
    Field("serve.output_min", int, 8, "serve script: fewest output tokens of a request", minimum=1),
    Field("serve.output_max", int, 32, "serve script: most output tokens of a request", minimum=1),
    Field("serve.yield_s", (int, float), 0.001, "serve script: the engine's `await asyncio.sleep()` between steps "
          "(0 = yield without sleeping)", minimum=0),
    Field("serve.to_thread", bool, False, "serve script: run each engine step in `asyncio.to_thread`"),
    Field("serve.token_readback", str, "batched", "serve script: read new tokens with one copy per step, or with "
          "`.item()` per request", choices=("batched", "item")),
    Field("serve.warmup_sessions", int, 1, "serve script: unrecorded replays of the same traffic before timing (every "
          "prompt length seen once, so no first-call costs land in the timed or profiled sessions)", minimum=0),
    Field("serve.timed_sessions", int, 3, "serve script: unprofiled sessions of the same traffic; the one of median "
          "throughput is reported, with every session's figures beside it", minimum=1),
    Field("hf.max_new_tokens", int, 16, "hf_generate script: tokens each `model.generate()` call makes (its "
          "max_new_tokens and min_new_tokens, so every call makes exactly this many; one call is one profiled step)",
          minimum=1),
    Field("compile.mode", str, "default", "compile_decode script: the `torch.compile` mode of the decode step "
          "(reduce-overhead and max-autotune also replay it as a CUDA graph on CUDA)",
          choices=COMPILE_MODES),
    Field("compile.backend", str, "inductor", "decode_recompile and decode_graph_break scripts: the `torch.compile` "
          "backend of their helper (eager and aot_eager compile as inductor does, without generating kernels: fast "
          "on a CPU)",
          choices=("inductor", "aot_eager", "eager")),
    Field("memory_history.enabled", bool, True, "CUDA only: record the caching allocator's own history during the "
          "profiled window (torch.cuda.memory._record_memory_history, Python stacks) and write memory_snapshot.pickle; "
          "the time phase also measures the step time with recording on (its overhead)"),
    Field("memory_history.max_entries", int, 100_000, "most allocator events the history keeps (older ones are "
          "dropped first)", minimum=1),
    Field("sync_debug_pass", bool, True, "CUDA only: a separate unprofiled pass that records the file:line of "
          "every synchronizing call (torch.cuda.set_sync_debug_mode)"),
)
FIELDS = {f.key: f for f in SCHEMA}
_SECTIONS = sorted({f.key.split(".")[0] for f in SCHEMA if "." in f.key})


# --- the typed config: one frozen class per YAML section, attributes in SCHEMA's order --------------------------

@dataclasses.dataclass(frozen=True)
class ModelConfig:
    preset: str
    checkpoint: str | None
    layers: int | None


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    temperature: float
    top_k: int


@dataclasses.dataclass(frozen=True)
class StragglerConfig:
    rank: int | None
    delay_ms: float


@dataclasses.dataclass(frozen=True)
class TimingConfig:
    warmup_steps: int
    sessions: int
    compare_modes: bool
    compare_fix: str | None
    compare_fix_mode: Literal["eager", "cuda_graph"] | None
    compare_fix_compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"] | None


@dataclasses.dataclass(frozen=True)
class ProfilerConfig:
    wait: int
    warmup: int
    active: int
    record_shapes: bool
    profile_memory: bool
    with_stack: bool
    cuda_sync_events: bool
    cost_probe: bool
    stackless_pass: bool
    graph_timing: bool


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    requests: int
    arrival: Literal["poisson", "uniform", "burst"]
    rate: float
    prompt_min: int
    prompt_max: int
    output_min: int
    output_max: int
    yield_s: float
    to_thread: bool
    token_readback: Literal["batched", "item"]
    warmup_sessions: int
    timed_sessions: int


@dataclasses.dataclass(frozen=True)
class HFConfig:
    max_new_tokens: int


@dataclasses.dataclass(frozen=True)
class CompileConfig:
    mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]
    backend: Literal["inductor", "aot_eager", "eager"]


@dataclasses.dataclass(frozen=True)
class MemoryHistoryConfig:
    enabled: bool
    max_entries: int


@dataclasses.dataclass(frozen=True)
class CaptureConfig:
    """A validated workload. `path` is the YAML file (error messages name it); every other attribute is a SCHEMA key,
    a section's keys on its own object. Numbers keep the type the YAML gave them (an int where a float is allowed),
    so meta.json records the workload as written."""
    path: Path
    script: str
    name: str | None
    model: ModelConfig
    dtype: Literal["auto", "float32", "bfloat16", "float16"]
    device: str
    batch_size: int
    prompt_length: int
    decode_steps: int
    mode: Literal["eager", "cuda_graph"]
    seed: int
    sampling: SamplingConfig
    tp: int
    straggler: StragglerConfig
    timing: TimingConfig
    profiler: ProfilerConfig
    serve: ServeConfig
    hf: HFConfig
    compile: CompileConfig
    memory_history: MemoryHistoryConfig
    sync_debug_pass: bool

    @classmethod
    def from_values(cls, path: Path, values: dict[str, Any]) -> CaptureConfig:
        """Built from validated values keyed by SCHEMA's dotted keys; every key must land on an attribute."""
        left = dict(values)
        config = _build(cls, left, "", {"path": path})
        if left:
            raise TypeError(f"schema keys without a CaptureConfig attribute: {', '.join(left)}")
        return config

    @property
    def run_name(self) -> str:
        """The run folder's name: `name`, else the YAML file's stem."""
        return self.name or self.path.stem

    def script_path(self) -> Path:
        if self.script.endswith(".py"):
            return (self.path.parent / self.script).resolve()
        return WORKLOADS_DIR / f"{self.script}.py"

    def get(self, key: str) -> Any:
        """The value of a dotted SCHEMA key (`"profiler.with_stack"`)."""
        return functools.reduce(getattr, key.split("."), self)

    def options(self, sections: typing.Iterable[str]) -> dict[str, Any]:
        """The keys of these schema sections by dotted key: what a script's `option_sections` receive."""
        sections = set(sections)
        return {f.key: self.get(f.key) for f in SCHEMA if f.key.split(".")[0] in sections}

    def as_dict(self) -> dict[str, Any]:
        """The resolved workload as the YAML would write it, in SCHEMA's order (meta.json's `workload`)."""
        out: dict[str, Any] = {}
        for f in SCHEMA:
            node = out
            *parents, leaf = f.key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = self.get(f.key)
        return out


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, values: dict[str, Any], prefix: str, given: dict[str, Any]):
    kwargs = dict(given)
    for attr, hint in _hints(cls).items():
        if attr in kwargs:
            continue
        if dataclasses.is_dataclass(hint):
            kwargs[attr] = _build(hint, values, f"{prefix}{attr}.", {})
        elif prefix + attr in values:
            kwargs[attr] = values.pop(prefix + attr)
        else:
            raise TypeError(f"{cls.__name__}.{attr} has no schema key {prefix + attr!r}")
    return cls(**kwargs)


def _typed_keys(cls: type = CaptureConfig, prefix: str = "") -> dict[str, Any]:
    """Every leaf attribute of the typed config as a dotted key -> its annotation."""
    keys: dict[str, Any] = {}
    for attr, hint in _hints(cls).items():
        if cls is CaptureConfig and attr == "path":
            continue
        if dataclasses.is_dataclass(hint):
            keys.update(_typed_keys(hint, f"{prefix}{attr}."))
        else:
            keys[prefix + attr] = hint
    return keys


def _expected_annotation(field: Field) -> Any:
    kinds = field.kind if isinstance(field.kind, tuple) else (field.kind,)
    if field.choices:
        hint = Literal[field.choices]
    else:
        hint = float if float in kinds else kinds[0]
    return Optional[hint] if field.nullable else hint


def config_mismatches() -> list[str]:
    """Where the typed config and SCHEMA disagree: a key without an attribute, an attribute without a key, a type
    or an order that differs. Empty when they agree (the tests assert so)."""
    typed = _typed_keys()
    problems = [f"schema key {k!r} has no CaptureConfig attribute" for k in FIELDS if k not in typed]
    problems += [f"CaptureConfig attribute {k!r} has no schema key" for k in typed if k not in FIELDS]
    for key, hint in typed.items():
        if key in FIELDS and hint != _expected_annotation(FIELDS[key]):
            problems.append(f"{key!r}: annotated {hint}, schema says {_expected_annotation(FIELDS[key])}")
    if not problems and list(typed) != list(FIELDS):
        problems.append("CaptureConfig's attributes are not in SCHEMA's order")
    return problems


# --- validation -------------------------------------------------------------------------------------------------

def _type_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    return " or ".join(dict.fromkeys(names[k] for k in kinds))


def _check_value(source: str, field: Field, value: Any) -> Any:
    where = f"{source}: key '{field.key}'"
    if value is None:
        if field.nullable:
            return None
        raise UsageError(f"{where} must be set ({field.doc})")
    kinds = field.kind if isinstance(field.kind, tuple) else (field.kind,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        raise UsageError(f"{where}: expected {_type_name(field.kind)}, got {value!r}")
    if field.choices and value not in field.choices:
        raise UsageError(f"{where}: {value!r} is not allowed; allowed: {', '.join(field.choices)}")
    if field.minimum is not None and value < field.minimum:
        raise UsageError(f"{where}: {value!r} is below the minimum {field.minimum:g}")
    return value


def _flatten(source: str, data: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise UsageError(f"{source}: key {key!r} is not a string")
        dotted = prefix + key
        if dotted in _SECTIONS:
            if not isinstance(value, dict):
                raise UsageError(f"{source}: key '{dotted}' must be a mapping of "
                                 f"{', '.join(k.split('.', 1)[1] for k in FIELDS if k.startswith(dotted + '.'))}")
            flat.update(_flatten(source, value, dotted + "."))
        elif dotted in FIELDS:
            flat[dotted] = value
        else:
            siblings = [k[len(prefix):] for k in FIELDS if k.startswith(prefix) and "." not in k[len(prefix):]]
            siblings += [s for s in _SECTIONS if not prefix and s not in siblings]
            raise UsageError(f"{source}: unknown key '{dotted}'; allowed: {', '.join(sorted(siblings))}")
    return flat


def parse_override(source: str, text: str) -> tuple[str, Any]:
    """One `--set key=value` (the value is read as YAML: 4, true, cuda_graph, null)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"{source}: --set {text!r} is not key=value")
    if key not in FIELDS:
        raise UsageError(f"{source}: --set {key!r} is not a known key; allowed: {', '.join(FIELDS)}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def load_config(path: str | Path, overrides: typing.Sequence[str] = ()) -> CaptureConfig:
    """The workload YAML at `path` with `--set` overrides, validated: any mistake is one UsageError line naming the
    file, the key and the allowed values."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UsageError(f"{source}: no such workload file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{source}: cannot read ({exc.__class__.__name__}: {exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{source}: not valid YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping of keys (script, model, ...), got {type(data).__name__}")
    given = _flatten(source, data)
    for text_override in overrides:
        key, value = parse_override(source, text_override)
        given[key] = value
    values = {f.key: _check_value(source, f, given.get(f.key, f.default)) for f in SCHEMA}
    _check_cross_fields(source, values)
    return CaptureConfig.from_values(path, values)


def _check_cross_fields(source: str, values: dict[str, Any]) -> None:
    script = values["script"]
    if script.endswith(".py"):
        script_file = (Path(source).parent / script)
        if not script_file.is_file():
            raise UsageError(f"{source}: key 'script': file {script_file} does not exist")
    elif script not in script_names():
        raise UsageError(f"{source}: key 'script': unknown script {script!r}; allowed: "
                         f"{', '.join(script_names())} or a path to a .py file")
    twin = values["timing.compare_fix"]
    if twin is not None and twin not in script_names():
        raise UsageError(f"{source}: key 'timing.compare_fix': unknown script {twin!r}; allowed: "
                         f"{', '.join(script_names())}")
    if values["timing.compare_fix_compile_mode"] is not None and twin != "compile_decode":
        raise UsageError(f"{source}: key 'timing.compare_fix_compile_mode': sets the compile mode of the twin "
                         f"compile_decode, but timing.compare_fix is {twin!r}")
    if values["model.checkpoint"] is None:
        presets = _preset_names()
        if values["model.preset"] not in presets:
            raise UsageError(f"{source}: key 'model.preset': unknown preset {values['model.preset']!r}; "
                             f"allowed: {', '.join(presets)}")
    else:
        folder = Path(values["model.checkpoint"]).expanduser()
        if not folder.is_absolute():
            folder = Path(source).parent / folder
        if not (folder / "config.json").is_file():
            raise UsageError(f"{source}: key 'model.checkpoint': {folder} has no config.json")
        values["model.checkpoint"] = str(folder.resolve())
    for low, high in (("serve.prompt_min", "serve.prompt_max"), ("serve.output_min", "serve.output_max")):
        if values[low] > values[high]:
            raise UsageError(f"{source}: key '{low}': {values[low]} is above '{high}' ({values[high]})")
    device = values["device"]
    if not (device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise UsageError(f"{source}: key 'device': {device!r} is not allowed; allowed: auto, cpu, cuda, cuda:N")
    tp, straggler = values["tp"], values["straggler.rank"]
    if tp > 1 and device.startswith("cuda:"):
        raise UsageError(f"{source}: key 'device': {device!r} names one GPU, but tp={tp} puts rank N on cuda:N; "
                         "allowed with tp > 1: auto, cpu, cuda")
    if straggler is not None and straggler >= tp:
        raise UsageError(f"{source}: key 'straggler.rank': {straggler} is not a rank of tp={tp}; allowed: "
                         f"0 to {tp - 1} or null")


def describe_schema() -> str:
    """The schema as a Markdown table (docs/workloads.md and `python -m analyzer schema`)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in SCHEMA:
        kind = "/".join(dict.fromkeys(k.__name__ for k in (f.kind if isinstance(f.kind, tuple) else (f.kind,))))
        if f.choices:
            kind = " \\| ".join(f.choices)
        default = "required" if f.default is None and not f.nullable else ("null" if f.default is None else
                                                                            yaml.safe_dump(f.default).split("\n")[0])
        rows.append(f"| `{f.key}` | {kind} | {default} | {f.doc} |")
    return "\n".join(rows)
