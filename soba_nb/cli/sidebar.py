"""Whether JupyterLab will show soba's sidebar (`soba-nb doctor`): the prebuilt extension
where JupyterLab looks for one, and not disabled in any `labconfig/page_config.json`."""

from __future__ import annotations

import json
from pathlib import Path

EXTENSION = "soba-nb-labextension"


def sidebar_state() -> str:
    """One line: installed and enabled (where), disabled, or not installed (and how to get it)."""
    from jupyter_core.paths import jupyter_config_path, jupyter_path

    found = [Path(place) / EXTENSION for place in jupyter_path("labextensions") if (Path(place) / EXTENSION / "package.json").is_file()]
    if not found:
        return "not installed: pip install -e . builds it when node >= 20.19 and npm are on the PATH"
    disabled = [place for place in jupyter_config_path() if EXTENSION in _disabled(Path(place) / "labconfig" / "page_config.json")]
    if disabled:
        return f"installed but disabled in {disabled[0]}/labconfig/page_config.json (jupyter labextension enable {EXTENSION})"
    return f"installed and enabled ({found[0]})"


def _disabled(page_config: Path) -> set[str]:
    try:
        data = json.loads(page_config.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return set()
    listed = data.get("disabledExtensions") if isinstance(data, dict) else None
    if isinstance(listed, dict):
        return {name for name, off in listed.items() if off}
    return {name for name in listed if isinstance(name, str)} if isinstance(listed, list) else set()
