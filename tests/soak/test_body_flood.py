"""Request bodies sent without a cookie to the real UI process: a 20 MB JSON body and a 2 GB streamed upload are
refused (413) before they are read, and the UI's peak RSS (VmHWM) stays within a fixed bound of what it was. And a
token logged out is refused, also once the UI has restarted (the revocations are kept in its folder). One launch for
both tests (the flood first), then the restart."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from tests.e2e import support as e2e
from tests.support.live_app import LOGIN_PASSWORD, launched_with_login

pytestmark = [pytest.mark.soak, pytest.mark.product, pytest.mark.asyncio(loop_scope="module")]

JSON_BYTES = 20 * 1024 * 1024
UPLOAD_BYTES = 2 * 1024 * 1024 * 1024
CHUNK = 256 * 1024
WARM = "warm-up done"  # Service.warm_up's last log line
GROWTH_LIMIT_MIB = 48  # the peak may grow by this much over the flood; a body read whole grows it by its size


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for process {pid}")


def page_status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return int(resp.status)


def json_body() -> bytes:
    """20 MB of JSON that parses into a large object (a list of 10M numbers: about 80 MB of Python once read)."""
    ids = b"0," * ((JSON_BYTES - 64) // 2)
    return b'{"threadId": "x", "name": [' + ids + b"0]}"


async def status_of(reader: asyncio.StreamReader) -> int:
    line = await asyncio.wait_for(reader.readline(), 60)
    return int(line.split()[1]) if line.startswith(b"HTTP/") else 0


async def put_json(url: str, body: bytes, *, send_body: bool = True) -> int:
    """PUT /project/thread with a Content-Length, no cookie: the status (0: the connection was reset, as a server
    that answers before reading a body does when it closes). ``send_body`` False: only the headers are sent, so the
    answer can only be one given before reading."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"PUT /project/thread HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    writer.write(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode())
    answer = asyncio.ensure_future(status_of(reader))
    try:
        if send_body:
            writer.write(body)
            await asyncio.wait_for(writer.drain(), 120)
    except (ConnectionError, TimeoutError):
        pass  # refused before the body was read
    try:
        return await answer
    except ConnectionError:
        return 0
    finally:
        writer.close()


async def stream_upload(url: str, total: int) -> tuple[int, int]:
    """POST /project/file chunked (no Content-Length), no cookie, until the server answers or stops reading:
    (status, bytes the server took before that)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    boundary = "qwenchatflood"
    head = (
        f"POST /project/file?session_id=x HTTP/1.1\r\nHost: {host}:{port}\r\nTransfer-Encoding: chunked\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n"
    )
    writer.write(head.encode())
    part = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n\r\n'.encode()
    chunk = part + b"x" * (CHUNK - len(part))
    sent = 0
    answer = asyncio.ensure_future(status_of(reader))
    try:
        while sent < total and not answer.done():
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await asyncio.wait_for(writer.drain(), 30)
            sent += len(chunk)
            chunk = chunk if sent == len(chunk) else b"x" * CHUNK
    except (ConnectionError, TimeoutError):
        pass
    try:
        return await asyncio.wait_for(answer, 60), sent
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        return 0, sent
    finally:
        writer.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def ui(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Path, e2e.LiveApp]]:
    """The product (login on) and its folder, for both tests; the logout test stops it and starts it again there."""
    folder = tmp_path_factory.mktemp("body-flood")
    async with launched_with_login(folder) as app:
        yield folder, app


async def test_a_20_mb_json_body_and_a_2_gb_upload_without_a_cookie_leave_the_ui_memory_bounded(ui):
    _, app = ui
    pid = await asyncio.to_thread(e2e.ui_pid, app)
    # The UI loads its token counter, chat template and SDK client in the background after it starts answering
    # (Service.warm_up: about 100 MiB of tokenizer and imports); the baseline is taken once that is done, so
    # the growth measured is the flood's alone.
    log = await asyncio.to_thread(app.log_with, WARM, "ui", 120)
    assert WARM in log, "the UI never finished its warm-up"
    before = peak_rss_mib(pid)
    declared_status = await put_json(app.url, json_body(), send_body=False)
    json_status = await put_json(app.url, json_body())
    upload_status, uploaded = await stream_upload(app.url, UPLOAD_BYTES)
    after = peak_rss_mib(pid)
    still = await asyncio.to_thread(page_status, app.url)
    print(
        f"\n[body flood] UI peak RSS {before:.0f} MiB before, {after:.0f} MiB after a 20 MB JSON body "
        f"(answer {json_status}) and a streamed upload (answer {upload_status} after {uploaded / 2**20:.0f} MiB sent)"
    )
    assert declared_status == 413, f"a declared 20 MB JSON body was answered {declared_status}"
    assert json_status in (413, 0), f"the 20 MB JSON body was answered {json_status}"
    # 401: refused for having no login token before a byte of it is read; 413: over the limit; 0: cut off
    assert upload_status in (401, 413, 0) and uploaded < UPLOAD_BYTES, "the upload was read to its end"
    assert after - before < GROWTH_LIMIT_MIB, f"peak RSS grew from {before:.0f} to {after:.0f} MiB"
    assert still == 200, "the UI no longer serves its page"


async def signed_in(url: str, other_than: str = "") -> dict[str, str]:
    """The login cookie(s) of a new sign-in as admin. Chainlit's token carries its time to the second: two sign-ins
    within one second get the same token, so with ``other_than`` the sign-in is made again until its token differs."""
    deadline = time.monotonic() + 30
    while True:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            answer = await http.post("/login", data={"username": "admin", "password": LOGIN_PASSWORD})
            assert answer.status_code == 200, answer.text
            cookies = {k: v for k, v in http.cookies.items() if k.startswith("access_token")}
        assert cookies, "no login cookie"
        if "".join(cookies.values()) != other_than or time.monotonic() > deadline:
            return cookies
        await asyncio.sleep(0.2)


async def user_status(url: str, cookies: dict[str, str]) -> int:
    """GET /user with a copy of a login cookie kept aside (as a thief would)."""
    async with httpx.AsyncClient(base_url=url, timeout=60, cookies=cookies) as http:
        return (await http.get("/user")).status_code


async def test_logout_then_the_old_token_is_refused_by_the_real_ui_also_after_it_restarts(ui):
    folder, app = ui
    other = await signed_in(app.url)  # another session, never logged out
    cookies = await signed_in(app.url, other_than="".join(other.values()))
    assert await user_status(app.url, cookies) == 200
    async with httpx.AsyncClient(base_url=app.url, timeout=60, cookies=cookies) as http:
        assert (await http.post("/logout")).status_code == 200
    refused = await user_status(app.url, cookies)
    await asyncio.to_thread(e2e.stop, app)
    async with launched_with_login(folder) as again:  # the UI process started again on the same folder
        after_restart = await user_status(again.url, cookies)
        other_after = await user_status(again.url, other)
    assert refused == 401, f"the token still works after the logout: {refused}"
    assert other_after == 200, f"a session never logged out was refused after the restart: {other_after}"
    assert after_restart == 401, f"the token logged out before the restart works again after it: {after_restart}"
