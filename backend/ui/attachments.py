"""Files attached to a message (Chainlit's composer upload): read with a live step, refused with the typed text kept,
stored with the message; and the "send the part that fits" button (backend/chat/turn.py offers it)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import replace
from pathlib import Path

import chainlit as cl
from chainlit.data import get_data_layer

from backend.chat.document_errors import DocumentError
from backend.chat.documents import Document, describe
from backend.chat.reading import Upload
from backend.storage.files import FILES_ROUTE
from backend.storage.history import documents_metadata
from backend.text import quoted, t
from backend.ui.answering import answer_as_task, one_answer, turn_of
from backend.ui.context import Ui, guarded
from backend.ui.views import show_error

logger = logging.getLogger(__name__)


def uploads_of(message: cl.Message) -> list[Upload]:
    """The files that came with ``message`` (Chainlit stored each under its files folder, ``path``)."""
    out = []
    for element in message.elements or []:
        path = getattr(element, "path", None)
        if path:
            out.append(Upload(str(element.name or Path(path).name), Path(path)))
    return out


async def read_documents(ui: Ui, message: cl.Message, uploads: list[Upload]) -> tuple[Document, ...] | None:
    """The uploads as documents, stored with the message; None after saying why not (the typed text quoted back,
    nothing sent). Stop while reading says so and ends the conversion."""
    lang, text = ui.lang(), message.content or ""
    kept = "\n\n" + t("document.kept_text", lang, text=quoted(text)) if text.strip() else ""
    chat = ui.chat()
    model = chat.model or ui.service.default_model(ui.service.poller.status)
    refused: DocumentError | None = None
    try:
        async with cl.Step(name=t("document.reading", lang, name=uploads[0].name), type="tool") as step:

            async def progress(name: str, page: int, pages: int) -> None:
                step.name = t("document.reading_page", lang, name=name, page=page, pages=pages)
                await step.update()

            try:
                images = ui.service.takes_images(model)
                docs = await ui.reader.read_all(uploads, model=model, progress=progress, images=images)
            except DocumentError as exc:  # said in the reader's language here, not the step's English default
                refused, step.output = exc, exc.user_text(lang)
            else:
                docs = await keep_originals(ui, uploads, docs)
                step.name = ", ".join(d.name for d in docs)
                step.output = "\n".join(f"- {describe(d, lang)}{download_link(d, lang)}" for d in docs)
    except asyncio.CancelledError:
        await show_error(t("document.stopped", lang, name=", ".join(u.name for u in uploads)) + kept)
        raise
    if refused is not None:
        await show_error(refused.user_text(lang) + kept)
        return None
    # Also on the message object: a later write of it by Chainlit (an edit) keeps them.
    message.metadata = {**(message.metadata or {}), **documents_metadata(docs)}
    await store(message.id, docs, with_message=True)
    return tuple(docs)


async def keep_originals(ui: Ui, uploads: list[Upload], docs: list[Document]) -> list[Document]:
    """With a file store ([uploads] keep_originals): each original kept under a new id, named in its document. A
    file that cannot be kept is logged and the message goes on (its text is what the model reads)."""
    thread_id = cl.context.session.thread_id
    if ui.files is None or not thread_id:
        return docs
    kept = []
    for upload, doc in zip(uploads, docs, strict=True):
        file_id = str(uuid.uuid4())
        try:
            await ui.files.put(thread_id, file_id, upload.path)
        except (OSError, ValueError) as exc:
            logger.warning("the original of %s could not be kept: %s", doc.name, exc)
            kept.append(doc)
        else:
            kept.append(replace(doc, file=file_id))
    return kept


def download_link(doc: Document, lang: str) -> str:
    """ " · [original](/qwenchat/files/<chat>/<file>)" for a document whose original is kept, else ""."""
    if not doc.file:
        return ""
    return f" · [{t('originals.link', lang)}]({FILES_ROUTE}/{cl.context.session.thread_id}/{doc.file})"


async def store(message_id: str, docs: list[Document] | tuple[Document, ...], *, with_message: bool = False) -> None:
    """The converted text kept with the user's message (its step's metadata under our key), so that resume, share,
    /export and compare read the same documents. Written to the history only (no history: nothing to do): for the
    message just received (``with_message``), with Chainlit's own write of it when that is still to come; else as a
    partial upsert of the step, behind that write (``GuardedDataLayer.carry_metadata``; Chainlit's data layer writes
    only the columns given). Not sent to the browser, which shows the file it sent."""
    layer = get_data_layer()
    if layer is None:
        return
    metadata = documents_metadata(docs)
    carry = getattr(layer, "carry_metadata", None)
    if with_message and carry is not None and not carry(message_id, metadata):
        return  # it goes with the message's own write
    step = {"id": message_id, "threadId": cl.context.session.thread_id, "type": "user_message"}
    try:
        await layer.update_step({**step, "metadata": metadata})
    except Exception:  # the chat goes on; a resumed chat would lack the documents
        logger.exception("could not store the documents of message %s", message_id)


@guarded
async def on_send_cut(ui: Ui, action: cl.Action) -> None:
    """ "Send pages 1–212 of 340": the latest user turn again, its document cut as the button says (the step
    names the cut, and the history keeps the cut document)."""
    async with one_answer(ui) as free:
        last = await turn_of(ui, action) if free else None
        if last is None:
            return
        index, part = int(action.payload["document"]), int(action.payload["part"])
        docs = list(last.documents)
        if not 0 <= index < len(docs) or part <= 0:
            await show_error(t("old_button", ui.lang()))
            return
        whole, docs[index] = docs[index], docs[index].first(part)
        unit = t(f"document.unit.{whole.unit}", ui.lang())
        async with cl.Step(
            name=t("document.cut_step", ui.lang(), name=whole.name, unit=unit, part=part, total=whole.units),
            type="tool",
        ) as step:
            step.output = describe(docs[index], ui.lang())
        ui.chat().conversation.add_user(last.id, last.content, tuple(docs))
        await store(last.id, docs)
        await answer_as_task(ui)
