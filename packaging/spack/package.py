# SPDX-License-Identifier: Apache-2.0
# Spack recipe for solar: copy this folder into a Spack repository (packages/solar/package.py)
# and `spack install solar` (packaging/README.md). Spack builds it as any CMake project; the
# tests and benchmarks are not built.
from spack.package import *


class Solar(CMakePackage):
    """Planned data loading for distributed deep-learning training on HPC clusters: a Slurm
    SPANK plugin, a node agent filling a shared-memory buffer ahead of the ranks, libsolar
    (C, C++, Python) and an LD_PRELOAD interposer for unmodified h5py scripts."""

    homepage = "https://example.invalid/solar"
    git = "https://example.invalid/solar.git"
    license("Apache-2.0")

    version("main", branch="main")

    variant("cuda", default=False, description="libsolar's GPU copy path (libcudart on first use)")
    variant("python", default=True, description="the solar Python package (numpy; torch optional)")
    variant("slurm", default=True, description="the SPANK plugin, built against this Slurm")

    depends_on("cmake@3.25:", type="build")  # CMakeLists.txt: cmake_minimum_required
    depends_on("pkgconfig", type="build")
    depends_on("cli11", type="build")
    depends_on("nlohmann-json", type="build")
    depends_on("fmt")
    depends_on("spdlog")
    depends_on("boost")
    # Serial HDF5 serves the agent and libsolar; libfabric moves bytes from solar-stored and
    # between nodes' buffers (required: solar-stored and peer sharing use it).
    depends_on("hdf5~mpi")
    depends_on("libfabric")
    depends_on("slurm", when="+slurm")
    depends_on("cuda", when="+cuda")
    depends_on("python@3.9:", when="+python", type=("build", "run"))
    depends_on("py-numpy", when="+python", type="run")

    def cmake_args(self):
        args = [
            self.define("SOLAR_BUILD_TESTS", False),
            self.define("SOLAR_BUILD_BENCH", False),
            # A plain prefix: <prefix>/lib, not Debian's lib/<multiarch> (the default).
            self.define("CMAKE_INSTALL_LIBDIR", "lib"),
            self.define_from_variant("SOLAR_WITH_CUDA", "cuda"),
            # The plugin beside the libraries: an admin points plugstack.conf at it.
            self.define("SOLAR_SLURM_PLUGIN_DIR", "lib/slurm"),
        ]
        if "+python" in self.spec:
            args.append(self.define("SOLAR_PYTHON_DIR", "lib/python3/site-packages"))
        return args

    def setup_run_environment(self, env):
        env.set("SOLAR_ROOT", self.prefix)
        env.set("SOLAR_SPANK_PLUGIN", join_path(self.prefix, "lib", "slurm", "solar_spank.so"))
        if "+python" in self.spec:
            env.prepend_path("PYTHONPATH", join_path(self.prefix, "lib", "python3",
                                                     "site-packages"))
