"""Model: fetch the pinned source, convert and quantize it into a content-addressed GGUF.

Source hf: the checkpoint files of ``model_repo`` at ``model_revision`` (those
``model_hf_include`` selects), checked by the hashes the hub lists for that
commit, converted by the pinned llama.cpp's ``convert_hf_to_gguf.py`` (in the
converter env) to ``model_convert_outtype``, then ``llama-quantize`` to
``model_quant``; with ``model_route = 'awq'``, AutoAWQ's scales are applied
into the checkpoint's fp16 weights first (``files/awq_apply.py``, the AWQ
env's python). A new quantized artifact is measured by ``llama-perplexity``
against its f16 GGUF (``docs/quality.md``). Source gguf (a prequantized file of a hub repo) and url
(with ``model_sha256``) are fetched and verified, nothing more.

Where downloads run: on each host, from ``model_hf_endpoint`` (point it at a
LAN mirror for a big rack). Pushing one control-machine download through
every host's SSH link would serialize the rack behind one link; every host
fetching in parallel from a mirror does not.

The hub is asked on the control machine (``requests``), for sizes and content hashes, only
when the served artifact is not the one the settings ask for, nor planned from its record
(``deploy.plan_for``); route awq on a CUDA build also reads the checkpoint's ``config.json``
there, in preflight (``calibration.py``). Hosts need only python3's standard library.

A draft model for speculative decoding (``model_draft_repo``) is made by the same code
(``plan.draft_settings``) into its own content-addressed directory, and
``<root>/models/draft`` points at it.

Returns the plan (``<root>/models/current`` points at its directory).
"""
