"""No silent wrong result at the edges, one test per class: non-finite logits whatever made them (every decode's first
forward, every training loss), the identity of an input (a lock through a symlink), writes that fail naming their
cause, weight files readable by others, provenance that counts source files only. The bad-input table
(test_bad_inputs.py) holds the command-line cases of the same classes."""
import copy
import errno
import json
import os
import subprocess

import pytest
import torch

from dmtp.engine.decode import generate
from dmtp.engine.methods import build_method
from dmtp.engine.server import serve
from dmtp.models import tiny


BAD = 77  # the token whose embedding is NaN in `nan_on`


@pytest.fixture(scope="module")
def nan_on():
    """A tiny full-attention target whose forward is NaN on prompts holding token BAD (its embedding row NaN: the
    load-time weight check would refuse it, a decode of a target built in memory is not checked there), finite on
    the others: what a degenerate RoPE or an overflow makes, on chosen requests."""
    tgt, mtp = copy.deepcopy(tiny.build("qwen3", seed=0))
    with torch.no_grad():
        tgt.body.embed_tokens.weight[BAD] = float("nan")
    return tgt, mtp


LONG = [list(range(60, 90)), list(range(70, 95))]  # both hold BAD


@pytest.mark.parametrize("engine", ["hf", "fast-eager"])
def test_first_forward_not_finite_is_refused(nan_on, engine):
    """generate, on every CPU engine, every kind of method: one error naming non-finite logits, no records."""
    tgt, mtp = nan_on
    for name in ("ar", "mtp"):
        m = build_method(name, tgt, mtp=mtp)
        with pytest.raises(ValueError, match="first forward of a decode .* non-finite logits"):
            generate(tgt, m, LONG, 0.0, 8, engine=engine)


@pytest.mark.parametrize("engine", ["hf", "fast-eager"])
def test_first_forward_not_finite_is_refused_in_serve(nan_on, engine):
    """The server path: a newcomer whose prompt pass is NaN (a long prompt; the short one before it stays finite)
    joins a running batch and is refused before its record is returned; the first group alike."""
    from dmtp.config import EngineConfig

    tgt, _ = nan_on
    eng = EngineConfig(engine=engine, prefill="graphed")
    short = [3, 4, 5, 6]
    with pytest.raises(ValueError, match="non-finite logits"):
        serve(tgt, build_method("ar", tgt), [short, LONG[0]], 1, 0.0, 4, engine=eng)
    with pytest.raises(ValueError, match="non-finite logits"):
        serve(tgt, build_method("ar", tgt), LONG, 2, 0.0, 4, engine=eng)
    assert serve(tgt, build_method("ar", tgt), [short, short[:3]], 1, 0.0, 4, engine=eng)[1].output_ids


def test_finite_decode_unchanged(models):
    """The check changes nothing on a sound target (the same tokens as without it: greedy HF)."""
    from conftest import hf_greedy

    tgt, mtp = models
    res = generate(tgt, build_method("mtp", tgt, mtp=mtp), LONG, 0.0, 6)
    for r, p in zip(res, LONG):
        assert r.output_ids == hf_greedy(tgt, p, 6)[: len(r.output_ids)]


# --- every training loss ---------------------------------------------------------------------------------------------
def _nan_target(vocab=40):
    """A tiny trainable target + MTP whose final norm is NaN: every loss non-finite from the first step."""
    from dmtp.config import TargetArch
    from dmtp.training.pretrain import build_target

    torch.manual_seed(0)
    tgt, mtp = build_target(TargetArch(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=16, intermediate_size=64), vocab, eos_id=0)
    with torch.no_grad():
        tgt.body.norm.weight.fill_(float("nan"))
    return tgt, mtp


def test_pretraining_with_a_nan_loss_is_refused(tmp_path):
    """Pretraining: refused at the first log step after the NaN (log_every 3: the flag kept over steps 1 and 2),
    before the state of that step is saved."""
    import numpy as np

    from dmtp.config import PretrainConfig
    from dmtp.training.pretrain import pretrain

    tgt, mtp = _nan_target()
    tokens = np.random.default_rng(0).integers(1, 40, 4000).astype(np.int64)
    cfg = PretrainConfig(tokens=4 * 16 * 4, seq_len=16, batch_size=4, log_every=3, save_every=100, bf16=False,
                         compile="off", fused_ce="off")
    with pytest.raises(ValueError, match=r"target pretraining .*: the training loss is not finite \(NaN or "
                                         r"infinity\) by step 1 .*likely cause: the target's forward"):
        pretrain(tgt, mtp, tokens, cfg, tmp_path / "p", log=lambda *_: None)
    assert not (tmp_path / "p" / "pretrain_state.pt").exists()


