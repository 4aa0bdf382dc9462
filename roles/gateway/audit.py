"""The gateway role's audit item, on the hosts of group ``gateways``: the backends HAProxy's
runtime API shows, each with its state, against those its config names, every one UP."""

from llamarack.audit import Item, Seen
from llamarack.facts import FactRead
from roles.settings import Settings

from .plan import BACKEND, HAPROXY_CONFIG
from .reads import ConfiguredServers, HaproxyServers


def reads(settings: Settings, verify: bool = False) -> tuple[FactRead, ...]:
    if not settings.is_gateway:
        return ()
    return (FactRead.of(HaproxyServers, backend=BACKEND), FactRead.of(ConfiguredServers, path=HAPROXY_CONFIG))


def state(server: dict) -> str:
    """A server's state as HAProxy words it (UP, DOWN, MAINT, DRAIN...), with its last
    check's status where the server is not UP (``DOWN L7TOUT``: /slots did not answer)."""
    status, check = server.get("status") or "?", server.get("check") or ""
    return status if status == "UP" or not check else f"{status} {check}"


def items(seen: Seen) -> dict[str, Item]:
    if not seen.settings.is_gateway:
        return {}
    answer = seen.fact(HaproxyServers, backend=BACKEND)
    configured = seen.fact(ConfiguredServers, path=HAPROXY_CONFIG) or []
    wanted = {"backends": {name: "UP" for name in configured}}
    if answer is None:
        found = {"backends": None, "error": "HAProxy does not answer on its admin socket"}
        return {"gateway": Item(found, wanted, drift=True)}
    found = {"backends": {name: state(server) for name, server in answer["servers"].items()}}
    return {"gateway": Item(found, wanted, drift=found["backends"] != wanted["backends"] or not configured)}
