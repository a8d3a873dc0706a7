"""What the launcher tells the UI process: environment variables, two files in the log folder.

    launcher (backend/launcher)                        UI (app.py, backend/ui, backend/chat)
    ───────────────────────────────────────────────    ─────────────────────────────────────────────
    env QWENCHAT_ENGINE_API_KEY  launch.serve      →   settings.load_settings: the engine's key
    env QWENCHAT_STATUS_FILE     launch.serve      →   service.from_environment → the health poller
    env QWENCHAT_LOG_DIR         launch.serve      →   service.excluded_adapters
    env QWENCHAT_ENGINE          launch.serve      →   (nobody yet: gpu / cpu / external, for logs)
    env QWENCHAT_ENGINE_PYTHON   start.sh, test.sh →   launch.engine_python (and merge, __main__)
    <log dir>/engine-status.json supervisor        →   health poller, every poll: EngineStatus.read
    <log dir>/adapters-excluded.json launch.serve  →   service.excluded_adapters: {name: diagnosis}
    <log dir>/engine-status-replica-<i>.json  fleet  →   (with a [fleet]: local replica i's supervisor; the main
                                                         status file then describes vllm-router)

With an external engine (OPENAI_BASE_URL) there is no supervisor: no status file, no
QWENCHAT_STATUS_FILE, no API key from the launcher. The UI also inherits the launcher's whole
environment (QWENCHAT_CONFIG, QWENCHAT_PROFILE, QWENCHAT_<SECTION>_<KEY>), so it loads the same
settings.

The status file is one JSON object (``EngineStatus``), replaced atomically on every change:

    state         SupervisorState value: [preparing →] starting → running → restarting → … → down | stopped
    pid           the engine process (leader of its process group), or null when none was launched
    attempt       restarts within the window (0 for the first start)
    max_attempts  [supervision].restart_attempts
    reason        the cause alone, a catalog text {"key": "cause.engine_hung", "params": {...}} (backend/text.py Text;
                  null when none); the UI makes it in the viewer's language and adds "attempt 2 of 5"
    cause         log_diagnosis kind ("oom_gpu", "unknown" …), "hung" (the supervisor's probe), "" when none
    message       the whole sentence, for people reading the file (the UI does not show it)
    log_path      the engine log
    since         epoch: this state began
    updated       epoch: the file was written
    phase         while preparing: "install_engine", "convert_model" or "download_model" (PHASE_*); "" otherwise
    progress      while preparing: percent done of that phase (0–100), or null when unknown
    bytes_done    while downloading the model: bytes on disk so far (null otherwise)
    bytes_total   while downloading the model: bytes of the files it fetches (null otherwise)
    bytes_rate    while downloading the model: bytes per second over the last seconds (null otherwise)

``preparing`` (the launcher builds the engine environment and the model while the UI is already up) and the
phase/progress keys came later, the bytes_* keys later still: an older UI ignores the keys and reads the state as
unknown text (it then decides from HTTP alone: "starting"); a newer UI reads an older file's missing keys as "" and
null. Before the catalog became data (#21) ``reason`` was English text beside ``reason_zh``: such a file reads
as that English text, untranslated (``Text.verbatim``), until the launcher writes the file again.

This module is shared by both sides: it imports nothing from either side.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .text import Text

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- names

#: In the log folder; written by the supervisor, read by the UI's health poller (via ENV_STATUS_FILE).
STATUS_FILE_NAME = "engine-status.json"
#: In the log folder; written by launch.serve ({adapter: diagnosis}), read by service.excluded_adapters.
EXCLUDED_ADAPTERS_FILE_NAME = "adapters-excluded.json"

#: In the log folder, with a [fleet]: local replica ``index``'s supervisor status (an EngineStatus, like the
#: main file, which then describes the router). Written by engine/fleet.py; the UI polls replicas over HTTP
#: (Settings.replica_urls) and may read these for the cause of a restart.
REPLICA_STATUS_FILE_NAME = "engine-status-replica-{index}.json"


def replica_status_file_name(index: int) -> str:
    return REPLICA_STATUS_FILE_NAME.format(index=index)


#: In the log folder: the UI process's own restarts (an EngineStatus: state, attempt, cause, reason, since), written
#: by engine/ui_keeper.py when the UI died and was started again; read by the new UI (status line, chat note).
UI_STATUS_FILE_NAME = "ui-status.json"


#: Set by launch.serve when it supervises an engine; read by service.from_environment (status file path).
ENV_STATUS_FILE = "QWENCHAT_STATUS_FILE"
#: Set by launch.serve (the log folder); read by service.excluded_adapters.
ENV_LOG_DIR = "QWENCHAT_LOG_DIR"
#: Set by launch.serve (the per-launch key, never logged); read by settings.load_settings.
ENV_ENGINE_API_KEY = "QWENCHAT_ENGINE_API_KEY"
#: Set by launch.serve ("gpu", "cpu" or "external"); read by nobody yet, there for people and logs.
ENV_ENGINE = "QWENCHAT_ENGINE"
#: Set by start.sh / test.sh (the engine environment's python); read by launch.engine_python.
ENV_ENGINE_PYTHON = "QWENCHAT_ENGINE_PYTHON"


#: EngineStatus.phase while PREPARING: the engine environment is being installed (progress: percent).
PHASE_INSTALL_ENGINE = "install_engine"
#: EngineStatus.phase while PREPARING: the embedded model is being converted (no progress).
PHASE_CONVERT_MODEL = "convert_model"
#: EngineStatus.phase while PREPARING: [model] path's hub id is being downloaded (progress, bytes_*).
PHASE_DOWNLOAD_MODEL = "download_model"


# ---------------------------------------------------------------- the status file


class SupervisorState(enum.StrEnum):
    """What the supervisor is doing; not the UI's EngineState, which the poller derives from it and HTTP."""

    PREPARING = "preparing"  # the launcher builds what the engine needs (phase, progress); no engine process yet
    STARTING = "starting"  # first launch, not healthy yet
    RUNNING = "running"  # /health answered 200
    RESTARTING = "restarting"  # it crashed or hung; relaunched (reason, attempt say why and which)
    DOWN = "down"  # the first start failed, or too many restarts: given up
    STOPPED = "stopped"  # the launcher stopped it (Ctrl-C, SIGTERM)