def test_unlikelihood_with_a_nan_loss_is_refused():
    import numpy as np

    from dmtp.config import PretrainConfig
    from dmtp.training.unloop import unloop

    tgt, mtp = _nan_target()
    tokens = np.random.default_rng(0).integers(1, 40, 4000).astype(np.int64)
    cfg = PretrainConfig(tokens=4000, seq_len=16, batch_size=4, log_every=2, unloop_steps=3, unloop_every=10,
                         unloop_prompts=4, unloop_prompt_len=8, unloop_new=4, unloop_batch=2, bf16=False,
                         fused_ce="off")
    with pytest.raises(ValueError, match="unlikelihood fine-tuning of the target: the training loss is not finite"):
        unloop(tgt, mtp, tokens, cfg, eos_id=0, log=lambda s: None)


def test_drafter_training_with_a_nan_loss_is_refused(models, tmp_path):
    """A drafter whose loss turns NaN between log steps (its norm weight NaN from step 2 on): refused at the log
    step, no DONE and no final checkpoint."""
    from conftest import token_seqs

    from dmtp.config import TrainConfig
    from dmtp.training.drafters import new_drafters, train_drafters

    tgt, mtp = models
    base = dict(hidden_size=tgt.hidden_size, vocab_size=tgt.vocab_size, num_target_layers=tgt.num_layers,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
                mask_token_id=2, seed=1)
    ds = new_drafters(tgt, ["dflash"], base)
    cfg = TrainConfig(steps=4, batch_size=4, max_len=40, anchors_per_seq=5, log_every=4, save_every=100,
                      compile="off")
    d = ds["dflash"]
    hook = d.norm.register_forward_hook(lambda m, i, o: o * float("nan") if m.training and hook.calls.append(1)
                                        is None and len(hook.calls) == 2 else o)
    hook.calls = []
    with pytest.raises(ValueError, match=r"drafter training .*dflash: the training loss is not finite .* by step 4"):
        train_drafters(tgt, mtp, ds, token_seqs(), cfg, tmp_path, log=lambda *_: None)
    assert not (tmp_path / "dflash" / "DONE").exists() and not (tmp_path / "dflash" / "drafter").exists()


# --- the identity of an input is its resolved file -----------------------------------------------------------------
def test_one_writer_holds_the_file_not_the_path(tmp_path, monkeypatch):
    """A second writer of one file through a symlink, a `..` path or a relative path is refused."""
    from dmtp.io import Busy, one_writer

    (tmp_path / "a").mkdir()
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "a" / "o.jsonl")
    monkeypatch.chdir(tmp_path / "a")
    with one_writer(tmp_path / "a" / "o.jsonl"):
        for other in (tmp_path / "link.jsonl", tmp_path / "a" / ".." / "a" / "o.jsonl", "o.jsonl"):
            with pytest.raises(Busy, match="being written by pid"):
                with one_writer(other):
                    pass
    with one_writer(tmp_path / "link.jsonl"):  # let go: free again
        pass


