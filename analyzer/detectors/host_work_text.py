"""What the host-work findings say: the advice for a function or op that ran, for untraced time, for untraced time
that holds a large host tensor's release, and for an op's own host work up to its launch (host_work)."""
from __future__ import annotations

import re

from analyzer.units import fmt_bytes, fmt_us
from analyzer.views.traits import is_compiled_region

MANY_EVENT_QUERIES = 50  # event queries inside one allocation: the caching allocator working through a backlog
SLOW_CALL = 10  # a call this many times its op's median CPU time is not what every call costs
# ops whose library picks a kernel per shape (heuristics, algorithm search) on its first call at that shape
LIBRARY_PICKS_KERNEL = re.compile(r"^aten::(_?(add)?b?mm|matmul|linear|addmv|_scaled_mm|_?convolution|conv\w*|"
                                  r"cudnn_\w+|miopen_\w+)$")


def host_work_advice(site: dict, graphs_replayed: bool) -> str:
    op = site.get("op")
    if not op or site.get("call_site"):
        return ("The CPU ran this code for over a millisecond with nothing queued on the GPU: move host work (data "
                "preparation, Python bookkeeping, logging, tokenization) out of the step, precompute it, or queue "
                "the next GPU work before doing it so the two overlap.")
    if is_compiled_region(op):
        graphs = ("; under mode=\"reduce-overhead\", the CUDA-graph tree's checks of its inputs' addresses, copies "
                  "of inputs that moved and re-recording when they keep moving" if graphs_replayed else "")
        keep = ("Keep the inputs at fixed addresses across calls (one preallocated cache or buffer, reset in place). "
                if graphs_replayed else "")
        return (f"The CPU spent over a millisecond inside the compiled region {op} with nothing queued on the GPU: "
                f"torch.compile's own cost around its kernels (Dynamo's guard checks, AOT autograd's runtime "
                f"wrappers, the Python launchers of Triton kernels{graphs}), or eager code the region runs between "
                f"them. {keep}Run with TORCH_LOGS=\"recompiles,guards"
                f"{',cudagraphs' if graphs_replayed else ''}\" to see what it re-does each call; with_stack=True "
                f"shows the frames inside it.")
    advice = (f"The CPU spent over a millisecond inside {op} with nothing queued on the GPU. The trace has no Python "
              f"stack (record with with_stack=True to see the line that called it). If the op works on host tensors, "
              f"move it out of the step; if it launches many small GPU ops, its per-call CPU cost is the gap: batch "
              f"or fuse the calls (foreach / fused variants).")
    if op == "aten::zero_":
        advice += " For gradients, optimizer.zero_grad(set_to_none=True) (the default since torch 2.0) skips it."
    return advice


UNTRACED_ADVICE = (
    "The profiler recorded nothing inside this time on the thread that launches the GPU work: no op, no CUDA call, no "
    "Python call (or only the enclosing one). It is the interpreter running that code's own lines, a JIT or compiler "
    "(TorchScript's profiling executor, torch.compile, Triton), garbage collection, waiting for the GIL held by "
    "another thread, or the OS. Record with with_stack=True (and record_shapes) to see Python calls; if it happens "
    "only in the first iterations, profile after warm-up; py-spy or Nsight Systems' CPU sampling show what the "
    "thread ran.")


HOST_RELEASE_ADVICE = (
    "Releasing a large host tensor is the OS's work, outside every op: unmapping its pages, and for a batch that a "
    "DataLoader worker process built, its shared-memory segment, which costs milliseconds (a 16.1 MiB batch: 5 to 9 "
    "ms on a 2-core host, against microseconds for a tensor of that size the process allocated itself). The release "
    "holds the GIL, so moving it to another thread (pin_memory=True's pin-memory thread releases the worker's batch) "
    "still stalls the launching thread's Python. Drop the host tensor where the GPU has queued work to hide it: bind "
    "the device copy to a new name (x_gpu = x.to(device)) and `del x` after the step's launches, or reuse one "
    "preallocated host buffer. If gaps like these recur without a release, py-spy or Nsight Systems' CPU sampling "
    "show what the thread ran.")


