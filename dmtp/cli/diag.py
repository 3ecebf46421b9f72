"""Training vs decoding consistency of trained drafters: does the drafter propose at decode time what it predicts
teacher-forced on the same trajectory?

At T = 0 every method walks the target's greedy trajectory, so the teacher-forced accuracy of the first predicting
slot over the anchors a decode visits must equal the decoded first-token acceptance. This measures both for each
decode engine (`hf`, `fast-eager`, `compiled`), plus the teacher-forced accuracy of every slot.

    python -m dmtp.cli.diag --profile mini --work work --runs dflash,zero_init_residual --prompts 32
"""
from __future__ import annotations

import argparse

import torch

from dmtp.cli.args import failure
from dmtp.cli.pipeline import Ctx, drafters_dir
from dmtp.config import ENGINES
from dmtp.data.datasets import encode_prompts, humaneval_prompts
from dmtp.engine.methods import load_method
from dmtp.engine.runner import run_generate
from dmtp.io import write_json
from dmtp.training.drafters import block_inputs, extract


@torch.no_grad()
def teacher_forced(tgt, mtp, d, seqs, anchors_of):
    """Drafter d's argmax at each predicting slot (the training forward) at the anchors `anchors_of[i]` of each
    sequence. Returns per sequence {anchor: (hit [P], has_label [P])}."""
    var = d.injection
    lay = var.layout(d.config.num_candidates)
    predict = list(lay.predict)
    out = []
    for ids_l, anchors in zip(seqs, anchors_of):
        anchors = [a for a in anchors if 1 <= a <= len(ids_l) - 3]
        if not anchors:
            out.append({})
            continue
        ids = torch.tensor(ids_l, device=tgt.device)[None]
        lengths = torch.tensor([len(ids_l)], device=tgt.device)
        feats = extract(tgt, mtp, ids, lengths, d.config.target_layer_ids, var.needs_mtp)  # the drafter's tap order
        an = torch.tensor(anchors, device=tgt.device)[None]
        block, pos, labels, _ = block_inputs(d, tgt, feats, an, torch.ones_like(an, dtype=torch.bool), 4.0)
        f = d.context(feats.taps, feats.g)
        ctx_kv = d.context_kv(f, torch.arange(ids.shape[1], device=f.device)[None])
        pred = tgt.lm_head(d(block, pos, ctx_kv, an, None)).argmax(-1)  # [1, N*S]
        pred, labels = pred.view(len(anchors), lay.slots)[:, predict], labels.view(len(anchors), lay.slots)[:, predict]
        ok = labels >= 0
        out.append({a: (h, o) for a, h, o in zip(anchors, ((pred == labels) & ok).cpu(), ok.cpu())})
    return out


def slot_accuracy(per_seq, anchors_of=None) -> list[float]:
    """Accuracy per predicting slot over every anchor of `teacher_forced`'s result, or over `anchors_of` only."""
    pairs = [v for i, m in enumerate(per_seq) for a, v in m.items() if anchors_of is None or a in anchors_of[i]]
    if not pairs:
        return []
    hits, cnt = sum(h.float() for h, _ in pairs), sum(o.float() for _, o in pairs)
    return [round(float(h / max(n, 1)), 4) for h, n in zip(hits, cnt)]


def visited_anchors(rec, plen):
    """Anchor positions a decode visited: the first at plen; each round of n accepted drafts moves it by n + 1."""
    a, out = plen, []
    for n in rec["accepted"]:
        out.append(a)
        a += n + 1
    return out


def main():
    ap = argparse.ArgumentParser()
    for flag, default in (("--profile", "mini"), ("--work", "work"), ("--results", "results"),
                          ("--runs", "dflash,zero_init_residual"), ("--seed", 0), ("--prompts", 32),
                          ("--new-tokens", 128)):
        ap.add_argument(flag, default=default, type=type(default))
    ap.add_argument("--engines", default=None, help="decode engines to compare (default: hf,fast-eager on CPU; "
                    "hf,compiled,compiled+fast on CUDA; `+fast`: the compiled drafter)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.set, a.force = [], False
    c = Ctx(a)
    tgt, mtp = c.target()
    tok = c.tok
    rows = encode_prompts(tok, humaneval_prompts()[: a.prompts])
    plens = {r["id"]: len(r["prompt_ids"]) for r in rows}
    report = {}
    cuda = tgt.device.type == "cuda"
    engines = (a.engines or ("hf,compiled,compiled+fast" if cuda else "hf,fast-eager")).split(",")
    bad = [e for e in engines if e.removesuffix("+fast") not in ENGINES]
    if bad:
        raise SystemExit(f"unknown engine(s) {bad}; known: {', '.join(ENGINES)} (+fast: the compiled drafter)")
    for run in a.runs.split(","):
        report[run] = res = {}
        traj = None
        for eng in engines:
            cfg = c.eng.with_(engine=eng.removesuffix("+fast"), drafter="compiled" if eng.endswith("+fast") else "hf")
            m = load_method(run, tgt, mtp, drafters_dir(c, a.seed))
            try:
                recs = run_generate(tgt, m, rows, 0.0, a.new_tokens, [], len(rows), desc=f"{run} {eng}", engine=cfg)
            except Exception as e:  # noqa: BLE001 - one engine failing must not hide the others' numbers
                res[eng] = {"error": failure(e)}
                print(f"{run:<24} {eng:<13} FAILED {res[eng]['error']}", flush=True)
                continue
            acc = [n for r in recs for n in r["accepted"]]
            first = sum(n >= 1 for n in acc) / max(1, len(acc))
            tau = sum(n + 1 for n in acc) / max(1, len(acc))
            res[eng] = {"first_token": round(first, 4), "per_verify": round(tau, 4), "rounds": len(acc)}
            if traj is None:
                traj = recs
            else:
                res[eng]["same_tokens_as_" + engines[0]] = all(x["output_ids"] == y["output_ids"]
                                                               for x, y in zip(recs, traj))
            print(f"{run:<24} {eng:<13} first-token {first:.3f}  per-verify {tau:.3f}  ({len(acc)} rounds)",
                  flush=True)
        if traj is None:  # every engine failed: nothing to compare against
            continue
        d = m.drafter  # the same weights whichever engine's method loaded them
        seqs = [list(r_["prompt_ids"]) + list(t["output_ids"]) for r_, t in zip(rows, traj)]
        every = [range(plens[t["id"]], plens[t["id"]] + len(t["output_ids"]) - 2) for t in traj]
        per_seq = teacher_forced(tgt, mtp, d, seqs, every)  # one pass; the visited anchors are a subset
        visited = [set(visited_anchors(t, plens[t["id"]])) for t in traj]
        res["teacher_forced_visited"] = slot_accuracy(per_seq, visited)
        res["teacher_forced_all"] = slot_accuracy(per_seq)
        print(f"{run:<24} teacher-forced slot accuracy at visited anchors {res['teacher_forced_visited']}")
        print(f"{run:<24} teacher-forced slot accuracy at every anchor    {res['teacher_forced_all']}", flush=True)
    if a.out:
        write_json(a.out, report)


if __name__ == "__main__":
    main()