def test_an_output_with_other_names_is_refused(tmp_path, capsys):
    """A file reached through a hard link has no one resolved path: an output with other names is refused (one
    line, nothing written), so two writers through two of its names cannot both run; `dmtp generate` too."""
    from dmtp.cli.main import main
    from dmtp.io import Busy, one_writer

    (tmp_path / "o.jsonl").write_text("")
    os.link(tmp_path / "o.jsonl", tmp_path / "hard.jsonl")
    for name in ("o.jsonl", "hard.jsonl"):
        with pytest.raises(Busy, match=f"{name}: a file with 2 names \\(hard links\\)"):
            with one_writer(tmp_path / name):
                pass
    with pytest.raises(SystemExit) as e:
        main(["generate", "--target", str(tmp_path / "t"), "--method", "ar", "--prompts", str(tmp_path / "p.jsonl"),
              "--out", str(tmp_path / "hard.jsonl")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "hard.jsonl: a file with 2 names (hard links)" in err and "Traceback" not in err
    assert (tmp_path / "o.jsonl").read_text() == "" and not list(tmp_path.glob(".*lock"))


# --- every write failure names its cause ---------------------------------------------------------------------------
@pytest.fixture
def full(tmp_path):
    """A path whose writes fail as on a full disk (a symlink to /dev/full)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    p = tmp_path / "full.bin"
    p.symlink_to("/dev/full")
    return p


def test_a_full_disk_is_named(full, monkeypatch):
    from pathlib import Path

    from dmtp.io import append_jsonl, save_state, write_json

    with pytest.raises(OSError, match=f"{full}: cannot be written \\(No space left on device\\)") as e:
        save_state({"w": torch.zeros(100_000)}, full)  # torch's own writer would say "unexpected pos ..."
    assert e.value.errno == errno.ENOSPC
    with pytest.raises(OSError, match=f"{full}: cannot be written \\(No space left on device\\)"):
        append_jsonl(full, [{"id": "a"}])

    def no_space(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", no_space)
    with pytest.raises(OSError, match=r"meta.json: cannot be written \(No space left on device\)"):
        write_json(full.parent / "meta.json", {"a": 1})
    assert not list(full.parent.glob(".meta.json.*"))  # no temp file left


# --- every artifact readable by others ------------------------------------------------------------------------------
def test_every_weight_writer_leaves_files_readable(models, tmp_path):
    """save_target_with_mtp on its own, a target saved without its MTP head, a drafter's save, saved training state,
    the rehearsal's public-layout DFlash checkpoint, tokenizer and data sets: 0644 under umask 022 (the mode a plain
    open gives), never safetensors' or mkstemp's private 0600."""
    from conftest import make_drafter

    from dmtp.io import save_state
    from dmtp.models.mtp import save_target_with_mtp
    from experiments import reproduce_standin as S

    tgt, mtp = models
    mask = os.umask(0)
    os.umask(mask)
    want = 0o666 & ~mask
    save_target_with_mtp(tgt.model, mtp, tmp_path / "t")
    tiny.save(tgt, mtp, tmp_path / "nomtp", with_mtp=False)
    make_drafter(tgt, "dflash", layers=1).save(tmp_path / "d")
    save_state({"w": torch.zeros(3)}, tmp_path / "s.pt")
    S.public_dflash(tmp_path / "dflash", tmp_path / "t")
    S.save_tokenizer(S.tokenizer(), tmp_path / "t")
    S.write_sets(tmp_path / "data", n=2, n_train=2)
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert {"nomtp/model.safetensors", "dflash/model.safetensors", "data/HumanEval.jsonl.gz", "t/tokenizer.json",
            "s.pt"} <= {f.relative_to(tmp_path).as_posix() for f in files}
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in files} == {f.name: oct(want) for f in files}


# Every call in the library and the experiments that writes a file, found by its name: a pandas frame's to_*(path),
# a Path's write_text / write_bytes / touch, open(..., "w"/"a"/"x"/"+"), torch.save, np.save, savefig,
# save_pretrained, safetensors' save_file, shutil's copies, json.dump; the suite's own writers (a function of a dmtp
# or experiments module) are checked where they are defined.
_WRITE_METHODS = {"write_text", "write_bytes", "touch", "save_file", "savefig", "save_pretrained", "savez",
                  "savez_compressed", "tofile", "save", "to_csv", "to_json", "to_parquet", "to_pickle"}
_WRITE_FUNCS = {"save_file", "copyfile", "copy2", "copytree"}
_MODULE_WRITERS = {("shutil", "copy"), ("shutil", "copy2"), ("shutil", "copyfile"), ("shutil", "copytree"),
                   ("shutil", "move"), ("json", "dump"), ("pickle", "dump")}
# writers outside dmtp.io's helpers, each with why its file gets the helpers' modes
_WRITERS_ELSEWHERE = {
    ("dmtp/cli/args.py", "out_file"): "a probe: opens an existing output for append and writes nothing",
    ("dmtp/training/drafters.py", "_train"): "Drafter.save, whose atomic_dir is in dmtp/models/drafter.py",
}


def _file_writes(tree, library: set[str]):
    """(line, function, call) of each call in `tree` that writes a file outside dmtp.io's helpers: inside no
    `atomic_path` / `atomic_dir` (a name bound to their temp path, or derived from one, in the function or one around
    it names its target) and in no function that gives what it wrote the helpers' modes (`make_readable`)."""
    import ast

    def name(f):
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""

    def target(call):  # the expression naming the file a call writes, or None
        f, args = call.func, call.args
        first = args[0] if args else next((k.value for k in call.keywords if k.arg in ("path", "path_or_buf",
                                                                                         "file", "fname")), None)
        if name(f) == "open":
            mode = args[1] if len(args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
            writes = isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+")
            method = isinstance(f, ast.Attribute) and not (isinstance(f.value, ast.Name) and f.value.id in (
                "gzip", "tarfile", "bz2", "lzma", "io"))
            return (f.value if method else first) if writes else None
        if isinstance(f, ast.Name):
            return first if f.id in _WRITE_FUNCS else None
        if not isinstance(f, ast.Attribute):
            return None
        root = f.value
        while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
            root = root.func if isinstance(root, ast.Call) else root.value
        recv = root.id if isinstance(root, ast.Name) else None
        if recv in library:  # the suite's own writer, checked where it is defined
            return None
        if (recv, f.attr) in _MODULE_WRITERS:
            return args[1] if len(args) > 1 else first
        if f.attr in ("write_text", "write_bytes", "touch"):
            return f.value
        if f.attr in _WRITE_METHODS:
            return args[1] if recv == "torch" and len(args) > 1 else first
        return None

    writes, covered, inner = {}, set(), {}
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    def own(fn):  # the nodes of a scope, without the functions defined inside it
        todo = list(ast.iter_child_nodes(fn))
        while todo:
            n = todo.pop()
            if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield n
                todo.extend(ast.iter_child_nodes(n))

    for fn in [tree, *scopes]:  # outer scopes first: a write's function is the innermost around it
        body, mine = list(ast.walk(fn)), list(own(fn))
        readable = any(isinstance(n, ast.Call) and name(n.func) == "make_readable" for n in mine)
        binds = [(n.value, n.targets) if isinstance(n, ast.Assign) else (n.context_expr, [n.optional_vars])
                 for n in mine if isinstance(n, (ast.Assign, ast.withitem))]
        atomic = set()
        while True:  # names bound to an atomic temp path, or to something derived from one
            more = {t.id for val, tg in binds for g in tg if g is not None for t in ast.walk(g)
                    if isinstance(t, ast.Name) and any(isinstance(c, ast.Call) and name(c.func) in (
                        "atomic_path", "atomic_dir") or isinstance(c, ast.Name) and c.id in atomic
                        for c in ast.walk(val))}
            if more <= atomic:
                break
            atomic |= more
        for n in body:
            what = target(n) if isinstance(n, ast.Call) else None
            if what is None:
                continue
            writes[n], inner[n] = ast.unparse(n)[:80], getattr(fn, "name", "<module>")
            if readable or any(isinstance(x, ast.Name) and x.id in atomic for x in ast.walk(what)):
                covered.add(n)
    return sorted((n.lineno, inner[n], call) for n, call in writes.items() if n not in covered)


def test_every_file_writer_goes_through_the_io_helpers():
    """Every file the library and the experiments write is written through dmtp.io's helpers (atomic, and 0644 under
    umask 022: `_readable`), or given their modes after an outside writer (`make_readable`); a new writer anywhere is
    found by name, not only the ones known today. The exceptions are listed with their reason, and each must still
    exist."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    bad, seen = [], set()
    for path in sorted(p for d in ("dmtp", "experiments") for p in (root / d).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "dmtp/io.py":  # the helpers themselves
            continue
        tree = ast.parse(path.read_text())
        library = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) for a in getattr(n, "names", [])
                   if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in ("dmtp", "experiments")
                   or isinstance(n, ast.Import) and a.name.split(".")[0] in ("dmtp", "experiments")}
        for line, fn, call in _file_writes(tree, library):
            if (rel, fn) in _WRITERS_ELSEWHERE:
                seen.add((rel, fn))
            else:
                bad.append(f"{rel}:{line} ({fn}): {call}")
    assert not bad, "file writes outside dmtp.io's helpers:\n" + "\n".join(bad)
    assert seen == set(_WRITERS_ELSEWHERE), f"listed exceptions no longer found: {set(_WRITERS_ELSEWHERE) - seen}"


def test_a_cut_last_line_is_dropped_in_place(tmp_path):
    """drop_cut_line: a record file cut mid-line by a kill keeps its whole lines (read back in blocks from the end:
    a cut line longer than a block, a file without any newline, a whole file untouched)."""
    from dmtp.io import drop_cut_line

    f = tmp_path / "r.jsonl"
    whole = b'{"id": 1}\n{"id": 2}\n'
    for cut, dropped in ((b"", 0), (b'{"id": 3', 8), (b"x" * 200_000, 200_000)):
        f.write_bytes(whole + cut)
        assert drop_cut_line(f) == dropped and f.read_bytes() == whole
    f.write_bytes(b"no newline at all")
    assert drop_cut_line(f) == 17 and f.read_bytes() == b""


# --- provenance counts source files only ---------------------------------------------------------------------------
def test_a_run_rewriting_tracked_results_is_not_dirty(tmp_path):
    from dmtp.io import git_sha

    def git(*a):
        subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)

    for f in ("dmtp/x.py", "results/r/REPORT.md", "README.md", "pyproject.toml"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("1\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    (tmp_path / "results/r/REPORT.md").write_text("rerun\n")  # what a rerun of the pipeline rewrites
    (tmp_path / "README.md").write_text("edited\n")
    assert not git_sha(tmp_path).endswith("-dirty")
    (tmp_path / "dmtp/x.py").write_text("2\n")
    assert git_sha(tmp_path).endswith("-dirty")
    (tmp_path / "dmtp/x.py").write_text("1\n")
    (tmp_path / "pyproject.toml").write_text("2\n")
    assert git_sha(tmp_path).endswith("-dirty")


# --- --set is checked once, after every assignment -----------------------------------------------------------------
@pytest.mark.parametrize("sets", [
    ["pretrain.tokens=100", "pretrain.batch_size=1", "pretrain.seq_len=16", "pretrain.eval_tokens=100"],
    ["pretrain.seq_len=4096", "model.arch.max_position_embeddings=8192"],
    ["train.steps=5", "train.snapshots=[5]"],
])
def test_set_assignments_valid_together_in_any_order(sets):
    """Assignments valid only together pass whatever their order (each alone would break a rule across fields)."""
    from dmtp.schema import override
    from dmtp.profiles import get_profile

    base = get_profile("smoke")
    for order in (sets, sets[::-1]):
        p = override(base, order)
        for a in order:
            key, _, raw = a.partition("=")
            obj = p
            for part in key.split("."):
                obj = getattr(obj, part)
            assert str(obj).replace(" ", "").strip("()[],") == raw.strip("[]")


# --- realizations: a copy is not a second one, a folder without finished runs is none --------------------------------
SMALL = ["ar", "dflash", "zero_init_residual"]


def _realizations(res, ks):
    from dmtp.config.ablation import code
    from dmtp.analysis.report.synthetic import write_synthetic

    for k in ks:
        write_synthetic(code(), res, "p", n=6, temps=(0,), modes=("natural",), methods=SMALL, curve=False,
                        oracle=False, bench=False, realization=k)


def test_a_copied_realization_is_refused_naming_both(tmp_path):
    import shutil

    from dmtp.analysis.report import load

    _realizations(tmp_path, [1])
    shutil.copytree(tmp_path / "p" / "r1", tmp_path / "p" / "r2")  # the same records and seeds in another folder
    with pytest.raises(ValueError, match=r"p/r1 and .*p/r2 hold the same records \(digest [0-9a-f]+\): one "
                                         r"realization in two folders"):
        load("p", tmp_path, n_boot=50)
    exp = json.loads((tmp_path / "p" / "r2" / "experiment.json").read_text())
    (tmp_path / "p" / "r2" / "experiment.json").write_text(json.dumps({**exp, "realization": 2}))
    with pytest.raises(ValueError, match="hold the same records"):  # relabelled: still the same records
        load("p", tmp_path, n_boot=50)
    shutil.rmtree(tmp_path / "p" / "r2")
    _realizations(tmp_path, [2])
    (tmp_path / "p" / "r2" / "experiment.json").write_text(json.dumps({**exp, "realization": 1}))
    with pytest.raises(ValueError, match=r"r1 and .*r2 record the same seeds \(experiment.json realization 1\)"):
        load("p", tmp_path, n_boot=50)


def test_a_realization_without_finished_runs_is_not_counted(tmp_path):
    """r3 holds experiment.json and no run, r4 only a half-written run: neither is counted; the report's text and
    its tables say the same number of realizations."""
    import pandas as pd

    from dmtp.analysis.report import load, render_report

    _realizations(tmp_path, [1, 2])
    (tmp_path / "p" / "r3").mkdir()
    exp = (tmp_path / "p" / "r1" / "experiment.json").read_text()
    (tmp_path / "p" / "r3" / "experiment.json").write_text(exp.replace('"realization": 1', '"realization": 3'))
    _realizations(tmp_path, [4])
    for meta in (tmp_path / "p" / "r4" / "runs").rglob("*.meta.json"):
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "finished": False}))
    art = load("p", tmp_path, n_boot=50)
    assert [r.name for r in art.realizations] == ["r1", "r2"]
    assert [n for n, _ in art.left_out] == ["r3", "r4"] and all("no finished run" in w for _, w in art.left_out)
    text = render_report("p", tmp_path, art).read_text()
    assert "**2 realizations (r1, r2), pooled**" in text and "- r3: no finished run" in text
    assert set(art.natural.n_realizations) == {2}
    assert not any("3 realizations" in ln or "4 realizations" in ln for ln in text.splitlines())
    for name in ("ablation_humaneval.csv", "pairwise_T0.csv"):
        assert set(pd.read_csv(tmp_path / "p" / "tables" / name).n_realizations) == {2}


def test_the_verification_section_names_its_models(tmp_path):
    """The verification study's section names the commit its runs were made at, and says so in bold when its runs
    predate the realization's target (left from earlier models)."""
    from dmtp.analysis.report import verify
    from dmtp.analysis.report.synthetic import write_synthetic_verify

    root = write_synthetic_verify(tmp_path, "p", n=4, methods=("ar", "mtp"), temps=(1.0,), modes=("target",),
                                  caps=(1,))
    assert verify.made_by(root) == "Models: no recorded commit (the study's runs have no meta files beside them)."
    for f in (root / "verify" / "runs").glob("*/*/*.jsonl"):
        f.with_suffix(".meta.json").write_text(json.dumps({"env": {"git_sha": "abc123"},
                                                           "written": "2026-01-02T00:00:00+0000"}))
    (root / "target").mkdir()
    (root / "target" / "meta.json").write_text(json.dumps({"written": "2026-01-01T00:00:00+0000"}))
    line = verify.made_by(root)
    assert line.startswith("Models: the study's runs at abc123, written 2026-01-02") and "earlier" not in line
    (root / "target" / "meta.json").write_text(json.dumps({"written": "2026-03-01T00:00:00+0000"}))
    section = verify.render(root, n_boot=50)
    assert section[2].startswith("Models: the study's runs at abc123") and "**Left from earlier models**: these " \
        "runs predate its target (written 2026-03-01T00:00:00+0000)" in section[2]


def test_a_full_disk_inside_a_checkpoint_write_is_named(models, tmp_path, monkeypatch):
    """save_pretrained's safetensors error on a full disk, inside the target stage's atomic folder and from
    save_target_with_mtp on its own: one OSError naming the checkpoint and "No space left on device"."""
    import safetensors
    import safetensors.torch

    from dmtp.io import atomic_dir
    from dmtp.models.mtp import save_target_with_mtp

    def full(*a, **k):
        raise safetensors.SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                          'message: "No space left on device" })')

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    import transformers.modeling_utils as mu
    monkeypatch.setattr(mu, "safe_save_file", full, raising=False)
    tgt, mtp = models
    with pytest.raises(OSError, match=r"/t: cannot be written \(No space left on device\)"):
        save_target_with_mtp(tgt.model, mtp, tmp_path / "t")
    with pytest.raises(OSError, match=r"/target: cannot be written \(No space left on device\)"):
        with atomic_dir(tmp_path / "target") as tmp:
            save_target_with_mtp(tgt.model, mtp, tmp)
    assert not (tmp_path / "target").exists()


def test_a_training_continued_from_a_repointed_symlink_is_another_configuration(tmp_path, capsys):
    """`dmtp train --init-from V=LINK`: the fingerprint holds the file LINK resolves to (and when it was written),
    not the path as typed, so a LINK pointing at another checkpoint is another configuration, refused."""
    import shutil

    from dmtp.cli.main import main as dmtp

    tgt, mtp = tiny.build("qwen3_5", seed=0)
    tiny.save(tgt, mtp, tmp_path / "target")
    d = tiny.drafter(tgt, "dflash", layers=1)
    d.save(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the same bytes and times, another file
    (tmp_path / "link").symlink_to(tmp_path / "a")
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"ids": list(range(3, 30))}) + "\n" for _ in range(4)))
    argv = ["train", "--target", str(tmp_path / "target"), "--data", str(tmp_path / "data.jsonl"), "--out",
            str(tmp_path / "out"), "--variants", "dflash", "--init-from", f"dflash={tmp_path / 'link'}", "--steps", "1",
            "--batch-size", "2", "--layers", "1", "--mask-token-id", "2"]
    dmtp(argv)
    dmtp(argv)  # the same file: nothing to train
    assert "nothing to train" in capsys.readouterr().out
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to(tmp_path / "b")
    with pytest.raises(SystemExit):
        dmtp(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "made with another configuration" in err and "(init_from: " in err, err


def test_every_report_reader_refuses_a_half_written_run(tmp_path):
    """The verification study's and the learning curve's readers refuse a run file whose meta says finished: false,
    as the runs' reader does (one rule, io.check_finished)."""
    from dmtp.config.ablation import code
    from dmtp.analysis.report import verify
    from dmtp.analysis.report.data import read_curve
    from dmtp.analysis.report.synthetic import write_synthetic, write_synthetic_verify

    root = write_synthetic_verify(tmp_path, "v", n=3, methods=("ar", "mtp"), temps=(1.0,), modes=("target",),
                                  caps=(1,))
    run = next((root / "verify" / "runs").glob("*/*/*.jsonl"))
    run.with_suffix(".meta.json").write_text(json.dumps({"finished": False}))
    with pytest.raises(ValueError, match=f"{run}: half-written .*says finished: false"):
        verify.read(root)
    cur = write_synthetic(code(), tmp_path, "c", n=3, temps=(0,), modes=("natural",), methods=["ar", "dflash"],
                          curve=True, oracle=False, bench=False)
    f = next((cur / "curve").glob("*/*.jsonl"))
    meta = f.with_name(f.name.replace(".jsonl", ".meta.json"))
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "finished": False}))
    with pytest.raises(ValueError, match="half-written"):
        read_curve(cur)


