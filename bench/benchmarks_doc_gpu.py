"""The sections of docs/benchmarks.md whose results the GPU machine writes (and the sm_70
build beside the build proof): each a function of the results, rendered by
``bench/benchmarks_doc.py``. Standard library only: they read JSON."""

from __future__ import annotations

import re

from benchmarks_doc import Results, num, secs, section, source, span


# --- builds ---------------------------------------------------------------------------------


def cpu_code_text(cpu: dict) -> str:
    """ggml's CPU library checked for AVX-512 and AVX2 registers (the build proofs' ``artifact``)."""
    return "; ".join(f"{name}: {num(c['instructions'])} instructions, {num(c['avx512_zmm'])} naming an AVX-512 register, "
                     f"{num(c['avx2_ymm'])} an AVX2 one" for name, c in cpu.items())  # fmt: skip


def sm70_row(r: dict) -> str:
    release = re.search(r"release ([\d.]+)", r.get("toolkit") or "")
    compiler = (r.get("host_compiler") or "?").split(" (")[0]
    baseline = "; ggml's CPU baseline" if "-DGGML_NATIVE=OFF" in (r.get("cmake_args") or []) else ""
    cpu = f"; {cpu_code_text(r['cpu_code'])}" if r.get("cpu_code") else ""
    return (f"| `sm70-build.json` | the role's cmake arguments for Volta: CUDA {release and release.group(1)}, "
            f"{compiler}{baseline} | {secs(r['build_s'], 0)} ({num(r['build_s'] / 60)} min) on {r['jobs']} jobs, exit "
            f"{r['build_exit_code']}; {r['cubin_count']} cubins, all {', '.join(r['cubin_archs'])}{cpu} |")  # fmt: skip


def right_text(right: dict) -> str:
    first, second, proof = right["first_deploy"], right.get("second_deploy") or {}, right.get("proof") or {}
    again = " with no change" if second.get("changed_operations") == 0 else ""
    devices = proof.get("devices_used") or proof.get("devices") or ["no device named"]
    return (f"first deploy {secs(first['seconds'], 0)} (rc {first['rc']}) on {first.get('jobs')} jobs, second "
            f"{secs(second.get('seconds'), 0)} (rc {second.get('rc')}){again}; {first.get('cubins')} cubins for "
            f"arch {', '.join(first.get('cuda_archs') or [])}; the smoke run on {'; '.join(devices)}: "
            f"{num(proof.get('tokens_per_second'), 1)} tokens/s on the tiny model")  # fmt: skip


def wrong_text(wrong: dict) -> str:
    deploy = wrong.get("deploy") or {}
    said = next((m.group(0) for x in reversed(wrong.get("output") or [])
                 for m in [re.search(r"CUDA error:.*|error:.*", x)] if m), "no error line")  # fmt: skip
    start, end = wrong.get("current_at_start"), wrong.get("current_at_end")
    kept = "unchanged" if start == end else "**changed**"
    return (f"a build for `{', '.join(wrong['settings']['llamacpp_cuda_archs'])}` only, the rules bypassed: rc "
            f"{deploy.get('rc')} after {secs(deploy.get('seconds'), 0)}, refused with \"{said}\"; `builds/current` "
            f"{kept} ({start or 'none'} before, {end or 'none'} after)")  # fmt: skip


def build_proof_row(r: dict) -> str:
    parts = [right_text(r["right_arch"]) if r.get("right_arch") else "no right-arch deploy in this result"]
    parts.append(wrong_text(r["wrong_arch"]) if r.get("wrong_arch") else "no wrong-arch deploy in this result")
    return f"| `gpu-build-proof.json` | the llama.cpp role through pyinfra on a GPU host, twice; then a wrong arch " \
           f"| {'; '.join(parts)} |"  # fmt: skip


def deploys_text(case: str, c: dict) -> str:
    """A build proof case's two deploys: seconds, exit status, and what its first one says of itself."""
    first, second = c.get("first_deploy") or {}, c.get("second_deploy") or {}
    note = f"; {first['note']}" if first.get("note") else ""
    return (f"`{case}`: first deploy {secs(first.get('seconds'), 0)} (rc {first.get('rc')}{note}), second "
            f"{secs(second.get('seconds'), 0)} (rc {second.get('rc')})")  # fmt: skip


