"""The environments that rebuild the results: requirements/cpu.lock pins every package of the CPU test environment
(what `make venv` and CI install), environment.yml names the GPU one every committed GPU result records."""
import importlib.metadata as md
import json
import re
import tomllib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[1]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock() -> dict[str, str]:
    rows = [x.strip() for x in (ROOT / "requirements" / "cpu.lock").read_text().splitlines()]
    pins = dict(x.split("==", 1) for x in rows if x and not x.startswith("#"))
    return {_norm(k): v for k, v in pins.items()}


def test_the_lock_pins_every_package_the_suite_declares_and_a_cpu_torch():
    lock = _lock()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]  # the CPU environment's extras (`make venv`: dev, eval); `gdn` holds
    # CUDA kernels a GPU machine installs
    declared = project["dependencies"] + extras["dev"] + extras["eval"]
    names = {_norm(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]) for d in declared}
    assert names <= set(lock), sorted(names - set(lock))
    assert lock["torch"] == "2.13.0+cpu"  # the CPU build: CI never installs a CUDA wheel
    for line in (ROOT / "constraints.txt").read_text().splitlines():  # the pins both environments share
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            assert lock[_norm(name)] == version.strip(), line
    make = (ROOT / "Makefile").read_text()
    assert "pip install -q -r requirements/cpu.lock" in make and "make test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.skipif(torch.version.cuda is not None, reason="the lock is the CPU environment's")
def test_this_cpu_environment_is_the_locked_one():
    """The interpreter running the tests has every locked package at its locked version (`make venv`; after
    installing something new: `make lock`)."""
    wrong = {}
    for name, version in _lock().items():
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            have = None
        if have != version:
            wrong[name] = (have, version)
    assert not wrong, f"installed vs locked: {wrong}"


def test_environment_yml_is_the_environment_of_every_committed_gpu_result():
    text = (ROOT / "environment.yml").read_text()
    python = re.search(r"- python=([\d.]+)", text).group(1)
    torch_v = re.search(r"- torch==(\S+)", text).group(1)
    tf = re.search(r"- transformers==(\S+)", text).group(1)
    seen = set()
    for meta in ROOT.glob("results/**/meta.json"):
        env = json.loads(meta.read_text()).get("env", {})
        if env.get("device", "cpu") != "cpu" and "python" in env:
            seen.add((env["python"], env["torch"], env.get("transformers")))
    assert seen == {(python, torch_v, tf)}, seen
