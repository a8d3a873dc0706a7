"""The operator's ``/status``: the engine(s) and replicas, the adapters loaded and their slots, the queue, the answers
streaming per account, the downloads, the disk. Pure: the numbers in, one Markdown text out, in the reader's
language; ``gather`` reads them from the service (``Service.operator_report`` checks the role first).

    report = OperatorReport(status, adapters=[("pirate", 1, False)], slots=4, answering={"bob": 2},
                            downloads=("acme/lora", ["acme/other"]), disk_free=12 * 10**9, disk_path="~/.cache/hf")
    report.text("en")
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..hub import hub_cache_dir, human_bytes
from ..text import t
from .health import HealthStatus

if TYPE_CHECKING:
    from .service import Service


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


async def gather(service: Service, answering: Mapping[str, int], lang: str | None) -> str:
    """The report from the service's state now (a fresh poll); ``answering``: the UI's fair share, per account."""
    status = await service.poller.refresh()
    static = service.static_adapters()
    adapters = [(m.id, service.adapter_usage.answering(m.id), m.id in static) for m in status.adapters]
    folder = hub_cache_dir()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = await asyncio.to_thread(lambda: shutil.disk_usage(folder).free)
    report = OperatorReport(
        status,
        adapters=adapters,
        slots=service.settings.lora.max_cpu_loras,
        answering=answering,
        downloads=(service.downloads.running, service.downloads.waiting),
        disk_free=free,
        disk_path=str(hub_cache_dir()),
    )
    return report.text(lang)
