"""Add the contrib and non-free components to the Debian sources this machine already uses.

    python3 .ci/debian_nonfree.py        (as root; prints what it changed)

Debian's CUDA 11.8 toolkit (nvidia-cuda-toolkit) lives in non-free. Rather
than naming a mirror host, this widens the machine's own Debian entries, so a
machine that uses a local mirror keeps using it. deb822 ``.sources`` stanzas
signed by the Debian archive key and one-line ``deb`` entries are both handled;
an entry that already has the components is left alone.
"""

import re
import sys
from pathlib import Path

WANTED = ("contrib", "non-free")
APT = Path("/etc/apt")


def widen_deb822(text: str) -> str:
    stanzas = re.split(r"\n\s*\n", text)
    out = []
    for stanza in stanzas:
        debian = "debian-archive-keyring" in stanza or re.search(r"^URIs:.*/debian(-security)?/?\s*$", stanza, re.M)
        enabled = not re.search(r"^Enabled:\s*no", stanza, re.M | re.I)
        if debian and enabled:
            def add(m):
                have = m.group(2).split()
                return m.group(1) + " ".join(have + [c for c in WANTED if c not in have])
            stanza = re.sub(r"^(Components:\s*)(.*)$", add, stanza, flags=re.M)
        out.append(stanza)
    return "\n\n".join(out)


def widen_one_line(text: str) -> str:
    def add(m):
        have = m.group(2).split()
        return m.group(1) + " ".join(have + [c for c in WANTED if c not in have])
    return re.sub(r"^(deb\s+(?:\[[^\]]*\]\s+)?\S*/debian(?:-security)?/?\s+\S+\s+)(.*)$", add, text, flags=re.M)


def main() -> int:
    files = sorted(APT.glob("sources.list.d/*.sources")) + [APT / "sources.list"]
    files += sorted(APT.glob("sources.list.d/*.list"))
    changed = 0
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text()
        new = widen_deb822(text) if path.suffix == ".sources" else widen_one_line(text)
        if new != text:
            path.write_text(new)
            print(f"debian_nonfree: added {' '.join(WANTED)} to {path}")
            changed += 1
    if not changed:
        print("debian_nonfree: no Debian entry needed a change")
    return 0


if __name__ == "__main__":
    sys.exit(main())
