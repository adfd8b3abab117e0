"""Every workload mistake is one line naming the file, the key and the allowed values; exit 2; nothing written."""
import pytest

from analyzer.capture.config import SCHEMA, describe_schema, load_config

from conftest import REPO

SHIPPED = sorted((REPO / "workloads").glob("*.yaml"))


def capture_rejects(cli, tmp_path, text: str, *extra: str) -> str:
    wl = tmp_path / "bad.yaml"
    wl.write_text(text)
    out = tmp_path / "out"
    result = cli("capture", str(wl), "--out", str(out), *extra)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists() or not any(out.iterdir()), "nothing may be written for a rejected workload"
    assert str(wl) in lines[0]
    return lines[0]


@pytest.mark.parametrize("text, expected", [
    ("script: decode\nbatch: 4\n", ["unknown key 'batch'", "batch_size", "profiler"]),
    ("script: decode\nprofiler: {activ: 3}\n", ["unknown key 'profiler.activ'", "active", "warmup"]),
    ("script: decode\nbatch_size: four\n", ["'batch_size'", "expected an integer", "'four'"]),
    ("script: decode\nbatch_size: true\n", ["'batch_size'", "expected an integer"]),
    ("script: decode\nbatch_size: -1\n", ["'batch_size'", "minimum 1"]),
    ("script: decode\nprofiler: {with_stack: 1}\n", ["'profiler.with_stack'", "true or false"]),
    ("script: decode\nmode: graph\n", ["'mode'", "allowed: eager, cuda_graph"]),
    ("script: decode\ndtype: fp8\n", ["'dtype'", "allowed: auto, float32, bfloat16, float16"]),
    ("script: decode\nmodel: {preset: qwen3-8b}\n", ["'model.preset'", "qwen2-0.5b", "tiny"]),
    ("script: decodez\n", ["'script'", "unknown script 'decodez'", "decode_item_sync"]),
    ("script: missing.py\n", ["'script'", "does not exist"]),
    ("batch_size: 1\n", ["'script' must be set"]),
    ("script: decode\ndevice: tpu\n", ["'device'", "auto, cpu, cuda, cuda:N"]),
    ("script: decode\nmodel: qwen\n", ["'model' must be a mapping", "preset"]),
    ("- just\n- a list\n", ["expected a mapping"]),
    ("script: [unclosed\n", ["not valid YAML", "line"]),
    ("script: decode\nmodel: {checkpoint: /nonexistent/folder}\n", ["'model.checkpoint'", "config.json"]),
])
def test_bad_workload_is_one_line(cli, tmp_path, text, expected):
    line = capture_rejects(cli, tmp_path, text)
    for fragment in expected:
        assert fragment in line


def test_bad_override(cli, tmp_path):
    line = capture_rejects(cli, tmp_path, "script: decode\n", "--set", "profiler.active=lots")
    assert "'profiler.active'" in line and "expected an integer" in line
    line = capture_rejects(cli, tmp_path, "script: decode\n", "--set", "nope=1")
    assert "'nope'" in line and "batch_size" in line


def test_missing_file(cli, tmp_path):
    result = cli("capture", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'nope.yaml'}: no such workload file"


def test_cuda_requested_without_gpu(cli, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    line = capture_rejects(cli, tmp_path, "script: decode\nmodel: {preset: tiny}\ndevice: cuda\n")
    assert "'device'" in line and "no CUDA device" in line and "allowed here: auto, cpu" in line
    line = capture_rejects(cli, tmp_path, "script: decode\nmodel: {preset: tiny}\nmode: cuda_graph\n")
    assert "'mode'" in line and "eager" in line


def test_malformed_checkpoint_folder(cli, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "qwen2", "hidden_size": 64}')
    line = capture_rejects(cli, tmp_path, f"script: decode\nmodel: {{checkpoint: {ckpt}}}\n")
    assert "'model.checkpoint'" in line and "missing key" in line


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_workloads_validate(path):
    config = load_config(path)
    assert config.script_path().is_file()


def test_schema_documents_every_key():
    table = describe_schema()
    for field in SCHEMA:
        assert f"`{field.key}`" in table
