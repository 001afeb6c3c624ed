"""soba-nb: a coding agent that lives inside a Jupyter notebook and leaves receipts.

`%load_ext soba_nb` registers the magics (`%soba`, `%%soba`, `%compact`, `%budget`,
`%capsule`, `%auto_compact`, `%rewind`); the work lives in `soba_nb.notebook.magics`.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> str:
    """`__version__`, read from the installed package's metadata when first asked for (the
    metadata machinery costs every `soba-nb` command 10 ms it rarely needs)."""
    if name != "__version__":
        raise AttributeError(f"module 'soba_nb' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("soba-nb")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0"


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The Jupyter server extension (`soba_nb.server`: steer, queue, conversation), enabled by
    the install's `jupyter_server_config.d/soba_nb.json`."""
    return [{"module": "soba_nb.server"}]


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics on `ipython`; loading twice keeps the one instance."""
    from soba_nb.notebook.magics import register

    register(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove the magics and close the session (its transcript lock is released)."""
    from soba_nb.notebook.magics import unregister

    unregister(ipython)
