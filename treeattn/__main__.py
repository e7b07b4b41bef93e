"""``python -m treeattn``: the console script, for launchers that start a module rather than an
executable (``torchrun --nproc-per-node N -m treeattn run PLAN``)."""

from treeattn.entry import main

if __name__ == "__main__":
    main()
