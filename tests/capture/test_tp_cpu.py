"""Tensor parallelism on the CPU (issue 16): the Qwen2 runtime split over 2 gloo ranks decodes the tokens of one
rank, and `python -m analyzer capture workloads/tp_decode.yaml` writes one run folder with a trace per rank.

Real processes, real gloo collectives, real torch.profiler traces (read back here with gzip + json only)."""
import datetime
import gzip
import json
import os
import statistics
import sys
from pathlib import Path

import pytest


torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

from workloads.qwen2 import PRESETS, Generator, TensorParallel, random_model  # noqa: E402
from workloads.qwen2.parallel import plan_shard  # noqa: E402

LOGITS_ATOL = 1e-5  # fp32: the all-reduce sums the row-parallel partial products in another order than one matmul
STEPS = 10


def decode(model, config):
    """Greedy fp32 decode of a fixed prompt: (tokens, logits of every decode step)."""
    gen = Generator(model, batch_size=2, capacity=16 + STEPS + 1)
    gen.prefill(torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(7)))
    logits = []
    for _ in range(STEPS):
        gen.step()
        logits.append(gen.last_logits.clone())
    return gen.tokens().clone(), torch.stack(logits)


RANK_TIMEOUT = datetime.timedelta(seconds=300)  # rendezvous and each collective: generous for a loaded machine


def _rank(rank, world, port, out):
    """One rank (a spawned process). The rendezvous store is the test process's (see below), so no rank's exit can
    take it away from another."""
    import torch.distributed as dist
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=RANK_TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=RANK_TIMEOUT)
    config = PRESETS["tiny"]
    model = random_model(config, "cpu", torch.float32, seed=0, tp=TensorParallel.from_process_group())
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    tokens, logits = decode(model, config)
    torch.save({"tokens": tokens, "logits": logits, "shapes": shapes}, f"{out}.{rank}")
    dist.barrier()  # every rank is past its last collective and has written its file: nobody leaves a peer behind
    dist.destroy_process_group()
    # Leave without finalizing the interpreter. destroy_process_group() does not stop gloo's threads here: building
    # the model on the meta device imports torch._dynamo, which imports torch.distributed.nn.functional, whose
    # `group=group.WORLD` defaults (evaluated at that import) hold the live default group, so the group and its 2
    # worker threads outlive the call. A worker still releasing the last all-gather's tensors once finalization has
    # begun needs the GIL, and CPython ends such a thread with pthread_exit: the unwind hits a noexcept destructor
    # and the rank dies of SIGABRT ("terminate called without an active exception"), a race a loaded machine loses.
    # On an error the exception propagates instead and mp.spawn reports it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_world_size_2_decodes_the_tokens_of_world_size_1(tmp_path):
    config = PRESETS["tiny"]
    tokens_1, logits_1 = decode(random_model(config, "cpu", torch.float32, seed=0), config)
    # The rendezvous store lives in this process, which outlives both ranks, on a port the kernel picked and this
    # process holds (no free-port race with other processes)
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=RANK_TIMEOUT)
    mp.spawn(_rank, args=(2, store.port, str(tmp_path / "out")), nprocs=2)
    del store
    for rank in range(2):
        got = torch.load(tmp_path / f"out.{rank}")
        assert torch.equal(got["tokens"], tokens_1)  # greedy fp32: identical tokens
        assert (got["logits"] - logits_1).abs().max().item() <= LOGITS_ATOL
        # each rank holds half: 2 of 4 query heads, 1 of 2 KV heads, 88 of 176 MLP columns, 512 of 1024 vocab rows
        shapes = got["shapes"]
        assert shapes["model.layers.0.self_attn.q_proj.weight"] == (2 * 16, 64)
        assert shapes["model.layers.0.self_attn.k_proj.weight"] == (16, 64)
        assert shapes["model.layers.0.self_attn.o_proj.weight"] == (64, 2 * 16)
        assert shapes["model.layers.0.mlp.down_proj.weight"] == (64, 88)
        assert shapes["lm_head.weight"] == shapes["model.embed_tokens.weight"] == (512, 64)


