"""The project's deploy.py unchanged, then, on the one host named by the environment's
``LLAMARACK_BENCH_FAIL_GATE``, its llama-server stopped: a deploy that succeeds and leaves
that host failing the rollout's gate (/health). Lab only: ``bench/rollout_bench.py`` rolls
it with that host as the canary, to measure a rollout that stops at its canary.

    LLAMARACK_BENCH_FAIL_GATE=lab-v100-a llamarack rollout inventory/lab.py bench/deploys/fails_gate.py
"""

import os
from pathlib import Path

from pyinfra import host, local
from pyinfra.operations import systemd

local.include(str(Path(__file__).resolve().parents[2] / "deploy.py"))

if host.name == os.environ.get("LLAMARACK_BENCH_FAIL_GATE"):
    systemd.service(name="Stop llama-server (the bench's failing gate)", service="llamarack-server.service",
                    running=False)
