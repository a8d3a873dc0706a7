"""/export through Chainlit's own socket handlers (driven like tests/unit/test_app_handlers.py, its fixtures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_app_handlers import Chat, chat, fake, marker, send_command, ui  # noqa: F401 - fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")


def exported_file(tab: Chat, n: int) -> tuple[dict, str]:
    [element] = [d for e, d in tab.events[n:] if e == "element"]
    stored = tab.session.files[element["chainlitKey"]]  # what GET /project/file/<key> serves
    return element, Path(stored["path"]).read_text(encoding="utf-8")


async def test_export_sends_the_chat_as_a_markdown_file_with_each_answers_model(chat: Chat, fake):  # noqa: F811
    m = marker()
    await chat.send(f"first {m}")
    await chat.send(f"second {m}")
    before = len(fake.records)
    n = len(chat.events)
    screen = await send_command(chat, "export", "")
    assert "This chat as Markdown (4 messages)" in screen.answers[-1] and screen.errors == []
    element, text = exported_file(chat, n)
    assert (
        element["name"].startswith("chat-") and element["name"].endswith(".md") and element["mime"] == "text/markdown"
    )
    assert text.count("## Answer · `fake-qwen`") == 2 and f"## You\n\nfirst {m}" in text and f"second {m}" in text
    assert "*`fake-qwen` ·" not in text  # the raw answers, not the footers
    assert len(fake.records) == before  # nothing went to the model
    screen = await chat.send(f"third {m}")  # the command is not a turn of the conversation
    assert [t.role for t in chat.conversation.turns] == ["user", "assistant"] * 3


async def test_export_of_an_empty_chat_says_there_is_nothing_yet(chat: Chat):  # noqa: F811
    n = len(chat.events)
    screen = await send_command(chat, "export", "")
    assert screen.answers[-1].startswith("Nothing to export yet") and not [
        e for e, _ in chat.events[n:] if e == "element"
    ]


async def test_the_chat_offers_the_export_command(chat: Chat):  # noqa: F811
    sent = [d for e, d in chat.events if e == "set_commands"]
    assert "export" in {c["id"] for c in sent[-1]}


async def test_export_works_after_another_chainlit_process_removed_the_files_folder(ui, fake):  # noqa: F811
    """Every Chainlit process deletes <app root>/.files when it stops: another UI on this checkout (a second port,
    a test's app) would otherwise leave this one unable to attach the export (FileNotFoundError)."""
    import shutil

    from chainlit.config import FILES_DIRECTORY

    shutil.rmtree(FILES_DIRECTORY, ignore_errors=True)
    tab = Chat(ui, fake)
    await tab.start()
    try:
        await tab.send(f"hello {marker()}")
        n = len(tab.events)
        screen = await send_command(tab, "export", "")
        assert screen.errors == [] and "This chat as Markdown" in screen.answers[-1]
        assert exported_file(tab, n)[1].startswith("#")
    finally:
        await tab.end()
