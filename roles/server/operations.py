"""llama-server under systemd as one pyinfra operation: plan, write, restart,
check /health, and roll back to the previous unit when the new one fails.

The unit names the build and model directories it serves
(``builds/<stamp>``, ``models/<stamp16>``), not the ``current`` links: the
running server keeps its files while a later run builds or fetches new
ones, and the unit's text changes exactly when what it serves changes.

The operation reads its facts when it runs (pyinfra 3 runs an operation's
body at execution time), so a first run plans from the build and model that
the llama.cpp and model roles made earlier in the same run.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Optional

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import File, FileContents, Link, Sha1File
from pyinfra.operations.util.files import generate_color_diff
from pyinfra.facts.server import Command

from llamarack import remote
from llamarack.roles.llamacpp.reads import BenchRecord, BuildSeals, LlamaServerFlags
from llamarack.roles.driver.reads import CharDevices, RecordedGpus
from llamarack.roles.model.reads import GgufShape, ModelArtifact
from llamarack.roles.server.reads import NOLOGIN, SERVICE_USER_MARK, SystemGroup, SystemUser, UnitState, active_since
from llamarack.facts import read
from llamarack.layout import API_KEY_PATH, UNIT_NAME, UNIT_PATH, unit_build
from llamarack.operations import executing, private_upload, refusal, secret_upload
from llamarack.roles.server.files.secret_digest import digest
from llamarack.rules import account_failure
from llamarack.secrets import read_token
from llamarack.settings import Settings

from .plan import (HEALTH_MARK, KEY_DIGEST_SALT, RESIDENCY_MARK, PlanError, bench_args, card_compute_cap, card_mib, health_url,
                   key_digest_command, parse_pin, plan_context, roofline, wanted_unit)  # fmt: skip

def service_user(settings: Settings):
    """
    The system user (and its group) for llama-server, with no shell and no home of its own
    (``llamarack_service_user``; its home, not created, is the llamarack root): a
    ``system_account`` operation.
    """
    user = settings.general.service_user
    return system_account(name=f"Service user {user}", user=user, home=settings.general.root,
                          setting="llamarack_service_user")


@operation()
def system_account(user: str, home: str, setting: Optional[str] = None):
    """
    A system user (and its group of the same name), with no shell and no home of its own.

    + user: the account
    + home: its home (not created)
    + setting: the setting that names it, for the refusal's fix

    Made with the mark ``SERVICE_USER_MARK`` in its GECOS field; an account llamarack
    did not make is refused, unchanged (``llamarack.rules.account_failure``; preflight
    checks the service user's before anything is touched). Reads the one account
    (``SystemUser``) and group (``SystemGroup``), not every account of the host.
    """
    entry = read(SystemUser, user=user)
    failure = account_failure(user, home, setting, entry, read(SystemGroup, group=user))
    if failure:
        yield refusal(failure.message(host.name))
    elif entry is None:
        # --system: a uid in the system range; --user-group: a group of the same name.
        yield StringCommand("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", home,
                            "--shell", NOLOGIN, "--comment", QuoteString(SERVICE_USER_MARK), user)  # fmt: skip
    elif (entry.home, entry.shell, entry.gecos) != (home, NOLOGIN, SERVICE_USER_MARK):
        yield StringCommand("usermod", "--home", home, "--shell", NOLOGIN, "--comment",
                            QuoteString(SERVICE_USER_MARK), user)  # fmt: skip
    else:
        host.noop(f"user {user} exists")


def _linked(current: str) -> Optional[str]:
    """The directory the link ``current`` (``builds/current``, ``models/current``) points at, or None."""
    link = read(Link, path=current)
    if not link or not link.get("link_target"):
        return None
    target = link["link_target"]
    return target if target.startswith("/") else f"{current.rsplit('/', 1)[0]}/{target}"


# Held by a switch while it runs: one whose run died (SSH dropped, pyinfra killed) goes on
# on the host, and the next run's switch must not restart the service under its check.
SWITCH_LOCK = "/run/llamarack-server-switch.lock"


def health_function() -> str:
    """The shell function ``health SECONDS``: waits for the /health URL the unit names
    (its first lines) to answer 200; fails at once when the unit stops."""
    return f"""
health() {{
  url=$(sed -n 's|^{HEALTH_MARK}||p' {shlex.quote(UNIT_PATH)})
  on=$(sed -n 's|^{RESIDENCY_MARK}||p' {shlex.quote(UNIT_PATH)})
  {remote.command("wait_healthy")} "$url" {UNIT_NAME} "$1" "$on"
}}"""


def switch_script(settings: Settings) -> str:
    """Move the staged unit in, restart, wait for /health; on failure restore the
    previous unit and restart it, print the new one's journal, and exit 1. One
    switch at a time: a second waits for the first (``SWITCH_LOCK``)."""
    u, svc = shlex.quote(UNIT_PATH), UNIT_NAME
    timeout = settings.server.health_timeout
    wait = 2 * timeout + 120  # the other switch's check, and its rollback's
    state, previous = shlex.quote(settings.layout.state), shlex.quote(settings.layout.previous_unit)
    return f"""
exec 9>>{shlex.quote(SWITCH_LOCK)}
flock -w {wait} 9 || {{ echo "llama-server: another unit switch is still running after {wait} s" >&2; exit 1; }}{health_function()}
rollback() {{
  printf 'llama-server: %s\\n' "$1" >&2
  journalctl -u {svc} -n 30 --no-pager -o cat >&2 || true
  if [ -f {u}.prev ]; then
    mv -f {u}.prev {u} && systemctl daemon-reload && systemctl restart {svc}
    if health {timeout}; then
      echo "rolled back: the previous unit is serving again" >&2
    else
      echo "rolled back, but the previous unit does not answer /health either" >&2
    fi
  else
    systemctl disable --now {svc} >/dev/null 2>&1 || true
    rm -f {u}; systemctl daemon-reload
    echo "no previous unit to roll back to: the new one is removed" >&2
  fi
  exit 1
}}
# A .prev already there is the last unit that passed /health: an earlier switch was cut
# off before its check, and the unit now in place is unproven. Keep the proven one.
if [ ! -f {u}.prev ] && [ -f {u} ]; then cp -p {u} {u}.prev; fi
mv -f {u}.new {u} && systemctl daemon-reload && systemctl enable -q {svc} \\
  && systemctl restart {svc} || rollback "the new unit did not start"
health {timeout} || rollback "the new unit is not healthy"
# The unit it replaced stays as the previous one, for `llamarack rollback`.
if [ -f {u}.prev ] && ! cmp -s {u}.prev {u}; then mkdir -p {state} && mv -f {u}.prev {previous}; fi
rm -f {u}.prev
echo "llama-server answers /health"
"""


@operation(is_idempotent=False)
def answers_health(settings: Settings, reason: str):
    """
    Fail unless the llama-server unit answers ``/health`` within ``server_health_timeout``.

    + settings: the host's settings (``server_health_timeout``)
    + reason: why it is checked (for the messages), e.g. the driver role's reboot

    For a server that was not switched by this run but started anew anyway: after
    the reboot for a driver upgrade, the unit is the same text, yet it runs on a
    new driver. A host without the unit has nothing to check.
    """
    yield StringCommand(health_check_script(settings, reason))


def health_check_script(settings: Settings, reason: str, restart: bool = False) -> str:
    """Wait for the unit in place to answer /health (restarting it first with ``restart``);
    else print its journal and exit 1. No unit: nothing to check."""
    u = shlex.quote(UNIT_PATH)
    timeout = settings.server.health_timeout
    fail = shlex.quote(f"{host.name}: llama-server does not answer /health after {reason} (its journal follows)")
    start = f"systemctl restart {UNIT_NAME} && " if restart else ""
    return f"""{health_function()}
if [ ! -f {u} ]; then echo "no llama-server unit: nothing to check"; exit 0; fi
if {start}health {timeout}; then echo {shlex.quote(f"llama-server answers /health after {reason}")}; exit 0; fi
printf '%s\\n' {fail} >&2
journalctl -u {UNIT_NAME} -n 30 --no-pager -o cat >&2 || true
exit 1
"""


def _served(root: str, unit_lines) -> tuple[Optional[str], Optional[str]]:
    """The build directory name and the model file a unit's ExecStart runs (None where it names none)."""
    line = next((x for x in unit_lines or () if x.startswith("ExecStart=")), None)
    try:
        words = shlex.split(line.split("=", 1)[1]) if line else []
    except ValueError:
        words = []
    model = words[words.index("--model") + 1] if "--model" in words[:-1] else None
    return unit_build(root, unit_lines), model


def _served_by(root: str, unit_lines) -> str:
    """"build B, model M": what a unit runs, for people."""
    build, model = _served(root, unit_lines)
    return f"build {build or '?'}, model {Path(model).parent.name if model else '?'}"


@operation(is_idempotent=False)
def rollback(settings: Settings):
    """
    Put back the unit that served before the last switch (``state/previous.service``):
    its build and model, switched in as any unit is (restart, ``/health``, the unit in
    place restored if it does not answer), then pinned (``state/rollback.json``).

    + settings: the host's settings (root, ``server_health_timeout``)

    The pin keeps later deploys from undoing it while the settings still want the
    unit it replaced; changed settings release it, and a second rollback (forward
    again, to the unit the settings want) removes it.
    """
    layout, root = settings.layout, settings.general.root
    previous = read(FileContents, path=layout.previous_unit)
    if not previous:
        yield refusal(f"{host.name}: rollback: no previous unit ({layout.previous_unit}): no switch "
                      "recorded one since llamarack kept them")  # fmt: skip
        return
    build = unit_build(root, previous)
    if build and read(BuildSeals, root=root).tampered(build):
        yield refusal(f"{host.name}: rollback: build {build} differs from its seal; not putting it back")
        return
    now = _served_by(root, read(FileContents, path=UNIT_PATH))
    host.log(f"rolling back to {_served_by(root, previous)} (from {now})", logger.info)
    u, prev, pin = (shlex.quote(p) for p in (UNIT_PATH, layout.previous_unit, layout.rollback_pin))
    model = _served(root, previous)[1]
    needed = ([f"{layout.build(build)}/bin/llama-server"] if build else []) + ([model] if model else [])
    yield (" && ".join(f"test -e {shlex.quote(p)}" for p in needed) or "true") + (
        f" || {{ echo {shlex.quote(f'{host.name}: rollback: the previous unit names files that are gone')} >&2; exit 1; }}")
    yield f"cp -p {prev} {u}.new && chmod 644 {u}.new"
    yield StringCommand(switch_script(settings))
    # Back on the unit the last pin replaced: that is undone; else pin the unit put back.
    yield StringCommand(f"""new=$(sha1sum < {u} | cut -d' ' -f1); old=$(sha1sum < {prev} | cut -d' ' -f1)
if [ -f {pin} ] && grep -q "\\"replaced_sha1\\": \\"$new\\"" {pin}; then
  rm -f {pin}; echo "rolled forward to the unit the settings want: the rollback pin is released"
else
  printf '{{"unit_sha1": "%s", "replaced_sha1": "%s", "at": %s}}\\n' "$new" "$old" "$(date +%s)" > {pin}.new \\
    && mv -f {pin}.new {pin} && echo "rolled back and pinned: deploys keep this unit until the settings change"
fi""")


def _show_unit_diff(unit: str) -> None:
    """With ``--diff``, print how the unit file changes, as pyinfra's files.put does."""
    config = getattr(host.state, "config", None)
    if not getattr(config, "DIFF", False):
        return
    current = read(FileContents, path=UNIT_PATH)
    host.log(f"Will {'modify' if current else 'create'} {UNIT_PATH}", logger.info)
    for line in generate_color_diff([line + "\n" for line in current or []], unit.splitlines(keepends=True)):
        logger.info("  %s", line)
    logger.info("")


def _draft(settings: Settings) -> Optional[tuple]:
    """(directory, shape) of the draft model ``models/draft`` points at, when one is asked."""
    draft_dir = _linked(settings.layout.draft_model) if settings.model.draft_repo else None
    return (draft_dir, read(GgufShape, path=f"{draft_dir}/model.gguf")) if draft_dir else None


def _cards(settings: Settings, seen: tuple) -> tuple:
    """The run's GPUs: preflight's (``HostFacts.gpus``); when it had none (a driver
    that hid them until the driver role's reboot), the record that role wrote."""
    return seen or read(RecordedGpus, path=settings.layout.gpus_record) or ()


def _devices(settings: Settings) -> tuple:
    """The host's character devices, on a CUDA build (the unit allows the driver's)."""
    return tuple(read(CharDevices)) if settings.llamacpp.backend == "cuda" else ()


def _not_made_yet(root: str, build: bool, model: bool):
    """The command for a host without the current build or model: a refusal when
    executing; with ``--dry`` on a fresh host, a note that the unit follows them (they
    come from earlier operations of this run)."""
    missing = [n for n, v in (("llama.cpp build", build), ("model", model)) if not v]
    if host.state.is_executing:
        return refusal(f"{host.name}: server: no current {' and no '.join(missing)} under {root}; "
                       "the llama.cpp and model roles make them (see their output above)")  # fmt: skip
    made = f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} made"
    return StringCommand(f"echo 'write {UNIT_NAME} once the {made}'")


