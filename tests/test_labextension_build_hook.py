"""The sidebar is built during the install (labextension/build_hook.py, hatch-jupyter-builder's
build function): skipped with one clear line where node is missing or too old, not rebuilt
when up to date, and never failing the install (issue 26 item 1)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parent.parent / "labextension" / "build_hook.py"


@pytest.fixture
def hook(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("build_hook", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUTPUT", tmp_path / "built")  # never the real build
    return module


def test_without_node_the_install_goes_on_and_says_so(hook, monkeypatch, capsys):
    monkeypatch.setattr(hook.shutil, "which", lambda name: None)
    hook.build("wheel", "standard")
    err = capsys.readouterr().err.strip()
    assert err.startswith("soba-nb: the JupyterLab sidebar was not built (node and npm are not on the PATH)")
    assert "\n" not in err and "bash labextension/build.sh" in err


def test_an_old_node_is_named(hook, monkeypatch, capsys, tmp_path):
    fake = tmp_path / "node"
    fake.write_text("#!/bin/sh\necho v18.19.0\n")
    fake.chmod(0o755)
    monkeypatch.setattr(hook.shutil, "which", lambda name: str(fake))
    hook.build("wheel", "editable")
    assert "node v18.19.0 is older than 20.19" in capsys.readouterr().err


def test_an_up_to_date_build_is_not_run_again(hook, monkeypatch, tmp_path):
    built = tmp_path / "built"
    built.mkdir()
    (built / "package.json").write_text("{}")
    newest = max(p.stat().st_mtime for p in HOOK.parent.rglob("*") if p.is_file() and "node_modules" not in p.parts)
    import os

    os.utime(built / "package.json", (newest + 10, newest + 10))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("rebuilt an up-to-date sidebar"))
    hook.build("wheel", "standard")


def test_doctor_says_whether_the_sidebar_is_installed_and_enabled(tmp_path, monkeypatch, capsys):
    from soba_nb.cli import main

    data, config = tmp_path / "data", tmp_path / "config"
    monkeypatch.setenv("JUPYTER_PATH", str(data))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(config))
    monkeypatch.setenv("JUPYTER_PREFER_ENV_PATH", "1")
    monkeypatch.setattr("jupyter_core.paths.ENV_JUPYTER_PATH", [])
    monkeypatch.setattr("jupyter_core.paths.SYSTEM_JUPYTER_PATH", [])
    monkeypatch.setattr("jupyter_core.paths.jupyter_data_dir", lambda: str(tmp_path / "user"))

    def sidebar_line() -> str:
        assert main(["doctor", str(tmp_path)]) == 0
        return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("sidebar"))

    assert "not installed: pip install -e . builds it" in sidebar_line()
    extension = data / "labextensions" / "soba-nb-labextension"
    extension.mkdir(parents=True)
    (extension / "package.json").write_text("{}")
    assert f"installed and enabled ({extension})" in sidebar_line()
    (config / "labconfig").mkdir(parents=True)
    (config / "labconfig" / "page_config.json").write_text('{"disabledExtensions": {"soba-nb-labextension": true}}')
    assert "installed but disabled" in sidebar_line()
