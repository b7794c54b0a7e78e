"""The rotating tier (tests/helpers/rotation.py): which modules `make test` runs at a commit, and that three
consecutive commits run them all."""

from __future__ import annotations

import re

import pytest

from tests.helpers.repo import REPO_ROOT
from tests.helpers.rotation import ROTATING, SLOTS, chosen_slot, runs


@pytest.mark.parametrize("first", [0, 1, 2, 379, 380, 1000])
def test_any_three_consecutive_commits_run_every_rotating_module_once(first: int) -> None:
    counts = {module: 0 for module in ROTATING}
    for commits in range(first, first + SLOTS):
        for module in ROTATING:
            counts[module] += runs(module, chosen_slot(str(commits)))
    assert counts == {module: 1 for module in ROTATING}


def test_every_other_module_runs_at_every_commit_and_all_runs_everything() -> None:
    assert all(runs("tests/test_params_reading.py", chosen_slot(str(commits))) for commits in range(SLOTS))
    assert all(runs(module, chosen_slot("all")) and runs(module, chosen_slot("")) for module in ROTATING)


def test_the_tier_names_real_modules_in_every_slot() -> None:
    assert ROTATING, "the tier is empty: then LAB_ROTATION changes nothing"
    assert all((REPO_ROOT / module).is_file() for module in ROTATING)
    assert set(ROTATING.values()) == set(range(SLOTS))


def test_a_rotation_that_is_no_commit_count_is_refused() -> None:
    with pytest.raises(ValueError, match="LAB_ROTATION must be a commit count or 'all'"):
        chosen_slot("HEAD")


def test_a_test_with_no_rotating_marker_runs_at_every_commit_even_in_a_rotating_module() -> None:
    module = next(iter(ROTATING))
    at_each = [runs(module, chosen_slot(str(commits)), set()) for commits in range(SLOTS)]
    slow_at_each = [runs(module, chosen_slot(str(commits)), {"slow"}) for commits in range(SLOTS)]
    assert at_each == [True] * SLOTS
    assert sum(slow_at_each) == 1


def test_every_module_with_slow_or_browser_tests_is_in_the_tier_and_stress_modules_are_not() -> None:
    """A slow module missing from ROTATING would run at every commit and push `make test` past its budget; a
    stress module there would be a slot that `make test` never runs (it deselects the stress marker)."""
    marked = re.compile(r"pytest\.mark\.(slow|browser)\b")
    found = set()
    for path in sorted((REPO_ROOT / "tests").rglob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        if marked.search(text) and "pytest.mark.stress" not in text:
            found.add(path.relative_to(REPO_ROOT).as_posix())
    assert found == set(ROTATING), (
        f"not in the tier: {sorted(found - set(ROTATING))}; in it without such tests: {sorted(set(ROTATING) - found)}"
    )
