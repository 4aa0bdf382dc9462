"""python -m roles: the llamarack command."""

from .cli import main

main()