def test_qwen2_05b_shards():
    """14 query heads, 2 KV heads: tp=2 splits the KV heads, tp=4 replicates each on 2 ranks (4, 3, 4, 3 query
    heads); tp=3 cannot be cut."""
    config = PRESETS["qwen2-0.5b"]
    two = [plan_shard(config, r, 2) for r in range(2)]
    assert [(s.q_heads, s.kv_heads, s.kv_replicated) for s in two] == [((0, 7), (0, 1), False),
                                                                        ((7, 14), (1, 2), False)]
    assert [s.intermediate for s in two] == [(0, 2432), (2432, 4864)] and two[1].vocab == (75968, 151936)
    four = [plan_shard(config, r, 4) for r in range(4)]
    assert [s.q_heads for s in four] == [(0, 4), (4, 7), (7, 11), (11, 14)]
    assert [s.kv_heads for s in four] == [(0, 1), (0, 1), (1, 2), (1, 2)] and four[0].kv_replicated
    assert [s.vocab_rows for s in four] == [37984] * 4 and four[3].intermediate == (3648, 4864)
    with pytest.raises(ValueError, match="tp=3"):
        plan_shard(config, 0, 3)


DELAY_MS = 20  # the planted straggler's sleep: well above the CPU's scheduling noise
ACTIVE = 3
CAPTURE = ("--set", "model.preset=tiny", "--set", "model.layers=null", "--set", "prompt_length=16",
           "--set", "batch_size=2", "--set", "decode_steps=4", "--set", "timing.sessions=1",
           "--set", "timing.warmup_steps=1", "--set", "profiler.warmup=1", "--set", f"profiler.active={ACTIVE}")


def only_run(out: Path) -> Path:
    runs = list(out.iterdir())
    assert len(runs) == 1, runs
    return runs[0]


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    from conftest import run_cli
    out = tmp_path_factory.mktemp("traces")
    result = run_cli("capture", "workloads/tp_decode.yaml", "--out", str(out), *CAPTURE,
                     "--set", "straggler.rank=1", "--set", f"straggler.delay_ms={DELAY_MS}", timeout=300)
    assert result.returncode == 0, result.stderr
    return only_run(out)


def events(run: Path, rank: int) -> list[dict]:
    with gzip.open(run / f"rank{rank}.trace.json.gz") as f:
        return json.load(f)["traceEvents"]


def steps_of(evs):
    steps = sorted((e for e in evs if e.get("cat") == "user_annotation" and e["name"].startswith("decode_step#")),
                   key=lambda e: e["ts"])
    assert len(steps) == ACTIVE
    return steps


def within(evs, step, name, cat):
    return sorted((e for e in evs if e.get("name") == name and e.get("cat") == cat
                   and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]), key=lambda e: e["ts"])


def test_one_run_folder_with_a_trace_per_rank(tp_run):
    assert sorted(p.name for p in tp_run.iterdir()) == ["meta.json", "rank0.stackless.trace.json.gz",
                                                        "rank0.trace.json.gz", "rank1.stackless.trace.json.gz",
                                                        "rank1.trace.json.gz"]
    from analyzer import api
    assert Path(api.load(tp_run / "rank1.trace.json.gz", cache=False).stackless.path).name == \
        "rank1.stackless.trace.json.gz"  # each rank's own stackless pass
    meta = json.loads((tp_run / "meta.json").read_text())
    d = meta["distributed"]
    assert meta["complete"] is True and d["backend"] == "gloo" and d["world_size"] == 2 and d["nccl_version"] is None
    assert d["environment"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                "NVSHMEM_DISABLE_NVLS": "1"}
    assert d["traces"] == ["rank0.trace.json.gz", "rank1.trace.json.gz"] and d["straggler"]["rank"] == 1
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    for r in d["ranks"]:
        assert r["unprofiled"]["steps"] == 4 and len(r["unprofiled"]["per_step_ms"]) == 4
        assert r["shard"]["size"] == 2 and r["shard"]["collectives_per_forward"] == {"all_reduce": 5,
                                                                                        "all_gather": 1}
    assert meta["unprofiled"] == d["ranks"][0]["unprofiled"]  # rank 0 where a one-process run has it
    # the ranks decoded the same tokens
    assert d["ranks"][0]["script_info"]["tokens_sha1"] == d["ranks"][1]["script_info"]["tokens_sha1"]
    assert not any(p.name.startswith(".") for p in tp_run.parent.iterdir())


