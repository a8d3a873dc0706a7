"""Compare mode with documents (backend/chat/compare.py): both sides are sent the same documents, and the vote's
prompt, hence the exported preference pair (backend/storage/feedback_export.py), carries a document's text up to
``PAIR_DOCUMENT_CHARS`` characters, a reference (name, SHA-256 of its text, tokens) above, and a reference for an
image. Both sides against the fake OpenAI server (its base model and its adapter)."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid

import pytest

from backend.chat import budget, compare
from backend.chat.documents import Document, frame
from backend.chat.session import ChatSession
from backend.chat.turn import Outcome
from backend.storage.feedback_export import preference_pairs
from tests.unit.chat.test_turn import Recorder, fake, marker, service  # noqa: F401 - fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

SMALL = Document("notes.txt", "text", "the code word is heron")
BIG = Document("contract.txt", "text", "clause " * 4_000)  # 28,000 characters: over PAIR_DOCUMENT_CHARS
PIXELS = b"\x89PNG\r\n\x1a\n fake pixels"
IMAGE = Document("photo.png", "image", "", data="data:image/png;base64," + base64.b64encode(PIXELS).decode())


async def test_both_compare_sides_are_sent_the_same_documents(service, fake):  # noqa: F811 - fixtures
    m = marker()
    session = ChatSession(system_prompt="", sampling=service.default_sampling())
    last = session.conversation.add_user(str(uuid.uuid4()), f"which code word? {m}", (SMALL, BIG))
    pair = compare.new_pair(compare.CompareMode("fake-qwen", "fake-adapter"), last.id, [])

    await compare.run(pair, session, service, {"A": Recorder(), "B": Recorder()})

    assert [s.outcome for s in pair.sides] == [Outcome.ANSWERED, Outcome.ANSWERED]
    sent = {r.model: r.messages for r in fake.records if m in json.dumps(r.messages)}
    assert set(sent) == {"fake-qwen", "fake-adapter"}
    assert sent["fake-qwen"] == sent["fake-adapter"]
    assert frame(SMALL) in sent["fake-qwen"][-1]["content"] and frame(BIG) in sent["fake-qwen"][-1]["content"]


async def test_a_pairs_prompt_carries_a_short_documents_text_and_a_reference_for_a_long_one_and_an_image(
    service,  # noqa: F811 - fixtures
):
    session = ChatSession(system_prompt="be brief", sampling=service.default_sampling())
    session.conversation.add_user("u1", "compare them", (SMALL, BIG, IMAGE))
    counter = await service.counter()
    tokens = [await budget.frame_tokens(d, counter) for d in (SMALL, BIG, IMAGE)]
    mode = compare.CompareMode("fake-qwen", "fake-adapter")

    pair = compare.new_pair(
        mode, "u1", session.conversation.messages("be brief"), documents=(SMALL, BIG, IMAGE), tokens=tokens
    )
    pair.sides[0].text, pair.sides[1].text = "heron", "no idea"
    [record] = preference_pairs([compare.to_vote(pair, "a", "alice", "t1")]).records

    assert record["prompt"][0] == {"role": "system", "content": "be brief"}
    sent = record["prompt"][1]["content"]
    assert frame(SMALL) in sent and "clause" not in sent and sent.endswith("compare them")
    big_sha = hashlib.sha256(BIG.text.encode()).hexdigest()
    assert (
        f'<document name="contract.txt" type="text" sha256="{big_sha}" tokens="{tokens[1]}" characters="28000" '
        'text="omitted">\n</document>'
    ) in sent
    assert tokens[1] > 4_000 and tokens[2] == 0
    image_sha = hashlib.sha256(PIXELS).hexdigest()
    assert sent.startswith(f'<document name="photo.png" type="image" sha256="{image_sha}" tokens="0" characters="0"')
    assert IMAGE.data not in sent
