"""Where the lab keeps a rack's state: its own tmpfs, or with LLAMARACK_LAB_TMPFS=0 the directory as it is."""

import stat

from llamarack_lab import paths, rack


def test_with_tmpfs_off_the_state_dir_is_used_where_it_is_and_only_root_reads_it(tmp_path, monkeypatch):
    sd = tmp_path / "state"
    monkeypatch.setenv("LLAMARACK_LAB_DIR", str(sd))
    monkeypatch.setenv("LLAMARACK_LAB_TMPFS", "0")
    assert paths.state_dir() == sd and not paths.state_on_tmpfs()
    assert rack._mount_state_dir(sd) is False  # nothing mounted: down leaves the filesystem alone
    assert stat.S_IMODE(sd.stat().st_mode) == 0o700 and not rack.is_mountpoint(sd)


def test_the_tmpfs_is_the_default(monkeypatch):
    monkeypatch.delenv("LLAMARACK_LAB_TMPFS", raising=False)
    assert paths.state_on_tmpfs()
    monkeypatch.setenv("LLAMARACK_LAB_TMPFS", "1")
    assert paths.state_on_tmpfs()
