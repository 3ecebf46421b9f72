"""Evaluation modes through the one decode loop: stop strings matched on the host (exact cuts, late stops, dynamic
batching), `natural` vs `fixed` records identical across methods."""

import pytest
from conftest import hf_greedy, make_drafter

from dmtp.engine import decode, slots
from dmtp.engine.decode import generate
from dmtp.engine.methods import build_method, method_class
from dmtp.engine.server import serve
from dmtp.engine.stops import HUMANEVAL_STOPS, StopStrings, cut_rounds

PROMPTS = [[5, 7, 9, 11, 3], [4, 8], [10, 20, 30, 40, 50, 60, 70, 80, 90], [33]]
METHODS = ["ar", "mtp", "dflash", "zero_init_residual"]


def method_for(name, tgt, mtp):
    d = make_drafter(tgt, name) if method_class(name).needs_drafter else None
    return build_method(name, tgt, drafter=d, mtp=mtp, mtp_steps=4)


# --- the matcher on hand-made tokens -----------------------------------------------------------------------------
def test_match_spanning_tokens_and_earliest_start():
    table = [b"\n", b"de", b"f", b"  x", b"#", b"\xe4\xb8", b"\xad"]  # 5, 6: the two halves of a UTF-8 char
    m = StopStrings(HUMANEVAL_STOPS, table).match()
    assert not m.feed([3, 5, 6, 0]) and m.found is None  # "  x中\n": "\n" could still begin a stop
    assert not m.feed([1]) and m.found is None  # "\nde"
    assert m.feed([2]) and m.found == (6, 6)  # "\ndef" starts at byte 6, completed by the 6th token (b"f")
    assert m.feed([0, 4]) and m.found == (6, 6)  # certain: later tokens change nothing
    m = StopStrings(["\n#", "\ndef"], table).match()
    assert m.feed([3, 0, 1, 2, 0, 4]) and m.found == (3, 4)  # two stops in one feed: the earliest start wins
    m = StopStrings(["\n#"], table).match()
    assert m.feed([0, 4]) and m.found == (0, 2)
    with pytest.raises(ValueError, match="non-empty"):
        StopStrings(["\n", ""], table)


def test_match_waits_for_an_earlier_stop_that_may_still_complete():
    table = [b"a", b"b", b"c", b"d", b"x"]
    spec = StopStrings(["bc", "abcd"], table)
    m = spec.match()
    assert not m.feed([0, 1, 2]) and m.found == (1, 3)  # "bc" found, but "abc" may still become "abcd" at 0
    assert m.feed([3]) and m.found == (0, 4)  # it did: the earlier start wins, cut after "d"
    m = spec.match()
    assert not m.feed([0, 1, 2])
    assert m.feed([4]) and m.found == (1, 3)  # "abcx": "bc" stands


def test_cut_rounds():
    # token 0 from the prefill; rounds emit 3, 1, 4 tokens: tokens 1-3 | 4 | 5-8
    assert cut_rounds([2, 0, 3], 1) == []
    assert cut_rounds([2, 0, 3], 2) == [0] and cut_rounds([2, 0, 3], 3) == [1] and cut_rounds([2, 0, 3], 4) == [2]
    assert cut_rounds([2, 0, 3], 5) == [2, 0]
    assert cut_rounds([2, 0, 3], 6) == [2, 0, 0] and cut_rounds([2, 0, 3], 9) == [2, 0, 3]
    for acc in ([2, 0, 3], [7, 7, 1], [0, 0]):  # every cut accounts for exactly the tokens kept
        for keep in range(1, 2 + sum(a + 1 for a in acc)):
            cut = cut_rounds(acc, keep)
            assert 1 + sum(a + 1 for a in cut) == min(keep, 1 + sum(a + 1 for a in acc)) and all(a >= 0 for a in cut)