def _rollback_pin(settings: Settings, unit: str) -> tuple:
    """(pin, held, held_by, unit_changed): the pin ``llamarack rollback`` wrote, whether it
    holds the unit in place against ``unit``, what that unit serves, and whether the unit
    file is to change (``--diff`` shows how)."""
    found_sha1, wanted_sha1 = read(Sha1File, path=UNIT_PATH), hashlib.sha1(unit.encode()).hexdigest()
    # `llamarack rollback` put an earlier unit back: it stays while the settings still
    # want the very unit it replaced; a change of what they want releases it.
    pin = parse_pin(read(FileContents, path=settings.layout.rollback_pin))
    held = bool(pin) and pin.get("unit_sha1") == found_sha1 and pin.get("replaced_sha1") == wanted_sha1
    held_by = _served_by(settings.general.root, read(FileContents, path=UNIT_PATH)) if held else None
    unit_changed = found_sha1 != wanted_sha1 and not held
    if unit_changed:
        _show_unit_diff(unit)
    return pin, held, held_by, unit_changed


def _running_and_remade(model_dir: str, held: bool) -> tuple[bool, bool]:
    """Whether llama-server runs, and whether its model was remade in place since it started
    (its directory's name is its stamp: the unit is the same text, and only a restart
    serves the new file)."""
    unit_state = read(UnitState, unit=UNIT_NAME)
    running = unit_state.get("SubState") == "running"
    served = read(ModelArtifact, path=model_dir)
    sealed_at, since = (served.record or {}).get("sealed_at") if served else None, active_since(unit_state)
    # systemd says whole seconds: the server started in [since, since + 1).
    remade = bool(running and sealed_at and since and sealed_at >= since + 1) and not held
    return running, remade


