"""``python -m kvbridge`` (also what ``torchrun -m kvbridge`` runs)."""

from kvbridge.cli.main import main

main()