# --- through the decode loop ---------------------------------------------------------------------------------------
TABLE = [bytes([97 + t % 7, 97 + (t // 7) % 5]) for t in range(96)]  # two letters per token


def reference_cut(ids, stops):
    """Brute force: earliest start of any stop in the whole text, tokens kept up to the one that completes it."""
    text = b"".join(TABLE[t] for t in ids)
    hits = [(text.find(s.encode()), len(s)) for s in stops if s.encode() in text]
    if not hits:
        return None
    start, n = min(hits)
    return next(i + 1 for i in range(len(ids)) if len(b"".join(TABLE[t] for t in ids[: i + 1])) >= start + n)


@pytest.fixture(scope="module")
def stop_case(models):
    """Stop strings that straddle two tokens, found in the target's greedy outputs a few rounds in."""
    tgt, _ = models
    refs = [hf_greedy(tgt, p, 40) for p in PROMPTS]
    text = b"".join(TABLE[t] for t in refs[0]).decode()
    for j in range(6, 30):
        stops = [text[2 * j + 1: 2 * j + 3], "zz"]  # last letter of token j + first of token j+1; "zz" never
        keeps = [reference_cut(r, stops) for r in refs]
        if 6 <= keeps[0] <= 30 and text.find(stops[0]) % 2 == 1:
            return refs, stops, keeps
    pytest.skip("no straddling stop string in this tiny model's output")


def lagging(monkeypatch, seen):
    """Emulate the CUDA engine's late copies on CPU: every copy to the host (`Batch._pending`: done flags, a round's
    tokens, the newcomers' first tokens) is read only when two newer ones are in flight or when the host waits, as
    when the GPU runs ahead of the host; so the host sees a stop string two rounds late, the stopped request keeps
    decoding until then, and a server refills slots while copies about their former occupants are still queued.
    `seen`: the batches made, in order."""
    orig = decode.Batch._publish

    def publish(self, ring=True):
        if not self._pending and self not in seen:
            seen.append(self)
        orig(self, ring)

    monkeypatch.setattr(slots._Arrived, "query", lambda self: False)  # a CUDA event that has not completed yet
    monkeypatch.setattr(decode.Batch, "_publish", publish)


def check_cut(res, refs, keeps):
    for r, ref, keep in zip(res, refs, keeps):
        if keep is None:
            assert r.stop_reason == "length" and r.output_ids == ref
            continue
        assert r.stop_reason == "stop" and r.output_ids == ref[:keep]
        spans = [1 + sum(a + 1 for a in r.accepted[:i]) for i in range(len(r.accepted) + 1)]
        assert (keep == 1 and not r.accepted) or spans[-2] < keep <= spans[-1]  # the last round emitted the cut


@pytest.mark.parametrize("name", METHODS)
def test_stop_strings_cut_exactly(models, name, stop_case, monkeypatch):
    tgt, mtp = models
    refs, stops, keeps = stop_case
    stop = StopStrings(stops, TABLE)
    res = generate(tgt, method_for(name, tgt, mtp), PROMPTS, 0.0, 40, stop=stop)
    check_cut(res, refs, keeps)
    check_cut(serve(tgt, method_for(name, tgt, mtp), PROMPTS, 3, 0.0, 40, stop=stop), refs, keeps)
    batches = []
    lagging(monkeypatch, batches)
    late = generate(tgt, method_for(name, tgt, mtp), PROMPTS, 0.0, 40, stop=stop)
    assert [(r.output_ids, r.accepted, r.stop_reason) for r in late] == [(r.output_ids, r.accepted, r.stop_reason)
                                                                         for r in res]
    assert int(batches[0].n_out[0]) > keeps[0]  # the device decoded past the stop; the record is cut exactly
    # dynamic batching with late copies: slots freed by stop strings are refilled
    check_cut(serve(tgt, method_for(name, tgt, mtp), PROMPTS, 1, 0.0, 40, stop=stop), refs, keeps)


def test_stop_strings_on_the_fast_engine(models, stop_case, monkeypatch):
    """The compiled engine's forwards (`fast.py`; engine "fast-eager": uncompiled, as CPU runs them) with stop strings:
    records cut exactly as on the HF layers, with late copies and with dynamic batching (the bookkeeping stage, graphed
    and compiled on CUDA, hands each round's tokens and appended counts to the host's matcher)."""
    tgt, mtp = models
    refs, stops, keeps = stop_case
    stop = StopStrings(stops, TABLE)
    m = method_for("zero_init_residual", tgt, mtp)
    check_cut(serve(tgt, m, PROMPTS, 1, 0.0, 40, stop=stop, engine="fast-eager"), refs, keeps)
    batches = []
    lagging(monkeypatch, batches)
    check_cut(generate(tgt, m, PROMPTS, 0.0, 40, stop=stop, engine="fast-eager"), refs, keeps)
    assert batches[0].engine == "fast-eager" and batches[0].cache.fast and int(batches[0].n_out[0]) > keeps[0]


def test_stop_at_the_first_token(models, stop_case):
    """A stop completed by the prefill's token: zero rounds, one token."""
    tgt, mtp = models
    refs, _, _ = stop_case
    stop = StopStrings([TABLE[refs[0][0]].decode()], TABLE)
    for name in ("ar", "zero_init_residual"):
        r = generate(tgt, method_for(name, tgt, mtp), PROMPTS[:1], 0.0, 40, stop=stop)[0]
        assert (r.output_ids, r.accepted, r.stop_reason) == (refs[0][:1], [], "stop")


# --- run_generate: the two evaluation modes ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def byte_models():
    """A one-byte-per-token tokenizer (so every 2-character stop string straddles two tokens) and a tiny target."""
    from test_datasets import byte_tokenizer

    from dmtp.models import tiny

    tok = byte_tokenizer(chat=False)
    tgt, mtp = tiny.build("qwen3", vocab=len(tok))
    return tok, tgt, mtp


def test_modes_records_identical_across_methods(byte_models, tmp_path):
    from dmtp.cli.main import main
    from dmtp.data.tokenizer import token_bytes
    from dmtp.engine.runner import cut_text, run_generate
    from dmtp.io import read_jsonl, write_jsonl

    tok, tgt, mtp = byte_models
    rows = [{"id": str(i), "prompt_ids": tok(p)["input_ids"]} for i, p in enumerate(["def f(x):\n", "class A:\n  ",
                                                                                      "x = [1, 2", "#"])]
    N = 30
    free = run_generate(tgt, build_method("ar", tgt), rows, 0.0, N, [], 4, tok=tok)
    table = token_bytes(tok)
    raw = [b"".join(table[t] for t in r["output_ids"]) for r in free]
    j = next(j for j in range(4, N - 1) if all(32 < c < 127 for c in raw[1][j: j + 2]))
    stops = [raw[1][j: j + 2].decode(), "\n\n\n"]
    eos = free[0]["output_ids"][5]
    want = []  # brute force on the free output: the first of end-of-text, a stop string, length (ties: that order)
    for r in free:
        ids, ends = r["output_ids"], [(N, 2, "length")]
        if eos in ids:
            ends.append((ids.index(eos) + 1, 1, "eos"))
        text = [b"".join(table[t] for t in ids[:n]) for n in range(N + 1)]
        ends += [(n, 0, "stop") for n in range(N + 1) if any(s.encode() in text[n] for s in stops)][:1]
        cut, _, reason = min(ends)
        want.append((ids[:cut], reason))
    assert {w[1] for w in want} == {"eos", "stop", "length"}  # the case covers all three endings
    for mode, kw in [("natural", {"stop_strings": stops}), ("fixed", {})]:
        recs = {}
        for name in ["ar", "mtp", "zero_init_residual"]:
            recs[name] = run_generate(tgt, method_for(name, tgt, mtp), rows, 0.0, N, [eos], 3, tok=tok, mode=mode,
                                      **kw)
            assert [(r["output_ids"], r["output_text"], r["stop_reason"], r["mode"]) for r in recs[name]] == \
                [(r["output_ids"], r["output_text"], r["stop_reason"], r["mode"]) for r in recs["ar"]]
        got = [(r["output_ids"], r["stop_reason"]) for r in recs["ar"]]
        if mode == "fixed":  # end-of-text ignored: exactly N tokens, the free output
            assert got == [(r["output_ids"], "length") for r in free]
            continue
        assert got == want
        for r in recs["zero_init_residual"]:
            text = tok.decode(r["output_ids"])
            assert r["output_text"] == (cut_text(text, stops) if r["stop_reason"] == "stop" else text)
            assert not any(s in r["output_text"] for s in stops)
            assert len(r["output_ids"]) <= 1 + sum(a + 1 for a in r["accepted"])
    # the CLI: --mode, --stop
    from dmtp.models import tiny

    path = tiny.save(tgt, mtp, tmp_path / "t")
    tok.save_pretrained(path)
    write_jsonl(tmp_path / "p.jsonl", rows)
    for mode, extra in [("natural", ["--stop", stops[0], "--stop", stops[1]]), ("fixed", [])]:  # ar
        main(["generate", "--target", str(path), "--method", "ar", "--prompts", str(tmp_path / "p.jsonl"),
              "--max-new-tokens", str(N), "--eos", str(eos), "--mode", mode, "--out", str(tmp_path / f"o_{mode}.jsonl"),
              *extra])
        cli = read_jsonl(tmp_path / f"o_{mode}.jsonl")  # one file per mode: a finished --out resumes its own
        assert [(r["output_ids"], r["stop_reason"]) for r in cli] == (got if mode == "fixed" else want)


def test_mode_errors(byte_models):
    from dmtp.engine.runner import run_generate

    tok, tgt, _ = byte_models
    rows = [{"id": "0", "prompt_ids": [5, 6]}]
    ar = build_method("ar", tgt)
    for kw, msg in [({"mode": "fixed", "stop_strings": ["\n"], "tok": tok}, "no stop strings"),
                    ({"stop_strings": ["\n"]}, "need the target's tokenizer"),
                    ({"mode": "greedy"}, "unknown evaluation mode 'greedy'")]:
        with pytest.raises(ValueError, match=msg):
            run_generate(tgt, ar, rows, 0.0, 4, [0], 1, **kw)


def test_end_of_text_ids_come_from_every_file_that_names_one(tmp_path):
    """config.json's eos_token_id, generation_config.json's (Qwen releases list `<|im_end|>` and `<|endoftext|>`
    there; the engines stop at each) and the tokenizer's, all of them; --eos replaces them."""
    import json
    from types import SimpleNamespace

    from dmtp.cli.args import eos_ids

    cfg, tok = SimpleNamespace(eos_token_id=3), SimpleNamespace(eos_token_id=5)
    assert eos_ids(None, cfg, tok, 10, tmp_path) == [3, 5]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 3]}))
    assert eos_ids(None, cfg, tok, 10, tmp_path) == [3, 5, 7]
    assert eos_ids("4", cfg, tok, 10, tmp_path) == [4] and eos_ids("none", cfg, tok, 10, tmp_path) == []
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 12}))
    with pytest.raises(ValueError, match=r"end-of-text id 12 \(.*generation_config.json.*\) outside the vocabulary"):
        eos_ids(None, cfg, tok, 10, tmp_path)
