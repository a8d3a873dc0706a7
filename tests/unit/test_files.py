"""The original files kept with a chat ([uploads] keep_originals: backend/storage/files.py) and their route
(backend/ui/routes.py ``original_file``), on Chainlit's real SQLAlchemyDataLayer and a real SQLite file: the owner
downloads them, a viewer only once the chat is shared, nobody without a login or a file the chat does not name, and
deleting the chat deletes them."""

from __future__ import annotations

import types
import uuid

import pytest
import pytest_asyncio
from starlette.requests import Request

from backend.chat.documents import Document
from backend.settings import Settings, UISettings
from backend.storage import datalayer, history
from backend.storage.files import LocalFileStore
from backend.ui import routes as routes_mod
from tests.unit.chat.test_datalayer import chainlit_layer, new_thread

pytestmark = pytest.mark.asyncio

ORIGINAL = b"%PDF-1.4 the original bytes \x00\xff"


@pytest_asyncio.fixture
async def kept(tmp_path, monkeypatch):
    """A chat by "admin" whose message names a kept original; (routes, layer, store, thread id, file id)."""
    import chainlit as cl

    store = LocalFileStore(tmp_path / "originals")
    layer = datalayer.GuardedDataLayer(chainlit_layer(tmp_path / "history.sqlite3"), files=store)
    monkeypatch.setattr(routes_mod, "get_data_layer", lambda: layer)
    routes = routes_mod.Routes(types.SimpleNamespace(settings=Settings(ui=UISettings(language="en"))), sharing=True)
    routes.files = store
    thread_id, file_id = await new_thread(layer), str(uuid.uuid4())
    source = tmp_path / "upload"
    source.write_bytes(ORIGINAL)
    await store.put(thread_id, file_id, source)
    step = cl.Message(content="read it", author="admin", type="user_message").to_dict()
    step["metadata"] = history.documents_metadata([Document("report 1.pdf", "pdf", "text", file=file_id)])
    await layer.create_step(step)
    yield routes, layer, store, thread_id, file_id
    await layer.close()


def request() -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "headers": []})


def user(name: str):
    import chainlit as cl

    return cl.User(identifier=name)


async def test_the_owner_downloads_the_original_as_an_attachment(kept):
    routes, _, _, thread_id, file_id = kept
    answer = await routes.original_file(request(), thread_id, file_id, user("admin"))
    assert answer.status_code == 200 and answer.body == ORIGINAL
    assert answer.headers["content-disposition"] == "attachment; filename*=UTF-8''report%201.pdf"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.media_type == "application/octet-stream"


async def test_another_user_gets_it_only_once_the_chat_is_shared_and_nobody_without_a_login(kept):
    routes, layer, _, thread_id, file_id = kept
    assert (await routes.original_file(request(), thread_id, file_id, None)).status_code == 401
    refused = await routes.original_file(request(), thread_id, file_id, user("viewer"))
    assert refused.status_code == 403 and b"not shared" in refused.body
    await layer.update_thread(thread_id, metadata={"is_shared": True})
    shared = await routes.original_file(request(), thread_id, file_id, user("viewer"))
    assert shared.status_code == 200 and shared.body == ORIGINAL


@pytest.mark.parametrize("which", ["a file the chat does not name", "no such chat", "not a chat id"])
async def test_only_a_file_its_chat_names_is_served(kept, tmp_path, which):
    routes, _, store, thread_id, file_id = kept
    other = str(uuid.uuid4())
    (tmp_path / "other").write_bytes(b"someone else's")
    await store.put(thread_id, other, tmp_path / "other")  # kept, but no message of the chat names it
    ids = {
        "a file the chat does not name": (thread_id, other),
        "no such chat": (str(uuid.uuid4()), file_id),
        "not a chat id": ("../../etc", file_id),
    }[which]
    answer = await routes.original_file(request(), *ids, user("admin"))
    assert answer.status_code == 404 and answer.body != ORIGINAL


async def test_deleting_the_chat_deletes_its_files(kept, tmp_path):
    routes, layer, store, thread_id, file_id = kept
    assert (tmp_path / "originals" / thread_id / file_id).is_file()
    await layer.delete_thread(thread_id)
    assert not (tmp_path / "originals" / thread_id).exists() and await store.get(thread_id, file_id) is None


@pytest.mark.parametrize("bad", ["../x", "", "a/b", "00000000-0000-0000-0000-00000000000g"])
async def test_the_store_makes_paths_from_uuids_only(tmp_path, bad):
    store = LocalFileStore(tmp_path)
    with pytest.raises(ValueError, match="not a UUID"):
        await store.get(bad, str(uuid.uuid4()))
    with pytest.raises(ValueError, match="not a UUID"):
        await store.put(str(uuid.uuid4()), bad, tmp_path / "x")
