"""``run_op`` for operations that call pyinfra's own (files.put reads the op's global arguments)."""

import re
from dataclasses import dataclass, field

from types import SimpleNamespace

from pyinfra.api import Config
from pyinfra.context import ctx_host, ctx_state

from tests.support.ophost import FakeHost


@dataclass(eq=False)
class StackHost(FakeHost):
    current_op_global_arguments: dict = field(default_factory=dict)

    def get_temp_filename(self, hash_key=None, hash_filename=True, *args, **kwargs):
        return f"/tmp/pyinfra-{abs(hash(str(hash_key))) % 10**8}"


def run_op(op, facts: dict, **kwargs) -> tuple[list[str], list[str]]:
    """(commands yielded, no-op messages) of ``op`` given ``facts``."""
    fake = StackHost(facts)
    # pyinfra's files.put reads the run's config; tests that need "executing" set their own state.
    state = ctx_state.get() or SimpleNamespace(config=Config(), is_executing=False, cwd="/")
    if not hasattr(state, "config"):
        state.config = Config()
    with ctx_host.use(fake), ctx_state.use(state):
        commands = [re.sub(r"<_io.StringIO object at 0x[0-9a-f]+>", "<StringIO>", str(c))
                    for c in op._inner(**kwargs)]
    return commands, fake.noops
