"""The body limit: 413 on a declared or a streamed body over the route's limit, before the route reads it whole."""

from __future__ import annotations

from typing import Any

import pytest

from backend.web.body_limit import BodyLimitMiddleware, BodyLimits, BodyTooLarge


class Route:
    """An ASGI app that reads the whole body (as FastAPI does before the login check) and answers 200."""

    def __init__(self) -> None:
        self.bodies: list[int] = []
        self.ran = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.ran = True
        size = 0
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        self.bodies.append(size)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(app: Any, path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """(status, chunks the client had to hand over)."""
    handed = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal handed
        handed += 1
        if handed > len(chunks):
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunks[handed - 1], "more_body": handed < len(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    await app(scope, receive, send)
    return int(sent[0]["status"]), handed


@pytest.mark.parametrize(
    ("path", "limit"),
    [
        ("/project/thread", 1024 * 1024),
        ("/project/file", 1024 * 1024),
        ("/login", 64 * 1024),
        ("/ws/socket.io/", 16 * 1024 * 1024 + 1024 * 1024),
        ("/ws/socket.io", 16 * 1024 * 1024 + 1024 * 1024),
    ],
)
def test_limits_per_route(path, limit):
    assert BodyLimits().limit_for(path) == limit


@pytest.mark.asyncio
async def test_a_declared_20_mb_json_body_is_refused_before_the_route_runs():
    route = Route()
    status, handed = await call(
        BodyLimitMiddleware(route), "/project/thread", [b"{}"], [(b"content-length", str(20 << 20).encode())]
    )
    assert (status, handed, route.ran) == (413, 0, False)


@pytest.mark.asyncio
async def test_a_content_length_that_is_no_number_is_refused():
    route = Route()
    status, _ = await call(BodyLimitMiddleware(route), "/project/thread", [b"{}"], [(b"content-length", b"1e9")])
    assert status == 413 and not route.ran


@pytest.mark.asyncio
async def test_a_streamed_body_stops_at_the_chunk_past_the_limit():
    route = Route()
    chunks = [b"x" * 64 * 1024] * 2000  # 125 MiB offered, chunked (no Content-Length)
    status, handed = await call(BodyLimitMiddleware(route), "/project/file", chunks, [])
    assert status == 413
    assert handed == 17  # 16 chunks make 1 MiB; the 17th crosses it, nothing after it is asked for
    assert route.bodies == []


@pytest.mark.asyncio
async def test_a_body_within_the_limit_reaches_the_route_whole():
    route = Route()
    chunks = [b"x" * 1000] * 10
    status, _ = await call(BodyLimitMiddleware(route), "/project/thread", chunks, [(b"content-length", b"10000")])
    assert status == 200 and route.bodies == [10000]


@pytest.mark.asyncio
async def test_a_route_that_swallows_the_error_gets_a_disconnect_and_the_client_413():
    class Swallowing(Route):
        async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            try:
                await super().__call__(scope, receive, send)
            except BodyTooLarge:
                assert (await receive())["type"] == "http.disconnect"

    status, _ = await call(BodyLimitMiddleware(Swallowing()), "/feedback", [b"x" * 700_000] * 3, [])
    assert status == 413


@pytest.mark.asyncio
async def test_websockets_pass_untouched():
    seen = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    await BodyLimitMiddleware(app)({"type": "websocket", "path": "/ws/socket.io/"}, None, None)
    assert seen == ["websocket"]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([(b"content-length", str(20 << 20).encode())], 401),  # no token at all: refused, nothing read
        ([(b"cookie", b"theme=dark; other=1"), (b"content-length", b"10")], 401),
        ([(b"cookie", b"theme=dark; access_token=abc"), (b"content-length", b"10")], 200),
        ([(b"cookie", b"access_token_0=ab; access_token_1=c"), (b"content-length", b"10")], 200),  # split cookie
        ([(b"authorization", b"Bearer abc"), (b"content-length", b"10")], 200),
    ],
    ids=["nothing", "other-cookies", "cookie", "split-cookie", "header"],
)
async def test_with_login_an_upload_without_any_token_is_refused_before_its_body_is_read(headers, status):
    """With login on, POST /project/file's limit is a whole file: a request with no token at all gets 401 at once
    (the body flood without a cookie); one with a token goes on to Chainlit's own check."""
    route = Route()
    limits = BodyLimits(upload=21 << 20, upload_needs_login=True)
    got, handed = await call(BodyLimitMiddleware(route, limits=limits), "/project/file", [b"x" * 10], headers)
    assert (got, route.ran) == (status, status == 200)
    if status == 401:
        assert handed == 0


@pytest.mark.asyncio
async def test_without_login_an_upload_needs_no_token_and_other_routes_are_not_asked_for_one():
    route = Route()
    assert (await call(BodyLimitMiddleware(route), "/project/file", [b"x"], [(b"content-length", b"1")]))[0] == 200
    limits = BodyLimits(upload=21 << 20, upload_needs_login=True)
    got, _ = await call(BodyLimitMiddleware(route, limits=limits), "/project/thread", [b"{}"], [])
    assert got == 200
