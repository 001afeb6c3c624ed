"""The structure ARCHITECTURE.md describes, checked from the source: imports run one way (no
cycle, the layers below never import the ones above), one module constructs sessions, each
path of a session folder is spelled in one module, and no module grows past 550 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "soba_nb"
MAX_MODULE_LINES = 550
LAYERS = {
    # package (or top-level module) -> what it may import
    "layout": set(),
    "digest": set(),
    "text": set(),
    "messages": set(),
    "paths": set(),
    "collector": set(),
    "printable": {"text"},
    "redact": set(),
    "images": set(),
    "tokenizer_cache": {"layout"},
    "plain_counts": {"tokenizer_cache", "digest"},
    "tokens": {"images", "tokenizer_cache", "plain_counts"},
    "resolution": set(),
    "catalogue": set(),
    "own_files": {"layout"},
    "inbox": {"layout"},
    "transcript": {"layout", "redact", "collector"},
    "compaction": {"transcript", "tokens", "plain_counts", "images", "messages", "redact", "text", "layout", "collector", "digest"},
    "config": {"compaction", "layout", "paths", "printable", "redact", "resolution", "text"},
    "engine": {"messages"},
    "window": {"catalogue", "compaction", "config", "transcript"},
    "providers": {
        "engine", "compaction", "config", "images", "messages", "text", "transcript", "tokens", "redact", "resolution", "window",
    },
    "capsule_files": {"compaction", "layout", "paths", "redact", "tokens", "transcript", "text", "printable"},
    "agent": {
        "capsule_files", "catalogue", "compaction", "config", "images", "layout", "messages", "own_files", "providers", "resolution",
        "text", "tokens", "transcript", "window", "redact", "paths", "collector", "printable", "inbox",
    },
    "demo": {"agent", "capsule_files", "compaction", "config", "layout"},
    "cli": {
        "agent", "capsule_files", "catalogue", "compaction", "config", "demo", "layout", "providers",
        "resolution", "tokens", "transcript", "window", "paths", "printable", "text", "redact",
    },
    "notebook": {
        "agent", "capsule_files", "compaction", "config", "images", "layout", "paths", "printable", "providers",
        "redact", "transcript", "text", "window", "tokens", "messages", "inbox",
    },
    "server": {"agent", "inbox", "layout", "printable", "transcript"},
    "soba_nb": {"notebook"},
}
"""The layers, lowest first: a package imports only what is listed for it (the compaction core
nothing of the notebook, the providers or the agent; the engine nothing of the providers)."""


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imported(path: Path, known: dict[str, Path]) -> set[str]:
    """soba_nb modules `path` imports, at any depth but under `if TYPE_CHECKING:`."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("soba_nb"):
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name.startswith("soba_nb"))
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit(inner)

    visit(ast.parse(path.read_text()).body)
    return {name for name in found if name in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(path, known) - {name} for name, path in known.items()}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "soba_nb"


def test_no_module_imports_itself_back():
    edges = graph()
    state: dict[str, int] = {}
    cycle: list[str] = []

    def walk(node: str, trail: list[str]) -> bool:
        state[node] = 1
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                cycle.extend(trail[trail.index(target) :] + [target])
                return True
            if target not in state and walk(target, [*trail, target]):
                return True
        state[node] = 2
        return False

    for start in sorted(edges):
        if start not in state and walk(start, [start]):
            break
    assert cycle == [], " → ".join(cycle)


def test_imports_run_down_the_layers():
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in targets
        if layer_of(target) != layer_of(module) and layer_of(target) not in LAYERS[layer_of(module)]
    )
    assert wrong == []


def test_every_package_has_its_layer():
    assert {layer_of(module) for module in modules()} <= set(LAYERS)


def test_one_module_constructs_sessions():
    constructing = [
        str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if re.search(r"\bAgentSession\(", path.read_text())
    ]
    assert constructing == ["agent/assembly.py"]


def test_each_path_of_a_session_folder_is_spelled_in_one_module():
    names = ('".tokens"', '".budget"', '".extract"', '"flight.jsonl"', '".repaired.jsonl"', '"soba.json"', '".soba"')
    spelled = {
        name: sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if name in path.read_text())
        for name in names
    }
    assert spelled == {name: ["layout.py"] for name in names}


def test_no_module_is_over_550_lines():
    long = {str(path.relative_to(PACKAGE)): n for path in PACKAGE.rglob("*.py") if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}