def tools_row(r: dict) -> str:
    q = r.get("quality") or {}
    proof = q.get("proof") or {}
    switches = ", ".join(proof.get("runtime_args") or []) or "no runtime switch needed"
    tools = " and ".join(proof.get("tools") or []) or "no tool"
    devices = "; ".join(proof.get("devices_used") or proof.get("devices") or ["no device named"])
    parts = [f"{tools} with the server, the rung \"{proof.get('variant')}\" ({switches}), on {devices}: "
             f"{proof.get('offloaded')} layers, {num(proof.get('gpu_mib'))} MiB"]  # fmt: skip
    parts += [f"llama-bench {key[len('bench_'):-len('_tokens_per_second')]} {num(tps)} t/s" for key, tps in q.items()
              if key.startswith("bench_pp") and key.endswith("_tokens_per_second")]  # fmt: skip
    if q.get("kl_divergence"):
        parts.append("KLD " + ", ".join(f"{k['kv']} {k['mean_kld']:.4f}" for k in q["kl_divergence"])
                     + " (the smoke model is random: these say the runs computed, nothing of quality)")
    parts += [deploys_text(case, r[case]) for case in ("right", "quality") if r.get(case)]
    return (f"| `gpu-build-proof-tools.json` | the proof runs the tools the deploy runs after the build, as it runs "
            f"them (`right`, then `quality`: with `model_quality`, llama-perplexity for the f16 logits and the "
            f"quant's KL divergence with each KV type), a {proof.get('batch')}-token batch each, on the card "
            f"| {'; '.join(parts)} |")  # fmt: skip


def ship_row(r: dict) -> str:
    sh = r.get("ship") or {}
    maker, receiver, art = sh.get("maker") or {}, sh.get("receiver") or {}, sh.get("artifact") or {}
    shipped = (sh.get("shipped") or [{}])[0]
    same = sh.get("same_files") or {}
    cpu = cpu_code_text(art.get("cpu_code") or {})
    devices = "; ".join((receiver.get("proof") or {}).get("devices_used") or ["no device named"])
    cache = sh.get("cmake_cache") or {}
    files = "byte for byte the same" if same.get("identical") else "differing: " + ", ".join(same.get("differ") or [])
    variant = (maker.get("proof") or {}).get("variant")
    return (f"| `gpu-ship-proof.json` | one portable build made by the role, published, received by a second "
            f"root | made in {secs(maker.get('seconds'), 0)} (rc {maker.get('rc')}) on {maker.get('jobs')} jobs, "
            f"CPU rung \"{variant}\"; the tar {num((shipped.get('bytes') or 0) / 2**20)} "
            f"MiB; received in {secs(receiver.get('seconds'), 0)} (rc {receiver.get('rc')}), CMake cache there: "
            f"{'yes' if cache.get('receiver') else 'no (nothing compiled)'}, its smoke run on {devices}; "
            f"{same.get('files')} files {files}; "
            f"second runs {(sh.get('maker_again') or {}).get('changed_operations')} and "
            f"{(sh.get('receiver_again') or {}).get('changed_operations')} changes; {art.get('cubins')} cubins, all "
            f"{', '.join(art.get('cubin_archs') or ['none'])}; {cpu} |")  # fmt: skip


def builds(results: Results) -> str:
    named = [("sm70-build", results("sm70-build"), sm70_row), ("gpu-build-proof", results("gpu-build-proof"),
                                                                  build_proof_row),
             ("gpu-build-proof-tools", results("gpu-build-proof-tools"), tools_row),
             ("gpu-ship-proof", results("gpu-ship-proof"), ship_row)]  # fmt: skip
    rows = ["| result | what | figures |", "| --- | --- | --- |"] + [row(r) for _, r, row in named if r]
    return "\n".join(source(n, r) for n, r, _ in named) + "\n\n" + "\n".join(rows)


