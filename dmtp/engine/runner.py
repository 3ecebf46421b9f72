"""The one evaluation path: prompt dicts -> batched decoding through `decode.generate` -> output records.

A record (the `dmtp generate` schema): `id, method, temperature, verify, prompt_tokens, output_ids, accepted`
(accepted draft count of every verify round), `n_candidates`, `wall_s`, `mode` and `stop_reason` (below),
`output_text` when a tokenizer is given; every metric is derived from `accepted`. `verify`: target | sample | block
(`verify.py`).

Evaluation modes, both through the one decode loop:
  natural  a request ends at an end-of-text id (`eos_ids`), at the first stop string in its completion
           (`stop_strings`, e.g. `stops.HUMANEVAL_STOPS`; needs `tok`), or at `max_new_tokens`. A stop string keeps
           the output tokens up to the one that completes it and the verify rounds up to the one that emitted that
           token; `output_text` is cut before the stop string (`stops.py` states the rule). Lossless decoding makes
           every method's record identical to `ar`'s.
  fixed    end-of-text ignored, no stop strings: every request decodes exactly `max_new_tokens` (the blog's
           throughput setting).
`stop_reason`: "eos" (the output ends in an end-of-text id) | "stop" (a stop string) | "length".

    recs = run_generate(target, method, [{"id": "0", "prompt_ids": [1, 2, 3]}], 0.0, 64, eos_ids=[0], batch_size=8)
    recs = run_generate(target, method, rows, 0.0, 256, [tok.eos_token_id], 16, tok=tok, mode="natural",
                        stop_strings=HUMANEVAL_STOPS)     # HumanEval as code benchmarks run it
"""
from __future__ import annotations

import torch
from tqdm import tqdm

from dmtp.checks import BadValue
from dmtp.checks import temperature as TEMPERATURE
from dmtp.config import EVAL_MODES
from dmtp.data.datasets import chat_text, encode
from dmtp.data.tokenizer import token_bytes
from dmtp.dist import all_gather_objects, rank_world
from dmtp.engine.decode import generate
from dmtp.engine.stops import StopStrings


def stop_spec(tgt, tok, mode: str, stop_strings) -> StopStrings | None:
    """The decode loop's stop strings for a mode (None: none); a clear error for a combination that cannot work."""
    if mode not in EVAL_MODES:
        raise ValueError(f"unknown evaluation mode {mode!r} (natural, fixed)")
    if not stop_strings:
        return None
    if mode == "fixed":
        raise ValueError("mode 'fixed' decodes max_new_tokens and takes no stop strings")
    if tok is None:
        raise ValueError("stop strings need the target's tokenizer (tok=)")
    table = token_bytes(tok)
    return StopStrings(stop_strings, table + [b""] * max(0, tgt.vocab_size - len(table)))


def cut_text(text: str, stop_strings) -> str:
    """The text before the earliest stop string in it (unchanged when none occurs)."""
    return text[: min([i for s in stop_strings if (i := text.find(s)) >= 0], default=len(text))]


