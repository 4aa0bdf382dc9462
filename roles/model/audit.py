"""The model role's audit item: the served artifact against the settings, untouched since its seal."""

from __future__ import annotations

from pyinfra.facts.files import File, Sha256File

from llamarack.audit import Item, Seen
from llamarack.facts import FactRead
from roles.settings import Settings

from .files.model_quality import kld_problem
from .plan import plan_from_pinned_record, plan_from_record, quality_summary
from roles.server.audit import account_item
from roles.server.reads import SystemGroup, SystemUser

from .reads import BlobCacheIndex, ModelArtifact, shape_record_name
from .sandbox import PIPELINE_HOME, PIPELINE_USER


def reads(settings: Settings, verify: bool = False) -> tuple[FactRead, ...]:
    """The served artifact, the blob cache's index; ``verify``: the GGUF hashed."""
    current = settings.layout.current_model
    return (FactRead.of(ModelArtifact, path=current), FactRead.of(File, path=f"{current}/{shape_record_name()}"),
            FactRead.of(BlobCacheIndex, cache=settings.layout.blob_cache),
            FactRead.of(SystemUser, user=PIPELINE_USER), FactRead.of(SystemGroup, group=PIPELINE_USER)) + \
        ((FactRead.of(Sha256File, path=f"{current}/model.gguf"),) if verify else ())  # fmt: skip


def items(seen: Seen) -> dict[str, Item]:
    settings, fact, current = seen.settings, seen.fact, seen.settings.layout.current_model
    served = fact(ModelArtifact, path=current)
    record = (served.record or {}) if served else {}
    asked, bound = record.get("asked", {}), settings.model.quality_max_kld
    found = {"stamp": served.stamp if served else None, "repo": asked.get("repo"), "revision": asked.get("revision"),
             "quant": asked.get("quant"), "untouched": bool(served and served.untouched),
             # the GGUF's shape as this llamarack's header reader records it (a new reader reads it again)
             "shape_recorded": bool(served and fact(File, path=f"{current}/{shape_record_name()}")),
             # the route it was made by, and its quality (a record made before either names neither)
             "route": record.get("route", "gguf") if served else None,
             "quality": quality_summary(record.get("quality"))}
    wanted = {"repo": settings.model.repo, "revision": settings.model.revision, "quant": settings.model.quant,
              "untouched": True, "shape_recorded": True, "route": settings.model.route,
              "quality": f"mean KLD at most {bound}" if bound is not None else None}
    if seen.verify:
        found["sha256"] = fact(Sha256File, path=f"{current}/model.gguf")
        wanted["sha256"] = (record.get("gguf") or {}).get("sha256")
    # plan_from_record plans only an untouched artifact
    planned = plan_from_record(settings, served)
    drift = planned is None or not found["shape_recorded"] or \
        bool(kld_problem(record.get("quality"), bound, "model")) or \
        (seen.verify and not (wanted["sha256"] and found["sha256"] == wanted["sha256"]))  # fmt: skip
    wanted.update(made(settings, served, fact(BlobCacheIndex, cache=settings.layout.blob_cache), planned))
    found["bytes"] = served.gguf_size if served else None
    pipeline = account_item(fact(SystemUser, user=PIPELINE_USER), fact(SystemGroup, group=PIPELINE_USER), PIPELINE_HOME)
    return {"pipeline_user": pipeline, "model": Item(found, wanted, drift=drift)}


def made(settings: Settings, served, index, planned=None) -> dict:
    """What plan-upgrade says of the artifact the deploy makes (``llamarack.upgrade.models_made``):
    its stamp where the served record plans it without the hub (``planned``: ``plan_from_record``'s
    plan, where the caller has it), whether it is made once and shipped (``model_ship_artifacts``),
    and whether this host's blob cache (``index``) holds its checkpoint (such a host is the run's
    preferred maker: ``roles/model/ship.py``)."""
    plan = planned or plan_from_record(settings, served) or plan_from_pinned_record(settings, served)
    return {"stamp": plan.name if plan else None, "ship": settings.model.ship_artifacts,
            "cache_holds": bool(plan and plan.cache_holds(index or {}))}