def tail_op_advice(h: dict, hip: bool) -> str:
    t = h["tail_op"]
    text = (f"The CPU spent {fmt_us(t['in_gap_us'])} of the longest gap inside {t['op']}, up to the launch that "
            f"ended it, with nothing queued on the GPU: the op's own host work before its kernel.")
    outlier = t["other_median_us"] is not None and t["other_median_us"] * SLOW_CALL <= t["cpu_us"]
    if t["other_median_us"] is not None:
        text += (f" Its other {t['other_calls']} calls in the window took {fmt_us(t['other_median_us'])} each "
                 f"(median)")
        text += f"; this one took {fmt_us(t['cpu_us'])}: a cost not paid on every call." if outlier else "."
    calls = t["runtime_calls"]
    if calls:
        text += " Inside it, the runtime calls before its launch: " + ", ".join(
            f"{c['api']} {c['count']}x ({fmt_us(c['us'])})" for c in calls) + "."
    polls = t["allocator_event_queries"]
    if polls >= MANY_EVENT_QUERIES:
        text += (f" {polls} event queries inside an allocation are the caching allocator catching up on blocks "
                 f"freed while another stream still used them (Tensor.record_stream): it queries each one's event "
                 f"before it takes the block back. ProcessGroupNCCL does this to its collectives' tensors unless "
                 f"TORCH_NCCL_AVOID_RECORD_STREAMS=1; fewer, larger collectives (DDP's bucket_cap_mb) leave fewer "
                 f"such blocks.")
    elif outlier or not t["other_calls"]:
        libraries = "hipBLASLt / rocBLAS heuristics, MIOpen's search" if hip else \
            "cuBLAS / cuBLASLt heuristics, cuDNN's algorithm search"
        first = (f"a first call at a shape it has not run yet (a matrix multiply or convolution choosing its kernel: "
                 f"{libraries}, a kernel module loaded on first use; paid once per shape: run each shape once before "
                 f"profiling, and keep the number of shapes small by padding or bucketing batch and sequence sizes)"
                 if LIBRARY_PICKS_KERNEL.search(t["op"]) else
                 "a first call on a new path (a new shape, dtype or device, a library's lazy set-up; paid once)")
        lead = "A call this much slower than the op's others" if outlier else "The op's only call in the window"
        inside = "no recorded work" if not calls else "little recorded work"
        text += (f" {lead}, with {inside} inside it, is {first}, or "
                 f"the thread losing its core for that time (preempted by the OS or another process: "
                 f"record_shapes=True shows whether it was the first call at its input shapes; py-spy, `perf sched` "
                 f"or Nsight Systems' CPU sampling show a thread that was not running).")
    else:
        text += (" That is the op's argument checks, output allocation and dispatch, or a library call's set-up: a "
                 "cheaper variant of the op, fewer calls of it, or its work moved off the step's critical path.")
    return text


def host_release_text(h: dict) -> tuple[str, str]:
    """The title's words and the advice's first sentence for a group whose untraced pieces hold a large host
    tensor's release (the only op-level record inside them)."""
    m = h["host_memory"]
    where = {"end": "at the end of", "start": "at the start of", "middle": "inside"}[m["where"]]
    share = "" if m["pieces"] == h["count"] else f" (in {m['pieces']} of {h['count']} gaps)"
    size = fmt_bytes(-m["bytes"])
    title = f", untraced but for the release of a {size} host tensor{share}"
    first = (f"The profiler recorded no op, CUDA call or Python call in this time on the thread that launches the "
             f"GPU work, only the [memory] event of a {size} host tensor's release ({where} the longest gap{share}): "
             f"the thread most likely spent the time on that release (the event is written at one end of it). ")
    return title, first


def held_by_text(h: dict, long_gap_us: float) -> tuple[str, str]:
    """The title's words and the advice for untraced gaps of the launching thread while another thread of the process
    ran Python (holding the GIL)."""
    held = h["held_by"]
    who = held["role"] if held["role"] != "another thread" else f"thread {held['tid']}"
    launching = ", ".join(str(t) for t in held["launching_tids"])
    what = f"while {who} ran {h['call_site']} in Python (holding the GIL)"
    other = f"{who} (tid {held['tid']})" if who != f"thread {held['tid']}" else who
    if held.get("binding"):
        before = (f"In these gaps the launching thread (tid {launching}) sat in a torch call "
                  f"(`{held['binding']}`) whose ops had already ended: it was waiting for the GIL to return to "
                  f"Python, while {other} was running Python in {h['call_site']}.")
    else:
        before = (f"In these gaps the launching thread (tid {launching}) recorded nothing, while {other} was running "
                  f"Python in {h['call_site']}.")
    advice = (before + " Only one thread runs Python bytecode at a "
              f"time: a thread that needs the GIL waits for the holder to drop it, which a busy thread does every "
              f"sys.getswitchinterval() (5 ms by default), so the launching thread's next launch waits that long and "
              f"the GPU idles.")
    if held["role"] == "autograd's backward thread":
        advice += (" On autograd's thread that is Python run during the backward pass (hooks, custom autograd "
                   "Functions): make it cheaper or move it out of the backward.")
    elif held["role"] == "DataLoader's pin-memory thread":
        advice += (" The pin-memory thread runs Python between its copies: fewer, larger batches, or pin_memory in the "
                   "worker processes' collate_fn, keep it off the GIL.")
    else:
        advice += (" Move that work to another process (a ProcessPoolExecutor or a multiprocessing worker: its own "
                   "interpreter and GIL), use a library call that releases the GIL (a fast tokenizer's batch API, "
                   "numpy on large arrays), or batch it so it runs between steps instead of during them.")
    evidence = ("a torch call's frame stayed open long after its ops ended" if held.get("binding") else
                "no event ended on the launching thread in the gap")
    advice += (f" The evidence is the trace's own: {evidence}, and the other thread's innermost frame there is a "
               f"Python function, not a wait; py-spy dump or Nsight Systems' OS runtime trace show the GIL wait "
               f"directly. The price removes the stalls from the steps they fell in, averaged over the steps; the "
               f"other thread's Python ran under the profiler too, and how much slower that made it the trace "
               f"cannot tell.")
    return what, advice
