"""The settings' building blocks (backend/settings.py): the value types of a key, ``key(default, form, ...)`` and the
``Section`` every ``[section]`` model derives from, and pydantic's errors turned into ``ConfigError``.

Scalars are strict: TOML's ``port = "80"`` or ``temperature = true`` is an error. The environment's strings are
converted before the models see them, by pydantic's lax mode ("8001" -> 8001, "yes" -> true; settings.py's pre-pass).
Lists and tables are TOML arrays and tables, and have a spelling of their own in one environment variable
(``FromEnv``: the pre-pass reads it).
"""

from __future__ import annotations

import shlex
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError
from pydantic_settings import NoDecode

from .errors import ConfigError


@dataclass(frozen=True)
class FromEnv:
    """How a list or a table is spelled in one environment variable (``Annotated`` metadata of its type, beside
    pydantic-settings' ``NoDecode``: the variable is not JSON)."""

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


def any_case(change: Callable[[str], str]) -> BeforeValidator:
    """A choice given in another case ("debug", "CPU") is still that choice."""
    return BeforeValidator(lambda v: change(v) if isinstance(v, str) else v)


Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]
#: A list of strings; the environment separates them with spaces (shell quoting: "a 'b c'").
Words = Annotated[tuple[str, ...], NoDecode, FromEnv(shlex.split)]
#: name = "value"; the environment: "a=/p1,b=/p2".
Table = Annotated[
    Mapping[str, str],
    BeforeValidator(_pairs),
    AfterValidator(types.MappingProxyType),
    NoDecode,
    FromEnv(lambda v: [item for item in v.split(",") if item.strip()]),
]
#: name = ["text", ...]; the environment: "name=text|text,other=text".
ListTable = Annotated[
    Mapping[str, tuple[str, ...]], AfterValidator(types.MappingProxyType), NoDecode, FromEnv(_starters_from_env)
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


def every_item(good: Callable[[str], bool]) -> AfterValidator:
    """Every item of a list is ``good``; else the error names the first bad one."""

    def check(values: tuple[str, ...]) -> tuple[str, ...]:
        for item in values:
            if not good(item):
                raise _BadItem(item)
        return values

    return AfterValidator(check)


def need(ok: bool, key: str, value: Any, expected: str) -> None:
    """A check across keys: a ConfigError naming ``key``, its value and what was expected, unless ``ok``."""
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
            raise config_error(exc, (type(self).section,), {type(self).section: type(self)}) from None


def config_error(exc: ValidationError, prefix: tuple[str, ...], sections: Mapping[str, type[Section]]) -> ConfigError:
    """pydantic's first error as a ConfigError: ``section.key``, the value, and the key's accepted forms (``sections``:
    the sections the error may be in, by name)."""
    err = exc.errors(include_url=False)[0]
    names = [str(part) for part in prefix + tuple(err["loc"]) if not isinstance(part, int)]
    cause = (err.get("ctx") or {}).get("error")
    value = cause.item if isinstance(cause, _BadItem) else err["input"]
    section = sections.get(names[0]) if names else None
    if err["type"] == "extra_forbidden" and len(names) == 1:
        return ConfigError(names[0], "[section]", "one of the sections " + ", ".join(f"[{s}]" for s in sections))
    if section is None or len(names) == 1:  # a section that is no table, or base_url / api_key
        return ConfigError(".".join(names), value, "a [section] table" if section else "a string")
    if err["type"] == "extra_forbidden":
        return ConfigError(".".join(names), value, "one of the keys " + ", ".join(sorted(section.model_fields)))
    form = section.model_fields[names[1]].description or err["msg"]
    if isinstance(cause, ValueError) and not isinstance(cause, _BadItem):
        form = str(cause)  # a validator's own words (the logo file is missing, not "an image file")
    return ConfigError(".".join(names), value, form)