@dataclass(frozen=True)
class EngineStatus:
    """One snapshot of the status file. ``state`` is a str only when a newer launcher wrote a state
    this version does not know; the UI then decides from HTTP alone, as it always has."""

    state: SupervisorState | str
    pid: int | None = None
    attempt: int | None = None
    max_attempts: int | None = None
    reason: Text | None = None
    cause: str = ""
    message: str = ""
    log_path: str = ""
    since: float | None = None
    updated: float | None = None
    phase: str = ""
    progress: int | None = None
    bytes_done: int | None = None
    bytes_total: int | None = None
    bytes_rate: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.state, SupervisorState):
            try:
                object.__setattr__(self, "state", SupervisorState(self.state))
            except ValueError:
                pass  # unknown: kept as text

    def to_json(self) -> dict[str, Any]:
        """The file's object: every field, in order; ``updated`` is now unless set."""
        data = dataclasses.asdict(self)
        data["state"] = self.state.value if isinstance(self.state, SupervisorState) else self.state
        data["reason"] = self.reason.to_json() if self.reason is not None else None
        if data["updated"] is None:
            data["updated"] = time.time()
        return data

    def write(self, path: Path) -> None:
        """Atomically replace ``path``: a reader sees the old file or the new one, never half of one."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), ensure_ascii=False))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> EngineStatus | None:
        """The file's snapshot; None when it is missing, garbled or has no text ``state``.

        Never raises: a field of the wrong type reads as its empty value (None or ""), because the
        UI polls this every second and must keep going whatever the file holds.
        """
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            logger.debug("supervisor status file %s unreadable: %s", path, exc)
            return None
        if not isinstance(data, dict) or not isinstance(data.get("state"), str):
            return None

        def num(key: str, tp: type) -> Any:
            v = data.get(key)
            # json reads NaN/Infinity as floats, which int() refuses
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            return tp(v) if ok else None

        def text(key: str) -> str:
            v = data.get(key)
            return v if isinstance(v, str) else ""

        return cls(
            state=data["state"],
            pid=num("pid", int),
            attempt=num("attempt", int),
            max_attempts=num("max_attempts", int),
            reason=_reason(data.get("reason")),
            cause=text("cause"),
            message=text("message"),
            log_path=text("log_path"),
            since=num("since", float),
            updated=num("updated", float),
            phase=text("phase"),
            progress=num("progress", int),
            bytes_done=num("bytes_done", int),
            bytes_total=num("bytes_total", int),
            bytes_rate=num("bytes_rate", int),
        )


def _reason(value: Any) -> Text | None:
    """The file's ``reason``: a catalog text, or an older launcher's English words (read as they are)."""
    if isinstance(value, str):
        return Text.verbatim(value) if value else None
    return Text.from_json(value)
