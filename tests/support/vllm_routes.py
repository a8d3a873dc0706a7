"""Print the route table of vLLM's own API server app, built the way it builds it (run with the ENGINE's Python).

    <engine python> tests/support/vllm_routes.py '["generate"]' --model … --middleware … (the engine's arguments)

Prints one JSON list: {"path", "methods", "kind"} per route ("http", "websocket" or "mount"). vLLM's arguments are
parsed by its own parser and the app is made by its own ``build_app`` with the supported tasks the running engine
logged ("Supported tasks: [...]") and the model's config, so a route a new vLLM adds is listed without anyone
naming it (tests/integration/test_engine_gate.py calls each one). Nothing is loaded but the model's config.
"""

from __future__ import annotations

import json
import sys


def main(tasks_json: str, engine_args: list[str]) -> None:
    from starlette.routing import Mount, WebSocketRoute
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(engine_args)
    model_config = AsyncEngineArgs.from_cli_args(args).create_model_config()
    app = build_app(args, tuple(json.loads(tasks_json)), model_config)
    routes = []
    for route in app.routes:
        path = getattr(route, "path", None)
        if path is None:
            continue
        kind = "websocket" if isinstance(route, WebSocketRoute) else "mount" if isinstance(route, Mount) else "http"
        methods = sorted(getattr(route, "methods", None) or (["GET"] if kind == "mount" else []))
        routes.append({"path": path, "methods": methods, "kind": kind})
    print(json.dumps(routes))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
