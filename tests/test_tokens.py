"""The token store (`dmtp.data.tokens`): converted from the generate JSONL (atomically; an unfinished generate output
refused; bad lines named), read back as the same sequences; `batches` over a store yields exactly the batches of the
JSONL read into lists, for the whole batch and for each rank's rows, with and without skipped (replayed) batches; a
rank's peak memory stays flat as the token file grows ten times; the drafter training loop over a store equals the
one over lists; `dmtp train --data` takes either, converting a JSONL once."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import token_seqs

from dmtp.data.tokens import TokenSequences, convert, open_store
from dmtp.training.drafters import batches, load_sequences


def write_jsonl(path, seqs, generate=True):
    with open(path, "w") as f:
        for i, s in enumerate(seqs):
            row = {"id": str(i), "prompt_ids": s[:3], "output_ids": s[3:]} if generate and i % 2 else {"ids": s}
            f.write(json.dumps(row) + "\n")
    return path


def test_store_roundtrip_and_meta(tmp_path):
    seqs = token_seqs(20) + [[5, 6], []]  # a short and an empty sequence are stored, and dropped when read
    src = write_jsonl(tmp_path / "d.jsonl", seqs)
    dst = convert(src, tmp_path / "d.tokens", vocab_size=100)
    st = open_store(dst)
    assert st.tokens.dtype == np.dtype("<u2") and st.meta["sequences"] == 22
    assert st.meta["tokens"] == sum(map(len, seqs)) and st.meta["max_id"] == max(max(s) for s in seqs if s)
    assert [st.tokens[st.offsets[i]:st.offsets[i + 1]].tolist() for i in range(22)] == seqs
    ts = load_sequences(dst, 30, vocab_size=100)
    assert isinstance(ts, TokenSequences)
    assert [r.tolist() for r in ts.rows(range(len(ts)))] == load_sequences(src, 30, vocab_size=100)
    assert convert(src, tmp_path / "wide.tokens").exists() and open_store(tmp_path / "wide.tokens").tokens.dtype == \
        np.dtype("<u4")
    assert not list(tmp_path.glob(".*"))  # no temporary folder left behind


def test_bad_inputs(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", token_seqs(4))
    (tmp_path / "d.jsonl.meta.json").write_text(json.dumps({"finished": False}))
    with pytest.raises(ValueError, match="half-written"):
        convert(src, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    (tmp_path / "d.jsonl.meta.json").write_text(json.dumps({"finished": True}))
    with pytest.raises(ValueError, match=r"d.jsonl:1: token id \d+ outside the target's vocabulary \[0, 10\)"):
        convert(src, tmp_path / "x", vocab_size=10)
    (tmp_path / "bad.jsonl").write_text('{"ids": [1, 2]}\n{"text": "no ids"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected `ids`"):
        convert(tmp_path / "bad.jsonl", tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        convert(tmp_path / "none.jsonl", tmp_path / "x")
    dst = convert(src, tmp_path / "ok")
    with pytest.raises(ValueError, match=r"outside the target's vocabulary \[0, 10\)"):
        open_store(dst, vocab_size=10)
    (dst / "tokens.bin").write_bytes(b"\0" * 6)
    with pytest.raises(ValueError, match="damaged token store"):
        open_store(dst)
    with pytest.raises(FileNotFoundError, match="not a token store"):
        open_store(tmp_path)


@pytest.mark.parametrize("batch,world", [(4, 1), (4, 2), (6, 3), (50, 1)])  # 50 > the 23 sequences: one batch
def test_store_batches_equal_list_batches(tmp_path, batch, world):
    seqs = token_seqs(23, seed=3)
    src = write_jsonl(tmp_path / "d.jsonl", seqs)
    lists, store = load_sequences(src, 25), load_sequences(convert(src, tmp_path / "s"), 25)
    ref = batches(lists, batch, seed=7)
    per_rank = [batches(store, batch, 7, rank, world) for rank in range(world)]
    skipped = batches(store, batch, 7, world - 1, world, skip=5)
    for step in range(12):  # several epochs
        ids, lengths = next(ref)
        got = [next(it) for it in per_rank]
        for rank, (ids_r, lengths_r) in enumerate(got):
            assert torch.equal(lengths_r, lengths) and torch.equal(ids_r, ids[rank::world])
        s_ids, s_len = next(skipped)
        assert torch.equal(s_len, lengths) and (s_ids is None) == (step < 5)
        if s_ids is not None:
            assert torch.equal(s_ids, ids[world - 1::world])


def test_training_over_a_store_equals_training_over_lists(tmp_path):
    """Two steps of a tiny drafter: the same history and weights from the JSONL's lists and from its store."""
    from dmtp.models import tiny
    from dmtp.training.drafters import TrainConfig, new_drafters, train_drafters

    tgt, mtp = tiny.build("qwen3", seed=0)
    src = write_jsonl(tmp_path / "d.jsonl", token_seqs())
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2, seed=1)
    cfg = TrainConfig(steps=2, batch_size=4, max_len=40, anchors_per_seq=5, log_every=1, save_every=100)
    out = []
    for data in (load_sequences(src, 40), load_sequences(convert(src, tmp_path / "s"), 40)):
        ds = new_drafters(tgt, ["dflash"], base)
        hist = train_drafters(tgt, mtp, ds, data, cfg, tmp_path / f"run{len(out)}", log=lambda *_: None)
        out.append(([h["loss"] for h in hist["dflash"]], ds["dflash"].state_dict()))
    assert out[0][0] == out[1][0]
    for k, w in out[0][1].items():
        assert torch.equal(out[1][1][k], w), k


