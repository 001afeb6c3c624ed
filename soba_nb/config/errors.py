"""How a configuration is refused (one line naming the key, the value and the rule) or warned
about (a deprecated key)."""

from __future__ import annotations

import warnings


class ConfigDeprecationWarning(DeprecationWarning):
    """A deprecated config key was used. Shown by default (see the filter below)."""


class ConfigError(ValueError):
    """A configuration value was refused. The message names key, value and rule."""


# DeprecationWarning is hidden outside __main__ by default; users must see this one.
warnings.filterwarnings("default", category=ConfigDeprecationWarning)
