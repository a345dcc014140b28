"""The default holder: ``user@host`` and the CI job the environment names."""

from __future__ import annotations

import pytest

from coordinator.engine.lock.results import ci_job, default_holder

GITHUB = {"GITHUB_ACTIONS": "true", "GITHUB_RUN_ID": "4242", "GITHUB_RUN_ATTEMPT": "2", "GITHUB_JOB": "deploy"}


def test_two_github_jobs_of_one_runner_machine_are_two_holders() -> None:
    a = ci_job({**GITHUB, "RUNNER_NAME": "runner-a"}, "host")
    b = ci_job({**GITHUB, "RUNNER_NAME": "runner-b"}, "host")
    other_job = ci_job({**GITHUB, "GITHUB_JOB": "test", "RUNNER_NAME": "runner-a"}, "host")
    retried = ci_job({**GITHUB, "GITHUB_RUN_ATTEMPT": "3", "RUNNER_NAME": "runner-a"}, "host")
    assert a == "github-run:4242.2 job:deploy runner:runner-a"
    assert len({a, b, other_job, retried}) == 4


def test_gitlab_and_pods() -> None:
    assert ci_job({"GITLAB_CI": "true", "CI_JOB_ID": "77"}, "host") == "ci-job:77"
    assert ci_job({"POD_NAME": "deploy-x7k2p"}, "runner") == "pod:deploy-x7k2p"
    # In a pod the host name is the pod's name already: nothing to add.
    assert ci_job({"POD_NAME": "deploy-x7k2p"}, "deploy-x7k2p") is None
    assert ci_job({}, "laptop") is None


def test_the_environment_cannot_put_spaces_or_control_characters_in_the_holder() -> None:
    assert ci_job({"GITHUB_RUN_ID": "1 2\n3", "GITHUB_JOB": "a\x1bb"}, "h") == "github-run:123.1 job:ab"


def test_coordinator_holder_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {**GITHUB, "RUNNER_NAME": "r"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("COORDINATOR_HOLDER", "deployer")
    assert default_holder() == "deployer"
    monkeypatch.delenv("COORDINATOR_HOLDER")
    assert default_holder().endswith(" github-run:4242.2 job:deploy runner:r")
