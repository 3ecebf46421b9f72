"""Bad input at every entry point: a non-zero exit and one clear error line naming the flag, file, line or field,
never a traceback. Most cases fail before any model is loaded; they run the command in-process, a few as real
subprocesses (the exit code and stderr a user sees)."""
import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from dmtp.cli import bench, lossless
from dmtp.cli import report as report_cli
from dmtp.cli.main import main as dmtp
from dmtp.models import tiny
from dmtp.models.drafter import Drafter, DrafterConfig


def _edit(src, dst, config=None, tensors=None, files=None):
    """A copy of checkpoint `src` at `dst` with its config.json changed (`config`: config dict -> None), tensors
    changed (`tensors`: state dict -> None) and files written (`files`: name -> bytes)."""
    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg.get("text_config", cfg))
        (dst / "config.json").write_text(json.dumps(cfg))
    if tensors:
        sd = load_file(str(dst / "model.safetensors"))
        tensors(sd)
        save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for name, raw in (files or {}).items():
        (dst / name).write_bytes(raw)


def _set(key, value):
    def f(sd):
        sd[key] = torch.full_like(sd[key], value)
    return f


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """Checkpoints and files: a tiny target (vocab 96, no tokenizer files, eos 1), broken variants of it, drafters,
    prompts, training data, a small results folder."""
    root = tmp_path_factory.mktemp("bad")
    tgt, mtp = tiny.build("qwen3_5", seed=0)
    tiny.save(tgt, mtp, root / "target")
    shutil.copytree(root / "target", root / "noeos")
    for f in ("config.json", "generation_config.json"):
        cfg = json.loads((root / "noeos" / f).read_text())
        cfg.pop("eos_token_id", None)
        (root / "noeos" / f).write_text(json.dumps(cfg))
    shutil.copytree(root / "target", root / "geneos")
    (root / "geneos" / "generation_config.json").write_text(json.dumps({"eos_token_id": "<|endoftext|>"}))
    tiny.save(tgt, mtp, root / "nomtp", with_mtp=False)
    shutil.copytree(root / "target", root / "trunc")
    b = (root / "trunc" / "model.safetensors").read_bytes()
    (root / "trunc" / "model.safetensors").write_bytes(b[: len(b) // 2])
    (root / "empty").mkdir()
    torch.manual_seed(0)
    for name, hidden in (("zir", 64), ("wide", 128)):
        Drafter(DrafterConfig(hidden_size=hidden, vocab_size=96, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16, intermediate_size=64, num_target_layers=4, variant="zero_init_residual",
                              mask_token_id=2)).save(root / name)
    shutil.copytree(root / "zir", root / "dtrunc")
    shutil.copytree(root / "zir", root / "zir_run" / "drafter")  # a `dmtp train` run folder: weights in drafter/
    (root / "dtrunc" / "model.safetensors").write_bytes(b"\x00" * 16)
    # weights and config.json that do not fit, numbers that are not finite, unreadable tokenizer files
    _edit(root / "target", root / "t_hidden", config=lambda c: c.update(hidden_size=96))
    _edit(root / "target", root / "t_layers", config=lambda c: c.update(num_hidden_layers=2,
                                                                        layer_types=c["layer_types"][:2]))
    _edit(root / "target", root / "t_nan", tensors=_set("model.layers.1.mlp.up_proj.weight", float("nan")))
    _edit(root / "target", root / "t_overflow", tensors=_set("model.norm.weight", 3e38))  # finite, logits are not
    _edit(root / "target", root / "t_tokjson", files={"tokenizer.json": b'{"version": "1.0", "trunc'})
    _edit(root / "target", root / "t_rope", config=lambda c: c.update(rope_scaling={"type": "linear", "factor": 0.0}))
    _edit(root / "target", root / "t_yarn", config=lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                                                    "beta_fast": float("nan")}))
    _edit(root / "zir", root / "d_rope", config=lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 0}))
    _edit(root / "zir", root / "d_noinj", tensors=lambda sd: [sd.pop(k) for k in list(sd) if k.startswith("injection")])
    _edit(root / "zir", root / "d_shape", tensors=lambda sd: sd.update(
        {"fc.weight": sd["fc.weight"][:, :16].contiguous()}))
    _edit(root / "zir", root / "d_nan", tensors=_set("norm.weight", float("inf")))
    _edit(root / "target", root / "t_types", config=lambda c: c.update(layer_types=c["layer_types"][:3]))
    _edit(root / "target", root / "t_list", files={"config.json": b"[1, 2]"})
    _edit(root / "target", root / "t_dtype", config=lambda c: c.update(dtype="float99"))
    _edit(root / "zir", root / "d_negtap", config=lambda c: c["dmtp_config"]["dflash_config"].update(
        target_layer_ids=[-1]))  # would index the hidden states from the end
    from experiments.reproduce_standin import tokenizer

    tokenizer().save_pretrained(root / "t_bigtok")  # 258 tokens, a model of 96
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(root / "target" / f, root / "t_bigtok" / f)
    from experiments.reproduce_standin import tiny_target

    tiny_target(root / "vl", layout="vl")  # the released layout: nested text_config, mtp.* in their own shard
    for name, edit in (("vl_mtp0", lambda c: [d.update(mtp_num_hidden_layers=0) for d in (c, c["text_config"])]),
                       ("vl_mtp2", lambda c: [d.update(mtp_num_hidden_layers=2) for d in (c, c["text_config"])]),
                       ("vl_llama", lambda c: c.update(model_type="llama4_text"))):
        shutil.copytree(root / "vl", root / name)
        cfg = json.loads((root / name / "config.json").read_text())
        edit(cfg)
        (root / name / "config.json").write_text(json.dumps(cfg))
    shutil.copytree(root / "vl", root / "vl_notext")  # the released layout without its text_config
    cfg = json.loads((root / "vl_notext" / "config.json").read_text())
    (root / "vl_notext" / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "text_config"}))
    _edit(root / "vl", root / "vl_pos64", config=lambda c: c.update(max_position_embeddings=64))
    _edit(root / "vl", root / "vl_noeos", config=lambda c: c.pop("eos_token_id"),
          files={"generation_config.json": b"{}"})  # no end-of-text id anywhere (the tokenizer's removed below)
    tc = json.loads((root / "vl_noeos" / "tokenizer_config.json").read_text())
    (root / "vl_noeos" / "tokenizer_config.json").write_text(json.dumps(dict(tc, eos_token=None)))
    _edit(root / "target", root / "t_heads0", config=lambda c: c.update(num_attention_heads=0))
    _edit(root / "target", root / "t_sliding", config=lambda c: c["layer_types"].__setitem__(1, "sliding_attention"))
    _edit(root / "target", root / "t_int", tensors=lambda sd: sd.update(
        {"model.layers.1.mlp.up_proj.weight": sd["model.layers.1.mlp.up_proj.weight"].to(torch.int32)}))
    shutil.copytree(root / "vl", root / "vl_int")  # an MTP tensor stored as integers (cast on load: cut to zeros)
    sd = load_file(str(root / "vl_int" / "model-mtp.safetensors"))
    sd["mtp.fc.weight"] = sd["mtp.fc.weight"].to(torch.int32)
    save_file(sd, str(root / "vl_int" / "model-mtp.safetensors"), metadata={"format": "pt"})
    shutil.copytree(root / "vl", root / "vl_index")
    (root / "vl_index" / "model.safetensors.index.json").write_text('{"weight_map": {"a": ')
    shutil.copytree(root / "vl", root / "vl_tplraise")  # a chat template whose own text raises
    tc = json.loads((root / "vl_tplraise" / "tokenizer_config.json").read_text())
    tc["chat_template"] = "{{ raise_exception('System role not supported') }}"
    (root / "vl_tplraise" / "tokenizer_config.json").write_text(json.dumps(tc))
    (root / "vl_tplraise" / "chat_template.jinja").unlink(missing_ok=True)
    (root / "humaneval.jsonl").write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}) + "\n")
    (root / "gsm8k_train" / "main").mkdir(parents=True)  # a GSM8K snapshot holding its train split only
    (root / "gsm8k_train" / "main" / "train.jsonl").write_text(json.dumps({"question": "Q", "answer": "#### 1"}) + "\n")
    (root / "number.jsonl").write_text("5\n")  # a set file whose first row is a number
    (root / "empty_q.jsonl").write_text(json.dumps({"question": "", "answer": "#### 1"}) + "\n")
    (root / "humaneval_long.jsonl").write_text("".join(json.dumps({"task_id": f"HumanEval/{i}", "prompt": "def f():\n"
                                                                   + "    x = 1\n" * 8 * (i == 0)}) + "\n"
                                                       for i in range(4)))
    shutil.copytree(root / "vl", root / "vl_notpl")  # a tokenizer without its chat template
    tc = json.loads((root / "vl_notpl" / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (root / "vl_notpl" / "tokenizer_config.json").write_text(json.dumps(tc))
    (root / "vl_notpl" / "chat_template.jinja").unlink(missing_ok=True)
    import io
    import tarfile

    for name, state in (("list_status", b"[1]"), ("str_status", b'{"folder": "smoke", "finished": "no"}')):
        with tarfile.open(root / f"{name}.tgz", "w:gz") as t:  # a state that is no object; `finished` a string
            info = tarfile.TarInfo("smoke/pipeline.json")
            info.size = len(state)
            t.addfile(info, io.BytesIO(state))
    (root / "surrogate.jsonl").write_text('{"id": "a", "prompt_ids": [3]}\n{"id": "b", "prompt": "x = \\ud800"}\n')
    (root / "not_utf8.jsonl").write_bytes(b'{"id": "a", "prompt_ids": [3]}\n{"id": "b", "prompt": "\xff"}\n')
    (root / "data_not_utf8.jsonl").write_bytes(b'{"ids": [3, 4, 5, 6, 7]}\n\n{"ids": [3], "x": "\xfe"}\n')
    # the pipeline: a finished target whose record is corrupt; eval results made with 12 new tokens
    (root / "pw_times" / "smoke").mkdir(parents=True)  # measured stage times, one of them not a number
    (root / "pw_times" / "smoke" / "stage_times.json").write_text('{"corpus": 12.5, "target": "slow"}')
    (root / "pw_corrupt" / "smoke" / "target").mkdir(parents=True)
    (root / "pw_corrupt" / "smoke" / "target" / "DONE").write_text("ok\n")
    (root / "pw_corrupt" / "smoke" / "target" / "fingerprint.json").write_text('{"fingerprint": {"data.cor')
    from dmtp.experiment import write_experiment
    from dmtp.profiles import get_profile

    write_experiment(root / "pr_made" / "smoke" / "experiment.json", get_profile("smoke"))
    lines = {"prompts": [{"id": "a", "prompt_ids": [3, 4, 5]}, {"id": "b", "prompt_ids": [6, 7]}],
             "bad_json": ['{"id": "a", "prompt_ids": [3]}', "", '{"id": "b", "prompt_ids": [4'],
             "not_object": ['{"id": "a", "prompt_ids": [3]}', "[1, 2]"],
             "dup": [{"id": "a", "prompt_ids": [3]}, {"id": "a", "prompt_ids": [4]}],
             "some_ids": [{"id": "a", "prompt_ids": [3]}, {"prompt_ids": [4]}],
             "oov": [{"id": "a", "prompt_ids": [3, 999]}], "negative": [{"id": "a", "prompt_ids": [-1, 3]}],
             "empty_prompt": [{"id": "a", "prompt_ids": []}], "text": [{"id": "a", "prompt": "def f():"}],
             "neither": [{"id": "a", "question": "?"}], "long": [{"id": "a", "prompt_ids": [3] * 4090}],
             "data": [{"ids": list(range(3, 40))}] * 4, "data_oov": [{"ids": [3, 4, 5, 400]}],
             "data_keys": [{"tokens": [3, 4, 5, 6]}], "data_bad": ['{"ids": [3, 4, 5, 6]}', "", '{"ids": [3,']}
    for name, rows in lines.items():
        (root / f"{name}.jsonl").write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                                                    for r in rows))
    (root / "a_file").write_text("x")
    from dmtp.data.tokens import convert

    for name in ("store_nosrc", "store_edited"):  # token stores: store.json without its source; tokens.bin edited
        convert(root / "data.jsonl", root / name, vocab_size=96)
    meta = json.loads((root / "store_nosrc" / "store.json").read_text())
    (root / "store_nosrc" / "store.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "source"}))
    raw = bytearray((root / "store_edited" / "tokens.bin").read_bytes())
    raw[:2] = (7).to_bytes(2, "little")
    (root / "store_edited" / "tokens.bin").write_bytes(bytes(raw))
    dec = "".join(json.dumps({"id": str(i), "prompt_ids": [3, 4], "output_ids": [5, 6, 7], "accepted": [1]}) + "\n"
                  for i in range(4))
    (root / "killed.jsonl").write_text(dec)  # a `dmtp generate` output stopped half-way
    (root / "killed.jsonl.meta.json").write_text(json.dumps({"finished": False, "fingerprint": {}}))
    (root / "nometa.jsonl").write_text(dec)  # decoded records, no meta to say they are complete
    (root / "training" / "dflash").mkdir(parents=True)  # a drafter training under way: its save, no DONE
    shutil.copytree(root / "zir", root / "training" / "dflash" / "drafter")
    (root / "training" / "dflash" / "trainer_state.pt").write_bytes(b"")
    (root / "out_dir").mkdir()
    (root / "taken.jsonl").write_text('{"id": "a", "accepted": []}\n')  # records with no meta beside them
    (root / "other.jsonl").write_text('{"id": "a", "accepted": []}\n')
    (root / "other.jsonl.meta.json").write_text(json.dumps({"fingerprint": {"temperature": 1.0}}))
    runs = root / "results" / "bad" / "runs" / "ablation" / "dflash"
    runs.mkdir(parents=True)
    (runs / "humaneval_T0.jsonl").write_text('{"id": "a", "accepted": [1]}\n\n{"id": "b", "accepted": "x"}\n')
    rec = '{"id": "a", "accepted": [1, 0]}\n'
    for profile, files in {"twice": {"humaneval_T0.jsonl": rec + rec}, "half": {"humaneval_T0.jsonl": rec,
                                                                                 "humaneval_T0.meta.json": '{"finished"'
                                                                                 ': false}'},
                           "empty": {"humaneval_T0.jsonl": ""}, "badexp": {"humaneval_T0.jsonl": rec}}.items():
        d = root / "results" / profile / "runs" / "ablation" / "dflash"
        d.mkdir(parents=True)
        for name, text in files.items():
            (d / name).write_text(text)
    (root / "results" / "badexp" / "experiment.json").write_text('{"ablation": {"baselines": ["ar"],')
    return root


def G(w, *extra, prompts="prompts"):
    return ["generate", "--target", str(w / "target"), "--method", "ar", "--prompts", str(w / f"{prompts}.jsonl"),
            "--out", str(w / "out" / "o.jsonl"), *extra]


def TR(w, *extra, data="data"):
    return ["train", "--target", str(w / "target"), "--data", str(w / f"{data}.jsonl"), "--out", str(w / "drafters"),
            "--mask-token-id", "2", *extra]


def P(w, *extra):
    return ["pipeline", "--profile", "smoke", "--work", str(w / "pw"), "--results", str(w / "pr"), "--stage",
            "corpus", *extra]


CASES = [  # (name, argv builder, what the error line must say)
    # dmtp generate: numbers
    ("temperature nan", lambda w: G(w, "--temperature", "nan"), "argument --temperature: expected 0 (greedy) or a "
     "finite number >= 0.0001 (the sampling floor), got nan"),
    ("temperature -1", lambda w: G(w, "--temperature", "-1"), "argument --temperature: expected 0 (greedy) or"),
    ("temperature denormal", lambda w: G(w, "--temperature", "1e-320"), "expected 0 (greedy) or a finite number >= "
     "0.0001 (the sampling floor), got 1e-320"),
    ("temperature below the floor", lambda w: G(w, "--temperature", "5e-5"), "the sampling floor), got 5e-5"),
    ("temperature inf", lambda w: G(w, "--temperature", "inf"), "argument --temperature"),
    ("max-new-tokens 0", lambda w: G(w, "--max-new-tokens", "0"), "--max-new-tokens: expected an integer >= 1"),
    ("max-new-tokens -5", lambda w: G(w, "--max-new-tokens", "-5"), "argument --max-new-tokens"),
    ("batch-size -1", lambda w: G(w, "--batch-size", "-1"), "argument --batch-size: expected an integer >= 1"),
    ("n -1", lambda w: G(w, "--n", "-1"), "argument --n: expected an integer >= 1"),
    ("n text", lambda w: G(w, "--n", "two"), "argument --n: expected an integer >= 1, got 'two'"),
    ("mtp-steps 0", lambda w: G(w, "--mtp-steps", "0"), "argument --mtp-steps"),
    ("seed -3", lambda w: G(w, "--seed", "-3"), "argument --seed"),
    # dmtp generate: methods, checkpoints, devices
    ("unknown method", lambda w: G(w)[:4] + ["bogus"] + G(w)[5:], "unknown variant 'bogus'; known: "),
    ("variant without drafter", lambda w: G(w)[:4] + ["zero_init_residual"] + G(w)[5:], "needs --drafter"),
    ("ar with a drafter", lambda w: G(w, "--drafter", str(w / "zir")), "--method ar uses no drafter"),
    ("limit beyond the block", lambda w: G(w)[:4] + ["zero_init_residual-k9", "--drafter", str(w / "zir")] + G(w)[5:],
     "method 'zero_init_residual-k9': drafts must be a whole number in [2, 7]"),
    ("limit of ar", lambda w: G(w)[:4] + ["ar-k2"] + G(w)[5:],
     "method 'ar-k2': its run drafts nothing (k = 0), so it has no drafts to limit to 2"),
    ("limit 0", lambda w: G(w)[:4] + ["dflash-k0", "--drafter", str(w / "zir")] + G(w)[5:],
     "expected <run>-k<drafts>, drafts a whole number >= 1"),
    ("run name as method", lambda w: G(w)[:4] + ["dmtp_d2-k4", "--drafter", str(w / "zir")] + G(w)[5:],
     "--method dmtp_d2-k4: a run of the ablation (zero_init_residual on the dflash2 backbone), not a method: give "
     "--method zero_init_residual-k4"),
    ("drafter run folder", lambda w: G(w)[:4] + ["zero_init_residual", "--drafter", str(w / "zir_run")] + G(w)[5:],
     "zir_run: no config.json (expected a drafter checkpoint folder); "),
    ("drafter run folder named", lambda w: G(w)[:4] + ["zero_init_residual", "--drafter", str(w / "zir_run")]
     + G(w)[5:], "zir_run/drafter is one: pass that"),
    ("target missing", lambda w: ["generate", "--target", str(w / "nope")] + G(w)[3:], "no such folder"),
    ("target without config", lambda w: ["generate", "--target", str(w / "empty")] + G(w)[3:], "no config.json"),
    ("target truncated", lambda w: ["generate", "--target", str(w / "trunc")] + G(w)[3:],
     "cannot be loaded: model.safetensors: Error while deserializing header"),
    ("drafter truncated", lambda w: G(w)[:4] + ["zero_init_residual", "--drafter", str(w / "dtrunc")] + G(w)[5:],
     "model.safetensors cannot be loaded"),
    ("drafter of another width", lambda w: G(w)[:4] + ["zero_init_residual", "--drafter", str(w / "wide")] + G(w)[5:],
     "drafter hidden_size 128 != target hidden_size 64"),
    ("target of another hidden size", lambda w: ["generate", "--target", str(w / "t_hidden")] + G(w)[3:],
     "weights of another shape than config.json describes: lm_head.weight: [96, 64] in the checkpoint, [96, 96]"),
    ("target with fewer layers", lambda w: ["generate", "--target", str(w / "t_layers")] + G(w)[3:],
     "holds tensors its config.json has no place for (model.layers.2."),
    ("target NaN weights", lambda w: ["generate", "--target", str(w / "t_nan")] + G(w)[3:],
     "non-finite weights (NaN or infinity) in model.layers.1.mlp.up_proj.weight"),
    ("target non-finite logits", lambda w: ["generate", "--target", str(w / "t_overflow")] + G(w)[3:],
     "t_overflow: a forward pass of 32 positions gives non-finite logits in float32 (NaN or infinity); likely cause: "),
    ("target RoPE factor 0", lambda w: ["generate", "--target", str(w / "t_rope")] + G(w)[3:],
     "t_rope/config.json: rope factor=0.0 (rope_type linear): expected a finite number > 0"),
    ("target RoPE beta NaN", lambda w: ["generate", "--target", str(w / "t_yarn")] + G(w)[3:],
     "t_yarn/config.json: rope beta_fast=nan: expected a finite number"),
    ("drafter RoPE factor 0", lambda w: G(w)[:4] + ["zero_init_residual", "--drafter", str(w / "d_rope")] + G(w)[5:],
     "rope factor=0 (rope_type linear): expected a finite number > 0"),
    ("train on a target with RoPE factor 0", lambda w: ["train", "--target", str(w / "t_rope")] + TR(w)[3:],
     "t_rope/config.json: rope factor=0.0"),
    ("target tokenizer truncated", lambda w: ["generate", "--target", str(w / "t_tokjson")] + G(w)[3:],
     "t_tokjson/tokenizer.json:1: not valid JSON"),
    ("drafter without its injection", lambda w: G(w)[:4] + ["zero_init_residual", "--drafter", str(w / "d_noinj")]
     + G(w)[5:], "d_noinj: lacks tensors its config.json needs (injection.fuse."),
    ("drafter tensor of another shape", lambda w: G(w)[:4] + ["zero_init_residual", "--drafter", str(w / "d_shape")]
     + G(w)[5:], "fc.weight: [64, 16] in the checkpoint, [64, 64] by config.json"),
    ("drafter infinite weights", lambda w: G(w)[:4] + ["zero_init_residual", "--drafter", str(w / "d_nan")] + G(w)[5:],
     "d_nan: non-finite weights (NaN or infinity) in norm.weight"),
    ("device cuda", lambda w: G(w, "--device", "cuda"), "CUDA is not available here"),
    ("device tpu", lambda w: G(w, "--device", "tpu"), "--device 'tpu': expected cpu, cuda or cuda:N"),
    # dmtp generate: the prompt file, line by line
    ("prompts missing", lambda w: G(w, prompts="nope"), "--prompts"),
    ("malformed json", lambda w: G(w, prompts="bad_json"), "bad_json.jsonl:3: not valid JSON"),
    ("line not an object", lambda w: G(w, prompts="not_object"), "not_object.jsonl:2: expected a JSON object"),
    ("duplicate id", lambda w: G(w, prompts="dup"), "dup.jsonl:2: id 'a' already used on line 1"),
    ("missing id", lambda w: G(w, prompts="some_ids"), "some_ids.jsonl:2: no `id` while other lines have one"),
    ("token id out of range", lambda w: G(w, prompts="oov"), "oov.jsonl:1: token id 999 outside the target's "
     "vocabulary [0, 96)"),
    ("negative token id", lambda w: G(w, prompts="negative"), "negative.jsonl:1: token id -1 outside"),
    ("empty prompt", lambda w: G(w, prompts="empty_prompt"), "empty_prompt.jsonl:1: empty prompt"),
    ("text without tokenizer", lambda w: G(w, prompts="text"), "text.jsonl:1: a text prompt, but the target has no "
     "tokenizer files"),
    ("no prompt field", lambda w: G(w, prompts="neither"), "neither.jsonl:1: needs `prompt` (text) or `prompt_ids`"),
    ("prompt beyond positions", lambda w: G(w, prompts="long"), "long.jsonl:1: 4090 prompt tokens + "
     "--max-new-tokens 128 exceed the target's 4096 positions"),
    ("prompts and dataset", lambda w: G(w, "--dataset", "gsm8k"), "give exactly one of --prompts FILE and --dataset"),
    ("unknown dataset", lambda w: G(w)[:5] + ["--dataset", "bogus"] + G(w)[7:], "unknown dataset 'bogus'"),
    # dmtp generate: --out and end-of-text ids
    ("out is a folder", lambda w: G(w)[:-2] + ["--out", str(w / "out_dir")], "is a folder; expected a file path"),
    ("out under a file", lambda w: G(w)[:-2] + ["--out", str(w / "a_file" / "o.jsonl")], "cannot write there"),
    ("out of another run", lambda w: G(w)[:-2] + ["--out", str(w / "other.jsonl")],
     "made with another configuration (temperature: 1.0 -> 0.0"),
    ("out is the prompts file", lambda w: G(w)[:-2] + ["--out", str(w / "out_dir" / ".." / "prompts.jsonl")],
     "prompts.jsonl: is the --prompts file"),
    ("out without meta", lambda w: G(w)[:-2] + ["--out", str(w / "taken.jsonl")],
     "exists without a record of how it was made (in taken.jsonl.meta.json)"),
    ("prompt with a lone surrogate", lambda w: G(w, prompts="surrogate"), "surrogate.jsonl:2: `prompt`: not encodable "
     "text: a lone surrogate '\\ud800' at character 5"),
    ("prompts not UTF-8", lambda w: G(w, prompts="not_utf8"), "not_utf8.jsonl:2: not UTF-8 text (byte 0xff"),
    ("seed beyond a generator's", lambda w: G(w, "--seed", "99999999999999999999999"), "argument --seed: expected an "
     "integer in [0, 4294967295]"),
    ("eos not ids", lambda w: G(w, "--eos", "abc"), "--eos 'abc': expected comma-separated token ids, or none"),
    ("eos out of range", lambda w: G(w, "--eos", "500"), "end-of-text id 500 (--eos) outside the vocabulary"),
    ("no eos anywhere", lambda w: ["generate", "--target", str(w / "noeos")] + G(w)[3:], "no end-of-text id"),
    ("eos of generation_config not ids", lambda w: ["generate", "--target", str(w / "geneos")] + G(w)[3:],
     "generation_config.json: eos_token_id must be a token id or a list of ids, not '<|endoftext|>'"),
    # dmtp generate: evaluation mode and stop strings
    ("mode unknown", lambda w: G(w, "--mode", "greedy"), "argument --mode: invalid choice: 'greedy'"),
    ("stop with fixed", lambda w: G(w, "--mode", "fixed", "--stop", "x"), "--stop takes --mode natural"),
    ("stop without tokenizer", lambda w: G(w, "--stop", "x"), "--stop needs the target's tokenizer files"),
    # dmtp train
    ("train steps 0", lambda w: TR(w, "--steps", "0"), "argument --steps: expected an integer >= 1"),
    ("train lr nan", lambda w: TR(w, "--lr", "nan"), "argument --lr: expected a finite number > 0"),
    ("train lr -1", lambda w: TR(w, "--lr", "-1"), "argument --lr"),
    ("train gamma 0", lambda w: TR(w, "--gamma", "0"), "argument --gamma"),
    ("train max-len 2", lambda w: TR(w, "--max-len", "2"), "argument --max-len: expected an integer >= 4"),
    ("train variant twice", lambda w: TR(w, "--variants", "dflash,dflash"), "argument --variants: dflash given twice"),
    ("train unknown variant", lambda w: TR(w, "--variants", "dflash,bogus"), "unknown variant or run 'bogus'; "
     "variants: "),
    ("train sliding window 0", lambda w: TR(w, "--attention", "public", "--sliding-window", "0"),
     "argument --sliding-window: expected an integer >= 1"),
    ("train attention", lambda w: TR(w, "--attention", "sliding"), "argument --attention: invalid choice: 'sliding'"),
    ("train malformed data", lambda w: TR(w, data="data_bad"), "data_bad.jsonl:3: not valid JSON"),
    ("train token out of range", lambda w: TR(w, data="data_oov"), "data_oov.jsonl:1: token id 400 outside"),
    ("train data keys", lambda w: TR(w, data="data_keys"), "data_keys.jsonl:1: expected `ids`, or `prompt_ids`"),
    ("train mask id", lambda w: TR(w)[:-2] + ["--mask-token-id", "500"], "--mask-token-id 500: expected a token id"),
    ("train init-from", lambda w: TR(w, "--init-from", "x"), "--init-from 'x': expected RUN=PATH"),
    ("train DMTP variant, no MTP head", lambda w: ["train", "--target", str(w / "nomtp")] + TR(w, "--variants",
     "zero_init_residual", "--steps", "1")[3:], "has no `mtp.*` weights: the target ships no native MTP head"),
    ("train profile", lambda w: TR(w, "--profile", "bogus"), "unknown profile 'bogus'"),
    ("train target sharded without FSDP", lambda w: TR(w, "--fsdp", "off", "--shard-target", "on"),
     "train.shard_target='on' shards the target under FSDP2, and train.fsdp='off' runs the plain step"),
    ("train out is a file", lambda w: TR(w)[:5] + ["--out", str(w / "a_file")] + TR(w)[7:], "is a file"),
    ("train data not UTF-8", lambda w: TR(w, data="data_not_utf8"), "data_not_utf8.jsonl:3: not UTF-8 text"),
    ("train on a killed decode", lambda w: TR(w, data="killed"), "killed.jsonl: half-written (killed.jsonl.meta.json "
     "says finished: false): finish it with the command that made it (it resumes)"),
    ("train on decoded records without meta", lambda w: TR(w, data="nometa"), "nometa.jsonl: decoded records without "
     "their meta (nometa.jsonl.meta.json): whether the decode finished is unknown"),
    ("generate with a drafter still training", lambda w: G(w)[:4] + ["zero_init_residual", "--drafter",
                                                                       str(w / "training" / "dflash" / "drafter")]
     + G(w)[5:], "drafter: the checkpoint of an unfinished training"),
    ("train seed beyond a generator's", lambda w: TR(w, "--seed", str(2**32)), "argument --seed"),
    ("train init-from another width", lambda w: TR(w, "--variants", "zero_init_residual", "--init-from",
                                                   f"zero_init_residual={w / 'wide'}"),
     "a drafter for a target of {'hidden_size': 128, 'vocab_size': 96}, --target has {'hidden_size': 64,"),
    ("train paper profile, small target", lambda w: TR(w, "--profile", "qwen3.6-27b"), "--profile qwen3.6-27b is "
     "made for a target of {'hidden_size': 5120, 'vocab_size': 248320} (its config); --target"),
    # dmtp pipeline: profile fields and stages
    ("set tokens -100", lambda w: P(w, "--set", "pretrain.tokens=-100"), "--set pretrain.tokens=-100: expected an "
     "integer >= 1"),
    ("set temperature nan", lambda w: P(w, "--set", "data.temperature=nan"), "--set data.temperature=nan: expected 0 "
     "(greedy) or a finite number >= 0.0001"),
    ("set temperature denormal", lambda w: P(w, "--set", "eval.temperatures=[0, 1e-320]"), "--set "
     "eval.temperatures=[0, 1e-320]: expected a non-empty list, each item 0 (greedy) or a finite number >= 0.0001"),
    ("set max_len 2", lambda w: P(w, "--set", "train.max_len=2"), "--set train.max_len=2: expected an integer >= 4"),
    ("set tokens below a step", lambda w: P(w, "--set", "pretrain.tokens=100"), "expected at least one step's worth"),
    ("set eval gsm8k", lambda w: P(w, "--set", "eval.subsets={}", "--set", 'eval.sets={"gsm8k": 2}'),
     "the pipeline evaluates on HumanEval only"),
    ("set unknown field", lambda w: P(w, "--set", "bogus=1"), "Profile has no field 'bogus'"),
    ("set one key of a dict", lambda w: P(w, "--set", "eval.sets.humaneval=3"), "--set eval.sets.humaneval=3: "
     "eval.sets is a dict-valued field: set it whole, as a JSON object (the keys you keep included), e.g. --set "
     "'eval.sets={\"humaneval\": 3}'"),
    ("set an absurd token budget", lambda w: P(w, "--set", "pretrain.tokens=1e30"), "--set pretrain.tokens=1e30: "
     "expected an integer of at most 9,007,199,254,740,991 (2**53 - 1)"),
    ("set an absurd count in a list", lambda w: P(w, "--set", f"verify.caps=[1, {2**60}]"), "--set verify.caps=[1, "
     f"{2**60}]: expected integers of at most"),
    ("set rules across assignments", lambda w: P(w, "--set", "train.snapshots=[5]", "--set", "train.steps=2"),
     "--set train.snapshots=[5], --set train.steps=2: train.snapshots: steps [5] outside 1..steps=2"),
    ("train steps absurd", lambda w: TR(w, "--steps", str(10**30)), "argument --steps: expected an integer >= 1 and "
     "at most 9,007,199,254,740,991"),
    ("set without value", lambda w: P(w, "--set", "novalue"), "expected KEY=VALUE"),
    ("set a typo'd type", lambda w: P(w, "--set", "train.steps=ten"), "--set train.steps=ten"),
    ("unknown stage", lambda w: P(w)[:-1] + ["bogus"], "unknown stage 'bogus'"),
    ("deadline not positive", lambda w: P(w, "--deadline", "0"), "argument --deadline: expected a finite number > 0"),
    ("deadline beyond the timer", lambda w: P(w, "--deadline", "1e300"), "--deadline 1e+300: expected a positive "
     "number of seconds, at most 1e+08"),
    ("reserve eats the deadline", lambda w: P(w, "--deadline", "60", "--reserve", "100"), "--reserve 100: expected "
     "seconds >= 0 and below --deadline 60"),
    ("archive a folder", lambda w: P(w, "--archive", str(w)), ": is a folder; expected a file path"),
    ("costs not an object", lambda w: P(w, "--deadline", "60", "--costs", str(w / "target" / "config.json")),
     "expected a JSON object stage -> seconds"),
    ("corpus digest not hex", lambda w: P(w, "--set", "data.corpus_digest=xyz"), "data.corpus_digest = 'xyz': "
     "expected 16 hex digits"),
    ("land no archive", lambda w: ["land", str(w / "none.tgz")], "none.tgz: no such archive"),
    ("unknown profile", lambda w: P(w)[:2] + ["bogus"] + P(w)[3:], "unknown profile 'bogus'"),
    ("paper profile", lambda w: P(w)[:2] + ["qwen3.6-27b"] + P(w)[3:], "is paper-scale"),
    ("eval on an empty work folder", lambda w: P(w)[:-1] + ["eval"], "smoke/drafters/dflash is not there or not "
     "finished: run the drafters stage first (dmtp pipeline --profile smoke --stage drafters)"),
    ("eval of a baseline on an empty work folder", lambda w: P(w)[:-1] + ["eval", "--set", "ablation.only=ar"],
     "smoke/target is not there or not finished: run the target stage first"),
    ("tables on an empty results folder", lambda w: P(w)[:6] + [str(w / "pr_none"), "--stage", "tables"],
     "smoke/runs/ablation is not there: run the eval stage first (dmtp pipeline --profile smoke --stage eval)"),
    ("drafters on an empty work folder", lambda w: P(w)[:-1] + ["drafters"], "smoke/data/train.jsonl is not there "
     "or not finished: run the data stage first"),
    ("a stage time that is not a number, under --deadline", lambda w: P(w, "--deadline", "100")[:4]
     + [str(w / "pw_times")] + P(w, "--deadline", "100")[5:],
     "pw_times/smoke/stage_times.json: stage 'target': 'slow': expected a JSON object stage -> seconds (numbers >= 0)"),
    ("a corrupt stage record", lambda w: ["pipeline", "--profile", "smoke", "--work", str(w / "pw_corrupt"),
                                          "--results", str(w / "pr"), "--stage", "target"],
     "smoke/target/fingerprint.json:1: not valid JSON"),
    ("tables of settings no run used", lambda w: ["pipeline", "--profile", "smoke", "--work", str(w / "pw"),
                                                  "--results", str(w / "pr_made"), "--stage", "tables", "--set",
                                                  "eval.new_tokens=13"],
     "experiment.json: the runs were made with another experiment than the one requested (eval.new_tokens: 12 -> 13)"),
    # checkpoints of the other kind, of another model, or contradicting themselves
    ("target is a drafter", lambda w: ["generate", "--target", str(w / "zir")] + G(w)[3:],
     "zir: a drafter checkpoint (config.json architectures ['DMTPDraftModel']), not a target model"),
    ("drafter is a target", lambda w: G(w)[:4] + ["zero_init_residual", "--drafter", str(w / "target")] + G(w)[5:],
     "target/config.json: architectures ['Qwen3_5ForCausalLM']: not a drafter checkpoint (a target model's?)"),
    ("train init-from a target", lambda w: TR(w, "--variants", "zero_init_residual", "--init-from",
                                              f"zero_init_residual={w / 'target'}"), "not a drafter checkpoint"),
    ("drafter tap negative", lambda w: G(w)[:4] + ["zero_init_residual", "--drafter", str(w / "d_negtap")] + G(w)[5:],
     "d_negtap/config.json: target_layer_ids=[-1]: expected a list of target layer indices, integers >= 0"),
    ("tokenizer beyond the vocabulary", lambda w: ["generate", "--target", str(w / "t_bigtok")] + G(w)[3:],
     "t_bigtok: the tokenizer has 258 tokens, more than the model's vocabulary of 96 (config.json vocab_size)"),
    ("target layer types of another count", lambda w: ["generate", "--target", str(w / "t_types")] + G(w)[3:],
     "t_types/config.json cannot be read: Class validation error for validator 'validate_layer_type': ValueError: "
     "`num_hidden_layers` (4) must be equal to the number of `layer_types` (3)"),  # the library's lines, joined
    ("target config a list", lambda w: ["generate", "--target", str(w / "t_list")] + G(w)[3:],
     "t_list/config.json: expected a JSON object, got list"),
    ("target dtype unknown", lambda w: ["generate", "--target", str(w / "t_dtype")] + G(w)[3:],
     "t_dtype/config.json: dtype='float99': expected a torch dtype name"),
    ("engine setting unknown", lambda w: G(w, "--engine", "bogus=1"), "--engine bogus: EngineConfig has no field"),
    ("engine setting without value", lambda w: G(w, "--engine", "fast"), "--engine 'fast': expected KEY=VALUE, e.g. "
     "engine=auto"),
    ("train on a token store without its source", lambda w: TR(w)[:4] + [str(w / "store_nosrc")] + TR(w)[5:],
     "store_nosrc/store.json: damaged token store (fields ['source'] missing or of another type"),
    ("train on a token store edited after conversion", lambda w: TR(w)[:4] + [str(w / "store_edited")] + TR(w)[5:],
     "store_edited/tokens.bin: changed after conversion (its sha256 is not store.json's tokens_sha256): convert it "
     "again"),
    ("train batch beyond the data", lambda w: TR(w, "--batch-size", "8", "--steps", "1"), "the training data holds 4 "
     "sequence(s), fewer than one batch of train.batch_size=8"),
    # output folders that are files, options given twice, stages made empty
    ("pipeline work is a file", lambda w: P(w)[:4] + [str(w / "a_file")] + P(w)[5:], "a_file/smoke: cannot write "
     "there ("),
    ("pipeline results under a file", lambda w: P(w)[:6] + [str(w / "a_file")] + P(w)[7:],
     "a_file is a file, not a folder)"),
    ("reproduce work is a file", lambda w: ["reproduce", "--profile", "open-tiny", "--target", str(w / "target"),
                                            "--work", str(w / "a_file")], "a_file: is a file; expected a folder"),
    ("reproduce data-path twice", lambda w: ["reproduce", "--profile", "open-tiny", "--target", str(w / "target"),
                                             "--work", str(w / "rw"), "--data-path", f"gsm8k={w / 'prompts.jsonl'}",
                                             "--data-path", f"gsm8k={w / 'data.jsonl'}"],
     "--data-path gsm8k given twice ("),
    ("reproduce init-from twice", lambda w: ["reproduce", "--profile", "open-tiny", "--target", str(w / "target"),
                                             "--work", str(w / "rw"), "--init-from", f"dflash={w / 'zir'}",
                                             "--init-from", f"dflash={w / 'zir_run' / 'drafter'}"],
     "run 'dflash' given twice"),
    ("train init-from twice for one run", lambda w: TR(w, "--variants", "zero_init_residual", "--init-from",
                                                     f"zero_init_residual={w / 'zir'}", "--init-from",
                                                     f"zero_init_residual={w / 'zir_run' / 'drafter'}"),
     "--init-from: run 'zero_init_residual' given twice ("),
    ("train init-from twice in one list", lambda w: TR(w, "--variants", "zero_init_residual", "--init-from",
                                                      f"zero_init_residual={w / 'zir'},zero_init_residual="
                                                      f"{w / 'zir_run' / 'drafter'}"),
     "--init-from: run 'zero_init_residual' given twice ("),
    ("set one key twice", lambda w: P(w, "--set", "eval.new_tokens=10", "--set", "eval.new_tokens=20"),
     "--set eval.new_tokens given twice (eval.new_tokens=10, eval.new_tokens=20): which value to use is ambiguous"),
    ("engine setting twice", lambda w: G(w, "--engine", "engine=hf", "--engine", "engine=compiled"),
     "--engine engine given twice (engine=hf, engine=compiled)"),
    ("reproduce epochs 0", lambda w: ["reproduce", "--profile", "open-tiny", "--target", str(w / "target"), "--work",
                                      str(w / "rw"), "--set", "scale.epochs=0"],
     "--set scale.epochs=0: expected an integer >= 1"),
    ("set eval sets empty", lambda w: P(w, "--set", "eval.subsets={}", "--set", "eval.sets={}"),
     "eval.sets={}: expected at least one dataset"),
    ("land a status that is no object", lambda w: ["land", str(w / "list_status.tgz"), "--results", str(w / "lr")],
     "list_status.tgz: smoke/pipeline.json: expected a JSON object, got list"),
    ("land a status finished 'no'", lambda w: ["land", str(w / "str_status.tgz"), "--results", str(w / "lr")],
     "str_status.tgz: smoke/pipeline.json: finished='no', missing=[]: expected true or false"),
    ("land into a file", lambda w: ["land", str(w / "str_status.tgz"), "--results", str(w / "a_file")],
     "a_file: is a file; expected a folder"),
    # released-layout checkpoints (nested text_config, mtp.* in their own shard) contradicting themselves
    ("MTP layers declared 0, one held", lambda w: ["generate", "--target", str(w / "vl_mtp0"), "--method", "mtp"]
     + G(w)[5:], "vl_mtp0/config.json: mtp_num_hidden_layers=0, its `mtp.*` weights hold 1 layer(s) (mtp.layers.0); "
     "expected one MTP layer, declared and present"),
    ("MTP layers declared 2, one held", lambda w: ["generate", "--target", str(w / "vl_mtp2"), "--method", "mtp"]
     + G(w)[5:], "vl_mtp2/config.json: mtp_num_hidden_layers=2, its `mtp.*` weights hold 1 layer(s)"),
    ("released layout under another model_type", lambda w: ["generate", "--target", str(w / "vl_llama")] + G(w)[3:],
     "vl_llama/config.json: model_type 'llama4_text' gives no text config with integer vocab_size, hidden_size and "
     "num_hidden_layers"),
    ("MTP weights stored as integers", lambda w: ["generate", "--target", str(w / "vl_int"), "--method", "mtp"]
     + G(w)[5:], "vl_int (its `mtp.*` tensors, in the target's layer format): weights of a non-floating dtype where "
     "the model holds floating-point ones: mtp.fc.weight (int32)"),
    ("MTP shard index truncated", lambda w: ["generate", "--target", str(w / "vl_index"), "--method", "mtp"]
     + G(w)[5:], "vl_index/model.safetensors.index.json:1: not valid JSON"),
    ("chat template that raises", lambda w: ["generate", "--target", str(w / "vl_tplraise"), "--method", "ar",
                                             "--dataset", "humaneval", "--data-path", str(w / "humaneval.jsonl"),
                                             "--out", str(w / "out" / "o.jsonl")],
     "vl_tplraise: its chat template cannot render a user turn (TemplateError: System role not supported)"),
    ("reproduce on a tokenizer without a chat template", lambda w: [
        "reproduce", "--profile", "open-tiny", "--target", str(w / "vl_notpl"), "--work", str(w / "rw_notpl"),
        "--stage", "regen", "--prompts", str(w / "prompts.jsonl")], "vl_notpl: its tokenizer has no chat template"),
    # a target's config.json against its weights, before any model is built or any stage runs (dmtp.preflight)
    ("released layout without text_config", lambda w: ["generate", "--target", str(w / "vl_notext")] + G(w)[3:],
     "vl_notext/config.json: model_type 'qwen3_5' keeps the text model's settings in `text_config`, which is "
     "missing: expected an object with the text model's vocab_size, hidden_size, num_hidden_layers"),
    ("train on a released layout without text_config", lambda w: ["train", "--target", str(w / "vl_notext")]
     + TR(w)[3:], "vl_notext/config.json: model_type 'qwen3_5' keeps the text model's settings in `text_config`"),
    ("reproduce on a released layout without text_config", lambda w: [
        "reproduce", "--profile", "open-tiny", "--target", str(w / "vl_notext"), "--work", str(w / "rw_notext"),
        "--stage", "regen", "--prompts", str(w / "prompts.jsonl")], "keeps the text model's settings in `text_config`"),
    ("dryrun on a released layout without text_config", lambda w: ["dryrun", "--profile", "qwen3.6-27b", "--target",
                                                                   str(w / "vl_notext")],
     "vl_notext/config.json: model_type 'qwen3_5' keeps the text model's settings in `text_config`"),
    ("target with no attention heads", lambda w: ["generate", "--target", str(w / "t_heads0")] + G(w)[3:],
     "t_heads0/config.json: num_attention_heads=0: expected an integer >= 1"),
    ("dryrun target with no attention heads", lambda w: ["dryrun", "--profile", "qwen3.6-27b", "--target",
                                                         str(w / "t_heads0")],
     "t_heads0/config.json: num_attention_heads=0: expected an integer >= 1"),
    ("dryrun on a checkpoint whose MTP layers disagree", lambda w: ["dryrun", "--profile", "qwen3.6-27b", "--target",
                                                                   str(w / "vl_mtp2")],
     "vl_mtp2/config.json: mtp_num_hidden_layers=2, its `mtp.*` weights hold 1 layer(s)"),
    ("dryrun on target weights stored as integers", lambda w: ["dryrun", "--profile", "qwen3.6-27b", "--target",
                                                               str(w / "t_int")],
     "model.layers.1.mlp.up_proj.weight (I32)"),
    ("target with a layer type the suite does not run", lambda w: ["generate", "--target", str(w / "t_sliding")]
     + G(w)[3:], "t_sliding/config.json: layer_types holds ['sliding_attention']: expected full_attention or "
     "linear_attention layers"),
    ("target weights stored as integers", lambda w: ["generate", "--target", str(w / "t_int")] + G(w)[3:],
     "t_int: weights of a non-floating dtype where the model holds floating-point ones: "
     "model.layers.1.mlp.up_proj.weight (I32)"),
    ("train on target weights stored as integers", lambda w: ["train", "--target", str(w / "t_int")] + TR(w)[3:],
     "model.layers.1.mlp.up_proj.weight (I32)"),
    ("reproduce: MTP layers disagreeing, refused before the regeneration", lambda w: [
        "reproduce", "--profile", "open-tiny", "--target", str(w / "vl_mtp2"), "--work", str(w / "rw_mtp2"),
        "--prompts", str(w / "prompts.jsonl")], "vl_mtp2/config.json: mtp_num_hidden_layers=2, its `mtp.*` weights "
     "hold 1 layer(s)"),
    ("reproduce: regeneration beyond the target's positions", lambda w: [
        "reproduce", "--profile", "open-tiny", "--target", str(w / "vl_pos64"), "--work", str(w / "rw_pos64"),
        "--stage", "regen", "--prompts", str(w / "prompts.jsonl")],
     "data.prompt_tokens=256 + data.new_tokens=12 exceed the target's 64 positions (max_position_embeddings)"),
    ("reproduce: evaluation beyond the target's positions", lambda w: [
        "reproduce", "--profile", "open-tiny", "--target", str(w / "vl_pos64"), "--work", str(w / "rw_pos64"),
        "--stage", "eval", "--data-path", f"humaneval={w / 'humaneval_long.jsonl'}"],
     "evaluation set humaneval: prompt 'HumanEval/0' takes"),
    ("reproduce without an end-of-text id", lambda w: [
        "reproduce", "--profile", "open-tiny", "--target", str(w / "vl_noeos"), "--work", str(w / "rw_noeos"),
        "--stage", "regen", "--prompts", str(w / "prompts.jsonl")],
     "set no eos_token_id and the folder's tokenizer names none; set eos_token_id in its config.json or "
     "generation_config.json"),
    # published sets: the split by its file names, rows that are objects, the user's own text non-empty
    ("set folder without the test split", lambda w: ["generate", "--target", str(w / "vl"), "--method", "ar",
                                                     "--dataset", "gsm8k", "--data-path", str(w / "gsm8k_train"),
                                                     "--out", str(w / "out" / "o.jsonl")],
     "gsm8k_train: no file of the 'test' split (expected test.jsonl, test.parquet, test-00000-of-00001.parquet or a "
     "test/ folder); its files are of the ['train'] split(s)"),
    ("set file whose first row is a number", lambda w: ["generate", "--target", str(w / "vl"), "--method", "ar",
                                                        "--dataset", "humaneval", "--data-path",
                                                        str(w / "number.jsonl"), "--out", str(w / "out" / "o.jsonl")],
     "number.jsonl:1: expected a JSON object (a row of the set), got int"),
    ("set question left empty", lambda w: ["generate", "--target", str(w / "vl"), "--method", "ar", "--dataset",
                                           "gsm8k", "--data-path", str(w / "empty_q.jsonl"), "--out",
                                           str(w / "out" / "o.jsonl")],
     "row 1: `question` = '': expected non-empty text"),
    # dmtp dryrun
    ("dryrun target of another width", lambda w: ["dryrun", "--profile", "qwen3.6-27b", "--target", str(w / "target")],
     "--profile qwen3.6-27b is made for a target of {'hidden_size': 5120, 'vocab_size': 248320} (its config); "
     "--target"),
    ("dryrun target missing", lambda w: ["dryrun", "--profile", "qwen3.6-27b", "--target", str(w / "nope")],
     "nope: no config.json there (expected the target checkpoint's folder)"),
]


def _fails(argv, capsys, fn=dmtp):
    with pytest.raises(SystemExit) as e:
        fn(argv)
    err = capsys.readouterr().err
    assert e.value.code not in (0, None), err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("name,argv,msg", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line(w, capsys, name, argv, msg):
    if name == "device cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    line = _fails(argv(w), capsys)
    assert "error:" in line and msg in line, line
    assert not (w / "out" / "o.jsonl").exists()  # nothing was decoded
    assert not list(w.glob("rw*")), list(w.glob("rw*"))  # `dmtp reproduce`: no work folder made
    if argv(w)[0] == "reproduce":  # a remedy it offers is one it has
        assert "--eos" not in line, line


def report_tables(profile):
    """argv of `python -m dmtp.cli.report tables` on results/<profile> of the fixture's folder."""
    return lambda w: ["tables", "--profile", profile, "--results", str(w / "results")]


OTHER = [  # the other entry points: (name, main, argv, message)
    ("report unknown profile", report_cli.main, report_tables("typo"), "holds no artifacts"),
    ("report malformed record", report_cli.main, report_tables("bad"), "humaneval_T0.jsonl:3: expected "
     "a record with `id` and `accepted`"),
    ("lossless n 0", lossless.main, lambda w: ["--target", str(w / "target"), "--out", str(w / "l"), "--n", "0"],
     "argument --n"),
    ("lossless drafter method", lossless.main, lambda w: ["--target", str(w / "target"), "--out", str(w / "l"),
                                                           "--methods", "ar,dflash"], "needs --drafters DIR"),
    ("lossless no tokenizer", lossless.main, lambda w: ["--target", str(w / "target"), "--out", str(w / "l")],
     "no tokenizer files"),
    ("bench caps 0", bench.main, lambda w: ["--out", str(w / "b"), "--caps", "1,0"], "argument --caps"),
    ("bench temperatures nan", bench.main, lambda w: ["--out", str(w / "b"), "--temperatures", "0,nan"],
     "argument --temperatures"),
    ("bench parts", bench.main, lambda w: ["--out", str(w / "b"), "--parts", "speed"], "argument --parts"),
    ("bench no tokenizer", bench.main, lambda w: ["--out", str(w / "b"), "--target", str(w / "target"), "--methods",
                                                   "ar"], "no tokenizer files"),
    ("bench a drafter still training", bench.main, lambda w: ["--out", str(w / "b"), "--target", str(w / "target"),
                                                             "--drafters", str(w / "training"), "--methods", "dflash"],
     "training/dflash/drafter: the checkpoint of an unfinished training"),
    ("bench temperature denormal", bench.main, lambda w: ["--out", str(w / "b"), "--temperatures", "0,1e-320"],
     "argument --temperatures"),
    ("report duplicated record", report_cli.main, report_tables("twice"),
     "humaneval_T0.jsonl:2: request 'a' of this run is already on "),
    ("report half-written run", report_cli.main, report_tables("half"),
     "humaneval_T0.jsonl: half-written (humaneval_T0.meta.json says finished: false)"),
    ("report empty run file", report_cli.main, report_tables("empty"),
     "humaneval_T0.jsonl: holds no records (an empty run file)"),
    ("report experiment.json truncated", report_cli.main, report_tables("badexp"),
     "badexp/experiment.json:1: not valid JSON"),
]


@pytest.mark.parametrize("name,fn,argv,msg", OTHER, ids=[c[0] for c in OTHER])
def test_other_entry_points(w, capsys, name, fn, argv, msg):
    line = _fails(argv(w), capsys, fn)
    assert "error:" in line and msg in line, line


@pytest.mark.parametrize("argv,msg", [
    (["-m", "dmtp.cli.main", "generate", "--target", "T", "--method", "ar", "--prompts", "p", "--out", "o",
      "--temperature", "nan"], "argument --temperature"),
    (["-m", "dmtp.cli.main", "pipeline", "--profile", "smoke", "--set", "pretrain.tokens=-100"],
     "--set pretrain.tokens=-100"),
    (["-m", "dmtp.cli.report", "report", "--profile", "nothing-here", "--results", "/nonexistent"],
     "holds no artifacts"),
])
def test_subprocess_exit_code_and_stderr(argv, msg):
    p = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr and msg in p.stderr.strip().splitlines()[-1], p.stderr


def test_total_cases():
    assert len(CASES) + len(OTHER) >= 40


@pytest.mark.parametrize("prompts", [[[5, 7], [3, 96]], [[-1, 4]], [[2, 10_000_000]]])
def test_prompt_ids_outside_the_vocabulary_are_named(models, prompts):
    """A prompt id outside the target's vocabulary fails before any forward (on a GPU it would surface as a
    device-side assert in the embedding, far from its cause), through `generate` and `serve` alike."""
    from dmtp.engine.decode import generate
    from dmtp.engine.methods import build_method
    from dmtp.engine.server import serve

    tgt, _ = models
    bad = [[t if t < 96 else tgt.vocab_size + t - 96 for t in p] for p in prompts]  # 96: one past the tiny vocabulary
    with pytest.raises(ValueError, match=f"outside the target's vocabulary of {tgt.vocab_size}"):
        generate(tgt, build_method("ar", tgt), bad, 0.0, 4)
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        serve(tgt, build_method("ar", tgt), [[4, 5]] + bad, 2, 0.0, 4)


def test_a_failed_checkpoint_write_names_the_file(models, tmp_path, monkeypatch):
    """Disk full while a drafter is saved: one error naming the file, and nothing half-written left at its path."""
    import safetensors
    import safetensors.torch
    from conftest import make_drafter

    def full(*a, **k):
        raise safetensors.SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                          'message: "No space left on device" })')

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(OSError, match=r"model.safetensors: cannot be written \(.*No space left on device"):
        make_drafter(models[0], "dflash", layers=1).save(tmp_path / "d")
    assert not (tmp_path / "d").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_gpu_timing_refused_without_cuda(tmp_path, capsys):
    line = _fails(["--paper-shape", "--out", str(tmp_path / "b")], capsys, bench.main)
    assert "--paper-shape times the engine on a GPU, and torch" in line and "sees no CUDA device here" in line
    assert not list((tmp_path / "b").glob("*.csv"))


def test_notebooks_on_missing_artifacts(tmp_path):
    """The notebooks' loader on a profile with no artifacts: a message naming the folder, not a KeyError later."""
    from dmtp.analysis.report import load

    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'typo'} holds no artifacts"):
        load("typo", tmp_path)


