"""The generator: a long data-analysis session with planted facts, deterministic from a seed.

The session follows one analysis from the goal to the report: the user states the goal and
constraints, the agent reads the project, loads the raw tables, cleans them, builds features
(`build_features` and its test fail until `src/features.py` is fixed), splits, trains and
evaluates a model, saves its outputs, runs the linter (which still fails at the end), and
is finally asked for a section of the report — the latest request. Filler turns
(`retention_filler`) between those steps make the session long the way real sessions are
long. Every fact the benchmark scores is recorded as a `Fact` where it is planted.
"""

from __future__ import annotations

import random

from benchmarks import retention_content as content
from benchmarks.retention_builder import SessionBuilder
from benchmarks.retention_facts import Kind
from benchmarks.retention_filler import Filler, turn_chars, user_variables
from benchmarks.retention_sessions import Step, SyntheticSession, ToolUse, Turn
from benchmarks.retention_themes import (
    BLOCKERS,
    CONSTRAINTS,
    DECISIONS,
    LATEST_REQUESTS,
    READ_ONLY_FILES,
    THEMES,
)

TARGET_TOKENS_RANGE = (36_000, 150_000)
CHARS_PER_TOKEN = 2.4
"""Characters per token of this content, between SmolLM2's tokenizer (~2.1: numbers and
tables cost it dearly) and o200k's (~2.9); used only to size the filler, so a session is
roughly 30k–125k o200k tokens and 40k–170k SmolLM2 tokens. The benchmark reports the real
counts."""
DECISION_WINDOW = 300
CONSTRAINT_WINDOW = 60
FEATURE_COUNT_RANGE = (12, 28)
TEST_COMMAND = "python -m pytest -q tests/test_features.py"
LINT_COMMAND = "make lint"


def _fill(text: str, **values: object) -> str:
    return text.format(**values) if "{" in text else text


def generate_session(seed: int, target_tokens: int | None = None) -> SyntheticSession:
    """One session: the same seed gives the same turns, facts and kernel variables."""
    rng = random.Random(seed)
    theme = rng.choice(THEMES)
    target = target_tokens or rng.randint(*TARGET_TOKENS_RANGE)
    b = SessionBuilder(rng, theme)
    read_only = rng.sample(READ_ONLY_FILES, rng.randint(6, 9))
    decisions = rng.sample(range(len(DECISIONS)), rng.randint(3, 4))
    blockers = rng.sample(BLOCKERS, 2)
    scenes = [
        _goal(b, read_only[:2]),
        _load(b),
        _explore(b),
        _clean(b, decisions),
        _features_fail(b, blockers[0]),
        _features_fixed(b),
        _split(b, decisions),
        _model(b, decisions),
        _lint(b, 1),
        _save(b, decisions),
        _lint(b, 2),
    ]
    final = _final(b)
    filler = Filler(b, reads=read_only[2:], blocker=blockers[1])
    budget = target * CHARS_PER_TOKEN - sum(turn_chars(t) for t in (*scenes, final))
    turns = scenes[:2]
    for scene, fillers in zip(scenes[2:], filler.turns(int(budget), gaps=len(scenes) - 2), strict=True):
        turns += [*fillers, scene]
    turns += [*filler.leftover(), final]
    for path in read_only:
        b.plant(Kind.FILES_READ, path, (path,))
    return SyntheticSession(seed, turns, b.facts, list(b.frames.values()), user_variables(rng))


# --- the planted scenes --------------------------------------------------------------------


