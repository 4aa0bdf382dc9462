"""The gateway role: its settings, HAProxy's config for a rack (against a literal file, and
through ``haproxy -c`` where HAProxy is installed), its operations in pyinfra's fixture
style, Prometheus's files, and the audit item read from a real runtime API capture."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File, Sha1File
from pyinfra.facts.server import Command

from llamarack.audit import Answers, Seen
from roles.audit import audit_reads, role_audits
from llamarack.errors import SettingsError
from llamarack.facts import FactRead
from llamarack.facts.reading import Answer
from roles.gateway import audit, operations
from roles.gateway.files import haproxy_runtime
from roles.gateway.operations import haproxy, node_exporter, prometheus_targets
from roles.gateway.plan import (HAPROXY_CONFIG, TARGETS, GatewayError, alert_rules, backends_of,
                                          haproxy_config, prometheus_config, rack_key, ring_weights, server_name,
                                          serving_host, targets)  # fmt: skip
from roles.gateway.reads import ConfiguredServers, HaproxyServers
from roles.gateway.settings import ADMIN_SOCKET
from roles.preflight.reads import role_reads
from roles.server.files.secret_digest import digest
from roles.server.reads import secret_digest_command
from roles.server.reads import KEY_DIGEST_SALT
from roles.server.reads import UnitState
from roles.settings import load_settings, private_dirs
from tests.support.ophost import PRIVATE_DIR_SHOWN, fact_key, run_op

HERE = Path(__file__).resolve().parent
CAPTURE = HERE.parent / "fixtures/haproxy/show-stat.csv"
BASE = {"python_env_backend": "venv"}
SERVING = {**BASE, "server_listen": "0.0.0.0", "server_allow_unauthenticated": True}
RUNNING = {"ActiveState": "active", "SubState": "running", "MainPID": "812"}


def gateway_settings(**data):
    return load_settings("lab-gw", {**BASE, **data}, groups=("lab", "gateways"))


def host(name, address, units=None, bench=None, **data):
    """(ServingHost, units record, bench record) of one serving host."""
    return serving_host(name, address, load_settings(name, {**SERVING, **data})), units, bench


# A rack of four: three hosts of one unit (two without a units record), one of 8 cards.
RACK = [
    host("lab-v100-a", "10.77.0.11", server_parallel=4, bench={"tg128": {"tokens_per_second": 31.5}}),
    host("lab-v100-b", "10.77.0.12"),
    host("lab-t4", "10.77.0.14",
         units={"units": [{"index": 0, "unit": "llamarack-server.service", "port": 8080, "listen": "0.0.0.0",
                           "parallel": 2, "cards": ["GPU-t4"]}]}),
    host("h200-x8", "gpu8.rack.example",
         units={"units": [{"index": i, "unit": f"llamarack-server@{i}.service", "port": 8080 + i,
                           "listen": "0.0.0.0", "parallel": 8, "cards": [f"GPU-{i}"]} for i in range(8)]},
         bench={"tg128": {"tokens_per_second": 140}}),
]  # fmt: skip
HOSTS = tuple(h for h, _, _ in RACK)


def rack_backends():
    return [b for h, units, bench in RACK for b in backends_of(h, units, bench)]


# --- settings -------------------------------------------------------------------------------


def test_defaults_and_the_gateway_group():
    s = gateway_settings()
    assert s.is_gateway and not load_settings("gpu01", BASE).is_gateway
    g = s.gateway
    assert (g.port, g.bind, g.tls_cert_file, g.api_key, g.stats_port) == (8000, "0.0.0.0", None, "pass-through", 8404)
    assert (g.prometheus, g.node_exporter, g.slow_fraction, ADMIN_SOCKET) == (
        False, False, 0.5, "/run/haproxy/admin.sock")  # fmt: skip
    assert (g.balance, g.balance_factor) == ("affinity", 300)


@pytest.mark.parametrize("data, expected", [
    ({"gateway_port": 8404}, "gateway_stats_port: given 8404; allowed: a port other than gateway_port (8404)"),
    ({"gateway_port": 0}, "gateway_port: given 0; allowed: an integer from 1 to 65535"),
    ({"gateway_bind": "0.0.0.0; rm"}, "gateway_bind: given '0.0.0.0; rm'; allowed: an IP address"),
    ({"gateway_api_key": "none"}, "gateway_api_key: given 'none'; allowed: one of 'pass-through', 'checked'"),
    ({"gateway_tls_cert_file": "cert.pem"}, "gateway_tls_cert_file: given 'cert.pem'; allowed: an absolute path"),
    ({"gateway_slow_fraction": 2.0}, "gateway_slow_fraction: given 2.0; allowed: a number from 0.01 to 1"),
    ({"gateway_check_timeout": 0}, "gateway_check_timeout: given 0; allowed: an integer from 1 to 600"),
    ({"gateway_prometheus": "yes"}, "gateway_prometheus: given 'yes'; allowed: true or false"),
    ({"gateway_balance": "roundrobin"}, "gateway_balance: given 'roundrobin'; allowed: one of 'affinity', 'leastconn'"),
    ({"gateway_balance_factor": 100}, "gateway_balance_factor: given 100; allowed: an integer from 101 to 10000"),
])  # fmt: skip
def test_bad_gateway_settings_are_refused(data, expected):
    with pytest.raises(SettingsError, match=re.escape(expected)):
        gateway_settings(**data)


def test_the_certificate_is_a_file_haproxy_reads_not_a_directory_root_runs_from():
    s = gateway_settings(gateway_tls_cert_file="/etc/haproxy/rack.pem")
    assert s.gateway.tls_cert_file == "/etc/haproxy/rack.pem"
    assert "gateway_tls_cert_file" not in dict(private_dirs(s))


# --- the config -----------------------------------------------------------------------------


def test_the_rendered_config_is_the_expected_file():
    text = haproxy_config(gateway_settings(), rack_backends(), None)
    assert text == (HERE / "expected/haproxy.cfg").read_text()


def test_one_server_per_unit_weighted_by_its_slots():
    servers = [(b.server, b.address_port, b.weight) for b in rack_backends()]
    assert servers[:3] == [("lab-v100-a_0", "10.77.0.11:8080", 4), ("lab-v100-b_0", "10.77.0.12:8080", 1),
                           ("lab-t4_0", "10.77.0.14:8080", 2)]  # fmt: skip
    assert servers[3:] == [(f"h200-x8_{i}", f"gpu8.rack.example:{8080 + i}", 8) for i in range(8)]
    assert server_name("rack 1/gpu@08", 3) == "rack_1_gpu_08_3"


def test_a_unit_on_its_own_address_and_an_ipv6_one():
    h = serving_host("v6", "fd00::7", load_settings("v6", SERVING))
    units = {"units": [{"index": 0, "port": 8080, "listen": "0.0.0.0", "parallel": 1},
                       {"index": 1, "port": 8081, "listen": "10.0.0.7", "parallel": 300}]}  # fmt: skip
    (a, b) = backends_of(h, units)
    assert (a.address_port, b.address_port, b.weight) == ("[fd00::7]:8080", "10.0.0.7:8081", 256)


@pytest.mark.parametrize("units, bench, expected", [
    (None, None, "llama-server listens on 127.0.0.1 only: the gateway cannot reach it"),
    ({"units": [{"index": 0, "port": 70000, "listen": "0.0.0.0", "parallel": 1}]}, None,
     "unit 0 has port 70000; allowed: an integer from 1 to 65535"),
    ({"units": [{"index": 0, "port": 8080, "listen": "0.0.0.0", "parallel": 1}] * 2}, None,
     "names a unit index twice"),
    ({"units": "all"}, None, "has no list of units"),
])  # fmt: skip
def test_units_the_gateway_cannot_route_to_are_refused(units, bench, expected):
    h = serving_host("lab-x", "10.77.0.20", load_settings("lab-x", BASE))  # loopback by default
    with pytest.raises(GatewayError, match=expected):
        backends_of(h, units, bench)


def test_one_key_for_the_rack_or_none():
    keys = {"/k/a": "abc", "/k/b": "abc", "/k/c": "other", "/k/bad": "a'b"}
    hosts = [serving_host(n, None, load_settings(n, {**SERVING, "server_api_key_file": f})) for n, f in
             (("a", "/k/a"), ("b", "/k/b"))]  # fmt: skip
    token = lambda path, setting: keys.get(path)  # noqa: E731
    assert rack_key(hosts, token) == "abc"
    assert rack_key(list(HOSTS), token) is None
    other = serving_host("c", None, load_settings("c", {**SERVING, "server_api_key_file": "/k/c"}))
    with pytest.raises(GatewayError, match=r"different API keys \(a, b; c\)"):
        rack_key(hosts + [other], token)
    bad = serving_host("d", None, load_settings("d", {**SERVING, "server_api_key_file": "/k/bad"}))
    with pytest.raises(GatewayError, match="characters HAProxy's config cannot hold"):
        rack_key([bad], token)


def test_the_key_in_the_config_pass_through_and_checked():
    passed = haproxy_config(gateway_settings(), rack_backends(), "k3y")
    assert "    http-check send meth GET uri /metrics hdr Authorization 'Bearer k3y'\n" in passed
    assert "acl llamarack_key" not in passed
    checked = haproxy_config(gateway_settings(gateway_api_key="checked"), rack_backends(), "k3y")
    assert "    http-request deny deny_status 401 unless llamarack_public || llamarack_key\n" in checked
    with pytest.raises(GatewayError, match="no serving host has a server_api_key_file"):
        haproxy_config(gateway_settings(gateway_api_key="checked"), rack_backends(), None)


def backend_section(text: str) -> list:
    """The lines of backend ``llamarack`` up to its checks, comments left out."""
    lines = text.split("\nbackend llamarack\n", 1)[1].split("    option httpchk\n", 1)[0].splitlines()
    return [line.strip() for line in lines if not line.strip().startswith("#")]


def test_affinity_keys_a_conversation_and_bounds_the_imbalance():
    lines = backend_section(haproxy_config(gateway_settings(gateway_balance_factor=175), rack_backends(), None))
    assert lines[:4] == ["balance hash var(txn.llamarack_conversation)", "hash-type consistent",
                         "hash-balance-factor 175", "option http-buffer-request"]  # fmt: skip
    keys = [line.split(" if ")[0].split(") ", 1)[1] for line in lines if line.startswith("http-request set-var")]
    assert keys == ["req.fhdr(x-session-id)", "req.body,json_query('$.messages[1].content')",
                    "req.body,json_query('$.messages[1].content[0].text')",
                    "req.body,json_query('$.messages[0].content')",
                    "req.body,json_query('$.messages[0].content[0].text')",
                    "req.body,json_query('$.prompt'),bytes(0,256)"]  # fmt: skip


def test_leastconn_is_still_a_setting():
    text = haproxy_config(gateway_settings(gateway_balance="leastconn"), rack_backends(), None)
    assert backend_section(text) == ["balance leastconn"]
    assert [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith("    server ")] == \
        ["4", "1", "2"] + ["8"] * 8  # fmt: skip  # weight: the unit's slots


def test_affinity_weights_keep_the_slots_ratios_on_a_fine_ring():
    weights = [b.weight for b in ring_weights(rack_backends())]
    assert weights == [128, 32, 64] + [256] * 8  # 4, 1, 2 and 8 slots, the largest at HAProxy's highest weight
    one = [b.weight for b in ring_weights(rack_backends()[1:2])]
    assert one == [256] and ring_weights([]) == []


HAPROXY = shutil.which("haproxy")


@pytest.mark.skipif(not HAPROXY, reason="HAProxy is not installed here (apt-get install haproxy)")
@pytest.mark.parametrize("variant", ["plain", "tls-checked-ipv6", "leastconn"])
def test_haproxy_accepts_the_rendered_config(tmp_path, variant):
    data, key = ({"gateway_balance": "leastconn"} if variant == "leastconn" else {}), None
    if variant == "tls-checked-ipv6":
        cert = tmp_path / "rack.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=gw",
                        "-keyout", str(tmp_path / "k.pem"), "-out", str(tmp_path / "c.pem")],
                       check=True, capture_output=True)  # fmt: skip
        cert.write_text((tmp_path / "c.pem").read_text() + (tmp_path / "k.pem").read_text())
        data = {"gateway_tls_cert_file": str(cert), "gateway_api_key": "checked", "gateway_bind": "::",
                "llamarack_allow_shared_dirs": True}  # fmt: skip
        key = "s3cret.key-1"
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(gateway_settings(**data), rack_backends(), key))
    result = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    # The one warning: this machine cannot resolve the 8-card host's name (HAProxy starts anyway).
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if "WARNING" in line]
    assert warnings and all("could not resolve address 'gpu8.rack.example'" in line for line in warnings)


# --- Prometheus -----------------------------------------------------------------------------


def test_targets_name_every_unit_the_gateway_and_the_node_exporters():
    hosts = list(HOSTS[:1]) + [serving_host("lab-v100-b", "10.77.0.12", load_settings(
        "lab-v100-b", {**SERVING, "gateway_node_exporter": True}))]  # fmt: skip
    groups = json.loads(targets(gateway_settings(gateway_node_exporter=True), "10.77.0.15", hosts, rack_backends()))
    units = [g for g in groups if g["labels"]["llamarack_kind"] == "unit"]
    assert len(units) == 11 and units[0] == {"targets": ["10.77.0.11:8080"], "labels": {
        "llamarack_kind": "unit", "llamarack_host": "lab-v100-a", "llamarack_server": "lab-v100-a_0",
        "llamarack_tg128": "31.5"}}  # fmt: skip
    assert [g for g in groups if g["labels"]["llamarack_kind"] != "unit"] == [
        {"targets": ["10.77.0.15:8404"], "labels": {"llamarack_kind": "haproxy", "llamarack_host": "lab-gw"}},
        {"targets": ["10.77.0.12:9100"], "labels": {"llamarack_kind": "node", "llamarack_host": "lab-v100-b"}},
        {"targets": ["10.77.0.15:9100"], "labels": {"llamarack_kind": "node", "llamarack_host": "lab-gw"}},
    ]


def test_alert_rules_one_slow_rule_per_unit_with_a_bench_record():
    rules = json.loads(alert_rules(gateway_settings(gateway_slow_fraction=0.4), rack_backends()).split("\n", 1)[1])
    rules = rules["groups"][0]["rules"]
    assert [r["alert"] for r in rules] == ["LlamarackNoHealthyBackend", "LlamarackRequestsDeferred"] + [
        "LlamarackSlowGeneration"] * 9  # fmt: skip
    assert rules[0]["expr"] == 'haproxy_backend_active_servers{proxy="llamarack"} < 1'
    assert rules[1]["expr"] == "llamacpp:requests_deferred > 0" and rules[1]["for"] == "1m"
    rate = 'llamacpp:predicted_tokens_seconds{llamarack_server="lab-v100-a_0"}'
    assert rules[2]["expr"] == f"{rate} > 0 and {rate} < 12.6"
    assert rules[3]["expr"].endswith("< 56")


def test_prometheus_config_sends_the_key_to_the_units_only():
    config = json.loads(prometheus_config("k").split("\n", 1)[1])
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert list(jobs) == ["llamarack-unit", "llamarack-haproxy", "llamarack-node"]
    assert jobs["llamarack-unit"]["authorization"] == {"credentials_file": "/etc/prometheus/llamarack-api-key"}
    assert "authorization" not in jobs["llamarack-haproxy"]
    assert "authorization" not in json.loads(prometheus_config(None).split("\n", 1)[1])["scrape_configs"][0]


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(not PROMTOOL, reason="promtool is not installed here (Debian's prometheus package)")
def test_promtool_accepts_the_rules(tmp_path):
    rules = tmp_path / "rules.yml"
    rules.write_text(alert_rules(gateway_settings(), rack_backends()))
    result = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- operations -----------------------------------------------------------------------------


@pytest.fixture
def rack_records(monkeypatch):
    """The serving hosts' records as ``rack_fact`` reads them (one FactsTogether each)."""
    records = {h.name: (units, bench) for h, units, bench in RACK}
    asked = []

    def rack_fact(name, fact, reads):
        asked.append((name, tuple(repr(r) for r in reads)))
        return {i: Answer(0, value) for i, value in enumerate(records[name])}

    monkeypatch.setattr(operations, "rack_fact", rack_fact)
    return asked


