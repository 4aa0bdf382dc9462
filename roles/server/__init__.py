"""Server: llama-server under systemd, serving the current model with the current build.

    /etc/systemd/system/llamarack-server.service   the unit (templates/llama-server.service.j2 here)
    /etc/systemd/system/llamarack-server@N.service unit N of a host of several (port server_port + N)
    /etc/llamarack/server-api-key                  the API key, when server_api_key_file is set
    <root>/state/units.json                        the host's units: name, port, listen, slots, cards

A host's cards make one unit or several (``server_layout``,
``llamarack/card_layout.py``): one per card, or one over the cards that hold the
model together (``--tensor-split``); each unit of a host of several cards sees only
its own (``CUDA_VISIBLE_DEVICES`` by UUID). Units no longer made are retired.
Each unit's context is planned from the GGUF's own header and its cards
(``plan.py``, with ``llamarack/planner.py``): ``server_ctx_size`` None
serves the largest that fits, a given one that does not fit is refused
before anything is touched; ``auto`` KV types and ``server_gpu_layers``
None are chosen there too. The flags are those the built binary's ``--help`` accepts (mmap
off is ``--load-mode none`` or ``--no-mmap``). A changed unit is switched
in, restarted and must answer ``/health``; if it does not, the previous
unit is put back and serves again, and the host fails with the journal.

The lab's hosts (``llamacpp_backend = 'cpu'``) run the same unit without
``--n-gpu-layers``, and the context is still planned against their
(fake) card, so the memory guard runs there too.
"""
