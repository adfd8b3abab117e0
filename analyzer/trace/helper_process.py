"""What runs in the helper process when it cannot be a fork (analyzer.trace.helper starts it): read one part of a
large trace's event array into numpy columns and pickle them to stdout.

    python -m analyzer.trace.helper_process TRACE TEXT_LENGTH START END BARE
"""
from __future__ import annotations

import gc
import mmap
import pickle
import sys
from pathlib import Path

from .build import read_part
from .parse import EventArray, trace_text


def main(argv: list[str]) -> int:
    trace, text_length, start, end, bare = argv
    gc.disable()
    with trace_text(Path(trace)) as text:
        if not isinstance(text, mmap.mmap) or len(text) != int(text_length):
            return 1  # not the file the main process is reading
        result = read_part(text, EventArray(int(start), int(end), {}, bare=bare == "1"))
    pickle.dump(result, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
