# pyinfra reads this file before the deploy: pin the pyinfra we are written for.
REQUIRE_PYINFRA_VERSION = ">=3.1,<4"

# A host that fails its preflight guard stops; the rest of the rack goes on.
FAIL_PERCENT = 100