def cpu_profile_cell(run: dict) -> str:
    if run.get("computed"):
        return "computed (" + ", ".join(f"{k} {num(v, 1)} t/s" for k, v in run["tokens_per_second"].items()) + ")"
    return f"**died: {run.get('signal') or 'rc ' + str(run.get('rc'))}**"


def cpu_profiles_body(r: dict) -> str:
    builds = r.get("builds") or {}
    lines = [", ".join(f"`{k}` build: exit {b.get('build_exit_code')} in {secs(b.get('build_s'), 0)}, "
                       f"{cpu_code_text(b.get('cpu_code') or {})}" for k, b in builds.items()) + f"; {r.get('qemu')}.",
             "", "| CPU | reports | the rule, for the shipped build | shipped build | native build |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for p in r.get("profiles") or []:
        rule = p["rule_for_shipped"]
        verdict = "passes" if rule["passes"] else f"refuses: {rule['found']}"
        cpu = p["profile"] + (f" (QEMU `{p['qemu_cpu']}`)" if p.get("qemu_cpu") else "")
        lines.append(f"| {cpu}: {p['what']} | {' '.join(p['cpu_reports'])} | {verdict} | "
                     f"{cpu_profile_cell(p['shipped'])} | {cpu_profile_cell(p['native'])} |")  # fmt: skip
    good = r.get("shipped_runs_where_the_rule_passes_and_only_there")
    lines += ["", "The shipped build computed on every CPU the rule passes and on no other: "
              + ("yes." if good else "**no**.")]  # fmt: skip
    return "\n".join(lines)


# --- residency ------------------------------------------------------------------------------


def case_text(key: str, c: dict) -> str:
    served = c.get("served") or {}
    where = (f"{served['offloaded']} layers offloaded, {served.get('gpu_mib')} MiB on the card" if served.get("offloaded")
             else f"served from the CPU ({num(served.get('tokens_per_second'))} tokens/s)")  # fmt: skip
    text = f"{where}; the build proof: {c['proof']}; the residency check: \"{c.get('residency')}\""
    if "unit_allows" in c:
        text += (f" (the unit allows {', '.join(c['unit_allows'])}; its rule denies "
                 f"{', '.join(c['unit_denies']) or 'none of the nodes'})")  # fmt: skip
    elif key == "device_denied":
        text += (" (**this cause was handed to the check by the harness, not worked out by the product**: the "
                 "result predates the fix; through the product's own reads this case reads \"no CUDA device\")")
    return text


def busy_text(busy: list) -> str:
    groups: list = []
    for b in busy:
        free = re.search(r"(\d+) MiB free", b.get("holder") or "")
        verdict = ("on the card" if b["proof"] == "on the card" else
                   "refused as a GPU out-of-memory" if "out of memory" in b["proof"] else b["proof"])  # fmt: skip
        if groups and groups[-1][1] == verdict:
            groups[-1][0].append(free and free.group(1))
        else:
            groups.append(([free and free.group(1)], verdict))
    return "; ".join(f"{', '.join(map(str, frees))} MiB free: {verdict}" for frees, verdict in groups)


RESIDENCY_CASES = {"on_the_card": "The card reachable", "device_denied": "The card's nodes unopenable, the role's unit",
                   "unit_denies": "The same, a unit without the `nvidia` and `nvidiactl` lines"}  # fmt: skip


def residency_body(r: dict) -> str:
    rule = r["device_rule"]
    nodes = ", ".join(f"`{n}` ({v['major']})" for n, v in rule["nodes"].items())
    lines = [f"- The device rule ({', '.join(rule['allowed'])}, from `/proc/devices`) "
             + ("allows every node's major: " if rule["ok"] else "**leaves a node's major out**: ") + nodes + "."]
    lines += [f"- {what}: {case_text(key, r[key])}." for key, what in RESIDENCY_CASES.items() if key in r]
    lines.append(f"- Another process holding all but some of the card: {busy_text(r['busy_card'])}.")
    return "\n".join(lines)


def layers_run(run: dict) -> str:
    verbosity = (run.get("env") or {}).get("LLAMA_ARG_LOG_VERBOSITY")
    said = f"at verbosity {verbosity}" if verbosity else "at llama.cpp's default verbosity"
    lines = "; ".join(f"`offloaded {a}/{b} layers to GPU`" for a, b in run.get("offloaded_lines") or [])
    verdict = ("the check passed it" if run.get("residency") == "passed" else
               f"the check refused it: \"{run.get('residency')}\"")  # fmt: skip
    return (f"`--n-gpu-layers {run.get('n_gpu_layers')}` {said}: {lines or 'no layer line in the log'}; {verdict} "
            f"({num(run.get('process_mib'))} MiB on the card)")  # fmt: skip


def layers_body(r: dict) -> str:
    return "\n".join("- " + layers_run(run) for run in r["runs"])


def sleep_body(r: dict) -> str:
    mib = lambda key: (r.get(key) or {}).get("process_mib")  # noqa: E731
    again = r.get("wake_again") or {}
    size = (r.get("model") or {}).get("bytes") or r.get("model_bytes")
    argv, shown = r.get("argv") or [], []
    for i, word in enumerate(argv):  # the model's path and the port say nothing of the unit
        if word not in ("-m", "--port") and (i == 0 or argv[i - 1] not in ("-m", "--port")):
            shown.append(word)
    freed = mib("awake") - mib("asleep") if mib("awake") is not None and mib("asleep") is not None else None
    stayed = ("`/health`, `/metrics` and `/props` left it asleep" if r.get("asleep_after_health_metrics_props")
              else "**`/health`, `/metrics` or `/props` woke it**")  # fmt: skip
    return (f"llama-server `{' '.join(shown)}` on a {num(size and size / 2**20)} MiB Q4_K_M (random weights). Its "
            f"process held {num(mib('awake'))} MiB of the card awake, {num(mib('asleep'))} MiB asleep (it gave back "
            f"{num(freed)} MiB, the model's weights and KV cache, and kept its CUDA context) and {num(mib('woken'))} "
            f"MiB woken. It fell asleep {secs(r.get('seconds_to_sleep_after_the_request'))} after its last request "
            f"({secs(again.get('seconds_to_sleep'))} the second time); {stayed}. A completion took "
            f"{secs(r.get('wake_completion_s'), 3)} waking it ({secs(again.get('wake_completion_s'), 3)} the second "
            f"time), {secs(r.get('awake_completion_s'), 3)} awake.")  # fmt: skip


def sampling_body(r: dict) -> str:
    v, on, off = r.get("verdicts") or {}, *((r.get("servers") or {}).get(k) or {} for k in ("on", "off"))
    tg = next((row.get("avg_ts") for row in (r.get("llama_bench") or {}).get("rows", []) if row.get("n_gen")), None)
    speed = lambda s, kind: ((s.get("decode") or {}).get(kind) or {}).get("median_tps")  # noqa: E731
    yes = lambda key, said: said if v.get(key) else f"**not {said}**"  # noqa: E731
    cases = (on.get("cases") or {})
    cpu = sorted(name for name, c in cases.items() if c.get("placement") != "backend")
    placed = v.get("placement_as_the_source_says") or {}
    return (f"With `--backend-sampling` (the default unit: `server_backend_sampling` `auto`) and without (`off`): "
            f"greedy tokens {yes('greedy_identical', 'identical')}; seeded sampling ("
            f"{', '.join(f'{k} {x}' for k, x in (r.get('seeded') or {}).items())}) "
            f"{yes('seeded_reproducible_with_flag', 'reproducible')} with the flag and "
            f"{yes('seeded_identical_with_and_without', 'identical with and without it')}. Served decode (128 "
            f"tokens, median of 5) over `llama-bench` tg128 ({num(tg, 1)} tokens/s): greedy "
            f"{v.get('served_over_tg128_greedy_on')} with the flag ({num(speed(on, 'greedy'), 1)} tokens/s), "
            f"{v.get('served_over_tg128_greedy_off')} without ({num(speed(off, 'greedy'), 1)}); the default "
            f"sampling chain {v.get('served_over_tg128_default_sampling_on')} and "
            f"{v.get('served_over_tg128_default_sampling_off')}. Requests whose chain leaves the card ("
            f"{', '.join(cpu)}) were {yes('fallback_requests_answered', 'all answered')}; where each chain ran, by "
            f"the server's own `sampler chain` line, {sum(placed.values())} of {len(placed)} as llama.cpp's source "
            "says.")  # fmt: skip


# --- the GPU proof --------------------------------------------------------------------------

PAIRS = (("weights", "model_gpu"), ("weights_host", "model_host"), ("kv", "kv_gpu"), ("kv_host", "kv_host"))


def memory_text(mp: dict) -> str:
    rows = mp["rows"]
    close = lambda r, a, b: abs(r["planned"][a] - r["log"][b]) <= 0.1  # noqa: E731
    exact = [r for r in rows if all(close(r, a, b) for a, b in PAIRS)]
    compute = [r for r in rows if close(r, "compute", "compute_gpu")]
    off = [(r["planned"]["compute"] - r["log"]["compute_gpu"]) / r["log"]["compute_gpu"] for r in rows
           if r not in compute and r["log"]["compute_gpu"]]  # fmt: skip
    under, over = [-100 * e for e in off if e < 0], [100 * e for e in off if e > 0]
    text = (f"Memory, {len(rows)} runs: weights and KV, on the card and on the host, equal llama.cpp's buffers to "
            f"0.1 MiB in {len(exact)} of them; the compute buffer equals llama.cpp's to 0.1 MiB in {len(compute)}")
    text += f", and is {span(under, 0, '%')} under it in {len(under)}" if under else ""
    text += f", {span(over, 0, '%')} over it in {len(over)}" if over else ""
    reserve = mp.get("reserve")
    if reserve:
        text += (f". The process needed {num(reserve['needed_min_mib'], 1)} to {num(reserve['needed_max_mib'], 1)} "
                 f"MiB beyond the planned weights, KV and compute; the reserve is {num(reserve['today_mib'])} MiB")
    return text + "."


def v100_text(q: dict) -> str:
    server = "the `GGML_CUDA_FORCE_CUBLAS` build" if "cublas" in str(q.get("server")) else str(q.get("server"))
    past = q.get("one_layer_past_process_mib")
    fits = "within the card" if q.get("fits_card_one_layer_past") else "past the card"
    text = (f"A {q['shape']} planned for a V100 16 GB ({q['plan_note']}; {num(q.get('at_plan_planned_total_mib'), 1)} "
            f"of {num(q['card_mib'])} MiB planned), served by {server}, took {num(q.get('at_plan_process_mib'))} "
            f"MiB after a {num(q.get('prompt_tokens'))}-token prompt; one layer more took {num(past)} MiB, {fits}; "
            f"one context step more, {num(q.get('one_ctx_step_past_process_mib'))} MiB.")  # fmt: skip
    if "cublas" not in str(q.get("server")):
        text += (" This card's build prefills through MMQ, so it does not take the cuBLAS prefill pool that a V100 "
                 "takes and the plan counts; the `v100_cublas` phase serves the same plan on the V100's path.")
    return text


def model_text(r: dict) -> str:
    m = (r.get("summary") or {}).get("model_8b") or {"made_by_the_role": r["phases"].get("model8b", {}).get("ok")}
    if m.get("made_by_the_role"):
        how = f", its steps through {m['systemd_run'].split(',')[0]}" if m.get("systemd_run") else ""
        return f"The 8B model was made by the model role{how}."
    return f"**The 8B model was not made by the model role** (the phase `model8b` is not ok): {m.get('route')}."


def phases_text(r: dict) -> str:
    failed = [n for n, p in r["phases"].items() if not p.get("ok")]
    text = f"Phases not ok: {', '.join(failed)}." if failed else "Every phase run is ok."
    return text + (f" Not run: {', '.join(r['not_run'])}." if r.get("not_run") else "")


def decode_text(d: dict) -> str:
    served, tg = d["served_tps_default_sampling"], d["llama_bench_tg128_tps"]
    text = (f"Decode, an 8B Llama-3-shaped Q4_K_M with the unit's own command line: {num(served, 1)} tokens/s "
            f"through `/completion`, against {num(tg, 1)} for `llama-bench` tg128 with the same flags "
            f"({d['served_over_llama_bench']}; the goal of 0.97 is {'met' if d['goal_0_97_met'] else 'not met'})")
    if d.get("roofline_tps"):
        text += (f" and a copy-bandwidth roofline of {num(d['roofline_tps'])} ({d['copy_bandwidth_GBps'] / 1000:.2f} "
                 "TB/s over the weights)")  # fmt: skip
    variants = d.get("served_variants", {})
    gpu = variants.get("backend_sampling")
    if gpu:
        text += (f". Sampling on the GPU (`server_backend_sampling`): {num(gpu['tps_default_sampling'], 1)} tokens/s "
                 f"({gpu['over_llama_bench']}), the greedy tokens "
                 + ("identical" if gpu["greedy_tokens_same_as_unit"] else "**different**"))  # fmt: skip
    others = {k: v for k, v in variants.items() if k.startswith("threads_") or k == "poll_0"}
    if others:
        most = max(abs(v["tps_default_sampling"] / served - 1) for v in others.values())
        threads = sorted({int(v["extra_args"][1]) for k, v in others.items() if k.startswith("threads_")})
        text += f". Threads ({', '.join(map(str, threads))}) and `--poll 0` stay within {100 * most:.0f}% of it"
    off = ((d.get("pinning") or {}).get("served_tps_default_sampling") or {}).get("cuda_graphs_off")
    text += f"; with CUDA graphs off, {num(off, 1)} tokens/s" if off else ""
    bench = "; ".join(f"{k} {num(v, 1)}" for k, v in d.get("llama_bench_tg128_variants", {}).items())
    return text + f". `llama-bench` tg128 by flags: {bench}."


def cublas_text(c: dict) -> str:
    return (f"The prefill pool a V100 takes (a `GGML_CUDA_FORCE_CUBLAS` build): "
            f"{' and '.join(num(v) for v in c['cublas_over_mmq_mib'].values())} MiB after "
            f"{' and '.join(c['cublas_over_mmq_mib'])}-token prompts; planned "
            f"{' and '.join(num(v, 1) for v in c['planned_mib_as_6_0'].values())}.")  # fmt: skip


def modload_text(m: dict) -> str:
    return (f"`CUDA_MODULE_LOADING=LAZY` against eager loading, the 8B plan: {num(m['lazy_process_mib'])} MiB "
            f"against {num(m['eager_process_mib'])} MiB.")  # fmt: skip


def prefill_text(p: dict) -> str:
    return (f"Prefill: {num(p['served_single_pp512_tps'])} tokens/s for one 512-token prompt (`llama-bench` pp512: "
            f"{num(p['llama_bench_pp512_tps'])}), {' and '.join(num(v) for v in p['served_aggregate_tps'].values())} "
            f"in aggregate with {' and '.join(p['served_aggregate_tps'])} slots busy.")  # fmt: skip


def smi_text(smi: dict) -> str:
    return (f"nvidia-smi's CPU for the two queries the facts make: {1000 * smi['query_gpu']:.1f} and "
            f"{1000 * smi['query_compute_apps']:.1f} ms.")  # fmt: skip


# The summary's parts, in the page's order, each with what renders it.
PROOF_PARTS = (("memory_plan", memory_text), ("cublas_prefill", cublas_text), ("module_loading", modload_text),
               ("v100_question", v100_text), ("v100_question_cublas", v100_text), ("decode_8b", decode_text),
               ("prefill_8b", prefill_text), ("nvidia_smi_cpu_s", smi_text))  # fmt: skip


def proof_lines(r: dict) -> list:
    s = r.get("summary") or {}
    return [model_text(r), phases_text(r)] + [text(s[key]) for key, text in PROOF_PARTS if s.get(key)]


def proof_body(r: dict) -> str:
    return "\n".join("- " + line for line in proof_lines(r))


# --- the split, AWQ, the sandbox ---------------------------------------------------------------


def split_rows(r: dict) -> list:
    rows = ["| KV | card | weights MiB (ledger / llama.cpp) | KV MiB | compute MiB | process MiB (nvidia-smi / "
            "planned total) |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for kv, e in r["kv"].items():
        for c in (e.get("served") or {}).get("cards", []):
            device = c["device"].split("[")[0] + (", main" if c.get("output_layer") else "")
            pair = lambda k: f"{num(c[k]['ledger'], 1)} / {num(c[k]['llama.cpp'], 2)}"  # noqa: E731
            rows.append(f"| {kv} | {c['card']} ({device}) | {pair('weights_mib')} | {pair('kv_mib')} | "
                        f"{pair('compute_mib')} | {num(c['process_mib']['nvidia-smi'])} / "
                        f"{num(c['process_mib']['ledger_total'])} |")  # fmt: skip
    return rows


def split_body(r: dict) -> str:
    plans = [f"{kv}: {e['split']['note']}, `{' '.join(e['split']['split_args'])}` (one card alone: "
             f"{e['one_card']['note']})" for kv, e in r["kv"].items()]  # fmt: skip
    text = f"Planned for {r['cards']}. " + "; ".join(plans) + ".\n\n" + "\n".join(split_rows(r))
    cards = [c for e in r["kv"].values() for c in (e.get("served") or {}).get("cards", [])]
    other = [c["compute_mib"]["ledger"] - c["compute_mib"]["llama.cpp"] for c in cards if not c.get("output_layer")]
    if other:
        text += (f"\n\nThe ledger counts the main card's compute buffer on every card: {span(other)} MiB more than "
                 "llama.cpp takes on the other one.")  # fmt: skip
    tps = [e["served"]["decode_tokens_per_second"] for e in r["kv"].values() if e.get("served")]
    return text + (f" Decode through the loopback RPC link: {span(tps)} tokens/s." if tps else "")


def awq_body(r: dict) -> str:
    c, q = r["calibration"], r["quality"]
    env, rep = c.get("env") or {}, c.get("report") or {}
    kld = lambda route: " / ".join(f"{q['q4_k_m'][route][kv]['kld']:.3f}" for kv in ("f16", "q8_0", "q4_0"))  # noqa: E731
    return (f"AutoAWQ {env.get('autoawq')} with transformers {env.get('transformers')}, accelerate "
            f"{env.get('accelerate')}, torch {env.get('torch')} on {rep.get('device')}, on {num(rep.get('tokens'))} "
            f"calibration tokens: {secs(rep.get('calibration_seconds'), 1)}, peak GPU memory "
            f"{rep['peak_gpu_bytes'] / 1e9:.2f} GB (the role's preflight figure in this run: "
            f"{c['preflight_bytes'] / 1e9:.2f} GB). Mean KL divergence from the plain f16 GGUF: the AWQ f16 GGUF "
            f"alone {q['f16_awq_vs_f16_plain']['kld']:.3f}; Q4_K_M plain {kld('gguf')}, AWQ {kld('awq')} (f16 / q8_0 "
            f"/ q4_0 KV; ctx {q.get('ctx')}).")  # fmt: skip


SANDBOX = {"plain": "plain", "sandbox": "sandboxed", "sandbox_mdwe": "sandboxed with MemoryDenyWriteExecute"}


def sandbox_body(r: dict) -> str:
    runs = {SANDBOX[k]: r[k] for k in SANDBOX if k in r}
    ok = [v for v in runs.values() if v.get("ok")]
    text = (f"{', '.join(runs)}: each answered `/health` within {max(v['health_after_s'] for v in ok)} s, completed "
            f"{span([v['predicted_n'] for v in ok])} tokens and held {span([v['gpu_mib'] for v in ok])} MiB of the "
            "card." if len(ok) == len(runs) and ok else
            "**Not every run served from the card**: " + "; ".join(f"{k}: exit {v.get('exit')}, "
                                                                  f"{v.get('log_lines', [])[-1:]}" for k, v in
                                                                  runs.items() if not v.get("ok")) + ".")  # fmt: skip
    built = r.get("built") or r.get("build")
    text += f" The server: {built}." if built else ""
    return text + f" Not reproduced there: {r.get('not_reproduced')}."


def buffers_mib(c: dict, *kinds: str) -> float:
    bufs = c.get("llama_cpp_host_buffers_mib") or {}
    return sum(sum((bufs.get(k) or {}).values()) for k in kinds)


def host_ram_row(name: str, c: dict) -> str:
    u, first, last = c["ledger"], (c.get("rss_mib") or [{}])[0], (c.get("rss_mib") or [{}])[-1]
    items = ("weights_mib", "kv_mib", "compute_mib", "process_mib", "prompt_cache_mib")
    buffers = (("model", "output"), ("KV",), ("compute",))
    cells = [name, u.get("cache_ram"), f"{num(u.get('total_mib'), 1)} ({' + '.join(num(u.get(k), 1) for k in items)})",
             " + ".join(num(buffers_mib(c, *kinds), 2) for kinds in buffers),
             f"{num(first.get('VmRSS'), 1)} / {num(last.get('VmRSS'), 1)} ({num(last.get('VmHWM'), 1)})",
             num(c.get("rss_minus_ledger_mib"), 1) + ("" if c.get("within_ledger") else " **over its share**")]
    return "| " + " | ".join(map(str, cells)) + " |"


def host_ram_body(r: dict) -> str:
    cases = r["cases"]
    rows = ["| case | `--cache-ram` | the unit's share, MiB (weights + KV + compute + process + prompt cache) | "
            "llama.cpp's host buffers, MiB (model + KV + compute) | VmRSS after load / after the prompts (peak), "
            "MiB | VmRSS less the share, MiB |", "| --- | ---: | --- | --- | --- | ---: |"]  # fmt: skip
    rows += [host_ram_row(name, c) for name, c in cases.items()]
    off = [abs(buffers_mib(c, *kinds) - sum(c["ledger"][k] for k in keys)) for c in cases.values()
           for kinds, keys in ((("model", "output"), ("weights_mib",)), (("KV",), ("kv_mib",)),
                               (("compute",), ("compute_mib",)))]  # fmt: skip
    failed = sum(1 for c in cases.values() for x in c.get("rss_mib") or [] if x.get("status") not in (None, 200))
    build = {"cpu": "CPU", "cuda": "CUDA"}.get(r.get("build"), r.get("build"))
    failed = f" (**{failed} answered other than 200**)" if failed else ""
    text = (f"A {build} build, ctx {num(r.get('ctx'))}, {r.get('prompts')} distinct prompts of "
            f"{num(r.get('prompt_tokens'))} tokens each{failed}:\n\n" + "\n".join(rows))  # fmt: skip
    text += f"\n\nllama.cpp's host buffers are within {max(off):.2f} MiB of the ledger's weights, KV and compute."
    beyond = [(name, c) for name, c in cases.items() if "beyond_buffers_mib" in c]
    return text + "".join(f" With the prompt cache off ({name}), VmRSS was {num(c['beyond_buffers_mib'], 1)} MiB "
                          f"beyond them; the ledger counts {num(c['ledger'].get('process_mib'), 1)} MiB for the "
                          "process's own." for name, c in beyond)  # fmt: skip


def host_ram(results: Results) -> str:
    return "\n\n".join(section(name, results(name), host_ram_body) for name in ("cpu-host-ram", "gpu-host-ram"))


def gpu_sections() -> dict:
    one = lambda name, body: lambda results: section(name, results(name), body)  # noqa: E731
    return {"builds": builds, "gpu_residency": one("gpu-residency", residency_body),
            "gpu_proof": one("gpu-proof", proof_body), "gpu_split": one("gpu-split", split_body),
            "gpu_awq": one("gpu-awq", awq_body), "gpu_sandbox": one("gpu-sandbox", sandbox_body),
            "gpu_layers": one("gpu-layers", layers_body), "gpu_sleep": one("gpu-sleep", sleep_body),
            "gpu_sampling": one("gpu-sampling", sampling_body),
            "host_ram": host_ram, "cpu_profiles": one("cpu-profiles", cpu_profiles_body)}  # fmt: skip
