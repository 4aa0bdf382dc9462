"""The shell scripts that switch, check, retire and pin a host's llama-server units.

Each takes the units it acts on (``plan.UnitRef``: name, file, port); every path and
name goes through ``shlex.quote``. A unit's /health URL and cards are read from its own
first lines (``HEALTH_MARK``, ``RESIDENCY_MARK``), so a rollback checks the previous
unit's address.
"""

from __future__ import annotations

import shlex

from llamarack import remote
from llamarack.layout import UNIT_DIR, UNIT_GLOBS, UNIT_NAME
from roles.settings import Settings

from .plan import HEALTH_MARK, RESIDENCY_MARK, UnitRef

# Held by a switch while it runs: one whose run died (SSH dropped, pyinfra killed) goes on
# on the host, and the next run's switch must not restart a service under its check.
SWITCH_LOCK = "/run/llamarack-server-switch.lock"


def label(name: str) -> str:
    """How the messages name a unit: ``llama-server`` for a host's one, else its unit's name."""
    return "llama-server" if name == UNIT_NAME else name.removesuffix(".service")


def health_function() -> str:
    """The shell function ``health UNIT_FILE SECONDS``: waits for the /health URL the unit
    names (its first lines) to answer 200, and for it to serve from its cards; fails at
    once when the unit stops."""
    return f"""
health() {{
  url=$(sed -n 's|^{HEALTH_MARK}||p' "$1")
  on=$(sed -n 's|^{RESIDENCY_MARK}||p' "$1")
  {remote.command("wait_healthy")} "$url" "${{1##*/}}" "$2" "$on"
}}"""


def _switch_one(settings: Settings, unit: UnitRef) -> str:
    """One unit's switch, in a subshell: a unit that fails rolls back only itself, and the
    script goes on with the next (``failed`` names the ones that failed)."""
    u, svc, say = shlex.quote(unit.path), shlex.quote(unit.name), shlex.quote(label(unit.name))
    timeout = settings.server.health_timeout
    state, previous = shlex.quote(settings.layout.state), shlex.quote(settings.layout.previous_unit_of(unit.name))
    return f"""(
rollback() {{
  printf '%s: %s\\n' {say} "$1" >&2
  journalctl -u {svc} -n 30 --no-pager -o cat >&2 || true
  if [ -f {u}.prev ]; then
    mv -f {u}.prev {u} && systemctl daemon-reload && systemctl restart {svc}
    if health {u} {timeout}; then
      echo {say}": rolled back: the previous unit is serving again" >&2
    else
      echo {say}": rolled back, but the previous unit does not answer /health either" >&2
    fi
  else
    systemctl disable --now {svc} >/dev/null 2>&1 || true
    rm -f {u}; systemctl daemon-reload
    echo {say}": no previous unit to roll back to: the new one is removed" >&2
  fi
  exit 1
}}
# A .prev already there is the last unit that passed /health: an earlier switch was cut
# off before its check, and the unit now in place is unproven. Keep the proven one.
if [ ! -f {u}.prev ] && [ -f {u} ]; then cp -p {u} {u}.prev; fi
mv -f {u}.new {u} && systemctl daemon-reload && systemctl enable -q {svc} \\
  && systemctl restart {svc} || rollback "the new unit did not start"
health {u} {timeout} || rollback "the new unit is not healthy"
# The unit it replaced stays as the previous one, for `llamarack rollback`.
if [ -f {u}.prev ] && ! cmp -s {u}.prev {u}; then mkdir -p {state} && mv -f {u}.prev {previous}; fi
rm -f {u}.prev
echo {say}" answers /health"
) || failed="$failed {unit.name}"
"""


def switch_script(settings: Settings, units: tuple, stop_first: bool = False) -> str:
    """For each unit (its file staged as ``<unit>.new``): move it in, restart, wait for
    /health; on failure restore its previous unit and restart it, print the new one's
    journal. Exits 1 when any failed. ``stop_first``: stop every one of them before the
    first starts (their cards changed: a unit must not start on a card another still
    holds). One switch at a time: a second waits for the first (``SWITCH_LOCK``)."""
    timeout = settings.server.health_timeout
    wait = (2 * timeout + 120) * max(len(units), 1)  # the other switch's checks, and its rollbacks'
    stop = f"systemctl stop {' '.join(shlex.quote(u.name) for u in units)} || true\n" if stop_first else ""
    return f"""
exec 9>>{shlex.quote(SWITCH_LOCK)}
flock -w {wait} 9 || {{ echo "llama-server: another unit switch is still running after {wait} s" >&2; exit 1; }}{health_function()}
failed=""
{stop}{"".join(_switch_one(settings, u) for u in units)}[ -z "$failed" ] || {{ echo "llama-server: not switched:$failed" >&2; exit 1; }}
"""


# The end of the heredoc that carries a detached script to the host: no script line is it.
_END = "LLAMARACK_DETACHED_END"
# Where a detached script, its output and its status lie while it runs: root's tmpfs.
DETACHED_DIR = "/run"