@pytest.mark.parametrize("name,rows,msg", [
    ("mtbench", [{"question_id": 1, "category": "x", "turns": ["Write a poem."]}], "row 1: `turns` (or `prompt`) = "
     "\"['Write a poem.']\": expected MT-Bench's two user turns, a list of two strings"),
    ("mtbench", [{"question_id": 1, "category": "x", "turns": []}], "row 1: `turns` (or `prompt`) = '[]': expected"),
    ("mtbench", [{"question_id": 1, "category": "x", "turns": "Write a poem."}], "expected MT-Bench's two user turns"),
    ("mtbench", [{"question_id": 1, "category": "x", "turns": ["a", None]}], "row 1, turn 2: 'None': expected "
     "non-empty text"),
    ("humaneval", [{"task_id": "H/0", "prompt": "def f():\n"}, {"task_id": "H/0", "prompt": "def g():\n"}],
     "row 2: id 'H/0' already used by row 1"),
    ("humaneval", [{"task_id": "H/0", "prompt": ""}], "row 1: `prompt` = '': expected non-empty text"),
    ("gsm8k", [{"question": None, "answer": "#### 4"}], "row 1: `question` = 'None': expected non-empty text"),
])
@pytest.mark.parametrize("reader", ["load_prompts", "text_prompts"])
def test_a_published_set_row_of_another_shape_is_named(tmp_path, name, rows, msg, reader):
    """A local copy of a published set whose row holds a null, empty or mistyped field, MT-Bench without its two
    turns, or an id an earlier row has: one error naming the file and row (before, a traceback, or prompts silently
    dropped, repeated or split into characters), through the templated and the plain-text reader alike."""
    from dmtp.data import datasets as D

    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    def tok(text, add_special_tokens):  # a plain tokenizer (no chat template): one id a character
        return {"input_ids": [ord(c) % 96 for c in text]}

    call = (lambda: D.load_prompts(name, tok, path=path)) if reader == "load_prompts" else \
        (lambda: D.text_prompts(name, path=path))
    with pytest.raises(ValueError) as e:
        call()
    assert f"dataset {name!r} from {path}" in str(e.value) and msg in str(e.value), e.value


