"""Colours shared by report.html and the dashboard (Okabe-Ito: distinguishable with the common colour-vision
deficiencies). tests/dashboard/test_palette.py checks that the colours drawn side by side stay apart (CIEDE2000)."""

CAUSE_COLORS = {"cpu_launch": "#E69F00", "sync": "#D55E00", "allocator": "#CC79A7", "queued": "#999999",
                "event_loop_idle": "#882255", "thread_hop": "#44AA99",  # Paul Tol's wine and teal: no clash
                "input_wait": "#117733", "host_compute": "#332288",  # Tol's green and indigo
                "warmup": "#DDCC77", "profiler": "#BBBBBB", "unknown": "#666666",  # Tol's sand, greys
                "setup": "#AA4499",  # Tol's purple
                # launch gaps of a millisecond and more (the host-work detector's): a dark brown, the launch
                # overhead's orange darkened
                "host_work": "#543005"}
BUSY_COLOR = "#0072B2"
MEMCPY_COLOR = "#33BBEE"  # Tol's cyan: Okabe-Ito's bluish green was too near input_wait's green and thread_hop's teal
MEMSET_COLOR = "#000000"  # Okabe-Ito's yellow was too near warmup's sand
RESERVED_COLOR = "#009E73"
ALLOCATED_COLOR = "#56B4E9"
STEP_COLORS = ("#D9D9D9", "#BDBDBD")
SEVERITY_COLORS = {"high": "#D55E00", "medium": "#E69F00", "low": "#56B4E9", "info": "#999999"}
