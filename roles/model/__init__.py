"""Model: fetch the pinned source, convert and quantize it into a content-addressed GGUF.

docs/deploy.md ("The roles") says what the role does, docs/quality.md how a new artifact
is measured. Downloads run on each host, from ``model_hf_endpoint`` (point it at a LAN
mirror for a big rack): one control-machine download pushed through every host's SSH link
would serialize the rack behind that link. The hub is asked on the control machine, only
when the served artifact is neither the one the settings ask for nor planned from its
record (``deploy.plan_for``); hosts need only python3's standard library. A draft model
(``model_draft_repo``) is made by the same code, and ``<root>/models/draft`` points at it.

Returns the plan (``<root>/models/current`` points at its directory).
"""
