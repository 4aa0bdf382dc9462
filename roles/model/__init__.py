"""Model: fetch the pinned source, convert and quantize it into a content-addressed GGUF.

Source hf: the checkpoint files of ``model_repo`` at ``model_revision`` (those
``model_hf_include`` selects), checked by the hashes the hub lists for that
commit, converted by the pinned llama.cpp's ``convert_hf_to_gguf.py`` (in the
converter env) to ``model_convert_outtype``, then ``llama-quantize`` to
``model_quant``. Source gguf (a prequantized file of a hub repo) and url
(with ``model_sha256``) are fetched and verified, nothing more.

Where downloads run: on each host, from ``model_hf_endpoint`` (point it at a
LAN mirror for a big rack). Pushing one control-machine download through
every host's SSH link would serialize the rack behind one link; every host
fetching in parallel from a mirror does not.

The hub is asked on the control machine (``requests``), for sizes and
content hashes, only when the artifact a host serves is not already the one
its settings ask for (its own record says so), and not even then when the
record was made from the same settings but the llama.cpp commit, of a
revision pinned by its full 40-hex sha (a llama.cpp bump): a commit's
listing never changes, so the record's files (content ids and sizes) plan
the new artifact. A revision given shorter is listed again. Hosts need only python3's standard library.

A draft model for speculative decoding (``model_draft_repo``) is made the
same way, by the same code (``llamarack.settings.draft_settings``: the
model's settings with the draft's repository, revision, file and quant), into
its own content-addressed directory with its own stamp, and
``<root>/models/draft`` points at it.

Returns the plan (``plan.gguf`` is the served file; ``<root>/models/current``
points at its directory).
"""

from typing import Optional
from urllib.parse import urlsplit

from pyinfra.api import deploy
from pyinfra.facts.files import File

from llamarack.errors import ModelSourceError
from llamarack.facts import FactRead, GgufShape, ModelArtifact, read, read_together, shape_record_name
from llamarack.secrets import read_token
from llamarack.settings import Settings, draft_settings

from .hub import HubListing, repo_files
from .operations import artifact
from .plan import ModelPlan, plan_from_pinned_record, plan_from_record, plan_model


def listing_for(settings: Settings) -> Optional[HubListing]:
    m = settings.model
    if m.source == "url":
        return None
    if not (m.repo and m.revision):
        raise ModelSourceError(f"model_repo/model_revision: source {m.source!r} needs both")
    return repo_files(m.hf_endpoint, m.repo, m.revision, read_token(m.hf_token_file))


def plan_for(settings: Settings, link: Optional[str] = None) -> ModelPlan:
    """The artifact this host needs. When the one it serves (``link``: models/current,
    or models/draft) was made from what the settings ask now (its record says so),
    that is the plan, and the hub is not asked: a converged rack deploys with the hub down.
    When it was made from the same settings but the llama.cpp commit, of a revision
    pinned by its full sha, the new artifact is planned from its record (its files, with
    content ids and sizes), and the hub is not asked either. Otherwise the hub lists the
    revision."""
    served = read(ModelArtifact, path=link or settings.layout.current_model)
    return (plan_from_record(settings, served) or plan_from_pinned_record(settings, served)
            or plan_model(settings, listing_for(settings)))  # fmt: skip


@deploy("llamarack model")
def model(settings: Settings, tool_paths: Optional[dict] = None) -> ModelPlan:
    """
    Make the model artifact this host's settings ask for, and point ``models/current`` at it.

    + settings: the host's settings
    + tool_paths: where the converter python/script and llama-quantize are, when not
      at the default places under the root (``operations.tools``)
    """
    plan = plan_for(settings)
    draft = draft_settings(settings)
    draft_plan = plan_for(draft, settings.layout.draft_model) if draft else None
    # The artifacts' directories are known now: their state, their shape records and the
    # served files' shapes (the server role plans from them) in one command.
    read_together(*(read for p in (plan, draft_plan) if p
                    for read in (FactRead.of(ModelArtifact, path=p.dir),
                                 FactRead.of(File, path=f"{p.dir}/{shape_record_name()}"),
                                 FactRead.of(GgufShape, path=f"{p.dir}/model.gguf"))))  # fmt: skip
    token_file = settings.model.hf_token_file if settings.model.source != "url" else None
    artifact(
        # A URL may carry a signed query: name only its host.
        name=f"Model {plan.name} ({settings.model.source}: "
        f"{settings.model.repo or urlsplit(settings.model.url).hostname})",
        plan=plan,
        token_file=token_file,
        tool_paths=tool_paths,
    )
    if draft_plan:
        artifact(
            name=f"Draft model {draft_plan.name} ({draft.model.source}: {draft.model.repo})",
            plan=draft_plan,
            token_file=token_file,
            tool_paths=tool_paths,
            link="draft",
        )
    return plan
