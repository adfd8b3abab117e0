"""A thread-safe LRU cache bounded by the total size of what it holds (the newest entry always stays)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable


class SizedLru:
    def __init__(self, max_bytes: int, size_of: Callable[[Any], int]):
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self.peak_bytes = 0  # the most it held at once (after evicting)
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                return None
            self._items.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: Any) -> None:
        size = self._size_of(value)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped
            self.peak_bytes = max(self.peak_bytes, self._bytes)

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