def _api_key(settings: Settings):
    """The API key file as the settings want it (uploaded, or removed when none is set);
    returns whether it changed."""
    key = read_token(settings.server.api_key_file, "server_api_key_file")
    host_key = read(Command, command=key_digest_command())
    if key is not None and host_key != digest((key + "\n").encode(), KEY_DIGEST_SALT):
        yield from secret_upload(key + "\n", API_KEY_PATH, mode="640", group=settings.general.service_user)
        return True
    if key is None and host_key != "missing":
        yield f"rm -f {shlex.quote(API_KEY_PATH)}"
        return True
    return False


def _unproven() -> bool:
    """Whether the unit in place never answered /health: a switch cut off before its check
    left the proven unit as .prev, so the unit is checked now (and rolled back if it does
    not answer)."""
    unproven = read(File, path=f"{UNIT_PATH}.prev") is not None
    if unproven:
        host.log(f"{UNIT_PATH} never passed its /health check (an earlier switch was cut off): "
                 "switching again", logger.warning)  # fmt: skip
    return unproven


def _keep_rolled_back(settings: Settings, held_by: str, restart: bool):
    """Keep the unit ``llamarack rollback`` put back; with ``restart``, restart it and
    check /health."""
    host.log(f"llama-server runs the unit `llamarack rollback` put back ({held_by}); "
             "the settings still want the unit it replaced: kept (change the settings, or run "
             "`llamarack rollback` again to go forward)", logger.warning)  # fmt: skip
    if not restart:
        host.noop("llama-server serves the unit `llamarack rollback` put back")
        return
    yield StringCommand(health_check_script(settings, "a restart of the rolled-back unit", restart=True))


