"""Our HTTP routes in front of Chainlit's: status, /metrics, sharing, feedback owner checks, branding.

``Routes`` binds them to one Service; ``install_routes`` puts them before Chainlit's catch-all and its own share,
feedback, logo and favicon routes, replacing those of an earlier installation (Chainlit's server is one per
process; a test installs the UI again against a new Service: no route may stay bound to the old one).
"""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any

import chainlit as cl
from chainlit.auth import get_current_user
from chainlit.data import get_data_layer
from chainlit.server import sio
from chainlit.types import DeleteFeedbackRequest, ShareThreadRequest, UpdateFeedbackRequest
from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from backend.chat import welcome
from backend.chat.client import anomaly_counts
from backend.chat.service import Service
from backend.paths import ROOT, resolve_path
from backend.storage import history, share
from backend.storage.datalayer import GuardedDataLayer, pending_answer_of_feedback
from backend.storage.files import FILES_ROUTE, FileStore
from backend.storage.outbox import Outbox, backlog_text
from backend.text import pick_language, t
from backend.ui import renderer
from backend.ui.chainlit_settings import THEME_CSS
from backend.web import metrics

logger = logging.getLogger(__name__)

FILE_GONE = share.Refusal(404, "originals.gone")  # not named by the chat's messages, or no longer kept


def connected_sessions() -> int:
    """Chainlit's websocket sessions whose browser is connected now (a closed tab's session lingers a while)."""
    from chainlit.session import ws_sessions_id

    return sum(1 for s in list(ws_sessions_id.values()) if sio.manager.is_connected(s.socket_id, "/"))


async def author_of_step(step_id: str) -> tuple[str | None, str]:
    """The thread of an answer and its author ("" when there is none)."""
    layer = get_data_layer()
    execute = getattr(layer, "execute_sql", None)
    if layer is None or execute is None:
        return None, ""
    # An answer whose write still waits (outbox.py), taken before the database is read: a write stored between the
    # two would be in neither, the other way round.
    pending = layer.pending_thread_of_step(step_id) if isinstance(layer, GuardedDataLayer) else None
    rows = await execute('SELECT "threadId" FROM steps WHERE "id" = :id', {"id": step_id})
    thread_id = (rows[0].get("threadId") if isinstance(rows, list) and rows else None) or pending
    if not thread_id:
        return None, ""
    try:
        return thread_id, await layer.get_thread_author(thread_id)
    except ValueError:
        return thread_id, ""


async def answer_of_feedback(feedback_id: str) -> str | None:
    """The answer (step id) an existing rating rates, stored or still waiting to be (a rating taken back right after
    it was given), or None when there is no such rating."""
    layer = get_data_layer()
    execute = getattr(layer, "execute_sql", None)
    if execute is None:
        return None
    pending = pending_answer_of_feedback(layer, feedback_id) if isinstance(layer, GuardedDataLayer) else None
    rows = await execute('SELECT "forId" FROM feedbacks WHERE "id" = :id', {"id": feedback_id})
    found = (rows[0].get("forId") if isinstance(rows, list) and rows else None) or pending
    return str(found) if found else None


async def feedback_refusal(step_ids: list[str | None], user: cl.User | None) -> share.Refusal | None:
    """Why ``user`` may not write or delete a rating: every answer involved must be in one of their chats."""
    for step_id in step_ids:
        thread_id, author = await author_of_step(step_id) if user is not None and step_id else (None, "")
        refusal = share.feedback_refusal(thread_id, author, user.identifier if user else None)
        if refusal is not None:
            logger.warning("feedback on an answer refused (%s)", refusal.key)
            return refusal
    return None


