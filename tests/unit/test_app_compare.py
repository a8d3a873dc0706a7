"""Compare and blind mode (issue #12, items 1 and 2) through Chainlit's own socket handlers, against the fake
server: both sides stream at once, each with its own footer and error, Stop stops both, continue-with, blind
names hidden until the vote, the vote stored, /leaderboard, and the bad inputs."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.fakes.openai_server import expected_text
from tests.unit import test_app_handlers as handlers
from tests.unit.test_app_handlers import marker, send_command, wait_for

# The handler tests' fixtures: the app pointed at the in-process fault server, one chat tab.
fake, ui, chat = handlers.fake, handlers.ui, handlers.chat

pytestmark = pytest.mark.asyncio(loop_scope="module")

BASE, ADAPTER = "fake-qwen", "fake-adapter"


def sides(screen) -> dict[str, dict]:
    """The compare bubbles on a screen, by label ("A", "B"): author "A · model" or just "A" while blind."""
    out = {}
    for m in screen.messages:
        author = str(m.get("name") or "")
        if not m.get("isError") and author.split(" ·")[0] in ("A", "B"):
            out[author.split(" ·")[0]] = m
    return out


def notes(screen) -> list[dict]:
    return [m for m in screen.messages if m.get("name") == "compare"]


def actions(screen, message: dict) -> list[dict]:
    return screen.actions.get(message["id"], [])


async def compare_on(chat, args: str = ""):
    screen = await send_command(chat, "compare", args)
    assert screen.errors == [], screen.errors
    return screen


async def compare_off(chat) -> None:
    screen = await send_command(chat, "compare", "off")
    assert screen.errors == [] and "Compare mode off" in screen.answers[-1]


async def test_the_chat_offers_compare_leaderboard_and_vote_commands(chat):
    sent = [d for e, d in chat.events if e == "set_commands"]
    assert {"compare", "leaderboard", "vote"} <= {c["id"] for c in sent[-1]}


async def test_compare_streams_both_models_at_once_each_with_its_own_footer(chat, fake):
    on = await compare_on(chat)
    assert f"**A** `{BASE}`" in on.answers[-1] and f"**B** `{ADAPTER}`" in on.answers[-1]
    m = marker()
    n = len(chat.events)
    task = chat.start_sending(f"[[normal:tokens=40:rate=40]] compare {m}")
    both_partial = []

    def both_streaming() -> bool:
        s = sides(chat.screen(n))
        outs = [str(s[k].get("output") or "") for k in ("A", "B") if k in s]
        ok = len(outs) == 2 and all("w1 " in o and "w39" not in o for o in outs)
        if ok:
            both_partial.append(outs)
        return ok

    await wait_for(both_streaming, 20, "both sides showing partial text before either is done")
    await asyncio.wait_for(task, 30)
    screen = chat.screen(n)
    assert screen.errors == []
    shown = sides(screen)
    assert shown["A"]["name"] == f"A · {BASE}" and shown["B"]["name"] == f"B · {ADAPTER}"
    for label, model in (("A", BASE), ("B", ADAPTER)):
        out = shown[label]["output"]
        assert out.startswith(f"[**{label}** · `{model}`](#qc-side-{label.lower()})\n\n{expected_text(40)}"), out
        assert f"*`{model}` · 40 tokens ·" in out  # each side its own footer
    recs = chat.received(m)
    assert sorted(r.model for r in recs) == sorted([BASE, ADAPTER])
    a, b = recs
    assert b.started_at < a.ended_at and a.started_at < b.ended_at  # the two requests overlapped

    # The history continues from A (the default pick); the note offers B.
    last = chat.conversation.turns[-1]
    assert (last.role, last.model, last.content) == ("assistant", BASE, expected_text(40))
    [note] = notes(screen)
    assert "continues from **A**" in note["output"]
    assert [x["name"] for x in actions(screen, note)] == ["compare_pick"]
    metas = {
        k: json.loads(v["metadata"]) if isinstance(v["metadata"], str) else v["metadata"] for k, v in shown.items()
    }
    assert metas["A"]["qwenchat"]["compare"] == {"side": "A", "picked": True, "blind": False}
    assert metas["B"]["qwenchat"]["compare"]["picked"] is False
    assert metas["B"]["qwenchat"]["model"] == ADAPTER and metas["B"]["qwenchat"]["raw"] == expected_text(40)

    # Continue with B: the conversation's answer is B's, and the stored messages say which was picked.
    [pick] = actions(screen, note)
    n2 = len(chat.events)
    await chat.click(pick)
    assert chat.conversation.turns[-1].model == ADAPTER
    left = actions(chat.screen(), note)  # the button now offers A, once
    assert [(x["name"], x["payload"].get("side")) for x in left] == [("compare_pick", "A")], left
    updated = [d for e, d in chat.events[n2:] if e == "update_message" and d.get("name", "").startswith("B")]
    assert updated and updated[-1]["metadata"]["qwenchat"]["compare"]["picked"] is True

    # The next message is compared too, and both models get the history with the picked answer.
    after = await chat.send(f"next {m}")
    assert len(sides(after)) == 2
    for rec in chat.received(f"next {m}"):
        assert rec.messages[-2] == {"role": "assistant", "content": expected_text(40)}
    await compare_off(chat)
    plain = await chat.send(f"plain {m}")
    assert plain.answers == [plain.answers[0]] and plain.answers[0].startswith(expected_text(8))
    assert [r.model for r in chat.received(f"plain {m}")] == [BASE]


async def test_one_side_failing_shows_its_error_while_the_other_completes(chat):
    await compare_on(chat)
    m = marker()
    screen = await chat.send(f"[[fault:error-mid:model={ADAPTER}]] fail b {m}")
    shown = sides(screen)
    assert shown["A"]["output"].startswith(f"[**A** · `{BASE}`](#qc-side-a)\n\n{expected_text(8)}")
    assert f"`{BASE}` · 8 tokens" in shown["A"]["output"]
    assert "⚠ answer interrupted · `fake-adapter`" in shown["B"]["output"]  # B's partial, kept and marked
    [error] = screen.errors
    assert error.startswith(f"[**B · {ADAPTER}**](#qc-side-b):") and "fake engine failure mid-stream" in error
    assert "retry" in screen.error_actions()
    assert chat.conversation.turns[-1].model == BASE and not chat.conversation.turns[-1].interrupted

    # A failing before any text: no empty A bubble, B answers, and the chat continues from B.
    screen = await chat.send(f"[[fault:http-500:model={BASE}]] fail a {m}")
    shown = sides(screen)
    assert "A" not in shown and shown["B"]["output"].startswith(
        f"[**B** · `{ADAPTER}`](#qc-side-b)\n\n{expected_text(8)}"
    )
    [error] = screen.errors
    assert error.startswith(f"[**A · {BASE}**](#qc-side-a):") and "HTTP 500" in error
    assert chat.conversation.turns[-1].model == ADAPTER
    await compare_off(chat)


async def test_retry_on_a_failed_side_runs_that_side_again_and_keeps_the_others_answer(chat):
    """Nothing the user saw is lost: B's Retry asks B's model again, in a new B bubble; A is not asked again, its
    answer stays the one the chat continues from, and the new note offers continuing with B."""
    await compare_on(chat)
    m = marker()
    # the adapter fails mid-stream on the first two requests of this spec (A's and B's count together; the fake
    # server counts attempts per spec string, so no other test uses it): B only
    screen = await chat.send(f"[[fault:error-mid:model={ADAPTER}:fail=2]] retry b {m}")
    [error] = [x for x in screen.messages if x.get("isError")]
    assert error["output"].startswith(f"[**B · {ADAPTER}**](#qc-side-b):")
    [retry] = [a for a in actions(screen, error) if a["name"] == "retry"]
    assert retry["payload"]["side"] == "B"

    again = await chat.click(retry)
    assert again.errors == [], again.errors
    first, second, third = chat.received(m)
    assert sorted([first.model, second.model]) == sorted([BASE, ADAPTER]) and third.model == ADAPTER  # B only
    assert third.messages == first.messages  # the same turn, without B's cut answer
    shown = sides(again)
    before = sides(screen)["A"]
    assert (shown["A"]["id"], shown["A"]["output"]) == (before["id"], before["output"])  # A's bubble, as it was
    assert shown["B"]["output"].startswith(f"[**B** · `{ADAPTER}`](#qc-side-b)\n\n{expected_text(8)}")
    assert chat.conversation.turns[-1].model == BASE  # A's answer, still picked
    [note] = notes(again)
    assert [(a["name"], a["payload"]["side"]) for a in actions(again, note)] == [("compare_pick", "B")]
    await compare_off(chat)


async def test_retry_on_a_side_of_a_pair_already_voted_on_is_refused_clearly(chat):
    await compare_on(chat, "blind")
    m = marker()
    screen = await chat.send(f"[[fault:error-mid:model={ADAPTER}]] voted {m}")
    [retry] = [a for x in screen.messages if x.get("isError") for a in actions(screen, x) if a["name"] == "retry"]
    voted = await send_command(chat, "vote", "tie")
    assert voted.errors == [], voted.errors
    refused = await chat.click(retry)
    assert any("has a vote already" in e for e in refused.errors), refused.errors
    assert len(chat.received(m)) == 2  # nobody was asked again
    await compare_off(chat)


async def test_stop_during_a_compare_stops_both_and_keeps_both_partials(chat, fake):
    await compare_on(chat)
    m = marker()
    n = len(chat.events)
    task = chat.start_sending(f"[[normal:tokens=400:rate=20]] long {m}")

    def both_have_text() -> bool:
        s = sides(chat.screen(n))
        return len(s) == 2 and all("w3 " in str(v.get("output") or "") for v in s.values())

    await wait_for(both_have_text, 20, "both sides streaming")
    await chat.stop()
    await asyncio.wait_for(task, 20)
    recs = chat.received(m)
    assert len(recs) == 2
    for rec in recs:
        await fake.wait_finished(rec, 5)
        assert rec.disconnected and not rec.completed  # both upstream requests were closed
    shown = sides(chat.screen(n))
    for label, model in (("A", BASE), ("B", ADAPTER)):
        out = shown[label]["output"]
        assert out.endswith(f"*⚠ stopped · `{model}`*") and expected_text(4) in out and expected_text(400) not in out
    last = chat.conversation.turns[-1]
    assert last.model == BASE and last.interrupted and last.content.startswith(expected_text(4))
    await compare_off(chat)


async def test_blind_mode_hides_the_names_until_the_vote_then_stores_and_reveals_it(chat, ui):
    on = await compare_on(chat, "blind")
    assert "Blind compare on" in on.answers[-1]
    board_before = {s.model: s for s in ui.service.votes.leaderboard()}
    m = marker()
    screen = await chat.send(f"blind question {m}")
    shown = sides(screen)
    assert set(shown) == {"A", "B"}
    for label, msg in shown.items():
        assert msg["name"] == label  # the author is only the label
        assert BASE not in msg["output"] and ADAPTER not in msg["output"], msg["output"]
        assert f"`{label} (hidden)` · 8 tokens" in msg["output"]
        assert msg["metadata"]["qwenchat"]["model"] == ""
    [note] = notes(screen)
    assert "revealed after your vote" in note["output"] and BASE not in note["output"]
    votes = {a["payload"]["winner"]: a for a in actions(screen, note)}
    assert set(votes) == {"a", "b", "tie"}

    n2 = len(chat.events)
    await chat.click(votes["b"])
    [stored] = [v for v in ui.service.votes.all() if v.turn_id == chat.conversation.turns[-2].id]
    assert stored.winner == "b" and {stored.model_a, stored.model_b} == {BASE, ADAPTER}
    assert stored.answer_a == stored.answer_b == expected_text(8)
    assert stored.prompt[-1] == {"role": "user", "content": f"blind question {m}"}
    assert stored.thread_id == chat.session.thread_id and stored.user
    revealed = {
        d["name"].split(" ·")[0]: d for e, d in chat.events[n2:] if e == "update_message" and " · " in d.get("name", "")
    }
    assert revealed["A"]["name"] == f"A · {stored.model_a}" and revealed["B"]["name"] == f"B · {stored.model_b}"
    assert f"*`{stored.model_b}` · 8 tokens" in revealed["B"]["output"]
    note_after = [d for e, d in chat.events[n2:] if e == "update_message" and d.get("name") == "compare"][-1]
    assert f"**A** was `{stored.model_a}`, **B** was `{stored.model_b}`" in note_after["output"]
    assert chat.conversation.turns[-1].model == stored.model_b  # the winner is what the chat continues from
    # Under the note now: no vote buttons, one "continue with A" (the winner B is picked).
    left = actions(chat.screen(), note)
    assert [(x["name"], x["payload"].get("side")) for x in left] == [("compare_pick", "A")], left

    board = {s.model: s for s in ui.service.votes.leaderboard()}
    won, lost = board[stored.model_b], board[stored.model_a]
    assert won.wins == (board_before[won.model].wins if won.model in board_before else 0) + 1
    assert lost.losses == (board_before[lost.model].losses if lost.model in board_before else 0) + 1
    table = (await send_command(chat, "leaderboard", "")).answers[-1]
    assert "| model | wins | losses | ties |" in table and f"| `{won.model}` | {won.wins} | {won.losses} |" in table

    bad = await send_command(chat, "vote", "maybe")
    assert bad.errors and "Use `/vote A`, `/vote B` or `/vote tie`" in bad.errors[0] and "`maybe`" in bad.errors[0]

    # A second vote on the same turn (with a comment): the last vote wins, and the chat says so.
    again = await send_command(chat, "vote", "tie both fine")
    assert any("the last vote counts" in a for a in again.answers), again.answers
    [stored] = [v for v in ui.service.votes.all() if v.turn_id == stored.turn_id]
    assert stored.winner == "tie" and stored.comment == "both fine"
    await compare_off(chat)


async def test_compare_bad_inputs_get_clear_messages(chat, ui):
    unknown = await send_command(chat, "compare", "nosuch")
    assert unknown.errors and "`nosuch` is not a served model or adapter" in unknown.errors[0]
    assert f"`{BASE}`" in unknown.errors[0]  # the choices are named
    usage = await send_command(chat, "compare", "a b c")
    assert usage.errors and "/compare [A] [B]" in usage.errors[0]
    same = await compare_on(chat, f"{BASE} {BASE}")
    assert "Same model on both sides" in same.answers[-1]
    screen = await chat.send(f"same {marker()}")
    assert all("same model on both sides" in s["output"] for s in sides(screen).values())
    await compare_off(chat)
    vote = await send_command(chat, "vote", "a")  # no blind comparison in this chat
    assert vote.errors and "no blind comparison to vote on" in vote.errors[0]


async def test_compare_with_only_one_model_served_says_so(chat, ui, monkeypatch):
    from dataclasses import replace

    status = ui.service.poller.status
    only_base = replace(status, models=tuple(m for m in status.models if not m.is_adapter))
    monkeypatch.setattr(type(ui.service.poller), "status", property(lambda self: only_base))
    screen = await send_command(chat, "compare", "")
    assert screen.errors and f"only `{BASE}` is served" in screen.errors[0]
    assert f"/compare {BASE} {BASE}" in screen.errors[0]


async def test_a_resumed_compared_thread_continues_from_the_picked_answer():
    from backend.storage import history

    def step(i: str, side: str, picked: bool, text: str) -> dict:
        meta = {"qwenchat": {"raw": text, "model": side, "compare": {"side": side, "picked": picked}}}
        return {"id": i, "type": "assistant_message", "metadata": json.dumps(meta)}

    thread = {
        "steps": [
            {"id": "u1", "type": "user_message", "output": "q"},
            step("a1", "A", False, "answer a"),
            step("b1", "B", True, "answer b"),
        ]
    }
    conv = history.conversation_from_thread(thread)
    assert [(t.role, t.content) for t in conv.turns] == [("user", "q"), ("assistant", "answer b")]


async def test_a_chat_opened_with_a_bare_command_still_gets_its_stop_button(chat):
    """Chainlit announces the first interaction with the message text; empty for "/compare", and the page then
    never shows Stop. The app announces it with the command's name."""
    screen = await send_command(chat, "compare", "")
    assert ("first_interaction", {"interaction": "/compare", "thread_id": chat.session.thread_id}) in screen.events
    await compare_off(chat)
    later = await send_command(chat, "leaderboard", "")
    assert not [e for e, _ in later.events if e == "first_interaction"]  # only while the chat has no turns yet


