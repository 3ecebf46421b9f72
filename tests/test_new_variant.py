"""A tenth injection variant written as ONE new file (a temporary module; no other file of the suite edited) goes
through drafter training, decoding (lossless against `ar` at T = 0), the experiment (`--set ablation.main=...`) and
the report, where its row appears."""
import importlib
import json
import sys
from dataclasses import replace

import pandas as pd
import pytest
import torch

from dmtp.config.ablation import code
from dmtp.analysis.lossless import compare_runs
from dmtp.analysis.report import load, tables
from dmtp.engine.methods import build_method, load_method
from dmtp.engine.runner import run_generate
from dmtp.experiment import read_experiment, write_experiment
from dmtp.io import write_jsonl
from dmtp.models.variants import NAMES, REGISTRY
from dmtp.schema import override
from dmtp.training.drafters import TrainConfig, new_drafters, train_drafters
from dmtp.profiles import get_profile

NAME = "gated_t1_test"
VARIANT_FILE = '''
from dataclasses import dataclass

import torch.nn as nn

from dmtp.models.variants.base import Variant, register


@dataclass
class GateConfig:
    scale: float = 0.5  # weight of the gated MTP hidden added to E(T1)


@register
class GatedT1(Variant):
    """[A, E(T1) + scale * W sg h_MTP, M x6], W zero-initialised."""

    name = "gated_t1_test"
    description = "test only: double anchor, T1 slot = E(T1) + scale * W sg h_MTP"
    anchor, t1 = True, True
    Config = GateConfig

    def __init__(self, cfg):
        super().__init__(cfg)
        self.gate = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def reset_parameters(self):
        nn.init.zeros_(self.gate.weight)

    def t1_embed(self, e_t1, h_mtp):
        return e_t1 + self.config.scale * self.gate(h_mtp)
'''


@pytest.fixture
def new_variant(tmp_path, monkeypatch):
    (tmp_path / "gated_t1_variant.py").write_text(VARIANT_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("gated_t1_variant")  # @register: the variant is known from here on
    yield NAME
    REGISTRY.pop(NAME, None)
    sys.modules.pop("gated_t1_variant", None)


def test_a_tenth_variant_in_one_new_file(models, new_variant, tmp_path):
    tgt, mtp = models
    assert new_variant in REGISTRY and new_variant not in NAMES  # NAMES: the package's own nine

    # training, beside dflash on the same batches; its own setting travels in the checkpoint
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=64, mask_token_id=2, seed=0)
    drafters = new_drafters(tgt, ["dflash", NAME], base, variant_configs={NAME: {"scale": 0.25}})
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, tgt.vocab_size, (int(n),), generator=g).tolist() for n in (30, 24, 36, 28)]
    cfg = TrainConfig(steps=4, batch_size=2, max_len=40, anchors_per_seq=4, save_every=4, log_every=1)
    hist = train_drafters(tgt, mtp, drafters, seqs, cfg, tmp_path / "drafters", log=lambda *_: None)
    assert [h["step"] for h in hist[NAME]] == [1, 2, 3, 4] and all(h["loss"] > 0 for h in hist[NAME])
    saved = json.loads((tmp_path / "drafters" / NAME / "drafter" / "config.json").read_text())
    assert saved["dmtp_config"]["variant"] == NAME and saved["dmtp_config"]["variant_config"] == {"scale": 0.25}

    # decoding: the trained checkpoint through the one loop, token for token the target's greedy output
    m = load_method(NAME, tgt, mtp, tmp_path / "drafters")
    assert m.drafter.injection.config.scale == 0.25 and m.drafter.injection.gate.weight.abs().sum() > 0
    prompts = [{"id": str(i), "prompt_ids": torch.randint(3, tgt.vocab_size, (5 + i,), generator=g).tolist()}
               for i in range(3)]
    ar = run_generate(tgt, build_method("ar", tgt), prompts, 0.0, 24, [], batch_size=3)
    ours = run_generate(tgt, m, prompts, 0.0, 24, [], batch_size=3)
    (row,), flips = compare_runs({r["id"]: r["output_ids"] for r in ar}, {NAME: ours}, "synthetic")
    assert row["identical"] == row["n"] == 3 and not flips and sum(len(r["accepted"]) for r in ours) > 0

    # the experiment names it as a main row (a plain --set), the report shows its row
    p = override(get_profile("smoke"), [f"ablation.main={','.join(code().main + (NAME,))}"])
    res = tmp_path / "results" / "smoke"
    write_experiment(res / "experiment.json", p)
    assert read_experiment(res / "experiment.json") == replace(p, verify=p.study)  # the study's runs named
    for run, recs in (("ar", ar), ("dflash", ar), (NAME, ours)):  # dflash: any records; only rows matter here
        write_jsonl(res / "runs" / "ablation" / run / "humaneval8_T0.jsonl", recs)
    tables.ablation(load("smoke", tmp_path / "results", n_boot=20))
    ab = pd.read_csv(res / "tables" / "ablation_code.csv").set_index("method")
    assert ab.loc[NAME, "table"] == "main" and ab.loc[NAME, "n_requests"] == 3
    assert list(ab.index) == ["ar", "dflash", NAME]  # the spec's order: baselines, then main rows
