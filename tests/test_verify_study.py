"""The verification-mode study end to end on CPU: `dmtp.cli.verify.study` on a tiny target with saved drafters
(records, throughput rows, resume), then its report section (tables, paired tests, figure)."""
import json
from dataclasses import replace

import pandas as pd
import pytest
from conftest import make_drafter

from dmtp.analysis.report import verify as report
from dmtp.cli import verify as study_cli
from dmtp.config import VerifyConfig
from dmtp.engine.stops import StopStrings
from dmtp.experiment import write_experiment
from dmtp.io import read_jsonl
from dmtp.models import tiny
from dmtp.schema import override
from dmtp.profiles import get_profile


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    tgt, mtp = tiny.build("qwen3_5", seed=0)
    root = tmp_path_factory.mktemp("vs")
    for v in ("dflash", "zero_init_residual"):
        make_drafter(tgt, v).save(root / "drafters" / v / "drafter")
    cfg = VerifyConfig(methods=("ar", "mtp", "dflash", "zero_init_residual"), temperatures=(1.0,), caps=(1, 2),
                      prompts=4, small_cap_prompts=2, repeats=2, max_new_tokens=8)
    prompts = [{"id": f"p{i}", "prompt_ids": p} for i, p in enumerate([[5, 7, 9], [4, 8], [10, 20, 30, 40], [33]])]
    out = root / "results" / "prof" / "verify"
    study_cli.study(tgt, mtp, root / "drafters", prompts, cfg, out, eos=[], mtp_steps=3)
    return tgt, mtp, root, cfg, prompts, out


def test_study_writes_records_and_throughput(done):
    _, _, _, cfg, prompts, out = done
    for m in cfg.methods:
        for v in cfg.modes:
            recs = read_jsonl(study_cli.group_path(out, m, v, 1.0))
            assert len(recs) == len(prompts) * cfg.repeats  # the largest cap, every repeat
            assert {r["verify"] for r in recs} == {v} and {r["method"] for r in recs} == {m}
            assert all(r["batch_cap"] == 2 and 1 <= len(r["output_ids"]) <= 8 for r in recs)
            k = {"ar": 0, "mtp": 3}.get(m, 7)
            assert all(r["n_candidates"] == k and all(0 <= a <= k for a in r["accepted"]) for r in recs)
    tp = pd.read_csv(out / "throughput.csv")
    assert len(tp) == len(cfg.methods) * len(cfg.modes) * len(cfg.caps) * cfg.repeats
    assert set(tp.requests[tp.batch_cap == 1]) == {2} and set(tp.requests[tp.batch_cap == 2]) == {4}
    assert (tp.tok_per_s > 0).all()


def test_study_resumes(done):
    tgt, mtp, root, cfg, prompts, out = done
    path = study_cli.group_path(out, "dflash", "block", 1.0)
    before = path.stat().st_mtime_ns
    study_cli.study(tgt, mtp, root / "drafters", prompts, cfg, out, eos=[], mtp_steps=3)
    assert path.stat().st_mtime_ns == before


def test_a_failing_group_does_not_stop_the_others(tmp_path):
    """A group that fails (here: a method without a saved drafter) is named in the error raised after the other
    groups have run and been written."""
    tgt, mtp = tiny.build("qwen3_5", seed=0)
    make_drafter(tgt, "dflash").save(tmp_path / "drafters" / "dflash" / "drafter")
    cfg = VerifyConfig(methods=("zero_init_residual", "dflash"), modes=("target",), temperatures=(1.0,), caps=(1,),
                       prompts=2, small_cap_prompts=1, repeats=1, max_new_tokens=4)
    prompts = [{"id": f"p{i}", "prompt_ids": p} for i, p in enumerate([[5, 7, 9], [4, 8]])]
    out = tmp_path / "verify"
    with pytest.raises(RuntimeError, match=r"1 verify-study group\(s\) failed.*\n  zero_init_residual target T=1"):
        study_cli.study(tgt, mtp, tmp_path / "drafters", prompts, cfg, out, eos=[], mtp_steps=3)
    assert len(read_jsonl(study_cli.group_path(out, "dflash", "target", 1.0))) == 2
    assert not study_cli.group_path(out, "zero_init_residual", "target", 1.0).exists()
    assert set(pd.read_csv(out / "throughput.csv").method) == {"dflash"}


