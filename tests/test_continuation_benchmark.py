"""The continuation benchmark (benchmarks/continuation.py, SPEC §14) on one session, in process:
today's deterministic and model capsules must meet the issue's targets on what the next model
reads (100 % requests, the current request identified, ≥ 95 % figures, no phantom file), and the
scorer must catch the faults of the capsules before issue 38."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

from benchmarks import continuation  # noqa: E402
from benchmarks.continuation_scripts import ORDERS  # noqa: E402
from benchmarks.continuation_sessions import build  # noqa: E402


@pytest.fixture(scope="module")
def orders(tmp_path_factory: pytest.TempPathFactory) -> tuple[continuation.Built, Path]:
    folder = tmp_path_factory.mktemp("continuation")
    return build(ORDERS, folder / "orders"), folder


def test_the_session_is_real(orders: tuple[continuation.Built, Path]) -> None:
    built, _ = orders
    assert built.written == {"orders.csv", "revenue_by_region.png"}
    assert (built.folder / "revenue_by_region.png").read_bytes()[:4] == b"\x89PNG"
    assert ("/fix", built.requests[2][1]) == built.requests[2]
    assert "KeyError: 'Region'" in built.requests[2][1]
    assert "duplicates dropped" not in built.figures  # figures are the printed numbers
    assert built.figures[:1] == ["1736"]


@pytest.mark.parametrize("path", continuation.NEW_PATHS)
def test_todays_capsules_meet_the_targets(orders: tuple[continuation.Built, Path], path: str) -> None:
    built, folder = orders
    scores = continuation.run_new(built, folder / "work", paths=(path,))
    assert [s.variant for s in scores] == list(continuation.VARIANTS)
    for s in scores:
        where = f"{s.variant}/{s.path}"
        assert s.requests[0] == s.requests[1], f"{where}: requests not verbatim: {s.missing_requests}"
        assert s.current == 1, f"{where}: {s.current_problem}"
        assert s.figures[0] >= continuation.FIGURES_TARGET * s.figures[1], f"{where}: lost {s.missing_figures}"
        assert s.phantom == [], f"{where}: phantom files {s.phantom}"
        assert s.columns[0] == s.columns[1], f"{where}: columns unknown"
    assert all("MISSED" not in line for line in continuation.targets(scores))


def test_the_scorer_catches_what_old_capsules_did(orders: tuple[continuation.Built, Path]) -> None:
    """A capsule that quotes a finished request as the latest, lists `Unknown` as a written file,
    records `/fix` as its template and keeps no figure fails every target."""
    built, _ = orders
    finished = built.requests[-1][0]
    capsule = (
        f"## Goal and constraints\n\nLatest user request (verbatim):\n\n```\n{finished}\n```\n\n"
        f"First request of the session:\n- {built.requests[2][1]}\n\n"
        "## Files modified\n\n- orders.csv\n- Unknown\n\n## Kernel state\n\n- clean: DataFrame 1662×6\n"
    )
    result = {
        "capsule": capsule, "capsule_content": capsule, "capsule_tokens": 1, "input_tokens": 2,
        "messages": [{"role": "user", "content": capsule, "calls": []},
                     {"role": "user", "content": built.last_request, "calls": []}],
    }  # fmt: skip
    s = continuation.score(built, "tail", "old", result)
    assert "/fix" in s.missing_requests
    assert s.current == 0 and "finished request" in s.current_problem
    assert s.phantom == ["Unknown"]
    assert s.figures[0] < continuation.FIGURES_TARGET * s.figures[1]
    assert s.columns[0] == 0
