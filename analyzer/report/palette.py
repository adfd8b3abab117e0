"""Colours shared by report.html and the dashboard (Okabe-Ito: distinguishable with the common colour-vision
deficiencies)."""

CAUSE_COLORS = {"cpu_launch": "#E69F00", "sync": "#D55E00", "allocator": "#CC79A7", "queued": "#999999",
                "event_loop_idle": "#882255", "thread_hop": "#44AA99",  # Paul Tol's wine and teal: no clash
                "input_wait": "#117733", "host_compute": "#332288",  # Tol's green and indigo
                "warmup": "#DDCC77", "profiler": "#BBBBBB", "unknown": "#666666",  # Tol's sand, greys
                "setup": "#AA4499"}  # Tol's purple
BUSY_COLOR = "#0072B2"
RESERVED_COLOR = "#009E73"
ALLOCATED_COLOR = "#56B4E9"
STEP_COLORS = ("#D9D9D9", "#BDBDBD")
SEVERITY_COLORS = {"high": "#D55E00", "medium": "#E69F00", "low": "#56B4E9", "info": "#999999"}