@pytest.mark.parametrize("name,raw", [("HumanEval.jsonl.gz", "cut"), ("HumanEval.jsonl.gz", "plain"),
                                      ("test.parquet", "cut")])
def test_an_unreadable_local_copy_is_named(tmp_path, name, raw):
    """A truncated or mislabelled local copy (a .gz cut short or not compressed, a parquet cut short): one error
    naming the file and how it was read, not the reader's EOFError / gzip / arrow exception."""
    import gzip

    from dmtp.data import datasets as D

    body = json.dumps({"task_id": "H/0", "prompt": "def f():\n"}).encode() * 50
    full = gzip.compress(body) if name.endswith(".gz") else b"PAR1" + body + b"PAR1"
    (tmp_path / name).write_bytes(full[: len(full) // 2] if raw == "cut" else body)
    with pytest.raises(ValueError, match=f"{tmp_path / name}: cannot be read as "
                                         f"{'gzip-compressed text' if name.endswith('.gz') else 'parquet'} \\("):
        D.load_rows("humaneval", tmp_path / name)


def _store(tmp_path, edit_meta=None, edit_offsets=None, edit_tokens=None):
    import numpy as np

    from dmtp.data.tokens import STORE_FILE, convert

    tmp_path.mkdir(exist_ok=True)
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"ids": list(range(3, 12 + i))}) + "\n" for i in range(4)))
    d = convert(src, tmp_path / "store", 96)
    if edit_meta:
        meta = json.loads((d / STORE_FILE).read_text())
        edit_meta(meta)
        (d / STORE_FILE).write_text(json.dumps(meta))
    if edit_offsets:
        o = np.load(d / "offsets.npy")
        edit_offsets(o)
        np.save(d / "offsets.npy", o)
    if edit_tokens:
        t = np.fromfile(d / "tokens.bin", dtype="<u2")
        edit_tokens(t)
        t.tofile(d / "tokens.bin")
    return d


