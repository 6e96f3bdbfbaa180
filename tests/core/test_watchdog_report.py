"""The watchdog's report (``core/watchdog_report.py``): a rank's summary of its run, the slowest rank, the table."""

from __future__ import annotations

import math

from lightning_gpu_boost.core.watchdog_report import format_summary, nanmean, rank_summary, slowest


def test_a_ranks_summary_and_the_slowest_rank():
    totals = {"wait_ms": 300.0, "busy_ms": 700.0, "steps": 12, "starved_steps": 5}
    timeline = [{"step": 5, "gpu_util": 40.0, "gpu_mem_frac": 0.5}, {"step": 10, "gpu_util": 60.0}]
    s = rank_summary(totals, timeline, warmup_steps=2, between_s=1.0, validation_s=0.5, wall_s=10.0)
    assert s["data_wait_frac"] == 0.3 and s["step_ms"] == 70.0 and s["starved_frac"] == 0.5
    assert s["gpu_util"] == 50.0 and s["between_frac"] == 0.1 and s["validation_frac"] == 0.05
    other = dict(s, data_wait_frac=float("nan"))
    assert slowest([other, s]) == 1
    table = format_summary([s], "data-bound", ["set num_workers=8"])
    assert "0 | 12 | 50 % | n/a | n/a | 30 % | 70.0 | 50 % | 10 %" in table
    assert table.endswith("verdict: data-bound (slowest rank: 0); advice: (1) set num_workers=8")


def test_nanmean_ignores_missing_readings():
    assert nanmean([1.0, float("nan"), 3.0]) == 2.0 and math.isnan(nanmean([float("nan")]))


def test_a_worker_count_one_of_our_parts_chose_is_decided_again_not_advised():
    from lightning_gpu_boost.core.data_path import DataPath
    from lightning_gpu_boost.core.run_record import RunRecord
    from lightning_gpu_boost.core.verdicts import RunFacts
    from lightning_gpu_boost.core.watchdog_report import ask_again, host_message

    m = {"data_wait_frac": 0.01, "data_wait_ms": 0.5, "step_ms": 84.8, "gpu_util": 61.0, "gpu_mem_frac": 0.2}
    record = RunRecord()
    record.choose("num_workers", 16, by="AutoNumWorkers", why="measured",
                  decide_again=lambda proposal, reason, **evidence: (proposal, f"AutoNumWorkers decided again: 16 -> {proposal}"))
    facts = RunFacts(cuda=True, num_workers=16, usable_cpus=16, chosen_by=record.chosen_by())
    said = ask_again(DataPath(record), facts, m)  # the watchdog proposes through the path; the part decides
    assert said == "AutoNumWorkers decided again: 16 -> 15"
    message = host_message(m, facts, said)
    assert said in message and "set num_workers" not in message  # one voice: the part decides, nobody advises
    users = RunFacts(cuda=True, num_workers=16, usable_cpus=16)  # the user's own count: advised
    assert ask_again(DataPath(), users, m) is None and "set num_workers=15" in host_message(m, users)


def test_windows_that_disagree_are_phases_and_the_verdict_says_how_many_agree():
    from lightning_gpu_boost.core.watchdog_report import agreement, phases

    timeline = [{"step": 20.0, "verdict": "host-bound"}, {"step": 40.0, "verdict": "data-bound"},
                {"step": 60.0, "verdict": "data-bound"}, {"step": 80.0, "verdict": "data-bound"}, {"step": 90.0}]  # fmt: skip
    assert phases(timeline) == [{"verdict": "host-bound", "from_step": 0, "to_step": 20, "windows": 1},
                                {"verdict": "data-bound", "from_step": 20, "to_step": 80, "windows": 3}]  # fmt: skip
    assert agreement(timeline, "data-bound") == (3, 4)
    s = {"steps": 90.0, "data_wait_frac": 0.5, "data_wait_ms": 5.0, "step_ms": 5.0, "gpu_util": float("nan"),
         "gpu_mem_frac": float("nan"), "starved_frac": 0.7, "between_frac": 0.0, "validation_frac": 0.0}  # fmt: skip
    text = format_summary([s], "data-bound", ["x"], timeline, [{"said": "Tuner decided again: 4 -> 3."}])
    assert "verdict: data-bound (slowest rank: 0; 3 of 4 windows agree; phases: steps 0-20 host-bound, steps 20-80 " \
           "data-bound)\ndecided again: Tuner decided again: 4 -> 3.; advice: (1) x" in text


