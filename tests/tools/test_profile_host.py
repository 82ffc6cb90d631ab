"""scripts/bench/profile_host.py: the host part of a step, by phase, with the forwards left out."""

from tests.helpers.bench import load_bench


def test_profile_host_names_every_phase_and_leaves_the_forwards_out(tmp_path):
    mod = load_bench("profile_host")
    out = mod.main(["--model", "tiny", "--slots", "2", "--steps", "12", "--warmup", "3", "--out",
                    str(tmp_path / "p.json")])
    phases = out["phases"]
    for name in ("propose", "propose.inject", "verify", "verify.layer_rows", "settle_features", "commit", "commit.emit",
                 "propose.target_rollback (target seq_rm, in the drafter forward)",
                 "verify.drafter_rollback (drafter seq_rm)"):
        assert name in phases, name
    assert phases["commit"]["calls_per_step"] == 2  # one per slot and step
    w = out["wrapped"]
    assert 0 < w["python_ms"] < w["step_ms"] and abs(w["python_ms"] + w["forwards_ms"] - w["step_ms"]) < 1e-3
    # a phase's time has the forwards inside it taken out: verify's Python is far below a step's forwards
    assert phases["verify"]["us_per_step"] / 1e3 < w["forwards_ms"]
    assert (tmp_path / "p.json").exists()
