"""The engine fleet, launcher side: local vLLM replicas and ``vllm-router`` in front of them ([fleet]).

    plan = fleet.plan(settings, engine="cpu", python=..., api_key=k, adapters=..., chat_template=None,
                      cpus=fleet.usable_cpus(), gpu_ids=None)
    plan.replicas   # one vLLM Command per local replica (port [network] engine_port + 1 + i)
    plan.router     # vllm-router (through router_gate: the key on every route), where a single engine would listen

Each local replica is the single engine's command (``command.build_engine_command``: the same static
``--lora-modules``, the same runtime-loading environment, the same key through ``VLLM_API_KEY``) with its own
port, plus its share of the machine:

- GPU: replica ``i`` gets ``CUDA_VISIBLE_DEVICES`` = the ``i``-th group of ``[vllm] tensor_parallel_size``
  visible GPUs (the ids of ``CUDA_VISIBLE_DEVICES`` when it is set, else 0 … n-1); ``local × tp`` above the GPUs
  found is refused naming ``fleet.local``.
- CPU: the usable cores (``os.sched_getaffinity``) are split into ``local`` disjoint contiguous groups and replica
  ``i`` binds its OpenMP threads to its group (``VLLM_CPU_OMP_THREADS_BIND``, e.g. ``0`` and ``1`` on two cores):
  vLLM-CPU's own "auto" binding would put every replica's threads on the same cores. With more replicas than
  cores, replica ``i`` gets core ``i mod n`` (they share). The KV cache is per replica: each gets the whole
  ``[vllm] cpu_kvcache_gib`` (``VLLM_CPU_KVCACHE_SPACE`` is a per-process reservation in whole GiB, so splitting
  the default 1 GiB would give 0), i.e. ``local × cpu_kvcache_gib`` GiB in all; the dry run says so.

What ``vllm-router`` 0.1.17 does (measured against recording servers and real vLLM-CPU replicas; see
``tests/integration/test_fleet.py``):

- Worker URLs are server roots (``http://127.0.0.1:8001``): it appends ``/v1/chat/completions`` itself, so the
  ``/v1`` of a replica's base URL is removed.
- As its CLI starts it, it checks no key of its own, on any route: ``POST /add_worker?url=…`` and
  ``/remove_worker`` let any local process (or a web page, through DNS rebinding) put its own worker in the
  rotation and receive the next chats with the engine key in ``Authorization`` (issue #18, measured). So it is
  started through ``router_gate`` (``python -m backend.engine_plugins.router_gate <its flags>``, the key in
  ``QWENCHAT_ENGINE_API_KEY``), which gives its Rust binding an API-key validation URL served by the router's own
  process: then every route of its port, admin and health ones included, answers 401 without the key (see
  ``router_gate`` and docs/ARCHITECTURE.md). The launcher's health check of it sends the key.
- ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` are forwarded with the client's
  ``Authorization`` header, so the replicas' key still guards chat. Its own ``--api-key`` is what it sends
  instead of the client's header on the other routes (``/tokenize``, ``/v1/load_lora_adapter``,
  ``/v1/unload_lora_adapter``, ``/metrics``, ``/version``): giving it the key would load adapters for any key
  holder through one replica only (and put the key in ``ps``). So it gets none: a load or unload through it
  reaches a replica without a key and is refused there (401, measured). The UI counts tokens locally and sends
  adapter loads to each replica directly (``Settings.replica_urls``).
- Worker URLs reach it without any ``user:password@`` of a ``[fleet] remote`` URL (``worker_url``): it would show
  them in ``ps``, its log (``Router ready | workers: [...]``) and its metrics labels, and it would not send them
  anyway with the engine key in the same header. Every replica takes the engine key as a bearer token; the
  launcher says so when a remote URL carries a password (and the dry run, logs and messages show it without).
- A load or unload through it reaches one replica (round robin), never all.
- Health: ``/liveness`` is 200 once it listens; ``/readiness`` is 200 with ``{"healthy_workers", "total_workers"}``;
  ``/health`` is 503 as soon as one worker is unhealthy. It starts listening only once at least one worker
  answers ``/health`` (and exits 1 if none does within ``--worker-startup-timeout-secs``), so the router being up
  means a replica is ready.
- A dead worker (connection refused): each request sent there is retried on another worker (≈50 ms of backoff);
  ``--cb-failure-threshold 2`` opens its circuit after two failures, and the health checker (every
  ``ROUTER_HEALTH_EVERY`` s, ``--health-failure-threshold 2``) takes it out of rotation. ``/v1/models`` is not
  retried: it goes to one worker and fails (500) until the health checker has marked a dead one unhealthy.
- It rewrites the chat body (adds SGLang fields such as ``skip_special_tokens``; vLLM ignores unknown ones) but
  keeps our extensions (``top_k``, ``min_p``, ``stream_options``).
- It also opens a Prometheus port (default 29000 whatever the flags say, so two routers collide; its binding
  always opens one, and a port already taken makes it panic): we set ``router_metrics_port`` =
  ``[network] engine_port + fleet.local + 1``, on 127.0.0.1. That port asks for no key (read-only: counters and the
  workers' public URLs); see docs/ARCHITECTURE.md.

Supervision reuses ``Supervisor`` (same restart budget, causes, hang watchdog): one per local replica (log
``engine-replica-<i>.log``, status ``contract.replica_status_file_name(i)``, its own one-token probe), and one
for the router (log ``router.log``, the main status file the UI reads: "starting" until a replica is ready).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend import contract
from backend.contract import ENV_ENGINE_API_KEY
from backend.engine_http import public_url
from backend.errors import ConfigError, EngineStartFailed, FleetModelsDiffer, ReplicaKeyRefused, ReplicaNotOpenAI
from backend.launcher.command import Command, build_engine_command
from backend.launcher.preflight import check_port_free
from backend.launcher.supervisor import Supervisor
from backend.probe import OneTokenProbe
from backend.settings import ROOT, Settings, is_loopback, replace
from backend.text import t

logger = logging.getLogger(__name__)

#: Seconds between the router's health checks of its workers (its default is 60: a dead replica would stay in
#: rotation for minutes, each request paying a failed attempt first).
ROUTER_HEALTH_EVERY = 2
#: Consecutive failures before the router takes a worker out (health checks; circuit breaker on requests).
ROUTER_FAILURES = 2
#: Seconds the router's circuit stays open before it tries a worker again (a restarted replica comes back).
ROUTER_CB_OPEN_S = 10


# ---------------------------------------------------------------- commands


def replica_settings(settings: Settings, index: int) -> Settings:
    """The settings a local replica runs with: the single engine's, on port ``[network] engine_port + 1 + index``."""
    return replace(settings, network=replace(settings.network, engine_port=settings.network.engine_port + 1 + index))


