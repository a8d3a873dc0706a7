"""Fair share of the engine (issue #20): at most ``[ui] max_answers_per_user`` answers streaming at once per user,
over all their chats and tabs in this UI process (a compare pair is 2 answers).

share = FairShare(limit)                 # one per UI process; limit 0: no limit
claim = share.claim(who, count)          # raises TooMany (nothing taken) when ``who`` would exceed the limit
claim.ahead                              # ``who``'s answers already streaming then: the engine priority (issue #20)
with claim: ...                          # or claim.release() in a finally / a task's done callback; twice is harmless

``who`` is the login name, else the browser (backend/ui/context.answerer). A user with nothing streaming may
always start one message, even a compare pair past a limit of 1. Everything runs on the event loop: a claim is
taken and counted with no await in between, so two sends at once never both pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType


class TooMany(Exception):
    """``who`` has ``held`` answers streaming; ``count`` more would pass ``limit``."""

    def __init__(self, who: str, held: int, count: int, limit: int) -> None:
        super().__init__(f"{who}: {held} answers streaming, {count} more would pass the limit of {limit}")
        self.who, self.held, self.count, self.limit = who, held, count, limit


@dataclass
class Claim:
    """``count`` answers of ``who``, counted until released (once, whatever ends them)."""

    share: FairShare | None  # None: a claim of nothing (a command starts no answer)
    who: str
    count: int
    ahead: int = 0  # ``who``'s answers already streaming when this claim was taken
    released: bool = field(default=False, init=False)

    def release(self) -> None:
        if not self.released:
            self.released = True
            if self.share is not None:
                self.share._give_back(self.who, self.count)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


class FairShare:
    """Answers streaming per user in this process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}

    def held(self, who: str) -> int:
        return self._held.get(who, 0)

    def by_user(self) -> dict[str, int]:
        """Answers streaming now, per user (the operator's /status)."""
        return dict(self._held)

    def claim(self, who: str, count: int = 1) -> Claim:
        held = self.held(who)
        if self.limit and held and held + count > self.limit:
            raise TooMany(who, held, count, self.limit)
        self._held[who] = held + count
        return Claim(self, who, count, ahead=held)

    def _give_back(self, who: str, count: int) -> None:
        left = self.held(who) - count
        if left > 0:
            self._held[who] = left
        else:
            self._held.pop(who, None)
