"""Typed, immutable settings from config.toml + an optional profile + the environment.

    settings = load_settings()                        # config.toml next to the repo root
    settings = load_settings(profile="qwen3-4b-instruct-2507")  # + profiles/<name>.toml on top
    settings = Settings()                             # defaults, for tests
    settings = Settings(client=ClientSettings(idle_timeout=0.5))

Precedence (last wins): built-in defaults < config.toml < profile < environment.
Environment: ``QWENCHAT_<SECTION>_<KEY>`` (e.g. ``QWENCHAT_SERVER_PORT=8001``), plus the
openai SDK's own ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``: when ``OPENAI_BASE_URL`` is set the
app talks to that server and launches nothing ("external" mode).

A bad value raises ``ConfigError`` naming the key, the value and what was expected.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import ipaddress
import os
import re
import tomllib
import types
import typing
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from . import contract
from . import hub as hub_mod
from .errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
#: vLLM accepts only these values for --max-lora-rank (vllm/config/lora.py).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
EMBEDDED_MODEL_NAME = "smollm2-135m-instruct"
EMBEDDED_ADAPTER_NAME = "pirate"
#: The demo LoRA for the embedded model, shipped in git (3.7 MB; retrain: python -m backend train-demo).
DEMO_ADAPTER_DIR = ROOT / "backend" / "data" / "pirate"


def canonical_origin(value: str) -> str | None:
    """``scheme://host:port`` (lower case, default port made explicit) of a browser origin, or None.

    Only http/https with a host and nothing after it (no path, query, user or fragment) is an origin:
    "localhost:8080" (no scheme) or "http://x/app" are not.
    """
    try:
        parts = urllib.parse.urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host or parts.username is not None or parts.password is not None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or value.strip().endswith("?"):
        return None
    port = port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def http_base_url(value: str, *, bare: bool = False) -> bool:
    """An http(s) URL with a host and, if given, a port from 1 to 65535 (an engine's or a replica's base URL).
    ``bare``: no query, fragment or comma either (vllm-router takes the replicas as one comma-separated list)."""
    try:
        parts = urllib.parse.urlsplit(value.strip())
        port = parts.port
    except ValueError:  # a port that is not a number or out of range, a broken [IPv6] host
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        return False
    return not bare or not (parts.query or parts.fragment or "," in value)


def without_password(url: str) -> str:
    """``url`` for a message: the password of a ``user:password@`` in it shown as ``***``."""
    return re.sub(r"//([^/@:]*):[^/@]*@", r"//\1:***@", url)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or "localhost"; an empty host, 0.0.0.0, :: or any other name is not."""
    import ipaddress

    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_HOST_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")  # one label of a host name


def host_name_of(value: str) -> str | None:
    """A host name or IP address the way the UI compares ``Host`` headers: lower case, an IPv6 address compressed
    and without brackets, no trailing dot ("Chat.Example." -> "chat.example"); None when ``value`` is not one (a
    URL, a port, a path, a space)."""
    v = value.strip().lower()
    if v.startswith("[") and v.endswith("]"):
        v = v[1:-1]
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        pass
    v = v.removesuffix(".")
    if not v or len(v) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in v.split(".")):
        return None
    return v


def is_wildcard(host: str) -> bool:
    """0.0.0.0, :: or "": every address of this machine."""
    try:
        return not host.strip() or ipaddress.ip_address(host.strip().strip("[]")).is_unspecified
    except ValueError:
        return False


def served_host_names(settings: Settings) -> tuple[str, ...]:
    """The ``Host`` names the UI answers to besides loopback ones (DNS rebinding): ``[ui] hosts``, the hosts of
    ``[ui] allowed_origins`` and ``[server] ui_host`` when it is one address or name (not 0.0.0.0 / ::).

    Empty for a ``ui_host`` of 0.0.0.0 with neither set: the launcher then asks for ``[ui] hosts`` by name."""
    candidates = [*settings.ui.hosts]
    candidates += [urllib.parse.urlsplit(o.strip()).hostname or "" for o in settings.ui.allowed_origins]
    if not is_wildcard(settings.server.ui_host) and not is_loopback(settings.server.ui_host):
        candidates.append(settings.server.ui_host)
    names = (host_name_of(c) for c in candidates)
    return tuple(dict.fromkeys(n for n in names if n))


