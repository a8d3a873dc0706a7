"""Images for a model that reads them (backend/chat/vision.py): whether it does comes from the served model's
config.json (``vision_config``); its images reach the engine as OpenAI image parts beside the message's text, and a
text-only model's are refused naming it. Against the fake OpenAI server, made to look like a vision model by pointing
its ``/v1/models`` root at a folder holding such a config."""

from __future__ import annotations

import base64
import json
import struct
import uuid
import zlib
from pathlib import Path

import pytest
import pytest_asyncio

from backend.chat import turn, vision
from backend.chat.document_errors import ImageNotSupported
from backend.chat.documents import Document, describe
from backend.chat.reading import Reader, Upload
from backend.chat.session import ChatSession
from backend.chat.turn import Outcome
from backend.settings import UploadsSettings
from tests.unit.chat.test_turn import Recorder, fake, marker, service  # noqa: F401 - fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

QWEN2_VL = {"architectures": ["Qwen2VLForConditionalGeneration"], "vision_config": {"depth": 32, "patch_size": 14}}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 2560}


def png(width: int = 2, height: int = 2) -> bytes:
    """A real (tiny, grey) PNG, built here."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\0" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def model_folder(tmp_path: Path, config: object) -> Path:
    folder = tmp_path / f"model-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


async def _no_progress(name: str, page: int, pages: int) -> None:
    return None


@pytest.mark.parametrize(
    "config, reads_images",
    [(QWEN2_VL, True), (QWEN3, False), ({"vision_config": None}, False), ([1, 2], False), ("{not json", False)],
)
async def test_a_vision_model_is_told_by_the_vision_config_of_its_config_json(tmp_path, config, reads_images):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    assert vision.takes_images([None, tmp_path / "absent", folder]) is reads_images


@pytest_asyncio.fixture(loop_scope="module")
async def served_as(service, fake, tmp_path):  # noqa: F811 - fixtures
    """Point the fake server's base model at a folder holding ``config``; back to its default after the test."""

    async def serve(config: dict[str, object]) -> None:
        fake.root = str(model_folder(tmp_path, config))
        await service.poller.refresh()

    yield serve
    fake.root = f"/models/{fake.model}"
    await service.poller.refresh()


async def test_a_vision_models_images_reach_it_as_image_parts_beside_the_text(service, fake, served_as, tmp_path):  # noqa: F811
    await served_as(QWEN2_VL)
    assert service.takes_images("fake-qwen") and service.takes_images("fake-adapter")  # an adapter: its base's
    image = png()
    photo = Upload("photo.png", tmp_path / "photo.png")
    photo.path.write_bytes(image)
    [doc] = await Reader(UploadsSettings()).read_all([photo], model="fake-qwen", progress=_no_progress, images=True)
    assert describe(doc, "en") == "photo.png: image · 1 KB, sent to the model as an image"
    notes = Document("notes.txt", "text", "the notes")
    m = marker()
    session = ChatSession(system_prompt="", sampling=service.default_sampling())
    session.conversation.add_user(str(uuid.uuid4()), f"what is in the picture? {m}", (notes, doc))
    view = Recorder()

    assert await turn.answer(session, service, view) is Outcome.ANSWERED

    [rec] = [r for r in fake.records if m in json.dumps(r.messages)]
    text, picture = rec.messages[-1]["content"]
    assert text["type"] == "text" and text["text"].startswith('<document name="notes.txt" type="text">')
    assert text["text"].endswith(f"what is in the picture? {m}") and "photo.png" not in text["text"]
    assert picture["type"] == "image_url"
    prefix, _, data = picture["image_url"]["url"].partition(",")
    assert prefix == "data:image/png;base64" and base64.b64decode(data) == image
    assert [name for name, _ in view.reply().fitted.documents] == ["notes.txt"]  # the meter lists framed text


async def test_a_text_only_models_image_is_refused_naming_it_before_any_conversion(service, served_as, tmp_path):  # noqa: F811
    await served_as(QWEN3)
    assert not service.takes_images("fake-qwen")
    photo = Upload("photo.png", tmp_path / "photo.png")
    photo.path.write_bytes(png())

    no_converter = Reader(UploadsSettings(), python="/nonexistent/python")  # a conversion would fail otherwise
    with pytest.raises(ImageNotSupported) as caught:
        await no_converter.read_all(
            [photo], model="fake-qwen", progress=_no_progress, images=service.takes_images("fake-qwen")
        )

    assert "photo.png" in caught.value.user_text("en") and "fake-qwen" in caught.value.user_text("en")
