"""Which adapters the chats of this UI process use: one shared registry, kept by the ``Service``.

    usage = AdapterUsage()
    with usage.streaming("pirate"):        # turn.py, around the answer's stream
        ...
    usage.touch("poet")                     # just loaded: counts as used now
    victim = usage.victim(["poet", "sea"])  # least recently used, never one that is streaming; None if all are

vLLM registers any number of runtime adapters (its worker cache evicts weights silently beyond
``--max-cpu-loras`` and reads them again from disk), so the slots are our rule: at most
[lora].max_cpu_loras adapters served, static ones included. When they are full, the least recently
used runtime adapter no answer streams from is unloaded to make room. "Used" is the start or the end
of an answer from it, or its load, in any chat of this process; one never used here (loaded before a
restart of the UI) counts as the oldest. Ties go to the name that sorts first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager


class AdapterUsage:
    """Last use and answers streaming, per adapter name. Plain dicts: the UI runs on one event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last_used: dict[str, float] = {}
        self._streaming: dict[str, int] = {}

    def touch(self, name: str) -> None:
        self._last_used[name] = self._clock()

    def last_used(self, name: str) -> float | None:
        return self._last_used.get(name)

    def answering(self, name: str) -> int:
        """How many answers stream from ``name`` right now."""
        return self._streaming.get(name, 0)

    @contextmanager
    def streaming(self, name: str) -> Iterator[None]:
        """Mark an answer streaming from ``name`` for the duration of the block (also on error or Stop)."""
        self.touch(name)
        self._streaming[name] = self._streaming.get(name, 0) + 1
        try:
            yield
        finally:
            left = self._streaming.get(name, 1) - 1
            if left > 0:
                self._streaming[name] = left
            else:
                self._streaming.pop(name, None)
            self.touch(name)

    def victim(self, candidates: Iterable[str]) -> str | None:
        """The least recently used of ``candidates`` that nothing streams from; None when every one does.

        The caller passes only runtime adapters: static ones are never candidates.
        """
        idle = [n for n in candidates if not self.answering(n)]
        if not idle:
            return None
        return min(idle, key=lambda n: (self._last_used.get(n, float("-inf")), n))

    def forget(self, name: str) -> None:
        """``name`` was unloaded: its history of use ends (a stream still open keeps its count)."""
        self._last_used.pop(name, None)
