# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Tell whether a secret file on the host holds what the control machine has,
printing nothing a reader of the output could check a guess against cheaply.

    python3 secret_digest.py FILE SALT   -> "pbkdf2-sha256:<hex>", or "missing"

The control machine picks a fresh random SALT for each run and computes the
same digest of the secret it holds (``digest`` below, shared by import). A
plain hash of the file (pyinfra's ``Sha1File``) would be the same on every
run and every host, printed at ``-vvv``, and open to a dictionary; this one
changes every run and costs ``ITERATIONS`` rounds of SHA-256 per guess.
"""

from __future__ import annotations

import hashlib
import sys

ITERATIONS = 200_000


def digest(secret: bytes, salt: str) -> str:
    return "pbkdf2-sha256:" + hashlib.pbkdf2_hmac("sha256", secret, salt.encode(), ITERATIONS).hex()


def main(argv: list) -> int:
    path, salt = argv
    try:
        with open(path, "rb") as f:
            secret = f.read()
    except FileNotFoundError:
        print("missing")
        return 0
    print(digest(secret, salt))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
