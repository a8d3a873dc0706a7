"""The token coalescer: first token at once, bounded delay, flush on finish/cancel/switch, order, no loss."""

from __future__ import annotations

import asyncio

import pytest

from backend.chat.coalesce import Coalescer


class FakeClock:
    """A clock the test moves; sleeps end only when the clock passes their deadline."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sleepers.append((self.now + delay, fut))
        await fut

    async def advance(self, seconds: float) -> None:
        for _ in range(5):  # let a just-scheduled timer task start its sleep at the current time
            await asyncio.sleep(0)
        self.now += seconds
        for deadline, fut in list(self.sleepers):
            if deadline <= self.now + 1e-9 and not fut.done():
                fut.set_result(None)
        self.sleepers = [(d, f) for d, f in self.sleepers if not f.done()]
        for _ in range(5):  # let the woken timer task run its flush
            await asyncio.sleep(0)


class Recorder:
    def __init__(self, clock: FakeClock | None = None) -> None:
        self.calls: list[tuple[str, str, float | None]] = []
        self.clock = clock

    async def __call__(self, kind: str, text: str) -> None:
        self.calls.append((kind, text, self.clock() if self.clock else None))

    def text(self, kind: str = "answer") -> str:
        return "".join(t for k, t, _ in self.calls if k == kind)


def make(interval: float = 0.040) -> tuple[Coalescer, Recorder, FakeClock]:
    clock = FakeClock()
    rec = Recorder(clock)
    return Coalescer(rec, interval, clock=clock, sleep=clock.sleep), rec, clock


@pytest.mark.asyncio
async def test_first_token_goes_out_at_once_then_tokens_are_batched():
    co, rec, clock = make()
    await co.add("answer", "Hello")
    assert rec.calls == [("answer", "Hello", 100.0)]  # no waiting for the first token
    for tok in (" wor", "ld", "!"):
        await clock.advance(0.005)
        await co.add("answer", tok)
    assert len(rec.calls) == 1 and co.pending == " world!"  # held: less than 40 ms since the last send
    await clock.advance(0.025)  # 40 ms after the first send
    assert rec.calls[1][:2] == ("answer", " world!")
    assert rec.calls[1][2] == pytest.approx(100.040)
    await co.aclose()
    assert rec.text() == "Hello world!"


@pytest.mark.asyncio
async def test_a_held_token_waits_at_most_the_interval_even_when_nothing_follows():
    co, rec, clock = make(0.050)
    await co.add("answer", "a")
    await clock.advance(0.001)
    await co.add("answer", "b")  # then silence (the model pauses)
    await clock.advance(0.048)
    assert rec.text() == "a"
    await clock.advance(0.001)  # 50 ms after "a" went out
    assert rec.text() == "ab"
    assert max(rec.calls[i + 1][2] - rec.calls[i][2] for i in range(len(rec.calls) - 1)) <= 0.050 + 1e-9


@pytest.mark.asyncio
async def test_steady_stream_sends_at_most_once_per_interval_and_loses_nothing():
    co, rec, clock = make(0.040)
    tokens = [f"t{i} " for i in range(1000)]
    for tok in tokens:  # 1,000 tokens at 1 ms each: 1 s
        await co.add("answer", tok)
        await clock.advance(0.001)
    await co.aclose()
    assert rec.text() == "".join(tokens)  # order kept, nothing lost or repeated
    times = [t for _, _, t in rec.calls]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps[:-1]) >= 0.040 - 1e-9  # the last one is the final flush
    assert 20 <= len(rec.calls) <= 30  # about 1 s / 40 ms, not 1,000


@pytest.mark.asyncio
async def test_flush_before_finishing_sends_what_is_held():
    co, rec, clock = make()
    await co.add("answer", "x")
    await co.add("answer", "y")
    await co.add("answer", "z")
    assert rec.text() == "x"
    await co.flush()  # the answer is finalised: nothing may stay behind
    assert rec.text() == "xyz"
    await clock.advance(1.0)  # the cancelled timer sends nothing twice
    assert rec.text() == "xyz" and co.pending == ""


@pytest.mark.asyncio
async def test_stop_mid_stream_keeps_every_token_added():
    co, rec, clock = make()
    got: list[str] = []

    async def stream() -> None:
        try:
            for i in range(10_000):
                got.append(f"{i},")
                await co.add("answer", f"{i},")
                await clock.advance(0.003)
        except asyncio.CancelledError:
            await co.aclose()  # what the renderer does on Stop, inside the cancelled task
            raise

    task = asyncio.create_task(stream())
    for _ in range(200):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert got and rec.text() == "".join(got)


@pytest.mark.asyncio
async def test_switching_between_reasoning_and_answer_flushes_in_order():
    co, rec, clock = make()
    await co.add("reasoning", "think")
    await co.add("reasoning", "ing")  # held
    await co.add("answer", "Yes")  # the switch sends the held reasoning first, then the answer at once
    assert [(k, t) for k, t, _ in rec.calls] == [("reasoning", "think"), ("reasoning", "ing"), ("answer", "Yes")]
    await co.add("answer", ",")
    await co.add("reasoning", "more")  # back again
    await co.aclose()
    assert [(k, t) for k, t, _ in rec.calls][3:] == [("answer", ","), ("reasoning", "more")]


@pytest.mark.asyncio
async def test_zero_interval_sends_every_token_as_it_comes():
    co, rec, _ = make(0)
    for tok in ("a", "b", "c"):
        await co.add("answer", tok)
    assert [t for _, t, _ in rec.calls] == ["a", "b", "c"]


@pytest.mark.asyncio
async def test_a_failed_timer_flush_is_retried_and_reported_to_the_streaming_task():
    clock = FakeClock()
    sent: list[str] = []
    fail = [True]

    async def sink(kind: str, text: str) -> None:
        if fail[0] and sent:
            fail[0] = False
            raise ConnectionError("socket gone")
        sent.append(text)

    co = Coalescer(sink, 0.040, clock=clock, sleep=clock.sleep)
    await co.add("answer", "a")
    await co.add("answer", "b")
    await clock.advance(0.040)  # the timer's flush fails
    with pytest.raises(ConnectionError):
        await co.add("answer", "c")
    await co.aclose()
    assert "".join(sent) == "abc"


@pytest.mark.asyncio
async def test_real_clock_bounded_delay():
    sent: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()

    async def sink(kind: str, text: str) -> None:
        sent.append((text, loop.time()))

    co = Coalescer(sink, 0.030)
    await co.add("answer", "a")
    await co.add("answer", "b")
    await asyncio.sleep(0.2)  # nothing else comes: the timer alone sends "b"
    assert [t for t, _ in sent] == ["a", "b"]
    await co.aclose()


def test_negative_interval_is_refused():
    async def sink(kind: str, text: str) -> None: ...

    with pytest.raises(ValueError, match="interval"):
        Coalescer(sink, -1)
