"""Our HTTP routes (backend/ui/routes.py) as the UI's installation puts them: in front of Chainlit's, once each,
bound to the Service of the latest installation (each test installs the UI afresh against a new Service)."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx
import pytest
import pytest_asyncio

from backend.chat import welcome
from backend.settings import ROOT
from tests.fakes.openai_server import FakeServer

if TYPE_CHECKING:
    from backend.ui.context import Ui
from backend.ui import renderer

pytestmark = pytest.mark.asyncio(loop_scope="module")

RED, GREEN = "#dc2626", "#16a34a"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fake():
    async with FakeServer() as srv:
        yield srv


@contextlib.asynccontextmanager
async def installed_ui(fake: FakeServer, tmp_path, **ui: str) -> AsyncIterator[Ui]:
    """The UI installed afresh with these [ui] settings (QWENCHAT_UI_*), against the fake server."""
    from chainlit.config import config

    import backend.ui
    from backend.chat import health
    from backend.chat.service import Service

    # An installation with login on registers a password callback in Chainlit's config and puts a login secret in
    # os.environ (history.open_history): a later installation takes the callback out, but tests that install
    # nothing would still see both.
    secret_before = os.environ.get("CHAINLIT_AUTH_SECRET")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(config.code, "password_auth_callback", config.code.password_auth_callback)
        mp.setenv("QWENCHAT_CONFIG", str(ROOT / "tests" / "config.toml"))
        mp.setenv("OPENAI_BASE_URL", fake.base_url)
        mp.setenv("OPENAI_API_KEY", "test")
        mp.setenv("QWENCHAT_LOGGING_DIR", str(tmp_path))
        for key in ("QWENCHAT_STATUS_FILE", "QWENCHAT_LOG_DIR", "QWENCHAT_PROFILE"):
            mp.delenv(key, raising=False)
        for key, value in ui.items():
            mp.setenv(f"QWENCHAT_UI_{key.upper()}", value)
        await health.reset_shared()
        module = backend.ui.install(Service.from_environment())
        try:
            yield module
        finally:
            await module.service.poller.stop()
            await module.service.client.aclose()
            await health.reset_shared()
            if secret_before is None:
                os.environ.pop("CHAINLIT_AUTH_SECRET", None)
            else:
                os.environ["CHAINLIT_AUTH_SECRET"] = secret_before


def ours(http_app) -> list:
    from backend.ui.routes import Routes

    return [
        r for r in http_app.router.routes if isinstance(getattr(getattr(r, "endpoint", None), "__self__", None), Routes)
    ]


async def get(path: str) -> httpx.Response:
    from chainlit.server import app as http_app

    transport = httpx.ASGITransport(app=http_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as client:
        return await client.get(path)


async def test_a_second_installation_replaces_the_routes_bound_to_the_first_service(fake, tmp_path):
    from chainlit.server import app as http_app

    logo = tmp_path / "logo.svg"
    logo.write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    async with installed_ui(fake, tmp_path, accent=RED, logo=str(logo), language="en") as first:
        assert welcome.accent_hsl(RED) in (await get("/qwenchat/style.css")).text
        assert (await get("/logo")).text == logo.read_text()
        assert (await get("/qwenchat/status")).json()["lang"] == "en"
        assert {r.endpoint.__self__.service for r in ours(http_app)} == {first.service}
    async with installed_ui(fake, tmp_path, accent=GREEN, language="zh") as second:
        routes = ours(http_app)
        assert {r.endpoint.__self__.service for r in routes} == {second.service}  # none left bound to the first
        counts = Counter((r.path, tuple(sorted(r.methods))) for r in routes)
        assert counts == {
            ("/qwenchat/status", ("GET",)): 1,
            ("/metrics", ("GET",)): 1,
            ("/qwenchat/style.css", ("GET",)): 1,
            **{(f"/assets/{b.name}", ("GET",)): 1 for b in renderer.patched_bundles(renderer.chainlit_assets())},
        }
        css = (await get("/qwenchat/style.css")).text
        assert welcome.accent_hsl(GREEN) in css and welcome.accent_hsl(RED) not in css
        assert (await get("/qwenchat/status?lang=en-US")).json()["lang"] == "zh-CN"  # [ui].language forces it
        assert (await get("/logo")).text != logo.read_text()  # Chainlit's own /logo again
        # ours come before Chainlit's routes (its SPA catch-all last of all)
        assert [id(r) for r in http_app.router.routes[: len(routes)]] == [id(r) for r in routes]


async def test_chainlits_main_script_is_served_without_directives_or_alerts(fake, tmp_path):
    """#22: key:value is not a text directive, :::info not an alert; the other assets are Chainlit's files."""
    (shipped,) = [p for p in renderer.chainlit_assets().glob("index-*.js")]
    async with installed_ui(fake, tmp_path):
        first = await get(f"/assets/{shipped.name}")
        assert first.status_code == 200 and first.headers["content-type"].startswith("text/javascript")
        assert renderer.ALERT_PATTERN not in first.text and renderer.DIRECTIVE_SYNTAX.search(first.text) is None
        assert len(first.text) < len(shipped.read_text(encoding="utf-8"))
        etag = first.headers["etag"]
        from chainlit.server import app as http_app

        transport = httpx.ASGITransport(app=http_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as client:
            again = await client.get(f"/assets/{shipped.name}", headers={"If-None-Match": etag})
        assert again.status_code == 304
        other = sorted(renderer.chainlit_assets().glob("*.css"))[0]
        assert (await get(f"/assets/{other.name}")).content == other.read_bytes()


async def test_a_second_installation_without_login_takes_the_first_ones_login_and_history_out(fake, tmp_path):
    """Chainlit keeps its callbacks in one global config: an installation sets or clears every one it owns."""
    from chainlit.config import config

    async with installed_ui(fake, tmp_path, auth="true", password="pw") as first:
        assert first.history.url and config.code.data_layer is not None
        assert config.code.password_auth_callback is not None and config.code.on_shared_thread_view is not None
        async with installed_ui(fake, tmp_path, auth="false"):  # (the first one's variables are still set)
            assert config.code.password_auth_callback is None and config.code.data_layer is None
            assert config.code.on_shared_thread_view is None and config.features.allow_thread_sharing is False
