"""The model operation's commands, in pyinfra's fixture style: facts in, commands out.

Plus the plan (stamp, file choice) and the control machine's hub listing
against the local hub server.
"""

import json
from dataclasses import replace

import pytest
from pyinfra.context import ctx_host

from llamarack.errors import ModelSourceError
from roles.model.reads import ArtifactState, CachedBlobs, ModelArtifact, shape_record_name
from llamarack.layout import Layout
from llamarack.facts import FreeDiskBytes
from roles.llamacpp.reads import LlamaServerFlags
from roles.model.hub import HubFile, HubListing, repo_files
from roles.model.operations import artifact
from roles.model.plan import artifact_stamp, plan_from_pinned_record, plan_from_record, plan_model
from llamarack import remote
from roles.settings import load_settings
from pyinfra.facts.files import File, Link
from tests.support import fake_systemd_run, ophost
from tests.support.hub_server import HubServer

SHA = "a" * 40
LISTING = HubListing("org/tiny", SHA, (
    HubFile("config.json", 600, None, "c" * 40),
    HubFile("model.safetensors", 3_000_000, "5" * 64, "d" * 40),
    HubFile("tokenizer.model", 250_000, "7" * 64, "e" * 40),
    HubFile("README.md", 100, None, "f" * 40),
    HubFile("pytorch_model.bin", 3_000_000, "8" * 64, "9" * 40),
))  # fmt: skip


def settings(**data):
    # (the quality runs a new artifact gets are tested in test_model_awq_quality.py)
    base = {"python_env_backend": "venv", "llamacpp_backend": "cpu", "model_repo": "org/tiny",
            "model_revision": SHA, "llamarack_root": "/opt/lr", "model_quality": False}  # fmt: skip
    return load_settings("gpu01", {**base, **data})


def commands(plan, facts, **kwargs):
    """The operation's commands, but its uploads' private directories (made and removed
    around each upload: tests/unit/test_hostile_host_paths.py); and its no-ops."""
    cmds, noops = ophost.run_op(artifact, facts, plan=plan, **kwargs)
    private = (f"umask 077 && mkdir -m 700 {ophost.PRIVATE_DIR_SHOWN} ", f"rm -rf {ophost.PRIVATE_DIR_SHOWN}")
    return [c for c in cmds if not (isinstance(c, str) and c.startswith(private))], noops


PLAN = plan_model(settings(), LISTING)
# sha256 of the inputs as JSON (sorted keys, no spaces), made by hand:
# {"files":[["config.json","git-sha1:c…"],["model.safetensors","sha256:5…"],["tokenizer.model","sha256:7…"]],
#  "llamacpp_commit":"0c1e57098bba43ac29e6e3b677cdceebdd22334f","outtype":"f16","quant":"Q4_K_M","source":"hf"}
STAMP = "651b7877394b3c9cc473a4248580a3fbcf812190a6f7c0b19dc583c6673632ce"
MANIFEST = {"endpoint": "https://huggingface.co", "repo": "org/tiny", "revision": SHA, "files": [
    {"path": "config.json", "size": 600, "git_sha1": "c" * 40},
    {"path": "model.safetensors", "size": 3_000_000, "sha256": "5" * 64},
    {"path": "tokenizer.model", "size": 250_000, "sha256": "7" * 64}]}  # fmt: skip
DONE = ArtifactState(PLAN.stamp, 1_100_000, 1_100_000)
BLOBS = "/opt/lr/cache/blobs"


def on_host(plan, state, link=None, record=False, free=None, made=(), cached=None, link_name="current",
            flags=None) -> dict:  # fmt: skip
    """What the artifact operation reads: the artifact's directory (``state``: its
    ``ModelArtifact``), the link ``models/<link_name>`` (to ``link``), the shape record
    beside the GGUF (there or not), the current build's flags (``flags``, for the quality
    runs); and, to make the artifact (``free`` given): the free disk, the staged GGUFs a
    failed run left (``made``: their names), the blob cache."""
    d, s, models = plan.dir, plan.staging, plan.models_dir
    facts = {ophost.fact_key(ModelArtifact, path=d): state,
             ophost.fact_key(LlamaServerFlags, root=plan.root): flags,
             ophost.fact_key(Link, path=f"{models}/{link_name}"): {"link_target": link} if link else None,
             ophost.fact_key(File, path=f"{d}/{shape_record_name()}"): {"size": 600, "mode": 644} if record else None}
    if free is not None:
        facts[ophost.fact_key(FreeDiskBytes, path=models)] = free
        # (the converter's and quantize's outputs are in the pipeline's work directory)
        for name in ("model.gguf", "work/model-f16.gguf", "work/model.gguf"):
            facts[ophost.fact_key(File, path=f"{s}/{name}")] = {"size": 9} if name in made else None
        facts[ophost.fact_key(CachedBlobs, cache=Layout(plan.root).blob_cache, ids=plan.blob_ids)] = cached
    return facts


