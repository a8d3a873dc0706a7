"""The fair share counter (issue #20): at most ``limit`` answers streaming per user, released on every ending."""

from __future__ import annotations

import asyncio

import pytest

from backend.chat.fairshare import FairShare, TooMany


def test_a_user_gets_the_limit_and_one_more_is_refused_naming_what_is_held():
    share = FairShare(2)
    first, second = share.claim("user:alice"), share.claim("user:alice")
    with pytest.raises(TooMany) as refused:
        share.claim("user:alice")
    assert (refused.value.held, refused.value.count, refused.value.limit) == (2, 1, 2)
    assert share.held("user:alice") == 2  # the refusal took nothing
    first.release()
    share.claim("user:alice")  # one ended: one more may start
    second.release()
    assert share.held("user:alice") == 1


def test_a_compare_pair_counts_two():
    share = FairShare(2)
    pair = share.claim("browser:b1", 2)
    with pytest.raises(TooMany):
        share.claim("browser:b1")
    pair.release()
    one = share.claim("browser:b1")
    with pytest.raises(TooMany) as refused:
        share.claim("browser:b1", 2)  # one answer streaming plus a pair: three
    assert refused.value.count == 2
    one.release()
    assert share.held("browser:b1") == 0


def test_the_limit_is_per_user_over_all_their_sessions_not_global():
    share = FairShare(2)
    for _tab in range(2):  # two tabs of alice
        share.claim("user:alice")
    for _ in range(2):  # bob is not held back by alice
        share.claim("user:bob")
    share.claim("browser:0123456789ab")  # nor is a browser without login
    with pytest.raises(TooMany):
        share.claim("user:alice")
    with pytest.raises(TooMany):
        share.claim("user:bob")


def test_nothing_streaming_may_always_start_one_message_and_zero_means_no_limit():
    one = FairShare(1)
    one.claim("user:alice", 2)  # a compare pair alone, past a limit of 1: else compare could never answer
    with pytest.raises(TooMany):
        one.claim("user:alice")
    free = FairShare(0)
    for _ in range(100):
        free.claim("user:script")
    assert free.held("user:script") == 100


def test_release_on_an_exception_and_twice_is_harmless():
    share = FairShare(2)
    with pytest.raises(RuntimeError), share.claim("user:alice", 2):
        raise RuntimeError("the engine went away")
    assert share.held("user:alice") == 0
    claim = share.claim("user:alice")
    claim.release()
    claim.release()  # a done callback after a finally: counted back once
    share.claim("user:alice", 2)
    assert share.held("user:alice") == 2


@pytest.mark.asyncio
async def test_release_when_the_answer_is_cancelled_stop_or_disconnect():
    share = FairShare(2)
    started = asyncio.Event()

    async def answer() -> None:
        with share.claim("user:alice"):
            started.set()
            await asyncio.sleep(60)

    tasks = [asyncio.create_task(answer()) for _ in range(2)]
    await started.wait()
    await asyncio.sleep(0)
    assert share.held("user:alice") == 2
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert share.held("user:alice") == 0


def test_a_claim_knows_how_many_answers_its_user_had_streaming_already():
    """The engine priority of an answer (issue #20): 0 for a user with nothing streaming, 1 for their second."""
    share = FairShare(0)
    first, pair = share.claim("user:alice"), share.claim("user:bob", 2)
    second = share.claim("user:alice")
    assert (first.ahead, second.ahead, pair.ahead) == (0, 1, 0)
    first.release()
    second.release()
    assert share.claim("user:alice").ahead == 0
