"""The configs live in one torch-free tree (`dmtp.config`), each defined once: describing an experiment, writing it
and reading it back import no torch."""
import subprocess
import sys

import dmtp.config as C


def test_the_experiment_imports_no_torch():
    code = ("import sys, dmtp.experiment, dmtp.config, experiments.profiles; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_each_config_is_defined_once():
    from dmtp.training import drafters, pretrain

    assert drafters.TrainConfig is C.TrainConfig and pretrain.PretrainConfig is C.PretrainConfig
    assert pretrain.TargetArch is C.TargetArch
    for name in C.__all__:
        obj = getattr(C, name)
        if isinstance(obj, type):
            assert obj.__module__.startswith("dmtp.config."), name