def test_plan_takes_the_included_files_and_pins_the_full_commit():
    assert [f.path for f in PLAN.files] == ["config.json", "model.safetensors", "tokenizer.model"]
    assert PLAN.manifest() == MANIFEST
    assert PLAN.stamp == STAMP and PLAN.dir == "/opt/lr/models/651b7877394b3c9c"


def test_stamp_changes_with_quant_commit_and_content_but_not_with_file_order():
    base = PLAN.stamp
    assert plan_model(settings(model_quant="Q8_0"), LISTING).stamp != base
    assert plan_model(settings(llamacpp_commit="b" * 40), LISTING).stamp != base
    changed = replace(LISTING, files=(replace(LISTING.files[1], sha256="6" * 64),) + LISTING.files[2:])
    assert plan_model(settings(), changed).stamp != base
    assert plan_model(settings(), replace(LISTING, files=LISTING.files[::-1])).stamp == base


def test_prequantized_sources_do_not_depend_on_llamacpp_or_quant():
    listing = replace(LISTING, files=LISTING.files + (HubFile("m-Q4_K_M.gguf", 9, "1" * 64, "2" * 40),))
    a = plan_model(settings(model_source="gguf", model_file="m-Q4_K_M.gguf"), listing)
    b = plan_model(settings(model_source="gguf", model_file="m-Q4_K_M.gguf", llamacpp_commit="b" * 40,
                            model_quant="Q8_0"), listing)  # fmt: skip
    assert a.stamp == b.stamp and not a.converts
    assert a.files[0].url == f"https://huggingface.co/org/tiny/resolve/{SHA}/m-Q4_K_M.gguf"
    u = plan_model(settings(model_source="url", model_url="https://m/x.gguf", model_sha256="3" * 64))
    assert u.manifest()["files"] == [{"path": "model.gguf", "size": None, "sha256": "3" * 64,
                                      "url": "https://m/x.gguf"}]  # fmt: skip
    # sha256 of {"files":[["model.gguf","sha256:33…33"]],"source":"url"}: no quant, outtype or commit
    assert u.stamp == "139ede9554dc8c7632a9bd0bad036b49e8862fe7e156cb7f047dc102988f83d2"
    assert artifact_stamp("url", u.files, "Q8_0", "bf16", "b" * 40) == u.stamp


def test_a_repo_without_safetensors_is_refused_with_what_it_has():
    listing = replace(LISTING, files=tuple(f for f in LISTING.files if "safetensors" not in f.path))
    with pytest.raises(ModelSourceError, match="no \\*.safetensors .* pytorch_model.bin"):
        plan_model(settings(), listing)


def test_already_in_place_is_a_noop():
    cmds, noops = commands(PLAN, on_host(PLAN, DONE, link=PLAN.name, record=True))
    assert cmds == []
    assert noops[0].startswith(f"model {PLAN.name} is in place")


def test_in_place_without_its_shape_record_only_records_it():
    # sealed before shapes were recorded, or recorded by another reader (another name)
    cmds, noops = commands(PLAN, on_host(PLAN, DONE, link=PLAN.name))
    assert cmds == [remote.command("gguf_header", "--record", shape_record_name(), f"{PLAN.dir}/model.gguf")]
    assert not any(n.startswith(f"model {PLAN.name} is in place") for n in noops)


def test_in_place_but_current_points_elsewhere_only_switches_the_link():
    cmds, _ = commands(PLAN, on_host(PLAN, DONE, link="0123456789abcdef", record=True))
    assert cmds == [f"ln -sfn {PLAN.name} /opt/lr/models/current.new && "
                    "mv -T /opt/lr/models/current.new /opt/lr/models/current"]  # fmt: skip


