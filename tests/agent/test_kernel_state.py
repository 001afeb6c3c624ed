"""Kernel state: one line per user variable, type and shape, never values or reprs."""

from __future__ import annotations

import math
import os

import pytest

from soba_nb.agent.kernel_state import describe_namespace, describe_value


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
