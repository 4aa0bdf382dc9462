"""Server: llama-server under systemd, serving the current model with the current build.

    /etc/systemd/system/llamarack-server.service   the unit (templates/llama-server.service.j2)
    /etc/llamarack/server-api-key                  the API key, when server_api_key_file is set

The context is planned from the GGUF's own header and the smallest card
(``llamarack.server_plan``): ``server_ctx_size`` None serves the largest
that fits, a given one that does not fit is refused before anything is
touched. The flags are those the built binary's ``--help`` accepts (mmap
off is ``--load-mode none`` or ``--no-mmap``). A changed unit is switched
in, restarted and must answer ``/health``; if it does not, the previous
unit is put back and serves again, and the host fails with the journal.

The lab's hosts (``llamacpp_backend = 'cpu'``) run the same unit without
``--n-gpu-layers``, and the context is still planned against their
(fake) card, so the memory guard runs there too.
"""

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server

from llamarack.operations import report
from llamarack.rules import HostFacts
from llamarack.server_ops import service
from llamarack.settings import Settings


def public_url(settings: Settings) -> str:
    listen = settings.server.listen
    addr = host.data.get("ssh_hostname") or host.name if listen in ("0.0.0.0", "::") else listen
    return f"http://{addr}:{settings.server.port}"


@deploy("llama-server")
def llama_server(settings: Settings, facts: HostFacts):
    """
    Run llama-server as a system service and check that it answers.

    + settings: the host's settings (``server_*``, ``llamarack_service_user``)
    + facts: what preflight read; where its driver listed no GPU (a mismatch the
      driver role reboots away), the service operation reads them again
    """
    user = settings.general.service_user
    server.user(
        name=f"Service user {user}",
        user=user,
        system=True,
        shell="/usr/sbin/nologin",
        home=settings.general.root,
        create_home=False,
    )
    url = public_url(settings)
    key = "API key required" if settings.server.api_key_file else "no API key"
    service(
        name=f"llama-server at {url} ({key})",
        settings=settings,
        gpus=facts.driver.gpus,
    )
    report(
        name="How to reach it",
        message=f"serving: {url}/v1/chat/completions (OpenAI API), {url}/completion, "
        f"health at {url}/health ({key})",
    )
