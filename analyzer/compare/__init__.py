"""Two reports compared: what changed per finding and per step (`diff.py`), whether the change is an improvement
(`verdict.py`), and the CI gates of `diff --fail-on` and `check` (`gate.py`)."""
