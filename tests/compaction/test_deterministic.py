"""The deterministic capsule must be good on its own (SPEC §4): every file touched, every
command with its last outcome, the user's requests verbatim (SPEC §14), the previous capsule kept."""

from __future__ import annotations

import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from soba_nb.compaction.capsule import Capsule, parse_capsule, render_capsule
from soba_nb.compaction.deterministic import (
    NARRATIVE_MAX_ITEMS,
    build_deterministic_capsule,
)
from soba_nb.compaction.requests import REQUESTS_LABEL, split_goal
from soba_nb.transcript.entries import (
    CapsuleEntry,
    CheckpointEntry,
    Entry,
    MessageEntry,
    SkillEntry,
    ToolCallEntry,
    ToolResultEntry,
)


class History:
    """A small builder of path entries."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._calls = 0

    def user(self, text: str) -> History:
        self.entries.append(MessageEntry(role="user", content=text))
        return self

    def assistant(self, text: str) -> History:
        self.entries.append(MessageEntry(role="assistant", content=text))
        return self

    def tool(self, name: str, result: str | None = "", *, error: bool = False, raw: str | None = None, **arguments: object) -> History:
        self._calls += 1
        call_id = f"call_{self._calls}"
        self.entries.append(ToolCallEntry(call_id=call_id, name=name, arguments=raw or json.dumps(arguments)))
        if result is not None:
            self.entries.append(ToolResultEntry(call_id=call_id, name=name, content=result, is_error=error))
        return self

    def shell(self, command: str, status: int, output: str = "") -> History:
        """A call as the shell tool answers it: its status line, then what it printed."""
        return self.tool("shell", f"exit status: {status}\n{output}".rstrip("\n"), command=command, timeout_s=60)

    def checkpoint(self, kind: str, note: str) -> History:
        self.entries.append(CheckpointEntry(kind=kind, note=note))  # type: ignore[arg-type]
        return self


def build(history: History, **options: object) -> Capsule:
    capsule = build_deterministic_capsule(history.entries, **options)  # type: ignore[arg-type]
    assert parse_capsule(render_capsule(capsule)) is not None  # always a valid capsule
    return capsule


def test_every_file_touched_survives() -> None:
    history = (
        History()
        .user("tidy the data")
        .tool("read_file", "a,b", path="data/raw.csv")
        .tool("list_files", "raw.csv", path="data")
        .tool("write_file", "ok", path="src/clean.py", content="x = 1")
        .tool("edit_file", "ok", path="src/util.py", old="a", new="b")
        .tool(
            "python",
            "ok",
            code=(
                "df.to_csv('out/clean.csv', index=False)\n"
                "plt.savefig(\"figures/hist.png\")\n"
                "with open('notes.txt', 'w') as f:\n    f.write('x')\n"
                "Path('report.html').write_text(html)\n"
                "df.to_parquet(path='out/clean.parquet')\n"
                "pd.read_csv('data/raw.csv')"
            ),
        )
        .tool("shell", "exit status: 0", command="python make.py > build/log.txt 2>&1")
        .tool("read_file", None, raw='{"path": "data/trunc.csv", "pa')  # malformed, no result
    )
    capsule = build(history)
    for path in ("data/raw.csv", "data (listed)", "data/trunc.csv"):
        assert f"- {path}" in capsule.files_read.splitlines()
    modified = capsule.files_modified.splitlines()
    for path in (
        "src/clean.py", "src/util.py", "out/clean.csv", "figures/hist.png", "notes.txt",
        "report.html", "out/clean.parquet", "build/log.txt",
    ):
        assert f"- {path}" in modified
    assert "- data/raw.csv" not in modified
    artifacts = capsule.artifacts.splitlines()
    assert {"- out/clean.csv", "- figures/hist.png", "- report.html", "- out/clean.parquet"} <= set(artifacts)
    assert "- src/clean.py" not in artifacts


def test_a_failed_write_is_still_listed_and_says_so() -> None:
    capsule = build(History().tool("write_file", "outside the project", error=True, path="../x.py", content=""))
    assert capsule.files_modified == "- ../x.py (write failed)"
    assert capsule.artifacts == ""


def test_every_command_survives_with_its_last_outcome() -> None:
    history = (
        History()
        .shell("pytest -q", 1)
        .shell("ruff check .", 0)
        .tool("python", "Traceback (most recent call last):\n  File …\nKeyError: 'region'", error=True, code="df['region']")
        .tool("python", "result: 120000", code="len(df)")
        .shell("pytest -q", 0)
        .tool("shell", "refused: timeout_s must be positive", error=True, command="sleep 1", timeout_s=0)
        .tool("python", None, code="train()")
    )
    lines = build(history).verification.splitlines()
    assert lines == [
        "- shell `ruff check .` → exit status 0",
        "- python `df['region']` → KeyError: 'region'",
        "- python `len(df)` → ok: 120000",
        "- shell `pytest -q` → exit status 0",
        "- shell `sleep 1` → error: refused: timeout_s must be positive",
        "- python `train()` → no result recorded",
    ]


def test_a_command_that_still_fails_is_a_blocker_until_it_passes() -> None:
    failing = build(History().shell("pytest -q", 1).shell("make lint", 2))
    assert failing.blockers.splitlines() == [
        "- shell `pytest -q` last failed: exit status 1",
        "- shell `make lint` last failed: exit status 2",
    ]
    fixed = build(History().shell("pytest -q", 0), previous=failing)
    assert fixed.blockers == "- shell `make lint` last failed: exit status 2"
    assert "- shell `pytest -q` → exit status 0" in fixed.verification.splitlines()
    assert "- shell `pytest -q` → exit status 1" not in fixed.verification.splitlines()


LONG_REQUEST = (
    "Please rebuild the churn model.\n\n## Requirements\n"
    "```python\n# keep this exact snippet\nmodel = fit(df)\n```\n"
    "You must not touch data/raw.csv. Only use scikit-learn.\n" + "Context line. " * 400
)


def quoted(capsule: Capsule) -> list[tuple[str, str]]:
    """(status, text) of the requests the capsule quotes, newest first."""
    requests, _ = split_goal(capsule.goal_and_constraints)
    return [(request.status, request.text) for request in requests.items]


def test_every_request_is_quoted_verbatim_newest_first_with_its_status() -> None:
    history = (
        History()
        .user("first: load the data " + "x" * 2000)
        .assistant("Loaded.")
        .user("second: plot it")
        .assistant("Plotted.")
        .user(LONG_REQUEST)
        .tool("python", "ok", code="fit(df)")
    )
    capsule = build(history)
    assert quoted(capsule) == [
        ("in progress", LONG_REQUEST),
        ("done", "second: plot it"),
        ("done", "first: load the data " + "x" * 2000),
    ]
    assert capsule.goal_and_constraints.startswith(REQUESTS_LABEL)
    assert quoted(parse_capsule(render_capsule(capsule))) == quoted(capsule)
    assert "- You must not touch data/raw.csv." in capsule.goal_and_constraints
    assert "- Only use scikit-learn." in capsule.goal_and_constraints
    assert "marked in progress" in capsule.in_progress


def test_requests_in_the_kept_tail_follow_the_capsule_and_are_not_quoted() -> None:
    history = History().user("old request").assistant("done")
    kept = History().user("new short request").entries
    capsule = build(history, kept=kept)
    assert "new short request" not in capsule.goal_and_constraints
    assert quoted(capsule) == [("done", "old request")]
    assert not capsule.in_progress  # the work goes on in the tail, not in the capsule


def test_a_request_answered_only_in_the_kept_tail_is_done() -> None:
    history = History().user("count the refunds").tool("python", "41", code="(df.amount < 0).sum()")
    kept = History().assistant("There are 41 refunds.").entries
    assert quoted(build(history, kept=kept)) == [("done", "count the refunds")]
    assert quoted(build(history)) == [("in progress", "count the refunds")]


def test_a_request_a_newer_one_followed_without_an_answer_is_not_answered() -> None:
    history = History().user("plot by region").tool("python", "", code="plot()").user("never mind, list the columns")
    history.assistant("The columns are a, b.")
    assert quoted(build(history)) == [("done", "never mind, list the columns"), ("not answered", "plot by region")]


def test_narration_before_tool_calls_is_no_answer() -> None:
    history = History().user("count duplicates").assistant("Looking at the ids first.").tool("python", "14", code="d()")
    assert quoted(build(history)) == [("in progress", "count duplicates")]


def test_a_turn_checkpoint_marks_its_request_done() -> None:
    history = History().user("plot it").tool("python", "", code="plot()").checkpoint("turn", "")
    assert quoted(build(history)) == [("done", "plot it")]


def test_a_slash_command_is_quoted_as_typed_and_its_template_is_no_constraint() -> None:
    template = "Fix the notebook cell In [3], which failed.\n\nKeyError: 'Region'\n\nYou must propose the corrected cell with add_cell."
    fix = MessageEntry(role="user", content=template, typed="/fix use the region column")
    entries: list[Entry] = [fix, MessageEntry(role="assistant", content="The column is `region`."), MessageEntry(role="user", content="thanks, now plot it")]
    capsule = build_deterministic_capsule(entries)
    assert quoted(capsule) == [("in progress", "thanks, now plot it"), ("done", "/fix use the region column")]
    assert "KeyError" not in capsule.goal_and_constraints and "add_cell" not in capsule.goal_and_constraints
    # While it is being worked on, what soba sent is kept beside it: the work needs the traceback.
    working = build_deterministic_capsule([fix, *History().tool("python", "ok", code="df.columns").entries])
    assert "/fix use the region column" in working.goal_and_constraints
    assert "KeyError: 'Region'" in working.goal_and_constraints
    assert "which soba sent to the model as:" in working.goal_and_constraints


def test_decisions_the_user_states_are_kept_as_constraints() -> None:
    history = History().user(
        "Keep refunds out of revenue, finance books them separately. Treat Unknown as a region of its own. "
        "Exclude the test orders from now on. Plot it."
    ).assistant("Done.")
    goal = build(history).goal_and_constraints.split("Constraints the user stated:")[1]
    assert "- Keep refunds out of revenue, finance books them separately." in goal
    assert "- Treat Unknown as a region of its own." in goal
    assert "- Exclude the test orders from now on." in goal
    assert "Plot it" not in goal


def test_requests_beyond_the_budget_are_clipped_then_counted() -> None:
    history = History()
    for n in range(60):
        history.user(f"request {n}: " + "word " * 200).assistant(f"answer {n}")
    capsule = build(history, request_tokens=1000)
    items = quoted(capsule)
    assert items[0][1] == "request 59: " + ("word " * 200)  # the newest whole
    requests, _ = split_goal(capsule.goal_and_constraints)
    assert any(r.clipped for r in requests.items)
    assert requests.older_left_out + len(requests.items) == 60
    assert "older request(s) left out" in capsule.goal_and_constraints
    assert len(render_capsule(capsule)) < 1000 * 4 + 6000


def test_results_in_the_kept_tail_complete_calls_in_the_summarized_part() -> None:
    history = History().tool("shell", None, command="make", timeout_s=5)
    kept = [ToolResultEntry(call_id="call_1", name="shell", content="exit status: 0")]
    capsule = build(history, kept=kept)
    assert capsule.verification == "- shell `make` → exit status 0"
    assert capsule.pending == ""


def test_checkpoints_skills_and_kernel_state() -> None:
    history = (
        History()
        .checkpoint("milestone", "baseline model trained, AUC 0.81")
        .checkpoint("plan_pivot", "switch to gradient boosting because the baseline underfits")
        .checkpoint("user", "before feature work")
        .tool("checkpoint", "recorded", kind="milestone", note="features added")
        .tool("python", "ok", code="X, y = split(df)\nmodel = fit(X, y)\n_tmp = 1\nif a == b:\n    pass")
    )
    history.entries.append(SkillEntry(name="pandas-style", path=".soba/skills/pandas-style/SKILL.md", content="…"))
    capsule = build(history, kernel_state=["df: DataFrame 120000×14", "model: GradientBoostingClassifier"])
    assert "- Milestone: baseline model trained, AUC 0.81" in capsule.work_done
    assert "- Milestone: features added" in capsule.work_done
    assert "- Plan pivot: switch to gradient boosting because the baseline underfits" in capsule.decisions
    assert "- User checkpoint: before feature work" in capsule.decisions
    assert capsule.active_skills == "- pandas-style (.soba/skills/pandas-style/SKILL.md)"
    # A live kernel's description is the whole truth (it names what the agent built and lost).
    assert capsule.kernel_state.splitlines() == ["- df: DataFrame 120000×14", "- model: GradientBoostingClassifier"]
    # Read offline (no kernel to ask), the names the code assigned are what is known.
    offline = build(history).kernel_state.splitlines()
    assert len(offline) == 1 and "`X`, `y`" in offline[0] and "`model`" in offline[0] and "_tmp" not in offline[0]


PREVIOUS = Capsule(
    goal_and_constraints="Build a churn model. Never upload data.",
    work_done="- cleaned the data\n- trained a baseline",
    in_progress="- tuning",
    pending="- write the report",
    decisions="- logistic regression first, because it is explainable",
    blockers="- shell `make docs` last failed: exit status 2",
    next_steps="- try gradient boosting",
    files_read="- data/raw.csv",
    files_modified="- src/model.py",
    verification="- shell `pytest -q` → exit status 1\n- python `len(df)` → ok",
    active_skills="- pandas-style",
    kernel_state="- df: DataFrame 100×3",
    artifacts="- figures/roc.png",
    extra_sections=[("Notes", "model-written extra")],
)


def test_the_previous_capsule_is_carried_over_first_and_updated() -> None:
    history = (
        History()
        .user("Now write the report.")
        .tool("read_file", "…", path="src/model.py")
        .shell("pytest -q", 0)
        .tool("write_file", "ok", path="report.md", content="# Report")
    )
    capsule = build(history, previous=PREVIOUS, kernel_state=["df: DataFrame 120000×14"])
    assert "Now write the report." in capsule.goal_and_constraints
    assert "Build a churn model. Never upload data." in capsule.goal_and_constraints
    for field in ("work_done", "in_progress", "pending", "decisions", "blockers", "next_steps"):
        for line in str(getattr(PREVIOUS, field)).splitlines():
            assert line in str(getattr(capsule, field)), (field, line)
    assert capsule.files_read.splitlines() == ["- data/raw.csv", "- src/model.py"]
    assert capsule.files_modified.splitlines() == ["- src/model.py", "- report.md"]
    assert capsule.verification.splitlines() == ["- python `len(df)` → ok", "- shell `pytest -q` → exit status 0"]
    assert capsule.kernel_state == "- df: DataFrame 120000×14"
    assert capsule.artifacts == "- figures/roc.png"
    assert capsule.active_skills == "- pandas-style"
    assert capsule.extra_sections == [("Notes", "model-written extra")]


def test_rolling_twice_keeps_the_older_request_and_carried_goal() -> None:
    first = build(History().user("Request one. You should keep logs."), previous=PREVIOUS)
    second = build(History().user("Request two."), previous=first)
    goal = second.goal_and_constraints
    assert quoted(second) == [("in progress", "Request two."), ("not answered", "Request one. You should keep logs.")]
    assert "- You should keep logs." in goal
    assert goal.count("Build a churn model. Never upload data.") == 1
    third = build(History().assistant("still working"), previous=second)
    assert quoted(third) == [("done", "Request two."), ("not answered", "Request one. You should keep logs.")]


def test_every_request_of_the_session_survives_every_later_capsule() -> None:
    history = History().user("I'm preparing the Q3 churn report for the board. Keep it under two pages.")
    for n in range(5):
        history.assistant(f"done step {n}").user(f"step {n + 1}: next thing")
    capsule = build(history)
    for n in range(6):
        capsule = build(History().user(f"later request {n}").assistant("ok"), previous=capsule)
    goal = capsule.goal_and_constraints
    assert goal.count("the Q3 churn report for the board") == 1
    texts = [text for _, text in quoted(capsule)]
    assert texts[0] == "later request 5" and texts[-1].startswith("I'm preparing the Q3 churn report")
    statuses = [status for status, _ in quoted(capsule)]
    assert len(texts) == 12 and statuses == ["done"] * 6 + ["not answered"] + ["done"] * 5  # "step 5" had no answer
    assert "- Keep it under two pages." in goal  # a "keep … under" sentence is a constraint


def test_blockers_stated_in_messages_are_kept_beside_failing_runs() -> None:
    history = (
        History()
        .user("Score March. One more thing: finance has not confirmed the fiscal calendar yet.")
        .assistant("Loaded the data. Blocked on access to the CRM warehouse: ticket IT-4411 is still open.")
        .shell("pytest -q", 1)
        .assistant("The weather is fine and the tests ran.")
    )
    blockers = build(history).blockers
    assert "finance has not confirmed the fiscal calendar yet." in blockers
    assert "Blocked on access to the CRM warehouse: ticket IT-4411 is still open." in blockers
    assert "pytest -q" in blockers and "weather" not in blockers
    carried = build(History().user("go on").assistant("ok"), previous=build(history))
    assert "IT-4411" in carried.blockers


def test_a_capsule_entry_among_the_entries_is_the_previous_capsule() -> None:
    entry = CapsuleEntry(
        operation_id="op", checkpoint_id="ck_00000000", trigger="user", quality="full",
        tokens_before=10, tokens_after=5, first_kept_entry_id=None, content=render_capsule(PREVIOUS),
    )
    history = History()
    history.entries.append(entry)
    history.user("go on")
    capsule = build(history)
    assert "- trained a baseline" in capsule.work_done
    assert capsule.artifacts == "- figures/roc.png"


def test_narrative_sections_stay_bounded() -> None:
    history = History().user("go")
    for index in range(500):
        history.assistant(f"step {index}: " + "words " * 200)
        history.checkpoint("turn", "")
    capsule = build(history)
    items = capsule.work_done.splitlines()
    assert len(items) <= NARRATIVE_MAX_ITEMS
    assert max(len(item) for item in items) < 300
    assert "step 499" in capsule.work_done and "step 0:" not in capsule.work_done


def synthetic_history(turns: int) -> list[Entry]:
    """A notebook session of `turns` analysis steps, about 1,200 tokens each."""
    history = History()
    table = "region revenue customers churned segment quarter\n" * 60
    for index in range(1, turns + 1):
        history.user(f"Step {index}: analyse segment {index}. Don't change the raw files.")
        history.assistant(f"I'll look at segment {index}.\nNext, plot it.")
        history.tool("read_file", table, path=f"data/part_{index}.csv")
        code = f"seg_{index} = df[df.segment == {index}]\nseg_{index}.to_csv('out/seg_{index}.csv')"
        history.tool("python", table, code=code)
        history.shell(f"pytest tests/test_seg_{index}.py -q", index % 3)
    return history.entries


def test_a_200k_token_history_builds_fast() -> None:
    entries = synthetic_history(190)  # about 200k tokens (o200k_base)
    started = time.perf_counter()
    capsule = build_deterministic_capsule(entries, kernel_state=["df: DataFrame 1×1"])
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0, f"{elapsed:.3f}s"  # the real timing is in benchmarks/
    assert "- out/seg_1.csv" in capsule.files_modified
    assert capsule.verification.count("\n") + 1 == sum(isinstance(e, ToolCallEntry) and e.name != "read_file" for e in entries)


# -- the request being worked on (SPEC §5) ---------------------------------------------------


def test_a_request_before_the_region_is_quoted_whole_in_progress():
    previous = build_deterministic_capsule(History().user("Clean df.").assistant("Cleaned.").entries)
    region = History().tool("read_file", "a,b\n1,2", path="a.csv").entries
    current = MessageEntry(role="user", content="Now plot df by month.")
    capsule = build_deterministic_capsule(region, previous=previous, current=current)
    assert quoted(capsule) == [("in progress", "Now plot df by month."), ("done", "Clean df.")]
    # Listed by the previous capsule already: not twice; answered in this region: done.
    again = build_deterministic_capsule(History().assistant("Plotted.").entries, previous=capsule, current=current)
    assert quoted(again) == [("done", "Now plot df by month."), ("done", "Clean df.")]


def test_with_requests_puts_soba_s_list_on_a_model_capsule_whatever_it_copied():
    from soba_nb.compaction.deterministic import requests_of, with_requests

    entries = History().user("Clean df.").assistant("Cleaned.").user("Now plot df by month.").entries
    requests = requests_of(entries, (), None, None)
    copied = render_capsule(build_deterministic_capsule(History().user("Something else.").entries)).split("## Work done")[0]
    model = Capsule(goal_and_constraints=copied.replace("## Goal and constraints", "") + "\n\nThe user cleans a sales table.")
    fixed = with_requests(model, requests, 4000)
    goal = fixed.goal_and_constraints
    assert goal.count(REQUESTS_LABEL) == 1 and "Something else." not in goal
    assert quoted(fixed) == [("in progress", "Now plot df by month."), ("done", "Clean df.")]
    assert "The user cleans a sales table." in goal
    assert with_requests(fixed, requests, 4000) == fixed  # idempotent
    assert parse_capsule(render_capsule(fixed)).goal_and_constraints == goal


# The stems in front of the case-insensitive patterns only skip texts that cannot match.
_KEYED_WORDS = [
    "must", "MUST", "muſt", "Keep it under", "KEEP", "ſhould", "don’t", "DON'T", "dont", "decided",
    "DECIDE TO", "choſe", "blocKed", "waiting for", "Waiting On", "is still open", "IS STILL PENDING",
    "can't proceed", "CAN’T PROCEED", "has not yet confirmed", "not confirmed", "are missing from",
    "because", "BECAUSE", "rather than", "switched to", "instead of", "İ", "ı", "ß", "SS", "x", " ",
    ".", "\n", "at most", "AT LEAST", "in under", "needs to", "REQUIRED", "without", "ensure",
    "keep them out", "KEEP", "apart", "Exclude", "EXCLUDED", "treat", "Treat x as", "instead of", "From now on",
]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(_KEYED_WORDS) | st.text(max_size=6), max_size=12).map("".join))
def test_keyed_patterns_find_exactly_what_their_regular_expression_finds(text: str) -> None:
    from soba_nb.compaction.extract import _BLOCKER, _CONSTRAINT, _DECISION

    for keyed in (_DECISION, _BLOCKER, _CONSTRAINT):
        assert (keyed.search(text) is None) == (keyed.pattern.search(text) is None), keyed.stems


# The substrings in front of the file-writing patterns only skip texts that cannot match.
_WRITE_WORDS = [
    "df.to_csv(", ".to_parquet(", "to_", "plt.savefig(", "np.savez(", "save(", "fig.write_image(", "imwrite(",
    "gdf.to_file(", "torch.save(m, ", "joblib.dump(m, ", "pickle.dump(x, ", "dump(x, ", "open(", "Path(",
    ").write_text(", ".touch(", "shutil.copy(", "copy2(", "move(", "os.rename(", "replace(", "'out.csv'",
    '"a/b.png"', ", ", "mode=", "'w'", "'rb'", "x = ", "\n", " > ", ">>", "2>&1", "tee -a ", "touch ",
    "cp ", "mv -f ", "file.txt", " ", "(", ")",
]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(_WRITE_WORDS) | st.text(max_size=6), max_size=12).map("".join))
def test_write_patterns_find_exactly_what_their_regular_expression_finds(text: str) -> None:
    from soba_nb.compaction.extract import _CODE_WRITES, _SHELL_WRITES

    for needing in (*_CODE_WRITES, *_SHELL_WRITES):
        found = [match.group(0) for match in needing.finditer(text)]
        assert found == [match.group(0) for match in needing.pattern.finditer(text)], needing.needs


def test_tool_arguments_nested_absurdly_deep_do_not_stop_the_capsule() -> None:
    from soba_nb.compaction.deterministic import build_deterministic_capsule

    deep = "[" * 100_000 + "]" * 100_000
    entries = [
        MessageEntry(role="user", content="load the data"),
        ToolCallEntry(call_id="c1", name="python", arguments=deep),
        ToolResultEntry(call_id="c1", name="python", content="ok"),
        MessageEntry(role="assistant", content="done"),
    ]
    capsule = build_deterministic_capsule(entries)
    assert "load the data" in capsule.goal_and_constraints


def test_lists_stay_bounded_over_many_compactions() -> None:
    from soba_nb.compaction.deterministic import LIST_ITEMS_MAX, OLDER_LEFT_OUT

    previous: Capsule | None = None
    for roll in range(4):  # each capsule rolls the one before up, with 150 new distinct runs
        history = History().user(f"batch {roll}")
        for index in range(150):
            history.shell(f"echo {roll}-{index} > out/{roll}-{index}.txt", 0)
        previous = build(history, previous=previous)
    verification = previous.verification.splitlines()
    assert verification[0] == f"- {OLDER_LEFT_OUT}" and len(verification) == LIST_ITEMS_MAX + 1
    assert verification.count(f"- {OLDER_LEFT_OUT}") == 1  # one note, however many rolls
    assert "echo 3-149 >" in previous.verification and "echo 0-0 >" not in previous.verification
    assert len(previous.files_modified.splitlines()) == LIST_ITEMS_MAX + 1


def test_fewer_items_make_a_shorter_capsule_that_keeps_the_newest_and_the_request() -> None:
    from soba_nb.compaction.deterministic import capsule_from_scan, requests_of, scan_for_capsule

    history = History().user("Clean the sensor logs; keep the raw files.")
    for index in range(300):
        history.assistant(f"step {index} done").shell(f"python clean.py --part {index}", index % 2)
        history.tool("read_file", "x", path=f"data/part_{index}.csv")
    history.user("Now plot the drift per sensor.")
    scan = scan_for_capsule(history.entries)
    requests = requests_of(history.entries, (), None, None)
    sizes = []
    for items_max in (None, 100, 25, 6, 1):
        capsule = capsule_from_scan(scan, items_max=items_max, requests=requests)
        text = render_capsule(capsule)
        assert parse_capsule(text) is not None
        assert "Now plot the drift per sensor." in capsule.goal_and_constraints
        assert "--part 299" in capsule.verification and "data/part_299.csv" in capsule.files_read
        sizes.append(len(text))
        if items_max is not None:
            for section in (capsule.verification, capsule.files_read, capsule.work_done, capsule.blockers):
                assert len(section.splitlines()) <= items_max + 1
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0] // 20
    assert capsule_from_scan(scan, requests=requests) == build(history)  # rendering again leaves the scan as it was


def test_a_capsule_that_gives_way_drops_printed_output_before_any_run() -> None:
    from soba_nb.compaction.deterministic import (
        KERNEL_LINE_GIVING_WAY_CHARS,
        capsule_from_scan,
        scan_for_capsule,
        without_output,
    )

    history = History().user("count them").tool("python", "stdout:\n14\n", code="print(len(dups))")
    history.shell("wc -l data.csv", 0, "1723 data.csv").shell("ls missing", 2, "ls: cannot access 'missing'")
    history.tool("python", "Traceback (most recent call last):\nKeyError: 'region'", error=True, code="df['Region']")
    scan = scan_for_capsule(history.entries)
    wide = "clean: DataFrame 1722×40 · columns: " + ", ".join(f"column_{n} float64" for n in range(40))
    full = capsule_from_scan(scan, kernel_state=[wide])
    brief = capsule_from_scan(scan, kernel_state=[wide], giving_way=True)
    assert "→ ok: 14" in full.verification and "exit status 0: 1723 data.csv" in full.verification
    assert brief.verification.splitlines() == [
        "- python `print(len(dups))` → ok",
        "- shell `wc -l data.csv` → exit status 0",
        "- shell `ls missing` → exit status 2",
        "- python `df['Region']` → KeyError: 'region'",  # a failure keeps what went wrong
    ]
    assert wide in full.kernel_state and len(brief.kernel_state) <= KERNEL_LINE_GIVING_WAY_CHARS + 2
    assert brief.kernel_state.startswith("- clean: DataFrame 1722×40 · columns: column_0 float64")
    # A previous capsule's runs give way too.
    assert without_output("- python `len(df)` → ok: 1722") == "- python `len(df)` → ok"
    assert without_output("- python `x` → KeyError: 'a'") == "- python `x` → KeyError: 'a'"


def test_the_session_s_first_request_outlasts_the_budget_through_every_roll_up() -> None:
    goal = "I'm preparing the Q3 churn report for the board; every seed fixed to 7. " + "Context. " * 150
    capsule = build(History().user(goal).assistant("Noted."), request_tokens=300)
    for n in range(12):
        history = History().user(f"request {n}: " + "detail " * 60).assistant(f"answer {n}")
        capsule = build(history, previous=capsule, request_tokens=300)
    requests, _ = split_goal(capsule.goal_and_constraints)
    assert requests.items[0].text.startswith("request 11: ")
    first = requests.items[-1]
    assert first.opening and first.clipped and first.text.startswith("I'm preparing the Q3 churn report for the board")
    assert requests.older_left_out > 0
    block = capsule.goal_and_constraints
    assert block.index("older request(s) left out") < block.index("(the session's first request; clipped: its head and tail):")
    assert split_goal(parse_capsule(render_capsule(capsule)).goal_and_constraints)[0] == requests
    # With room for it, the first request is quoted whole.
    roomy = build(History().user(goal).assistant("Noted.").user("next").assistant("ok"))
    assert split_goal(roomy.goal_and_constraints)[0].items[-1] == replace_opening(goal)


def replace_opening(text: str):
    from soba_nb.compaction.requests import Request

    return Request(text, "done", opening=True)


def test_the_newest_request_is_whole_even_past_the_budget() -> None:
    newest = "Write the methods section next: " + "data sources, cleaning rules, the split, the evaluation; " * 40
    history = History().user("first: load it").assistant("ok").user(newest).assistant("Drafted.")
    requests, _ = split_goal(build(history, request_tokens=100).goal_and_constraints)
    assert requests.items[0].text == newest and not requests.items[0].clipped
    assert requests.items[-1].text == "first: load it"