def test_missing_artifact_is_fetched_converted_quantized_sealed_and_moved():
    cmds, _ = commands(PLAN, on_host(PLAN, None, free=100 << 30))
    s, d, w = PLAN.staging, PLAN.dir, f"{PLAN.staging}/work"
    uploads = [c for c in cmds if isinstance(c, tuple)]
    assert [u[1] for u in uploads] == [f"{s}/manifest.json", f"{s}/stamp.plan.json"]
    assert json.loads(uploads[0][2]) == MANIFEST and json.loads(uploads[1][2])["stamp"] == STAMP
    # the plan's record goes up only once the pipeline user's steps are over (they cannot touch it)
    assert cmds.index(uploads[1]) > next(i for i, c in enumerate(cmds) if isinstance(c, str) and "chown -R root" in c)
    shell = [c for c in cmds if isinstance(c, str)]
    # the staging is root's, entered by the pipeline user's group; its work directory the user's
    assert shell[0] == ("install -d -m 755 /opt/lr/models && install -d -m 711 /opt/lr/models/.staging && "
                        f"install -d -m 710 -g \"$(id -g -- llamarack-model)\" {s} && "
                        f"install -d -m 700 -o llamarack-model -g \"$(id -g -- llamarack-model)\" {w}")  # fmt: skip
    assert "install -d -m 700 -o llamarack-model" in shell[1] and "/opt/lr/cache/blobs" in shell[1]
    assert shell[2] == f"chmod 644 {s}/manifest.json"
    assert shell[3] == f"rm -f /run/llamarack/hub-token-{PLAN.name} /run/llamarack/hub-token-{PLAN.name}.new"
    (fetch,) = fake_systemd_run.steps(shell[4])
    assert fetch.argv == ["python3", "-c", remote.source("model_fetch"), "fetch", "--manifest", f"{s}/manifest.json",
                          "--dest", f"{w}/hf", "--retries", "5", "--cache", "/opt/lr/cache/blobs"]  # fmt: skip
    # its log is root's file in root's staging, opened by root's shell and handed to the step
    assert shell[4].endswith(f"< /dev/null >> {s}/fetch.log 2>&1; rc=$?; [ $rc = 0 ] || "
                             f"{{ tail -n 40 {s}/fetch.log >&2; exit $rc; }}; }}")  # fmt: skip
    assert "hub-token" not in " ".join(shell[4:7])  # no token without one
    (convert,) = fake_systemd_run.steps(shell[5])
    assert convert.argv[:2] == ["/bin/sh", "-c"]
    # Each made file is on disk (fsync) before its final name says it is complete, and each
    # step writes a file of its own shell's ($$ in the sandbox): a step still going on the
    # host after its run's connection dropped never shares it with a re-run's.
    assert convert.argv[2] == (f"/opt/lr/envs/convert/bin/python /opt/lr/src/llama.cpp/convert_hf_to_gguf.py {w}/hf "
                               f"--outtype f16 --outfile {w}/model-f16.gguf.tmp.$$ && sync -- {w}/model-f16.gguf.tmp.$$ "
                               f"&& mv -f -- {w}/model-f16.gguf.tmp.$$ {w}/model-f16.gguf")  # fmt: skip
    assert shell[5].startswith(f"[ -f {s}/model.gguf ] || [ -f {w}/model-f16.gguf ] || [ -f {w}/model.gguf ] || ")
    assert f"< /dev/null >> {s}/convert.log 2>&1" in shell[5]
    (quantize,) = fake_systemd_run.steps(shell[6])
    assert quantize.argv[2] == (f"/opt/lr/builds/current/bin/llama-quantize {w}/model-f16.gguf {w}/model.gguf.tmp.$$ "
                                f"Q4_K_M && sync -- {w}/model.gguf.tmp.$$ && mv -f -- {w}/model.gguf.tmp.$$ {w}/model.gguf")
    assert f">> {s}/quantize.log 2>&1" in shell[6]
    # then root takes the work over, and only then reads what it made
    assert shell[7].startswith(f"if [ -d {w} ]; then") and shell[7].endswith(f"chown root:root {s} && chmod 700 {s}")
    # its shape recorded beside it, then sealed: the artifact appears with both
    assert shell[8] == remote.command("gguf_header", "--record", shape_record_name(), f"{s}/model.gguf")
    assert shell[9].startswith(remote.command("model_fetch", "seal"))
    # the token too: whatever cut its fetch short, it never outlives the run
    assert shell[10] == (f"rm -rf {s}/manifest.json {s}/stamp.plan.json /run/llamarack/hub-token-{PLAN.name} "
                         f"/run/llamarack/hub-token-{PLAN.name}.new {s}/hf {s}/model-f16.gguf {s}/*.gguf.tmp.*")  # fmt: skip
    assert shell[11] == f"chmod 755 {s} && mv -T {s} {d}"
    # Once the new artifact's record is in place, the cache keeps only what records name.
    assert shell[12] == remote.command("model_fetch", "prune-cache", "--cache", "/opt/lr/cache/blobs",
                                       "--models", "/opt/lr/models")  # fmt: skip
    assert shell[13].startswith(f"ln -sfn {PLAN.name} ")