def test_report_section(done):
    _, _, _, cfg, _, out = done
    lines = report.render(out.parent)
    s = pd.read_csv(out.parent / "tables" / "verify.csv")
    assert len(s) == len(cfg.methods) * len(cfg.modes)
    assert {"acceptance_length", "acceptance_length_lo", "per_verify", "first_token", "tok_s_B1", "tok_s_B2",
            "ceiling_target_only"} <= set(s.columns)
    assert (s[s.method == "ar"].ceiling_target_only == 1.0).all()
    assert (s.acceptance_length_lo <= s.acceptance_length + 1e-9).all()
    pt = pd.read_csv(out.parent / "tables" / "verify_paired.csv")
    assert len(pt) == 2 * 3 * 3  # 2 metrics x 3 drafting methods x 3 pairs
    assert (pt.p_holm >= pt.p - 1e-12).all()
    assert (out.parent / "figures" / "verify_T1.png").exists()
    text = "\n".join(lines)
    assert "Verification at T > 0" in text and "verify_T1.png" in text and "Paired tests" in text


def test_report_on_hand_made_records(tmp_path):
    """Hand-made counts: per-request acceptance pools a request's rounds over repeats; the ceiling comes from
    oracle.csv (position 0 = acceptance length) for target-only rows of the matching k."""
    base = tmp_path / "verify"
    rows = {"target": [[0, 1], [2]], "block": [[3, 1], [4]]}
    for v, accs in rows.items():
        d = base / "runs" / "dflash" / v
        d.mkdir(parents=True)
        lines = [{"id": f"r{i}", "temperature": 1.0, "n_candidates": 7, "accepted": a, "repeat": rep}
                 for rep in (0, 1) for i, a in enumerate(accs)]
        (d / "humaneval_T1.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    pd.DataFrame([{"temperature": 1.0, "k": 7, "position": 0, "ceiling": 2.5},
                  {"temperature": 1.0, "k": 7, "position": 1, "ceiling": 0.8}]).to_csv(base / "oracle.csv",
                                                                                       index=False)
    lines = "\n".join(report.render(tmp_path))
    s = pd.read_csv(tmp_path / "tables" / "verify.csv").set_index("verify")
    assert s.loc["target", "acceptance_length"] == pytest.approx((1.5 + 3.0) / 2)  # r0: 1 + 2/4, r1: 1 + 4/2
    assert s.loc["block", "per_verify"] == pytest.approx(1 + 16 / 6)
    assert s.loc["target", "first_token"] == pytest.approx(4 / 6)
    assert s.loc["target", "ceiling_target_only"] == 2.5
    text = (tmp_path / "tables" / "verify.md").read_text()  # the table file; the findings are in the section
    assert "Findings" in lines and "T=1, `dflash`: block > target (block − target +1.750" in lines
    assert "Requests without a verify round (their first token ended them; left out of the per-request numbers): 0." \
        in lines
    assert text.startswith("| temperature")


def test_report_findings_name_zero_round_requests_and_rows_above_the_ceiling(tmp_path):
    """A request with no verify round is named by id; a row whose whole interval lies above the target-only ceiling
    is named; a comparison the test does not resolve is worded as such."""
    base = tmp_path / "verify"
    accs = {"target": [[0]] * 6 + [[1]] * 2, "sample": [[6]] * 7 + [[]]}
    for v, a in accs.items():
        d = base / "runs" / "dflash" / v
        d.mkdir(parents=True)
        lines = [{"id": f"r{i}", "temperature": 1.0, "n_candidates": 7, "accepted": x, "repeat": 0}
                 for i, x in enumerate(a)]
        (d / "humaneval_T1.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    pd.DataFrame([{"temperature": 1.0, "k": 7, "position": 0, "ceiling": 2.0}]).to_csv(base / "oracle.csv",
                                                                                     index=False)
    text = "\n".join(report.render(tmp_path))
    assert "T=1 `dflash` sample 7.000 > 2.000" in text  # every sampled request accepted all 6: 7 tokens a round
    assert "`dflash` target" not in text.split("Above the target-only ceiling")[1].split("\n- ")[0]
    assert "left out of the per-request numbers): 1 — T=1 `dflash` sample: r7." in text
    assert "T=1, `dflash`: sample > target" in text