def test_traces_hold_the_collectives(tp_run):
    """Per decode step: 2 all-reduces per layer (after attention, after the MLP) + 1 for the vocab-parallel
    embedding, and 1 all-gather of the logits. torch 2.13's gloo records `c10d::allreduce_` / `_allgather_base_` on
    the calling thread and `gloo:all_reduce` / `gloo:all_gather` on its worker thread (no `record_param_comms`, which
    the NCCL backend adds)."""
    layers = 2
    for rank in (0, 1):
        evs = events(tp_run, rank)
        for step in steps_of(evs):
            assert len(within(evs, step, "c10d::allreduce_", "cpu_op")) == 2 * layers + 1
            assert len(within(evs, step, "c10d::_allgather_base_", "cpu_op")) == 1
        names = [e["name"] for e in evs]
        # the profiled window: the prefill's forward and ACTIVE decode steps, each 5 all-reduces and 1 all-gather
        assert names.count("c10d::allreduce_") == names.count("gloo:all_reduce") == 5 * (ACTIVE + 1)
        assert names.count("c10d::_allgather_base_") == names.count("gloo:all_gather") == ACTIVE + 1


def test_planted_straggler_on_rank_1_only(tp_run):
    def sleeps(evs):
        return [e for e in evs if e.get("cat") == "python_function" and e["name"].startswith("workloads/tp_decode.py(")
                and e["name"].endswith(": straggler_sleep")]

    assert sleeps(events(tp_run, 0)) == []
    evs = events(tp_run, 1)
    assert len(sleeps(evs)) == ACTIVE  # once per recorded decode step, never in the prefill
    for step in steps_of(evs):
        (slept,) = [e for e in sleeps(evs) if step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
        assert slept["dur"] >= DELAY_MS * 1e3 * 0.95
        embed, attention = within(evs, step, "c10d::allreduce_", "cpu_op")[:2]
        assert embed["ts"] < slept["ts"] and slept["ts"] + slept["dur"] <= attention["ts"]  # right before layer 0's
    rank0, waits = events(tp_run, 0), []
    for step in steps_of(rank0):  # rank 0 waits for rank 1 inside that all-reduce
        waits.append(within(rank0, step, "gloo:all_reduce", "user_annotation")[1]["dur"])
    assert statistics.median(waits) >= DELAY_MS * 1e3 * 0.5


def leftover_processes(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def test_a_failing_rank_fails_the_capture_and_writes_nothing(tmp_path, cli):
    (tmp_path / "boom_tp.py").write_text(
        "from workloads.tp_decode import Workload as TensorParallelDecode\n"
        "class Workload(TensorParallelDecode):\n"
        "    def step(self):\n"
        "        super().step()\n"
        "        if self.model.tp.rank == 1 and self.steps_done == 2:\n"
        "            raise RuntimeError('boom on rank 1')\n")
    (tmp_path / "boom_tp.yaml").write_text("script: boom_tp.py\ntp: 2\nmodel: {preset: tiny}\nprompt_length: 8\n"
                                           "decode_steps: 4\ntiming: {warmup_steps: 1}\n")
    out = tmp_path / "traces"
    result = cli("capture", str(tmp_path / "boom_tp.yaml"), "--out", str(out), timeout=300)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: rank 1 failed: RuntimeError: boom on rank 1"), \
        result.stderr
    assert list(out.iterdir()) == []  # no run folder, not even a hidden partial one
    assert leftover_processes(str(out)) == []


@pytest.mark.parametrize("sets, key", [
    (["tp=3"], "'tp'"),  # 2 KV heads cannot be cut 3 ways
    (["straggler.rank=2"], "'straggler.rank'"),
    (["script=decode"], "'tp'"),  # a script without tensor_parallel = True
])
def test_bad_tensor_parallel_workloads_are_refused(cli, tmp_path, sets, key):
    args = [a for s in sets for a in ("--set", s)]
    result = cli("capture", "workloads/tp_decode.yaml", "--out", str(tmp_path), "--set", "model.preset=tiny", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: workloads/tp_decode.yaml: key " + key) and result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
