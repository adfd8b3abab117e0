"""Whose code a Kineto frame name is, on names taken from real traces (ours and the external ones)."""
import pytest

from analyzer.views.frames import FrameKind, describe_compiled, describe_frame, frame_kind, is_inner_function

CASES = [
    ("workloads/qwen2/model.py(56): forward", FrameKind.USER),
    ("moca/library/profiling/profile.py(34): run_torch_profiler", FrameKind.USER),
    ("/home/me/proj/train.py(12): main", FrameKind.USER),
    ("torch/nn/modules/module.py(1740): _call_impl", FrameKind.TORCH),
    ("/opt/conda/lib/python3.10/site-packages/torch/_ops.py(1116): __call__", FrameKind.TORCH),
    ("transformers/masking_utils.py(236): sdpa_mask", FrameKind.LIBRARY),
    ("vllm/v1/worker/gpu_model_runner.py(3087): synchronize_input_prep", FrameKind.LIBRARY),
    ("/sgl-workspace/sglang/python/sglang/srt/model_executor/forward_batch_info.py(443): init_new", FrameKind.LIBRARY),
    ("/usr/lib/python3/dist-packages/numpy/core/fromnumeric.py(59): _wrapfunc", FrameKind.LIBRARY),
    ("concurrent/futures/thread.py(58): run", FrameKind.STDLIB),
    ("/usr/lib/python3.12/concurrent/futures/thread.py(58): run", FrameKind.STDLIB),
    ("threading.py(1016): _bootstrap_inner", FrameKind.STDLIB),
    ("<frozen importlib._bootstrap>(1165): _find_and_load", FrameKind.STDLIB),
    ("/tmp/torchinductor_root/lw/clw7y73aeswyfnxf4auksf6b65sifta42pako7mj4yfoga3q24ji.py(1266): call", FrameKind.GENERATED),
    # Inductor's content-addressed module under a TORCHINDUCTOR_CACHE_DIR of the user's choosing
    ("/tmp/ind/lx/clxhzbqydevojo6rmzbuet7x24fruk7axxkkubklavnw6gxsorps.py(429): call", FrameKind.GENERATED),
    ("/home/me/project/ab/cabinet.py(3): open_door", FrameKind.USER),
    ("<eval_with_key>.3(5): forward", FrameKind.GENERATED),
    ("<string>(1): launcher", FrameKind.GENERATED),
    ("analyzer/capture.py(206): profile_run", FrameKind.TOOL),
    ("nn.Module: Linear_100", FrameKind.OTHER),
    ("<built-in method item of Tensor object at 0x7f1a8d580bd0>", FrameKind.OTHER),
]


@pytest.mark.parametrize("name,kind", CASES, ids=[c[0][:40] for c in CASES])
def test_frame_kind(name, kind):
    assert frame_kind(name) == kind


def test_user_code_prefix_turns_a_library_into_the_users_code():
    name = "vllm/v1/worker/gpu_model_runner.py(3087): synchronize_input_prep"
    assert frame_kind(name, ("vllm/",)) == FrameKind.USER
    assert frame_kind("torch/nn/modules/module.py(1740): _call_impl", ("vllm/",)) == FrameKind.TORCH


def test_inner_functions_and_descriptions():
    assert is_inner_function("workloads/decode_host_work.py(9): <genexpr>")
    assert is_inner_function("x.py(3): <lambda>") and not is_inner_function("x.py(3): helper")
    assert describe_frame("workloads/qwen2/model.py(56): forward") == \
        "forward() (defined at workloads/qwen2/model.py:56)"
    assert describe_compiled("/tmp/torchinductor_root/lw/clw7y73aeswyfnxf4auksf6b65sifta42pako7mj4yfoga3q24ji.py"
                             "(1266): call") == "call() in clw7y73aeswy….py (Inductor output)"
    assert describe_compiled("<eval_with_key>.3(5): forward") == "forward() in <eval_with_key>.3 (FX graph)"
