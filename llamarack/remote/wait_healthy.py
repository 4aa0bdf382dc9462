# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Wait until a llama-server answers /health with 200, or give up.

    python3 -c SOURCE URL UNIT SECONDS

llama-server answers 503 while it loads. Gives up at once when the unit is
no longer active (it crashed and waits to restart), else after SECONDS.
Exit 0: healthy.
"""

import subprocess
import sys
import time
import urllib.request


def main(url, unit, seconds):
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return 0
        except Exception:
            pass
        if subprocess.run(["systemctl", "is-active", "-q", unit]).returncode != 0:
            return f"{unit} stopped before {url} answered 200 (its journal follows)"
        time.sleep(1)
    return f"no 200 from {url} within {seconds} s"


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