def test_profiles_carry_the_study():
    assert get_profile("mini").verify.temperatures == (0.6, 1.0)
    assert get_profile("mini").study.methods == ("ar", "mtp", "dflash", "fusion", "zero_init_residual")  # the spec's
    p = override(get_profile("smoke"), ["verify.temperatures=[1.0]", "verify.repeats=3"])
    assert p.verify.temperatures == (1.0,) and p.verify.repeats == 3
    with pytest.raises(ValueError, match=r'verify.modes=\["greedy"\]: expected a non-empty list, each item one of'):
        override(get_profile("smoke"), ['verify.modes=["greedy"]'])
    with pytest.raises(ValueError, match="caps=\\(0,\\)"):
        VerifyConfig(caps=(0,))
    assert get_profile("mini").verify.eval_mode == "natural"
    assert override(get_profile("mini"), ["verify.eval_mode=fixed"]).verify.eval_mode == "fixed"
    with pytest.raises(ValueError, match="verify.eval_mode=bogus: expected one of 'natural', 'fixed'"):
        override(get_profile("mini"), ["verify.eval_mode=bogus"])
    with pytest.raises(ValueError, match="verify.temperatures=0: expected a non-empty list, each item a finite number"):
        override(get_profile("mini"), ["verify.temperatures=0"])
    with pytest.raises(ValueError, match="verify.modes=.*named twice"):
        override(get_profile("mini"), ["verify.modes=block,block"])


def test_study_honours_the_evaluation_mode(done):
    """natural: a stop string ends a request and its record is cut right after the token that completes it (as
    `run_generate` cuts); fixed: end-of-text ignored, every request decodes exactly max_new_tokens."""
    tgt, mtp, root, _, prompts, _ = done
    table = [bytes([97 + t % 7, 97 + (t // 7) % 5]) for t in range(tgt.vocab_size)]  # two letters per token
    cfg = VerifyConfig(methods=("ar", "dflash"), modes=("target", "block"), temperatures=(1.0,), caps=(2,),
                       prompts=4, small_cap_prompts=2, repeats=1, max_new_tokens=24)
    out = root / "stopped"
    study_cli.study(tgt, mtp, root / "drafters", prompts, cfg, out, eos=[], mtp_steps=3,
                    stop=StopStrings(["a"], table))  # about a third of the tokens hold an "a"
    stopped = 0
    for m, v, t in study_cli.groups(cfg):
        for r in read_jsonl(study_cli.group_path(out, m, v, t)):
            text = [b"".join(table[x] for x in r["output_ids"][:n]) for n in (len(r["output_ids"]) - 1,
                                                                              len(r["output_ids"]))]
            assert r["mode"] == "natural" and b"a" not in text[0]  # no stop before the last token
            assert (b"a" in text[1]) == (r["stop_reason"] == "stop")
            assert r["stop_reason"] == "stop" or len(r["output_ids"]) == 24
            stopped += r["stop_reason"] == "stop"
    assert stopped > 0
    fixed = root / "fixed"
    study_cli.study(tgt, mtp, root / "drafters", prompts, replace(cfg, eval_mode="fixed"), fixed,
                    eos=list(range(tgt.vocab_size)), mtp_steps=3)  # every token is end-of-text: ignored
    for m, v, t in study_cli.groups(cfg):
        recs = read_jsonl(study_cli.group_path(fixed, m, v, t))
        assert all(len(r["output_ids"]) == 24 and r["mode"] == "fixed" for r in recs)


def test_report_orders_rows_by_the_experiment(done, tmp_path):
    """The report takes the study's method and mode order from experiment.json's `verify` section."""
    out = done[-1]
    p = override(get_profile("smoke"), ["verify.methods=zero_init_residual,dflash,mtp,ar",
                                        "verify.modes=block,sample,target"])
    write_experiment(out.parent / "experiment.json", p)
    try:
        report.render(out.parent)
        s = pd.read_csv(out.parent / "tables" / "verify.csv")
        assert list(dict.fromkeys(s.method)) == ["zero_init_residual", "dflash", "mtp", "ar"]
        assert list(s.verify[:3]) == ["block", "sample", "target"]
    finally:
        (out.parent / "experiment.json").unlink()


def test_generate_cli_takes_verify(tmp_path):
    """`dmtp generate --verify sample` on a saved checkpoint: the records say so; an unknown mode is refused."""
    from dmtp.cli.main import main

    tgt, mtp = tiny.build("qwen3_5", seed=0)
    path = tiny.save(tgt, mtp, tmp_path / "t")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [5, 7, 9]}\n{"id": "b", "prompt_ids": [4, 8]}\n')
    out = tmp_path / "o.jsonl"
    main(["generate", "--target", str(path), "--method", "mtp", "--prompts", str(prompts), "--temperature", "1",
          "--verify", "sample", "--max-new-tokens", "6", "--eos", "1", "--out", str(out)])
    recs = read_jsonl(out)
    assert [r["verify"] for r in recs] == ["sample", "sample"] and all(r["output_ids"] for r in recs)
    assert json.loads((tmp_path / "o.jsonl.meta.json").read_text())["config"]["verify"] == "sample"
    with pytest.raises(SystemExit):
        main(["generate", "--target", str(path), "--method", "mtp", "--prompts", str(prompts), "--verify", "nope",
              "--out", str(out)])