def test_the_runs_worker_and_download_readings_come_from_its_starved_windows_else_from_the_whole_run():
    from lightning_gpu_boost.core.verdicts import classify
    from lightning_gpu_boost.core.watchdog_report import rank_summary, summary_evidence

    totals = {"steps": 30, "wait_ms": 900.0, "busy_ms": 100.0, "starved_steps": 20}
    windows = [{"verdict": "remote-io-bound", "workers_busy": 0.1, "download_mb_s": 2.0},
               {"verdict": "ok", "workers_busy": 0.9, "download_mb_s": 0.0}]  # fmt: skip
    s = rank_summary(totals, windows, 10, 0.0, 0.0, 10.0, workers_busy=0.8, download_bytes_s=0.0)
    assert s["workers_busy"] == 0.1 and s["download_mb_s"] == 2.0  # where the steps waited
    assert classify(summary_evidence(s)) == "remote-io-bound"
    s = rank_summary(totals, [], 10, 0.0, 0.0, 10.0, workers_busy=0.1, download_bytes_s=3 * 2**20)
    assert s["workers_busy"] == 0.1 and s["download_mb_s"] == 3.0  # no window closed: the run's own
    assert classify(summary_evidence(s)) == "remote-io-bound"
    assert classify(summary_evidence(rank_summary(totals, [], 10, 0.0, 0.0, 10.0))) == "data-bound"


def test_a_starving_window_says_the_most_the_data_side_can_give():
    from lightning_gpu_boost.core.watchdog_report import upper_bound

    said = upper_bound({"data_wait_ms": 30.0, "step_ms": 10.0}, 64)
    assert said.startswith("Expected effect: 1,600 samples/s now") and "6,400 samples/s (4.0x)" in said
    assert upper_bound({"data_wait_ms": 30.0, "step_ms": 10.0}, None) is None
    assert upper_bound({"data_wait_ms": float("nan"), "step_ms": 10.0}, 64) is None


def _facts():
    from lightning_gpu_boost.core.verdicts import RunFacts

    return RunFacts(cuda=True, num_workers=15, usable_cpus=16)


def _summary() -> dict[str, float]:
    return {"steps": 375.0, "data_wait_frac": 0.18, "data_wait_ms": 18.0, "step_ms": 81.2, "gpu_util": 79.0,
            "gpu_mem_frac": 0.5, "starved_frac": 0.16, "between_frac": 0.02, "validation_frac": 0.0}  # fmt: skip


def _phase_run(link_windows: range = range(3, 9)) -> list[dict]:
    """A stream's run as the H100 saw it: a first epoch that waited on the link, then a warm epoch at the GPU's pace
    (windows of 20 steps)."""
    timeline, step = [], 0
    for i in range(19):
        step += 20
        link = i in link_windows
        timeline.append({"step": float(step), "verdict": "remote-io-bound" if link else "ok",
                         "data_wait_frac": 0.65 if link else 0.02, "data_wait_ms": 120.0 if link else 1.0,
                         "step_ms": 64.0, "gpu_util": 30.0 if link else 98.0, "gpu_mem_frac": 0.5,
                         "workers_busy": 0.3 if link else None, "download_mb_s": 130.0 if link else None})  # fmt: skip
    return timeline


