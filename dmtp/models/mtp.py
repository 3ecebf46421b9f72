"""Native MTP head (Qwen3-Next / Qwen3.5 layout), frozen at decode time, trainable for the embedded default.

Checkpoint keys (inside the target's safetensors; HF ignores them on load):
    mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.fc.weight [H, 2H],
    mtp.layers.0.* (one decoder layer in the target's own format, full attention), mtp.norm.weight
Forward at position i (predicts x_{i+2}):
    u_i = fc([RMS_e(E(x_{i+1})) ; RMS_h(h^L_i)])         # embedding first, then hidden
    g_i = norm(DecoderLayer(u_i; causal over the MTP's own history))
    logits = LMHead(g_i)                                  # chained steps feed g back in place of h^L
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import torch.nn as nn

from dmtp.checks import gist
from dmtp.io import make_readable, save_safetensors, write_failure
from dmtp.models.cache import KVCache, causal_mask
from dmtp.models.weights import check_finite, check_fits, safetensor_files, tensor_index

MTP_PREFIX = "mtp."


def mtp_num_layers(config) -> int:
    for key in ("mtp_num_hidden_layers", "num_nextn_predict_layers"):
        v = getattr(config, key, None)
        if v:
            return int(v)
    return 0


def check_mtp_layers(path, config, names) -> str:
    """The native MTP head's layers in a checkpoint (`names`: its `mtp.*` tensor names without the prefix) against
    the count config.json declares (either key its families use): one layer, declared and present, else one line
    naming the file and the key. Returns a short note."""
    if not names:
        raise ValueError(
            f"checkpoint {path} has no `{MTP_PREFIX}*` weights: the target ships no native MTP head "
            "(methods `mtp` and every DMTP variant need one; `ar` and `dflash` do not)")
    layers = sorted({int(k.split(".")[1]) for k in names if k.startswith("layers.") and k.split(".")[1].isdigit()})
    key, declared = next(((k, v) for k in ("mtp_num_hidden_layers", "num_nextn_predict_layers")
                          if (v := getattr(config, k, None)) is not None), ("mtp_num_hidden_layers", None))
    if declared is not None and declared != len(layers) or len(layers) > 1:
        raise ValueError(f"{path}/config.json: {key}={declared!r}, its `{MTP_PREFIX}*` weights "
                         f"hold {len(layers)} layer(s) ({', '.join(f'{MTP_PREFIX}layers.{i}' for i in layers)}); "
                         "expected one MTP layer, declared and present (as Qwen3.5/3.6 ship it)")
    return f"{len(layers)} MTP layer"


def check_mtp_weights(path, config) -> str:
    """`check_mtp_layers` from the checkpoint's safetensors headers alone (nothing read or allocated)."""
    index = tensor_index(path, f"target checkpoint {path}")
    return check_mtp_layers(path, config, [k[len(MTP_PREFIX):] for k in index if k.startswith(MTP_PREFIX)])


def _init_like_target(layers: nn.Module, model) -> None:
    """Give every parameter of a freshly built decoder layer the value its model family would. Some of the family's
    modules leave their parameters to the model's `_init_weights` (transformers 5's fused MoE experts hold
    `torch.empty` memory, which may hold NaN; its router holds zeros), and a bare layer never meets it: every module
    but `nn.Linear` / `nn.Embedding` (which initialise themselves on construction, and are left as built) goes
    through it here. A dense layer's norms get the constant they were built with, so a dense head is unchanged."""
    init = getattr(model, "_init_weights", None)
    with torch.no_grad():
        for module in layers.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                continue
            if init is not None:
                init(module)
            elif not all(bool(torch.isfinite(p).all()) for p in module.parameters(recurse=False)):
                raise ValueError(f"{type(module).__name__} of the MTP layer was built with non-finite weights and "
                                 f"{type(model).__name__} has no `_init_weights` to give them values")


def _layer_config(config):
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = 1
    if hasattr(cfg, "layer_types"):
        cfg.layer_types = ["full_attention"]
    return cfg