def haproxy_facts(text=None, running=True):
    found = digest(text.encode(), KEY_DIGEST_SALT) if text else "missing"
    return {fact_key(UnitState, unit="haproxy.service"): RUNNING if running else {"SubState": "dead"},
            fact_key(Command, command=secret_digest_command(HAPROXY_CONFIG)): found}  # fmt: skip


def test_a_new_config_is_staged_proved_switched_and_reloaded(rack_records):
    settings = gateway_settings()
    commands, _ = run_op(haproxy, haproxy_facts(), settings=settings, hosts=HOSTS)
    text = haproxy_config(settings, rack_backends(), None)
    assert commands == [
        "install -d -m 755 -- /etc/haproxy",
        "install -m 600 /dev/null /etc/haproxy/haproxy.cfg.new",
        f"umask 077 && mkdir -m 700 {PRIVATE_DIR_SHOWN} && install -m 600 /dev/null {PRIVATE_DIR_SHOWN}/file",
        ("upload", "/etc/haproxy/haproxy.cfg.new", text),
        f"rm -rf {PRIVATE_DIR_SHOWN}",
        "haproxy -c -q -f /etc/haproxy/haproxy.cfg.new >&2 || { rm -f /etc/haproxy/haproxy.cfg.new; printf '%s\\n' "
        "'gpu01: gateway: the new HAProxy config fails its check (haproxy); the one in place keeps serving' >&2; "
        "exit 1; }",
        "sync -- /etc/haproxy/haproxy.cfg.new && mv -f -- /etc/haproxy/haproxy.cfg.new /etc/haproxy/haproxy.cfg && "
        "systemctl enable -q haproxy && systemctl reload-or-restart haproxy",
    ]  # fmt: skip
    assert [name for name, _ in rack_records] == [h.name for h in HOSTS]
    assert rack_records[0][1] == ("UnitsRecord(path='/opt/llamarack/state/units.json')",
                                  "BenchRecord(path='/opt/llamarack/state/bench.json')")  # fmt: skip