def _switch_to(settings: Settings, unit: str, pin: Optional[dict]):
    """Stage ``unit`` and switch to it (``switch_script``), releasing a rollback pin."""
    if pin is not None:
        host.log("the settings changed since `llamarack rollback`: its pin is released", logger.warning)
        yield f"rm -f {shlex.quote(settings.layout.rollback_pin)}"
    yield from private_upload(unit, f"{UNIT_PATH}.new")
    yield f"chmod 644 {shlex.quote(UNIT_PATH)}.new"
    yield StringCommand(switch_script(settings))


@operation()
def service(settings: Settings, gpus: tuple = (), templates: tuple = ()):
    """
    Serve ``models/current`` with ``builds/current`` under systemd.

    + settings: the host's settings (server, general, llamacpp backend)
    + gpus: the run's GPUs (``HostFacts.gpus``); empty: the record, read when this runs
    + templates: folders whose templates replace the role's own (the project's templates/)

    The smallest of the host's GPUs bounds the context; a host without GPUs
    serves from the CPU, bounded by the model's trained context only.

    Refuses (exit 1, nothing touched) when the plan does not fit the card. A unit
    that changed is written, the service restarted, and ``/health`` must answer
    200 within ``server_health_timeout``; otherwise the previous unit is put
    back and restarted. The API key goes to the host as a file (mode 640,
    group of the service user), never on a command line.
    """
    root, layout = settings.general.root, settings.layout
    build_dir, model_dir = _linked(layout.current_build), _linked(layout.current_model)
    flags = read(LlamaServerFlags, root=root)
    shape = read(GgufShape, path=f"{model_dir}/model.gguf") if model_dir else None
    if not (build_dir and flags and shape):
        yield _not_made_yet(root, bool(build_dir and flags), bool(shape))
        return

    draft = _draft(settings)
    try:
        unit, ctx = wanted_unit(settings, flags, build_dir, model_dir, shape, _cards(settings, gpus), templates,
                                draft=draft if draft and draft[1] else None, devices=_devices(settings))  # fmt: skip
    except PlanError as e:
        yield refusal(e.failure.message(host.name))
        return

    pin, held, held_by, unit_changed = _rollback_pin(settings, unit)
    running, remade = _running_and_remade(model_dir, held)
    key_changed = yield from _api_key(settings)
    if remade:
        host.log(f"{model_dir} was sealed after llama-server started: restarting it", logger.info)
    unproven = _unproven()
    if held:
        yield from _keep_rolled_back(settings, held_by, key_changed or unproven or not running)
        return
    if not (unit_changed or key_changed or remade or unproven or not running):
        # A pin that holds nothing (the unit in place is the one the settings want) is left
        # as it is: nothing to change, and the next switch releases it.
        host.noop(f"llama-server serves {Path(model_dir).name} with build {Path(build_dir).name}, "
                  f"{ctx.note}")  # fmt: skip
        return
    yield from _switch_to(settings, unit, pin)


