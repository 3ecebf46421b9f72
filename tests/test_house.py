"""The house's structure as docs/DESIGN.md states it ("Layering and the experiment object", "Function length"):
the library imports neither the command layer nor the named profiles; nothing in `dmtp/` imports `experiments/`, so
the installed `dmtp` command runs from the `dmtp` package alone; no module imports another's private name; no
function of `dmtp/` is longer than 80 lines but the exceptions DESIGN names; references to the method point to
docs/METHOD.md's sections. Each offence is named by file and line."""
import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]
ABOVE = ("dmtp.cli", "dmtp.profiles")  # above the library: the library imports neither
LONGEST = 80  # lines a function of dmtp/ may have (def to last line, docstring included)


def _modules() -> dict[str, Path]:
    """Module name -> file, for every module of dmtp/."""
    out = {}
    for path in sorted((ROOT / "dmtp").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(path: Path):
    """(line, module, names) of every import of a file, those inside functions too; `from a import b` where a.b is a
    module counts as an import of a.b."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, ()
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [a.name for a in node.names if f"{node.module}.{a.name}" in MODULES]
            for s in subs:
                yield node.lineno, f"{node.module}.{s}", ()
            yield node.lineno, node.module, tuple(a.name for a in node.names if a.name not in subs)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_library_imports_neither_the_commands_nor_the_profiles():
    bad = [f"{path.relative_to(ROOT)}:{line} imports {mod}"
           for name, path in MODULES.items() if not any(_under(name, a) for a in ABOVE)
           for line, mod, _ in _imports(path) if any(_under(mod, a) for a in ABOVE)]
    assert not bad, "\n".join(bad)


def test_nothing_in_dmtp_imports_a_folder_pyproject_does_not_install():
    installed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert installed["include"] == ["dmtp*"]
    local = {p.name for p in ROOT.iterdir() if p.is_dir() and (any(p.glob("*.py")) or (p / "__init__.py").exists())}
    local -= {"dmtp"}
    assert "experiments" in local  # the check below means something
    bad = [f"{path.relative_to(ROOT)}:{line} imports {mod}" for path in MODULES.values()
           for line, mod, _ in _imports(path) if mod.split(".")[0] in local]
    assert not bad, "\n".join(bad)


def test_the_installed_command_imports_from_the_dmtp_package_alone(tmp_path):
    """Every module of the command layer imports in a process that sees the `dmtp` package and the installed
    dependencies only (no checkout root on the path), as `pip install .` leaves them."""
    (tmp_path / "dmtp").symlink_to(ROOT / "dmtp")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entry = sorted({v.split(":")[0] for v in scripts.values()})
    cli = sorted(m for m in MODULES if _under(m, "dmtp.cli") and not m.endswith("__main__"))
    code = (f"import sys; sys.path = [{str(tmp_path)!r}] + [p for p in sys.path if p not in ('', {str(ROOT)!r})]\n"
            + "".join(f"import {m}\n" for m in entry + cli + ["dmtp.profiles"])
            + "import dmtp; print(dmtp.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(tmp_path / "dmtp" / "__init__.py")


def test_no_module_imports_another_modules_private_name():
    bad = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        alias = {}  # local name -> a dmtp module it is bound to
        for line, mod, names in _imports(path):
            if mod in MODULES and mod != name:
                bad += [f"{path.relative_to(ROOT)}:{line} imports {mod}.{n}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                alias.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                              if f"{node.module}.{a.name}" in MODULES})
            elif isinstance(node, ast.Import):
                alias.update({a.asname: a.name for a in node.names if a.asname and a.name in MODULES})
        bad += [f"{path.relative_to(ROOT)}:{node.lineno} reads {alias[node.value.id]}.{node.attr}"
                for node in ast.walk(tree) if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in alias and alias[node.value.id] != name
                and node.attr.startswith("_") and not node.attr.startswith("__")]
    assert not bad, "\n".join(bad)


def _long_functions() -> dict[str, int]:
    """'file:function' -> lines, for every function of dmtp/ over `LONGEST` lines (methods as Class.method)."""
    out = {}
    for path in MODULES.values():
        def visit(node, prefix=""):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = child.end_lineno - child.lineno + 1
                    if n > LONGEST:
                        out[f"{path.relative_to(ROOT)}:{prefix}{child.name}"] = n
                    visit(child, f"{prefix}{child.name}.")
                elif isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
        visit(ast.parse(path.read_text()))
    return out


def _named_exceptions() -> set[str]:
    """The functions DESIGN's "Function length" section names as exceptions: `file:function` in backticks."""
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design.split("## Function length", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`(dmtp/[\w/]+\.py:[\w.]+)`", section))


def test_no_function_is_longer_than_80_lines_but_the_named_exceptions():
    long, named = _long_functions(), _named_exceptions()
    unnamed = [f"{f}: {n} lines" for f, n in sorted(long.items()) if f not in named]
    assert not unnamed, "longer than 80 lines, not named in DESIGN's 'Function length':\n" + "\n".join(unnamed)
    assert named <= set(long), f"DESIGN names exceptions that are no longer long: {sorted(named - set(long))}"
    cli = sorted(f for f in long if f.startswith("dmtp/cli/"))
    assert not cli, f"the command layer has no exception: {cli}"


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return [ROOT / p for p in out if not p.startswith("results/") and p != "LOG.md"]


def test_method_references_name_sections_of_method_md():
    """No reference to a spec outside the repository ("SPEC §6"); every `docs/METHOD.md, "Section"` names a
    section METHOD.md has."""
    sections = set(re.findall(r"^## (.+)$", (ROOT / "docs" / "METHOD.md").read_text(), re.M))
    assert {"One round", "The injection variants", "Training", "Metrics", "The blog's numbers"} <= sections
    bad = []
    for path in _tracked("*.py", "*.md", "*.json", "*.sh", "Makefile"):
        if not path.is_file() or path == Path(__file__):  # (this file names the patterns it looks for)
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{i}"
            if re.search(r"\bSPEC('s)? (§|\d)", line):
                bad.append(f"{where}: {line.strip()[:80]}")
            for name in re.findall(r'METHOD\.md, "([^"]+)"', line):
                if name not in sections:
                    bad.append(f"{where}: no section {name!r} in docs/METHOD.md")
    assert not bad, "\n".join(bad)
