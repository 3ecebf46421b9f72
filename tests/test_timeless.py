"""The sources say what the code does, not when or on which borrowed machine it was found: (a) no word of how GPU
time is borrowed appears in README.md, docs/, the Makefile, dmtp/ or experiments/; (b) no comment or docstring in
dmtp/ or experiments/*.py names a realization (r7), a date or a LOG entry (LOG.md and the reports keep those).
Each hit is named by file and line."""
import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).parents[1]

# how GPU time is borrowed: none of these belongs in the project's sources or documentation
LENDING = [r"\ballotments?\b", r"\blease[ds]?\b", r"\bloans?\b", r"\blent\b", r"\blender\b", r"budget_left_s",
           r"files_at", r"\bgiven back\b", r"\btaken back\b", r"\bidle release\b", r"\$OUT\b", r"\bdevice commands?\b"]
HISTORY = [r"\br\d+\b", r"\b20\d\d-\d\d-\d\d\b", r"LOG\.md"]  # a realization, a date, a LOG entry


def _lending_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Makefile"]
    for d in ("docs", "dmtp", "experiments"):
        files += [p for p in (ROOT / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix in (".md", ".py", ".sh", ".txt", ".json", ".toml", ".yml", "")]
    return sorted(files)


def _notes(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file."""
    src = path.read_text()
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value,
                                                                                                   str):
                for i, line in enumerate(first.value.value.splitlines()):
                    out.append((first.lineno + i, line))
    return out


def test_no_lending_words_in_the_sources_and_docs():
    hits = []
    for f in _lending_files():
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            hits += [f"{f.relative_to(ROOT)}:{n}: {w!r} in {line.strip()[:100]!r}" for w in LENDING
                     if re.search(w, line, re.IGNORECASE)]
    assert not hits, "\n".join(hits)


def test_no_comment_or_docstring_names_a_realization_a_date_or_a_log_entry():
    files = sorted((ROOT / "dmtp").rglob("*.py")) + sorted((ROOT / "experiments").glob("*.py"))
    hits = []
    for f in files:
        for n, text in _notes(f):
            hits += [f"{f.relative_to(ROOT)}:{n}: {w!r} in {text.strip()[:100]!r}" for w in HISTORY
                     if re.search(w, text)]
    assert not hits, "\n".join(hits)
