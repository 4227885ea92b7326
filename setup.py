"""Maps the top-level adapters/ and recovery/ folders under the one import root ``iqbridge``.

Everything else lives in pyproject.toml. Sub-packages are discovered automatically, so a
new adapter folder needs no edit here; nobody writes ``import adapters``. Folders of data
files (admin/static, admin/templates, stores/lua) are found as namespace packages, so
setuptools ships their files (pyproject's package-data) without warning that they are
importable but not listed.
"""

from setuptools import find_namespace_packages, find_packages, setup

MAPPED = {"iqbridge.adapters": "adapters", "iqbridge.recovery": "recovery"}

packages = find_namespace_packages(
    include=["iqbridge", "iqbridge.*"], exclude=["*.__pycache__", "*.__pycache__.*"]
)
for root, folder in MAPPED.items():
    packages += [
        root + name[len(folder) :] for name in find_packages(include=[folder, f"{folder}.*"])
    ]

setup(packages=packages, package_dir={"iqbridge": "iqbridge", **MAPPED})