def home_dir() -> Path:
    """Cache folder for environments, models and adapters (outside git)."""
    return Path(os.environ.get("QWENCHAT_HOME") or Path.home() / ".cache" / "qwenchat")


@dataclass(frozen=True)
class ModelSettings:
    path: str = ""  # empty: the embedded default (SmolLM2-135M-Instruct, built by `prepare`)
    served_model_name: str = ""  # empty: derived from the folder name
    max_model_len: int = 8192
    dtype: str = "auto"
    system_prompt: str = ""
    temperature: float = 0.0  # greedy: the 135M demo model wanders off even at 0.2
    top_p: float = 0.9
    top_k: int = -1  # -1: disabled (vLLM's convention)
    min_p: float = 0.0

    @property
    def is_embedded(self) -> bool:
        return not self.path

    @property
    def hub(self) -> hub_mod.HubModel | None:
        """The hub model [model].path names (``owner/name[@revision]`` that is no existing folder), else None."""
        if hub_mod.classify_model_path(self.path, ROOT) != "hub":
            return None
        return hub_mod.parse_hub_id(self.path)

    @property
    def resolved_path(self) -> Path:
        """The model folder; a relative [model].path is relative to the repository folder. A hub id: its snapshot
        folder in huggingface_hub's cache (backend/hub.py), which exists once the download has finished."""
        if self.is_embedded:
            return home_dir() / "models" / EMBEDDED_MODEL_NAME
        model = self.hub
        if model is not None:
            return hub_mod.complete_snapshot(model) or hub_mod.pending_dir(model)
        p = Path(self.path).expanduser()
        return (p if p.is_absolute() else ROOT / p).resolve()

    @property
    def name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.is_embedded:
            return EMBEDDED_MODEL_NAME
        model = self.hub
        return model.name if model is not None else self.resolved_path.name


@dataclass(frozen=True)
class ServerSettings:
    engine: Literal["auto", "cpu", "gpu"] = "auto"
    host: str = "127.0.0.1"
    port: int = 8000
    ui_host: str = "127.0.0.1"
    ui_port: int = 8080
    api_key: str = ""  # empty: a random key per launch
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 8
    cpu_kvcache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE takes whole GiB
    tensor_parallel_size: int = 1  # GPU only: one model split over this many GPUs
    data_parallel_size: int = 1  # GPU only: this many replicas (each on tensor_parallel_size GPUs)
    extra_args: tuple[str, ...] = ()
    startup_timeout: float = 600.0
    restart_attempts: int = 5
    restart_window_min: float = 10.0


@dataclass(frozen=True)
class LoraSettings:
    enable: bool = True
    # name -> adapter folder; "" means the embedded demo adapter
    modules: Mapping[str, str] = field(default_factory=lambda: types.MappingProxyType({EMBEDDED_ADAPTER_NAME: ""}))
    dir: str = "adapters"
    runtime_loading: bool = True
    max_loras: int = 2
    max_lora_rank: int = 16
    max_cpu_loras: int = 4
    # Welcome-screen starters per model: name = ["question", ...] (an adapter's or the base model's name).
    # The 'pirate' demo adapter has built-in ones (en + zh) unless listed here; pirate = [] removes them.
    starters: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: types.MappingProxyType({}))
    # Lineage where the server in front hides it (LiteLLM, a router: no `parent` in /v1/models):
    # adapter name = base model name, e.g. {pirate = "smollm2-135m-instruct"}. vLLM's own `parent` wins.
    parents: Mapping[str, str] = field(default_factory=lambda: types.MappingProxyType({}))

    @property
    def resolved_dir(self) -> Path:
        p = Path(self.dir).expanduser()
        return (p if p.is_absolute() else ROOT / p).resolve()

    def adapter_path(self, name: str) -> Path:
        """Folder of a static adapter; the embedded demo adapter when its path is empty."""
        path = self.modules[name]
        if not path:
            return DEMO_ADAPTER_DIR
        p = Path(path).expanduser()
        return (p if p.is_absolute() else ROOT / p).resolve()


@dataclass(frozen=True)
class ClientSettings:
    connect_timeout: float = 5.0
    first_token_timeout: float = 120.0
    idle_timeout: float = 60.0
    total_timeout: float = 900.0
    max_retries: int = 2
    retry_backoff: float = 0.5


@dataclass(frozen=True)
class BudgetSettings:
    reply_reserve: int = 1024  # tokens kept free for the answer; also sent as max_tokens
    max_model_len: int = 0  # 0: what /v1/models says (else [model].max_model_len); >0: this, always


