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

Sources, last wins: built-in defaults < config.toml < profile (profiles/<name>.toml) < environment
``QWENCHAT_<SECTION>_<KEY>`` (e.g. ``QWENCHAT_NETWORK_ENGINE_PORT=8001``), plus the openai SDK's own
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``: when ``OPENAI_BASE_URL`` is set the app talks to that server and launches
nothing ("external" mode). The files are read by pydantic-settings' ``TomlConfigSettingsSource``, the environment by
its ``EnvSettingsSource``; between them and the models, one pre-pass on plain dicts:

- the names of before the split by concern (``[server] port``, ``[ui] auth``, ``[budget] max_model_len`` …: table
  ``RENAMED``) keep working, in TOML and in the environment, with one warning line naming the new key;
- each file's own values are checked, even those a later source replaces;
- a profile's key replaces config.toml's, a table too (never merged into it);
- the environment's strings are read in their key's spelling (``FromEnv``) and converted by pydantic's lax mode,
  an error naming the variable; unknown sections and keys stay errors (the models forbid extras).

The section models are in ``settings_sections.py``, their building blocks in ``settings_types.py``.

A bad value raises ``ConfigError`` naming the key (or the environment variable), the value and the accepted forms.
"""

from __future__ import annotations

import functools
import logging
import os
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from . import contract
from .errors import ConfigError as ConfigError

# canonical_origin, host_name_of, is_loopback and served_host_names: re-exported for callers still importing them
# from here; ROOT and home_dir too. New code imports backend.hosts and backend.paths.
from .hosts import canonical_origin as canonical_origin
from .hosts import host_name_of as host_name_of
from .hosts import http_base_url, without_password
from .hosts import is_loopback as is_loopback
from .hosts import served_host_names as served_host_names
from .paths import ROOT as ROOT
from .paths import home_dir as home_dir

# The sections and the names beside them, for callers importing them from here.
from .settings_sections import DEMO_ADAPTER_DIR as DEMO_ADAPTER_DIR
from .settings_sections import EMBEDDED_ADAPTER_NAME as EMBEDDED_ADAPTER_NAME
from .settings_sections import EMBEDDED_MODEL_NAME as EMBEDDED_MODEL_NAME
from .settings_sections import HISTORY_DB_FORMS as HISTORY_DB_FORMS
from .settings_sections import VLLM_LORA_RANKS as VLLM_LORA_RANKS
from .settings_sections import BrandingSettings as BrandingSettings
from .settings_sections import BudgetSettings as BudgetSettings
from .settings_sections import ClientSettings as ClientSettings
from .settings_sections import FleetSettings as FleetSettings
from .settings_sections import HealthSettings as HealthSettings
from .settings_sections import HistorySettings as HistorySettings
from .settings_sections import HubSettings as HubSettings
from .settings_sections import LoggingSettings as LoggingSettings
from .settings_sections import LoginSettings as LoginSettings
from .settings_sections import LoraSettings as LoraSettings
from .settings_sections import ModelSettings as ModelSettings
from .settings_sections import NetworkSettings as NetworkSettings
from .settings_sections import SupervisionSettings as SupervisionSettings
from .settings_sections import UISettings as UISettings
from .settings_sections import UploadsSettings as UploadsSettings
from .settings_sections import VllmSettings as VllmSettings
from .settings_types import FromEnv, Section, Str, config_error, need

logger = logging.getLogger(__name__)


class Settings(BaseSettings):
    # The environment's names (load_settings runs pydantic-settings' EnvSettingsSource with these):
    # QWENCHAT_<SECTION>_<KEY>, one "_" after the section (the keys have their own), any case.
    model_config = SettingsConfigDict(
        extra="forbid", frozen=True, env_prefix="QWENCHAT_", env_nested_delimiter="_", env_nested_max_split=1
    )

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
            raise config_error(exc, (), SECTIONS) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keywords only: ``Settings()`` alone is the built-in defaults, whatever the environment holds (tests).
        ``load_settings`` runs pydantic-settings' TOML and environment sources itself, for the files and the
        environment of that call, and gives their values, after the pre-pass, as keywords."""
        return (init_settings,)

    @model_validator(mode="after")
    def _across_sections(self) -> Settings:
        if self.base_url:
            need(
                http_base_url(self.base_url),
                "OPENAI_BASE_URL",
                without_password(self.base_url),
                'the OpenAI-compatible server\'s base URL, http:// or https://, like "http://gpu-box:8000/v1"',
            )
        need(
            self.model.max_model_len > self.budget.reply_reserve,
            "budget.reply_reserve",
            self.budget.reply_reserve,
            f"fewer tokens than model.max_model_len ({self.model.max_model_len}) so the prompt has room",
        )
        fleet = self.fleet
        twice = "each replica once (one listed twice)"
        need(len(set(self.replica_urls)) == fleet.size, "fleet.remote", fleet.remote, twice)
        if fleet.enabled:
            need(
                self.vllm.data_parallel_size == 1,
                "vllm.data_parallel_size",
                self.vllm.data_parallel_size,
                "1 with a [fleet]: the fleet's replicas are the data-parallel copies",
            )
            need(
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


# ---------------------------------------------------------------- the pre-pass


class _Warned:
    """The old names one load met: a warning line for each, once."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def __call__(self, old: str, new: str, where: str) -> None:
        if old not in self.names:
            self.names.add(old)
            logger.warning("%s: %s is now %s (the old name still works; rename it)", where, old, new)


@functools.cache
def _adapter(section: str, name: str) -> TypeAdapter[Any]:
    field = SECTIONS[section].model_fields[name]
    return TypeAdapter(Annotated[field.annotation, field])  # type: ignore[arg-type]


def _checked(where: tuple[str, str], value: Any, strict: bool | None = None) -> Any:
    """One key's value through its field's type and checks (not the section's validators); ConfigError if bad."""
    try:
        return _adapter(*where).validate_python(value, strict=strict)
    except ValidationError as exc:
        raise config_error(exc, where, SECTIONS) from None


def _from_toml(path: Path, warn: _Warned) -> dict[str, Any]:
    """One TOML file (config.toml or a profile), read by pydantic-settings' TomlConfigSettingsSource; old names
    moved to the new ones, each value checked; an unknown section or key is an error naming it and the file."""
    if not path.is_file():
        raise ConfigError(str(path), "(missing)", "an existing TOML file")
    try:
        raw = TomlConfigSettingsSource(Settings, toml_file=path)()
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "(unreadable)", f"valid TOML ({exc})") from None
    data: dict[str, Any] = {}
    given: dict[tuple[str, str], str] = {}
    for section, table in raw.items():
        if section not in (*SECTIONS, *GONE):
            sections = ", ".join(f"[{s}]" for s in SECTIONS)
            raise ConfigError(section, "[section]", f"one of the sections {sections} (in {path.name})")
        if not isinstance(table, dict):
            data[section] = table  # refused by the validation: no table
            continue
        for name, value in table.items():
            new = RENAMED.get((section, name))
            if new is None and section in GONE:
                known = ", ".join(k for s, k in RENAMED if s == section)
                raise ConfigError(f"{section}.{name}", value, "one of the keys " + known)
            if new is not None:
                warn(f"[{section}] {name}", f"[{new[0]}] {new[1]}", path.name)
                if new == ("model", "max_model_len") and value == 0:
                    continue  # the old "ask the server", which the budget always does now
            where = new or (section, name)
            if where in given:
                both = f"{given[where]} and [{section}] {name}"
                expected = f"one value ({path.name} sets both {both}; keep [{where[0]}] {where[1]})"
                raise ConfigError(".".join(where), value, expected)
            given[where] = f"[{section}] {name}"
            fields = SECTIONS[where[0]].model_fields
            if where[1] not in fields:
                raise ConfigError(
                    ".".join(where), value, f"one of the keys {', '.join(sorted(fields))} (in {path.name})"
                )
            _checked(where, value)  # each file's own values, even those a later source replaces
            data.setdefault(where[0], {})[where[1]] = value
    return data


def _variable(section: str, name: str) -> str:
    return f"QWENCHAT_{section}_{name}".upper()


def _env_names(env: Mapping[str, str], warn: _Warned) -> dict[str, str]:
    """The settings' variables of ``env`` by their new names -> the name each was given as (old names moved, a
    warning line each); every other variable left out."""
    pairs = [(_variable(*old), _variable(*new)) for old, new in RENAMED.items()]
    pairs += [(_variable(s, n), _variable(s, n)) for s, cls in SECTIONS.items() for n in cls.model_fields]
    given_as: dict[str, str] = {}
    for variable, new in pairs:
        if variable not in env:
            continue
        if variable != new:
            warn(variable, new, "environment")
        if variable == "QWENCHAT_BUDGET_MAX_MODEL_LEN" and env[variable].strip() == "0":
            continue  # the old "ask the server", which the budget always does now
        if new in given_as:
            raise ConfigError(new, env[variable], f"one value: {given_as[new]} is set too")
        given_as[new] = variable
    return given_as


def _from_string(variable: str, raw: str, where: tuple[str, str]) -> Any:
    """A variable's value for ``where``: its list or table spelling read (``FromEnv``), then pydantic's lax
    conversion; a ConfigError naming the variable and the key."""
    field = SECTIONS[where[0]].model_fields[where[1]]
    spelled = next((m.parse for m in field.metadata if isinstance(m, FromEnv)), None)
    try:
        return _checked(where, spelled(raw) if spelled else raw, strict=False)
    except ConfigError as exc:
        shown = exc.value if isinstance(exc.value, str) else raw  # a bad item, else the variable's text
        raise ConfigError(f"{variable} ({exc.key})", shown, exc.expected) from None
    except ValueError:  # a list or table spelling that does not parse
        raise ConfigError(f"{variable} ({'.'.join(where)})", raw, field.description or "") from None


def _from_environment(env: Mapping[str, str], warn: _Warned) -> dict[str, Any]:
    """``QWENCHAT_<SECTION>_<KEY>`` (old names too), read by pydantic-settings' EnvSettingsSource, each value
    converted; ``OPENAI_BASE_URL`` and the engine key."""
    given_as = _env_names(env, warn)
    source = EnvSettingsSource(Settings)  # named as Settings.model_config says
    source.env_vars = {new.lower(): env[old] for new, old in given_as.items()}  # this call's environment
    values: dict[str, Any] = {
        section: {
            name: _from_string(given_as[_variable(section, name)], raw, (section, name)) for name, raw in table.items()
        }
        for section, table in source().items()
    }
    base_url = env.get("OPENAI_BASE_URL", "").strip()
    # External mode: the openai SDK's own variable. Launched engine: the launcher's per-launch key
    # first (a stray OPENAI_API_KEY in the environment must not replace it).
    if base_url:
        values["base_url"], values["api_key"] = base_url, env.get("OPENAI_API_KEY", "")
    else:
        values["api_key"] = env.get(contract.ENV_ENGINE_API_KEY, "") or env.get("OPENAI_API_KEY", "")
    return values


def _over(lower: Mapping[str, Any], higher: Mapping[str, Any]) -> dict[str, Any]:
    """``higher``'s keys over ``lower``'s, section by section: a key's value (a table too) replaces, never merges."""
    out = dict(lower)
    for section, table in higher.items():
        below = out.get(section)
        out[section] = {**below, **table} if isinstance(below, dict) and isinstance(table, dict) else table
    return out


def load_settings(
    config_path: str | Path | None = None,
    profile: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Build Settings from config.toml (+ profile) + environment; ConfigError on any bad value."""
    env = os.environ if env is None else env
    warn = _Warned()
    profile = profile or env.get("QWENCHAT_PROFILE") or ""
    profile_path = None
    if profile:
        profile_path = Path(profile) if profile.endswith(".toml") else ROOT / "profiles" / f"{profile}.toml"
        if not profile_path.exists():
            available = sorted(p.stem for p in (ROOT / "profiles").glob("*.toml"))
            raise ConfigError("profile", profile, "one of " + ", ".join(available) + " or a path to a .toml file")
    values: dict[str, Any] = {}
    config = Path(config_path or env.get("QWENCHAT_CONFIG") or ROOT / "config.toml")
    if config.exists() or "QWENCHAT_CONFIG" in env:
        values = _from_toml(config, warn)
    if profile_path is not None:
        values = _over(values, _from_toml(profile_path, warn))
    return Settings(**_over(values, _from_environment(env, warn)))


Model = TypeVar("Model", bound=BaseModel)


def replace(obj: Model, **changes: Any) -> Model:
    """A checked copy of Settings or of one section with some fields replaced (tests, the launcher)."""
    return type(obj)(**{**{name: getattr(obj, name) for name in type(obj).model_fields}, **changes})
