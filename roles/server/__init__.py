"""Server: llama-server under systemd, serving the current model with the current build.

    /etc/systemd/system/llamarack-server.service   the unit (templates/llama-server.service.j2 here)
    /etc/systemd/system/llamarack-server@N.service unit N of a host of several (port server_port + N)
    /etc/llamarack/server-api-key                  the API key, when server_api_key_file is set
    <root>/state/units.json                        the host's units: name, port, listen, slots, cards

docs/deploy.md ("The roles") says how the units are planned (``plan.py``, with the host's
layout, ``card_layout.py``), switched in and checked (``switch.py``). The lab's hosts
(``llamacpp_backend = 'cpu'``) run the same unit without ``--n-gpu-layers``, planned
against their (fake) card, so the memory guard runs there too.
"""
