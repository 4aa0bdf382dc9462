"""The build path of deploy.py on a real GPU host: the GPU machine.

That machine has no apt reach and no systemd, so only the roles that need
neither run: preflight (real nvidia-smi, real toolkit and gcc facts) and the
llama.cpp build (real CUDA build, cuobjdump check, smoke run on the GPU,
atomic switch).

    pyinfra -y @local bench/gpu/build_deploy.py --data llamarack_root=... --data ...

``--data bench_skip_rules=True`` reads the facts without running the rules,
so a build the rules would refuse (an arch the card cannot run) reaches the
smoke run: it shows the smoke run is a backstop of its own.
"""

from pyinfra import host

from roles.settings import settings_for
from roles.llamacpp.deploy import llamacpp
from roles.preflight.deploy import preflight
from roles.preflight.reads import gather

settings = settings_for(host)

facts = gather(settings) if host.data.get("bench_skip_rules") else preflight(settings)
if facts:
    llamacpp(settings, facts)
