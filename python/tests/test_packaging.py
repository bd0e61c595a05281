"""The package installs with pip from the repository and imports from where pip put it."""

import os
import subprocess
import sys
import tempfile
import unittest

from harness import REPO


def have_pip() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


def have_build_backend() -> bool:
    """setuptools as new as pyproject.toml asks, in this interpreter (the test builds offline)."""
    probe = "import setuptools, sys; v = tuple(int(x) for x in setuptools.__version__.split('.')[:2]); sys.exit(v < (70, 1))"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


class Packaging(unittest.TestCase):
    @unittest.skipUnless(
        (have_pip() and have_build_backend()) or os.environ.get("CI"),
        "pip or setuptools>=70.1 is not installed in this interpreter (CI requires both)",
    )
    def test_pip_installs_the_package(self):
        with tempfile.TemporaryDirectory() as target:
            # Built with this interpreter's setuptools (no build isolation: nothing is downloaded,
            # so the test needs no network); --no-deps leaves out crc32c, which the client can do
            # without (slowly); --no-index makes sure pip never asks PyPI.
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--no-deps",
                    "--no-build-isolation",
                    "--no-index",
                    "--disable-pip-version-check",
                    "--quiet",
                    "--target",
                    target,
                    os.path.join(REPO, "python"),
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            self.assertEqual(r.returncode, 0, r.stderr)
            probe = (
                "import rbgctl, rbgctl.hicache, importlib.metadata as m;"
                "print(rbgctl.__file__); print(m.version('rbgctl'));"
                "print(rbgctl.hicache.RbgctlHiCacheStorage.__name__)"
            )
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env["PYTHONPATH"] = target
            out = subprocess.run(
                [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60
            )
            self.assertEqual(out.returncode, 0, out.stderr)
            path, version, cls = out.stdout.split()
            self.assertTrue(path.startswith(target), path)
            import rbgctl

            self.assertEqual(version, rbgctl.__version__)
            self.assertEqual(cls, "RbgctlHiCacheStorage")


if __name__ == "__main__":
    unittest.main()