class Routes:
    """The endpoints, bound to one installation's Service. ``sharing``: the history is on ([login].enable)."""

    def __init__(self, service: Service, *, sharing: bool) -> None:
        self.service, self.sharing = service, sharing
        self.outbox: Outbox | None = None  # set by installation.install with the history on
        self.files: FileStore | None = None  # [uploads] keep_originals: the chats' original files

    async def status(self, lang: str = "", user: cl.User | None = Depends(get_current_user)) -> dict[str, Any]:
        """Polled by public/status.js: the engine state line shown at all times, in the viewer's language (``?lang=``,
        the browser's navigator.language; English without one; [ui].language forces one).

        With [login].enable it names models, adapters and failure paths: Chainlit's own dependency answers
        401 without a login (and returns None when login is off).
        """
        await self.service.start()
        out = self.service.status_json(lang)
        # History writes waiting for the database (backend/storage/outbox.py): "" when all are stored
        out["history_text"] = backlog_text(self.outbox.state(), out["lang"]) if self.outbox is not None else ""
        return out

    async def metrics(self, user: cl.User | None = Depends(get_current_user)) -> Response:
        """Prometheus text format (backend/web/metrics.py); 401 without a login when [login].enable is on."""
        await self.service.start()
        text = metrics.METRICS.render(
            engine=self.service.poller.status, active_sessions=connected_sessions(), anomalies=anomaly_counts()
        )
        return Response(text, media_type=metrics.CONTENT_TYPE)

    def http_lang(self, request: Request) -> str:
        """The language of an HTTP answer's message: [ui].language, else the browser's Accept-Language."""
        if self.service.settings.ui.language != "auto":
            return self.service.settings.ui.language
        return pick_language((request.headers.get("accept-language") or "").split(",")[0])

    def refused(self, refusal: share.Refusal, request: Request) -> JSONResponse:
        """Chainlit's page shows ``detail`` in its "Failed to load thread" toast."""
        return JSONResponse({"detail": t(refusal.key, self.http_lang(request))}, status_code=refusal.status)

    async def shared_thread(
        self, request: Request, thread_id: str, user: cl.User | None = Depends(get_current_user)
    ) -> Response:
        """GET /project/share/{id} (Chainlit's shared-thread page): logged-in viewers, shared threads only,
        a clear refusal otherwise (backend/storage/share.py); the owner's settings are not sent along."""
        layer = get_data_layer()
        thread = await layer.get_thread(thread_id) if layer is not None and user is not None else None
        refusal = share.view_refusal(thread, user.identifier if user else None)
        if refusal is not None or thread is None:
            return self.refused(refusal or share.GONE, request)
        meta = share.thread_metadata(thread)
        thread["metadata"] = {k: meta[k] for k in ("is_shared", "shared_at") if k in meta}
        return JSONResponse(content=thread)

    async def original_file(
        self, request: Request, thread_id: str, file_id: str, user: cl.User | None = Depends(get_current_user)
    ) -> Response:
        """GET /qwenchat/files/{thread}/{file}: an attached file's original, to its chat's owner and, once shared,
        to those logged in; only a file the chat's messages name; always a download, never shown inline."""
        layer = get_data_layer()
        if user is None:  # Chainlit's dependency answers 401 itself with [login].enable; without it: no history
            return self.refused(share.LOGIN, request)
        thread = await layer.get_thread(thread_id) if layer is not None and self.files is not None else None
        if thread is None or thread.get("userIdentifier") != user.identifier:
            refusal = share.view_refusal(thread, user.identifier)
            if refusal is not None:
                return self.refused(refusal, request)
        assert thread is not None and self.files is not None
        docs = (d for step in thread.get("steps") or () for d in history.documents_of(step))
        name = next((d.name for d in docs if d.file and d.file == file_id), None)
        data = await self.files.get(thread_id, file_id) if name else None
        if name is None or data is None:
            return self.refused(FILE_GONE, request)
        disposition = f"attachment; filename*=UTF-8''{urllib.parse.quote(name)}"
        headers = {"Content-Disposition": disposition, "X-Content-Type-Options": "nosniff"}
        return Response(data, media_type="application/octet-stream", headers=headers)

    async def share(
        self, request: Request, payload: ShareThreadRequest, user: cl.User | None = Depends(get_current_user)
    ) -> Response:
        """PUT /project/thread/share: only the owner shares or unshares (403 and a message for anyone else)."""
        layer = get_data_layer()
        author = ""
        if layer is not None and user is not None:
            try:
                author = await layer.get_thread_author(payload.threadId)
            except ValueError:  # SQLAlchemyDataLayer: no such thread
                author = ""
        refusal = share.share_refusal(payload.threadId, author, user.identifier if user else None)
        if refusal is not None:
            what = "sharing" if payload.isShared else "unsharing"
            logger.warning("share: %s of a thread refused (%s)", what, refusal.key)
            return self.refused(refusal, request)
        from chainlit.server import share_thread

        response: Response = await share_thread(request, payload, user)
        return response

    async def feedback(
        self, request: Request, update: UpdateFeedbackRequest, user: cl.User | None = Depends(get_current_user)
    ) -> Response:
        """PUT /feedback (thumbs): only on one's own chats; Chainlit's route checks nothing (share.py). An update
        names an existing row by id: that row must rate one of the user's answers too (else it would be moved)."""
        steps: list[str | None] = [update.feedback.forId]
        if update.feedback.id and (rated := await answer_of_feedback(update.feedback.id)):
            steps.append(rated)
        refusal = await feedback_refusal(steps, user)
        if refusal is not None:
            return self.refused(refusal, request)
        from chainlit.server import update_feedback

        response: Response = await update_feedback(request, update, user)
        return response

    async def delete_feedback(
        self, request: Request, payload: DeleteFeedbackRequest, user: cl.User | None = Depends(get_current_user)
    ) -> Response:
        """DELETE /feedback: only a rating of one's own answer (Chainlit deletes any row by id)."""
        refusal = await feedback_refusal([await answer_of_feedback(payload.feedbackId) if user else None], user)
        if refusal is not None:
            return self.refused(refusal, request)
        from chainlit.server import delete_feedback

        response: Response = await delete_feedback(request, payload, user)
        return response

    def logo(self) -> Response:
        """[branding].logo (validated at start: an existing image file)."""
        return FileResponse(resolve_path(self.service.settings.branding.logo))

    def favicon(self) -> Response:
        """[branding].favicon (validated at start: an existing image file)."""
        return FileResponse(resolve_path(self.service.settings.branding.favicon))

    def renderer_script(self, request: Request) -> Response:
        """Chainlit's script of that name, its Markdown without the directive syntax (renderer.py, #22)."""
        name = request.url.path.rsplit("/", 1)[-1]
        bundle = next(b for b in renderer.patched_bundles(renderer.chainlit_assets()) if b.name == name)
        headers = {"ETag": bundle.etag, "Cache-Control": "no-cache"}
        if request.headers.get("if-none-match") == bundle.etag:
            return Response(status_code=304, headers=headers)
        return Response(bundle.body, media_type="text/javascript", headers=headers)

    async def theme_css(self) -> Response:
        """public/style.css plus the [branding].accent colour as Chainlit's theme variables."""
        css = (ROOT / "public" / "style.css").read_text(encoding="utf-8")
        return Response(css + welcome.theme_css(self.service.settings.branding.accent), media_type="text/css")


