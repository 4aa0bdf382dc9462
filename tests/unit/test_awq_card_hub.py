"""Preflight's awq-card-memory rule for a checkpoint the host has never served: the counts come
from its config.json on the hub (a local one, ``tests/support/hub_server.py``), read on the
control machine once per checkpoint for the run, before any operation; a hub that cannot
answer, or answers something else, leaves the check to the AWQ step, never a traceback."""

import json
import threading

import pytest

from roles.driver.reads import DriverState, Gpu, NvidiaSmi
from roles.model import calibration
from roles.model.deploy import listing_for
from roles.model.hub import CONFIG_MAX_BYTES, repo_config, repo_files
from roles.model.plan import asked_inputs
from roles.model.reads import ArtifactState, GgufShape, ModelArtifact
from roles.preflight.reads import gather
from roles.preflight.rules import evaluate
from roles.settings import load_settings
from tests.support.hub_server import HubServer

TOKEN = "hf_card_secret"
P4 = Gpu(2, "Tesla P4", "GPU-3", 7680, "6.1", "550.127.05")
# config.json of Llama-3-70B and Llama-3-8B (the counts the arithmetic reads, and a few it does not)
CONFIG_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
              "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
              "num_hidden_layers": 80, "vocab_size": 128256, "max_position_embeddings": 8192,
              "rope_scaling": None, "torch_dtype": "bfloat16"}  # fmt: skip
CONFIG_8B = {**CONFIG_70B, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
             "num_hidden_layers": 32}  # fmt: skip


@pytest.fixture(autouse=True)
def fresh_caches():
    """Each test its own run: nothing the hub answered is kept from another."""
    for cached in (repo_files, repo_config, calibration._asked):
        cached.cache_clear()
    yield
    for cached in (repo_files, repo_config, calibration._asked):
        cached.cache_clear()


def checkpoint(tmp_path, config, name="ckpt"):
    """A checkpoint directory: ``config`` (bytes as they are, else as JSON) and a weights file."""
    d = tmp_path / name
    d.mkdir()
    if config is not None:
        (d / "config.json").write_bytes(config if isinstance(config, bytes) else json.dumps(config).encode())
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    return d


@pytest.fixture
def token_file(tmp_path):
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return str(f)


def awq_settings(hub, token_file, host="gpu01", repo="org/big", **data):
    return load_settings(host, {"python_env_backend": "venv", "model_route": "awq", "model_repo": repo,
                                "model_revision": hub.repo(repo).sha, "model_hf_endpoint": hub.url,
                                "model_hf_token_file": token_file, **data})  # fmt: skip


def reader(gpus=(P4,), served=None, shape=None):
    """How preflight reads the host: ``gpus`` on the driver, ``served`` at models/current, its
    GGUF of ``shape``."""
    answers = {NvidiaSmi: DriverState("ok", gpus), ModelArtifact: served, GgufShape: shape}
    return lambda fact, **kwargs: answers[fact] if fact in answers else fact().default()


def other_checkpoint_served():
    """An artifact of another repository at models/current: its GGUF says nothing of this one."""
    record = {"stamp": "5" * 64, "source": "hf", "files": {}, "repo": "org/other", "revision": "e" * 40,
              "asked": {"repo": "org/other", "revision": "e" * 40}, "gguf": {"size": 9}}  # fmt: skip
    return ArtifactState(record["stamp"], 9, 9, record)


def card(s, facts):
    """The rule's refusals (the host's other facts are left at their defaults here)."""
    return [f for f in evaluate(s, facts) if f.rule == "awq-card-memory"]


def asked(hub, path):
    """The requests the hub got for ``path`` (config.json, or the listing: "revision")."""
    return [r for r in hub.requests if r.path.endswith("/" + path) or (path == "revision" and "/revision/" in r.path)]


@pytest.mark.parametrize("served", [None, other_checkpoint_served()], ids=["nothing-served", "another-served"])
def test_a_checkpoint_never_served_is_refused_before_the_fetch_with_the_figure(tmp_path, token_file, served):
    with HubServer({"org/big": checkpoint(tmp_path, CONFIG_70B)}, token=TOKEN) as hub:
        s = awq_settings(hub, token_file)
        facts = gather(s, read=reader(served=served), hub=True)
        (failure,) = card(s, facts)
        assert (len(asked(hub, "revision")), len(asked(hub, "config.json"))) == (1, 1)
        assert {r.auth for r in hub.requests} == {"ok"}  # the token, as the model role sends it
    assert failure.rule == "awq-card-memory"
    assert failure.message("gpu01").startswith(
        "gpu01: awq-card-memory: found Tesla P4 (GPU 2, the host's smallest card) of 7.50 GiB; needed 13.31 GiB "
        "to calibrate one decoder layer (1.59 GiB of fp16 weights, activations of at most 3689 calibration "
        "tokens")
    assert TOKEN not in failure.message("gpu01")


