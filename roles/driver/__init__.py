"""Driver: never installs or upgrades a driver; holds what is installed, reboots only when asked.

The driver itself is the operator's (a driver change on a rack of old GPUs is a decision,
not a side effect): docs/deploy.md ("The roles") says what the role keeps.
"""
