"""Pure UI helpers: dropdown items, sampling fields; the footer under each answer (backend/ui/markdown.py)."""

from __future__ import annotations

from backend.chat.budget import FitResult
from backend.chat.client import Finish, Usage
from backend.chat.health import HealthStatus, ModelEntry
from backend.chat.service import LocalAdapter, model_options, sampling_body, sampling_from
from backend.ui.markdown import footer


def status(*models: ModelEntry) -> HealthStatus:
    return HealthStatus(models=models, base_model="base")


def test_dropdown_lists_base_then_served_adapters_with_rank_then_loadable_ones():
    st = status(ModelEntry("base"), ModelEntry("pirate", parent="base", root="/a/pirate"))
    items = model_options(st, [LocalAdapter("poet", 16)], "en", rank_of=lambda root: 8)
    assert list(items.values()) == ["base", "pirate", "poet"]
    labels = list(items)
    assert "base model" in labels[0] and "r8" in labels[1] and "r16" in labels[2] and "not loaded" in labels[2]


def test_dropdown_labels_in_chinese():
    items = model_options(status(ModelEntry("base")), [], "zh-CN")
    assert "基础模型" in next(iter(items))


def test_sampling_from_settings_keeps_defaults_for_missing_values():
    out = sampling_from(
        {"temperature": 0.7, "top_k": 20.0}, {"temperature": 0.2, "top_p": 0.9, "top_k": -1, "min_p": 0.0}
    )
    assert out == {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.0}


