"""Two checkouts' audits of the same lab, alternating, against the same ``ssh HOST true`` fan-out.

    python3 bench/audit_ab.py REPS CHECKOUT_A CHECKOUT_B   (e.g. a `git worktree` of the previous commit)

On this machine the audit's time moves by 10 to 20% within an hour (the hypervisor
takes more or less of the two cores), so two codes are compared in the same minutes:
each round runs A's audit, B's audit and the fan-out once. Each checkout's modules are
compiled first (``compileall``, as ``audit_bench.py`` does: PYTHONDONTWRITEBYTECODE would
otherwise have a checkout without bytecode compile every module on every run). Prints
the medians; writes nothing. The lab must be up and converged (``audit_bench.py --reuse``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import audit_bench  # noqa: E402
from converged_bench import ssh_fan_out  # noqa: E402

from llamarack_lab import rack as lab_rack  # noqa: E402

# A checkout from before llamarack.entry starts through llamarack.cli.
OLD_CLI = audit_bench.AUDIT_CLI.replace("from llamarack.entry import entry", "from llamarack.cli import entry")


def audit_seconds(checkout: Path) -> float:
    audit_bench.ROOT = checkout
    audit_bench.ENV = {**os.environ, "PYTHONPATH": str(checkout)}
    cli = audit_bench.AUDIT_CLI
    if not (checkout / "llamarack/entry.py").exists():
        audit_bench.AUDIT_CLI = OLD_CLI
    try:
        return audit_bench.audit(checkout / "inventory/lab.py")[0]
    finally:
        audit_bench.AUDIT_CLI = cli


def main(argv: list) -> None:
    reps, checkouts = int(argv[1]), [Path(a).resolve() for a in argv[2:4]]
    rack = lab_rack.load()
    for checkout in checkouts:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "llamarack", "roles", "inventory"], cwd=checkout,
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    audits: dict = {c: [] for c in checkouts}
    fan_outs = []
    for _ in range(reps):
        for checkout in checkouts:
            audits[checkout].append(audit_seconds(checkout))
        fan_outs.append(ssh_fan_out(rack))
    fan_out = statistics.median(fan_outs)
    for checkout, times in audits.items():
        audit = statistics.median(times)
        print(f"{checkout}: audit {audit:.3f} s, fan-out {fan_out:.3f} s, {audit / fan_out:.2f} times ({reps} runs)")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    main(sys.argv)
