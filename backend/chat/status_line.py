"""The status line's words (public/status.js polls ``/qwenchat/status``): the engine's state as the poller sees it,
in the viewer's language, and the note after the launcher restarted this UI process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from .. import contract
from ..settings import Settings
from ..text import Text, pick_language, t
from .client import anomaly_counts
from .health import HealthStatus


def status_json(status: HealthStatus, settings: Settings, lang: str | None = "en") -> dict[str, Any]:
    """For the always-visible status line (public/status.js polls it), in the viewer's language: [ui].language
    when it forces one, else ``lang`` (the browser's tag). Every word is made here, from the catalog."""
    st = status
    forced = settings.ui.language
    lang = pick_language(forced if forced != "auto" else lang)
    word = "status.preparing" if st.phase else f"status.{st.state.value}"  # the state's word on the line
    note = ui_restart_note()
    return {
        "state": st.state.value,
        "reason": st.text(lang),
        "elapsed": round(st.starting_elapsed),
        "elapsed_text": t("status.elapsed", lang, seconds=round(st.starting_elapsed)),
        "attempt": st.attempt,
        "max_attempts": st.max_attempts,
        "model": st.base_model or settings.model.name,
        "adapters": [m.id for m in st.adapters],
        "stale": st.models_stale,
        # While the launcher prepares (contract.PHASE_*: "install_engine", "convert_model"), else null.
        "phase": st.phase,
        # Off-spec chunks tolerated since start, by kind (e.g. {"empty_choices": 3}): whose backend misbehaves.
        "anomalies": anomaly_counts(),
        # The catalog language the words are in ("en", "zh-CN", …): [ui].language, else the browser's.
        "lang": lang,
        # The line's state word, and the one the page shows by itself when this server stops answering (it keeps
        # the last it was sent).
        "label": t(word, lang),
        "offline_label": t("status.offline", lang),
        # A fleet ([fleet]): replicas answering their own /health, of how many (0 and 0 without a fleet), each
        # replica by number and host:port (never its URL's credentials), and the count as the line shows it.
        "replicas_ready": st.replicas_ready,
        "replicas_total": st.replicas_total,
        "replicas": [r.to_json(lang) for r in st.replicas],
        "replicas_text": st.replicas_text(lang),
        # A fleet: models some ready replicas serve but not all (so not offered), with the replicas lacking each,
        # and the line's note on them ("" when there are none).
        "partial_models": [{"model": name, "replicas": list(numbers)} for name, numbers in st.partial_models],
        "partial_text": st.partial_text(lang),
        # The UI process itself was restarted by the launcher lately (it died: killed, out of memory, a crash):
        # why, and that the model kept running ("" when it was not, or long ago).
        "ui_note": note.in_(lang) if note else "",
        # vLLM's own load (its /metrics, every replica's): requests generating and queued (null: unknown), and
        # the line's "busy · 8 running, 3 waiting" while some wait ("" otherwise).
        "running": st.load.running if st.load else None,
        "waiting": st.load.waiting if st.load else None,
        "load_text": st.load_text(lang),
    }


def ui_restart_note(*, now: float | None = None, shown_for: float = 600.0) -> Text | None:
    """ "the UI restarted 12 s ago (the UI was killed (SIGKILL) …); the model kept running", for ``shown_for``
    seconds after the launcher restarted this very process (logs/ui-status.json, read once); else None."""
    folder = os.environ.get(contract.ENV_LOG_DIR)
    status = contract.EngineStatus.read(Path(folder) / contract.UI_STATUS_FILE_NAME) if folder else None
    if status is None or status.since is None or status.pid != os.getpid():
        return None  # no restart, or the file describes another process (an older one, a test's)
    ago = max(0, int((time.time() if now is None else now) - status.since))
    if ago > shown_for:
        return None
    when = Text("ui_keeper.ago_seconds", {"n": ago}) if ago < 120 else Text("ui_keeper.ago_minutes", {"n": ago // 60})
    return Text("ui_keeper.restarted", {"ago": when, "reason": status.reason or Text.verbatim("?")})
