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
        # First: a unit that died is known at once, without waiting on its address
        # (one the host lacks would hold a connect for the whole timeout).
        if subprocess.run(["systemctl", "is-active", "-q", unit]).returncode != 0:
            return f"{unit} stopped before {url} answered 200 (its journal follows)"
        try:
            # Short: a loading llama-server answers 503 at once; the service is down meanwhile.
            with urllib.request.urlopen(url, timeout=min(2.0, max(0.1, deadline - time.monotonic()))) as r:
                if r.status == 200:
                    return 0
        except Exception:
            pass
        time.sleep(0.5)
    return f"no 200 from {url} within {seconds} s"


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
