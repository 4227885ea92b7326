"""Maps the top-level adapters/ and recovery/ folders under the one import root ``iqbridge``.

Everything else lives in pyproject.toml. Sub-packages are discovered automatically, so a
new adapter folder needs no edit here; nobody writes ``import adapters``.
"""

from setuptools import find_packages, setup

MAPPED = {"iqbridge.adapters": "adapters", "iqbridge.recovery": "recovery"}

packages = find_packages(include=["iqbridge", "iqbridge.*"])
for root, folder in MAPPED.items():
    packages += [
        root + name[len(folder) :] for name in find_packages(include=[folder, f"{folder}.*"])
    ]

setup(packages=packages, package_dir={"iqbridge": "iqbridge", **MAPPED})
