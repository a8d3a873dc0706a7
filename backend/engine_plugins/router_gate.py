"""vllm-router with the engine key required on every route (issue #18): ``python -m backend.engine_plugins.router_gate
<vllm-router flags>``, the key in the environment (``QWENCHAT_ENGINE_API_KEY``, never in argv).

vllm-router 0.1.17 checks callers only when it is given API-key validation URLs, a setting its CLI does not offer
but its Rust binding does (``vllm_router_rs.Router(api_key_validation_urls=[...])``). Then every route of its main
port, the admin ones (``/add_worker``, ``/remove_worker``, ``/list_workers``, ``/workers/{url}`` …) and the health
ones included, asks for ``Authorization: Bearer <token>`` and sends that header to each validation URL with a GET:
a 200 lets the caller in (401 "You must provide a valid API key" otherwise). It remembers the verdict of each token
for as long as it runs, a refusal included. So the one validation URL is served here, by a child of the router's
own process (forked before the router starts, on an ephemeral port of 127.0.0.1 bound by the parent, and killed by
the kernel when its parent dies): it is up whenever the router is, and a replica down at the first request cannot
get the real key refused until a restart. A thread would not do: the binding's ``start()`` holds the GIL for as
long as the router runs (measured: the check never answered). It answers 200 to the key and 401 to anything else,
on every path, and logs nothing.

Measured and documented in docs/ARCHITECTURE.md ("The fleet's doors"), with what this does not close: the
router's Prometheus port (always opened by the binding; a taken port makes it panic) answers without a key.
"""

from __future__ import annotations

import hmac
import http.server
import os
import signal
import sys

from backend.contract import ENV_ENGINE_API_KEY


class _Validator(http.server.BaseHTTPRequestHandler):
    """200 for ``Authorization: Bearer <the key>``, 401 for anything else, whatever the method and path."""

    expected = b""
    timeout = 10  # a caller that sends nothing does not hold a thread for ever

    def _answer(self) -> None:
        got = self.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        self.send_response(200 if hmac.compare_digest(got, self.expected) else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_HEAD = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass  # never a line per request (and nothing about the key)


def start_validator(key: str) -> str:
    """Serve the key check on 127.0.0.1 (an ephemeral port) from a forked child that dies with this process; its
    URL. Call it before anything starts threads (the router)."""
    handler = type("Validator", (_Validator,), {"expected": f"Bearer {key}".encode()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # bound here: known before the fork
    server.daemon_threads = True
    parent = os.getpid()
    if os.fork() == 0:  # the child: serve until the router's process is gone
        try:
            _die_with(parent)
            server.serve_forever()
        finally:
            os._exit(0)
    server.socket.close()
    return f"http://127.0.0.1:{server.server_address[1]}/"


def _die_with(parent: int) -> None:
    """SIGKILL this process when its parent exits (Linux prctl PR_SET_PDEATHSIG), or now if it already has."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (AttributeError, OSError):  # not Linux: the supervisor's process-group stop still ends it
        pass
    if os.getppid() != parent:
        os._exit(0)


def main(argv: list[str]) -> int:
    key = os.environ.pop(ENV_ENGINE_API_KEY, "")
    if not key:
        print(
            f"router_gate: {ENV_ENGINE_API_KEY} is not set: the router would serve every route without a key",
            flush=True,
        )
        return 2
    check_url = start_validator(key)  # first: the fork happens before the router's module is even loaded
    from vllm_router.launch_router import parse_router_args  # type: ignore[import-untyped]
    from vllm_router.router import Router  # type: ignore[import-untyped]

    args = parse_router_args(argv)
    args._validate_router_args()
    args.api_key_validation_urls = [check_url]  # passed on to the binding by from_args (vars(args))
    Router.from_args(args).start()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
