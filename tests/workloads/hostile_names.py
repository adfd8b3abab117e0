"""A workload whose names carry markup: the step label (and so every step annotation in the trace) holds an HTML
tag, a table pipe and a backtick, as a user's record_function names may. Reports must show it, not render it."""
from workloads.decode_item_sync import Workload as ItemSyncWorkload


class Workload(ItemSyncWorkload):
    step_label = "decode_<img src=x onerror=alert(1)>|`step"
