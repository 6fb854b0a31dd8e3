"""The `reasonsim` console entry point in a process forked from the suite's preloaded fork
server (`conftest.run_cli`): the real CLI, a fresh process per command, without importing
vLLM and PyTorch again for each one (about 16 s a command on the 2-core VM)."""

from __future__ import annotations

import atexit
import os
import sys
import traceback

from validation.replay import PRELOAD as ENGINE_PRELOAD

PRELOAD = (*ENGINE_PRELOAD, "reasonsim.cli", "sim.simulate", "pandas", "pyarrow.parquet",
           "cli_child")
"""what the fork server imports once: the engines' modules and the simulator's"""


def run(environ: dict, cwd: str, argv: list, out_path: str, err_path: str) -> None:
    """Run `reasonsim ARGV` here with the caller's environment and directory, its output in the
    two files, and exit with its code as the console script would."""
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    for fd, path in ((1, out_path), (2, err_path)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    sys.argv = ["reasonsim", *argv]
    from reasonsim.cli import main

    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # sys.exit("message"), as the interpreter prints it
        code = 1
    atexit._run_exitfuncs()  # what interpreter exit runs: temporary files, engine shutdowns
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