def test_token_goes_up_as_a_private_file_root_keeps_and_the_fetch_reads_on_its_stdin(tmp_path):
    token = tmp_path / "token"
    token.write_text("hf_secret_value\n")
    token.chmod(0o600)  # read_token refuses a secret others may read
    cmds, _ = commands(PLAN, on_host(PLAN, None, free=100 << 30), token_file=str(token))
    t, s = f"/run/llamarack/hub-token-{PLAN.name}", PLAN.staging
    assert ("upload", f"{t}.new", "hf_secret_value") in cmds
    shell = " ".join(c for c in cmds if isinstance(c, str))
    assert "hf_secret_value" not in shell  # only the upload holds it, never a command line
    assert f"install -m 600 /dev/null {t}.new" in shell  # private before a byte is written
    # root's shell opens it for the fetch, removes its name, then starts the fetch; and again after
    fetch = next(c for c in cmds if isinstance(c, str) and "--token-file" in c)
    assert fetch.startswith(f"{{ {{ rm -f -- {t} && systemd-run ")
    assert f" --token-file -; }} < {t} >> {s}/fetch.log 2>&1; rc=$?; rm -f {t}; [ $rc = 0 ]" in fetch
    assert fake_systemd_run.steps(fetch)[0].argv[-2:] == ["--token-file", "-"]


def test_a_resumed_run_past_its_fetch_sends_no_token(tmp_path):
    token = tmp_path / "token"
    token.write_text("hf_secret_value\n")
    token.chmod(0o600)  # read_token refuses a secret others may read
    s, t = PLAN.staging, f"/run/llamarack/hub-token-{PLAN.name}"
    cmds, _ = commands(PLAN, on_host(PLAN, None, free=100 << 30, made=("work/model-f16.gguf",)), token_file=str(token))
    assert not any(isinstance(c, tuple) and "hub-token" in c[1] for c in cmds)
    shell = " ".join(c for c in cmds if isinstance(c, str))
    assert f"rm -f {t} {t}.new" in shell and f"fetch --manifest {s}/manifest.json" not in shell
    steps = [st.description for c in cmds if isinstance(c, str) for st in fake_systemd_run.steps(c)]
    assert steps == ["llamarack model convert", "llamarack model quantize"]


def replaced_only_at_the_end(cmds) -> None:
    """The directory that is there (it may be what the server runs) is moved aside only
    by the last move, once its replacement is sealed, and removed after it."""
    shell = [c for c in cmds if isinstance(c, str)]
    assert not any(c == f"rm -rf {PLAN.dir}" for c in shell)
    last = [c for c in shell if f"mv -T {PLAN.staging} {PLAN.dir}" in c]
    assert len(last) == 1, shell
    aside = f"{PLAN.models_dir}/.staging/replaced-{PLAN.name}"
    assert last[0].index(f"mv -T {PLAN.dir} {aside}") < last[0].index(f"mv -T {PLAN.staging} {PLAN.dir}") \
        < last[0].rindex(f"rm -rf {aside}")  # fmt: skip
    seal = remote.command("model_fetch", "seal")
    assert shell.index(last[0]) > max(i for i, c in enumerate(shell) if c.startswith(seal))


def test_an_unsealed_leftover_is_replaced_once_its_successor_is_sealed():
    cmds, _ = commands(PLAN, on_host(PLAN, ArtifactState(None, None, None), free=100 << 30))
    replaced_only_at_the_end(cmds)


def test_a_truncated_artifact_is_not_taken_for_done():
    cmds, _ = commands(PLAN, on_host(PLAN, ArtifactState(PLAN.stamp, 10, 1_100_000), free=100 << 30))
    replaced_only_at_the_end(cmds)


def test_a_gguf_edited_after_its_seal_is_not_taken_for_done():
    """Same size, other bytes: the mtime the seal recorded differs (a tampered model)."""
    sealed = {"stamp": PLAN.stamp, "gguf": {"size": 1_100_000, "signature":
              {"size": 1_100_000, "mtime_ns": 1764640411_000000000, "inode": 42}}}  # fmt: skip
    edited = ArtifactState(PLAN.stamp, 1_100_000, 1_100_000, sealed,
                           {"size": 1_100_000, "mtime_ns": 1764649999_123456789, "inode": 42})  # fmt: skip
    assert not edited.complete_for(PLAN.stamp)
    cmds, _ = commands(PLAN, on_host(PLAN, edited, free=100 << 30))
    replaced_only_at_the_end(cmds)
    untouched = ArtifactState(PLAN.stamp, 1_100_000, 1_100_000, sealed, sealed["gguf"]["signature"])
    assert untouched.complete_for(PLAN.stamp)


def test_too_little_disk_fails_before_any_change():
    cmds, _ = commands(PLAN, on_host(PLAN, None, free=1 << 20))
    assert len(cmds) == 1 and "gpu01: model-disk: found 1048576 bytes free" in cmds[0]
    assert cmds[0].endswith("exit 1")


def test_f16_is_converted_straight_to_the_artifact_without_quantize():
    plan = plan_model(settings(model_quant="F16"), LISTING)
    cmds, _ = commands(plan, on_host(plan, None, free=100 << 30))
    shell = " ".join(c for c in cmds if isinstance(c, str))
    assert f"--outfile {plan.staging}/work/model.gguf.tmp.$$$$" in shell and "llama-quantize" not in shell