def test_a_card_that_holds_the_layer_passes(tmp_path, token_file):
    with HubServer({"org/big": checkpoint(tmp_path, CONFIG_8B)}, token=TOKEN) as hub:
        s = awq_settings(hub, token_file)
        facts = gather(s, read=reader(), hub=True)
    assert dict(facts.hub_config.counts) == {"hidden_size": 4096, "intermediate_size": 14336,
                                             "num_attention_heads": 32, "num_key_value_heads": 8,
                                             "vocab_size": 128256}  # fmt: skip
    assert card(s, facts) == []  # 4.81 GiB on 7.50


def test_one_request_per_checkpoint_for_every_host_and_the_model_role(tmp_path, token_file):
    repos = {"org/big": checkpoint(tmp_path, CONFIG_70B), "org/small": checkpoint(tmp_path, CONFIG_8B, "small")}
    with HubServer(repos, token=TOKEN) as hub:
        hosts = [awq_settings(hub, token_file, f"gpu{i:02}", repo=("org/big", "org/small")[i % 2]) for i in range(6)]
        facts = {}

        def preflight(s):
            facts[s.host] = gather(s, read=reader(), hub=True)

        threads = [threading.Thread(target=preflight, args=(s,)) for s in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # the model role's plan then lists each checkpoint from the cache
        for s in hosts:
            assert listing_for(s).sha == hub.repo(s.model.repo).sha
        assert sorted(r.path for r in hub.requests) == sorted(
            [f"/api/models/{repo}/revision/{hub.repo(repo).sha}" for repo in repos]
            + [f"/{repo}/resolve/{hub.repo(repo).sha}/config.json" for repo in repos])  # fmt: skip
    assert [f.rule for s in hosts for f in card(s, facts[s.host])] == ["awq-card-memory"] * 3


@pytest.mark.parametrize("data", [{"model_route": "gguf"}, {"llamacpp_backend": "cpu"}, {"llamarack_roles": "driver"}],
                         ids=["route-gguf", "cpu-host", "no-model-role"])  # fmt: skip
def test_nothing_is_asked_of_the_hub_where_no_card_calibrates(tmp_path, token_file, data):
    with HubServer({"org/big": checkpoint(tmp_path, CONFIG_70B)}, token=TOKEN) as hub:
        s = awq_settings(hub, token_file, **data)
        facts = gather(s, read=reader(), hub=True)
        assert hub.requests == []
    assert facts.hub_config is None and card(s, facts) == [] and calibration.unchecked(facts.hub_config) is None


def served_from(made_from):
    """The artifact at models/current as ``made_from`` (settings) made it: its record."""
    m = made_from.model
    record = {"stamp": "5" * 64, "source": "hf", "files": {}, "repo": m.repo, "revision": m.revision,
              "asked": dict(asked_inputs(made_from)), "gguf": {"size": 9}}  # fmt: skip
    return ArtifactState(record["stamp"], 9, 9, record)


def test_a_served_gguf_of_the_checkpoint_or_the_wanted_artifact_asks_nothing(tmp_path, token_file):
    shape = {"n_embd": 8192, "n_ff": 28672, "n_head": 64, "n_head_kv": 8, "head_dim_k": 128, "n_vocab": 128256}
    with HubServer({"org/big": checkpoint(tmp_path, CONFIG_70B)}, token=TOKEN) as hub:
        s = awq_settings(hub, token_file)
        plain = served_from(awq_settings(hub, token_file, model_route="gguf"))  # the same checkpoint, route gguf
        facts = gather(s, read=reader(served=plain, shape=shape), hub=True)
        wanted = gather(s, read=reader(served=served_from(s), shape=shape), hub=True)
        assert hub.requests == []
    assert facts.hub_config is None and card(s, facts)[0].needed.startswith("13.31 GiB")
    assert wanted.hub_config is None and card(s, wanted) == []  # nothing is calibrated


def test_the_audit_never_asks_the_hub(tmp_path, token_file):
    with HubServer({"org/big": checkpoint(tmp_path, CONFIG_70B)}, token=TOKEN) as hub:
        s = awq_settings(hub, token_file)
        facts = gather(s, read=reader())
        assert hub.requests == []
    assert facts.hub_config is None and card(s, facts) == []  # the AWQ step checks it


def unchecked(tmp_path, token_file, config, **hub_options):
    """(what preflight says it could not check, the hub's requests) for a checkpoint whose
    config.json is ``config``; the rule refuses nothing then."""
    with HubServer({"org/big": checkpoint(tmp_path, config)}, token=TOKEN) as hub:
        for path in hub_options.get("corrupt", ()):
            hub.corrupt(path)
        s = awq_settings(hub, token_file)
        facts = gather(s, read=reader(), hub=True)
        again = gather(awq_settings(hub, token_file, "gpu02"), read=reader(), hub=True)  # a second host
        requests = [r.path for r in hub.requests]
    assert facts.hub_config.counts is None and again.hub_config == facts.hub_config
    assert card(s, facts) == []
    problem = facts.hub_config.problem
    assert problem.isprintable() and len(problem) < 400 and TOKEN not in problem
    assert calibration.unchecked(facts.hub_config) == (f"cannot check before the fetch: {problem}; the AWQ step "
                                                       "checks the card once the checkpoint is fetched")  # fmt: skip
    return problem, requests


@pytest.mark.parametrize("config, message", [
    (b"{not json", "answered something that is not JSON"),
    (b"[1, 2]", "answered list, not a JSON object"),
    (b"\xff\xfe\x00garbage", "answered something that is not JSON"),
    (b"[" * 100_000, "answered something that is not JSON"),  # deeper than the parser goes
    ({**CONFIG_70B, "hidden_size": None}, "config.json: no hidden_size"),
    ({"text_config": {"hidden_size": 8}}, "config.json: no intermediate_size, num_attention_heads"),
    ({**CONFIG_70B, "hidden_size": "8192"}, "n_embd (hidden_size) '8192' is not an integer"),
    ({**CONFIG_70B, "num_attention_heads": True}, "n_head (num_attention_heads) True is not an integer"),
    ({**CONFIG_70B, "intermediate_size": 10**30}, "n_ff (intermediate_size) 1000000000000000000000000000000 is out"),
    ({**CONFIG_70B, "hidden_size": 0}, "hidden_size 0 is out of range (1 or more)"),
    ({**CONFIG_70B, "vocab_size": -5}, "n_vocab (vocab_size) -5 is out of range"),
    ({**CONFIG_70B, "text_config": [1]}, "text_config is list, not an object"),
], ids=lambda v: None if isinstance(v, str) else "config")  # fmt: skip
def test_a_config_that_is_not_a_models_leaves_the_check_to_the_step(tmp_path, token_file, config, message):
    problem, requests = unchecked(tmp_path, token_file, config)
    assert message in problem
    assert len(requests) == 2  # the listing and config.json, once for both hosts


def test_a_config_over_the_size_cap_is_not_read(tmp_path, token_file):
    problem, requests = unchecked(tmp_path, token_file, {**CONFIG_70B, "pad": "x" * CONFIG_MAX_BYTES})
    assert f"more than {CONFIG_MAX_BYTES} read" in problem
    assert not any(p.endswith("config.json") for p in requests)  # the listing's size says it


def test_a_config_the_listing_does_not_name_is_not_asked_for(tmp_path, token_file):
    problem, requests = unchecked(tmp_path, token_file, None)
    assert "the listing names no config.json" in problem and len(requests) == 1


def test_bytes_that_are_not_the_listed_blob_are_not_taken(tmp_path, token_file):
    problem, _ = unchecked(tmp_path, token_file, CONFIG_70B, corrupt=("config.json",))
    assert "are not the blob" in problem and "its listing names" in problem


def test_a_hub_that_refuses_the_listing_is_left_to_the_model_role(tmp_path, token_file):
    other = tmp_path / "other-token"
    other.write_text("hf_wrong\n")
    other.chmod(0o600)
    with HubServer({"org/big": checkpoint(tmp_path, CONFIG_70B)}, token=TOKEN) as hub:
        s = awq_settings(hub, token_file, model_hf_token_file=str(other))
        facts = gather(s, read=reader(), hub=True)
        assert len(hub.requests) == 1  # the listing, refused: config.json is not asked for
    assert "HTTP 401" in facts.hub_config.problem and "hf_wrong" not in facts.hub_config.problem
    assert card(s, facts) == []


def test_the_hubs_config_answers(tmp_path):
    """``repo_config`` alone (no listing at hand): 404, the size cap while reading, a sound answer."""
    big = {**CONFIG_70B, "pad": "x" * (2 * CONFIG_MAX_BYTES)}
    repos = {"org/none": checkpoint(tmp_path, None), "org/big": checkpoint(tmp_path, big, "big"),
             "org/ok": checkpoint(tmp_path, CONFIG_8B, "ok")}  # fmt: skip
    with HubServer(repos) as hub:
        sha = {repo: hub.repo(repo).sha for repo in repos}
        missing = repo_config(hub.url, "org/none", sha["org/none"])
        over = repo_config(hub.url, "org/big", sha["org/big"])
        ok = repo_config(hub.url, "org/ok", sha["org/ok"][:12], None, hub.repo("org/ok").files["config.json"].blob_id)
        assert repo_config(hub.url, "org/none", sha["org/none"]) is missing  # asked once
        assert len(hub.requests) == 3
    assert missing.config is None and "not found on" in missing.problem and "no such file" in missing.problem
    assert over.config is None and f"more than {CONFIG_MAX_BYTES} bytes" in over.problem
    assert ok == type(ok)(CONFIG_8B)
