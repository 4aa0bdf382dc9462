"""Server: llama-server under systemd, serving the current model with the current build.

    /etc/systemd/system/llamarack-server.service   the unit (templates/llama-server.service.j2 here)
    /etc/systemd/system/llamarack-server@N.service unit N of a host of several (port server_port + N)
    /etc/llamarack/server-api-key                  the API key, when server_api_key_file is set
    <root>/state/units.json                        the host's units: name, port, listen, slots, cards

A host's cards make one unit per card, or one over the cards that hold the model together
(``server_layout``, ``roles/server/card_layout.py``); each unit of a host of several cards sees
only its own (``CUDA_VISIBLE_DEVICES`` by UUID), and units no longer made are retired. Each
unit is planned from the GGUF's own header and its cards (``plan.py``): a context that does
not fit is refused before anything is touched. A changed unit is switched in, restarted and
must answer ``/health``; if it does not, the previous unit is put back and serves again, and
the host fails with the journal (``switch.py``).

The lab's hosts (``llamacpp_backend = 'cpu'``) run the same unit without ``--n-gpu-layers``,
planned against their (fake) card, so the memory guard runs there too.
"""