def test_a_run_of_phases_takes_the_verdict_of_the_phase_that_took_most_time_not_the_average_of_all():
    from lightning_gpu_boost.core.verdicts import Evidence, advise, classify
    from lightning_gpu_boost.core.watchdog_report import run_verdict, time_shares

    timeline = _phase_run()
    # the whole run's averages: a wait under the data threshold and a utilization under the busy one
    whole = Evidence(data_wait_frac=0.18, step_ms=81.2, data_wait_ms=18.0, gpu_util=79.0, between_frac=0.02)
    assert classify(whole, include_between=True) == "host-bound"  # a verdict no window had
    shares = time_shares(timeline)
    assert shares["remote-io-bound"] > 0.5 > shares["ok"] and math.isclose(sum(shares.values()), 1.0)
    verdict, e, share = run_verdict("host-bound", whole, timeline)
    assert verdict == "remote-io-bound" and share == shares["remote-io-bound"]
    close = math.isclose
    assert close(e.data_wait_frac, 0.65) and close(e.gpu_util, 30.0) and e.between_frac == 0.02  # the phase's own
    assert close(e.download_bytes_s, 130.0 * 2**20) and close(e.workers_busy, 0.3)
    assert classify(e) == "remote-io-bound"  # the advice reads figures that say what the verdict says
    assert "host-bound" not in " ".join(advise(verdict, _facts(), e))
    summary = format_summary([_summary()], verdict, ["x"], timeline)
    assert f"6 of 19 windows agree, {100 * share:.0f} % of their time" in summary


def test_the_whole_runs_verdict_stands_where_its_windows_hold_most_of_the_time_and_for_time_outside_the_steps():
    from lightning_gpu_boost.core.verdicts import Evidence
    from lightning_gpu_boost.core.watchdog_report import run_verdict

    timeline = _phase_run()
    whole = Evidence(data_wait_frac=0.3, step_ms=64.0, data_wait_ms=27.0, gpu_util=60.0)
    assert run_verdict("remote-io-bound", whole, timeline)[:2] == ("remote-io-bound", whole)
    assert run_verdict("between-steps", whole, timeline)[:2] == ("between-steps", whole)
    assert run_verdict("ok", whole, [])[:3] == ("ok", whole, None)  # no window judged: nothing to weigh


def test_a_phase_of_problem_that_holds_a_quarter_of_the_run_is_not_hidden_by_a_longer_ok_phase():
    from lightning_gpu_boost.core.verdicts import Evidence
    from lightning_gpu_boost.core.watchdog_report import PROBLEM_SHARE, run_verdict, time_shares

    whole = Evidence(data_wait_frac=0.15, step_ms=64.0, data_wait_ms=11.0, gpu_util=78.0)
    shorter = _phase_run(range(3, 7))  # four link-bound windows of 19
    assert PROBLEM_SHARE <= time_shares(shorter)["remote-io-bound"] < 0.5
    assert run_verdict("host-bound", whole, shorter)[0] == "remote-io-bound"
    brief = _phase_run(range(3, 4))  # one: under a quarter of the time, the run was at the GPU's pace
    assert time_shares(brief)["remote-io-bound"] < PROBLEM_SHARE
    assert run_verdict("host-bound", whole, brief)[0] == "ok"


def test_a_run_too_short_to_judge_says_so_and_shows_no_nan():
    from lightning_gpu_boost.core.verdicts import RunFacts
    from lightning_gpu_boost.core.watchdog_report import format_summary, judge_run

    nan = float("nan")
    short = {"steps": 5.0, "gpu_util": nan, "gpu_mem_frac": nan, "sm_active": nan, "mfu": nan, "data_wait_frac": nan,
             "data_wait_ms": nan, "step_ms": 0.0, "starved_frac": 0.0, "between_frac": 0.05, "validation_frac": 0.0}  # fmt: skip
    verdict, _, share, advice = judge_run([short], [], RunFacts(), 0.2, 80.0)
    assert verdict is None and share is None and advice[0].startswith("too short to judge: 5 steps")
    table = format_summary([short], verdict, advice)
    assert "nan" not in table and "verdict: too short to judge" in table and "0.0 |" not in table