def compiled_graphs() -> int:
    """Graphs torch.compile has made in this process so far (dynamo's count): a decode whose shapes an earlier one
    compiled adds none."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run_generate(tgt, method, prompts, temperature, max_new_tokens, eos_ids, batch_size, seed=0, tok=None,
                 desc="generate", extra=None, shard=False, mode="natural", stop_strings=(), verify="target",
                 engine=None):
    """Batched generation over prompt dicts -> output records in the `dmtp generate` schema. Batch i (prompts
    i*B..) is seeded with `seed + i*B`. `shard=True` under torchrun: rank r decodes batches r, r+W, ... and the
    records come back in prompt order on every rank, so the result does not depend on the number of ranks.
    `mode` "natural" (default; with no stop strings: end-of-text or length) or "fixed" (module docstring);
    `verify`: target | sample | block (`engine/verify.py`); `engine`: the `EngineConfig` (None: the default)."""
    if not TEMPERATURE[0](temperature):  # 1e-320: logits / T overflows in fp32 (checks.MIN_TEMPERATURE)
        raise BadValue("temperature", temperature, TEMPERATURE[1])
    stop = stop_spec(tgt, tok, mode, stop_strings)
    eos_ids = list(eos_ids) if mode == "natural" else []
    rank, world = rank_world() if shard else (0, 1)
    starts = list(range(0, len(prompts), batch_size))
    mine = starts[rank::world]
    recs = []
    bar = tqdm(total=sum(len(prompts[i: i + batch_size]) for i in mine), desc=desc[:40], dynamic_ncols=True,
               leave=False, disable=rank != 0)
    for i in mine:
        chunk = prompts[i: i + batch_size]
        res = generate(tgt, method, [p["prompt_ids"] for p in chunk], temperature, max_new_tokens, eos_ids,
                       seed=seed + i, stop=stop, verify=verify, engine=engine)
        for p, r in zip(chunk, res):
            rec = {"id": p["id"], "method": method.name, "temperature": temperature, "verify": verify,
                   "prompt_tokens": len(p["prompt_ids"]), "output_ids": r.output_ids, "accepted": r.accepted,
                   "n_candidates": method.k, "wall_s": round(r.wall_s, 4), "mode": mode,
                   "stop_reason": r.stop_reason}
            if tok is not None:
                text = tok.decode(r.output_ids)
                rec["output_text"] = cut_text(text, stop_strings) if r.stop_reason == "stop" else text
            rec.update(extra or {})
            recs.append(rec)
        bar.update(len(chunk))
        if torch.cuda.is_available():  # device memory held between batches: flat unless something keeps a batch;
            # the graphs compiled so far: flat unless each batch compiles anew
            bar.set_postfix(graphs=compiled_graphs(), held=f"{torch.cuda.memory_allocated() / 2**30:.1f}GiB")
    bar.close()
    if world == 1:
        return recs
    parts, out = all_gather_objects(recs), []
    for b, i in enumerate(starts):  # batch b was decoded by rank b % world, in order
        part, n = parts[b % world], len(prompts[i: i + batch_size])
        out += part[:n]
        parts[b % world] = part[n:]
    return out


def mtbench_generate(tgt, method, tok, questions: list[dict], temperature: float, max_new_tokens: int, eos_ids,
                     batch_size: int, seed: int = 0, mode: str = "natural", verify: str = "target",
                     engine=None) -> list[dict]:
    """MT-Bench, two turns, through the one decode loop (`run_generate`): turn 1 on q1; turn 2 on
    template(q1, the model's own answer 1, q2). One record per (question, turn) with `turn` and `question_id`;
    `id` = "<question_id>:t<turn>" so per-request acceptance is per turn."""
    recs = []
    history = {q["id"]: [{"role": "user", "content": q["turns"][0]}] for q in questions}
    for turn in (1, 2):
        prompts = []
        for q in questions:
            if len(q["turns"]) < turn:
                continue
            msgs = history[q["id"]]
            if turn > 1:
                msgs.append({"role": "user", "content": q["turns"][turn - 1]})
            ids = encode(tok, chat_text(tok, msgs))
            prompts.append({"id": f"{q['id']}:t{turn}", "qid": q["id"], "prompt_ids": ids})
        got = run_generate(tgt, method, prompts, temperature, max_new_tokens, eos_ids, batch_size,
                           seed=seed + 1000 * turn, tok=tok, desc=f"mtbench turn {turn}", extra={"turn": turn},
                           mode=mode, verify=verify, engine=engine)
        for p, r in zip(prompts, got):
            r.update(question_id=p["qid"], dataset="mtbench", prompt_ids=p["prompt_ids"])
            answer = tok.decode([t for t in r["output_ids"] if t not in set(eos_ids)], skip_special_tokens=True)
            history[p["qid"]].append({"role": "assistant", "content": answer})
        recs += got
    return recs
