"""The dashboard's timeline: lanes of GPU activity, idle by cause, CPU context, memory and markers, binned or exact
for any window (`lanes.py`), and saved beside the trace's columnar cache for a fresh server (`cache.py`)."""
