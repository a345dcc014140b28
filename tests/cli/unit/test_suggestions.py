"""Unknown names and what the error offers instead (coordinator.errors)."""

from __future__ import annotations

from pathlib import Path

from coordinator.errors import did_you_mean, unknown_cluster, unknown_deployment


def test_the_closest_names_are_offered_and_none_when_nothing_is_close() -> None:
    assert did_you_mean("paymnets", ["payments", "orders"]) == " Did you mean 'payments'?"
    assert did_you_mean("eu-3", ["eu-1", "eu-2", "us-3"]) == " Did you mean 'us-3', 'eu-2' or 'eu-1'?"  # closest first
    assert did_you_mean("zzz", ["payments"]) == ""


def test_a_typo_is_not_offered_for_creation(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: 1\n")
    typo = unknown_deployment("paymnets", ["payments", "orders"], config).message
    assert typo == "Unknown deployment 'paymnets'. Did you mean 'payments'? (known here: orders, payments.)"
    new = unknown_deployment("billing", ["payments"], config).message
    assert "coordinator deployment create billing" in new and "Did you mean" not in new
    assert "Did you mean 'c1'?" in unknown_cluster("c11", ["c1"], config).message


def test_a_missing_config_file_is_named_before_any_name(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    err = unknown_deployment("payments", [], missing)
    assert err.message.startswith(f"Unknown deployment 'payments': the config file {missing} does not exist")
    assert int(err.exit_code) == 2
