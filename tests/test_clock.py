"""The pipeline's wall-clock limit on hand-made clocks and cost files (dmtp/cli/clock.py)."""
import json

import pytest

from dmtp.cli.clock import TIMES, Deadline, read_costs, record_cost


def test_the_time_left_counts_from_the_start_less_the_reserve():
    now = [10.0]
    d = Deadline(100, reserve_s=30, clock=lambda: now[0])
    assert d.left() == 70 and d.fits(70) and not d.fits(71) and d.fits(None)  # an unknown cost is started
    now[0] = 90.0
    assert d.left() == -10 and not d.fits(0)
    free = Deadline(None)
    assert free.left() == float("inf") and free.fits(1e12)
    free.arm()  # no limit: nothing armed
    free.disarm()


@pytest.mark.parametrize("limit, reserve, word", [(0, 30, "--deadline"), (-5, 30, "--deadline"), (10, -1, "--reserve")])
def test_a_bad_limit_is_refused(limit, reserve, word):
    with pytest.raises(ValueError, match=word):
        Deadline(limit, reserve)


def test_costs_are_the_longest_measured_times_overridden_by_declared_ones(tmp_path):
    record_cost(tmp_path, "target", 120.0)
    record_cost(tmp_path, "target", 3.0)  # a rerun that only skipped finished work keeps the longer time
    record_cost(tmp_path, "curve", 40.04)
    assert json.loads((tmp_path / TIMES).read_text()) == {"target": 120.0, "curve": 40.0}
    (tmp_path / "declared.json").write_text('{"curve": 500, "verify": 900}')
    assert read_costs(tmp_path, tmp_path / "declared.json") == {"target": 120.0, "curve": 500.0, "verify": 900.0}
    assert read_costs(tmp_path / "none") == {}
    for bad in ('["curve"]', '{"curve": -1}', '{"curve": "long"}', "{curve"):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(ValueError, match="--costs .*bad.json"):
            read_costs(tmp_path, tmp_path / "bad.json")


def test_a_damaged_stage_times_file_is_named(tmp_path):
    """The measured times (work/<folder>/stage_times.json) and a declared file are read alike: a cost that is not a
    finite number of seconds >= 0 (text, true, infinity, negative) is one line naming the file and the stage."""
    for bad in ('{"curve": "slow"}', '{"curve": true}', '{"curve": Infinity}', '{"curve": -3}'):
        (tmp_path / TIMES).write_text(bad)
        with pytest.raises(ValueError, match=f"{TIMES}: stage 'curve': .*: expected a JSON object stage -> seconds "
                                             r"\(numbers >= 0\); remove it"):
            read_costs(tmp_path)
        with pytest.raises(ValueError, match=f"{TIMES}: stage 'curve'"):
            record_cost(tmp_path, "target", 1.0)
        (tmp_path / "declared.json").write_text(bad)
        with pytest.raises(ValueError, match=r"--costs .*declared.json: stage 'curve'"):
            read_costs(tmp_path / "none", tmp_path / "declared.json")
