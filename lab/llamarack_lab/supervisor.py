#!/usr/bin/env python3
"""Keeps one lab host running: runs the nspawn command given as arguments
and starts it again when the guest reboots (nspawn exits 133), like a
machine's power button. Any other exit ends the host. Standalone script
(no imports of the package): started by host.launch in the host's cgroup.
"""

import subprocess
import sys
import time

REBOOT_EXIT = 133


def main(cmd):
    while True:
        started = time.monotonic()
        rc = subprocess.call(cmd)
        print(f"llamarack-lab supervisor: nspawn exited {rc} after "
              f"{time.monotonic() - started:.1f} s", flush=True)
        if rc != REBOOT_EXIT:
            return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