def _goal(b: SessionBuilder, reads: list[str]) -> Turn:
    rng, theme = b.rng, b.theme
    chosen = rng.sample(CONSTRAINTS, 3)
    stated = []
    for sentence_template, groups in chosen:
        n = rng.randint(300, 1500) if "words" in sentence_template else rng.randint(1000, 9999) if "seed" in sentence_template else rng.randint(5, 40)
        sentence = _fill(sentence_template, n=n)
        stated.append(sentence)
        keys = tuple(tuple(_fill(option, n=n) for option in group) for group in groups)
        b.plant(Kind.CONSTRAINTS, sentence, *keys, window=CONSTRAINT_WINDOW if len(keys) > 1 else None)
    b.plant(Kind.GOAL, theme.goal, (theme.goal_key,))
    request = f"I'm preparing {theme.goal}. " + " ".join(stated) + " Please get familiar with the project first."
    steps = [Step("Let me read the project overview and the data documentation first.",
                  [b.read(path, content.markdown_doc(rng, content.title_of(path), rng.randint(3, 6))) for path in reads])]
    answer = f"I have read the overview. {content.remark(rng)} {content.remark(rng)}"
    return Turn(request, steps, answer)


def _load(b: SessionBuilder) -> Turn:
    rng, theme = b.rng, b.theme
    first = b.frame(theme.raw[0], rng.randint(2_000, 60_000), theme.raw_columns[0])
    second = b.frame(theme.raw[1], rng.randint(20_000, 250_000), theme.raw_columns[1])
    validate = f"python scripts/validate_schema.py data/raw/{first.name}.csv"
    b.plant_run(Kind.COMMANDS, validate, "ok")
    checks = "\n".join(f"  {c}: ok ({content.words(rng, 3)})" for c in first.columns)
    steps = [
        Step("I'll load both raw tables.", [
            b.python(f"{first.name} = pd.read_csv('data/raw/{first.name}.csv')\n{first.name}.shape",
                     f"result: ({first.rows}, {len(first.columns)})"),
            b.python(f"{second.name} = pd.read_csv('data/raw/{second.name}.csv')\n{second.name}",
                     "result: " + content.frame_repr(rng, second.columns, second.rows, shown=rng.randint(5, 15))),
        ]),
        Step("Now the schema check the project ships.", [b.shell(validate, f"schema ok\n{checks}", 0)]),
    ]
    return Turn("Load the two raw tables and tell me how big they are.", steps,
                f"Both tables are loaded and the schema check passes. {content.remark(rng)}")


def _explore(b: SessionBuilder) -> Turn:
    rng = b.rng
    command = f"wc -l data/raw/{b.theme.raw[1]}.csv"
    steps = [Step("Let me see how large the raw files are on disk.", [b.shell(command, f"{rng.randint(20_000, 250_000)} data/raw/{b.theme.raw[1]}.csv", 0)])]
    b.plant_run(Kind.COMMANDS, command, "ok")
    return Turn("Before we change anything, how big are the raw files?", steps, content.remark(rng))


def _decision(b: SessionBuilder, index: int, decisions: list[int], column: str) -> str:
    if index not in decisions:
        return ""
    template, groups = DECISIONS[index]
    n = b.rng.randint(11, 24) if "{n}%" in template else b.rng.randint(76, 84)
    sentence = _fill(template, n=n, column=column)
    keys = tuple(tuple(_fill(option, n=n, column=column) for option in group) for group in groups)
    b.plant(Kind.DECISIONS, sentence, *keys, window=DECISION_WINDOW)
    return " " + sentence


def _clean(b: SessionBuilder, decisions: list[int]) -> Turn:
    rng, raw = b.rng, b.frames[b.theme.raw[0]]
    column = b.theme.numeric
    old = "def clean(df):\n    return df.dropna()"
    new = f"def clean(df):\n    df = df.fillna({{{column!r}: df[{column!r}].median()}})\n    return df"
    b.plant(Kind.FILES_MODIFIED, "src/clean.py", ("src/clean.py",))
    steps = [
        Step("First the current cleaning code and the null rates.", [
            b.read("src/clean.py", content.source_module(rng, "clean", ["clean"], rng.randint(6, 14))),
            b.python(f"{raw.name}.isna().mean().sort_values()", "result: " + content.value_counts(rng, "column", 30)),
        ]),
        Step("Updating the cleaning step.", [b.edit("src/clean.py", old, new),
                                             b.python(f"{raw.name} = clean({raw.name})")]),
    ]
    answer = "Cleaning is updated." + _decision(b, 0, decisions, column) + _decision(b, 3, decisions, column)
    return Turn(f"Clean {raw.name}: handle the missing values and the obvious outliers.", steps, answer)


