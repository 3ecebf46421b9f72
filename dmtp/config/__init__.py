"""Every typed config of the suite, torch-free (`import dmtp.config` imports no torch): the library's modules take
these values as arguments and read no environment variable of their own.

    engine.py      EngineConfig: how the one decode loop and its compiled forwards run (engine, kernels, dtype, ...);
                   the value sets of the verify and evaluation modes
    training.py    TargetArch, PretrainConfig (the embedded target + MTP pretraining), TrainConfig (drafters)
    ablation.py    AblationSpec: which runs an ablation trains, evaluates, times and reports, and their roles
    experiment.py  Profile: the whole experiment (data, model, pretrain, drafter, train, eval, verify, engine, scale,
                   ablation), built on the above; named profiles: dmtp/profiles.py

    from dmtp.config import EngineConfig, Profile
"""
from dmtp.config.ablation import GROUPS, AblationSpec
from dmtp.config.engine import DTYPES, ENGINES, EVAL_MODES, VERIFY_MODES, EngineConfig
from dmtp.config.experiment import DataConfig, DrafterShape, EvalConfig, ModelConfig, PaperScale, Profile, VerifyConfig
from dmtp.config.training import CHUNK, COMPILE, KERNEL_CHOICES, NEGATIVES, PretrainConfig, TargetArch, TrainConfig

__all__ = ["AblationSpec", "CHUNK", "COMPILE", "DTYPES", "DataConfig", "DrafterShape", "ENGINES", "EVAL_MODES",
           "EngineConfig", "EvalConfig", "GROUPS", "KERNEL_CHOICES", "ModelConfig", "NEGATIVES", "PaperScale",
           "PretrainConfig", "Profile", "TargetArch", "TrainConfig", "VERIFY_MODES", "VerifyConfig"]
