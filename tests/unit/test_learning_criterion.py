from learning import learned


def test_a_run_that_rises_and_holds_passes_a_flat_or_late_one_does_not() -> None:
    ci_run = [0.56, 0.41, 0.56, 0.72, 0.78, 0.91, 0.94, 0.47, 0.81, 0.50]  # learned, then one dip
    assert learned(ci_run)[0]
    assert not learned([0.5, 0.4, 0.6, 0.5, 0.45, 0.55, 0.5, 0.6, 0.4, 0.5])[0]
    assert not learned([0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.5, 1.0])[0]  # two late steps are not a rise
    ok, why = learned([0.3, 0.3, 0.3])
    assert not ok and why == "3 steps: need at least 7"