def test_a_target_config_is_checked_against_its_weights_before_any_model_is_built(w, monkeypatch, tmp_path):
    """`Target.load` compares config.json, built on the meta device, with the safetensors headers before transformers
    builds anything: a released layout without text_config (whose default text model has billions of parameters),
    weights of another shape, layers config.json has no place for, integer weights, and a MoE layer whose experts,
    stored one by one, do not add up to the config's, are refused without a model allocated; the per-expert layout
    itself passes."""
    import transformers

    from dmtp.models.target import Target, check_weights

    tgt, mtp = tiny.build("qwen3_5_moe", seed=0)
    tiny.save(tgt, mtp, tmp_path / "moe")
    assert "model.layers.0.mlp.experts.7.down_proj.weight" in json.loads(
        (tmp_path / "moe" / "model.safetensors.index.json").read_text())["weight_map"]  # stored one by one
    assert "72 tensors as config.json describes" in check_weights(tmp_path / "moe")
    _edit(tmp_path / "moe", tmp_path / "moe_cut", tensors=lambda sd: [sd.pop(k) for k in list(sd)
                                                                      if k.startswith("model.layers.0.mlp.experts.7")])

    def never(*a, **k):
        raise AssertionError("a model was built")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    for folder, msg in [(w / "vl_notext", "keeps the text model's settings in `text_config`, which is missing"),
                        (w / "t_hidden", "lm_head.weight: [96, 64] in the checkpoint, [96, 96] by config.json"),
                        (w / "t_layers", "holds tensors its config.json has no place for (model.layers.2."),
                        (w / "t_int", "model.layers.1.mlp.up_proj.weight (I32)"),
                        (tmp_path / "moe_cut", "lacks tensors its config.json needs (model.layers.0.mlp.experts.")]:
        with pytest.raises(ValueError, match=re.escape(msg)):
            Target.load(folder)