HISTORY_DB_FORMS = (
    "a SQLite file path (empty = history.sqlite3 in [logging].dir), sqlite+aiosqlite:///FILE, or "
    "postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DATABASE (postgresql:// means asyncpg)"
)
HISTORY_DB_SCHEMES = ("sqlite", "sqlite+aiosqlite", "sqlite+pysqlite", "postgresql", "postgresql+asyncpg")


MAX_HISTORY_WAIT = 600.0  # [ui].history_wait: ten minutes at most (the launcher waits this long for the UI too)


def check_history_db(value: str) -> None:
    """``[ui].history_db``: a path, or a URL of a kind the history supports (backend/chat/database.py parses it)."""
    if "://" not in value:
        return
    scheme = value.split("://", 1)[0].strip().lower()
    if scheme not in HISTORY_DB_SCHEMES:
        # Never the rest of the URL in the message: it may hold a password.
        raise ConfigError("ui.history_db", scheme + "://…", HISTORY_DB_FORMS)
    try:
        port = urllib.parse.urlsplit(value.strip()).port
    except ValueError:  # not a number, out of range, a broken [IPv6] host
        port = 0
    if port == 0:
        raise ConfigError("ui.history_db", without_password(value), "a port from 1 to 65535: " + HISTORY_DB_FORMS)


@dataclass(frozen=True)
class UISettings:
    language: str = "auto"  # auto (browser) | en | zh
    wait_for_ready: float = 300.0  # how long a message sent while the model loads waits
    show_reasoning: bool = True
    auth: bool = False  # password login + chat history in SQLite (backend/history.py)
    username: str = "admin"
    password: str = ""  # or QWENCHAT_UI_PASSWORD (the usual environment override)
    history_db: str = ""  # empty: history.sqlite3 in [logging].dir; or a SQLAlchemy URL (SQLite, PostgreSQL)
    # At start, how long (s) a PostgreSQL that refuses connections, does not answer or is starting up is waited for
    # (one started alongside the UI); then the UI starts without history. 0: do not wait.
    history_wait: float = 30.0
    # Browser origins allowed to use the UI (HTTP and websocket); empty: only the page's own origin
    # (scheme://host:port of the request's Host header). Set: exactly these, e.g. "https://chat.example.com".
    allowed_origins: tuple[str, ...] = ()
    public: bool = False  # true: allow a non-loopback ui_host without login (anyone reaching the port chats)
    # Host names and addresses the UI answers to when [server] ui_host is not loopback ("chat.example.com",
    # "10.0.0.5"); any other Host header gets 403 (DNS rebinding). Loopback names, a single-address ui_host and the
    # hosts of allowed_origins are always served; with ui_host = "0.0.0.0" and none of them set, the start asks.
    hosts: tuple[str, ...] = ()
    # Reverse proxies in front of the UI (addresses or networks, "10.0.0.5", "10.0.0.0/24"): from these peers only,
    # X-Forwarded-For / X-Forwarded-Proto name the client and the scheme (login throttle, origin check).
    trusted_proxies: tuple[str, ...] = ()
    stream_flush_ms: float = 40.0  # answer text reaches the browser at most this often (ms); 0 = every token
    # More login accounts besides username/password, name = "password hash" (python -m backend hash-password):
    # each has its own chats and can open the chats others share with a link.
    users: Mapping[str, str] = field(default_factory=lambda: types.MappingProxyType({}))
    name: str = "Qwen Chat"  # the app's name: browser tab, header, welcome screen
    logo: str = ""  # an image file (.png .svg .jpg .webp) shown as the logo; "" = Chainlit's
    favicon: str = ""  # an image file (.png .svg .ico) for the browser tab; "" = Chainlit's
    accent: str = ""  # "#rrggbb": buttons, links and highlights; "" = Chainlit's

    def __post_init__(self) -> None:
        if self.auth and not self.password:
            raise ConfigError(
                "ui.password",
                "",
                "a password when [ui].auth is on: set [ui].password in "
                "config.toml or the QWENCHAT_UI_PASSWORD environment variable",
            )
        if self.auth and not self.username.strip():
            raise ConfigError("ui.username", self.username, "a user name when [ui].auth is on")
        check_history_db(self.history_db)
        if not 0 <= self.history_wait <= MAX_HISTORY_WAIT:
            raise ConfigError("ui.history_wait", self.history_wait, f"seconds from 0 to {MAX_HISTORY_WAIT:g}")


