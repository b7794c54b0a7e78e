"""The browser tests' reproduced project: the one `make test` built from this very tree, where there is one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.projects import build_reproduced, published_reproduced, reproduced_cache, session_digest


@pytest.fixture(scope="session")
def reproduced_project(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path
) -> Path:
    """A tiny `dvc repro` of this tree, read-only: the one an earlier session (`make test`, CI's step before the
    browser tests) published for the same tree digest (`tree_digest`: code, params, installed packages, machine,
    MNIST mirror), else one built here. These tests look at the pages of a reproduced project, not at how it came
    about; the pipeline itself is `make test`'s to test, so it is not run a second time for the same tree."""
    cache = reproduced_cache(request.config)
    if cache is not None and (published := published_reproduced(cache, session_digest(request.config, mnist_mirror))):
        return published
    return build_reproduced(request.config, tmp_path_factory, mnist_mirror)
