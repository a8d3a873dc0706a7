"""A ``Service`` wired to a fake vLLM (tests/unit/adapters/test_runtime.py's ``FakeVLLM`` behind ``serve``): the
poller's view is the base, the static adapters named, and whatever the fake has loaded, read live at each call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backend.chat.health import HealthStatus, ModelEntry
from backend.chat.service import Service
from backend.settings import Settings


class EnginePoller:
    """The poller's view of the fake engine: ``base``, the ``static`` adapters, then what the fake has loaded."""

    def __init__(self, fake: Any, base: str, static: Sequence[str] = ()) -> None:
        self.fake, self.base, self.static = fake, base, tuple(static)

    @property
    def status(self) -> HealthStatus:
        adapters = [ModelEntry(n, parent=self.base) for n in (*self.static, *self.fake.loaded)]
        return HealthStatus(models=(ModelEntry(self.base), *adapters), base_model=self.base)

    async def refresh(self) -> HealthStatus:
        return self.status


def on_fake_engine(settings: Settings, url: str, fake: Any, static: Sequence[str] = ()) -> Service:
    """A Service for ``settings`` talking to the fake at ``url`` (its key), its poller the fake's view."""
    service = Service(settings)
    service.base_url, service.api_key = url, fake.api_key
    service._poller = EnginePoller(fake, settings.model.served_model_name, static)  # type: ignore[assignment]
    return service
