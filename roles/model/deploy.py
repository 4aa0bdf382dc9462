"""The role's one ``@deploy`` entry point (the role is described in ``__init__.py``)."""

from typing import Optional
from urllib.parse import urlsplit

from pyinfra.api import deploy
from pyinfra.facts.files import File

from llamarack.errors import ModelSourceError
from llamarack.facts import FactRead, read, read_together
from llamarack.roles.model.reads import GgufShape, ModelArtifact, shape_record_name
from llamarack.secrets import read_token
from llamarack.settings import Settings

from .hub import HubListing, repo_files
from .operations import artifact
from .plan import ModelPlan, plan_from_pinned_record, plan_from_record, plan_model
from .settings import draft_settings


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
