"""Scripts this role runs on the host: standard library only, each run by
``llamarack.remote.command(name, *args)`` with the host's ``python3 -c``."""
