"""CI's non-free step widens the machine's own Debian sources, mirror and all."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("debian_nonfree", Path(__file__).parents[2] / ".ci/debian_nonfree.py")
nonfree = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nonfree)

# This machine's /etc/apt/sources.list.d/debian.sources, as the image ships it.
DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
Components: main
Signed-By: /usr/share/keyrings/nodesource.gpg
"""


def test_deb822_debian_stanza_gets_contrib_non_free_and_others_are_left():
    out = nonfree.widen_deb822(DEB822)
    assert out.count("Components: main contrib non-free") == 1
    assert "node_20.x\nSuites: nodistro\nComponents: main\n" in out
    assert nonfree.widen_deb822(out) == out


def test_a_local_mirror_keeps_its_host():
    local = "Types: deb\nURIs: http://mirror.lab.internal/debian\nSuites: bookworm\nComponents: main\n"
    out = nonfree.widen_deb822(local)
    assert "URIs: http://mirror.lab.internal/debian" in out and "Components: main contrib non-free" in out


def test_one_line_entries():
    text = "deb http://mirror.example/debian bookworm main\ndeb https://packages.cloud.google.com/apt cloud-sdk main\n"
    out = nonfree.widen_one_line(text)
    assert out.splitlines() == ["deb http://mirror.example/debian bookworm main contrib non-free",
                                "deb https://packages.cloud.google.com/apt cloud-sdk main"]
    assert nonfree.widen_one_line(out) == out