@dataclass(frozen=True)
class HealthSettings:
    """Poll intervals and limits, all in seconds.

    ==================  =======  ==========================================================
    field               default  meaning
    ==================  =======  ==========================================================
    poll_starting       1.0      interval while starting, degraded or down
    poll_ready          5.0      interval while ready
    probe_every         30.0     seconds between probe generations while ready
    probe_timeout       10.0     a probe taking longer is "timed out" → degraded
    probe_slow          5.0      a probe answering slower than this → degraded ("slow")
    request_timeout     3.0      limit for GET /health and GET /v1/models
    startup_limit       600.0    never ready within this → down (counts from start / the supervisor's "since")
    ==================  =======  ==========================================================

    ``restart_after_failed_probes`` (3, a count) is the supervisor's: it probes the engine it launched
    every ``probe_every`` s (again every ``probe_timeout`` s after a failure) and restarts it after that
    many probes in a row got no reply within ``probe_timeout``, i.e. at most
    ``probe_every + restart_after_failed_probes × probe_timeout`` seconds after it hung.
    """

    poll_starting: float = 1.0
    poll_ready: float = 5.0
    probe_every: float = 30.0
    probe_timeout: float = 10.0
    probe_slow: float = 5.0
    request_timeout: float = 3.0
    startup_limit: float = 600.0
    restart_after_failed_probes: int = 3

    def __post_init__(self) -> None:
        n = self.restart_after_failed_probes
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(
                "health.restart_after_failed_probes", n, "a whole number of probes, 1 or more (3: the default)"
            )
        for f in dataclasses.fields(self):
            if f.name == "restart_after_failed_probes":
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"health.{f.name}", value, "a positive number of seconds")
        if self.probe_slow > self.probe_timeout:
            raise ConfigError(
                "health.probe_slow", self.probe_slow, f"at most health.probe_timeout ({self.probe_timeout:g})"
            )


@dataclass(frozen=True)
class LoggingSettings:
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    dir: str = "logs"
    max_bytes: int = 20 * 1024 * 1024  # engine.log and ui.log rotate past this size …
    backups: int = 3  # … keeping this many older files (engine.log.1 …)

    def __post_init__(self) -> None:
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 65536:
            raise ConfigError("logging.max_bytes", self.max_bytes, "a size in bytes of at least 65536 (64 KiB)")
        if isinstance(self.backups, bool) or not isinstance(self.backups, int) or not 1 <= self.backups <= 99:
            raise ConfigError("logging.backups", self.backups, "a number of older log files from 1 to 99")

    @property
    def resolved_dir(self) -> Path:
        p = Path(self.dir).expanduser()
        return (p if p.is_absolute() else ROOT / p).resolve()


FLEET_POLICIES = ("round_robin", "power_of_two", "cache_aware", "random", "consistent_hash")


@dataclass(frozen=True)
class FleetSettings:
    """Several engine replicas behind vLLM's own load balancer (``vllm-router``, in the app environment).

    A fleet is on when it lists at least one replica. The router then listens on ``[server] host:port``
    (where a single engine would) and the UI talks to it; the replicas are:

    - ``local``: this many replicas launched on this machine, on ports ``[server] port + 1`` … (on a
      multi-GPU box each takes its own group of ``[server] tensor_parallel_size`` GPUs);
    - ``remote``: replicas started elsewhere, each an OpenAI base URL (``"http://gpu-b:8000/v1"``); they
      take the key ``[server] api_key`` (or none), and must serve the same base model and adapters.
    """

    local: int = 0
    remote: tuple[str, ...] = ()
    policy: str = "round_robin"  # vllm-router --policy

    @property
    def enabled(self) -> bool:
        return self.local > 0 or bool(self.remote)

    @property
    def size(self) -> int:
        return self.local + len(self.remote)


