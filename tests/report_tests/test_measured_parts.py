"""The report's predicted-against-measured table of the winner's step-time parts."""

from __future__ import annotations

from autotune.report.render import measured_parts_table
from autotune.report.render import verify_verdict


def test_predicted_beside_measured_parts_worked_by_hand() -> None:
    """Predicted bubble 0.1 + sends 0.05 = 0.15 s sits beside the measured pipeline 0.2 s
    (a recv waits for both); dp 0.3 + ZeRO-3 gathers 0.1 = 0.4 beside measured dp 0.35; data
    loading has no prediction."""
    record = {
        "predicted": {"step_time_s": 1.55, "time": {"parts": {
            "compute": 1.0, "pp_bubble": 0.1, "pp_p2p": 0.05, "dp_comm": 0.3,
            "zero3_gather": 0.1, "tp_comm": 0.0}}},
        "breakdown": {"parts": {"compute": 1.2, "pp_p2p": 0.2, "dp_comm": 0.35, "data": 0.01},
                      "step_time_s": 1.8, "unattributed_s": 0.04},
    }
    table = measured_parts_table(record)
    assert table is not None
    assert table.rows == [
        ["compute", "1.000", "1.200"],
        ["DP reduce + ZeRO gathers", "0.400", "0.350"],
        ["pipeline send/recv + bubble wait", "0.150", "0.200"],
        ["data loading", "–", "0.010"],
        ["not covered by a part", "", "0.040"],
        ["step time", "1.550", "1.800"],
    ]
    assert measured_parts_table({"predicted": record["predicted"]}) is None
    # a CPU trial measures ZeRO-3's gathers apart: 0.25 + 0.1 = 0.35 in the same row
    record["breakdown"]["parts"] |= {"dp_comm": 0.25, "zero3_gather": 0.1}
    table = measured_parts_table(record)
    assert table is not None and table.rows[1] == ["DP reduce + ZeRO gathers", "0.400", "0.350"]


def test_the_verify_verdict_states_the_result() -> None:
    ran = {"winner": "tp=2", "reference": "dp=2", "winner_losses": [9.0, 8.9, 8.8],
           "tolerance": 1e-4, "max_rel_diff": 2e-6, "passed": True, "reason": ""}
    assert verify_verdict(ran) == (
        "Loss curves agree: the winner (tp=2) against pure data parallelism (dp=2) over 3 "
        "measured steps, largest relative difference 2.0e-06 within the 0.0001 tolerance.")
    failed = verify_verdict({**ran, "passed": False, "reason": "loss at step 1 is 9.1"})
    assert failed.startswith("Loss curves DISAGREE") and failed.endswith("loss at step 1 is 9.1")
    assert verify_verdict(None) == ""