def _build_code(b: SessionBuilder) -> str:
    return f"features = build_features({b.theme.raw[0]}, {b.theme.raw[1]})"


def _features_fail(b: SessionBuilder, blocker: tuple[str, tuple[tuple[str, ...], ...]]) -> Turn:
    rng, missing = b.rng, b.theme.missing_column
    error = f"KeyError: '{missing}'"
    failures = [(f"test_{missing}_{i}", error) for i in range(rng.randint(1, 3))]
    steps = [
        Step("Let me read the feature code first.", [
            b.read("src/features.py", content.source_module(rng, "features", ["build_features"], rng.randint(8, 18)))]),
        Step("Running it.", [b.python(_build_code(b), error=error)]),
        Step("And the feature tests.", [b.shell(TEST_COMMAND, content.pytest_log(rng, "tests/test_features.py", rng.randint(20, 60), failures), 1)]),
    ]
    n = rng.randint(1000, 9999)
    text, groups = blocker
    sentence = _fill(text, table=b.theme.raw[1], n=n)
    b.plant(Kind.BLOCKERS, sentence, *(tuple(_fill(o, n=n) for o in g) for g in groups))
    answer = f"`build_features` fails: the column `{missing}` is never derived, and the feature tests fail the same way. {sentence}"
    return Turn("Build the feature table.", steps, answer)


def _features_fixed(b: SessionBuilder) -> Turn:
    rng, theme = b.rng, b.theme
    raw = b.frames[theme.raw[0]]
    names = [theme.missing_column, *(f"{rng.choice(content.WORDS)}_{i}" for i in range(rng.randint(*FEATURE_COUNT_RANGE)))]
    features = b.frame("features", raw.rows, tuple(names))
    b.plant(Kind.FILES_MODIFIED, "src/features.py", ("src/features.py",))
    b.plant(Kind.FILES_MODIFIED, "tests/test_features.py", ("tests/test_features.py",))
    b.plant_run(Kind.COMMANDS, _build_code(b), "ok")
    b.plant_run(Kind.COMMANDS, TEST_COMMAND, "ok")
    steps = [
        Step("Deriving the missing column and adding a regression test.", [
            b.edit("src/features.py", "    out = df.copy()", f"    out = df.copy()\n    out[{theme.missing_column!r}] = derive(out)"),
            b.write("tests/test_features.py", content.source_module(rng, "test_features", [f"test_{theme.missing_column}"], 4)),
        ]),
        Step("Running it again.", [b.python(_build_code(b)), b.python("features.shape", f"result: ({features.rows}, {len(names)})")]),
        Step("And the tests.", [b.shell(TEST_COMMAND, content.pytest_log(rng, "tests/test_features.py", rng.randint(20, 60), []), 0)]),
        Step("Recording the milestone.", [ToolUse("checkpoint", {"kind": "milestone", "note": "feature table built; its tests pass"})]),
    ]
    return Turn(f"Fix it: derive {theme.missing_column} in src/features.py and add a regression test.", steps,
                f"Fixed: `{theme.missing_column}` is derived and tested. {content.remark(rng)}")


def _split(b: SessionBuilder, decisions: list[int]) -> Turn:
    rng, features = b.rng, b.frames["features"]
    train_rows = round(features.rows * rng.uniform(0.7, 0.85))
    train = b.frame("train", train_rows, features.columns)
    holdout = b.frame("holdout", features.rows - train_rows, features.columns)
    code = "train, holdout = split_by_month(features, cutoff='2024-06-30')"
    b.plant_run(Kind.COMMANDS, code, "ok")
    steps = [Step("Splitting by month.", [
        b.python(code),
        b.python("train.shape, holdout.shape",
                 f"result: (({train.rows}, {len(train.columns)}), ({holdout.rows}, {len(holdout.columns)}))"),
    ])]
    answer = "Train and holdout are ready." + _decision(b, 2, decisions, "")
    return Turn("Split the features into train and holdout.", steps, answer)