def detached(script: str, what: str) -> str:
    """``script`` run on the host as a transient systemd service of its own, detached from the
    SSH session that starts it: once started it finishes, or rolls back, whatever becomes of
    the run (pyinfra killed, the SSH connection cut, the operator's laptop asleep). A dying
    session cannot take it down halfway either: no write to a closed pipe kills it, its output
    goes to a file. This command writes the script into a directory of root's under /run,
    starts it (``systemd-run``), waits for its result, prints its output (to stderr when it
    failed) and exits with its status. ``what``: the service's description."""
    if any(line == _END for line in script.splitlines()):
        raise ValueError("the script holds the heredoc's end line")
    q = shlex.quote
    where = q(DETACHED_DIR)
    return f"""find {where} -maxdepth 1 -name 'llamarack-switch.*' -mmin +1440 -exec rm -rf {{}} + 2>/dev/null
run=$(mktemp -d {where}/llamarack-switch.XXXXXX) || exit 1
cat > "$run/script" <<'{_END}'
dir=$(dirname "$0")
(
{script}
) > "$dir/log" 2>&1
echo $? > "$dir/rc.new" && mv -f "$dir/rc.new" "$dir/rc"
{_END}
unit="llamarack-switch-${{run##*.}}.service"
systemd-run --quiet --collect --unit="$unit" --description={q(what)} /bin/sh "$run/script" || {{ rm -rf "$run"; exit 1; }}
while [ ! -f "$run/rc" ]; do
  case $(systemctl is-active "$unit") in active|activating|reloading) sleep 0.2 ;; *) break ;; esac
done
if [ -f "$run/rc" ]; then rc=$(cat "$run/rc"); else rc=1; echo "$unit ended without a result" >> "$run/log"; fi
if [ "$rc" = 0 ]; then cat "$run/log"; else cat "$run/log" >&2; fi
rm -rf "$run"
exit "$rc"
"""


def health_check_script(settings: Settings, reason: str, restart: bool = False, units=None, host_name: str = "") -> str:
    """Wait for each unit in place (``units``; None: every unit file of the host) to answer
    /health, restarting it first with ``restart``; else print its journal. Exits 1 when one
    does not answer. No unit: nothing to check."""
    timeout = settings.server.health_timeout
    start = 'systemctl restart "$svc" && ' if restart else ""
    host, why = shlex.quote(host_name), shlex.quote(reason)
    paths = [f"{shlex.quote(UNIT_DIR)}/{g}" for g in UNIT_GLOBS] if units is None else \
        [shlex.quote(u.path) for u in units]  # fmt: skip
    return f"""{health_function()}
checked=""; failed=""
for u in {" ".join(paths)}; do
  [ -f "$u" ] || continue
  svc=${{u##*/}}; name=${{svc%.service}}; [ "$svc" != {UNIT_NAME} ] || name=llama-server
  checked=1
  if {start}health "$u" {timeout}; then echo "$name answers /health after "{why}; continue; fi
  printf '%s: %s does not answer /health after %s (its journal follows)\\n' {host} "$name" {why} >&2
  journalctl -u "$svc" -n 30 --no-pager -o cat >&2 || true
  failed=1
done
if [ -z "$checked" ]; then echo "no llama-server unit: nothing to check"; exit 0; fi
[ -z "$failed" ] || exit 1
"""


def retire_script(settings: Settings, units: tuple) -> str:
    """Stop, disable and remove units no longer wanted: their files, and their previous
    unit and rollback pin (a unit of another layout is no rollback target)."""
    layout = settings.layout
    names = " ".join(shlex.quote(u.name) for u in units)
    files = " ".join(shlex.quote(p) for u in units
                     for p in (u.path, f"{u.path}.prev", f"{u.path}.new", layout.previous_unit_of(u.name),
                               layout.rollback_pin_of(u.name)))  # fmt: skip
    return f"systemctl disable --now {names} >/dev/null 2>&1 || true; rm -f {files} && systemctl daemon-reload"


def pin_script(settings: Settings, unit: UnitRef) -> str:
    """After a rollback's switch: back on the unit the last pin replaced, that is undone; else
    pin the unit put back (``state/rollback[@N].json``)."""
    layout = settings.layout
    u, prev, pin = (shlex.quote(p) for p in (unit.path, layout.previous_unit_of(unit.name),
                                            layout.rollback_pin_of(unit.name)))  # fmt: skip
    say = shlex.quote(label(unit.name))
    return f"""new=$(sha1sum < {u} | cut -d' ' -f1); old=$(sha1sum < {prev} | cut -d' ' -f1)
if [ -f {pin} ] && grep -q "\\"replaced_sha1\\": \\"$new\\"" {pin}; then
  rm -f {pin}; echo {say}": rolled forward to the unit the settings want: the rollback pin is released"
else
  printf '{{"unit_sha1": "%s", "replaced_sha1": "%s", "at": %s}}\\n' "$new" "$old" "$(date +%s)" > {pin}.new \\
    && mv -f {pin}.new {pin} && echo {say}": rolled back and pinned: deploys keep this unit until the settings change"
fi"""
