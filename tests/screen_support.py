"""What the user sees of soba's output, read as they read it: a display bundle as JupyterLab
renders it (its renderer order: text/html before text/markdown; Markdown through
markdown-it-py's CommonMark, raw HTML allowed as in JupyterLab; then only the text a browser
shows — no comments, no script/style), and plain output through a small terminal that obeys
carriage return and erase-line."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import markdown_it


class _VisibleText(HTMLParser):
    """The text a browser shows of an HTML fragment (comments and script/style dropped)."""

    HIDDEN = {"script", "style", "template"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.HIDDEN:
            self._hidden += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self.HIDDEN and self._hidden:
            self._hidden -= 1

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.parts.append(data)


def jupyterlab_visible(bundle: dict[str, Any]) -> str:
    """What JupyterLab shows of a display bundle, as text."""
    if "text/html" in bundle:
        markup = bundle["text/html"]
    elif "text/markdown" in bundle:
        markup = markdown_it.MarkdownIt("commonmark").render(bundle["text/markdown"])
    else:
        return str(bundle.get("text/plain", ""))
    # As a browser's tokenizer: a comment ends at the first `-->`, or runs to the end unclosed.
    markup = re.sub(r"<!--.*?(?:-->|\Z)", "", markup, flags=re.S)
    parser = _VisibleText()
    parser.feed(markup)
    parser.close()
    return "".join(parser.parts)


def terminal_screen(output: str) -> str:
    """The lines a terminal leaves on screen: `\\r` returns to the line's start (overwriting),
    `ESC[2K` erases the line, other ESC sequences draw nothing."""
    screen: list[str] = []
    for line in output.split("\n"):
        shown: list[str] = []
        column = 0
        for token in re.findall(r"\x1b\[[0-9;]*[A-Za-z]|\r|[^\x1b\r]", line):
            if token == "\r":
                column = 0
            elif token == "\x1b[2K":
                shown = [" "] * len(shown)
            elif token.startswith("\x1b"):
                continue
            else:
                if column < len(shown):
                    shown[column] = token
                else:
                    shown.append(token)
                column += 1
        screen.append("".join(shown).rstrip())
    return "\n".join(screen)
