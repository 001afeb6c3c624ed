"""The user's answer to an approval question (SPEC §11), read with `input()`.

Every frontend answers `input()`: a kernel turns it into a stdin request that JupyterLab,
Notebook 7 and VS Code show as an input box under the cell; terminal IPython reads the
terminal. Where nothing can answer — nbconvert, a frontend that does not allow stdin
(`StdinNotImplementedError`), an input that has ended (`EOFError`) — the call is declined
and the cell says why.
"""

from __future__ import annotations

from collections.abc import Callable

from IPython.core.error import StdinNotImplementedError

from soba_nb.agent.approval import NoInput
from soba_nb.notebook.render import TurnRenderer


class InputApprover:
    """Shows the call in the turn's output and asks with `input()`."""

    def __init__(self, renderer: TurnRenderer, also_show: Callable[[str], None] | None = None):
        self.renderer = renderer
        self.also_show = also_show
        """The sidebar's conversation: it shows the question too (the answer may come from there)."""

    def ask(self, shown: str, question: str) -> str:
        if shown:
            self.renderer.show_call(shown)
        if self.also_show is not None:
            self.also_show(shown)
        try:
            return input(question)
        except StdinNotImplementedError:
            raise NoInput("this frontend does not answer input() (nbconvert, or stdin is off)") from None
        except EOFError:
            raise NoInput("the input has ended (nothing left to read an answer from)") from None
        except OSError as error:
            raise NoInput(f"input() cannot be read here ({error.strerror or error})") from None
