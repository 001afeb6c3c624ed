"""Cells as context (SPEC §10): what recording every cell costs the user's kernel.

Rows of `benchmarks/run.py` (`--only cells`), or alone: `python benchmarks/cells_bench.py`.
On a real `InteractiveShell` (history in memory, what a cell prints thrown away):

- per cell: a kernel that has already recorded `WARM_CELLS` cells runs a mix of ordinary
  cells (an assignment, a print, an expression with a result, a cell that raises) with the
  recorder registered and without it, in alternating rounds; the median added cost per cell
  (target: under 1 ms);
- the record: its memory after `WARM_CELLS` cells (the bounded deque of `KEPT_CELLS`), as
  tracemalloc sees it — what clearing it frees — for ordinary cells and for cells that each
  print 20 KB and raise, with the peak traced while they ran, against the same cells with no
  recorder (each in a fresh process: `python benchmarks/cells_bench.py child NAME`);
- a cell printing 10 MB, in one write and in 100,000 lines: how much the record keeps, the
  cell's time with the recorder and without, and the peak traced memory either way;
- a cell of 100,000 blank lines (telling soba's own magics apart once took quadratic time).
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

WARM_CELLS = 10_000
ROUNDS = 20
CELLS_PER_ROUND = 50
ADDED_TARGET_S = 0.001
PRINTED_MB = 10
HEAVY_PRINT_CHARS = 20_000
BLANK_LINES = 100_000
KEPT_PRINTED = 8_200
"""`PRINTED_CHARS` (8,000) and the note saying how much was not kept."""
SCRIPT = Path(__file__)


def ordinary(index: int) -> str:
    """The cells of a working session: an assignment, a print, a result, now and then an error."""
    kind = index % 10
    if kind == 9:
        return f"rows[{index}]  # raises: rows has 3 items"
    if kind % 3 == 0:
        return f"value = {index} * 2\nrows = [value, value + 1, value + 2]"
    if kind % 3 == 1:
        return f"print('step', {index}, 'rows:', len(rows))"
    return "value + 1"


def heavy(index: int) -> str:
    """A cell that prints 20 KB and raises (the record keeps the most of it)."""
    return f"print('{index:06d} ' * {HEAVY_PRINT_CHARS // 7})\nraise ValueError('step {index} failed')"


class _Discard:
    """Where the cells' printing goes: nowhere (the terminal is not what is measured)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


