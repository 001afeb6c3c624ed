"""What the deterministic capsule's scan takes as fact (SPEC §14, issue 38): files modified only
from what writes files, Work done only from answers (never the narration of a step), and each
command's key printed output beside its outcome. Tool results come from the real tools, run
here, so the layouts read are the ones a session records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soba_nb.agent.tools import ToolContext, run_tool
from soba_nb.compaction.capsule import Capsule, parse_capsule, render_capsule
from soba_nb.compaction.deterministic import build_deterministic_capsule
from soba_nb.compaction.extract import OUTPUT_CLIP_CHARS, Scan
from soba_nb.compaction.extract_snapshots import scan_of, state_of
from soba_nb.transcript.entries import Entry, MessageEntry, ToolCallEntry, ToolResultEntry


class Session:
    """Path entries whose tool results are what the real tools answered."""

    def __init__(self, project: Path) -> None:
        self.entries: list[Entry] = []
        self.ctx = ToolContext(project_root=project, namespace={})
        self._calls = 0

    def user(self, text: str) -> Session:
        self.entries.append(MessageEntry(role="user", content=text))
        return self

    def assistant(self, text: str) -> Session:
        self.entries.append(MessageEntry(role="assistant", content=text))
        return self

    def call(self, name: str, **arguments: object) -> Session:
        self._calls += 1
        call_id = f"call_{self._calls}"
        raw = json.dumps(arguments)
        self.entries.append(ToolCallEntry(call_id=call_id, name=name, arguments=raw))
        outcome = run_tool(name, raw, self.ctx)
        self.entries.append(ToolResultEntry(call_id=call_id, name=name, content=outcome.content, is_error=outcome.is_error))
        return self

    def capsule(self, **options: object) -> Capsule:
        capsule = build_deterministic_capsule(self.entries, **options)  # type: ignore[arg-type]
        return parse_capsule(render_capsule(capsule))


def recorded(code: str) -> list[Entry]:
    """A python call that is only recorded (its code refers to files that are not here)."""
    return [
        ToolCallEntry(call_id="c1", name="python", arguments=json.dumps({"code": code})),
        ToolResultEntry(call_id="c1", name="python", content="(no output)"),
    ]


CLEANING = [
    'df["region"] = df["region"].replace("N/A", "Unknown")',
    "df['region'] = df['region'].replace('N/A', 'Unknown')",
    'df = df.replace("N/A", "Unknown")',
    'df = df.replace({"N/A": "Unknown", "n/a": "Unknown"})',
    'df["region"].replace("N/A", "Unknown", inplace=True)',
    'df = df.rename(columns={"Region": "region", "Amount ": "amount"})',
    'df.rename(columns={"Region": "region"}, inplace=True)',
    'df = df.rename({"Region": "region"}, axis=1)',
    's = s.rename("amount_eur")',
    'df["amount"] = df["amount"].str.replace(",", ".").astype(float)',
    'df["sku"] = df["sku"].str.replace(r"\\s+", "", regex=True)',
    'name = "a-b".replace("-", "_")',
    'label = title.replace("old", "new")',
    'df.columns = [c.strip().lower().replace(" ", "_") for c in df.columns]',
    'clean = (\n    df.dropna(subset=["amount"])\n      .replace("N/A", "Unknown")\n      .rename(columns={"Region": "region"})\n)',
    'clean = df . replace("N/A", "Unknown")',
    'df["region"] = df["region"].map(lambda r: r.replace("N/A", "Unknown"))',
    'df = df.copy(); df2 = df.copy(deep=True)',
    'out = np.where(df["a"] > 0, "pos", "neg")',
    'df = df.replace(to_replace="N/A", value="Unknown")',
    'path = "data/raw.csv"; text = path.replace(".csv", ".parquet")',
]


@pytest.mark.parametrize("code", CLEANING)
def test_pandas_cleaning_code_names_no_modified_file(code: str) -> None:
    capsule = build_deterministic_capsule([MessageEntry(role="user", content="clean it"), *recorded(code)])
    assert capsule.files_modified == ""
    assert "Unknown" not in capsule.artifacts and "Unknown" not in capsule.files_modified


def test_the_whole_cleaning_pass_at_once_names_no_modified_file() -> None:
    capsule = build_deterministic_capsule(recorded("\n".join(CLEANING)))
    assert capsule.files_modified == ""


WRITING = {
    "import shutil\nshutil.copy('data/raw.csv', 'backup/raw.csv')": "backup/raw.csv",
    "shutil.copy2(src, 'backup/raw2.csv')": "backup/raw2.csv",
    "shutil.copyfile('a.csv', dst='b.csv')": "b.csv",
    "shutil.move('tmp/out.csv', 'out/final.csv')": "out/final.csv",
    "shutil.copytree('figs', 'figs_v1')": "figs_v1",
    "import os\nos.rename('clean.csv', 'clean_v1.csv')": "clean_v1.csv",
    "os.replace(tmp, 'report.html')": "report.html",
    "from shutil import copyfile\ncopyfile('a.csv', 'copied.csv')": "copied.csv",
    "from os import replace\nreplace('draft.md', 'final.md')": "final.md",
    "Path('old.parquet').rename('new.parquet')": "new.parquet",
    "Path(tmp).replace('model.pkl')": "model.pkl",
    "clean.to_csv('out/clean.csv', index=False)": "out/clean.csv",
    "fig.savefig('figures/amounts.png', dpi=150)": "figures/amounts.png",
    "with open('notes.txt', 'w') as f:\n    f.write('x')": "notes.txt",
}


@pytest.mark.parametrize(("code", "path"), list(WRITING.items()))
def test_code_that_writes_files_still_names_them(code: str, path: str) -> None:
    capsule = build_deterministic_capsule(recorded(code))
    assert capsule.files_modified.splitlines() == [f"- {path}"]


def test_writing_and_cleaning_in_one_cell_names_only_what_was_written() -> None:
    code = (
        'df["region"] = df["region"].replace("N/A", "Unknown")\n'
        'df = df.rename(columns={"Amount": "amount"})\n'
        "df.to_parquet('out/clean.parquet')\n"
        "shutil.move('out/clean.parquet', 'final/clean.parquet')\n"
    )
    capsule = build_deterministic_capsule(recorded(code))
    assert capsule.files_modified.splitlines() == ["- out/clean.parquet", "- final/clean.parquet"]


# --- Work done: answers, not the narration of steps ------------------------------------------


def test_narration_before_tool_calls_is_a_step_not_work_done(tmp_path: Path) -> None:
    session = (
        Session(tmp_path)
        .user("how many duplicate orders are there?")
        .assistant("Looking at the amounts by region first.")
        .call("python", code="x = 14")
        .assistant("Now checking the duplicates.")
        .call("python", code="print(x)")
        .assistant("There are 14 duplicate orders; I dropped them into `clean`.")
        .user("and refunds?")
        .assistant("Let me count them.")
        .call("python", code="print(41)")
        .assistant("41 refunds, kept out of revenue.")
    )
    capsule = session.capsule()
    work = capsule.work_done.splitlines()
    assert "- There are 14 duplicate orders; I dropped them into `clean`." in work
    assert "- 41 refunds, kept out of revenue." in work
    for chatter in ("Looking at the amounts", "Now checking", "Let me count"):
        assert chatter not in capsule.work_done
    assert capsule.in_progress == ""  # both requests answered: nothing is in progress


def test_a_turn_cut_mid_step_is_in_progress_not_answered(tmp_path: Path) -> None:
    session = (
        Session(tmp_path)
        .user("plot the amounts by region")
        .assistant("Looking at the amounts by region first.")
        .call("python", code="print('N 10')")
    )
    capsule = session.capsule()
    assert "Looking at the amounts" not in capsule.work_done
    assert capsule.in_progress.splitlines() == [
        "- The user request marked in progress under Goal and constraints: the work on it goes on",
        "- Latest step: Looking at the amounts by region first.",
    ]


def test_a_scan_carried_through_a_snapshot_between_narration_and_call_agrees(tmp_path: Path) -> None:
    session = (
        Session(tmp_path)
        .user("count the rows")
        .assistant("Checking the file first.")
        .call("shell", command="printf 'a\\nb\\n' > rows.txt && wc -l < rows.txt")
        .assistant("It has 2 rows.")
    )
    entries = session.entries
    whole = Scan({e.call_id: e for e in entries if isinstance(e, ToolResultEntry)})
    whole.run(entries)
    results = {e.call_id: e for e in entries if isinstance(e, ToolResultEntry)}
    first = Scan(results)
    first.run(entries[:2])  # stops between the narration and its call
    resumed = scan_of(state_of(first), results)
    resumed.run(entries[2:])
    assert resumed.work == whole.work == [(False, "- It has 2 rows.")]
    assert resumed.answered_latest_request and whole.answered_latest_request


# --- Results are state: each run's key output ------------------------------------------------


def test_python_runs_keep_what_they_printed_and_returned(tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    session = Session(tmp_path)
    session.ctx.namespace["df"] = pandas.DataFrame({"order_id": [1, 1, 2, 3] * 5, "amount": [1.5, 1.5, 2.0, 3.0] * 5})
    session.user("how many duplicates?")
    session.call("python", code="df.duplicated().sum()")
    session.call("python", code="print('refunds:', 41)\nprint('cut-off:', 812.5)")
    session.call("python", code="import warnings\nwarnings.warn('old API')\nlen(df)")
    session.call("python", code="x = 1")
    session.call("python", code="for i in range(50):\n    print('row', i, 'x' * 100)")
    lines = session.capsule().verification.splitlines()
    assert "- python `df.duplicated().sum()` → ok: 17" in lines
    assert "- python `print('refunds:', 41) ⏎ print('cut-off:', 812.5)` → ok: refunds: 41 ⏎ cut-off: 812.5" in lines
    assert any(line.startswith("- python `import warnings") and line.endswith("→ ok: 20") for line in lines)
    assert "- python `x = 1` → ok" in lines
    long = next(line for line in lines if "range(50)" in line)
    output = long.split(" → ", 1)[1]
    assert output.startswith("ok: row 0 ") and output.count("⏎") <= 2 and len(output) <= OUTPUT_CLIP_CHARS + len("ok: ")
    assert "row 3 " not in output


def test_shell_runs_keep_their_output_and_failures_say_why(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("id\n" + "".join(f"{i}\n" for i in range(1722)))
    session = (
        Session(tmp_path)
        .user("how long is the file?")
        .call("shell", command="wc -l data.csv")
        .call("shell", command="printf '\\033[31mred\\033[0m alert\\n'")
        .call("shell", command="ls missing.csv")
    )
    capsule = session.capsule()
    lines = capsule.verification.splitlines()
    assert "- shell `wc -l data.csv` → exit status 0: 1723 data.csv" in lines
    assert any(line.endswith("→ exit status 0: red alert") for line in lines)
    assert "\x1b" not in capsule.verification
    failed = next(line for line in lines if "missing.csv`" in line)
    assert "exit status 2: " in failed and "missing.csv" in failed.split(" → ", 1)[1]
    assert any("ls missing.csv` last failed: exit status 2: " in line for line in capsule.blockers.splitlines())


def test_a_failed_python_run_still_says_its_exception(tmp_path: Path) -> None:
    session = Session(tmp_path).user("x").call("python", code="print('before')\n{}['region']")
    assert session.capsule().verification.splitlines() == ["- python `print('before') ⏎ {}['region']` → KeyError: 'region'"]
