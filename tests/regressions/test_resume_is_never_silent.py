"""After a kernel restart, the first `%soba` says which session it resumed, how many turns it
holds and when it was last used — once (issue 26 item 4)."""

from __future__ import annotations

import re

from conftest import new_shell, shut_down
from IPython.utils.capture import capture_output
from llm_server import text


def test_the_first_turn_of_a_new_kernel_names_the_resumed_session(ip, nb_dir, scripted):
    scripted.script(text("One."), text("Two."), text("Three."), text("Four."))
    with capture_output() as first:
        ip.run_line_magic("soba", "first")
    assert "resumed session" not in first.stdout  # a new session is not a resumed one
    ip.run_line_magic("soba", "second")
    session_id = ip.magics_manager.registry["SobaMagics"].agent.session_id
    shut_down(ip)

    restarted = new_shell(nb_dir)
    with capture_output() as resumed:
        restarted.run_line_magic("soba", "third")
    assert re.search(rf"resumed session {session_id} \(2 turns, last at \d\d:\d\d\); %soba --new starts a new one", resumed.stdout)
    with capture_output() as later:
        restarted.run_line_magic("soba", "fourth")
    assert "resumed session" not in later.stdout
