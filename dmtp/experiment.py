"""The experiment as one typed object: a `Profile` (dmtp/config: data / model / pretrain / drafter / train / eval /
verify / engine / scale sections and the `AblationSpec` it runs), written to and read back from `experiment.json`,
the settings derived from it (`drafter_config`) and the rules that need the models (`check_models`). Named profiles
are functions deriving from a base in `dmtp/profiles.py`; the Code ablation is `dmtp/config/ablation.py`'s `code()`.
Unknown keys are an error everywhere: in `derive`, in `--set` overrides and in `experiment.json`. No torch at
import: the report reads the experiment back.

    from dmtp.profiles import resolve              # (above the library: the library never imports it)
    p = resolve("tiny", ["train.steps=10", "ablation.only=ar,dflash"])   # overrides applied, checked (`check_models`)
    write_experiment("results/tiny/experiment.json", p)      # the pipeline writes the resolved experiment ...
    read_experiment("results/tiny/experiment.json").ablation  # ... the report reads its ablation spec back
"""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

from dmtp import RECORDS_REVISION
from dmtp.checks import require
from dmtp.config import Profile
from dmtp.io import read_json, write_text
from dmtp.schema import from_dict


# --- experiment.json --------------------------------------------------------------------------------------------
def write_experiment(path: str | Path, p: Profile) -> Path:
    """The resolved experiment (profile with every override applied, the verify study's runs named: `Profile.study`)
    as JSON; the report reads it back. The seeds one invocation works on (`ablation.only_seeds`: work split between
    processes) are not part of it. Beside the profile: `records_revision`, the revision of the record-making code
    (`dmtp.RECORDS_REVISION`) that ran it; the report pools a series within one revision."""
    p = replace(p, ablation=replace(p.ablation, only_seeds=()), verify=p.study)
    write_text(path, json.dumps(dict(asdict(p), records_revision=RECORDS_REVISION), indent=2) + "\n")
    return Path(path)


def read_experiment(path: str | Path) -> Profile:
    """The profile an experiment.json holds (its `records_revision` aside: `records_revision`)."""
    exp = read_json(path)
    if isinstance(exp, dict):
        exp = {k: v for k, v in exp.items() if k != "records_revision"}
    return from_dict(Profile, exp, "experiment")


def records_revision(exp: dict) -> str | None:
    """The records revision an experiment.json (as a dict) names; None where it was written before revisions were
    declared."""
    v = exp.get("records_revision") if isinstance(exp, dict) else None
    return None if v is None else str(v)


# --- the rules that read the models ----------------------------------------------------------------------------
def check_models(p: Profile) -> Profile:
    """`p` checked against the models' registries (dmtp/models, torch; a variant registered from another module
    counts once that module is imported): every variant the ablation trains exists and takes the settings
    `drafter.variants` gives it, every backbone exists, and the embedded target has the layers the drafter taps.
    Whatever runs a profile checks it here (`dmtp.profiles.resolve`); `Profile` itself checks the rules that
    need no torch, so the report reads an experiment back without it. Returns `p`."""
    from dmtp.models import drafter, variants

    a = p.ablation
    for v in a.variants + tuple(v for v, _ in a.continued.values()) + tuple(v for v, _ in a.backbones.values()):
        variants.get_variant(v)  # an unknown variant fails here, naming the known ones
    for v, settings in p.drafter.variants.items():
        variants.get_variant(v).make_config(settings)  # an unknown variant or setting fails here
    for run, (_, bb) in a.backbones.items():
        require(bb in drafter.BACKBONES, f"ablation.backbones[{run!r}]: unknown backbone {bb!r}; known: "
                f"{', '.join(drafter.BACKBONES)}")
    arch = p.model.arch
    if not p.scale.target_config:  # the embedded target: the drafter taps must exist
        taps = drafter.default_target_layer_ids(arch.num_hidden_layers, p.drafter.layers)
        require(max(taps) < arch.num_hidden_layers - 1 and min(taps) >= 0, f"drafter.layers={p.drafter.layers} "
                f"taps target layers {taps}: expected layers below the last of model.arch.num_hidden_layers="
                f"{arch.num_hidden_layers}")
    return p


# --- derived settings -------------------------------------------------------------------------------------------
def drafter_config(p: Profile, target_config, mask_token_id: int | None = None) -> dict:
    """DrafterConfig fields of this profile's drafters on a target (its HF text config: `Target.config`, or
    `read_config(path)` before loading): the shape and attention rule from `p.drafter`; widths, depth, context
    length (and RoPE base and head size where the profile says 0) from the target. `mask_token_id`: the tokenizer's <|mask|>, used when the
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
                intermediate_size=d.intermediate, block_size=d.block_size, rope_theta=theta, **d.attention_fields(),
                mask_token_id=mask, max_position_embeddings=t.max_position_embeddings, attn_backend="sdpa")