def test_reproduce_training_prompts_are_checked_row_by_row(w, capsys, tmp_path):
    """`dmtp reproduce`'s training prompts are checked as the decode path's: a lone surrogate, a content part that is
    not text, a prompt left empty and a row that is not an object stop the regeneration stage in one line naming the
    file and row, before anything is decoded; content parts and a conversation kept as a JSON string are read as
    their text (the same token ids as the plain prompt)."""
    from dmtp.cli.reproduce import read_prompt_file
    from dmtp.data.tokenizer import find_tokenizer

    def prompts(name, *rows):
        (tmp_path / name).write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
        return tmp_path / name

    tok = find_tokenizer(w / "vl")
    same = prompts("same.jsonl", {"prompt": "Explain tides."},
                   {"messages": [{"role": "user", "content": [{"type": "text", "text": "Explain "},
                                                              {"type": "text", "text": "tides."}]}]},
                   {"conversations": json.dumps([{"from": "human", "value": "Explain tides."}])})
    ids = [r["prompt_ids"] for r in read_prompt_file(same, tok)]
    assert len(ids) == 3 and ids[0] == ids[1] == ids[2]
    for name, row, msg in [
            ("surrogate.jsonl", '{"prompt": "x = \\ud800"}', "surrogate.jsonl: row 2: not encodable text: a lone "
                                                              "surrogate '\\ud800' at character 5"),
            ("image.jsonl", {"messages": [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}]},
             "image.jsonl: row 2: `content`: content parts of kind ['image']: expected text"),
            ("empty.jsonl", {"prompt": " "}, "empty.jsonl: row 2: `prompt` = ' ': expected non-empty text"),
            ("number.jsonl", "7", "number.jsonl:2: expected a JSON object (a row of the set), got int")]:
        work = tmp_path / f"w_{name}"
        line = _fails(["reproduce", "--profile", "open-tiny", "--target", str(w / "vl"), "--work", str(work),
                       "--stage", "regen", "--prompts", str(prompts(name, {"prompt": "fine"}, row))], capsys)
        assert "error:" in line and msg in line, line
        assert not (work / "data").exists()


