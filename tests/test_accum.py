"""Gradient accumulation in drafter training (`TrainConfig.micro_batch`, `TrainConfig.grad_sync`): the global batch
taken in micro-batches is the same optimizer step as the whole batch at once, on the CPU in fp32 with gloo: one
process in 4 micro-batches and 2 ranks (FSDP2) in 2 micro-batches each follow one process taking the whole batch
(eager; the reduce-scatter after the last micro-batch or after every one), a DFlash2 drafter among them (its selector
term and every logged statistic the global batch's); the compiled one-region step in 2
micro-batches follows the eager whole-batch step and, at one micro-batch, keeps its single graph; a run stopped
mid-way resumes to the uninterrupted result, with another micro-batch size too; bad settings are refused in one
line.

Tolerances, as tests/test_fsdp.py and for the same reason: each micro-batch (and rank) sums the loss over its own
rows and the gradients are summed (averaged over ranks) afterwards, where one process sums every row in one
reduction: the same terms in another order, ~1e-7 relative per sum. Losses and gradient norms rel 1e-5, weights atol
1e-5 at lr 6e-4 (Adam's update has size ~lr whatever the gradient's: a cancellation near rounding level moves a
weight by a part of lr; a missing or doubled micro-batch moves whole tensors by ~lr)."""
import pytest
import torch
from conftest import compiled_graphs, gloo_ranks, token_seqs
from test_fsdp import BACKBONES, VARIANTS, _assert_same_run, _base, _cfg, _history, _run

from dmtp.config import TrainConfig
from dmtp.models import tiny
from dmtp.training import drafters as train_mod
from dmtp.training.drafters import (batches, combine_stats, drafter_features, drafter_loss, extract, new_drafters,
                                    rates, read_back, sample_anchors)

