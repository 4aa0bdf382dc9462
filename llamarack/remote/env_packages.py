# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Print the running interpreter's Python version and every installed distribution, as JSON.

    <env>/bin/python -c SOURCE

Run with the env's own interpreter: what importlib.metadata sees is exactly
what ``import`` will load, and no pip process is started to find out.
"""

import importlib.metadata
import json
import platform

if __name__ == "__main__":
    packages = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions() if d.metadata["Name"]}
    print(json.dumps({"python": platform.python_version(), "packages": packages}))