def test_gguf_source_is_fetched_into_place_without_convert():
    listing = replace(LISTING, files=LISTING.files + (HubFile("m.gguf", 9, "1" * 64, "2" * 40),))
    plan = plan_model(settings(model_source="gguf", model_file="m.gguf"), listing)
    cmds, _ = commands(plan, on_host(plan, None, free=100 << 30))
    shell = [c for c in cmds if isinstance(c, str)]
    assert f"--dest {plan.staging}/work " in shell[4] and "convert" not in " ".join(shell)
    # its GGUF moves into the staging with the take-over, as a converted one does
    assert any(c.startswith(f"if [ -d {plan.staging}/work ]; then") for c in shell)


def test_hub_listing_from_the_local_hub(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x" * 100)
    with HubServer({"org/tiny": tmp_path}, token="tok") as hub:
        sha = hub.repo("org/tiny").sha
        listing = repo_files(hub.url, "org/tiny", sha, "tok")
        assert listing.sha == sha
        by_path = {f.path: f for f in listing.files}
        assert by_path["config.json"].sha256 is None and by_path["config.json"].git_sha1
        assert by_path["model.safetensors"].size == 100 and len(by_path["model.safetensors"].sha256) == 64
        with pytest.raises(ModelSourceError, match="HTTP 401 .*set model_hf_token_file"):
            repo_files(hub.url, "org/tiny", sha, None)
        with pytest.raises(ModelSourceError, match="not found"):
            repo_files(hub.url, "org/tiny", "b" * 40, "tok")
        # a short sha (model_revision takes 7 to 40 hex digits) resolves to the full one
        assert repo_files(hub.url, "org/tiny", sha[:12], "tok").sha == sha


@pytest.mark.parametrize("output", [["size x"], ["size 10", "{not json"], ["size 10", "{}"]])
def test_unreadable_artifact_state_is_a_fact_process_error(output):
    from pyinfra.api.exceptions import FactProcessError

    with pytest.raises(FactProcessError):
        ModelArtifact().process(output)


def served(plan, **record_changes):
    """The ModelArtifact fact of models/current once ``plan``'s artifact is sealed."""
    record = {**json.loads(json.dumps(plan.record())), "gguf": {"size": 100, "sha256": "0" * 64}, **record_changes}
    return ArtifactState(plan.stamp, 100, 100, record)


def test_the_served_artifacts_own_record_plans_it_without_the_hub():
    s = settings()
    plan = plan_model(s, LISTING)
    again = plan_from_record(s, served(plan))
    assert (again.stamp, again.dir, again.revision) == (plan.stamp, plan.dir, plan.revision)
    assert again.record()["asked"] == plan.record()["asked"]
    # The artifact operation then does nothing: the listing was never needed.
    cmds, noops = commands(again, on_host(plan, served(plan), link=plan.name, record=True))
    assert cmds == [] and noops[0].startswith(f"model {plan.name} is in place")


@pytest.mark.parametrize("change", [{"model_quant": "Q8_0"}, {"model_revision": "f" * 40},
                                    {"llamacpp_commit": "a" * 40}, {"model_hf_include": ["*.safetensors"]}])
def test_a_record_made_from_other_settings_needs_the_hub(change):
    plan = plan_model(settings(), LISTING)
    assert plan_from_record(settings(**change), served(plan)) is None


def test_no_record_or_a_truncated_gguf_needs_the_hub():
    plan = plan_model(settings(), LISTING)
    assert plan_from_record(settings(), None) is None
    assert plan_from_record(settings(), served(plan, asked=None)) is None  # made before records said
    record = served(plan).record
    assert plan_from_record(settings(), ArtifactState(plan.stamp, 99, 100, record)) is None
    # edited after its seal (same size, another mtime): made again, so from the hub's listing
    sealed = {**record, "gguf": {"size": 100, "signature": {"size": 100, "mtime_ns": 1, "inode": 7}}}
    assert plan_from_record(settings(), ArtifactState(plan.stamp, 100, 100, sealed,
                                                      {"size": 100, "mtime_ns": 2, "inode": 7})) is None  # fmt: skip
    assert plan_from_record(settings(), ArtifactState(plan.stamp, 100, 100, sealed,
                                                      {"size": 100, "mtime_ns": 1, "inode": 7})) is not None  # fmt: skip
    # a mirror of the same hub is no reason to fetch again
    assert plan_from_record(settings(model_hf_endpoint="https://mirror.example:8080"), served(plan)) is not None


# -- the draft model: the same plan and operation, its own stamp and link --

DRAFT = {"model_draft_repo": "org/tiny", "model_draft_revision": SHA, "model_draft_quant": "Q8_0"}


def test_the_draft_is_planned_from_the_models_settings_with_its_own_repo_and_quant():
    from roles.model.plan import draft_settings

    s = settings(**DRAFT)
    assert draft_settings(settings()) is None
    d = draft_settings(s)
    assert (d.model.repo, d.model.revision, d.model.quant, d.model.source) == ("org/tiny", SHA, "Q8_0", "hf")
    assert d.model.hf_endpoint == s.model.hf_endpoint and d.model.hf_include == s.model.hf_include
    main, draft = plan_model(s, LISTING), plan_model(d, LISTING)
    assert draft.stamp != main.stamp and draft.quant == "Q8_0"  # its own artifact beside the model's
    # its record plans it again without the hub, and is not taken for the model's
    assert plan_from_record(d, served(draft)).stamp == draft.stamp
    assert plan_from_record(s, served(draft)) is None


def test_the_draft_artifact_switches_models_draft_not_current():
    d = plan_model(settings(**{**DRAFT, "model_quant": "Q8_0"}), LISTING)
    cmds, _ = commands(d, on_host(d, ArtifactState(d.stamp, 1, 1), record=True, link_name="draft"), link="draft")
    assert cmds == [f"ln -sfn {d.name} /opt/lr/models/draft.new && mv -T /opt/lr/models/draft.new /opt/lr/models/draft"]
    with pytest.raises(ValueError):
        commands(d, {}, link="../etc")


@pytest.mark.parametrize("data, problem", [
    ({"model_draft_repo": "org/tiny"}, "model_draft_revision: given None"),
    ({**DRAFT, "model_draft_source": "gguf"}, "model_draft_file: given None"),
    ({"server_draft_min": 9, "server_draft_max": 4}, "server_draft_min: given 9"),
    ({**DRAFT, "model_draft_quant": "Q4_K_X"}, "model_draft_quant: given 'Q4_K_X'"),
    ({"server_bench": "always"}, "server_bench: given 'always'"),
])  # fmt: skip
def test_draft_and_bench_settings_are_checked(data, problem):
    from llamarack.errors import SettingsError

    with pytest.raises(SettingsError) as e:
        settings(**data)
    assert problem in str(e.value)


# Day 2: the disk a model step asks for counts only the checkpoint files the
# host's blob cache does not hold (they are hardlinked, not written again).
CACHED_ALL = {f.content_id: f.size for f in PLAN.files}


def test_disk_needed_counts_the_checkpoint_only_where_the_blob_cache_lacks_it():
    s = PLAN.source_bytes  # 600 + 3_000_000 + 250_000
    gguf_files = s + s * 55 // 100  # the unquantized GGUF and the quantized one
    assert PLAN.disk_needed() == s + gguf_files + (1 << 30)
    assert PLAN.disk_needed(CACHED_ALL) == gguf_files + (1 << 30)
    # one file missing from the cache: that file's bytes count
    some = {cid: n for cid, n in CACHED_ALL.items() if not cid.startswith("sha256:5")}
    assert PLAN.to_download(some) == 3_000_000 and PLAN.disk_needed(some) == 3_000_000 + gguf_files + (1 << 30)
    # a blob of another size is not the file (model_fetch drops it and downloads)
    other = {**CACHED_ALL, "sha256:" + "5" * 64: 17}
    assert PLAN.disk_needed(other) == PLAN.disk_needed(some)
    # a prequantized source: only what is fetched, and nothing when cached
    listing = replace(LISTING, files=LISTING.files + (HubFile("m.gguf", 9_000_000, "1" * 64, "2" * 40),))
    gguf = plan_model(settings(model_source="gguf", model_file="m.gguf"), listing)
    assert gguf.disk_needed() == 9_000_000 + (1 << 30)
    assert gguf.disk_needed({"sha256:" + "1" * 64: 9_000_000}) == 1 << 30


def test_the_disk_check_reads_the_blob_cache_and_refuses_only_on_what_must_be_written():
    assert PLAN.blob_ids == tuple(sorted(CACHED_ALL))
    free = PLAN.disk_needed(CACHED_ALL)  # room for the GGUFs, not for a second checkpoint
    cmds, _ = commands(PLAN, on_host(PLAN, None, free=free, cached=CACHED_ALL))
    assert not any("model-disk" in c for c in cmds if isinstance(c, str)) and len(cmds) > 5
    # the same host without the blobs is refused, and the message says what counts
    cmds, _ = commands(PLAN, on_host(PLAN, None, free=free, cached={}))
    assert len(cmds) == 1 and cmds[0].endswith("exit 1")
    assert (f"gpu01: model-disk: found {free} bytes free under /opt/lr/models; needed {PLAN.disk_needed()} "
            f"(checkpoint files not in the blob cache: {PLAN.source_bytes}, unquantized GGUF") in cmds[0]
    assert "Fix: free space or move llamarack_root to a bigger disk" in cmds[0]


# Day 2: a llama.cpp bump with the revision pinned by its full sha is planned from
# the served artifact's record: the hub's listing of a commit never changes.
def test_a_bump_of_a_full_sha_pin_is_planned_from_the_record_without_the_hub():
    plan = plan_model(settings(), LISTING)
    assert plan.record()["sizes"] == {"config.json": 600, "model.safetensors": 3_000_000, "tokenizer.model": 250_000}
    for change in ({"llamacpp_commit": "b" * 40}, {"llamacpp_commit": "b" * 40, "model_hf_endpoint": "https://mirror:8080"},
                   {"llamacpp_commit": "b" * 40, "model_fetch_retries": 2}):
        bumped = settings(**change)
        assert plan_from_record(bumped, served(plan)) is None  # not the served artifact (the audit's drift)
        again = plan_from_pinned_record(bumped, served(plan))
        listed = plan_model(bumped, LISTING)
        assert again.stamp == listed.stamp != plan.stamp, change
        assert (again.manifest(), again.record(), again.dir) == (listed.manifest(), listed.record(), listed.dir)
        assert again.disk_needed(CACHED_ALL) == listed.disk_needed(CACHED_ALL)
    # The record it makes plans the same artifact again (a converged rack asks nothing).
    bumped = settings(llamacpp_commit="b" * 40)
    made = plan_from_pinned_record(bumped, served(plan))
    assert plan_from_record(bumped, served(made)).stamp == made.stamp
    # An artifact that must be made again (its GGUF truncated): the same stamp, from the record.
    truncated = ArtifactState(plan.stamp, 99, 100, served(plan).record)
    assert plan_from_pinned_record(settings(), truncated).stamp == plan.stamp


@pytest.mark.parametrize("change", [
    {"model_revision": SHA[:12]},  # a short sha: listed again
    {"model_quant": "Q8_0"},  # a new model setting: listed, as any
    {"model_convert_outtype": "bf16"},
    {"model_revision": "f" * 40},  # another commit
    {"model_repo": "org/other"},
    {"model_hf_include": ["*.safetensors"]},  # another selection of the listing
    {"model_source": "gguf", "model_file": "m.gguf"},
])  # fmt: skip
def test_a_pin_not_by_full_sha_or_other_files_needs_the_hub(change):
    plan = plan_model(settings(), LISTING)
    assert plan_from_pinned_record(settings(llamacpp_commit="b" * 40, **change), served(plan)) is None


def test_a_record_without_sizes_needs_the_hub():
    """Records made before they carried sizes: a git-sha1 check needs the size, so the hub lists."""
    plan = plan_model(settings(), LISTING)
    old = {k: v for k, v in served(plan).record.items() if k != "sizes"}
    state = ArtifactState(plan.stamp, 100, 100, old)
    assert plan_from_record(settings(), state).stamp == plan.stamp  # still read as the served one
    assert plan_from_pinned_record(settings(llamacpp_commit="b" * 40), state) is None
    assert plan_from_pinned_record(settings(llamacpp_commit="b" * 40), None) is None


def test_plan_for_asks_the_hub_only_when_the_record_cannot_say(monkeypatch):
    import roles.model.deploy as role

    asked = []
    monkeypatch.setattr(role, "listing_for", lambda s: asked.append(s.model.revision) or LISTING)
    plan = plan_model(settings(), LISTING)
    current = ophost.fact_key(ModelArtifact, path="/opt/lr/models/current")
    for data, listed in (({"llamacpp_commit": "b" * 40}, []), ({"llamacpp_commit": "b" * 40, "model_revision": SHA[:12]},
                                                               [SHA[:12]])):  # fmt: skip
        asked.clear()
        with ctx_host.use(ophost.FakeHost({current: served(plan)})):
            got = role.plan_for(settings(**data))
        assert asked == listed and got.stamp == plan_model(settings(**data), LISTING).stamp


def test_shipped_the_artifact_is_made_once_in_the_run_or_received_in_one_step():
    """With ``ship_artifacts`` the pipeline's commands are one FunctionCommand: ``ship.obtain``
    decides at run time to make them here or to receive the artifact sealed; the received
    one is moved into place as a made one is, then the link switches."""
    from pyinfra.api import FunctionCommand

    from roles.model import ship
    from tests.support.ophost import FakeHost, FakeState

    fake = FakeHost(on_host(PLAN, None, free=100 << 30), state=FakeState(True, False))
    with ctx_host.use(fake):
        step, link = list(artifact._inner(plan=PLAN, ship_artifacts=True))
    assert isinstance(step, FunctionCommand) and step.function is ship.obtain
    plan, make, python, place, note = step.args
    assert note.startswith(f"model {PLAN.name}: ") and "follow each step with: tail -f" in note
    made, _ = ophost.run_op(artifact, on_host(PLAN, None, free=100 << 30), plan=PLAN)  # without shipping
    assert plan is PLAN and python == "python3"
    assert [ophost._plain(c) for c in make] == made[:-1]  # the same pipeline, all but the link's switch
    assert place == [f"chmod 755 {ship.incoming(PLAN)} && mv -T {ship.incoming(PLAN)} {PLAN.dir}",
                     remote.command("model_fetch", "prune-cache", "--cache", BLOBS, "--models", "/opt/lr/models")]
    assert link.startswith(f"ln -sfn {PLAN.name} ")


def test_a_host_holding_the_artifact_sealed_is_a_source_for_the_run():
    from llamarack import ship as shipping
    from tests.support.ophost import FakeHost, FakeState

    fake = FakeHost(on_host(PLAN, DONE, link=PLAN.name, record=True), state=FakeState(True, False))
    with ctx_host.use(fake):
        assert list(artifact._inner(plan=PLAN, ship_artifacts=True)) == []
    (holder,) = shipping.for_state(fake.state).holders[f"model-{PLAN.name}"]
    assert holder.host is fake and holder.path == PLAN.dir
    # without shipping, or with an artifact that is not whole, nothing is held
    for facts, ship_artifacts in ((on_host(PLAN, DONE, link=PLAN.name, record=True), False),
                                  (on_host(PLAN, None, free=100 << 30), True)):  # fmt: skip
        other = FakeHost(facts, state=FakeState(True, False))
        with ctx_host.use(other):
            list(artifact._inner(plan=PLAN, ship_artifacts=ship_artifacts))
        assert not shipping.for_state(other.state).holders[f"model-{PLAN.name}"]


@pytest.mark.parametrize("facts, preferred", [
    (dict(cached=CACHED_ALL), True),  # its blob cache holds the whole checkpoint: no hub
    (dict(made=("work/model-f16.gguf",)), True),  # a cut run left its conversion: past the fetch
    (dict(cached={PLAN.files[0].content_id: PLAN.files[0].size}), False),  # part of it
    (dict(), False),
])  # fmt: skip
def test_a_host_that_can_make_the_artifact_without_the_hub_is_its_preferred_maker(facts, preferred):
    from llamarack import ship as shipping
    from tests.support.ophost import FakeHost, FakeState

    fake = FakeHost(on_host(PLAN, None, free=100 << 30, **facts), state=FakeState(True, False))
    with ctx_host.use(fake):
        list(artifact._inner(plan=PLAN, ship_artifacts=True))
    assert shipping.for_state(fake.state).preferred[f"model-{PLAN.name}"] == ([fake] if preferred else [])


def test_the_blob_cache_index_lists_the_sound_blobs_with_their_sizes(tmp_path):
    """``BlobCacheIndex``'s command run on a real cache: a blob written to since it was cached
    (its mtime moved) is not sound; a missing cache is an empty one."""
    import os
    import subprocess

    from roles.model.files.model_fetch import BLOB_MTIME_NS
    from roles.model.reads import BlobCacheIndex

    sound, stale = tmp_path / "sha256" / ("a" * 64), tmp_path / "git-sha1" / ("b" * 40)
    for blob, body in ((sound, b"weights"), (stale, b"edited")):
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(body)
    os.utime(sound, ns=(BLOB_MTIME_NS, BLOB_MTIME_NS))
    fact = BlobCacheIndex()
    for cache, want in ((tmp_path, {"sha256:" + "a" * 64: 7}), (tmp_path / "none", {})):
        out = subprocess.run(["bash", "-c", fact.command(cache=str(cache))], capture_output=True, text=True, check=True)
        assert fact.process(out.stdout.splitlines()) == want


def test_the_audit_names_the_artifact_a_bump_makes_and_whether_the_cache_holds_its_checkpoint():
    from roles.model.audit import made

    plan = plan_model(settings(), LISTING)
    bumped = settings(llamacpp_commit="b" * 40)
    wanted = plan_from_pinned_record(bumped, served(plan))
    assert wanted.stamp != plan.stamp
    assert made(bumped, served(plan), CACHED_ALL) == {"stamp": wanted.name, "ship": True, "cache_holds": True}
    assert made(bumped, served(plan), {plan.files[0].content_id: plan.files[0].size})["cache_holds"] is False
    assert made(settings(), served(plan), CACHED_ALL)["stamp"] == plan.name  # converged: the one served
    assert made(settings(model_ship_artifacts=False), None, None) == {"stamp": None, "ship": False, "cache_holds": False}
