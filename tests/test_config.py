"""The configs live in one torch-free tree (`dmtp.config`), each defined once: describing an experiment, writing it
and reading it back import no torch."""
import subprocess
import sys

import pytest

import dmtp.config as C


def test_the_experiment_imports_no_torch(tmp_path):
    """Describing an experiment, writing it and reading it back (what the report does) import no torch."""
    code = ("import sys, dmtp.experiment as E, dmtp.config, dmtp.profiles as P; "
            f"E.write_experiment({str(tmp_path / 'e.json')!r}, P.get_profile('mini')); "
            f"E.read_experiment({str(tmp_path / 'e.json')!r}); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("sets, msg", [
    (["ablation.supplementary=fuse"], "unknown variant 'fuse'; known: "),
    (["ablation.backbones={\"d2\": [\"dflash\", \"dflash3\"]}"], "unknown backbone 'dflash3'"),
    (["ablation.backbones={\"d2\": [\"dflash4\", \"dflash2\"]}"], "unknown variant 'dflash4'"),
    (["drafter.variants={\"fusion\": {\"bogus\": 1}}"], "bogus"),
    (["drafter.variants={\"nope\": {}}"], "unknown variant 'nope'"),
    (["drafter.layers=2", "model.arch.num_hidden_layers=2"], "taps target layers"),
])
def test_a_command_checks_its_profile_against_the_models(sets, msg):
    """`resolve` (what every command runs) checks what needs the models' registries; the profile itself, torch-free,
    does not (the report must read back an experiment whatever variants this process knows)."""
    from dmtp.profiles import get_profile, resolve
    from dmtp.schema import override

    p = override(get_profile("smoke"), sets)  # a description: not checked against the models
    with pytest.raises((KeyError, ValueError, TypeError), match=msg):
        resolve("smoke", sets)
    assert resolve("smoke") == get_profile("smoke") and p.name == "smoke"


def test_each_config_is_defined_once():
    from dmtp.training import drafters, pretrain

    assert drafters.TrainConfig is C.TrainConfig and pretrain.PretrainConfig is C.PretrainConfig
    assert pretrain.TargetArch is C.TargetArch
    for name in C.__all__:
        obj = getattr(C, name)
        if isinstance(obj, type):
            assert obj.__module__.startswith("dmtp.config."), name


def test_the_mini_servers_and_the_variant_timed_beside_them_differ():
    """`mini`'s servers prefill the next newcomers beside the decode with one round copy in flight (beside2+flight1);
    the server variant the benchmark times beside them (admit_beside 0, in_flight 2) differs from them, so its rows
    are never a copy of the plain ones, and the summary says in words what the variant changes."""
    from dmtp.config.engine import describe_variant, server_variant
    from dmtp.profiles import get_profile

    eng = get_profile("mini").engine
    assert (eng.admit_beside, eng.in_flight) == (2, 1)
    default = "beside0+flight2"  # the servers before mini's own (bench --server-variants beside0+flight2)
    settings = server_variant(default)
    assert settings == {"admit_beside": 0, "in_flight": 2}
    assert any(getattr(eng, k) != v for k, v in settings.items())
    assert describe_variant(default) == ("newcomers prefilled once their slots are free, the decode waiting for their "
                                         "prompt pass (`engine.admit_beside` = 0), 2 round copies in flight before the "
                                         "host waits (`engine.in_flight` = 2)")