@dataclass(frozen=True)
class Settings:
    model: ModelSettings = field(default_factory=ModelSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    lora: LoraSettings = field(default_factory=LoraSettings)
    client: ClientSettings = field(default_factory=ClientSettings)
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    ui: UISettings = field(default_factory=UISettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    fleet: FleetSettings = field(default_factory=FleetSettings)
    base_url: str = ""  # OPENAI_BASE_URL: external mode when set
    api_key: str = ""  # OPENAI_API_KEY or the launcher's per-launch key

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def external(self) -> bool:
        return bool(self.base_url)

    @property
    def engine_base_url(self) -> str:
        """The OpenAI-compatible base URL (ends in /v1) the app talks to."""
        if self.base_url:
            return self.base_url.rstrip("/")
        host = "127.0.0.1" if self.server.host in ("0.0.0.0", "::", "") else self.server.host
        return f"http://{host}:{self.server.port}/v1"

    def replica_url(self, index: int) -> str:
        """The OpenAI base URL (ends in /v1) of fleet replica ``index``: the local ones first, then the remote."""
        if index < self.fleet.local:
            host = "127.0.0.1" if self.server.host in ("0.0.0.0", "::", "") else self.server.host
            return f"http://{host}:{self.server.port + 1 + index}/v1"
        return self.fleet.remote[index - self.fleet.local].rstrip("/")

    @property
    def replica_urls(self) -> tuple[str, ...]:
        """Every fleet replica's OpenAI base URL; empty without a fleet."""
        return tuple(self.replica_url(i) for i in range(self.fleet.size))

    @property
    def budget_max_model_len(self) -> int:
        return self.budget.max_model_len or self.model.max_model_len


SECTIONS = {f.name: f.type for f in dataclasses.fields(Settings) if f.name not in ("base_url", "api_key")}
_SECTION_CLASSES = {
    "model": ModelSettings,
    "server": ServerSettings,
    "lora": LoraSettings,
    "client": ClientSettings,
    "budget": BudgetSettings,
    "ui": UISettings,
    "health": HealthSettings,
    "logging": LoggingSettings,
    "fleet": FleetSettings,
}


def _validate(s: Settings) -> None:
    def need(ok: bool, key: str, value: Any, expected: str) -> None:
        if not ok:
            raise ConfigError(key, value, expected)

    if s.base_url:
        need(
            http_base_url(s.base_url),
            "OPENAI_BASE_URL",
            without_password(s.base_url),
            'the OpenAI-compatible server\'s base URL, http:// or https://, like "http://gpu-box:8000/v1"',
        )
    need(hub_mod.classify_model_path(s.model.path, ROOT) is not None, "model.path", s.model.path, hub_mod.PATH_FORMS)
    need(s.model.max_model_len > 0, "model.max_model_len", s.model.max_model_len, "a positive number of tokens")
    need(0 <= s.model.temperature <= 2, "model.temperature", s.model.temperature, "a number from 0 to 2")
    need(0 < s.model.top_p <= 1, "model.top_p", s.model.top_p, "a number in (0, 1]")
    need(s.model.top_k == -1 or s.model.top_k > 0, "model.top_k", s.model.top_k, "-1 (off) or a positive integer")
    need(0 <= s.model.min_p <= 1, "model.min_p", s.model.min_p, "a number from 0 to 1")
    for key in ("port", "ui_port"):
        v = getattr(s.server, key)
        need(0 < v < 65536, f"server.{key}", v, "a TCP port from 1 to 65535")
    need(
        s.server.port != s.server.ui_port or s.server.host != s.server.ui_host,
        "server.ui_port",
        s.server.ui_port,
        f"a port different from server.port ({s.server.port})",
    )
    need(s.server.engine in ("auto", "cpu", "gpu"), "server.engine", s.server.engine, 'one of "auto", "cpu", "gpu"')
    need(
        0 < s.server.gpu_memory_utilization <= 1,
        "server.gpu_memory_utilization",
        s.server.gpu_memory_utilization,
        "a fraction in (0, 1]",
    )
    need(s.server.max_num_seqs > 0, "server.max_num_seqs", s.server.max_num_seqs, "a positive integer")
    need(
        s.server.cpu_kvcache_gib > 0,
        "server.cpu_kvcache_gib",
        s.server.cpu_kvcache_gib,
        "a positive whole number of GiB (VLLM_CPU_KVCACHE_SPACE)",
    )
    need(s.server.restart_attempts >= 0, "server.restart_attempts", s.server.restart_attempts, "0 or more")
    need(
        s.server.restart_window_min > 0,
        "server.restart_window_min",
        s.server.restart_window_min,
        "a positive number of minutes",
    )
    need(
        s.server.startup_timeout > 0, "server.startup_timeout", s.server.startup_timeout, "a positive number of seconds"
    )
    need(
        s.server.tensor_parallel_size >= 1,
        "server.tensor_parallel_size",
        s.server.tensor_parallel_size,
        "1 or more GPUs",
    )
    need(
        s.server.data_parallel_size >= 1,
        "server.data_parallel_size",
        s.server.data_parallel_size,
        "1 or more replicas",
    )
    need(
        s.lora.max_lora_rank in VLLM_LORA_RANKS,
        "lora.max_lora_rank",
        s.lora.max_lora_rank,
        "one of " + ", ".join(map(str, VLLM_LORA_RANKS)) + " (the ranks vLLM accepts)",
    )
    need(s.lora.max_loras > 0, "lora.max_loras", s.lora.max_loras, "a positive integer")
    need(
        s.lora.max_cpu_loras >= s.lora.max_loras,
        "lora.max_cpu_loras",
        s.lora.max_cpu_loras,
        f"at least lora.max_loras ({s.lora.max_loras})",
    )
    for name in s.lora.modules:
        need(
            bool(name) and "/" not in name and not name.startswith("."),
            "lora.modules",
            name,
            "adapter names without '/' or a leading '.'",
        )
    for adapter, parent in s.lora.parents.items():
        need(
            bool(adapter.strip()) and bool(parent.strip()) and adapter != parent,
            f"lora.parents.{adapter}",
            parent,
            'the name of the base model this adapter was trained on, e.g. pirate = "smollm2-135m-instruct"',
        )
        need(
            parent not in s.lora.parents,
            f"lora.parents.{adapter}",
            parent,
            f"a base model's name ({parent!r} is listed as an adapter itself)",
        )
    for key in ("connect_timeout", "first_token_timeout", "idle_timeout", "total_timeout"):
        v = getattr(s.client, key)
        need(v > 0, f"client.{key}", v, "a positive number of seconds")
    need(s.client.max_retries >= 0, "client.max_retries", s.client.max_retries, "0 (diagnose: no retries) or more")
    need(s.client.retry_backoff >= 0, "client.retry_backoff", s.client.retry_backoff, "0 or more seconds")
    need(s.budget.reply_reserve > 0, "budget.reply_reserve", s.budget.reply_reserve, "a positive number of tokens")
    need(
        s.budget_max_model_len > s.budget.reply_reserve,
        "budget.reply_reserve",
        s.budget.reply_reserve,
        f"fewer tokens than max_model_len ({s.budget_max_model_len}) so the prompt has room",
    )
    need(s.ui.language in ("auto", "en", "zh"), "ui.language", s.ui.language, 'one of "auto", "en", "zh"')
    need(s.ui.wait_for_ready >= 0, "ui.wait_for_ready", s.ui.wait_for_ready, "0 or more seconds")
    for origin in s.ui.allowed_origins:
        need(
            canonical_origin(origin) is not None,
            "ui.allowed_origins",
            origin,
            'origins like "http://localhost:8080" or "https://chat.example.com": scheme, host and optional port, '
            "no path",
        )
    for host in s.ui.hosts:
        need(
            host_name_of(host) is not None,
            "ui.hosts",
            host,
            'host names or IP addresses the UI is opened at, like "chat.example.com" or "10.0.0.5" (no scheme, port '
            "or path; QWENCHAT_UI_HOSTS separates them with spaces)",
        )
    _validate_branding(s, need)
    for proxy in s.ui.trusted_proxies:
        need(
            _is_address_or_network(proxy),
            "ui.trusted_proxies",
            proxy,
            'addresses or networks of the reverse proxies in front of the UI, like "10.0.0.5" or "10.0.0.0/24"',
        )
    need(
        0 <= s.ui.stream_flush_ms <= 1000,
        "ui.stream_flush_ms",
        s.ui.stream_flush_ms,
        "0 (send every token at once) to 1000 milliseconds",
    )
    _validate_fleet(s, need)


def _is_address_or_network(value: str) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


def _validate_fleet(s: Settings, need: Any) -> None:
    f = s.fleet
    need(
        not isinstance(f.local, bool) and isinstance(f.local, int) and 0 <= f.local <= 64,
        "fleet.local",
        f.local,
        "a number of replicas to launch on this machine, 0 to 64",
    )
    need(f.policy in FLEET_POLICIES, "fleet.policy", f.policy, "one of " + ", ".join(f'"{p}"' for p in FLEET_POLICIES))
    for url in f.remote:
        need(
            http_base_url(url, bare=True),
            "fleet.remote",
            without_password(url),
            'replica base URLs like "http://gpu-b:8000/v1"',
        )
    need(len(set(s.replica_urls)) == f.size, "fleet.remote", f.remote, "each replica once (one listed twice)")
    if f.enabled:
        need(
            s.server.data_parallel_size == 1,
            "server.data_parallel_size",
            s.server.data_parallel_size,
            "1 with a [fleet]: the fleet's replicas are the data-parallel copies",
        )
        need(
            not (s.external and f.local),
            "fleet.local",
            f.local,
            "0 with OPENAI_BASE_URL set (a UI-only start launches nothing; list the replicas in fleet.remote)",
        )


BRANDING_IMAGE_SUFFIXES = {"logo": (".png", ".svg", ".jpg", ".jpeg", ".webp"), "favicon": (".png", ".svg", ".ico")}
_ACCENT = re.compile(r"#[0-9a-fA-F]{6}")


def resolve_path(value: str) -> Path:
    """A path from config.toml: ``~`` expanded, relative to the repository folder."""
    p = Path(value).expanduser()
    return (p if p.is_absolute() else ROOT / p).resolve()


def _validate_branding(s: Settings, need: Callable[[bool, str, Any, str], None]) -> None:
    """[ui] name, logo, favicon, accent, users and [lora] starters: checked at start, each with its fix."""
    from .passwords import is_password_hash

    need(bool(s.ui.name.strip()) and len(s.ui.name) <= 60, "ui.name", s.ui.name, "a name of 1 to 60 characters")
    need(
        not s.ui.accent or _ACCENT.fullmatch(s.ui.accent) is not None,
        "ui.accent",
        s.ui.accent,
        'a colour as "#rrggbb", e.g. "#2563eb" (or "" for the default)',
    )
    for key in ("logo", "favicon"):
        value = getattr(s.ui, key)
        if not value:
            continue
        suffixes = BRANDING_IMAGE_SUFFIXES[key]
        need(
            value.lower().endswith(suffixes),
            f"ui.{key}",
            value,
            "an image file ending in " + ", ".join(suffixes),
        )
        need(resolve_path(value).is_file(), f"ui.{key}", value, "an existing file (relative to the qwenchat folder)")
    for name, stored in s.ui.users.items():
        need(
            bool(name.strip()) and name == name.strip() and len(name) <= 64,
            "ui.users",
            name,
            "user names of 1 to 64 characters without surrounding spaces",
        )
        need(name != s.ui.username, "ui.users", name, f"names other than [ui].username ({s.ui.username!r})")
        need(
            is_password_hash(stored),
            f"ui.users.{name}",
            stored[:16] + ("..." if len(stored) > 16 else ""),
            "a password hash made with `python -m backend hash-password` (never the password itself)",
        )
    for model, texts in s.lora.starters.items():
        need(bool(model.strip()), "lora.starters", model, "model or adapter names")
        need(
            len(texts) <= 6 and all(t.strip() and len(t) <= 500 for t in texts),
            f"lora.starters.{model}",
            list(texts),
            "at most 6 non-empty questions of at most 500 characters ([] = no starters for it)",
        )


# ---------------------------------------------------------------- loading


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin is tuple:
        return "a list of strings"
    if origin is collections.abc.Mapping and typing.get_args(tp)[1] is not str:
        return 'a table of name = ["text", ...]'
    if origin is collections.abc.Mapping:
        return 'a table of name = "value"'
    return str(tp)


def _coerce(key: str, value: Any, tp: Any, from_env: bool) -> Any:
    """Check/convert one value against the field's annotation; env values arrive as strings."""
    origin = typing.get_origin(tp)
    bad = ConfigError(key, value, _type_name(tp))
    if origin is Literal:
        choices = typing.get_args(tp)
        for candidate in (value, str(value).upper(), str(value).lower()) if isinstance(value, str) else (value,):
            if candidate in choices:
                return candidate
        raise bad
    if tp is bool:
        if isinstance(value, bool):
            return value
        if (
            from_env
            and isinstance(value, str)
            and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off")
        ):
            return value.lower() in ("1", "true", "yes", "on")
        raise bad
    if tp is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return value
        if from_env and isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                raise bad from None
        raise bad
    if tp is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, (int, float)):
            return float(value)
        if from_env and isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                raise bad from None
        raise bad
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad
    if origin is tuple:
        if from_env and isinstance(value, str):
            import shlex

            return tuple(shlex.split(value))
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise bad
    if origin is collections.abc.Mapping and typing.get_args(tp)[1] is not str:
        # name = ["text", ...] (starters); the environment spells it "name=text|text,other=text"
        if from_env and isinstance(value, str):
            pairs = [v.partition("=") for v in value.split(",") if v.strip()]
            if any(not sep for _, sep, _ in pairs):
                raise bad
            value = {n.strip(): [x for x in texts.split("|") if x.strip()] for n, _, texts in pairs}
        if isinstance(value, dict) and all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in value.values()
        ):
            return types.MappingProxyType({str(k): tuple(v) for k, v in value.items()})
        raise bad
    if origin is collections.abc.Mapping:
        # Accept a TOML table {name = "path"}, a list of "name=path" strings, or an env
        # string "a=/p1,b=/p2" (the --lora-modules spelling users copy from vLLM docs).
        if from_env and isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if isinstance(value, list):
            out: dict[str, str] = {}
            for item in value:
                if not isinstance(item, str) or "=" not in item:
                    raise bad
                name, _, path = item.partition("=")
                out[name.strip()] = path.strip()
            return types.MappingProxyType(out)
        if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            return types.MappingProxyType(dict(value))
        raise bad
    raise bad


