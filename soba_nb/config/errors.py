"""How a configuration is refused (one line naming the key, the value and the rule) or warned
about (a deprecated key)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from soba_nb.config.refusal import Refusal


class ConfigDeprecationWarning(DeprecationWarning):
    """A deprecated config key was used. Shown by default (see the filter below)."""


class ConfigError(ValueError):
    """A configuration value was refused. The message names key, value and rule."""


# DeprecationWarning is hidden outside __main__ by default; users must see this one.
warnings.filterwarnings("default", category=ConfigDeprecationWarning)


class FieldProblem(ValueError):
    """A key's own check refused its value (`model.baseUrl` that is no http URL): raised in a
    section's `__post_init__`, with the key (camelCase, relative to that section) so the
    refusal can name it and show its value."""

    def __init__(self, key: str, rule: str) -> None:
        super().__init__(rule)
        self.key = key
        self.rule = rule


class Refused(ValueError):
    """What `msgspec.convert` refused in a configuration, and where (`soba_nb.config.refusal`,
    imported only when something is refused); `refusal.line(data)` words it in one line."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.rule)
        self.refusal = refusal