def test_sampling_body_sends_vllm_extensions_only_when_active():
    assert sampling_body({"temperature": 0.7, "top_p": 0.8, "top_k": -1, "min_p": 0.0}) == {
        "temperature": 0.7,
        "top_p": 0.8,
    }
    assert sampling_body({"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.05}) == {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0.05,
    }


def test_footer_names_the_model_tokens_time_and_context_meter():
    fitted = FitResult(messages=[], prompt_tokens=1234, budget=7168, max_model_len=8192, reply_reserve=1024)
    text = footer("pirate", Usage(40, 25), fitted, 1.25, "en", Finish("stop", "pirate"))
    assert text.startswith("\n\n*`pirate` ·") and "25 tokens" in text and "1.2 s" in text and "1,234 / 7,168" in text
    assert "waited" not in text  # no wait was shown: nothing about one


def test_the_footer_keeps_the_answers_own_time_apart_from_the_wait_before_it_in_english_and_chinese():
    """Issue #20: a cold start's first answer read "8 tokens · 158.3 s" for an answer of under a second."""
    text = footer("pirate", Usage(40, 8), None, 0.6, "en", Finish("stop", "pirate"), waited=157.7)
    assert text == "\n\n*`pirate` · 8 tokens · 0.6 s · waited 157.7 s*"
    assert footer("pirate", Usage(40, 8), None, 0.6, "zh-CN", waited=157.7) == (
        "\n\n*`pirate` · 8 个词元 · 0.6 s · 等待 157.7 秒*"
    )


import asyncio  # noqa: E402

import pytest  # noqa: E402

from backend.ui.markdown import close_fence, interrupted_marker  # noqa: E402
from backend.ui.markdown import footer as footer_  # noqa: E402


@pytest.mark.parametrize(
    "text, closed",
    [
        ("plain answer", "plain answer"),
        ("```python\nprint(1)\n```\ndone", "```python\nprint(1)\n```\ndone"),
        ("```python\nprint(1", "```python\nprint(1\n```"),
        ("see:\n  ```\n  indented", "see:\n  ```\n  indented\n```"),
        ("~~~\ncode", "~~~\ncode\n~~~"),
        ("```\n~~~ inside\n", "```\n~~~ inside\n\n```"),
        ("```\na\n```\n```js\nb", "```\na\n```\n```js\nb\n```"),
    ],
)
def test_an_answer_cut_inside_a_code_block_gets_the_block_closed(text, closed):
    assert close_fence(text) == closed


def test_model_ids_with_markdown_characters_are_shown_as_code_in_the_footer_and_the_marker():
    assert footer_("my_adapter*v2", None, None, 1.0, "en").startswith("\n\n*`my_adapter*v2` ·")
    assert interrupted_marker("stopped", "a_b") == "\n\n*⚠ stopped · `a_b`*"


class FakePoller:
    """The shared poller's view: loads show up in it only after they finish (refresh)."""

    def __init__(self) -> None:
        self.served: list[str] = []
        self.pending: list[str] = []

    @property
    def status(self) -> HealthStatus:
        return status(ModelEntry("base"), *[ModelEntry(n, parent="base") for n in self.served])

    async def refresh(self) -> HealthStatus:
        self.served += self.pending
        self.pending = []
        return self.status


def test_two_sessions_loading_at_once_see_each_others_adapter_in_the_limit_check(monkeypatch, tmp_path):
    from backend.adapters import folder, runtime
    from backend.chat.service import Loaded, Service
    from backend.settings import LoggingSettings, LoraSettings, Settings

    settings = Settings(
        lora=LoraSettings(dir=str(tmp_path), max_loras=1, max_cpu_loras=1),
        logging=LoggingSettings(dir=str(tmp_path / "logs")),
    )
    service = Service(settings)
    poller = service._poller = FakePoller()
    seen: list[tuple[str, list[str]]] = []

    def prepare(lora_dir, name, base_path, max_rank, *, base_aliases):
        return type("Diagnosis", (), {"path": tmp_path / name})()

    async def load(base_url, api_key, name, path, *, loaded, limit):
        seen.append((name, list(loaded)))
        await asyncio.sleep(0.05)
        poller.pending.append(name)

    async def unload(base_url, api_key, name):
        poller.served.remove(name)

    monkeypatch.setattr(folder, "prepare_runtime_load", prepare)
    monkeypatch.setattr(runtime, "load_adapter", load)
    monkeypatch.setattr(runtime, "unload_adapter", unload)

    async def both():
        stale = poller.status  # read by both sessions before either load
        return await asyncio.gather(
            service.ensure_loaded("a", stale), service.ensure_loaded("b", stale), service.ensure_loaded("a", stale)
        )

    assert asyncio.run(both()) == [Loaded("a"), Loaded("b", evicted="a"), Loaded("a", evicted="b")]
    # "b" found the one slot taken by "a" (counted although the stale view had not seen it) and made room;
    # the second "a" then found "b" there, not its own earlier load.
    assert seen == [("a", []), ("b", []), ("a", [])]


# ---------------------------------------------------------------- the UI's own restart, on the status line


def _restarted(tmp_path, monkeypatch, *, pid: int, since: float):
    """A Service whose launcher's log folder holds ui-status.json: the UI (``pid``) restarted at ``since``."""
    from backend import contract
    from backend.chat.service import Service
    from backend.contract import EngineStatus, SupervisorState
    from backend.settings import Settings
    from backend.text import Text

    monkeypatch.setenv(contract.ENV_LOG_DIR, str(tmp_path))
    reason = Text("ui_keeper.killed", {"signal": "SIGKILL"})
    EngineStatus(state=SupervisorState.RUNNING, pid=pid, attempt=1, reason=reason, since=since).write(
        tmp_path / contract.UI_STATUS_FILE_NAME
    )
    return Service(Settings())


@pytest.mark.parametrize(
    "ago, en",
    [
        (0, "the UI restarted 0 s ago"),
        (119, "the UI restarted 119 s ago"),
        (120, "the UI restarted 2 min ago"),
        (600, "the UI restarted 10 min ago"),  # the last second it is shown
    ],
)
def test_the_ui_restart_note_is_shown_for_ten_minutes_after_this_process_was_restarted(tmp_path, monkeypatch, ago, en):
    import os

    service = _restarted(tmp_path, monkeypatch, pid=os.getpid(), since=1_000_000.0)
    note = service.ui_restart_note(now=1_000_000.0 + ago)
    assert note is not None and note.in_("en").startswith(en + " (the UI was killed (SIGKILL)")
    assert note.in_("en").endswith("the model kept running")
    assert note.in_("zh-CN").startswith("界面进程在 ") and "SIGKILL" in note.in_("zh-CN")


def test_the_ui_restart_note_is_gone_after_ten_minutes(tmp_path, monkeypatch):
    import os

    service = _restarted(tmp_path, monkeypatch, pid=os.getpid(), since=1_000_000.0)
    assert service.ui_restart_note(now=1_000_000.0 + 601) is None
    assert service.ui_restart_note(now=1_000_000.0 + 601, shown_for=3600) is not None


def test_the_ui_restart_note_is_only_for_the_process_the_file_names(tmp_path, monkeypatch):
    """An older UI's file (its pid, not ours) says nothing about this process."""
    import os

    service = _restarted(tmp_path, monkeypatch, pid=os.getpid() + 1, since=1_000_000.0)
    assert service.ui_restart_note(now=1_000_000.0 + 5) is None


def test_without_a_log_folder_or_a_file_there_is_no_note(tmp_path, monkeypatch):
    from backend import contract
    from backend.chat.service import Service
    from backend.settings import Settings

    monkeypatch.delenv(contract.ENV_LOG_DIR, raising=False)
    assert Service(Settings()).ui_restart_note() is None
    monkeypatch.setenv(contract.ENV_LOG_DIR, str(tmp_path))  # the folder, but no restart written
    assert Service(Settings()).ui_restart_note() is None


def test_the_status_line_reads_the_ui_status_file_once_and_speaks_the_viewers_language(tmp_path, monkeypatch):
    import os
    import time

    from backend import contract
    from backend.contract import EngineStatus

    service = _restarted(tmp_path, monkeypatch, pid=os.getpid(), since=time.time() - 30)
    service._poller = FakePoller()
    reads: list[object] = []
    real_read = EngineStatus.read
    monkeypatch.setattr(EngineStatus, "read", classmethod(lambda cls, path: reads.append(path) or real_read(path)))
    zh = service.status_json("zh-CN")
    assert reads == [tmp_path / contract.UI_STATUS_FILE_NAME]  # once per poll, not once per language
    assert zh["lang"] == "zh-CN" and zh["ui_note"].startswith("界面进程在 ") and "模型一直在运行" in zh["ui_note"]
    assert service.status_json("en-GB")["ui_note"].startswith("the UI restarted 30 s ago")