@pytest.mark.parametrize("edit,msg", [
    (dict(edit_meta=lambda m: m.update(sequences="4")), "store.json: damaged token store (fields ['sequences'] "
     "missing or of another type"),
    (dict(edit_meta=lambda m: m.pop("source")), "fields ['source'] missing"),
    (dict(edit_meta=lambda m: m.update(dtype="float32")), "dtype '<u2' or '<u4'"),
    (dict(edit_offsets=lambda o: o.__setitem__(slice(1, 3), o[[2, 1]])), "the offsets must rise from 0"),
    (dict(edit_offsets=lambda o: o.__setitem__(0, 3)), "the offsets must rise from 0"),
])
def test_a_hand_edited_token_store_is_refused(tmp_path, edit, msg):
    """A store whose index is mistyped, or whose offsets do not rise from 0 (sequences overlapping or cut: batches of
    the wrong tokens, silently), is refused on opening, naming it."""
    from dmtp.data.tokens import open_store

    with pytest.raises(ValueError, match="damaged token store") as e:
        open_store(_store(tmp_path, **edit), 96)
    assert msg in str(e.value), e.value


def test_a_token_store_whose_data_outgrew_its_index_is_named_when_read(tmp_path):
    """tokens.bin edited after conversion (store.json's max_id still in the vocabulary): refused when opened (its
    sha256 is not the one converted); a store that predates that record: the id outside the vocabulary is named
    when its sequence is read for a batch, not an IndexError (a device-side assert on a GPU) inside the embedding;
    an untouched store reads as converted."""
    import numpy as np

    from dmtp.data.tokens import TokenSequences, open_store

    ok = TokenSequences(open_store(_store(tmp_path / "a"), 96), max_len=64)
    assert [list(map(int, r)) for r in ok.rows(range(len(ok)))] == [list(range(3, 12 + i)) for i in range(4)]
    with pytest.raises(ValueError, match=r"store/tokens.bin: changed after conversion"):
        open_store(_store(tmp_path / "c", edit_tokens=lambda t: t.__setitem__(12, 500)), 96)
    old = _store(tmp_path / "b", edit_tokens=lambda t: t.__setitem__(12, 500),
                 edit_meta=lambda m: [m.pop("tokens_sha256"), m.pop("offsets_sha256")])
    seqs = TokenSequences(open_store(old, 96), 64)
    assert np.asarray(seqs.rows([0])[0]).max() < 96  # the sequence before the edited one reads
    with pytest.raises(ValueError, match=r"store: sequence 1 holds token id 500 outside the target's vocabulary "
                                         r"\[0, 96\), while store.json says max_id 14"):
        seqs.rows([0, 1])


