"""The toolchain role alone, for the local test against this machine's real CUDA toolkit.

This machine has no GPU driver, so the facts are read without preflight's
rules; the run's toolchain plan is written to ``<root>/toolchain-plan.json``
(control machine and host are one here) for the test to read.
"""

import dataclasses
import json
from pathlib import Path

from pyinfra import host

from roles.preflight.reads import gather
from roles.toolchain.deploy import toolchain
from roles.toolchain.plan import plan_toolchain
from roles.settings import settings_for

settings = settings_for(host)
facts = gather(settings)
toolchain(settings, facts)
plan = plan_toolchain(settings, facts)
Path(settings.general.root, "toolchain-plan.json").write_text(json.dumps(dataclasses.asdict(plan)))