async def test_compare_mode_from_the_settings_panel(chat):
    from chainlit.config import config
    from chainlit.context import init_ws_context

    async def confirm(choice: str):
        n = len(chat.events)
        init_ws_context(chat.session)
        await config.code.on_settings_update({"model": BASE, "compare": choice})
        return chat.screen(n)

    def panel_choice(screen) -> str:
        [widgets] = [d for e, d in screen.events if e == "chat_settings"][-1:]
        [widget] = [w for w in widgets if w["id"] == "compare"]
        return widget["initial"]

    [widgets] = [d for e, d in chat.events if e == "chat_settings"][-1:]
    [widget] = [w for w in widgets if w["id"] == "compare"]
    assert [(i["label"], i["value"]) for i in widget["items"]] == [
        ("off", "off"),
        ("side by side", "on"),
        ("blind (vote, then names)", "blind"),
    ]
    on = await confirm("on")
    assert f"**A** `{BASE}` and **B** `{ADAPTER}`" in on.answers[-1] and panel_choice(on) == "on"
    assert len(sides(await chat.send(f"panel {marker()}"))) == 2
    blind = await confirm("blind")
    assert "Blind compare on" in blind.answers[-1] and panel_choice(blind) == "blind"
    same = await confirm("blind")  # unchanged: nothing said again
    assert same.answers == []
    off = await confirm("off")
    assert "Compare mode off" in off.answers[-1] and panel_choice(off) == "off"


