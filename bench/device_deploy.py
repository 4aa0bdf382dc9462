"""The build path of deploy.py on a real GPU host, for the borrowed H200 machine.

That machine has no apt reach and no systemd, so only the roles that need
neither run: preflight (real nvidia-smi, real toolkit and gcc facts) and the
llama.cpp build (real CUDA build, real cuobjdump check, atomic switch).

    pyinfra -y @local bench/device_deploy.py --data llamarack_root=... --data ...
"""

from pyinfra import host

from llamarack.settings import settings_for
from roles.llamacpp import llamacpp
from roles.preflight import preflight

settings = settings_for(host)

facts = preflight(settings)
if facts:
    llamacpp(settings, facts)
