"""Continuation benchmark (SPEC §14, issue 38): realistic data-science sessions, compacted, scored
on what the NEXT model reads. `python benchmarks/continuation.py` prints a Markdown table
(`--json` prints the scores as JSON instead).

Sessions (benchmarks/continuation_scripts.py): four, each played into a real transcript with its
code really run (benchmarks/continuation_sessions.py). Each is compacted twice by soba's engine
(`Compactor.compact()`, a `user` compaction; benchmarks/continuation_engine.py): `tail`, with the
last question in the kept tail, and `mid-turn`, with the last question and its first two tool
steps replaced (the work on it goes on after the capsule).

Paths:
- `deterministic`: today's capsule without a summary model;
- `model`: today's capsule written by an obedient scripted model that follows the summary prompt
  to the letter (benchmarks/continuation_summarizer.py);
- `drop-oldest`: no capsule, only the kept tail;
- `30842b0 deterministic` / `30842b0 model`: the same, by the revision before issue 38 (a git
  worktree of it, run in a child process; skipped, with a line saying so, without git or it).

Scores, from the next request's model input (`Compactor.request_for_sending()`: the capsule with
its frame and the kept tail) and the capsule:
- requests: share of the user's requests in the replaced part (as typed: `/fix`) found verbatim
  in the messages (a request under 20 characters must be a whole line);
- current: 1 when the request to work on (the last question) is in the messages verbatim, no
  finished request is quoted as the latest / in-progress one, and it is not quoted as done;
- figures: share of the session's key figures (printed by its code before the last question)
  found in the messages;
- phantom: paths under `## Files modified` that the session's code never wrote;
- columns: share of the session's key columns named in `## Kernel state`;
- capsule and input tokens (o200k, as gpt-4o counts).
Targets for today's paths: 100 % requests, 100 % current, ≥ 95 % figures, 0 phantom files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

try:
    from benchmarks.continuation_engine import compact_path, counter
    from benchmarks.continuation_scripts import SESSIONS
    from benchmarks.continuation_sessions import Built, build
    from benchmarks.continuation_summarizer import ObedientSummarizer
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    from continuation_engine import compact_path, counter  # type: ignore[no-redef]
    from continuation_scripts import SESSIONS  # type: ignore[no-redef]
    from continuation_sessions import Built, build  # type: ignore[no-redef]
    from continuation_summarizer import ObedientSummarizer  # type: ignore[no-redef]

BASELINE_REVISION = "30842b0"
"""The last commit before issue 38's work: 'today's capsule' before this issue."""
NEW_PATHS = ("deterministic", "model")
PATHS = (*NEW_PATHS, "drop-oldest", f"{BASELINE_REVISION} deterministic", f"{BASELINE_REVISION} model")
VARIANTS = ("tail", "mid-turn")
SHORT_REQUEST_CHARS = 20
FIGURES_TARGET = 0.95
BENCH_DIR = Path(__file__).resolve().parent

_FENCED = r"\s*\n+(`{3,})[a-z]*\n(.*?)\n\1"
_AS_CURRENT = (
    re.compile(r"(?:latest|current)[^\n]*request[^\n]*:" + _FENCED, re.IGNORECASE | re.DOTALL),
    re.compile(r"^\d+\. in progress[^\n]*:" + _FENCED, re.MULTILINE | re.DOTALL),
)
_AS_DONE = re.compile(r"^\d+\. done[^\n]*:" + _FENCED, re.MULTILINE | re.DOTALL)


@dataclass
class Score:
    session: str
    variant: str
    path: str
    requests: tuple[int, int]
    current: int
    figures: tuple[int, int]
    phantom: list[str]
    columns: tuple[int, int]
    capsule_tokens: int
    input_tokens: int
    missing_requests: list[str]
    missing_figures: list[str]
    current_problem: str


def _norm(text: str) -> str:
    return " ".join(text.split())


def model_reads(result: dict[str, Any]) -> str:
    """The messages of the next request (the system prompt is the same for every path)."""
    return "\n".join(m["content"] + "".join("\n" + call for call in m["calls"]) for m in result["messages"])


def request_kept(request: str, reads: str) -> bool:
    if len(request) < SHORT_REQUEST_CHARS:
        return any(line.strip() == request for line in reads.splitlines())
    return _norm(request) in _norm(reads)


def figure_kept(figure: str, reads: str) -> bool:
    return re.search(r"(?<![\d.])" + re.escape(figure) + r"(?!\d)", reads) is not None


def section(capsule: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", capsule, re.MULTILINE | re.DOTALL)
    return match.group(1).strip() if match else ""


def phantom_files(capsule: str, written: set[str]) -> list[str]:
    names = {Path(path).name for path in written}
    phantoms = []
    for line in section(capsule, "Files modified").splitlines():
        item = re.sub(r"^\s*(?:[-*+]|\d+[.)])\s+", "", line).replace("`", "").strip()
        item = re.split(r" \(| — | - |: ", item, maxsplit=1)[0].strip()
        if item and item.lower() not in ("(none)", "none") and Path(item).name not in names:
            phantoms.append(item)
    return phantoms


def current_problem(capsule: str, reads: str, target: str, finished: Sequence[tuple[str, str]]) -> str:
    """Why the request to work on is not identified ("" when it is)."""
    if _norm(target) not in _norm(reads):
        return "the request being worked on does not reach the model verbatim"
    quoted = [_norm(m.group(2)) for pattern in _AS_CURRENT for m in pattern.finditer(capsule)]
    for typed, sent in finished:
        for quote in quoted:
            if quote and any(_norm(text) and (_norm(text) == quote or _norm(text) in quote) for text in (typed, sent)):
                return f"a finished request is quoted as the current one: {typed[:60]!r}"
    if any(_norm(target) in _norm(m.group(2)) for m in _AS_DONE.finditer(capsule)):
        return "the request being worked on is quoted as done"
    return ""


def score(built: Built, variant: str, path: str, result: dict[str, Any]) -> Score:
    reads = model_reads(result)
    capsule = result["capsule_content"]
    requests = [typed for typed, _ in built.requests] + ([built.last_request] if variant == "mid-turn" else [])
    missing = [request for request in requests if not request_kept(request, reads)]
    lost = [figure for figure in built.figures if not figure_kept(figure, reads)]
    problem = current_problem(result["capsule"], reads, built.last_request, built.requests)
    kernel = section(capsule, "Kernel state")
    known = sum(re.search(rf"(?<![\w]){re.escape(c)}(?![\w])", kernel) is not None for c in built.session.columns)
    return Score(
        built.session.name, variant, path, (len(requests) - len(missing), len(requests)), int(not problem),
        (len(built.figures) - len(lost), len(built.figures)), phantom_files(capsule, built.written),
        (known, len(built.session.columns)), result["capsule_tokens"], result["input_tokens"], missing, lost, problem,
    )  # fmt: skip


def first_kept(built: Built, variant: str) -> str:
    return built.last_request_id if variant == "tail" else built.last_group_id


def drop_oldest(built: Built, first_kept_id: str) -> dict[str, Any]:
    """No capsule: the next request carries only the kept tail."""
    from soba_nb.agent.prompt import SYSTEM_PROMPT
    from soba_nb.agent.tools import TOOL_SCHEMAS
    from soba_nb.compaction.model_input import VISIBLE_TYPES, VisibleContext, assemble
    from soba_nb.transcript.store import Transcript

    try:
        from benchmarks.continuation_engine import messages_of
    except ImportError:
        from continuation_engine import messages_of  # type: ignore[no-redef]

    path = Transcript.load(built.transcript).path_view()
    start = next(index for index, entry in enumerate(path) if entry.id == first_kept_id)
    visible = tuple(entry for entry in path[start:] if isinstance(entry, VISIBLE_TYPES))
    built_input = assemble(VisibleContext(None, visible, ()), system=SYSTEM_PROMPT, tools=TOOL_SCHEMAS, counter=counter())
    return {"capsule": "", "capsule_content": "", "capsule_tokens": 0, "messages": messages_of(built_input),
            "input_tokens": built_input.tokens}  # fmt: skip


def run_new(built: Built, work: Path, paths: Sequence[str] = PATHS[:3]) -> list[Score]:
    """Today's paths (and drop-oldest) of one session, in process."""
    scores = []
    for variant in VARIANTS:
        kept = first_kept(built, variant)
        for path in paths:
            if path == "drop-oldest":
                result = drop_oldest(built, kept)
            else:
                summarizer = ObedientSummarizer() if path == "model" else None
                result = compact_path(
                    built.transcript, work / built.session.name / f"{variant}-{path}", first_kept_id=kept,
                    namespace=built.namespace, summarizer=summarizer,
                )  # fmt: skip
                if result["outcome"] != "completed" or not result["kept_from_expected"]:
                    raise RuntimeError(f"{built.session.name} {variant} {path}: compaction {result['outcome']}, kept tail elsewhere")
                if path == "model" and result["quality"] != "full":
                    raise RuntimeError(f"{built.session.name} {variant}: the model capsule was rejected (quality {result['quality']})")
            scores.append(score(built, variant, path, result))
    return scores


