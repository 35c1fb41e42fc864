"""`import sparq` picks OpenBLAS's kernels as the `sparq` command does (sparq/__init__.py
sets OPENBLAS_CORETYPE before _sparq loads OpenBLAS): the independent reference is the command's
own `sparq info` line, run without OPENBLAS_CORETYPE in either process."""

import os
import re
import subprocess
import sys

from conftest import REPO  # noqa: F401  (the fixtures' module; sparq_cli comes from it)


def _env_without_core(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "SPARQ_KEEP_BLAS_CORE")}
    env.update(extra)
    return env


def _python_core(env):
    code = "import sparq; print(sparq._sparq._blas_core())"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_import_uses_the_blas_kernels_of_the_command_line(sparq_cli):
    r = subprocess.run([sparq_cli, "info"], env=_env_without_core(), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    m = re.search(r"^OpenBLAS kernels: (\S+)", r.stdout, re.M)
    assert m, r.stdout
    assert _python_core(_env_without_core()) == m.group(1)


def test_a_core_the_user_set_is_kept():
    # Prescott runs everywhere x86-64 does; OpenBLAS never picks it on an AVX2 machine by itself.
    assert _python_core(_env_without_core(OPENBLAS_CORETYPE="Prescott")) == "Prescott"
