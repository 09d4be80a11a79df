"""`python -m kineto_comm`: the same command line as `kineto-comm`."""

from kineto_comm.cli import main

if __name__ == "__main__":
    main()
