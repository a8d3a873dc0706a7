"""Runtime load/unload (``backend/adapters/runtime.py``) against a local fake of vLLM's documented
/v1/(un)load_lora_adapter behaviour."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from backend.adapters.runtime import load_adapter, load_adapter_from_folder, unload_adapter
from backend.errors import (
    AdapterLimitReached,
    AdapterPathRefused,
    AdapterRejected,
    AdapterRuntimeDisabled,
    BackendError,
    ModelNotFound,
    ServerUnreachable,
)

# ---------------------------------------------------------------- runtime load/unload against a fake vLLM


class FakeVLLM:
    """vLLM 0.32's documented answers (DESIGN §3, vllm/entrypoints/serve/lora/api_router.py)."""

    def __init__(self, runtime: bool = True, api_key: str = "k") -> None:
        self.runtime = runtime
        self.api_key = api_key
        self.loaded: dict[str, str] = {}
        self.calls: list[tuple[str, dict]] = []

    @staticmethod
    def _error(status: int, message: str, err_type: str) -> web.Response:
        return web.json_response(
            {"error": {"message": message, "type": err_type, "param": None, "code": status}}, status=status
        )

    async def handle(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        if not self.runtime or request.path not in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            return web.json_response({"detail": "Not Found"}, status=404)  # FastAPI: route not attached
        body = await request.json()
        self.calls.append((request.path, body))
        name = body.get("lora_name")
        if request.path.endswith("/unload_lora_adapter"):
            if name not in self.loaded:
                return self._error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            del self.loaded[name]
            return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
        path = body.get("lora_path")
        if name in self.loaded:
            return self._error(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.",
                "InvalidUserInput",
            )
        if not Path(path).is_dir():
            return self._error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        if (Path(path) / "CRASH").exists():
            return self._error(500, "LoRA rank 32 is greater than max_lora_rank 16.", "InternalServerError")
        self.loaded[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


@contextlib.asynccontextmanager
async def serve(fake: FakeVLLM) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_load_then_unload(folder: Path) -> None:
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            text = await load_adapter(url, "k", "pirate", folder / "pirate")
            assert text == "Success: LoRA adapter 'pirate' added successfully."
            assert fake.loaded == {"pirate": str(folder / "pirate")}
            assert await unload_adapter(url, "k", "pirate") == "Success: LoRA adapter 'pirate' removed successfully."
            assert fake.loaded == {}

    run(go())


def test_loading_the_same_name_twice_is_a_no_op(folder: Path) -> None:
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            await load_adapter(url, "k", "pirate", folder / "pirate")
            text = await load_adapter(url, "k", "pirate", folder / "pirate")
            assert "already been loaded" in text and len(fake.calls) == 2

    run(go())


def test_an_openai_client_can_be_passed_instead_of_a_url(folder: Path) -> None:
    from openai import AsyncOpenAI

    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            client = AsyncOpenAI(base_url=url, api_key="k")
            await load_adapter(client, None, "pirate", folder / "pirate")
            assert "pirate" in fake.loaded
            await client.close()

    run(go())


def test_runtime_loading_disabled_says_which_setting(folder: Path) -> None:
    async def go() -> None:
        async with serve(FakeVLLM(runtime=False)) as url:
            with pytest.raises(AdapterRuntimeDisabled) as exc:
                await load_adapter(url, "k", "pirate", folder / "pirate")
            assert "[lora].runtime_loading = true" in exc.value.user_text()
            with pytest.raises(AdapterRuntimeDisabled):
                await unload_adapter(url, "k", "pirate")

    run(go())


def test_engine_refusal_is_adapter_rejected_with_its_message(folder: Path) -> None:
    (folder / "poet" / "CRASH").write_text("")

    async def go() -> None:
        async with serve(FakeVLLM()) as url:
            with pytest.raises(AdapterRejected) as exc:
                await load_adapter(url, "k", "poet", folder / "poet")
            assert "max_lora_rank 16" in exc.value.user_text() and "500" in exc.value.user_text()

    run(go())


def test_engine_cannot_see_the_path(tmp_path: Path) -> None:
    async def go() -> None:
        async with serve(FakeVLLM()) as url:
            with pytest.raises(AdapterRejected) as exc:
                await load_adapter(url, "k", "ghost", tmp_path / "ghost")
            assert "cannot find" in exc.value.user_text() and "mounted" in exc.value.user_text()

    run(go())


def test_unload_unknown_is_model_not_found() -> None:
    async def go() -> None:
        async with serve(FakeVLLM()) as url:
            with pytest.raises(ModelNotFound) as exc:
                await unload_adapter(url, "k", "ghost")
            assert "'ghost'" in exc.value.user_text()

    run(go())


def test_wrong_api_key_names_the_setting(folder: Path) -> None:
    async def go() -> None:
        async with serve(FakeVLLM(api_key="right")) as url:
            with pytest.raises(BackendError) as exc:
                await load_adapter(url, "wrong", "pirate", folder / "pirate")
            assert "401" in exc.value.user_text() and "OPENAI_API_KEY" in exc.value.user_text()

    run(go())


def test_server_down_is_unreachable(folder: Path) -> None:
    async def go() -> None:
        async with serve(FakeVLLM()) as url:
            pass  # closed again: nothing listens on that port now
        with pytest.raises(ServerUnreachable):
            await load_adapter(url, "k", "pirate", folder / "pirate", timeout=5)

    run(go())


def test_limit_is_enforced_before_calling_the_engine(folder: Path) -> None:
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            with pytest.raises(AdapterLimitReached) as exc:
                await load_adapter(url, "k", "pirate", folder / "pirate", loaded=["a", "b"], limit=2)
            assert "[lora].max_cpu_loras" in exc.value.user_text() and "limit is 2" in exc.value.user_text()
            assert fake.calls == []
            await load_adapter(url, "k", "pirate", folder / "pirate", loaded=["a"], limit=2)
            assert "pirate" in fake.loaded

    run(go())


def test_load_from_folder_refuses_escapes_and_broken_adapters_before_the_engine(folder: Path, base: Path) -> None:
    fake = FakeVLLM()

    async def go() -> None:
        async with serve(fake) as url:
            with pytest.raises(AdapterPathRefused):
                await load_adapter_from_folder(url, "k", folder, "../x", base, 16)
            with pytest.raises(AdapterRejected):
                await load_adapter_from_folder(url, "k", folder, "poet", base, 8)  # rank 16 > 8
            assert fake.calls == []
            d = await load_adapter_from_folder(url, "k", folder, "pirate", base, 16)
            assert d.ok and fake.loaded == {"pirate": str((folder / "pirate").resolve())}

    run(go())