@pytest.mark.parametrize("line", ['{"id": "b", "prompt_ids": [1, 2\n', '{"id": "b", "prompt_ids": [1]}\n'])
def test_a_shard_line_that_is_no_whole_record_is_named_at_merge(tmp_path, line):
    """A regeneration shard whose line opens with its id and ends with a newline but is no whole record (damaged,
    or without its fields): the merge names the shard, the byte and the id, and leaves no merged file."""
    from dmtp.cli.reproduce import merge_shards

    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "rank0-of-2.jsonl").write_text(json.dumps({"id": "a", "prompt_ids": [1], "output_ids": [2],
                                                          "stop_reason": "eos"}) + "\n")
    (shards / "rank1-of-2.jsonl").write_text(line)
    with pytest.raises(ValueError, match=r"rank1-of-2.jsonl: line at byte 0 \(id 'b'\) is not a whole regeneration "
                                         r"record \((JSONDecodeError|KeyError)"):
        merge_shards(shards, [{"id": "a"}, {"id": "b"}], tmp_path / "train.jsonl")
    assert not (tmp_path / "train.jsonl").exists()


def test_a_trainer_state_of_another_training_is_not_resumed(tmp_path, capsys):
    """trainer_state.pt copied in from a training of other settings (another learning rate): refused on resume,
    naming the state and the run's record, not continued as if it were this run's; the run's own state resumes."""
    import shutil

    from dmtp.cli.main import main as dmtp

    tgt, mtp = tiny.build("qwen3_5", seed=0)
    tiny.save(tgt, mtp, tmp_path / "target")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"ids": list(range(3, 30))}) + "\n" for _ in range(4)))

    def train(out, *extra):
        dmtp(["train", "--target", str(tmp_path / "target"), "--data", str(tmp_path / "d.jsonl"), "--out",
              str(tmp_path / out), "--mask-token-id", "2", "--steps", "3", "--batch-size", "2", *extra])

    train("a", "--stop-after", "1")
    train("b", "--stop-after", "1", "--lr", "1e-3")
    shutil.copy(tmp_path / "a" / "dflash" / "trainer_state.pt", tmp_path / "b" / "dflash" / "trainer_state.pt")
    with pytest.raises(SystemExit) as e:
        train("b", "--lr", "1e-3")
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "b/dflash/trainer_state.pt: saved by a training of another configuration" in err, err
    train("a")  # its own state: resumed and finished
    assert (tmp_path / "a" / "dflash" / "DONE").exists()


def test_a_token_store_of_another_vocabulary_is_refused(tmp_path):
    """A store converted for another target's vocabulary (its ids all below this one's: they would train, silently,
    as another tokenizer's tokens) is refused naming both sizes; one converted without a vocabulary is not."""
    from dmtp.data.tokens import open_store

    d = _store(tmp_path, edit_meta=lambda m: m.update(vocab_size=260))
    with pytest.raises(ValueError, match=r"store: a token store converted for a vocabulary of 260 \(store.json "
                                         r"vocab_size\), the target's is 96"):
        open_store(d, 96)
    unbound = _store(tmp_path / "none", edit_meta=lambda m: m.update(vocab_size=None))
    assert open_store(unbound, 96).meta["sequences"] == 4
