"""Chainlit's settings that follow ours (backend/ui/chainlit_settings.py): .chainlit/config.toml says what we set
for the shipped settings, and ``apply`` sets every one of them where Chainlit reads it."""

from __future__ import annotations

import tomllib

import pytest

from backend.settings import ROOT, BrandingSettings, NetworkSettings, Settings, load_settings
from backend.ui.chainlit_settings import SHIPPED_CSS, THEME_CSS, apply, chainlit_settings

CHAINLIT_TOML = ROOT / ".chainlit" / "config.toml"


def _in_toml(key: str) -> object:
    value = tomllib.loads(CHAINLIT_TOML.read_text(encoding="utf-8"))
    for part in key.split("."):
        value = value[part]
    return value


def _part(config: object, key: str) -> tuple[object, str]:
    """(the object holding ``key``'s last part, that part) in Chainlit's config."""
    *path, name = key.split(".")
    for part in path:
        config = getattr(config, part.lower())
    return config, name


@pytest.mark.parametrize(
    "settings",
    [load_settings(ROOT / "config.toml", env={}), Settings()],
    ids=["shipped config.toml", "defaults"],
)
def test_chainlits_config_toml_says_what_we_set_for_the_shipped_settings(settings):
    assert not settings.login.enable  # no login, so no history to share from
    ours = chainlit_settings(settings, sharing=False)
    differ = {key: (value, _in_toml(key)) for key, value in ours.items() if _in_toml(key) != value}
    assert not differ, f"(ours, .chainlit/config.toml): {differ}; change .chainlit/config.toml to say what we set"


def test_apply_sets_each_setting_where_chainlit_reads_it(monkeypatch):
    from chainlit.config import config
    from starlette.applications import Starlette
    from starlette.middleware.cors import CORSMiddleware

    for key in chainlit_settings(Settings(), sharing=False):
        part, name = _part(config, key)
        monkeypatch.setattr(part, name, getattr(part, name))  # put back after the test
    http_app = Starlette()
    http_app.add_middleware(CORSMiddleware, allow_origins=["*"])
    settings = Settings(
        branding=BrandingSettings(name="Team chat", accent="#16a34a"),
        network=NetworkSettings(allowed_origins=("https://chat.example.com", "http://h:8080")),
    )

    apply(settings, sharing=True, http_app=http_app)

    wanted = chainlit_settings(settings, sharing=True)
    assert {k: v for k, v in wanted.items() if "file_upload" not in k} == {
        "UI.name": "Team chat",
        "UI.custom_css": THEME_CSS,
        "features.allow_thread_sharing": True,
        "project.allow_origins": ["https://chat.example.com", "http://h:8080"],  # as browsers send them
        "project.user_session_timeout": 24 * 3600,  # [login] session_hours (Chainlit's own default: 15 days)
    }
    for key, value in wanted.items():
        part, name = _part(config, key)
        assert getattr(part, name) == value, key
    cors = next(m for m in http_app.user_middleware if m.cls is CORSMiddleware)
    assert cors.kwargs["allow_origins"] == wanted["project.allow_origins"]

    apply(Settings(), sharing=False, http_app=Starlette())  # back to the shipped ones; no CORS middleware: no error
    assert config.ui.custom_css == SHIPPED_CSS and config.ui.name == "Qwen Chat"
    assert config.features.allow_thread_sharing is False and config.project.allow_origins == []


def test_the_composers_upload_follows_uploads_settings():
    from backend.settings import UploadsSettings

    values = chainlit_settings(Settings(uploads=UploadsSettings(max_files=3, max_mb=2.5, enabled=False)), sharing=False)

    assert values["features.spontaneous_file_upload.enabled"] is False
    assert values["features.spontaneous_file_upload.max_files"] == 3
    assert values["features.spontaneous_file_upload.max_size_mb"] == 3  # whole MB, rounded up: ours checks exactly
    assert ".pdf" in values["features.spontaneous_file_upload.accept"]["*/*"]


@pytest.mark.parametrize(
    ("name", "mime", "taken"),
    [
        ("report.pdf", "application/pdf", True),
        ("notes.docx", "application/vnd.openxmlformats-officedocument.wordprocessingml.document", True),
        ("app.ts", "video/mp2t", True),  # what browsers call a TypeScript file
        ("data.csv", "text/csv", True),
        ("setup.exe", "application/x-msdownload", False),
    ],
)
def test_chainlits_upload_route_takes_the_files_we_read_whatever_type_the_browser_gives(monkeypatch, name, mime, taken):
    """Chainlit's own check of an upload (chainlit.server.validate_file_upload) with the settings ``apply`` sets."""
    import io

    from chainlit.config import config
    from chainlit.server import validate_file_upload
    from starlette.applications import Starlette
    from starlette.datastructures import Headers, UploadFile

    upload = config.features.spontaneous_file_upload
    for name_ in ("enabled", "accept", "max_files", "max_size_mb"):
        monkeypatch.setattr(upload, name_, getattr(upload, name_))
    apply(Settings(), sharing=False, http_app=Starlette())
    file = UploadFile(io.BytesIO(b"x"), filename=name, size=1, headers=Headers({"content-type": mime}))

    if taken:
        validate_file_upload(file)
    else:
        with pytest.raises(ValueError, match="not allowed"):
            validate_file_upload(file)