class MTPHead(nn.Module):
    def __init__(self, target):
        super().__init__()
        cfg = target.config
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        Norm = target.norm_class()
        layer_cls = type(target.body.layers[target.layer_types.index("full_attention")])
        self.pre_fc_norm_embedding = Norm(H, eps=eps)
        self.pre_fc_norm_hidden = Norm(H, eps=eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([layer_cls(_layer_config(cfg), 0)])
        self.norm = Norm(H, eps=eps)
        self._target = [target]  # not a submodule: the target is frozen and saved separately
        _init_like_target(self.layers, target.body)  # the text model: its config is the text config
        self.to(device=target.device, dtype=target.dtype)

    @property
    def target(self):
        return self._target[0]

    def forward(self, emb_next, hidden, pos, cache: KVCache | None = None, mask=None):
        """emb_next = E(x_{i+1}), hidden = h^L_i (or the previous g when chaining); pos [B, q] absolute i. Without a
        cache or a mask the q rows attend causally among themselves (SDPA's `is_causal`, no mask materialised, where
        the target's attention allows it: `Target.mask_free`)."""
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(emb_next), self.pre_fc_norm_hidden(hidden)], dim=-1))
        if cache is not None:
            cache.write_pos = pos
            mask = causal_mask(pos, cache.capacity)
        elif mask is None and not self.target.mask_free:
            mask = causal_mask(pos, pos.shape[1])
        x = self.layers[0](
            u,
            position_embeddings=self.target.rope(u, pos),
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            use_cache=cache is not None,
        )
        x = x[0] if isinstance(x, tuple) else x
        return self.norm(x)

    def teacher_forced(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """g_i for every i < T-1 over whole sequences: ids [B, T], hidden = h^L [B, T, H] -> [B, T-1, H]."""
        B, T = ids.shape
        pos = torch.arange(T - 1, device=ids.device)[None].expand(B, T - 1)
        return self.forward(self.target.embed(ids[:, 1:]), hidden[:, :-1], pos)

    # --- checkpoint I/O ------------------------------------------------------------------------------------------
    def mtp_state_dict(self) -> dict[str, torch.Tensor]:
        return {MTP_PREFIX + k: v.detach().contiguous() for k, v in self.state_dict().items()}

    @classmethod
    def load(cls, target, path: str | Path) -> "MTPHead":
        sd = read_prefixed_tensors(path, MTP_PREFIX)
        check_mtp_layers(path, target.config, sd)
        head = cls(target)
        sd = _unfuse_experts(sd, head.state_dict())
        what = f"MTP head of {path} (its `{MTP_PREFIX}*` tensors, in the target's layer format)"
        check_fits(what, {MTP_PREFIX + k: v for k, v in head.state_dict().items()},
                   {MTP_PREFIX + k: v for k, v in sd.items()})
        check_finite(what, sd.items())
        head.load_state_dict(sd)
        return head.requires_grad_(False).eval()


def _unfuse_experts(sd, want):
    """Match MoE expert weights to the layout the MTP layer holds (transformers 5.17 `Qwen3_5MoeExperts`:
    `mlp.experts.gate_up_proj` [E, 2I, H] with the gate rows first, `mlp.experts.down_proj` [E, H, I]).

    Checkpoints store them either per expert (`mlp.experts.N.gate_proj.weight` [I, H], `.up_proj.weight` [I, H],
    `.down_proj.weight` [H, I]: the Qwen3.5/3.6-MoE and Qwen3-Next layout, which HF itself fuses on load for the main
    layers through its `qwen2_moe` conversion mapping, but never for the `mtp.*` keys it ignores) or fused, possibly
    transposed ([E, H, 2I] / [E, I, H], the Qwen3-VL-MoE convention). A layer that holds experts per expert gets
    fused checkpoints split the same way."""
    if all(k in want and sd[k].shape == want[k].shape for k in sd) and all(k in sd for k in want):
        return sd
    out = dict(sd)

    def fused(key, parts):  # parts(e) -> tensors to concatenate for expert e
        n = want[key].shape[0]
        try:
            t = torch.stack([torch.cat(parts(e), 0) for e in range(n)])
        except KeyError as err:
            raise ValueError(f"MTP expert weights incomplete: {err.args[0]} missing (layer wants {n} experts)")
        return t

    for key in list(want):
        shape = want[key].shape
        if key in out:
            if out[key].shape != shape and out[key].dim() == 3 and out[key].transpose(1, 2).shape == shape:
                out[key] = out[key].transpose(1, 2).contiguous()  # fused, stored [E, in, out]
            continue
        if key.endswith("experts.gate_up_proj"):
            base = key[: -len("gate_up_proj")]
            out[key] = fused(key, lambda e: [out.pop(f"{base}{e}.gate_proj.weight"),
                                             out.pop(f"{base}{e}.up_proj.weight")])
        elif key.endswith("experts.down_proj"):
            base = key[: -len("down_proj")]
            out[key] = fused(key, lambda e: [out.pop(f"{base}{e}.down_proj.weight")])
    # the other way round: the layer holds per-expert Linear weights, the checkpoint is fused
    for key in [k for k in out if k.endswith(("experts.gate_up_proj", "experts.down_proj")) and k not in want]:
        base, t = key.rsplit(".", 1)[0] + ".", out.pop(key)
        for e in range(t.shape[0]):
            if key.endswith("gate_up_proj"):
                g, u = t[e].chunk(2, 0)
                out[f"{base}{e}.gate_proj.weight"], out[f"{base}{e}.up_proj.weight"] = g, u
            else:
                out[f"{base}{e}.down_proj.weight"] = t[e]
    return out


def split_experts(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fused expert tensors -> the per-expert checkpoint layout (`experts.N.{gate,up,down}_proj.weight`)."""
    out = {}
    for k, t in sd.items():
        if k.endswith("experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                g, u = t[e].chunk(2, 0)
                out[f"{base}{e}.gate_proj.weight"], out[f"{base}{e}.up_proj.weight"] = g.clone(), u.clone()
        elif k.endswith("experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[k] = t
    return out


def read_prefixed_tensors(path: str | Path, prefix: str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    out = {}
    for f in safetensor_files(path):
        try:
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    if k.startswith(prefix):
                        out[k[len(prefix):]] = fh.get_tensor(k)
        except Exception as e:  # SafetensorError (truncated, empty, not safetensors), a missing shard
            raise ValueError(f"{f}: cannot be read as safetensors ({gist(e)})") from None
    return out


def save_target_with_mtp(model: nn.Module, mtp: MTPHead, path: str | Path, max_shard_size: str = "15MB",
                         experts: str = "fused"):
    """save_pretrained + the `mtp.*` keys in a shard of their own, listed in the index like real Qwen3.5 checkpoints.
    experts: "fused" (as the module holds them) or "per_expert" (the Qwen3.5/3.6-MoE checkpoint layout). Every file
    is left readable by others (0644 under umask 022), as every artifact of the suite."""
    path = Path(path)
    try:
        model.save_pretrained(path, max_shard_size=max_shard_size)
    except Exception as e:  # a full disk: safetensors' IoError named as one (`write_failure`)
        named = write_failure(path, e)
        if named is None:
            raise
        raise named from None
    index_path = path / "model.safetensors.index.json"
    if index_path.exists():
        index = json.loads(index_path.read_text())
    else:  # single file: turn it into a one-shard index
        index = {"metadata": {}, "weight_map": {}}
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), framework="pt") as fh:
            index["weight_map"] = {k: "model.safetensors" for k in fh.keys()}
    sd = {k: v.cpu() for k, v in mtp.mtp_state_dict().items()}
    if experts == "per_expert":
        sd = split_experts(sd)
    elif experts != "fused":
        raise ValueError(f"experts must be 'fused' or 'per_expert', not {experts!r}")
    save_safetensors(sd, path / "model-mtp.safetensors")
    index["weight_map"].update({k: "model-mtp.safetensors" for k in sd})
    index_path.write_text(json.dumps(index, indent=2))
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("mtp_num_hidden_layers", 1)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    make_readable(path)  # save_pretrained's shards are 0600 (safetensors' save_file): weights are read by others
