"""The reproduced project one test session leaves for the next of the same tree (tests/browser/conftest.py): found
only under the digest of the tree that made it, never half copied, one tree's at a time."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.projects import copy_project, publish_reproduced, published_reproduced, tree_digest


def test_a_copy_of_the_tree_has_its_digest_and_an_edit_or_another_mirror_changes_it(
    tmp_path: Path, mnist_mirror: Path
) -> None:
    copy = copy_project(tmp_path / "copy")
    digest = tree_digest(mnist_mirror, copy)
    assert digest == tree_digest(mnist_mirror)
    assert tree_digest(tmp_path, copy) != digest  # another mirror
    (copy / "scratch.txt").write_text("new")  # a new file, not yet in git: a project copy would get it
    with_new_file = tree_digest(mnist_mirror, copy)
    assert with_new_file != digest
    params = copy / "params.yaml"
    params.write_text(params.read_text() + "\n")
    assert tree_digest(mnist_mirror, copy) not in (digest, with_new_file)


def test_a_published_project_is_found_only_under_its_digest_and_replaces_the_one_before(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    first, second = tmp_path / "first", tmp_path / "second"
    for project in (first, second):
        project.mkdir()
        (project / "params.yaml").write_text(f"name: {project.name}\n")

    publish_reproduced(first, cache, "a")
    found = published_reproduced(cache, "a")
    assert found is not None and (found / "params.yaml").read_text() == "name: first\n"
    assert published_reproduced(cache, "b") is None

    publish_reproduced(second, cache, "b")
    found = published_reproduced(cache, "b")
    assert found is not None and (found / "params.yaml").read_text() == "name: second\n"
    assert published_reproduced(cache, "a") is None and not (cache / "a").exists()

    (cache / "c" / "project").mkdir(parents=True)  # a copy cut short: no mark that it is complete
    assert published_reproduced(cache, "c") is None
