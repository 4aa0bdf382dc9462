"""The role's one ``@deploy`` entry point (the role is described in ``__init__.py``)."""

from typing import Optional
from urllib.parse import urlsplit

from pyinfra.api import deploy
from pyinfra.facts.files import File

from llamarack.errors import ModelSourceError
from llamarack.facts import FactRead, read, read_together
from llamarack.operations import refuse
from roles.driver.reads import CharDevices
from roles.model.reads import GgufShape, ModelArtifact, shape_record_name
from roles.server.operations import system_account
from roles.server.plan import device_names
from roles.server.reads import SystemGroup, SystemUser
from llamarack.secrets import read_token
from roles.settings import Settings

from .hub import HubListing, repo_files
from .operations import artifact
from .plan import ModelPlan, draft_settings, plan_from_pinned_record, plan_from_record, plan_model
from .sandbox import PIPELINE_HOME, PIPELINE_USER


def listing_for(settings: Settings) -> Optional[HubListing]:
    m = settings.model
    if m.source == "url":
        return None
    if not (m.repo and m.revision):
        raise ModelSourceError(f"model_repo/model_revision: source {m.source!r} needs both")
    return repo_files(m.hf_endpoint, m.repo, m.revision, read_token(m.hf_token_file))


def plan_for(settings: Settings, link: Optional[str] = None) -> ModelPlan:
    """The artifact this host needs: from the record of the one it serves (``link``:
    models/current, or models/draft) when that one is still wanted (``plan_from_record``) or
    was made from a pinned revision but another llama.cpp commit (``plan_from_pinned_record``);
    otherwise from the hub's listing of the revision."""
    served = read(ModelArtifact, path=link or settings.layout.current_model)
    return (plan_from_record(settings, served) or plan_from_pinned_record(settings, served)
            or plan_model(settings, listing_for(settings)))  # fmt: skip


def pipeline_user(settings: Settings) -> bool:
    """The account fetch, convert and quantize run as (``sandbox.py``; docs/ARCHITECTURE.md
    says why it is not llama-server's), made as the server's user is, before the server role
    runs (a run of the model role alone needs it); False (the host refused) when the settings
    give llama-server that same name."""
    if settings.general.service_user == PIPELINE_USER:
        refuse(name="Model pipeline user", reason=(
            f"{settings.host}: llamarack_service_user: given {PIPELINE_USER!r}, the model pipeline's own "
            "account (it runs a checkpoint's code). Fix: give llama-server another user, e.g. llamarack"))
        return False
    system_account(name=f"Model pipeline user {PIPELINE_USER}", user=PIPELINE_USER, home=PIPELINE_HOME)
    return True


@deploy("llamarack model")
def model(settings: Settings, tool_paths: Optional[dict] = None) -> ModelPlan:
    """Make the model artifact this host's settings ask for, and point ``models/current`` at it.

    + settings: the host's settings
    + tool_paths: where the converter python/script and llama-quantize are, when not
      at the default places under the root (``operations.tools``)"""
    plan = plan_for(settings)
    draft = draft_settings(settings)
    draft_plan = plan_for(draft, settings.layout.draft_model) if draft else None
    # The artifacts' directories are known now: their state, their shape records and the
    # served files' shapes (the server role plans from them) in one command, with the
    # pipeline's account.
    cuda = settings.llamacpp.backend == "cuda"
    read_together(FactRead.of(SystemUser, user=PIPELINE_USER), FactRead.of(SystemGroup, group=PIPELINE_USER),
                  *((FactRead.of(CharDevices),) if cuda else ()),
                  *(read for p in (plan, draft_plan) if p
                    for read in (FactRead.of(ModelArtifact, path=p.dir),
                                 FactRead.of(File, path=f"{p.dir}/{shape_record_name()}"),
                                 FactRead.of(GgufShape, path=f"{p.dir}/model.gguf"))))  # fmt: skip
    token_file = settings.model.hf_token_file if settings.model.source != "url" else None
    if not pipeline_user(settings):
        return plan
    # the AWQ and quality runs' GPU (the driver's devices, as the served unit's)
    devices = device_names(tuple(read(CharDevices)), cuda) if cuda and (plan.applies_awq or plan.measures) else ()
    # As PIPELINE_USER, the operation's default. A URL may carry a signed query: name only its host.
    artifact(name=f"Model {plan.name} ({settings.model.source}: "
             f"{settings.model.repo or urlsplit(settings.model.url).hostname})",
             plan=plan, token_file=token_file, tool_paths=tool_paths, devices=devices,
             ship_artifacts=settings.model.ship_artifacts)  # fmt: skip
    if draft_plan:
        artifact(name=f"Draft model {draft_plan.name} ({draft.model.source}: {draft.model.repo})",
                 plan=draft_plan, token_file=token_file, tool_paths=tool_paths, link="draft",
                 ship_artifacts=settings.model.ship_artifacts)  # fmt: skip
    return plan
