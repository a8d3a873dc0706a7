"""The operator's ``/status``: the engine(s) and replicas, the adapters loaded and their slots, the queue, the answers
streaming per account, the downloads, the disk. Pure: the numbers in, one Markdown text out, in the reader's
language (the UI's command only gathers them: ``Service.operator_report``).

    report = OperatorReport(status, adapters=[("pirate", 1, False)], slots=4, answering={"bob": 2},
                            downloads=("acme/lora", ["acme/other"]), disk_free=12 * 10**9, disk_path="~/.cache/hf")
    report.text("en")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..hub import human_bytes
from ..text import t
from .health import HealthStatus


@dataclass(frozen=True)
class OperatorReport:
    """What ``/status`` shows; ``adapters``: (name, answers streaming from it, static) per loaded adapter."""

    status: HealthStatus
    adapters: Sequence[tuple[str, int, bool]] = ()
    slots: int = 0  # [lora] max_cpu_loras: adapters the engine keeps at once
    answering: Mapping[str, int] = field(default_factory=dict)  # account -> answers streaming now
    downloads: tuple[str | None, Sequence[str]] = (None, ())  # (running, waiting in order)
    disk_free: int | None = None  # bytes free where the hub's cache is
    disk_path: str = ""

    def text(self, lang: str | None = "en") -> str:
        return "\n".join(
            [
                f"**{t('opstatus.title', lang)}**",
                *self._engine(lang),
                *self._adapters(lang),
                self._streaming(lang),
                self._downloads(lang),
                self._disk(lang),
            ]
        )

    def _engine(self, lang: str | None) -> list[str]:
        st = self.status
        load = st.load
        queue = (
            t("opstatus.queue", lang, running=load.running, waiting=load.waiting) if load else t("opstatus.na", lang)
        )
        lines = [t("opstatus.engine", lang, model=st.base_model or "?", state=st.text(lang), queue=queue)]
        for r in st.replicas:
            why = r.detail.in_(lang) if r.detail is not None else ""
            state = t("opstatus.ready", lang) if r.ready else t("opstatus.not_ready", lang, why=why)
            lines.append(t("opstatus.replica", lang, number=r.number, address=r.address, state=state))
        return lines

    def _adapters(self, lang: str | None) -> list[str]:
        lines = [t("opstatus.adapters", lang, loaded=len(self.adapters), slots=self.slots or "?")]
        for name, streaming, static in self.adapters:
            kind = t("opstatus.static", lang) if static else t("opstatus.runtime", lang)
            lines.append(t("opstatus.adapter", lang, name=name, kind=kind, streaming=streaming))
        return lines

    def _streaming(self, lang: str | None) -> str:
        who = ", ".join(f"{name} {n}" for name, n in sorted(self.answering.items())) or "—"
        return t("opstatus.streaming", lang, total=sum(self.answering.values()), who=who)

    def _downloads(self, lang: str | None) -> str:
        running, waiting = self.downloads
        return t("opstatus.downloads", lang, running=running or "—", waiting=", ".join(waiting) or "—")

    def _disk(self, lang: str | None) -> str:
        free = human_bytes(self.disk_free) if self.disk_free is not None else t("opstatus.na", lang)
        return t("opstatus.disk", lang, free=free, path=self.disk_path)