def test_the_config_in_place_is_left_alone_and_a_stopped_haproxy_started(rack_records):
    settings = gateway_settings()
    text = haproxy_config(settings, rack_backends(), None)
    assert run_op(haproxy, haproxy_facts(text), settings=settings, hosts=HOSTS) == (
        [], ["HAProxy routes to 11 units"])  # fmt: skip
    commands, _ = run_op(haproxy, haproxy_facts(text, running=False), settings=settings, hosts=HOSTS)
    assert commands == ["systemctl enable -q haproxy && systemctl restart haproxy"]


def test_a_rack_the_gateway_cannot_serve_is_refused_before_anything_changes(monkeypatch):
    loopback = serving_host("lab-lo", "10.77.0.30", load_settings("lab-lo", BASE))
    monkeypatch.setattr(operations, "rack_fact", lambda name, fact, reads: None)
    commands, _ = run_op(haproxy, {}, settings=gateway_settings(), hosts=(loopback,))
    assert len(commands) == 1 and commands[0].startswith("printf '%s\\n' 'gpu01: gateway: lab-lo: llama-server "
                                                         "listens on 127.0.0.1 only")  # fmt: skip
    assert commands[0].endswith(">&2; exit 1")


def test_diff_shows_the_config_without_the_key(rack_records, monkeypatch, caplog, tmp_path):
    import logging

    from pyinfra.facts.files import FileContents

    key_file = tmp_path / "key"
    key_file.write_text("t0ps3cret\n")
    key_file.chmod(0o600)
    keyed_data = {**SERVING, "server_api_key_file": str(key_file)}
    keyed = tuple(serving_host(h.name, h.address, load_settings(h.name, keyed_data)) for h in HOSTS)
    facts = {**haproxy_facts(), fact_key(FileContents, path=HAPROXY_CONFIG): ["global", "    daemon"]}
    with caplog.at_level(logging.INFO, logger="pyinfra"):
        commands, _ = run_op(haproxy, facts, diff=True, settings=gateway_settings(), hosts=keyed)
    assert "t0ps3cret" in commands[3][2]  # the config itself holds it, for the /metrics check
    shown = caplog.text
    assert "Will modify /etc/haproxy/haproxy.cfg" in shown and "Bearer <server_api_key_file>" in shown
    assert "t0ps3cret" not in shown