def _section(name: str, raw: Mapping[str, Any], env_values: Mapping[str, str]) -> Any:
    cls = _SECTION_CLASSES[name]
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise ConfigError(f"{name}.{key}", value, "one of the keys " + ", ".join(sorted(fields)))
        kwargs[key] = _coerce(f"{name}.{key}", value, hints[key], from_env=False)
    for key, value in env_values.items():
        env_key = f"QWENCHAT_{name.upper()}_{key.upper()}"
        kwargs[key] = _coerce(env_key, value, hints[key], from_env=True)
    return cls(**kwargs)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(str(path), "(missing)", "an existing TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "(unreadable)", f"valid TOML ({exc})") from None


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, values in top.items():
        if isinstance(values, dict) and isinstance(out.get(section), dict):
            out[section].update(values)
        else:
            out[section] = values
    return out


def load_settings(
    config_path: str | Path | None = None,
    profile: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Build Settings from config.toml (+ profile) + environment; ConfigError on any bad value."""
    env = os.environ if env is None else env
    config_path = Path(config_path or env.get("QWENCHAT_CONFIG") or ROOT / "config.toml")
    data = _read_toml(config_path) if config_path.exists() or "QWENCHAT_CONFIG" in env else {}
    profile = profile or env.get("QWENCHAT_PROFILE") or ""
    if profile:
        ppath = Path(profile) if profile.endswith(".toml") else ROOT / "profiles" / f"{profile}.toml"
        if not ppath.exists():
            available = sorted(p.stem for p in (ROOT / "profiles").glob("*.toml"))
            raise ConfigError("profile", profile, "one of " + ", ".join(available) + " or a path to a .toml file")
        data = _merge(data, _read_toml(ppath))
    for section in data:
        if section not in _SECTION_CLASSES:
            raise ConfigError(
                section, "[section]", "one of the sections " + ", ".join(f"[{s}]" for s in _SECTION_CLASSES)
            )
        if not isinstance(data[section], dict):
            raise ConfigError(section, data[section], "a [section] table")
    sections: dict[str, Any] = {}
    for name, cls in _SECTION_CLASSES.items():
        env_values: dict[str, str] = {}
        for f in dataclasses.fields(cls):
            env_key = f"QWENCHAT_{name.upper()}_{f.name.upper()}"
            if env_key in env:
                env_values[f.name] = env[env_key]
        sections[name] = _section(name, data.get(name, {}), env_values)
    base_url = env.get("OPENAI_BASE_URL", "").strip()
    # External mode: the openai SDK's own variable. Launched engine: the launcher's per-launch key
    # first (a stray OPENAI_API_KEY in the environment must not replace it).
    if base_url:
        api_key = env.get("OPENAI_API_KEY", "")
    else:
        api_key = env.get(contract.ENV_ENGINE_API_KEY, "") or env.get("OPENAI_API_KEY", "")
    return Settings(**sections, base_url=base_url, api_key=api_key)


def replace(settings: Settings, **sections: Any) -> Settings:
    """Return a copy with whole sections or top-level fields replaced (tests, the launcher)."""
    return dataclasses.replace(settings, **sections)
