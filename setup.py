# SPDX-License-Identifier: Apache-2.0
"""Build hook: install envs.py as numa_utils_envs.py (see pyproject.toml).

All metadata lives in pyproject.toml.  numa_utils.py finds the registry as the
sibling module "envs" when vendored, and as "numa_utils_envs" when pip-installed.
"""

from setuptools import setup
from setuptools.command.build_py import build_py

_RENAMED = {"envs": "numa_utils_envs"}


class BuildPy(build_py):
    def get_module_outfile(self, build_dir, package, module):
        if not "".join(package):  # the top level: "" or [""] depending on caller
            module = _RENAMED.get(module, module)
        return super().get_module_outfile(build_dir, package, module)


setup(cmdclass={"build_py": BuildPy})