def test_the_target_list_is_written_when_it_differs(rack_records):
    settings = gateway_settings()
    text = targets(settings, "10.77.0.15", list(HOSTS), rack_backends())
    facts = {fact_key(File, path=TARGETS): None}
    commands, _ = run_op(prometheus_targets, facts, settings=settings, hosts=HOSTS, address="10.77.0.15")
    assert commands[0] == "install -d -m 755 -- /etc/llamarack/prometheus"
    assert ("upload", f"{TARGETS}.new", text) in commands
    import hashlib

    facts = {fact_key(File, path=TARGETS): {"mode": 644}, fact_key(Sha1File, path=TARGETS):
             hashlib.sha1(text.encode()).hexdigest()}  # fmt: skip
    assert run_op(prometheus_targets, facts, settings=settings, hosts=HOSTS, address="10.77.0.15") == (
        [], [f"{TARGETS} is up to date"])  # fmt: skip


def test_node_exporter_only_where_asked():
    assert run_op(node_exporter, {}, settings=load_settings("gpu01", BASE)) == (
        [], ["no node-exporter asked (gateway_node_exporter = False)"])  # fmt: skip
    asked = load_settings("gpu01", {**BASE, "gateway_node_exporter": True})
    installed = {DebPackages: {"prometheus-node-exporter": ["1.5.0-1+b6"]}}
    assert run_op(node_exporter, installed, settings=asked) == (
        [], ["apt packages already installed: prometheus-node-exporter"])  # fmt: skip


