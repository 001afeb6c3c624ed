"""The subjects of the synthetic sessions and the pools planted facts are drawn from.

Each key string here is chosen so that it occurs in a session only where its fact is stated
(the filler of `retention_content` never writes it): the benchmark counts a fact as kept
when its keys reach the model, so a key that also occurred by chance would flatter every
method.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Theme:
    """What one session is about: its goal, its raw tables and its report."""

    goal: str
    goal_key: str
    raw: tuple[str, str]
    """Names of the two raw tables (and of the dataframes loaded from them)."""
    raw_columns: tuple[tuple[str, ...], tuple[str, ...]]
    segment: str
    """A categorical column of the first table."""
    numeric: str
    """A numeric column of the first table."""
    missing_column: str
    """The column whose absence makes `build_features` fail until `src/features.py` is fixed."""
    report: str
    audience: str


THEMES = (
    Theme(
        goal="a churn forecast for the Q3 retention review",
        goal_key="Q3 retention review",
        raw=("subscribers", "events"),
        raw_columns=(
            ("customer_id", "plan", "region", "signup_date", "monthly_fee", "support_calls", "churned"),
            ("customer_id", "event_at", "type", "duration_s", "device"),
        ),
        segment="plan",
        numeric="monthly_fee",
        missing_column="tenure_days",
        report="reports/q3_churn.md",
        audience="the retention leads",
    ),
    Theme(
        goal="a demand forecast for the Lisbon warehouse restock plan",
        goal_key="Lisbon warehouse",
        raw=("orders", "stores"),
        raw_columns=(
            ("order_id", "store", "sku", "order_date", "quantity", "unit_price", "channel", "returned"),
            ("store", "region", "opened_at", "floor_area", "segment"),
        ),
        segment="channel",
        numeric="unit_price",
        missing_column="promo_flag",
        report="reports/restock_forecast.md",
        audience="the supply planners",
    ),
    Theme(
        goal="an anomaly report on card payments for the internal fraud audit",
        goal_key="internal fraud audit",
        raw=("payments", "cards"),
        raw_columns=(
            ("payment_id", "card_id", "amount", "created_at", "channel", "country", "flagged"),
            ("card_id", "issued_at", "segment", "credit_limit"),
        ),
        segment="country",
        numeric="amount",
        missing_column="merchant_risk",
        report="reports/fraud_findings.md",
        audience="the audit committee",
    ),
)

CONSTRAINTS = (
    ("Never write to data/raw/; treat that folder as read-only.", (("read-only", "read only"),)),
    ("Keep the final report under {n} words.", (("{n} words",),)),
    ("Use only pandas and scikit-learn, no deep learning.", (("deep learning",),)),
    ("Every random seed must be fixed to {n}.", (("seed",), ("{n}",))),
    ("The notebook has to run end to end in under {n} minutes.", (("{n} minutes",),)),
    ("Report money in euros, never in dollars.", (("euros",),)),
)
"""(sentence, key groups); `{n}` is drawn per session."""

DECISIONS = (
    (
        "I decided to fill missing {column} with the median rather than drop rows, because {n}% of rows have no {column}.",
        (("median",), ("{n}% of rows",)),
    ),
    (
        "I chose a gradient-boosted model over logistic regression because it lifts the holdout AUC from 0.71 to 0.{n}.",
        (("gradient-boosted", "gradient boosted"), ("auc",)),
    ),
    (
        "I switched to a time-based split instead of a random split, because the same ids appear in several months and a random split leaks labels.",
        (("time-based split", "time based split"), ("leak",)),
    ),
    (
        "I decided to cap {column} at the 99th percentile because a few bot accounts inflate it.",
        (("99th percentile",), ("bot accounts", "bots")),
    ),
    (
        "I am keeping weekly aggregation rather than daily, because daily counts are too sparse ({n}% zeros).",
        (("weekly",), ("sparse",)),
    ),
)

BLOCKERS = (
    (
        "Blocked: the {table} export for March is missing from the raw folder; the data team has to re-run it before March can be scored.",
        (("export for march",),),
    ),
    (
        "One more thing: finance has not confirmed the fiscal calendar yet, so treat the quarter boundaries as provisional.",
        (("fiscal calendar",),),
    ),
    (
        "Blocked on access to the CRM warehouse: ticket IT-{n} is still open with the platform team.",
        (("it-{n}",),),
    ),
)

READ_ONLY_FILES = (
    "README.md", "docs/data_dictionary.md", "src/io.py", "src/model.py", "setup.cfg",
    "Makefile", "tests/test_clean.py", "notes/kickoff_meeting.md", "docs/metrics_definitions.md",
    "src/plotting.py", "requirements.txt", "docs/sources.md",
)  # fmt: skip
"""Files the agent only reads (files it also changes count as modified, not read)."""

LATEST_REQUESTS = (
    "Now draft the summary section of {report}: the top five drivers with their importance, "
    "the holdout AUC, and one paragraph of caveats for {audience}.",
    "Please finish {report} with a findings table (driver, effect, confidence) and a short "
    "list of next steps for {audience}; keep the tone plain.",
    "Write the methods section of {report} next: data sources, the cleaning rules we agreed "
    "on, the split, and how the model was evaluated, for {audience}.",
)

FILLER_REQUESTS = (
    "Show me the distribution of {column} in {frame}.",
    "Which {segment} values have the highest mean {column}? Top 20 please.",
    "Check {frame} for duplicated ids and count the nulls per column.",
    "How does {column} correlate with {other}? A quick look is enough.",
    "Summarise {frame}.{column} by {segment}.",
    "Look at the rows of {frame} where {column} is negative or zero.",
    "Can you compare {column} between the first and last quarter?",
    "Plot {column} by month and save the figure to figures/{column}_by_month.png.",
)

USER_VARIABLE_NAMES = (
    "DATA_DIR", "CUTOFF", "palette", "params", "months", "sample_ids", "TARGET", "trial_ids",
    "test_size", "n_jobs", "notes", "query", "raw_cols", "colors", "thresholds", "region_lookup",
    "holidays", "tmp", "i", "path", "title", "fig_size", "bins", "weights",
)  # fmt: skip
"""The user's own variables from earlier cells (none of them is a planted fact)."""
