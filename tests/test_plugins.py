"""A backend from a second, separately installed distribution is discovered like the built-ins."""

import os
import subprocess
import sys

import pytest
from conftest import install_wheel

PLUGIN_SOURCE = """
from vitbench.plugin import ModelSpec
from vitbench_plugins.vit import BACKEND

MODELS = [ModelSpec("acme-vit/16", "vit_tiny_patch16_224", BACKEND, summary="third-party test backend",
                    input_multiple=16)]
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plugin")
    files = {"acme_backend.py": PLUGIN_SOURCE}
    return install_wheel(folder, "acme-vitbench-backend", files, "[vitbench.backends]\nacme = acme_backend:MODELS\n")


def vitbench(site, *args, disable=False):
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "200"}
    env.pop("VITBENCH_DISABLE_PLUGIN_AUTOLOAD", None)
    if disable:
        env["VITBENCH_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    result = subprocess.run([sys.executable, "-m", "vitbench", *args], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_third_party_backend_is_listed_and_its_models_registered(site):
    plugins = vitbench(site, "ls", "plugins")
    assert "acme_backend:MODELS" in plugins and "acme-vitbench-backend" in plugins
    assert "vitbench_plugins.vit:MODELS" in plugins
    assert "acme-vit/16" in vitbench(site, "ls", "models")


def test_autoload_off_keeps_only_the_builtins(site):
    plugins = vitbench(site, "ls", "plugins", disable=True)
    assert "acme" not in plugins and "vitbench_plugins.vit:MODELS" in plugins
    models = vitbench(site, "ls", "models", disable=True)
    assert "acme-vit/16" not in models and "vit-b/16" in models


def test_listing_plugins_imports_none_of_them(site):
    code = (
        "import sys, vitbench.catalog.registry as r; r.plugins(); "
        "print(any(m.startswith(('acme_backend', 'vitbench_plugins.')) for m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "False"