# --- which roles a gateway runs and is audited for ------------------------------------------


def test_a_gateway_reads_and_is_audited_for_the_gateway_role_only():
    gw, serving = gateway_settings(), load_settings("gpu01", BASE)
    assert [m.__name__ for m in role_audits(gw)] == ["roles.gateway.audit"]
    assert audit_reads(gw) == (FactRead.of(HaproxyServers, backend="llamarack"),
                               FactRead.of(ConfiguredServers, path=HAPROXY_CONFIG))  # fmt: skip
    assert [r.fact.__name__ for r in role_reads(gw)] == ["DebPackages", "UnitState", "Command", "File", "Sha1File"]
    assert "gateway" not in [i for m in role_audits(serving) for i in m.reads(serving)]
    assert audit.reads(serving) == () and audit.items(_seen(serving, {})) == {}


# --- the audit item -------------------------------------------------------------------------


def test_the_runtime_api_capture_parses_into_each_servers_state():
    found = haproxy_runtime.stat_servers(CAPTURE.read_text(), "llamarack")
    assert {name: (s["status"], s["check"], s["weight"]) for name, s in found.items()} == {
        "lab-v100-a_0": ("UP", "L7OK", 4), "lab-v100-a_1": ("DRAIN", "L7OK", 4),
        "lab-v100-b_0": ("MAINT", "", 1), "lab-t4_0": ("DOWN", "L7TOUT", 2), "lab-cpu_0": ("DOWN", "L4CON", 1),
    }  # fmt: skip
    assert found["lab-t4_0"]["address"] == "127.0.0.1:28081"
    assert haproxy_runtime.stat_servers(CAPTURE.read_text(), "other") == {}
    with pytest.raises(ValueError):
        haproxy_runtime.stat_servers("Unknown command.\n", "llamarack")