PROBE = textwrap.dedent('''
    import resource, sys, tracemalloc
    from dmtp.training.drafters import batches, load_sequences
    tracemalloc.start()
    seqs = load_sequences(sys.argv[1], int(sys.argv[2]))
    it = batches(seqs, 8, 0, rank=1, world=2)
    for _ in range(40):
        next(it)
    print(tracemalloc.get_traced_memory()[1], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
''')


def _peak(path, max_len=64):
    out = subprocess.run([sys.executable, "-c", PROBE, str(path), str(max_len)], capture_output=True, text=True,
                         check=True)
    return [int(x) for x in out.stdout.split()]


def test_a_ranks_peak_memory_stays_flat_as_the_file_grows(tmp_path):
    """The same 400 sequences, 300 or 3,000 tokens each (a 1.2 MB and a 12 MB token file), read by rank 1 of 2
    for 40 batches (sequences cut to 64 tokens): the Python-heap peak (tracemalloc, numpy's arrays included) and
    the process's peak RSS barely move; the JSONL read into lists (uncut) grows with the file, ~36 bytes a token."""
    rng = np.random.default_rng(0)
    peaks = {}
    for n_tok in (300, 3000):
        src = tmp_path / f"d{n_tok}.jsonl"
        with open(src, "w") as f:
            for _ in range(400):
                f.write(json.dumps({"ids": rng.integers(0, 248320, n_tok).tolist()}) + "\n")
        peaks[n_tok] = _peak(convert(src, tmp_path / f"s{n_tok}", vocab_size=248320)), _peak(src, 4096)
    (heap1, rss1), (list_heap1, _) = peaks[300]
    (heap10, rss10), (list_heap10, _) = peaks[3000]
    assert (tmp_path / "s3000" / "tokens.bin").stat().st_size == 400 * 3000 * 4
    assert heap10 < 1.1 * heap1 + 20_000 and heap1 < 200_000  # flat, and well under the file's 1.2 MB
    assert rss10 < rss1 + 4_000_000  # the 10.8 MB more of file are not held
    assert list_heap10 > 8 * list_heap1 and 30 * 400 * 3000 < list_heap10 < 45 * 400 * 3000  # lists


def test_cli_train_converts_a_jsonl_once_and_takes_a_store(tmp_path, capsys):
    """`dmtp train --data X.jsonl` converts it into --out once (a rerun reuses it); `--data STORE` trains the same
    drafter (the same fingerprint: a store names its JSONL's digest)."""
    from dmtp.cli.main import main
    from dmtp.models import tiny

    tgt, mtp = tiny.build("qwen3", seed=0)
    target = tiny.save(tgt, mtp, tmp_path / "target")
    src = write_jsonl(tmp_path / "d.jsonl", token_seqs())
    run = lambda data, out: main(["train", "--target", str(target), "--data", str(data), "--out", str(out),  # noqa
                                  "--steps", "2", "--batch-size", "4", "--max-len", "40", "--mask-token-id", "2",
                                  "--device", "cpu"])
    run(src, tmp_path / "a")
    (store,) = (tmp_path / "a").glob("tokens-*")
    made = (store / "tokens.bin").stat().st_mtime_ns
    run(src, tmp_path / "a")
    assert "nothing to train" in capsys.readouterr().out and (store / "tokens.bin").stat().st_mtime_ns == made
    run(store, tmp_path / "b")
    assert not list((tmp_path / "b").glob("tokens-*"))
    hist = [json.loads((tmp_path / o / "dflash" / "history.json").read_text()) for o in "ab"]
    assert hist[0][-1]["loss"] == hist[1][-1]["loss"]
    fp = [json.loads((tmp_path / o / "dflash" / "fingerprint.json").read_text()) for o in "ab"]
    assert fp[0] == fp[1]


def test_a_store_is_its_conversion(tmp_path):
    """store.json holds tokens.bin's sha256 as converted: a store whose tokens.bin was edited since (even at its
    size and time) is refused naming the file, and `store_of` (its own stores in --out) converts it again rather
    than reuse it (offsets.npy too); a store.json without its source, or unreadable, is converted again, not a
    cryptic key."""
    import os

    from dmtp.data import tokens as T

    seqs = token_seqs(6)
    src = write_jsonl(tmp_path / "d.jsonl", seqs)
    dst = T.store_of(src, tmp_path / "s", vocab_size=100)
    made = open_store(dst).meta["tokens_sha256"]
    f = dst / "tokens.bin"
    st = f.stat()
    raw = bytearray(f.read_bytes())
    raw[0] ^= 1  # one id changed, the size the same
    f.write_bytes(bytes(raw))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # and its time as it was
    T._VERIFIED.clear()  # (a new process)
    with pytest.raises(ValueError, match=r"s/tokens.bin: changed after conversion \(its sha256 is not store.json's "
                                         r"tokens_sha256\): convert it again"):
        open_store(dst)
    T.store_of(src, dst, vocab_size=100)
    st = open_store(dst)
    assert st.meta["tokens_sha256"] == made
    assert [st.tokens[st.offsets[i]:st.offsets[i + 1]].tolist() for i in range(6)] == seqs
    offsets = np.load(dst / "offsets.npy")
    offsets[1], offsets[2] = offsets[1] + 1, offsets[2] - 1  # sequence boundaries moved, the offsets still rising
    np.save(dst / "offsets.npy", offsets)
    T._VERIFIED.clear()
    with pytest.raises(ValueError, match=r"offsets.npy: changed after conversion \(its sha256 is not store.json's "
                                         r"offsets_sha256\)"):
        open_store(dst)
    for broken in ({k: v for k, v in json.loads((dst / "store.json").read_text()).items() if k != "source"}, "{"):
        (dst / "store.json").write_text(broken if isinstance(broken, str) else json.dumps(broken))
        T.store_of(src, dst, vocab_size=100)
        assert open_store(dst).meta["source"]["name"] == "d.jsonl"