NAMES = [*VARIANTS, "dmtp_d2"]  # and a DFlash2 drafter (BACKBONES), whose selector term has its own mass


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The reference: one process, the global batch of 4 at once (eager)."""
    out = tmp_path_factory.mktemp("accum") / "whole"
    _run(out, NAMES)
    return out


def _ranks(rank, world, root):
    _run(root / "last", NAMES, micro_batch=1)  # 2 micro-batches a rank, one reduce-scatter after the last
    _run(root / "every", NAMES, micro_batch=1, grad_sync="every", shard_target="on")


def test_micro_batches_take_the_whole_batch_step(whole, tmp_path):
    """1 process in 4 micro-batches of 1 sequence, and 2 gloo ranks (FSDP2) in 2 micro-batches each (gradients
    reduce-scattered after the last micro-batch, or after every one with the target sharded too): the losses (the
    DFlash2 selector term's too), accuracies, gradient norms and final weights of the whole batch at once, step by
    step."""
    _run(tmp_path / "four", NAMES, micro_batch=1)
    _assert_same_run(tmp_path / "four", whole, NAMES)
    gloo_ranks(_ranks, 2, tmp_path)
    for run in ("last", "every"):
        assert "2 rank(s)" in (tmp_path / run / "dflash" / "DONE").read_text()
        _assert_same_run(tmp_path / run, whole, NAMES)


def test_dflash2_logs_the_global_batch_selector_term(whole):
    """The DFlash2 drafter's step-1 record is the whole global batch's, made here by one `drafter_loss` over the 4
    sequences with the fresh weights: its selector term  sum w * [label in top-k] * CE_topk / sum w,  coverage and
    accuracies (the runs above log the same on 4 micro-batches and on 2 ranks). The batch is one where the term is
    not the same on every sequence, so a per-part normalisation would log another value."""
    cfg, (tgt, mtp) = _cfg(), tiny.build("qwen3_5", seed=0)
    d = new_drafters(tgt, ["dmtp_d2"], _base(tgt), backbones=BACKBONES)["dmtp_d2"]
    ids, lengths = next(batches(token_seqs(), cfg.batch_size, cfg.seed))
    anchors, valid = sample_anchors(lengths, cfg.anchors_per_seq, torch.Generator().manual_seed(cfg.seed))
    taps = d.config.target_layer_ids

    def stats(rows):
        feats = drafter_features(extract(tgt, mtp, ids[rows], lengths[rows], taps, True), taps, d)
        return drafter_loss(d, tgt, feats, anchors[rows], valid[rows], cfg.gamma)[1]

    ref = rates({k: float(v) for k, v in stats(slice(None)).items()})
    rec = _history(whole / "dmtp_d2")[0]
    for key in ("loss", "sel_loss", "sel_cover", "sel_acc", "acc"):
        assert rec[key] == pytest.approx(ref[key], rel=1e-5), key
    per_row = [float(stats(slice(b, b + 1))["sel_loss"]) for b in range(cfg.batch_size)]
    assert max(per_row) - min(per_row) > 0.1 * ref["sel_loss"]


def test_fsdp_on_one_process_accumulates(whole, tmp_path):
    """FSDP2 in a process group of one, 2 micro-batches: with the reduction deferred to the last micro-batch (FSDP2
    sums the unsharded gradients) and with one reduction per micro-batch: the whole batch's step."""
    for sync in ("last", "every"):
        _run(tmp_path / sync, NAMES, fsdp="on", micro_batch=2, grad_sync=sync)
        _assert_same_run(tmp_path / sync, whole, NAMES)


def test_compiled_one_region_accumulates(tmp_path, monkeypatch):
    """The compiled one-region step (`drafters_loss` through AOTAutograd's eager backend, as its own function: the
    graphs Inductor would get, without a C++ build) in 2 micro-batches follows the eager whole-batch step; at one
    micro-batch a step is the region's one call with the same shapes as before: one graph for the drafters."""
    names = ["dflash", "zero_init_residual"]
    _run(tmp_path / "eager", names=names)
    fn = lambda *a: train_mod.drafters_loss(*a)  # noqa: E731
    monkeypatch.setattr(train_mod, "_JOINT", [torch.compile(fn, backend="aot_eager", dynamic=False, fullgraph=True)])
    _run(tmp_path / "one", names=names, compile="on")
    assert compiled_graphs(fn) == 1
    _run(tmp_path / "two", names=names, compile="on", micro_batch=2)
    assert compiled_graphs(fn) == 2  # the micro-batch's shapes: one more graph, then reused every step
    for run in ("one", "two"):
        for v in names:  # padded to max_len on the compiled path: the same loss, other reduction shapes
            h, h_ref = _history(tmp_path / run / v), _history(tmp_path / "eager" / v)
            for key in ("loss", "grad_norm"):
                assert [r[key] for r in h] == pytest.approx([r[key] for r in h_ref], rel=1e-5), (run, v, key)


def test_stopped_accumulating_run_resumes(whole, tmp_path):
    """Stopped after step 2 in micro-batches of 2, resumed in micro-batches of 1 (the micro-batch is run control: a
    checkpoint does not depend on it): the uninterrupted whole-batch run."""
    _run(tmp_path / "split", micro_batch=2, stop_after=2)
    state = torch.load(tmp_path / "split" / "dflash" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 2 and not (tmp_path / "split" / "dflash" / "DONE").exists()
    _run(tmp_path / "split", micro_batch=1)
    _assert_same_run(tmp_path / "split", whole)


def test_combined_statistics():
    """A step's statistics from its micro-batches, by hand: each summed (loss shares of the global batch, counts), one
    micro-batch untouched; read back on one rank, the counts become the logged ratios (acc = hits / labelled,
    sel_cover = covered / labelled, sel_acc = selector hits / covered), the gradient norm as it is."""
    t = torch.tensor
    one = {"loss": t(0.5), "hits": t(1.0), "labelled": t(4.0), "sel_loss": t(0.25), "sel_covered": t(2.0),
           "sel_hits": t(1.0)}
    assert combine_stats([one]) is one
    two = {"loss": t(1.5), "hits": t(3.0), "labelled": t(4.0), "sel_loss": t(0.5), "sel_covered": t(6.0),
           "sel_hits": t(6.0)}
    got = combine_stats([one, two])
    assert {k: v.item() for k, v in got.items()} == {"loss": 2.0, "hits": 4.0, "labelled": 8.0, "sel_loss": 0.75,
                                                     "sel_covered": 8.0, "sel_hits": 7.0}
    rec = read_back({"d": {**got, "grad_norm": t(0.125)}}, world=1)["d"]
    assert rec == {"loss": 2.0, "sel_loss": 0.75, "acc": 0.5, "sel_cover": 1.0, "sel_acc": 7 / 8, "grad_norm": 0.125}


def test_bad_micro_batch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="train.micro_batch=3: expected a divisor of train.batch_size=4"):
        TrainConfig(batch_size=4, micro_batch=3)
    with pytest.raises(ValueError, match="grad_sync"):
        TrainConfig(grad_sync="sometimes")
    with pytest.raises(ValueError, match=r"train.micro_batch=4 does not divide the 2 sequences of each of 4"):
        train_mod.micro_split(TrainConfig(batch_size=8, micro_batch=4), 4)


def test_cli_micro_batch_is_run_control(tmp_path):
    """`dmtp train --micro-batch 1 --grad-sync every` reaches TrainConfig; a run stopped that way resumes without the
    flags (the micro-batch and the reduction are not in the drafter's fingerprint) to the whole-batch run's loss."""
    import json

    from conftest import token_seqs

    from dmtp.cli.main import main
    from dmtp.models import tiny

    tgt, mtp = tiny.build("qwen3", seed=0)
    target = tiny.save(tgt, mtp, tmp_path / "target")
    with open(tmp_path / "d.jsonl", "w") as f:
        f.writelines(json.dumps({"ids": s}) + "\n" for s in token_seqs())
    run = lambda out, *extra: main(["train", "--target", str(target), "--data", str(tmp_path / "d.jsonl"),  # noqa
                                    "--out", str(out), "--steps", "3", "--batch-size", "4", "--max-len", "40",
                                    "--mask-token-id", "2", "--device", "cpu", *extra])
    run(tmp_path / "split", "--micro-batch", "1", "--grad-sync", "every", "--stop-after", "2")
    assert not (tmp_path / "split" / "dflash" / "DONE").exists()
    run(tmp_path / "split")
    run(tmp_path / "whole")
    h = [json.loads((tmp_path / o / "dflash" / "history.json").read_text()) for o in ("split", "whole")]
    assert [r["step"] for r in h[0]] == [r["step"] for r in h[1]] == [3]  # (logged every 10 steps, and the last)
    assert h[0][-1]["loss"] == pytest.approx(h[1][-1]["loss"], rel=1e-5)
    assert json.loads((tmp_path / "split" / "dflash" / "fingerprint.json").read_text()) == \
        json.loads((tmp_path / "whole" / "dflash" / "fingerprint.json").read_text())
    with pytest.raises(SystemExit) as e:  # a micro-batch that does not divide the batch: one line, exit 2
        run(tmp_path / "bad", "--micro-batch", "3")
    assert e.value.code == 2