@operation()
def bench(settings: Settings, gpus: tuple = ()):
    """
    Run llama-bench (pp512, tg128) with the served flags after a new build or model, and
    record it in ``<root>/state/bench.json`` beside the roofline of the host's card.

    + settings: the host's settings (``server_bench``: stopped, beside or off)
    + gpus: the run's GPUs (``HostFacts.gpus``)

    The record is keyed by the served build's stamp and model's: a host whose record
    names them does nothing (a converged run never benchmarks). With ``stopped``,
    llama-server is stopped for the bench and started again, and must answer
    ``/health`` within ``server_health_timeout``; with ``beside`` it keeps serving and
    shares the card (the figures are then lower). The run says which it did.
    """
    mode, layout = settings.server.bench, settings.layout
    # Read before this operation's first command (llamarack.facts.reading's rule).
    record = read(BenchRecord, path=layout.bench_record)
    build_dir, model_dir = _linked(layout.current_build), _linked(layout.current_model)
    if mode == "off":
        host.noop("llama-bench is off (server_bench = 'off')")
        return
    if not (build_dir and model_dir):
        host.noop("llama-bench: no current build or model to measure")
        return
    key = {"build": Path(build_dir).name, "model": Path(model_dir).name}
    if record and record.get("key") == key:
        pp, tg = (record.get(t, {}).get("tokens_per_second") for t in ("pp512", "tg128"))
        host.noop(f"llama-bench has measured build {key['build']} with model {key['model']}: "
                  f"pp512 {pp} t/s, tg128 {tg} t/s")  # fmt: skip
        return
    flags = read(LlamaServerFlags, root=settings.general.root)
    shape = read(GgufShape, path=f"{model_dir}/model.gguf")
    if not (flags and shape):
        host.noop("llama-bench: the build's flags or the model's header are unreadable; not measured")
        return
    cards = _cards(settings, gpus)
    draft = _draft(settings)
    cuda = settings.llamacpp.backend == "cuda"
    try:
        ctx = plan_context(settings, shape, card_mib(cards), draft[1] if draft else None, card_compute_cap(cards))
    except PlanError as e:
        yield refusal(e.failure.message(host.name))
        return
    args = bench_args(settings, flags, build_dir, model_dir, ctx, cuda)
    entry = {"key": key, "mode": mode, "backend": settings.llamacpp.backend, "on_card": cuda,
             "served": {"cache_type_k": ctx.cache_type_k, "cache_type_v": ctx.cache_type_v,
                        "gpu_layers": ctx.gpu_layers if cuda else None},
             "roofline": roofline(cards, shape)}  # fmt: skip
    run = remote.command("bench_record", layout.bench_record, json.dumps(entry, sort_keys=True), *args)
    where = "on the CPU build (the roofline is the card's, not this measurement's)" if not cuda else "on the card"
    if mode == "stopped":
        if executing():
            logger.info(f"{host.print_prefix}llama-bench {where}: llama-server is stopped for it and started "
                        "again (server_bench = 'stopped')")  # fmt: skip
        svc = UNIT_NAME
        wait = remote.command("wait_healthy", health_url(settings), svc, str(settings.server.health_timeout))
        back = f"systemctl start {svc} && {wait}"
        yield (f"systemctl stop {svc}; {run}; rc=$?; "
               f"{back} || {{ echo 'llama-server did not answer /health after the bench' >&2; exit 1; }}; "
               "exit $rc")  # fmt: skip
    else:
        if executing():
            logger.info(f"{host.print_prefix}llama-bench {where}, while llama-server serves beside it "
                        "(server_bench = 'beside': they share the card)")  # fmt: skip
        yield run
