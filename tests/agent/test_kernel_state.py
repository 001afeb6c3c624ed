"""Kernel state: one line per user variable, type and shape, never values or reprs."""

from __future__ import annotations

import json
import math
import os

import pytest

from soba_nb.agent.kernel_state import (
    MAX_LINE_CHARS,
    MISSING_PREFIX,
    describe_namespace,
    describe_value,
    kernel_state,
)
from soba_nb.agent.provenance import trace
from soba_nb.transcript.entries import ToolCallEntry, ToolResultEntry


class LinearRegression:
    """A user object whose repr must never be called."""

    def __repr__(self) -> str:
        raise AssertionError("repr of a user object was called")

    __str__ = __repr__


class DataFrame:
    """Duck-typed like pandas: a 2-D shape and no dtype."""

    shape = (120000, 14)

    def __repr__(self) -> str:
        raise AssertionError("repr of a user object was called")


class Series:
    shape = (120,)
    dtype = "int64"


def test_builtins_show_type_and_size_never_values() -> None:
    ns = {
        "items": [1, 2, 3, 4, 5],
        "cfg": {"a": 1, "b": 2, "c": 3},
        "name": "secret-token",
        "n": 42,
    }
    assert describe_namespace(ns) == ["items: list[5]", "cfg: dict[3]", "name: str[12]", "n: int"]


def test_duck_typed_frames_arrays_and_user_objects() -> None:
    ns = {"df": DataFrame(), "s": Series(), "model": LinearRegression()}
    assert describe_namespace(ns) == [
        "df: DataFrame 120000×14",
        "s: Series int64 (120,)",
        "model: LinearRegression",
    ]


def test_skips_private_names_modules_functions_classes_and_ipython_names() -> None:
    ns = {
        "_": 1,
        "_hidden": 2,
        "__builtins__": {},
        "os": os,
        "sqrt": math.sqrt,
        "helper": lambda: None,
        "Model": LinearRegression,
        "In": [""],
        "Out": {},
        "exit": object(),
        "quit": object(),
        "get_ipython": lambda: None,
        "kept": 1.5,
    }
    assert describe_namespace(ns) == ["kept: float"]


def test_names_select_and_order_and_missing_names_are_skipped() -> None:
    ns = {"a": 1, "b": [1], "c": {}}
    assert describe_namespace(ns, names=["c", "missing", "a", "c"]) == ["c: dict[0]", "a: int"]


def test_limit_adds_a_count_of_the_rest() -> None:
    ns = {f"v{index}": index for index in range(25)}
    lines = describe_namespace(ns, limit=3)
    assert lines == ["v0: int", "v1: int", "v2: int", "… and 22 more"]
    assert len(describe_namespace(ns)) == 21


def test_objects_with_odd_attributes_do_not_break_it() -> None:
    class Exploding:
        @property
        def shape(self) -> tuple[int, ...]:
            raise RuntimeError("lazy frame not loaded")

    class NotAShape:
        shape = "3x4"
        dtype = object()

    assert describe_value(Exploding()) == "Exploding"
    assert describe_value(NotAShape()) == "NotAShape"


def test_numpy_arrays_and_scalars() -> None:
    numpy = pytest.importorskip("numpy")
    ns = {
        "arr": numpy.zeros((3, 4)),
        "counts": numpy.arange(6, dtype="int32").reshape(2, 3),
        "x": numpy.float64(2.0),
    }
    assert describe_namespace(ns) == [
        "arr: ndarray float64 (3, 4)",
        "counts: ndarray int32 (2, 3)",
        "x: float64",
    ]


def test_pandas_dataframe_and_series() -> None:
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"a": range(10), "b": [0.5] * 10, "c": ["x"] * 10})
    ns = {"df": frame, "col": frame["a"]}
    assert describe_namespace(ns) == ["df: DataFrame 10×3", "col: Series int64 (10,)"]


# --- issue 38: kernel state knows data (columns), leaves plots out, names no entry ids ---------


