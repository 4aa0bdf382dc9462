"""The lab mirror's extra commits (lab/llamarack_lab/mirror.py): deterministic, and named by their change."""

import subprocess
from pathlib import Path

from llamarack_lab import mirror


def small_mirror(where: Path) -> mirror.Mirror:
    """A bare repository with one commit, made the way ensure_mirror makes the real one."""
    work = where / "work"
    work.mkdir(parents=True)
    (work / "README.md").write_text("# llama.cpp\n")
    mirror._git("init", "--quiet", "--initial-branch=main", cwd=work)
    mirror._git("add", "README.md", cwd=work)
    mirror._git("commit", "--quiet", "--no-verify", "-m", "base", cwd=work)
    bare = where / "llama.cpp.git"
    mirror._git("clone", "--quiet", "--bare", "--no-local", str(work), str(bare))
    return mirror.Mirror(bare, mirror._git("rev-parse", "HEAD", cwd=work))


def test_a_named_commit_is_the_same_everywhere_and_its_branch_names_its_change(tmp_path):
    a, b = small_mirror(tmp_path / "a"), small_mirror(tmp_path / "b")
    assert a.commit == b.commit
    first = mirror.add_named_commit(a, "lab-test-bump", "a later commit", mirror.GOOD_BUMP)
    assert first == mirror.add_named_commit(b, "lab-test-bump", "a later commit", mirror.GOOD_BUMP)
    assert first != a.commit
    branches = mirror._git("for-each-ref", "--format=%(refname:short)", "refs/heads/lab-test-bump-*", cwd=a.bare)
    assert len(branches.split()) == 1 and len(branches.split("-")[-1]) == 12
    # Asked again: the branch that is there; another change: another branch, another commit.
    assert mirror.add_named_commit(a, "lab-test-bump", "a later commit", mirror.GOOD_BUMP) == first
    other = mirror.add_named_commit(a, "lab-test-bump", "a later commit", {"README.md": "\nother\n"})
    assert other != first
    text = subprocess.run(["git", "-C", str(a.bare), "show", f"{first}:README.md"], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    assert text == "# llama.cpp\n" + mirror.GOOD_BUMP["README.md"]
