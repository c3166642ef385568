"""pip install ./python — offline: no pyproject.toml, so pip builds with the setuptools already
installed instead of fetching one. The package finds libsolar.so through SOLAR_LIBRARY, beside
the `solar` tool on PATH, or the dynamic linker's path (see python/README.md)."""
from setuptools import setup

setup(
    name="solar-loader",
    version="0.1.0",
    description="PyTorch/numpy front end of solar, the planned data loader for distributed "
                "training",
    packages=["solar"],
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require={"torch": ["torch"]},
)