def test_a_dataframe_line_names_its_columns_with_their_dtypes() -> None:
    pandas = pytest.importorskip("pandas")
    clean = pandas.DataFrame(
        {
            "order_id": [1, 2, 3],
            "region": ["N", "S", "N"],
            "amount": [9.5, 12.0, 3.25],
            "ordered_at": pandas.to_datetime(["2024-01-01", "2024-01-02", "2024-01-03"]),
            "order date": [1, 2, 3],
        }
    )
    region = clean["region"].dtype
    [line] = kernel_state({"clean": clean})
    assert line == (
        f"clean: DataFrame 3×5 · columns: order_id int64, region {region}, amount float64, "
        f"ordered_at {clean['ordered_at'].dtype}, `order date` int64"
    )


def test_a_wide_table_names_the_first_twenty_columns_and_counts_the_rest() -> None:
    pandas = pytest.importorskip("pandas")
    wide = pandas.DataFrame({f"c{index}": [index] for index in range(45)})
    [line] = kernel_state({"wide": wide})
    assert "c0 int64, c1 int64" in line and "c19 int64" in line and "c20 " not in line
    assert line.endswith("… +25 more")


def test_long_column_names_keep_the_line_bounded() -> None:
    pandas = pytest.importorskip("pandas")
    names = [f"measurement_of_the_quarterly_revenue_per_region_{index:02d}_" + "x" * 80 for index in range(30)]
    [line] = kernel_state({"wide": pandas.DataFrame({name: [1.0] for name in names})}, limit=20)
    assert len(line) <= MAX_LINE_CHARS
    assert "measurement_of_the_quarterly_revenue_pe… float64" in line
    more = int(line.rsplit("… +", 1)[1].split()[0])
    assert 10 < more < 30 and line.count(" float64") == 30 - more


def test_a_series_line_names_the_series_and_its_dtype() -> None:
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"amount": [1.5, 2.5], "region": ["N", "S"]})
    lines = kernel_state({"amounts": frame["amount"], "anonymous": pandas.Series([1, 2])})
    assert lines == ["amounts: Series float64 (2,) · name: amount", "anonymous: Series int64 (2,)"]


class PolarsLikeFrame:
    """Shaped like a polars DataFrame: `columns` a list of names, `dtypes` a list of types."""

    columns = ["id", "region"]
    dtypes = ["Int64", "String"]
    shape = (7, 2)

    def __repr__(self) -> str:
        raise AssertionError("repr of a user object was called")


PolarsLikeFrame.__module__ = "polars.dataframe.frame"


def test_a_polars_shaped_table_is_read_by_duck_typing() -> None:
    assert kernel_state({"pl_df": PolarsLikeFrame()}) == ["pl_df: PolarsLikeFrame 7×2 · columns: id Int64, region String"]


def test_column_names_never_call_a_user_object_s_repr() -> None:
    pandas = pytest.importorskip("pandas")

    class Key:
        def __repr__(self) -> str:
            raise AssertionError("repr of a user object was called")

        __str__ = __repr__

    frame = pandas.DataFrame([[1, 2]], columns=[Key(), ("a", 1)])
    [line] = kernel_state({"odd": frame})
    assert "columns: <Key> int64, a/1 int64" in line


def test_figures_axes_and_plot_handles_are_left_out() -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    pyplot = pytest.importorskip("matplotlib.pyplot")
    fig, ax = pyplot.subplots()
    lines = ax.plot([1, 2], [3, 4])
    grid_fig, axes = pyplot.subplots(2, 2)
    bars = ax.bar(["N", "S"], [1, 2])
    try:
        ns = {"fig": fig, "ax": ax, "lines": lines, "grid_fig": grid_fig, "axes": axes, "bars": bars,
              "cmap": matplotlib.colormaps["viridis"], "n": 3, "points": [1, 2]}
        assert kernel_state(ns) == ["n: int", "points: list[2]"]
    finally:
        pyplot.close("all")


def test_agent_built_variables_say_so_without_an_entry_id() -> None:
    code = "x = 1\ngone = 2\n"
    entries = [
        ToolCallEntry(call_id="c1", name="python", arguments=json.dumps({"code": code})),
        ToolResultEntry(call_id="c1", name="python", content="(no output)"),
    ]
    provenance = trace(entries)
    lines = kernel_state({"x": 1, "mine": 2}, provenance)
    assert lines == ["x: int · built by the agent", "mine: int", f"{MISSING_PREFIX} `gone`"]
    assert not any(entries[0].id in line for line in lines)
