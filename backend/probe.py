"""The one-token probe: can the engine still generate? Shared by the UI's health poller and the supervisor.

    body = probe_body("tiny-qwen3")            # the request both sides send to /v1/chat/completions
    probe = OneTokenProbe(base_url, key, "tiny-qwen3", timeout=10)
    result = await probe()                     # ProbeResult(answered, status, latency, error)
    await probe.aclose()

vLLM's ``/health`` says 200 while its EngineCore is frozen (vllm#39863): only a real generation tells
whether the engine answers. ``answered`` means an HTTP reply arrived within ``timeout`` (any status:
a 4xx or 5xx is an engine that answers, with its own problem); no reply at all (timed out, refused,
reset) is what the supervisor's hang watchdog counts.

This module is shared by both sides: it imports nothing from either side.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

#: What the probe asks: one token, greedy, no streaming.
PROBE_MESSAGES = ({"role": "user", "content": "ping"},)


def probe_body(model: str) -> dict[str, Any]:
    """The JSON body of one probe generation on ``model`` (the base model's served name)."""
    return {
        "model": model,
        "messages": [dict(m) for m in PROBE_MESSAGES],
        "max_tokens": 1,
        "temperature": 0,
        "stream": False,
    }


@dataclass(frozen=True)
class ProbeResult:
    answered: bool  # an HTTP reply arrived within the timeout (any status)
    status: int | None = None  # its HTTP status; None when nothing answered
    latency: float = 0.0  # seconds
    error: str = ""  # no reply: "timeout", "refused", or the transport's own words


class OneTokenProbe:
    """A one-token chat completion against an OpenAI-compatible engine, at most ``timeout`` seconds in all.

    Uses the openai SDK without retries, without keep-alive (a pooled connection to an engine that was
    restarted would read as a failure) and without proxies from the environment (the engine is local).
    """

    def __init__(self, base_url: str, api_key: str, model: str, timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.model = model
        self.timeout = timeout
        self._client: Any = None

    def _api(self) -> Any:
        if self._client is None:
            import httpx2
            from openai import AsyncOpenAI, DefaultAsyncHttpxClient

            self._client = AsyncOpenAI(
                base_url=self.base_url,
                api_key=self.api_key or "EMPTY",
                max_retries=0,
                timeout=self.timeout,
                http_client=DefaultAsyncHttpxClient(
                    trust_env=False, limits=httpx2.Limits(max_keepalive_connections=0), timeout=self.timeout
                ),
            )
        return self._client

    async def __call__(self) -> ProbeResult:
        import openai

        api = self._api()
        started = time.monotonic()
        try:
            # The SDK's timeout is per phase (connect, read, …): wait_for bounds the whole call.
            await asyncio.wait_for(
                api.post("/chat/completions", body=probe_body(self.model), cast_to=object), self.timeout
            )
            return ProbeResult(True, 200, time.monotonic() - started)
        except openai.APIStatusError as exc:
            return ProbeResult(True, exc.status_code, time.monotonic() - started)
        except (TimeoutError, openai.APITimeoutError):
            return ProbeResult(False, None, time.monotonic() - started, "timeout")
        except openai.APIConnectionError as exc:
            return ProbeResult(False, None, time.monotonic() - started, _no_reply(exc))

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()


def _no_reply(exc: BaseException) -> str:
    """Why nothing answered, in a few words: "connection refused", an OS error, or the exception's name."""
    cur: BaseException | None = exc
    seen: set[int] = set()
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cur, OSError) and cur.strerror:
            return cur.strerror.lower()
        cur = cur.__cause__ or cur.__context__
    return type(exc).__name__