async def test_a_blind_sides_progress_lines_never_name_its_model(chat, ui):
    """Whatever the turn writes into a step (an adapter load, the adapter it evicted), blind hides the names."""
    from chainlit.context import init_ws_context

    from backend.chat import compare
    from backend.ui.compare_view import CompareView
    from backend.ui.panel import Host

    init_ws_context(chat.session)
    pair = compare.new_pair(compare.CompareMode(BASE, ADAPTER, blind=True), "u", [])
    side = pair.side("B")
    n = len(chat.events)
    async with CompareView("en", Host(ui), pair, side).step(f"Loading adapter {side.model}") as step:
        step.name = step.output = f"{side.model} loaded; {pair.side('A').model} unloaded to make room"
    shown = [d for e, d in chat.events[n:] if e in ("new_message", "update_message")]
    assert shown and all(BASE not in str(d) and ADAPTER not in str(d) for d in shown), shown
    assert shown[-1]["name"] == "B (hidden) loaded; A (hidden) unloaded to make room"


async def test_a_blind_sides_answer_written_to_the_history_while_it_streams_never_names_its_model(chat, ui):
    """The checkpoint of a streaming answer (views.py) stores a side as keep_partial would: its heading, the text so
    far, the cut mark; in a blind compare with the names masked, in the text and in the metadata alike."""
    from chainlit.context import init_ws_context

    from backend.chat import compare
    from backend.ui.compare_view import CompareView
    from backend.ui.panel import Host

    init_ws_context(chat.session)
    pair = compare.new_pair(compare.CompareMode(BASE, ADAPTER, blind=True), "u", [])
    view = CompareView("en", Host(ui), pair, pair.side("B"))
    await view.new_answer(ADAPTER)
    assert view.checkpoint_step() is None  # no text yet: nothing to keep
    await view.stream_token("Once upon ")
    await view.stream_token("a time")
    await view.flushed()
    step = view.checkpoint_step()
    assert step is not None and BASE not in str(step) and ADAPTER not in str(step), step
    view.cut = ("Once upon a time", "answer interrupted")
    assert step["output"] == view.render() and step["output"].endswith("time\n\n*⚠ answer interrupted · `B (hidden)`*")
    meta = step["metadata"]["qwenchat"]
    assert meta["raw"] == "Once upon a time" and meta["interrupted"] is True and meta["model"] == ""
    assert meta["compare"] == {"side": "B", "picked": False, "blind": True} and step["streaming"] is False