def _model(b: SessionBuilder, decisions: list[int]) -> Turn:
    rng, holdout = b.rng, b.frames["holdout"]
    fit, evaluate = "model = fit_model(train, kind='gbm')", "evaluate_holdout(model, holdout)"
    b.plant_run(Kind.COMMANDS, fit, "ok")
    b.plant_run(Kind.COMMANDS, evaluate, "ok")
    scores = b.frame("scores", holdout.rows, ("id", "score", "label"))
    log = "\n".join(f"[{i}] train-logloss:{rng.uniform(0.2, 0.7):.5f} valid-logloss:{rng.uniform(0.2, 0.7):.5f}" for i in range(rng.randint(60, 200)))
    steps = [
        Step("Training the first model.", [b.python(fit, "stdout:\n" + log)]),
        Step("Evaluating it on the holdout and scoring.", [
            b.python(evaluate, f"result: {{'auc': 0.{rng.randint(70, 85)}, 'logloss': {rng.uniform(0.3, 0.5):.3f}}}"),
            b.python("scores = score_holdout(model, holdout)\nscores", "result: " + content.frame_repr(rng, scores.columns, scores.rows)),
        ]),
        Step("Recording the milestone.", [ToolUse("checkpoint", {"kind": "milestone", "note": "first model trained and evaluated"})]),
    ]
    answer = "The first model is trained." + _decision(b, 1, decisions, "")
    return Turn("Train a first model and evaluate it on the holdout.", steps, answer)


def _lint(b: SessionBuilder, attempt: int) -> Turn:
    rng = b.rng
    problems = rng.randint(8, 40) if attempt == 1 else rng.randint(2, 6)
    steps = [Step("Running the linter.", [b.shell(LINT_COMMAND, content.lint_log(rng, problems, 2), 2)])]
    if attempt == 1:
        return Turn("Run the linters before we go further.", steps, f"`make lint` fails with {problems} problems. {content.remark(rng)}")
    b.plant_run(Kind.COMMANDS, LINT_COMMAND, "failed")
    b.plant_run(Kind.BLOCKERS, LINT_COMMAND, "failed")
    return Turn("Try the lint again after your changes.", steps, f"`make lint` still fails ({problems} problems left). {content.remark(rng)}")


def _save(b: SessionBuilder, decisions: list[int]) -> Turn:
    rng = b.rng
    for path in ("data/processed/features.parquet", "config/pipeline.yaml"):
        b.plant(Kind.FILES_MODIFIED, path, (path,))
    du = "du -sh data/processed"
    b.plant_run(Kind.COMMANDS, du, "ok")
    steps = [Step("Saving the features and recording the cutoff.", [
        b.python("features.to_parquet('data/processed/features.parquet')"),
        b.edit("config/pipeline.yaml", "cutoff: null", "cutoff: 2024-06-30"),
        b.shell(du, f"{rng.randint(3, 90)}M\tdata/processed", 0),
    ])]
    answer = "Saved." + _decision(b, 4, decisions, "")
    return Turn("Save the features and record the cutoff in the pipeline config.", steps, answer)


def _final(b: SessionBuilder) -> Turn:
    rng, theme = b.rng, b.theme
    request = _fill(rng.choice(LATEST_REQUESTS), report=theme.report, audience=theme.audience)
    b.plant(Kind.LATEST_REQUEST, request, (request,))
    b.plant(Kind.FILES_MODIFIED, theme.report, (theme.report,))
    importances = content.value_counts(rng, "feature importance", rng.randint(40, 120))
    steps = [
        Step("Collecting the importances first.", [b.python("importances(model).head(40)", "result: " + importances)]),
        Step("Writing the section.", [b.write(theme.report, content.markdown_doc(rng, "Findings", rng.randint(3, 6)))]),
    ]
    return Turn(request, steps, f"The section is drafted in `{theme.report}`. {content.remark(rng)}")