def _seen(settings, values: dict) -> Seen:
    reads = tuple(values)
    answers = Answers(reads, {i: Answer(0, v) for i, v in enumerate(values.values())})
    return Seen(settings.host, settings, None, answers)


def _audit(servers, configured):
    values = {FactRead.of(HaproxyServers, backend="llamarack"): servers,
              FactRead.of(ConfiguredServers, path=HAPROXY_CONFIG): configured}  # fmt: skip
    return audit.items(_seen(gateway_settings(), values))["gateway"]


def test_the_audit_item_found_against_wanted():
    servers = haproxy_runtime.stat_servers(CAPTURE.read_text(), "llamarack")
    captured = HaproxyServers().process([json.dumps({"servers": servers})])
    item = _audit(captured, ["lab-v100-a_0", "lab-v100-a_1", "lab-v100-b_0", "lab-t4_0", "lab-cpu_0"])
    assert item.found == {"backends": {"lab-v100-a_0": "UP", "lab-v100-a_1": "DRAIN L7OK", "lab-v100-b_0": "MAINT",
                                       "lab-t4_0": "DOWN L7TOUT", "lab-cpu_0": "DOWN L4CON"}}  # fmt: skip
    assert item.wanted == {"backends": dict.fromkeys(item.found["backends"], "UP")} and item.drift
    up = {"servers": {"a_0": {"status": "UP", "check": "L7OK"}, "b_0": {"status": "UP", "check": "L7OK"}}}
    assert not _audit(up, ["a_0", "b_0"]).drift
    assert _audit(up, ["a_0", "b_0", "c_0"]).drift  # a unit the config names is missing
    silent = _audit(None, ["a_0"])
    assert silent.drift and silent.found == {"backends": None, "error": "HAProxy does not answer on its admin socket"}


