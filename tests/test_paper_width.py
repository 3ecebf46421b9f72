"""The paper-width proof script (`experiments/paper_width.py`) end to end on the CPU at tiny width and depth: both
rows (activation checkpointing off and on) train through FSDP2 at world size 1 with the same losses, the memory
model's prediction beside them, the Gated DeltaNet path and timings recorded, the JSON and the table written."""
import json

import pytest

from experiments import paper_width


def test_paper_width_tiny_end_to_end(tmp_path):
    paper_width.main(["--tiny", "--out", str(tmp_path)])
    rec = json.loads((tmp_path / "paper_width.json").read_text())
    rows = rec["rows"]
    assert [(r["layers"], r["checkpointing"], r["ran"]) for r in rows] == [(8, False, True), (8, True, True)]
    assert rows[0]["losses"] == pytest.approx(rows[1]["losses"], rel=1e-6)  # recomputation changes no number
    for r in rows:
        assert len(r["losses"]) == 2 and r["step_s"] > 0 and r["feature_s"] > 0 and r["checkpoint_s"] >= 0
        assert r["predicted"]["total"] > r["predicted"]["target"] > 0
    assert rows[1]["predicted"]["layers"] < rows[0]["predicted"]["layers"]
    assert rec["kernels"]["gated_delta_rule"] in ("fla", "torch fallback") and rec["gdn_bench_s"]["torch"] > 0
    assert rec["setting"]["True"]["shard_drafters"] and rec["setting"]["True"]["world"] == 1
    assert rec["target_config"]["vocab_size"] == 248320 and rec["commit"] and rec["torch"]
    table = (tmp_path / "paper_width.md").read_text()
    assert "| 8 | off | yes |" in table and "| 8 | on | yes |" in table
