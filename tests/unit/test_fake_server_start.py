"""tests/e2e/support.py ``fake_server``: the fake OpenAI server a worker starts is its own, not whatever answers on
the port it picked (two workers once picked the same free port: one worker's server failed to bind, the other's
answered its /health, and its tests went to a server that the other worker stopped later)."""

from __future__ import annotations

import http.server
import threading
import urllib.request

from tests.e2e import support as e2e
from tests.fakes.openai_server import PID_HEADER


class Impostor(http.server.BaseHTTPRequestHandler):
    """Another process's server on the port: /health 200, as another fake server's would."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header(PID_HEADER, "1")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_port_taken_by_another_server_that_answers_health_is_not_taken_for_the_fake_server(tmp_path, monkeypatch):
    import tests.conftest

    impostor = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Impostor)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    taken = impostor.server_address[1]
    ports = iter([taken])
    real_free_port = tests.conftest.free_port
    monkeypatch.setattr(tests.conftest, "free_port", lambda: next(ports, None) or real_free_port())
    try:
        with e2e.fake_server(tmp_path) as url:
            assert not url.endswith(f":{taken}"), url
            with urllib.request.urlopen(url + "/health", timeout=10) as resp:
                assert resp.status == 200 and resp.headers.get(PID_HEADER) not in (None, "1")
    finally:
        impostor.shutdown()
