"""The files soba keeps for itself (SPEC §11), named once: the agent's file tools never write
or edit them.

A prompt injection in a file the agent reads was enough to make scripted `write_file` /
`edit_file` calls truncate the session transcript (the session no longer opened) and point
`soba.json`'s `baseUrl` at another server, which then received the API key. So these are
refused to the file tools, wherever they are and however they are reached (the tools apply
the rule to the real path of what they opened, so a link to one of them is refused too):

- a session folder `<notebook-stem>.soba/` and the project's `.soba/` (memory, skills): any
  path with a component ending in `.soba`;
- any `soba.json` (the project configuration);
- `~/.soba/` (the user configuration);
- the session that is open, wherever `%soba --session PATH` put it: its folder and the
  `files/` and `artifacts/` stores there, with everything in them, given by the session; a
  folder that holds the project itself (`--session mine.jsonl` in the project, or in a
  parent of it) guards only the session's own files in it (its transcript, the side-cars
  beside it and the flight records).

Reading them stays allowed. `python` and `shell` can do anything the user can: that is what
approval is for.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from soba_nb.layout import PROJECT_CONFIG_NAME, SESSIONS_FOLDER_SUFFIX, USER_FOLDER


def _user_folder() -> Path | None:
    try:
        return USER_FOLDER.expanduser().resolve()
    except (OSError, RuntimeError):  # no home folder, or a link loop there
        return None


def soba_file_rule(path: Path, root: Path, session_files: Collection[Path] = ()) -> str | None:
    """Which rule makes `path` (absolute, links resolved) one of soba's own files, or None.

    `root` is the project folder (resolved): only components below it are looked at, so a
    project that itself lies in a folder named like a session folder is still usable.
    `session_files` are the open session's files and folders (resolved): a path is refused
    when it is one of them or lies in one, unless that folder holds the project."""
    if any(path == own or (path.is_relative_to(own) and not root.is_relative_to(own)) for own in session_files):
        return "the open session's folder, its transcript, side-cars and files/ and artifacts/ stores"
    user = _user_folder()
    if user is not None and path.is_relative_to(user):
        return "the user configuration ~/.soba/"
    if path.name.casefold() == PROJECT_CONFIG_NAME:
        return "the project configuration soba.json"
    relative = path.relative_to(root) if path.is_relative_to(root) else path
    if any(part.casefold().endswith(SESSIONS_FOLDER_SUFFIX) for part in relative.parts):
        return "session folders *.soba/ and the project's .soba/"
    return None