@contextmanager
def quiet_shell() -> Iterator[Any]:
    """A fresh InteractiveShell, history in memory, its output thrown away."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    InteractiveShell.clear_instance()
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    config.InteractiveShell.colors = "NoColor"
    out, err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = _Discard()  # type: ignore[assignment]
    try:
        shell = InteractiveShell.instance(config=config)
        yield shell
    finally:
        sys.stdout, sys.stderr = out, err
        InteractiveShell.clear_instance()


def run_cells(shell: Any, make: Callable[[int], str], first: int, count: int) -> list[float]:
    """Seconds per cell."""
    times = []
    for index in range(first, first + count):
        source = make(index)
        start = time.perf_counter()
        shell.run_cell(source, store_history=True)
        times.append(time.perf_counter() - start)
    return times


def per_cell_cost() -> dict[str, float]:
    from soba_nb.notebook.cells import CellRecorder

    with quiet_shell() as shell:
        recorder = CellRecorder(shell)
        recorder.register()
        run_cells(shell, ordinary, 0, WARM_CELLS)
        with_recorder: list[float] = []
        without: list[float] = []
        index = WARM_CELLS
        for round_ in range(ROUNDS):
            for registered in ((True, False) if round_ % 2 else (False, True)):
                if registered:
                    recorder.register()
                    with_recorder += run_cells(shell, ordinary, index, CELLS_PER_ROUND)
                else:
                    recorder.unregister()
                    without += run_cells(shell, ordinary, index, CELLS_PER_ROUND)
                index += CELLS_PER_ROUND
        recorder.unregister()
    return {
        "with": statistics.median(with_recorder),
        "without": statistics.median(without),
        "with_mean": statistics.mean(with_recorder),
        "without_mean": statistics.mean(without),
    }


def record_memory(make: Callable[[int], str], *, record: bool) -> dict[str, float]:
    """Traced memory of `WARM_CELLS` cells of `make`: the record's size (what clearing it
    frees) and the peak while they ran."""
    from soba_nb.notebook.cells import CellRecorder

    with quiet_shell() as shell:
        recorder = CellRecorder(shell)
        if record:
            recorder.register()
        gc.collect()
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            run_cells(shell, make, 0, WARM_CELLS)
            gc.collect()
            current, peak = tracemalloc.get_traced_memory()
            kept = len(recorder.cells)
            recorder.cells.clear()
            gc.collect()
            cleared, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            recorder.unregister()
    return {"record": current - cleared, "peak": peak - base, "kept": kept}


def blank_lines_cell(*, record: bool) -> dict[str, float]:
    """A cell of `BLANK_LINES` blank lines and one statement (a pasted block): its time."""
    from soba_nb.notebook.cells import CellRecorder

    with quiet_shell() as shell:
        recorder = CellRecorder(shell)
        if record:
            recorder.register()
        start = time.perf_counter()
        shell.run_cell("\n" * BLANK_LINES + "x = 1", store_history=True)
        seconds = time.perf_counter() - start
        recorder.unregister()
    return {"seconds": seconds}


def printed_cell(source: str, *, record: bool) -> dict[str, float]:
    """One cell printing `PRINTED_MB` MB: its time, the peak traced and what the record kept."""
    from soba_nb.notebook.cells import CellRecorder

    with quiet_shell() as shell:
        recorder = CellRecorder(shell)
        if record:
            recorder.register()
        shell.run_cell("x = 1", store_history=True)
        start = time.perf_counter()
        shell.run_cell(source, store_history=True)
        seconds = time.perf_counter() - start
        gc.collect()
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            shell.run_cell(source, store_history=True)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        kept = len(recorder.cells[-1].printed) if record and recorder.cells else 0
        recorder.unregister()
    return {"seconds": seconds, "peak": peak - base, "kept": kept}


ONE_WRITE = f"print('x' * {PRINTED_MB * 1_000_000})"
LINES = f"for i in range({PRINTED_MB * 10_000}):\n    print(f'line {{i:07d}} ' + 'x' * 86)"
"""100,000 lines of 100 characters."""


def large_image() -> dict[str, float]:
    """A 20-megapixel figure a call displayed: kept whole as an artifact, then made ready for
    a request (read, resized to what a model takes, base64) — its time and sizes."""
    import io
    import tempfile

    from PIL import Image, ImageDraw

    from soba_nb.agent.artifacts import keep_images
    from soba_nb.agent.request_images import with_images
    from soba_nb.agent.tools.base import DisplayedImage
    from soba_nb.messages import ChatMessage, ImagePart

    image = Image.linear_gradient("L").resize((5000, 4000)).convert("RGB")
    draw = ImageDraw.Draw(image)
    for x in range(0, 5000, 40):  # a plot's worth of lines
        draw.line([(x, 0), (5000 - x, 4000)], fill=(x % 255, 80, 160), width=3)
    out = io.BytesIO()
    image.save(out, format="PNG")
    data = out.getvalue()
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        (base / "nb.soba").mkdir()  # the session folder (the transcript lives there)
        start = time.perf_counter()
        kept = keep_images([DisplayedImage("image/png", data)], base / "nb.soba" / "artifacts", base)
        keep_s = time.perf_counter() - start
        [artifact] = kept.artifacts
        message = ChatMessage("tool", "ok", (), "c1", "python", False, (ImagePart(artifact.path, artifact.mime, artifact.width, artifact.height),))
        start = time.perf_counter()
        [sent] = with_images([message], base=base, vision=True, max_images=4)
        send_s = time.perf_counter() - start
    part = sent.images[0]
    return {"bytes": len(data), "keep": keep_s, "send": send_s, "width": part.width, "height": part.height, "sent": len(part.data or "")}


CHILDREN: dict[str, Callable[[], dict[str, float]]] = {
    "image-20mp": large_image,
    "cost": per_cell_cost,
    "memory-ordinary": lambda: record_memory(ordinary, record=True),
    "memory-ordinary-bare": lambda: record_memory(ordinary, record=False),
    "memory-heavy": lambda: record_memory(heavy, record=True),
    "memory-heavy-bare": lambda: record_memory(heavy, record=False),
    "printed-write": lambda: printed_cell(ONE_WRITE, record=True),
    "printed-write-bare": lambda: printed_cell(ONE_WRITE, record=False),
    "printed-lines": lambda: printed_cell(LINES, record=True),
    "printed-lines-bare": lambda: printed_cell(LINES, record=False),
    "blank-lines": lambda: blank_lines_cell(record=True),
    "blank-lines-bare": lambda: blank_lines_cell(record=False),
}
"""Each measured in a fresh process: IPython's caches (the parsed source of every traceback's
cell) would otherwise favour whichever side ran second."""


def register(benchmark: Callable[[str], Callable[[Any], Any]], row: type, ms: Callable[[float], str], mib: Callable[[float], str]) -> None:
    """Register the rows into run.py's table."""

    @benchmark("cells")
    def cells(_workspace: Any) -> list[Any]:
        return rows(row, ms, mib)


