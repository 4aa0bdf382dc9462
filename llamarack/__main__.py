"""python -m llamarack: the llamarack command."""

from .cli import main

main()