def test_prometheus_files_are_proved_with_promtool_before_the_switch(rack_records):
    import hashlib

    from roles.gateway.operations import prometheus
    from roles.gateway.plan import PROMETHEUS_CONFIG, PROMETHEUS_KEY, PROMETHEUS_RULES

    settings = gateway_settings(gateway_prometheus=True)
    rules, config = alert_rules(settings, rack_backends()), prometheus_config(None)
    facts = {fact_key(Command, command=secret_digest_command(PROMETHEUS_KEY)): "missing",
             fact_key(Sha1File, path=PROMETHEUS_RULES): None, fact_key(Sha1File, path=PROMETHEUS_CONFIG): None}
    commands, _ = run_op(prometheus, facts, settings=settings, hosts=HOSTS)
    proofs = [c for c in commands if isinstance(c, str) and c.startswith("promtool")]
    assert [p.split(" >&2")[0] for p in proofs] == [f"promtool check rules {PROMETHEUS_RULES}.new",
                                                    f"promtool check config {PROMETHEUS_CONFIG}.new"]  # fmt: skip
    assert ("upload", f"{PROMETHEUS_RULES}.new", rules) in commands
    assert ("upload", f"{PROMETHEUS_CONFIG}.new", config) in commands
    facts.update({fact_key(Sha1File, path=PROMETHEUS_RULES): hashlib.sha1(rules.encode()).hexdigest(),
                  fact_key(Sha1File, path=PROMETHEUS_CONFIG): hashlib.sha1(config.encode()).hexdigest()})
    assert run_op(prometheus, facts, settings=settings, hosts=HOSTS) == (
        [], ["Prometheus scrapes the rack with llamarack's rules"])  # fmt: skip


def _roles_then_gateway():
    """deploy.py's shape: the serving roles on serving hosts, then the gateway role on every host
    from one line, its first operation shared, the rest on gateways only."""
    from pyinfra import host
    from pyinfra.operations import server

    if "gateways" not in host.groups:
        server.shell(name="serving role 1", commands=["true"])
        server.shell(name="serving role 2", commands=["true"])
        server.shell(name="serving role 3", commands=["true"])
    _gateway_role(host)


def _gateway_role(host):
    from pyinfra.operations import server

    server.shell(name="on every host", commands=["true"])
    if "gateways" in host.groups:
        server.shell(name="HAProxy config", commands=["true"])


def test_pyinfra_orders_the_gateway_role_after_every_serving_hosts_roles(monkeypatch):
    import pyinfra
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.state import StateStage
    from pyinfra.context import ctx_host, ctx_state

    monkeypatch.setattr(pyinfra, "is_cli", True)  # ordered by the calling lines, as `pyinfra INVENTORY deploy.py` is
    inventory = Inventory((["gw", "a", "b"], {}), gateways=(["gw"], {}))
    state = State(inventory, Config(), check_for_changes=False)
    state.current_deploy_filename, state.current_op_file_number = __file__, 0
    state.set_stage(StateStage.Prepare)
    with ctx_state.use(state):
        for h in inventory:
            with ctx_host.use(h):
                _roles_then_gateway()
    order = [sorted(state.get_op_meta(op).names) for op in state.get_op_order()]
    assert order == [["serving role 1"], ["serving role 2"], ["serving role 3"], ["on every host"], ["HAProxy config"]]
