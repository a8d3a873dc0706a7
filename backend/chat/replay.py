"""What a browser may have missed while its socket was down, kept to be sent again when it comes back (issue #20,
"Wi-Fi blips lose nothing").

Chainlit's socket.io client reconnects to the same session after a cut, but what the server emitted meanwhile went
to the old, dead socket: an answer that ended while the browser was away stayed cut on its screen, without its
footer, and a streamed answer lost the tokens of the gap. The ``Journal`` keeps, per session, the latest state of
every message, step, action button and element it emitted (a streamed token is added to its step), and when each
last changed; on a reconnect ``replay`` gives the events that bring the browser's screen to that state: each thing
changed since shortly before the cut, whole (the browser's client merges a step it has by id, adds one it lacks,
and deletes one removed meanwhile).

"Shortly before": a cut the server has not noticed yet (no TCP close: a laptop that left the Wi-Fi) is found by the
socket's ping only, up to ``window`` seconds later (engine.io's ping interval + ping timeout), and what was emitted in
that time is lost too.

From the moment the session is on its new socket until the replay is sent (the browser's client asks for it once
its socket connects: a round trip), what the journal keeps is held back, not sent live: a token sent then would land
after the tokens of the gap that the browser still lacks, and the answer would show with a hole until the replay
filled it. The replay carries it. No Chainlit import here: backend/ui/reconnect.py feeds it Chainlit's events.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

STEP_EVENTS = frozenset({"new_message", "update_message", "stream_start"})  # each carries the step's whole dict
STATE_EVENTS = frozenset({"chat_settings", "set_commands", "set_modes"})  # the latest one is the state
PRUNE_MIN = 256  # entries kept before looking for old ones to drop

Event = tuple[str, Any]


@dataclass
class Entry:
    """The latest state of one thing on the browser's screen."""

    data: dict[str, Any]
    touched: float
    gone: bool = False
    output: list[str] = field(default_factory=list)  # tokens streamed into the step since ``data``
    input: list[str] = field(default_factory=list)

    def token(self, token: str, *, sequence: bool, into_input: bool) -> None:
        key, parts = ("input", self.input) if into_input else ("output", self.output)
        if sequence:  # the whole text at once
            self.data = {**self.data, key: token}
            parts.clear()
        else:
            parts.append(token)

    def current(self) -> dict[str, Any]:
        """The step as the browser should show it now."""
        data = dict(self.data)
        for key, parts in (("output", self.output), ("input", self.input)):
            if parts:
                data[key] = str(data.get(key) or "") + "".join(parts)
        return data


class Journal:
    """One session's emitted state (see the module's doc). ``window``: how long before a noticed cut (or before the
    reconnect, when no cut was noticed) emitted events may have been lost."""

    def __init__(self, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window, self.clock = window, clock
        self.entries: dict[tuple[str, str], Entry] = {}  # in the order each was first emitted
        self.away_since: float | None = None  # when the server noticed the socket close
        self.held_since: float | None = None  # when the session got its new socket (until the replay)
        self._prune_at = PRUNE_MIN

    def record(self, event: str, data: Any) -> bool:
        """An event Chainlit emitted to the session's browser (whether it arrived or not). True when the journal
        keeps what it changed (a replay would carry it)."""
        if event in STATE_EVENTS:  # a list (the settings panel's inputs, the commands, the modes)
            self.entries[(event, "")] = Entry({"value": data}, self.clock())
            return True
        if not isinstance(data, dict):
            return False
        if event == "stream_token":
            entry = self.entries.get(("step", str(data.get("id"))))
            if entry is None:
                return False
            entry.token(
                str(data.get("token") or ""),
                sequence=bool(data.get("isSequence")),
                into_input=bool(data.get("isInput")),
            )
            entry.touched = self.clock()
            return True
        kind, gone = self._kind(event)
        if kind is None:
            return False
        key = (kind, str(data.get("id")))
        entry = self.entries.get(key)
        if gone:
            if entry is not None:
                entry.gone, entry.touched = True, self.clock()
            else:
                self.entries[key] = Entry(dict(data), self.clock(), gone=True)
        else:
            self.entries[key] = Entry(dict(data), self.clock())  # replaces the value, keeps the first place
        if len(self.entries) >= self._prune_at:
            self._prune()
        return True

    @staticmethod
    def _kind(event: str) -> tuple[str | None, bool]:
        """What an event is about ("step", "action", "element"), and whether it removes it."""
        if event in STEP_EVENTS:
            return "step", False
        return {
            "delete_message": ("step", True),
            "action": ("action", False),
            "remove_action": ("action", True),
            "element": ("element", False),
            "remove_element": ("element", True),
        }.get(event, (None, False))

    def disconnected(self) -> None:
        """The server noticed the socket close (the first time counts until the next reconnect)."""
        if self.away_since is None:
            self.away_since = self.clock()

    def hold(self) -> None:
        """The session is on a new socket, its replay not sent yet: what the journal keeps waits for the replay."""
        if self.held_since is None:
            self.held_since = self.clock()

    def holds(self, kept: bool) -> bool:
        """Whether an event just recorded (``kept``: by ``record``) is to wait for the replay instead of going out."""
        return kept and self.held_since is not None

    def _cutoff(self) -> float:
        cutoff = (self.away_since if self.away_since is not None else self.clock()) - self.window
        return cutoff if self.held_since is None else min(cutoff, self.held_since)

    def _prune(self) -> None:
        cutoff = self._cutoff()
        self.entries = {k: e for k, e in self.entries.items() if e.touched >= cutoff}
        self._prune_at = max(PRUNE_MIN, 2 * len(self.entries))

    def replay(self) -> Iterator[Event]:
        """The events that bring a reconnected browser's screen up to date: everything changed since ``window``
        before the cut (and all that was held back since the new socket), in the order first emitted. An action
        button is removed before it is added again (the browser's client adds an action twice if told twice). The
        session counts as connected again, and nothing is held back any more.

        Lazily: each thing's state is taken when its event is asked for, so that an event sent right after it
        (a token of an answer still streaming, emitted while the replay is being sent) is never older than the
        state it follows. What first appears during the replay is sent live."""
        cutoff = self._cutoff()
        self.away_since = self.held_since = None
        keys = [key for key, entry in self.entries.items() if entry.touched >= cutoff]
        return self._events(keys)

    def _events(self, keys: list[tuple[str, str]]) -> Iterator[Event]:
        added: list[Event] = []
        for key in keys:
            entry = self.entries.get(key)
            if entry is None:
                continue
            kind = key[0]
            if kind == "step":
                yield ("delete_message", entry.data) if entry.gone else ("new_message", entry.current())
            elif kind == "action":
                yield ("remove_action", entry.data)
                if not entry.gone:
                    added.append(("action", entry.data))
            elif kind == "element":
                yield ("remove_element" if entry.gone else "element", entry.data)
            else:
                yield (kind, entry.data["value"])
        yield from added
