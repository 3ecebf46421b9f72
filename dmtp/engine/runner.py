"""The one evaluation path: prompt dicts -> batched decoding through `decode.generate` -> output records.

A record (the `dmtp generate` schema): `id, method, temperature, verify, prompt_tokens, output_ids, accepted`
(accepted draft count of every verify round), `n_candidates`, `wall_s`; every metric is derived from `accepted`.

    recs = run_generate(target, method, [{"id": "0", "prompt_ids": [1, 2, 3]}], 0.0, 64, eos_ids=[0], batch_size=8)
"""
from __future__ import annotations

from tqdm import tqdm

from dmtp.data.datasets import chat_text, encode
from dmtp.dist import all_gather_objects, rank_world
from dmtp.engine.decode import generate


def run_generate(tgt, method, prompts, temperature, max_new_tokens, eos_ids, batch_size, seed=0, tok=None,
                 desc="generate", extra=None, shard=False, verify="target"):
    """Batched generation over prompt dicts -> output records in the `dmtp generate` schema. Batch i (prompts
    i*B..) is seeded with `seed + i*B`. `shard=True` under torchrun: rank r decodes batches r, r+W, ... and the
    records come back in prompt order on every rank, so the result does not depend on the number of ranks.
    `verify`: target | sample | block (`engine/verify.py`)."""
    rank, world = rank_world() if shard else (0, 1)
    starts = list(range(0, len(prompts), batch_size))
    mine = starts[rank::world]
    recs = []
    bar = tqdm(total=sum(len(prompts[i: i + batch_size]) for i in mine), desc=desc[:40], dynamic_ncols=True,
               leave=False, disable=rank != 0)
    for i in mine:
        chunk = prompts[i: i + batch_size]
        res = generate(tgt, method, [p["prompt_ids"] for p in chunk], temperature, max_new_tokens, eos_ids,
                       seed=seed + i, verify=verify)
        for p, r in zip(chunk, res):
            rec = {"id": p["id"], "method": method.name, "temperature": temperature, "verify": verify,
                   "prompt_tokens": len(p["prompt_ids"]), "output_ids": r.output_ids, "accepted": r.accepted,
                   "n_candidates": method.k, "wall_s": round(r.wall_s, 4)}
            if tok is not None:
                rec["output_text"] = tok.decode(r.output_ids)
            rec.update(extra or {})
            recs.append(rec)
        bar.update(len(chunk))
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
                     batch_size: int, seed: int = 0, verify: str = "target") -> list[dict]:
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
                           verify=verify)
        for p, r in zip(prompts, got):
            r.update(question_id=p["qid"], dataset="mtbench", prompt_ids=p["prompt_ids"])
            answer = tok.decode([t for t in r["output_ids"] if t not in set(eos_ids)], skip_special_tokens=True)
            history[p["qid"]].append({"role": "assistant", "content": answer})
        recs += got
    return recs