def _packed(path, files: dict):
    """A tar.gz of `files` (member name -> text), as `dmtp pipeline --archive` would pack them."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as t:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            t.addfile(info, io.BytesIO(text.encode()))
    return path


def test_landing_names_what_is_in_the_way(tmp_path, capsys):
    """`dmtp land`: an archive whose pipeline.json lies at its top (no run folder) is refused naming it; a dangling
    symlink where the run lands, or on the way there, is named and nothing is left behind; a run packed as
    <profile> lands beside the partial landings of the same run (<profile>/partial/), never over a landed run."""
    done = {"folder": "smoke", "finished": True, "missing": []}
    top = _packed(tmp_path / "top.tgz", {"pipeline.json": json.dumps({**done, "folder": "."}), "runs/x.txt": "x"})
    line = _fails(["land", str(top), "--results", str(tmp_path / "r"), "--no-report"], capsys)
    assert "top.tgz: pipeline.json: expected pipeline.json inside the run's folder, <profile>/pipeline.json or " \
        "<profile>/r<k>/pipeline.json" in line, line
    finished = _packed(tmp_path / "done.tgz", {"smoke/pipeline.json": json.dumps(done), "smoke/tables/t.md": "t"})
    half = _packed(tmp_path / "half.tgz", {"smoke/pipeline.json": json.dumps(dict(done, finished=False,
                                                                                  missing=["tables"])),
                                           "smoke/target/DONE": "ok"})
    r1 = _packed(tmp_path / "r1.tgz", {"smoke/r1/pipeline.json": json.dumps(dict(done, folder="smoke/r1"))})
    for archive in (finished, r1):  # results/smoke dangling: the destination itself, or a folder on the way
        res = tmp_path / f"r_{archive.stem}"
        res.mkdir()
        (res / "smoke").symlink_to(tmp_path / "nowhere")
        line = _fails(["land", str(archive), "--results", str(res), "--no-report"], capsys)
        assert f"{res / 'smoke'}: a symlink to {tmp_path / 'nowhere'}, which does not exist: remove it" in line, line
        assert sorted(p.name for p in res.iterdir()) == ["smoke"]  # nothing staged and left behind
    res = tmp_path / "landed"
    dmtp(["land", str(half), "--results", str(res), "--partial", "--no-report"])
    dmtp(["land", str(finished), "--results", str(res), "--no-report"])
    assert sorted(p.name for p in (res / "smoke").iterdir()) == ["partial", "pipeline.json", "tables"]
    assert (res / "smoke" / "partial" / "r0" / "target" / "DONE").exists()
    line = _fails(["land", str(finished), "--results", str(res), "--no-report"], capsys)
    assert "smoke exists: a landed run is never overwritten" in line, line
    assert not list(res.rglob(".*landing"))