def worker_url(base_url: str) -> str:
    """A replica's OpenAI base URL as vllm-router wants it: the server root (no ``/v1``, no trailing slash), without
    any ``user:password@`` (see the module docstring)."""
    return public_url(base_url).rstrip("/").removesuffix("/v1")


def router_metrics_port(settings: Settings) -> int:
    """vllm-router's Prometheus port: right after the local replicas' ports."""
    return settings.network.engine_port + settings.fleet.local + 1


def usable_cpus() -> list[int]:
    """The cores this process may run on (cgroup/taskset aware)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def visible_gpu_ids(count: int | None) -> list[str] | None:
    """The GPU ids replicas are given out of: ``CUDA_VISIBLE_DEVICES``'s entries when set, else 0 … count-1;
    None when the GPUs are unknown (no nvidia-smi, e.g. a dry run on a CPU box)."""
    if count is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()][:count]
    return [str(i) for i in range(count)]


def _ranges(cores: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (the list syntax of VLLM_CPU_OMP_THREADS_BIND)."""
    out: list[str] = []
    start = prev = cores[0]
    for c in [*cores[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(out)


def cpu_groups(local: int, cpus: Sequence[int]) -> list[str]:
    """``local`` disjoint contiguous groups of ``cpus`` (the first ones one core larger when it does not divide),
    as VLLM_CPU_OMP_THREADS_BIND values; with more replicas than cores, replica i gets core i mod n."""
    cores = sorted(cpus) or [0]
    if local > len(cores):
        return [str(cores[i % len(cores)]) for i in range(local)]
    size, extra = divmod(len(cores), local)
    groups, at = [], 0
    for i in range(local):
        n = size + (1 if i < extra else 0)
        groups.append(_ranges(cores[at : at + n]))
        at += n
    return groups


def gpu_groups(settings: Settings, gpu_ids: Sequence[str] | None) -> list[str]:
    """CUDA_VISIBLE_DEVICES for each local replica: consecutive groups of tensor_parallel_size GPUs.
    ``gpu_ids`` None (unknown): numbered from 0, as a dry run shows them. ConfigError naming fleet.local when
    local × tp exceeds the GPUs found."""
    local, tp = settings.fleet.local, settings.vllm.tensor_parallel_size
    ids = list(gpu_ids) if gpu_ids is not None else [str(i) for i in range(local * tp)]
    if local * tp > len(ids):
        raise ConfigError(
            "fleet.local",
            local,
            f"fleet.local × [vllm] tensor_parallel_size ({local} × {tp} = {local * tp} GPUs) within the "
            f"{len(ids)} GPU(s) visible here (nvidia-smi -L, CUDA_VISIBLE_DEVICES); lower fleet.local or "
            "[vllm] tensor_parallel_size",
        )
    return [",".join(ids[i * tp : (i + 1) * tp]) for i in range(local)]


def build_replica_commands(
    settings: Settings,
    *,
    engine: str,
    python: str,
    api_key: str,
    adapters: Mapping[str, Path],
    chat_template: Path | None = None,
    cpus: Sequence[int] = (0,),
    gpu_ids: Sequence[str] | None = None,
) -> list[Command]:
    """One vLLM command per local replica; pure (the machine comes in as ``cpus`` / ``gpu_ids``)."""
    local = settings.fleet.local
    if not local:
        return []
    shares = gpu_groups(settings, gpu_ids) if engine == "gpu" else cpu_groups(local, cpus)
    var = "CUDA_VISIBLE_DEVICES" if engine == "gpu" else "VLLM_CPU_OMP_THREADS_BIND"
    cmds = []
    for i in range(local):
        cmd = build_engine_command(
            replica_settings(settings, i),
            engine=engine,
            python=python,
            api_key=api_key,
            adapters=adapters,
            chat_template=chat_template,
        )
        cmds.append(Command(cmd.argv, {**cmd.env, var: shares[i]}, cmd.unset))
    return cmds


def build_router_command(settings: Settings, *, python: str, api_key: str) -> Command:
    """The vllm-router command, run through ``router_gate`` (every route needs the key, given in the environment);
    pure. No --api-key: see the module docstring."""
    s = settings.network
    argv = [
        python,
        "-m",
        "backend.engine_plugins.router_gate",
        "--host",
        s.engine_host,
        "--port",
        str(s.engine_port),
        "--worker-urls",
        *(worker_url(u) for u in settings.replica_urls),
        "--policy",
        settings.fleet.policy,
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(router_metrics_port(settings)),
        # it listens once one replica answers /health; a first start waits as long as a single engine may
        "--worker-startup-timeout-secs",
        str(max(1, int(settings.supervision.startup_timeout))),
        "--worker-startup-check-interval",
        "1",
        "--health-check-interval-secs",
        str(ROUTER_HEALTH_EVERY),
        "--health-check-timeout-secs",
        str(max(1, int(settings.health.request_timeout))),
        "--health-failure-threshold",
        str(ROUTER_FAILURES),
        "--health-success-threshold",
        "1",
        "--cb-failure-threshold",
        str(ROUTER_FAILURES),
        "--cb-timeout-duration-secs",
        str(ROUTER_CB_OPEN_S),
        "--request-timeout-secs",
        str(max(1, int(settings.client.total_timeout))),
    ]
    # its HTTP client honours http_proxy: never for the local replicas
    no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY", ""), "127.0.0.1,localhost,::1"]))
    env = {ENV_ENGINE_API_KEY: api_key, "NO_PROXY": no_proxy, "no_proxy": no_proxy, "PYTHONPATH": str(ROOT)}
    return Command(tuple(argv), env)


@dataclass(frozen=True)
class Plan:
    replicas: tuple[Command, ...]
    router: Command


def plan(
    settings: Settings,
    *,
    engine: str,
    python: str,
    api_key: str,
    adapters: Mapping[str, Path],
    chat_template: Path | None = None,
    cpus: Sequence[int] = (0,),
    gpu_ids: Sequence[str] | None = None,
    router_python: str | None = None,
) -> Plan:
    """Every command of the fleet; ``router_python``: the Python that runs the router (this one: the app
    environment, where vllm-router is installed)."""
    replicas = build_replica_commands(
        settings,
        engine=engine,
        python=python,
        api_key=api_key,
        adapters=adapters,
        chat_template=chat_template,
        cpus=cpus,
        gpu_ids=gpu_ids,
    )
    router = build_router_command(settings, python=router_python or sys.executable, api_key=api_key)
    return Plan(tuple(replicas), router)


def describe(settings: Settings, p: Plan, engine: str) -> list[str]:
    """The dry run's lines: each replica's command with its share of the machine, then the router's."""
    lines: list[str] = []
    for i, cmd in enumerate(p.replicas):
        share = cmd.env.get("CUDA_VISIBLE_DEVICES") or cmd.env.get("VLLM_CPU_OMP_THREADS_BIND", "")
        what = f"GPU(s) {share}" if engine == "gpu" else f"CPU core(s) {share}"
        lines += [f"# replica {i} ({settings.replica_url(i)}, {what})", cmd.render()]
    for url in settings.fleet.remote:
        lines.append(f"# remote replica {public_url(url)} (checked at start: GET /v1/models with the engine key)")
    if engine != "gpu" and settings.fleet.local:
        gib = settings.vllm.cpu_kvcache_gib
        lines.append(
            f"# info: {settings.fleet.local} local replicas × VLLM_CPU_KVCACHE_SPACE={gib} GiB = "
            f"{settings.fleet.local * gib} GiB of KV cache, plus each replica's own process (≈ 3 GB on vLLM-CPU)"
        )
    lines += [
        f"# router (vllm-router, policy {settings.fleet.policy}, every route behind the engine key; the UI talks to "
        f"it at {settings.engine_base_url})",
        p.router.render(),
    ]
    return lines


# ---------------------------------------------------------------- preflight


def check_ports(settings: Settings) -> None:
    """The local replicas' ports and the router's metrics port are free (the router's own port is [network] engine_port,
    checked like a single engine's)."""
    s = settings.network
    for i in range(settings.fleet.local):
        check_port_free(
            s.engine_host,
            s.engine_port + 1 + i,
            f"[network].engine_port (fleet replica {i} listens on [network].engine_port + {i + 1})",
        )
    check_port_free(
        "127.0.0.1",
        router_metrics_port(settings),
        "[network].engine_port (the router's metrics listen on [network].engine_port + fleet.local + 1)",
    )


@dataclass(frozen=True)
class ReplicaModels:
    url: str
    bases: tuple[str, ...]  # served ids that are not adapters
    ids: tuple[str, ...]


#: (url, key, timeout) -> (status, content type, body); raises OSError when no answer came.
Fetch = Callable[[str, str, float], tuple[int, str, bytes]]


def _fetch(url: str, key: str, timeout: float) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    host = urllib.parse.urlsplit(url).hostname or ""
    opener = (
        urllib.request.build_opener(urllib.request.ProxyHandler({}))
        if is_loopback(host)
        else urllib.request.build_opener()
    )
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read(1_000_000)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", "") if exc.headers else "", exc.read(100_000)


def remote_models(
    url: str, key: str, *, adapters: Sequence[str], timeout: float, fetch: Fetch = _fetch
) -> ReplicaModels | None:
    """What a remote replica serves (GET {url}/models with the key); None when it cannot be reached now (no
    connection, a timeout, a gateway's 502/503/504: it may come up later). Raises ReplicaNotOpenAI for anything
    that is not an OpenAI model list, ReplicaKeyRefused for 401/403. ``adapters``: names never taken for a base
    (routers in front of a replica drop vLLM's ``parent`` field)."""
    models_url = url.rstrip("/") + "/models"
    try:
        status, ctype, body = fetch(models_url, key, timeout)
    except (OSError, ValueError) as exc:
        logger.info("fleet replica %s: %s", url, exc)
        return None
    if status in (401, 403):
        raise ReplicaKeyRefused(url, status)
    if status in (502, 503, 504):
        return None
    head = body[:200].lstrip().lower()
    if "html" in ctype.lower() or head.startswith((b"<!doctype", b"<html")):
        raise ReplicaNotOpenAI(url, f"HTTP {status} with a web page (HTML), not a JSON model list")
    if status != 200:
        raise ReplicaNotOpenAI(url, f"HTTP {status} for GET /models ({body[:120].decode(errors='replace')!r})")
    try:
        data = json.loads(body)
    except ValueError:
        raise ReplicaNotOpenAI(url, f"GET /models answered {body[:80].decode(errors='replace')!r}, not JSON") from None
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in items):
        raise ReplicaNotOpenAI(url, 'GET /models answered JSON without a "data" list of models')
    ids = tuple(m["id"] for m in items)
    bases = tuple(m["id"] for m in items if not m.get("parent") and m["id"] not in adapters)
    return ReplicaModels(url, bases, ids)


def check_remote(settings: Settings, key: str, *, fetch: Fetch = _fetch) -> list[str]:
    """Every remote replica: an OpenAI server, the key accepted, the same base model as the others and as
    ``[model]`` (the local replicas', or, in the launcher's fleet of remote replicas only, what the UI expects; not
    in external mode, where the server names the model). Raises ReplicaNotOpenAI / ReplicaKeyRefused / FleetModelsDiffer; returns the
    warnings to print (a replica not reachable now, a static adapter a replica does not serve, a password in a URL
    that is not used)."""
    f = settings.fleet
    if not f.remote:
        return []
    adapters = tuple(settings.lora.modules) if settings.lora.enable else ()
    timeout = max(settings.health.request_timeout, settings.client.connect_timeout)
    warnings: list[str] = []
    found: list[ReplicaModels] = []
    for given in f.remote:
        url = public_url(given)  # a user:password@ is never sent (nor shown): the key is the replicas' credential
        if url != given:
            warnings.append(t("fleet.replica_password_unused", "en", url=url))
        got = remote_models(url, key, adapters=adapters, timeout=timeout, fetch=fetch)
        if got is None:
            warnings.append(t("fleet.replica_unreachable", "en", url=url))
        else:
            found.append(got)
    served: dict[str, tuple[str, ...]] = {}
    if f.local:
        served[t("fleet.local_replicas", "en", n=f.local, first=settings.replica_url(0))] = (settings.model.name,)
    elif not settings.external:  # the launcher's fleet of remote replicas: the UI expects [model], counts with it
        served[t("fleet.model_setting", "en")] = (settings.model.name,)
    for r in found:
        served[r.url] = r.bases
    if len({frozenset(b) for b in served.values()}) > 1:
        listing = "; ".join(
            f"{who} serves {', '.join(repr(b) for b in bases) or 'no base model'}" for who, bases in served.items()
        )
        raise FleetModelsDiffer(listing)
    for r in found:
        missing = [a for a in adapters if a not in r.ids]
        if missing:
            warnings.append(t("fleet.replica_lacks_adapters", "en", url=r.url, names=", ".join(missing)))
    return warnings


# ---------------------------------------------------------------- supervision


class Fleet:
    """Supervises the local replicas and the router; what ``launch.serve`` needs of a ``Supervisor``
    (``run``, ``stop``, ``ready_event``, ``ever_ready``, ``failed``).

    Ready: the router listens (so a replica answers). Failed: a replica's or the router's first start failed
    (a configuration problem, as with a single engine); later crashes are each supervisor's to restart."""

    def __init__(self, replicas: Sequence[Supervisor], router: Supervisor) -> None:
        self.replicas = list(replicas)
        self.router = router
        self.ready_event = asyncio.Event()
        self.failed: EngineStartFailed | None = None

    @property
    def ever_ready(self) -> bool:
        return self.router.ever_ready

    async def run(self) -> None:
        tasks = [asyncio.create_task(s.run()) for s in [*self.replicas, self.router]]
        try:
            await self._first_start()
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _first_start(self) -> None:
        waits = {asyncio.create_task(s.ready_event.wait()): s for s in [*self.replicas, self.router]}
        try:
            pending = set(waits)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    sup = waits[task]
                    if sup.failed is not None:
                        self.failed = sup.failed
                        self.ready_event.set()
                        return
                    if sup is self.router:
                        self.ready_event.set()
                        return
        finally:
            for task in waits:
                task.cancel()

    def stop(self) -> None:
        for sup in [self.router, *self.replicas]:
            try:
                sup.stop()
            except Exception:
                logger.exception("stopping %s failed", sup.log_path.name)


def build_fleet(
    settings: Settings,
    p: Plan,
    *,
    api_key: str,
    log_dir: Path,
    status_path: Path,
) -> Fleet:
    """A Supervisor per local replica (its own log, status file and one-token probe) and one for the router."""
    s, h = settings.supervision, settings.health
    replicas = []
    for i, cmd in enumerate(p.replicas):
        url = settings.replica_url(i)
        replicas.append(
            Supervisor(
                cmd,
                log_path=log_dir / f"engine-replica-{i}.log",
                status_path=log_dir / contract.replica_status_file_name(i),
                health_url=url.removesuffix("/v1") + "/health",
                attempts=s.restart_attempts,
                window_s=s.restart_window_min * 60,
                startup_timeout=s.startup_timeout,
                probe=OneTokenProbe(url, api_key, settings.model.name, timeout=h.probe_timeout),
                probe_every=h.probe_every,
                probe_timeout=h.probe_timeout,
                restart_after_failed_probes=s.restart_after_failed_probes,
                name=f"replica {i}",
            )
        )
    router = Supervisor(
        p.router,
        log_path=log_dir / "router.log",
        status_path=status_path,
        health_url=settings.engine_base_url.removesuffix("/v1") + "/liveness",
        attempts=s.restart_attempts,
        window_s=s.restart_window_min * 60,
        startup_timeout=s.startup_timeout + 60,  # it listens once a replica is ready
        name="router",
        health_key=api_key,  # router_gate: its /liveness too needs the key
    )
    return Fleet(replicas, router)


def replica_status(log_dir: Path, index: int) -> dict[str, Any] | None:
    """A local replica's status file as JSON (for people and tests); None when missing."""
    st = contract.EngineStatus.read(log_dir / contract.replica_status_file_name(index))
    return st.to_json() if st else None
