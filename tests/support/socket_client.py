"""A chat session over Chainlit's real socket protocol, as the browser speaks it (no browser).

What Chainlit 2.12's frontend does, and so this client:
- connects a Socket.IO client to ``<app>/ws/socket.io`` (websocket transport), with the auth payload
  ``{clientType: "webapp", sessionId: <uuid4>, threadId: "", userEnv: "{}", chatProfile: ""}`` and the
  browser's ``Accept-Language`` (the app picks its language from it); no Origin header unless given
  (a Python client without Origin follows the normal rules of the app's Origin check);
- emits ``connection_successful``, after which the server runs ``on_chat_start`` as a task (``task_start``,
  the settings panel ``chat_settings``, ``task_end``): the chat is open at that ``task_end`` (a message sent
  earlier would be answered inside on_chat_start's task, as in the browser);
- sends a message as ``client_message`` ``{message: {id, type: "user_message", output, ...}, fileReferences}``;
- receives ``task_start``, steps (``new_message`` / ``update_message`` / ``delete_message``), the answer as
  ``stream_start`` (its first text is in the step's ``output``) then ``stream_token`` events — each may carry
  several tokens (the app coalesces them) — and the final ``new_message`` with the whole content; the turn
  ends with the first ``task_end`` after a ``task_start`` that came after the message.

``Session.send`` returns a ``Turn`` with everything that arrived for that message and its timings.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import socketio

ENGINEIO_PING = 2  # engine.io's packet type of a PING (engineio.packet.PING)
INTERRUPTED = "answer interrupted"  # backend/text.py "interrupted" (en), inside the ⚠ marker line


class TransportLog:
    """python-engineio's logger for one session: its warnings and errors kept (why the transport gave up: "Server sent
    close packet data 1011, aborting", "packet queue is empty, aborting", ...), the rest dropped."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _keep(self, msg: str, *args: Any, **_kwargs: Any) -> None:
        self.lines.append(f"{msg % args if args else msg} at {time.monotonic():.1f} s")

    warning = error = exception = critical = _keep

    def info(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    debug = info


@dataclass
class Turn:
    """One user message and what came back for it."""

    text: str
    message_id: str
    sent_at: float
    first_token_at: float | None = None
    done_at: float | None = None
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> newest step dict
    order: list[str] = field(default_factory=list)  # step ids in order of first appearance
    streamed: dict[str, str] = field(default_factory=dict)  # id -> text streamed so far
    token_events: int = 0
    started: bool = False  # a task_start arrived for it
    deleted: set[str] = field(default_factory=set)
    disconnected: bool = False

    @property
    def finished(self) -> bool:
        return self.done_at is not None

    def messages(self, kind: str = "assistant_message") -> list[dict[str, Any]]:
        return [self.steps[i] for i in self.order if i not in self.deleted and self.steps[i].get("type") == kind]

    @property
    def answers(self) -> list[str]:
        """Final contents of the assistant bubbles that are not errors (a cut answer included)."""
        return [m.get("output") or "" for m in self.messages() if not m.get("isError")]

    @property
    def errors(self) -> list[str]:
        return [m.get("output") or "" for m in self.messages() if m.get("isError")]

    @property
    def interrupted(self) -> bool:
        return any(INTERRUPTED in a for a in self.answers)

    @property
    def answered(self) -> bool:
        """A whole answer arrived (its task ended on the socket; not cut, no error)."""
        return (
            self.finished and not self.disconnected and bool(self.answers) and not self.interrupted and not self.errors
        )

    @property
    def outcome(self) -> str:
        if not self.finished:
            return "unfinished"
        if self.errors and self.interrupted:
            return "interrupted+error"
        if self.interrupted:
            return "interrupted"
        if self.errors:
            return "error"
        return "answered" if self.answers else "silent"

    @property
    def first_token_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    @property
    def total_s(self) -> float | None:
        return None if self.done_at is None else self.done_at - self.sent_at

    def summary(self) -> str:
        return json.dumps(
            {
                "sent": self.text[:80],
                "outcome": self.outcome,
                "disconnected": self.disconnected,
                "answers": self.answers,
                "errors": self.errors,
            },
            ensure_ascii=False,
        )[:1500]


class Session:
    """One browser tab's chat session, over one socket; ``async with Session(url) as s: await s.send("hi")``."""

    def __init__(
        self,
        url: str,
        *,
        language: str = "en-US",
        origin: str | None = None,
        chat_start: bool = True,
        cookie: str | None = None,
    ) -> None:
        """``chat_start=False`` for an app without ``on_chat_start`` (open once connected); ``cookie``: the
        ``Cookie`` header of a logged-in browser (``login_cookie``)."""
        self.url = url.rstrip("/")
        self.cookie = cookie
        self.chat_start = chat_start
        self.language = language
        self.origin = origin
        self.session_id = str(uuid.uuid4())
        self.transport_log = TransportLog()
        self.sio = socketio.AsyncClient(
            reconnection=False, websocket_extra_options={"max_msg_size": 0}, engineio_logger=self.transport_log
        )
        self.closing = False  # close() called: the disconnect that follows is this client's own
        self.turns: list[Turn] = []
        self.current: Turn | None = None
        self.opened = asyncio.Event()
        self.settings: list[dict[str, Any]] = []
        self.events: dict[str, int] = {}
        self.disconnects = 0
        self.disconnect_log: list[str] = []  # "<reason> at <monotonic> s[, mid-turn 'text']", one per disconnect
        self.pings: list[float] = []  # when engine.io's pings arrived (time.monotonic()); each is answered at once
        self._done = asyncio.Event()
        self._watch_pings()
        self._stream_types: dict[str, str] = {}
        for name in ("new_message", "update_message"):
            self.sio.on(name, self._step_handler(name))
        self.sio.on("stream_start", self._on_stream_start)
        self.sio.on("stream_token", self._on_stream_token)
        self.sio.on("delete_message", self._on_delete)
        self.sio.on("task_start", self._on_task_start)
        self.sio.on("task_end", self._on_task_end)
        self.sio.on("chat_settings", self._on_settings)
        self.sio.on("disconnect", self._on_disconnect)
        self.sio.on("*", self._on_other)

    def _watch_pings(self) -> None:
        """Note each engine.io PING as it arrives (python-engineio has no event for them)."""
        eio = self.sio.eio
        receive = eio._receive_packet

        async def receive_packet(pkt: Any) -> None:
            if pkt.packet_type == ENGINEIO_PING:
                self.pings.append(time.monotonic())
            await receive(pkt)

        eio._receive_packet = receive_packet

    # ------------------------------------------------------------ connection

    async def connect(self, timeout: float = 30) -> Session:
        headers = {"Accept-Language": self.language}
        if self.origin:
            headers["Origin"] = self.origin
        if self.cookie:
            headers["Cookie"] = self.cookie
        auth = {
            "clientType": "webapp",
            "sessionId": self.session_id,
            "threadId": "",
            "userEnv": "{}",
            "chatProfile": "",
        }
        await self.sio.connect(
            self.url,
            headers=headers,
            auth=auth,
            transports=["websocket"],
            socketio_path="/ws/socket.io",
            wait_timeout=timeout,
        )
        await self.sio.emit("connection_successful")
        if self.chat_start:
            await asyncio.wait_for(self.opened.wait(), timeout)
        return self

    async def close(self) -> None:
        self.closing = True
        await self.sio.disconnect()

    async def __aenter__(self) -> Session:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return bool(self.sio.connected)

    @property
    def sid(self) -> str | None:
        sid: str | None = self.sio.get_sid()  # python-socketio is untyped
        return sid

    # ------------------------------------------------------------ a turn

    async def start(
        self,
        text: str,
        *,
        message_id: str | None = None,
        kind: str = "user_message",
        overlap: bool = False,
        modes: dict[str, str] | None = None,
        files: list[str] | None = None,
    ) -> Turn:
        """Send a message; the returned Turn fills in as events arrive (``wait`` for its end).

        ``message_id``, ``kind``: what a browser other than Chainlit's page may put in the message (a reused id, a
        step type); ``overlap``: send while the previous message is still being answered."""
        if self.current is not None and not self.current.finished and not overlap:
            raise RuntimeError("the previous message is still being answered")
        mid = message_id or str(uuid.uuid4())
        turn = Turn(text=text, message_id=mid, sent_at=time.monotonic())
        self.current = turn
        self.turns.append(turn)
        self._done.clear()
        step: dict[str, Any] = {
            "threadId": "",
            "id": mid,
            "name": "User",
            "type": kind,
            "output": text,
            "createdAt": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "metadata": {"location": self.url + "/"},
        }
        if modes:
            step["modes"] = modes
        references = [{"id": f} for f in files or []]  # ids Chainlit's upload route gave (``POST /project/file``)
        await self.sio.emit("client_message", {"message": step, "fileReferences": references})
        return turn

    async def wait(self, timeout: float) -> Turn:
        """Wait (bounded) for the current turn's ``task_end``; an unfinished turn is returned as is."""
        turn = self.current
        assert turn is not None
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except TimeoutError:
            pass
        return turn

    async def send(self, text: str, timeout: float = 60, modes: dict[str, str] | None = None) -> Turn:
        await self.start(text, modes=modes)
        return await self.wait(timeout)

    # ------------------------------------------------------------ events

    def _count(self, name: str) -> None:
        self.events[name] = self.events.get(name, 0) + 1

    def _step_handler(self, name: str) -> Any:
        async def handler(step: dict[str, Any]) -> None:
            self._count(name)
            turn = self.current
            if turn is None or turn.finished or not isinstance(step, dict) or "id" not in step:
                return
            sid = step["id"]
            if sid not in turn.steps:
                turn.order.append(sid)
            turn.steps[sid] = step

        return handler

    async def _on_stream_start(self, step: dict[str, Any]) -> None:
        self._count("stream_start")
        turn = self.current
        if turn is None or turn.finished:
            return
        sid = step["id"]
        self._stream_types[sid] = step.get("type", "")
        if sid not in turn.steps:
            turn.order.append(sid)
            turn.steps[sid] = step
        turn.streamed[sid] = step.get("output") or ""
        if step.get("type") == "assistant_message" and turn.first_token_at is None:
            turn.first_token_at = time.monotonic()

    async def _on_stream_token(self, data: dict[str, Any]) -> None:
        self._count("stream_token")
        turn = self.current
        if turn is None or turn.finished:
            return
        sid, token = data.get("id", ""), data.get("token") or ""
        turn.token_events += 1
        if data.get("isSequence"):
            turn.streamed[sid] = token
        else:
            turn.streamed[sid] = turn.streamed.get(sid, "") + token
        if self._stream_types.get(sid) == "assistant_message" and turn.first_token_at is None:
            turn.first_token_at = time.monotonic()

    async def _on_delete(self, step: dict[str, Any]) -> None:
        self._count("delete_message")
        if self.current is not None and isinstance(step, dict):
            self.current.deleted.add(step.get("id", ""))

    async def _on_task_start(self, *args: Any) -> None:
        self._count("task_start")
        if self.current is not None:
            self.current.started = True

    async def _on_task_end(self, *args: Any) -> None:
        self._count("task_end")
        turn = self.current
        if turn is None:
            if self.settings:  # on_chat_start's task is over: the chat is open
                self.opened.set()
        elif turn.started and not turn.finished:
            turn.done_at = time.monotonic()
            self._done.set()

    async def _on_settings(self, data: Any) -> None:
        self._count("chat_settings")
        self.settings.append(data)

    async def _on_disconnect(self, *args: Any) -> None:
        """python-socketio passes the reason ("transport error", "server disconnect", "client disconnect"); engine.io's
        own words, if it gave up, are in ``transport_log``. A close of this client's own (``close()``) is not
        counted, and does not mark an unfinished turn as cut."""
        entry = f"{args[0] if args else 'no reason'} at {time.monotonic():.1f} s"
        if self.transport_log.lines:
            entry += f" (engine.io: {self.transport_log.lines[-1]})"
        if self.closing:
            self.disconnect_log.append(entry + ", closed by this client")
            return
        self.disconnects += 1
        if self.current is not None and not self.current.finished:
            self.current.disconnected = True
            entry += f", mid-turn {self.current.text[:30]!r}"
            self._done.set()
        self.disconnect_log.append(entry)

    async def _on_other(self, event: str, *args: Any) -> None:
        self._count(event)


def login_cookie(url: str, username: str, password: str) -> str:
    """``POST /login`` as the login form does; the ``Cookie`` header that carries the session (``Session(cookie=)``)."""
    import urllib.parse
    import urllib.request

    form = urllib.parse.urlencode({"username": username, "password": password}).encode()
    with urllib.request.urlopen(urllib.request.Request(url.rstrip("/") + "/login", data=form), timeout=10) as resp:
        return "; ".join(c.split(";")[0] for c in resp.headers.get_all("set-cookie") or [])


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]