def rows(row: type, ms: Callable[[float], str], mib: Callable[[float], str]) -> list[Any]:
    try:
        from benchmarks.resume_bench import run_child
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from resume_bench import run_child  # type: ignore[no-redef]

    figures = {name: run_child(SCRIPT, "child", name) for name in CHILDREN}
    cost = figures["cost"]
    added = cost["with"] - cost["without"]
    printed = []
    for name, kind in ((f"a cell printing {PRINTED_MB} MB in one write", "printed-write"), (f"a cell printing {PRINTED_MB} MB in 100,000 lines", "printed-lines")):
        recorded, bare = figures[kind], figures[f"{kind}-bare"]
        printed.append(
            row(name, 1,
                f"{ms(recorded['seconds'])}; kept {recorded['kept']:,} characters; peak traced {mib(recorded['peak'])}",
                f"no recorder {ms(bare['seconds'])}; peak traced {mib(bare['peak'])}",
                f"{recorded['seconds'] / bare['seconds']:.2f}×", "kept ≤ 8,000 + note", recorded["kept"] <= KEPT_PRINTED, None)
        )
    memory = []
    for name, kind in ((f"the record after {WARM_CELLS:,} ordinary cells", "memory-ordinary"), (f"the record after {WARM_CELLS:,} cells printing 20 KB and raising", "memory-heavy")):
        recorded, bare = figures[kind], figures[f"{kind}-bare"]
        memory.append(
            row(name, WARM_CELLS, f"{mib(recorded['record'])} kept ({int(recorded['kept'])} cells); peak traced {mib(recorded['peak'])}",
                f"no recorder: peak traced {mib(bare['peak'])}", "", "", None, None)
        )
    blank, blank_bare = figures["blank-lines"], figures["blank-lines-bare"]
    image = figures["image-20mp"]
    return [
        row("a 20-megapixel figure displayed by a call", 1,
            f"kept whole ({mib(image['bytes'])}) in {ms(image['keep'])}; sent at {int(image['width'])}×{int(image['height'])} "
            f"({mib(image['sent'])} base64) in {ms(image['send'])}",
            "5000×4000 PNG", "", "sent ≤ 1568 px, ≤ 1.15 MP",
            max(image["width"], image["height"]) <= 1568 and image["width"] * image["height"] <= 1_150_000, None),
        row(f"recording hook, per cell, after {WARM_CELLS:,} cells", WARM_CELLS,
            f"+{added * 1e6:,.0f} µs (median {ms(cost['with'])} with, {ms(cost['without'])} without; "
            f"means {ms(cost['with_mean'])} / {ms(cost['without_mean'])})",
            f"{ROUNDS * CELLS_PER_ROUND:,} cells each way, alternating rounds", "", f"< {ADDED_TARGET_S * 1000:g} ms added",
            added < ADDED_TARGET_S, None),
        *memory,
        *printed,
        row(f"a cell of {BLANK_LINES:,} blank lines and one statement", 1, ms(blank["seconds"]),
            f"no recorder {ms(blank_bare['seconds'])}", f"{blank['seconds'] / blank_bare['seconds']:.2f}×",
            "< 1 s (was quadratic: 8.7 s at 40,000 lines)", blank["seconds"] < 1.0, None),
    ]


def main(argv: list[str]) -> int:
    if argv[:1] == ["child"]:
        print(json.dumps(CHILDREN[argv[1]]()))
        return 0
    try:
        from benchmarks.run import Row, megabytes, milliseconds, render
    except ImportError:  # run as a script: benchmarks/ itself is on sys.path
        from run import Row, megabytes, milliseconds, render  # type: ignore[no-redef]
    started = time.monotonic()
    print(render(rows(Row, milliseconds, megabytes)))
    print(f"\npython {sys.version.split()[0]}; {time.monotonic() - started:,.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
