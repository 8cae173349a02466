"""The GitHub workflows: they parse, the tests run on every push and pull request, and no action
is older than its current major version.

The majors below are the newest each action had published on 2026-12-02 (from the actions'
release notes, as quoted in the upgrade pull requests of projects that use them). Raise a number
here when an action publishes a new major, and the test points at every workflow to update.
"""
import re
from pathlib import Path

import pytest
import yaml

from autograder.course import learners_release
ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
CURRENT = {
    "actions/checkout": 7,
    "actions/setup-python": 7,
    "actions/cache": 6,
    "actions/upload-artifact": 7,
    "actions/upload-pages-artifact": 5,
    "actions/deploy-pages": 5,
}


def workflow_texts():
    texts = {p.name: p.read_text() for p in sorted(WORKFLOWS.glob("*.yml"))}
    texts["learners' pages.yml"] = learners_release.PAGES_WORKFLOW.format(branch="main")
    return texts


def steps(workflow):
    for job in workflow["jobs"].values():
        yield from job.get("steps", [])


def test_the_workflows_are_there():
    assert {"deploy.yml", "tests.yml"} <= {p.name for p in WORKFLOWS.glob("*.yml")}


@pytest.mark.parametrize("name", list(workflow_texts()))
def test_every_action_is_at_its_current_major(name):
    """Is every `uses:` of a workflow (ours and the one the learners' release writes) at the major we found?"""
    workflow = yaml.safe_load(workflow_texts()[name])
    uses = [s["uses"] for s in steps(workflow) if "uses" in s]
    assert uses, name
    for use in uses:
        action, _, version = use.partition("@")
        assert action in CURRENT, f"{name}: {action} is not in CURRENT: add its current major"
        match = re.fullmatch(r"v(\d+)(\.\d+)*", version)
        assert match and int(match.group(1)) >= CURRENT[action], f"{name}: {use} is older than v{CURRENT[action]}"
    for job in workflow["jobs"].values():
        assert "runs-on" in job


def test_the_tests_run_on_push_and_pull_request():
    """Does tests.yml run .ci/run on every push and pull request, under a time limit, with the runner's fixes?"""
    workflow = yaml.safe_load((WORKFLOWS / "tests.yml").read_text())
    # PyYAML reads the key `on` as True (YAML 1.1).
    triggers = workflow.get("on", workflow.get(True))
    assert "push" in triggers and "pull_request" in triggers
    assert (triggers["push"] or {}).get("branches") is None, "tests must run on pushes to every branch"
    (job,) = workflow["jobs"].values()
    assert 0 < job["timeout-minutes"] <= 360
    runs = [s.get("run", "") for s in job["steps"]]
    assert any(re.search(r"(^|\s)(bash )?\.ci/run\b", r) for r in runs)
    assert any("kernel.apparmor_restrict_unprivileged_userns=0" in r for r in runs)
    assert job["env"]["CHROMIUM"] and job["env"]["TORCH_INDEX"].startswith("https://download.pytorch.org/whl/cpu")


def test_ci_takes_the_browser_chromium_names():
    """Does .ci/run use $CHROMIUM when it is set, instead of installing Debian's chromium?"""
    script = (ROOT / ".ci" / "run").read_text()
    assert '"${CHROMIUM:-}"' in script
    install = script.index("missing+=(chromium)")
    assert script.rindex("CHROMIUM", 0, install) < install
