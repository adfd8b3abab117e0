"""What runs in the helper process (analyzer.trace.helper starts it): read one part of a large trace's event array
into numpy columns and pickle them to stdout.

    python -m analyzer.trace.helper_process TRACE TEXT_LENGTH START END BARE
"""
from __future__ import annotations

import gc
import mmap
import pickle
import sys
from pathlib import Path

from .build import EventColumns, read_events
from .helper import NOT_CHUNKABLE
from .parse import EventArray, NotChunkable, trace_text


def main(argv: list[str]) -> int:
    trace, text_length, start, end, bare = argv
    gc.disable()
    with trace_text(Path(trace)) as text:
        if not isinstance(text, mmap.mmap) or len(text) != int(text_length):
            return 1  # not the file the main process is reading
        columns = EventColumns(lenient=False)
        try:
            spans, legacy = read_events(text, EventArray(int(start), int(end), {}, bare=bare == "1"), columns)
            result = {"columns": columns.export(), "spans": spans, "legacy": legacy}
        except NotChunkable:
            result = NOT_CHUNKABLE
    pickle.dump(result, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
