"""What a session's configuration means for its model: its limits, the counter that counts
for it and how it counts an image.

Kept apart from `soba_nb.agent.session` (which binds a provider, and so imports every HTTP
client): `soba-nb budget` and `inspect` need these and nothing that talks to a server.
"""

from __future__ import annotations

from collections.abc import Sequence

from soba_nb.agent.prompt import SHARED_PROMPT
from soba_nb.agent.tool_schemas import COMPACT_TOOL_SCHEMAS
from soba_nb.catalogue import lookup
from soba_nb.catalogue import takes_images as catalogue_takes_images
from soba_nb.compaction.limits import MAX_OUTPUT_SHARE, SummaryWindow, hard_limit
from soba_nb.compaction.model_input import fixed_tokens
from soba_nb.config import MAX_CONTEXT_WINDOW, SobaConfig
from soba_nb.config.settings import summary_safety_reserve
from soba_nb.images import ImageRule
from soba_nb.tokens import TokenCounter
from soba_nb.transcript.entries import WindowEntry
from soba_nb.transcript.store import Transcript
from soba_nb.window import (
    AUTO_KEY,
    ServerWindow,
    SessionLimits,
    learned_window,
    model_key,
    recorded_server_window,
    resolve_limits,
    usage_ceiling,
)


def session_limits(
    config: SobaConfig,
    transcript: Transcript,
    server: ServerWindow | None = None,
    counter: TokenCounter | None = None,
) -> SessionLimits:
    """The limits of a session: its config, the catalogue, the server's figure (or the one
    recorded last), what the session learned and its `%auto_compact` setting. A recorded
    window that no window can be is passed over (`recorded_windows`); `counter` counts for
    that check (the session's own by default)."""
    model = model_key(config)
    windows = recorded_windows(transcript.windows, counter or session_counter(config))
    return resolve_limits(
        config,
        catalogue=lookup(config.model.provider, config.model.name),
        server=server or recorded_server_window(windows, model),
        learned=learned_window(windows, model),
        auto_setting=transcript.setting(AUTO_KEY),
    )


def summary_window(config: SobaConfig) -> SummaryWindow | None:
    """The limits of the summary model of its own (`compaction.model`, SPEC §14), or None
    when `model` writes the summaries. Its `contextWindow` and `maxOutputTokens` when given;
    inherited from `model` otherwise, but never above what the catalogue knows of the summary
    model's own family (the inherited figures were another model's). The request is fitted to
    its window less its answer and the safety reserve (`summary_safety_reserve`)."""
    summary, given = config.summary_model, config.compaction.model
    if summary is None or given is None:
        return None
    window, output = summary.context_window, summary.max_output_tokens
    known = lookup(summary.provider, summary.name)
    if known is not None and given.context_window is None:
        window = min(window, known.context_window)
    if known is not None and given.max_output_tokens is None:
        output = min(output, known.max_output_tokens)
    if output >= window:  # (only inherited figures can come to this: given ones are checked)
        output = max(window // MAX_OUTPUT_SHARE, 1)
    safety = summary_safety_reserve(window, output, config.compaction.safety_reserve_tokens)
    return SummaryWindow(
        context_window=window, input_tokens=max(hard_limit(window, output, safety), 1), output_tokens=output
    )


def recorded_windows(windows: Sequence[WindowEntry], counter: TokenCounter) -> list[WindowEntry]:
    """The transcript's `window` entries a window can be: at most `MAX_CONTEXT_WINDOW`, and
    more than the system prompt and the compact tool schemas take — what a session checks a
    server's figure by before it records one (`AgentSession.plausible_window`). A transcript
    is data (a hand edit, a planted file): a recorded window of 5 tokens would leave no
    request room to be sent, ever, and one of 2**62 would put every limit out of reach
    (SPEC §12). Counted only when there is a figure to check."""
    kept = [entry for entry in windows if entry.context_window <= MAX_CONTEXT_WINDOW]
    if not kept:
        return kept
    floor = fixed_tokens(SHARED_PROMPT, COMPACT_TOOL_SCHEMAS, counter)  # known ahead: nothing counted
    return [entry for entry in kept if entry.context_window > floor]


def session_usage_ceiling(config: SobaConfig, transcript: Transcript, counter: TokenCounter) -> int | None:
    """Usage figures at or above this may measure a prompt the server cut (`usage_ceiling` of
    the checked `recorded_windows`); None when it never cut one."""
    return usage_ceiling(recorded_windows(transcript.windows, counter), model_key(config))


def takes_images(config: SobaConfig) -> bool:
    """The model takes images: `model.vision` when set, else the catalogue (the embedded
    model takes none)."""
    model = config.model
    if model.provider == "local":
        return False
    return (
        model.vision
        if model.vision is not None
        else catalogue_takes_images(model.provider, model.name)
    )


def image_rule(config: SobaConfig) -> ImageRule:
    """How the model counts an image: Anthropic's area rule, OpenAI's tiles (every
    OpenAI-compatible server), or none."""
    if not takes_images(config):
        return ImageRule.NONE
    return ImageRule.AREA if config.model.provider == "anthropic" else ImageRule.TILES


def session_counter(config: SobaConfig) -> TokenCounter:
    """The embedded model counts with its own tokenizer; other models by family (tokens.py),
    their images by their provider's rule, knowing what an empty conversation costs
    (`agent.fixed_counts`)."""
    if config.model.provider == "local":
        from soba_nb.resolution import embedded_model_installed

        if embedded_model_installed():
            from soba_nb.providers.local_model import count_tokens

            return TokenCounter.exact(f"{config.model.name} (GGUF vocabulary)", count_tokens)
    from soba_nb.agent.fixed_counts import prime

    return prime(TokenCounter.for_model(config.model.provider, config.model.name, images=image_rule(config)))


def counts_differently(counter: TokenCounter, config: SobaConfig) -> bool:
    """`config` counts otherwise than `counter` (an open session's) does — another encoding,
    factor or image rule: the session must be reopened for it."""
    return session_counter(config).key != counter.key
