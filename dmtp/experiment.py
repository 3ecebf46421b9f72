"""The experiment as one typed object: a `Profile` (dmtp/config: data / model / pretrain / drafter / train / eval /
verify / engine / scale sections and the `AblationSpec` it runs), written to and read back from `experiment.json`,
and the settings derived from it (`drafter_config`). Named profiles are functions deriving from a base in
`experiments/profiles.py`; the Code ablation is built by `ablations/code.py`. Unknown keys are an error everywhere:
in `derive`, in `--set` overrides and in `experiment.json`. No torch: the report reads the experiment back.

    from experiments.profiles import get_profile          # (orchestration code; the library never imports it)
    p = dmtp.schema.override(get_profile("tiny"), ["train.steps=10", "ablation.only=ar,dflash"])
    write_experiment("results/tiny/experiment.json", p)      # the pipeline writes the resolved experiment ...
    read_experiment("results/tiny/experiment.json").ablation  # ... the report reads its ablation spec back
"""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

from dmtp.config import Profile
from dmtp.io import read_json, write_text
from dmtp.schema import from_dict


# --- experiment.json --------------------------------------------------------------------------------------------
def write_experiment(path: str | Path, p: Profile) -> Path:
    """The resolved experiment (profile with every override applied, the verify study's runs named: `Profile.study`)
    as JSON; the report reads it back. The seeds one invocation works on (`ablation.only_seeds`: work split between
    processes) are not part of it."""
    p = replace(p, ablation=replace(p.ablation, only_seeds=()), verify=p.study)
    write_text(path, json.dumps(asdict(p), indent=2) + "\n")
    return Path(path)


def read_experiment(path: str | Path) -> Profile:
    return from_dict(Profile, read_json(path), "experiment")


# --- derived settings -------------------------------------------------------------------------------------------
def drafter_config(p: Profile, target_config, mask_token_id: int | None = None) -> dict:
    """DrafterConfig fields of this profile's drafters on a target (its HF text config: `Target.config`, or
    `read_config(path)` before loading): the shape from `p.drafter`; widths, depth, context length (and RoPE base
    and head size where the profile says 0) from the target. `mask_token_id`: the tokenizer's <|mask|>, used when the
    profile names none."""
    d, t = p.drafter, target_config
    mask = d.mask_token_id if d.mask_token_id >= 0 else mask_token_id
    if mask is None or mask < 0:
        raise ValueError(f"profile {p.name}: no MASK token id (drafter.mask_token_id = -1 and the tokenizer has no "
                         "<|mask|> token)")
    theta = d.rope_theta or (getattr(t, "rope_parameters", None) or {}).get("rope_theta", 1e6)
    return dict(hidden_size=t.hidden_size, vocab_size=t.vocab_size, num_target_layers=t.num_hidden_layers,
                num_hidden_layers=d.layers, num_attention_heads=d.heads, num_key_value_heads=d.kv_heads,
                head_dim=d.head_dim or getattr(t, "head_dim", None) or t.hidden_size // d.heads,
                intermediate_size=d.intermediate, block_size=d.block_size, window=d.window, rope_theta=theta,
                mask_token_id=mask, max_position_embeddings=t.max_position_embeddings, attn_backend="sdpa")