def run_baseline(builts: Sequence[Built], work: Path) -> list[Score] | str:
    """The revision before issue 38, in a child process on a worktree of it; or why not."""
    repo = BENCH_DIR.parent
    git = shutil.which("git")
    if git is None:
        return "git is not installed"
    found = subprocess.run([git, "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{BASELINE_REVISION}^{{commit}}"],
                           capture_output=True, text=True)  # fmt: skip
    if found.returncode != 0:
        return f"revision {BASELINE_REVISION} is not in {repo} (not a git clone of soba-nb, or a shallow one)"
    tree = work / f"soba-{BASELINE_REVISION}"
    added = subprocess.run([git, "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(tree), BASELINE_REVISION],
                           capture_output=True, text=True)  # fmt: skip
    if added.returncode != 0:
        return f"git worktree add failed: {added.stderr.strip()}"
    try:
        jobs = [
            {"session": b.session.name, "transcript": str(b.transcript), "folder": str(b.folder), "codes": b.codes,
             "workdir": str(work / "baseline" / b.session.name),
             "variants": [{"name": v, "first_kept_id": first_kept(b, v)} for v in VARIANTS]}
            for b in builts
        ]  # fmt: skip
        job_file = work / "baseline-jobs.json"
        job_file.write_text(json.dumps(jobs), encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": str(tree)}
        child = subprocess.run([sys.executable, str(BENCH_DIR / "continuation_engine.py"), "--child", str(job_file)],
                               capture_output=True, text=True, env=env, cwd=work)  # fmt: skip
        if child.returncode != 0:
            return f"the {BASELINE_REVISION} child failed: {child.stderr.strip().splitlines()[-1:]}"
        answer = json.loads(child.stdout)
        if not Path(answer["soba_nb"]).resolve().is_relative_to(tree.resolve()):
            return f"the child imported soba_nb from {answer['soba_nb']}, not the worktree"
    finally:
        subprocess.run([git, "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True)
    by_name = {b.session.name: b for b in builts}
    return [
        score(by_name[r["session"]], r["variant"], f"{BASELINE_REVISION} {'model' if r['model'] else 'deterministic'}", r)
        for r in answer["results"]
    ]


def _pct(pair: tuple[int, int]) -> str:
    return f"{100 * pair[0] / pair[1]:.0f} %" if pair[1] else "–"


def totals(scores: Sequence[Score], path: str) -> dict[str, Any]:
    mine = [s for s in scores if s.path == path]
    add = lambda name: (sum(getattr(s, name)[0] for s in mine), sum(getattr(s, name)[1] for s in mine))  # noqa: E731
    return {
        "path": path, "requests": add("requests"), "current": (sum(s.current for s in mine), len(mine)),
        "figures": add("figures"), "phantom": sum(len(s.phantom) for s in mine), "columns": add("columns"),
        "capsule_tokens": round(sum(s.capsule_tokens for s in mine) / max(len(mine), 1)),
        "input_tokens": round(sum(s.input_tokens for s in mine) / max(len(mine), 1)),
    }  # fmt: skip


def targets(scores: Sequence[Score]) -> list[str]:
    """One line per target for today's paths: met, or what missed it and where."""
    lines = []
    for path in NEW_PATHS:
        mine = [s for s in scores if s.path == path]
        t = totals(scores, path)
        misses = {
            "requests 100 %": [f"{s.session}/{s.variant}: {s.missing_requests}" for s in mine if s.missing_requests],
            "current request 100 %": [f"{s.session}/{s.variant}: {s.current_problem}" for s in mine if s.current_problem],
            "figures ≥ 95 %": [f"{s.session}/{s.variant}: lost {s.missing_figures}" for s in mine if s.missing_figures]
            if t["figures"][0] < FIGURES_TARGET * t["figures"][1] else [],
            "0 phantom files": [f"{s.session}/{s.variant}: {s.phantom}" for s in mine if s.phantom],
        }
        for target, missed in misses.items():
            lines.append(f"- {path}: {target}: " + ("met" if not missed else "MISSED: " + "; ".join(missed)))
    return lines


def table(scores: Sequence[Score], skipped: str | None) -> str:
    head = "| session | variant | path | requests | current | figures | phantom files | columns | capsule tok | input tok |"
    rule = "|" + "---|" * 10
    rows = [head, rule]
    for s in scores:
        rows.append(f"| {s.session} | {s.variant} | {s.path} | {_pct(s.requests)} | {s.current} | {_pct(s.figures)} | "
                    f"{len(s.phantom)} | {_pct(s.columns)} | {s.capsule_tokens:,} | {s.input_tokens:,} |")  # fmt: skip
    rows += ["", "Totals (shares pooled over sessions and variants; tokens: mean per compaction):", "",
             "| path | requests | current | figures | phantom files | columns | capsule tok | input tok |", "|" + "---|" * 8]  # fmt: skip
    for path in PATHS:
        if any(s.path == path for s in scores):
            t = totals(scores, path)
            rows.append(f"| {path} | {_pct(t['requests'])} | {t['current'][0]}/{t['current'][1]} | {_pct(t['figures'])} | "
                        f"{t['phantom']} | {_pct(t['columns'])} | {t['capsule_tokens']:,} | {t['input_tokens']:,} |")  # fmt: skip
    if skipped:
        rows += ["", f"Baseline {BASELINE_REVISION} skipped: {skipped}."]
    rows += ["", "Targets (today's paths):", *targets(scores)]
    return "\n".join(rows)


def run(folder: Path, *, baseline: bool = True, sessions: Sequence[Any] = SESSIONS) -> tuple[list[Score], str | None]:
    builts = [build(session, folder / "sessions" / session.name) for session in sessions]
    scores = [score for built in builts for score in run_new(built, folder / "work")]
    skipped: str | None = None
    if baseline:
        old = run_baseline(builts, folder)
        if isinstance(old, str):
            skipped = old
        else:
            scores += old
    order = {(s.name, v, p): i for i, (s, v, p) in enumerate((s, v, p) for s in sessions for v in VARIANTS for p in PATHS)}
    scores.sort(key=lambda s: order[(s.session, s.variant, s.path)])
    return scores, skipped


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Continuation benchmark: capsules scored on what the next model reads.")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON instead of a table")
    parser.add_argument("--no-baseline", action="store_true", help=f"skip the {BASELINE_REVISION} baseline (no git)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="soba-continuation-") as temp:
        scores, skipped = run(Path(temp), baseline=not args.no_baseline)
    if args.json:
        print(json.dumps({"scores": [asdict(s) for s in scores], "totals": [totals(scores, p) for p in PATHS],
                          "baseline_skipped": skipped, "targets": targets(scores)}, indent=2))  # fmt: skip
        return
    print(table(scores, skipped))
    print(f"\n({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