def _ours(route: object) -> bool:
    return isinstance(getattr(getattr(route, "endpoint", None), "__self__", None), Routes)


def install_routes(http_app: FastAPI, routes: Routes) -> None:
    """Our routes in front of Chainlit's catch-all (its SPA) and its own share/feedback/logo/favicon routes;
    those of an earlier installation (another Service) are taken out first."""
    http_app.router.routes[:] = [r for r in http_app.router.routes if not _ours(r)]
    ui_settings = routes.service.settings.branding
    table: list[tuple[str, object, list[str]]] = [
        ("/qwenchat/status", routes.status, ["GET"]),
        ("/metrics", routes.metrics, ["GET"]),
    ]
    table += [
        (f"/assets/{b.name}", routes.renderer_script, ["GET"])
        for b in renderer.patched_bundles(renderer.chainlit_assets())
    ]
    if routes.sharing:  # sharing needs the history (and so the login)
        table += [
            ("/project/share/{thread_id}", routes.shared_thread, ["GET"]),
            (FILES_ROUTE + "/{thread_id}/{file_id}", routes.original_file, ["GET"]),
            ("/project/thread/share", routes.share, ["PUT"]),
            ("/feedback", routes.feedback, ["PUT"]),
            ("/feedback", routes.delete_feedback, ["DELETE"]),
        ]
    if ui_settings.logo:
        table.append(("/logo", routes.logo, ["GET"]))
    if ui_settings.favicon:
        table.append(("/favicon", routes.favicon, ["GET"]))
    if ui_settings.accent:
        table.append((THEME_CSS, routes.theme_css, ["GET"]))
    for path, endpoint, methods in table:
        http_app.add_api_route(path, endpoint, methods=methods)  # type: ignore[arg-type]
        http_app.router.routes.insert(0, http_app.router.routes.pop())
